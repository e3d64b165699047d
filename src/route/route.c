/* route.c — the history core of akv/route.h: sequences (host table, device-pool context),
 * ONE batch step's placement (host growth, one device-pool step, fills of fresh pages, the CSR
 * table over the batch), the resident kind's write-back of new rows, settling a step whose
 * work failed after its pass returned, sync, abort, truncate, close. The staged kind's leases
 * are in route_staged.c. */
#include "akv/route.h"

#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "akv/gate.h"
#include "akv/host_table.h"
#include "akv/kvq.h"
#include "akv/stage.h"
#include "core/alloc.h"
#include "core/log.h"
#include "route/route_check.h"
#include "route/route_impl.h"

/* ---- kinds and their policy ------------------------------------------------------------------ */

static const akv__route_kind *const route_kinds[] = {&akv__route_resident, &akv__route_staged,
                                                     &akv__route_host};

const akv__route_kind *akv__route_kind_of(akv_route_kind kind) {
    for (size_t i = 0; i < sizeof route_kinds / sizeof *route_kinds; i++)
        if (route_kinds[i]->kind == kind) return route_kinds[i];
    return NULL;
}

const akv__route_kind *akv__route_kind_tiered(akv_route_kind kind, akv_repr tier) {
    if (tier == AKV_REPR_EXACT) return akv__route_kind_of(kind);
    return kind == AKV_ROUTE_RESIDENT ? &akv__route_hybrid
           : kind == AKV_ROUTE_STAGED ? &akv__route_hybrid_staged
                                      : NULL;
}

bool akv_route_kind_has_host_part(akv_route_kind kind) {
    const akv__route_kind *k = akv__route_kind_of(kind);
    return k && k->host_part;
}

const char *akv_route_kind_name(akv_route_kind kind) {
    const akv__route_kind *k = akv__route_kind_of(kind);
    return k ? k->name : "?";
}

akv_status akv_route_kind_from_name(const char *name, akv_route_kind *out) {
    for (size_t i = 0; name && i < sizeof route_kinds / sizeof *route_kinds; i++)
        if (!strcmp(name, route_kinds[i]->name)) return (*out = route_kinds[i]->kind), AKV_OK;
    return AKV_EINVAL;
}

const char *akv_kv_residence_name(akv_kv_residence r) {
    static const char *const names[AKV_KV_RESIDENCE_COUNT] = {"window", "staged", "host"};
    return (unsigned)r < AKV_KV_RESIDENCE_COUNT ? names[r] : "?";
}

uint32_t akv__route_floor_pages(const akv_geom *g, uint64_t n_tokens) {
    uint64_t pages = akv_geom_pages_for_tokens(g, n_tokens);
    return pages < 2 ? 2 : pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

uint32_t akv__route_order_sink_newest(const akv_route *r, const akv_route_seq *s,
                                      uint64_t n_tokens, uint32_t *order, uint32_t *n_floor) {
    (void)s;
    const uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_tokens);
    uint32_t k = 0;
    order[k++] = n_lp - 1;
    if (n_lp > 1) order[k++] = 0;
    for (uint32_t lp = n_lp - 1; lp-- > 1;) order[k++] = lp;
    *n_floor = n_lp > 1 ? 2 : 1;
    return k;
}

static const akv__route_kind *route_kind_logged(akv_route_kind kind) {
    const akv__route_kind *k = akv__route_kind_of(kind);
    if (!k) AKV_LOG_E("route: kind %d is neither resident nor staged", (int)kind);
    return k;
}

akv_status akv_route_plan_begin(akv_route_kind kind, uint32_t window_pages, const akv_geom *g,
                                uint64_t max_history, uint32_t max_seqs, akv_route_plan *pl) {
    const akv__route_kind *k = route_kind_logged(kind);
    if (!k) return AKV_EINVAL;
    *pl = (akv_route_plan){.kind = kind,
                           .window_pages = window_pages ? window_pages : AKV_ROUTE_WINDOW_PAGES};
    pl->staging_pages = k->plan_staging(g, max_history, pl->window_pages, max_seqs);
    return AKV_OK;
}

akv_status akv_route_plan_tier(akv_route_plan *pl, akv_repr tier, uint64_t exact_recent,
                               uint32_t max_step, const akv_geom *g, uint64_t max_history,
                               uint32_t max_seqs) {
    pl->tier = AKV_REPR_EXACT, pl->compact_gib = 0;
    pl->exact_recent = exact_recent ? exact_recent : AKV_ROUTE_EXACT_RECENT;
    pl->max_step = max_step ? max_step
                            : (uint32_t)(max_history < UINT32_MAX ? max_history : UINT32_MAX);
    if (tier == AKV_REPR_EXACT) return AKV_OK;
    if ((unsigned)tier >= AKV_REPR_COUNT) {
        AKV_LOG_E("route: {=kv_tier} %d is no representation", (int)tier);
        return AKV_EINVAL;
    }
    if (!akv__route_kind_tiered(pl->kind, tier)) {
        AKV_LOG_E("route: {=kv_tier} %s: no compact tier serves the %s route",
                  akv_repr_name(tier), akv_route_kind_name(pl->kind));
        return AKV_EUNSUPPORTED;
    }
    const size_t cbytes = akv_geom_repr_page_bytes(g, tier);
    if (cbytes == 0) {
        AKV_LOG_E("route: {=kv_tier} %s cannot hold a head dim of %u (a power of two of at "
                  "least %d)",
                  akv_repr_name(tier), g->head_dim, AKV_REPR_Q4_GROUP);
        return AKV_EUNSUPPORTED;
    }
    pl->tier = tier;
    /* the tiered kind's staging reserve in the exact pool (the staged hybrid stages compact
     * pages only, from the compact pool's reserve) */
    pl->staging_pages = akv__route_kind_tiered(pl->kind, tier)->plan_staging(g, max_history,
                                                                            pl->window_pages, max_seqs);
    if (pl->kind == AKV_ROUTE_STAGED) return AKV_OK; /* the pools: akv_route_plan_split */
    /* every history's pages after the sink, compact: the pool holds them all (resident) */
    const uint64_t pages = akv_geom_pages_for_tokens(g, max_history) * (max_seqs ? max_seqs : 1);
    const double bytes = (double)pages * g->n_layers * (double)cbytes;
    pl->compact_gib = (uint32_t)((bytes + (double)(1u << 30) - 1) / (double)(1u << 30));
    if (pl->compact_gib == 0) pl->compact_gib = 1;
    return AKV_OK;
}

uint32_t akv_route_compact_slot_pages(const akv_geom *g, uint64_t max_history, uint32_t max_seqs) {
    const uint64_t n = akv_geom_pages_for_tokens(g, max_history) * (max_seqs ? max_seqs : 1);
    return n < UINT32_MAX / 2 ? (uint32_t)n : UINT32_MAX / 2;
}

uint32_t akv_route_compact_staging_pages(const akv_geom *g, uint64_t max_history, uint32_t max_seqs) {
    const uint64_t n = (uint64_t)AKV__ROUTE_CSTAGE_SLOTS * akv_route_compact_slot_pages(g, max_history, max_seqs);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

akv_status akv_route_plan_split(akv_route_plan *pl, const akv_geom *g, uint64_t max_history,
                                uint32_t max_seqs, uint32_t device_gib, uint32_t host_gib,
                                bool quiet) {
    if (pl->kind != AKV_ROUTE_STAGED || pl->tier == AKV_REPR_EXACT) return AKV_OK;
    const uint32_t S = max_seqs ? max_seqs : 1;
    const double GiB = (double)(1u << 30);
    /* device: the exact part holds S exact windows (the sink, the recent tokens, a step),
     * whole GiB; the compact pool the rest: its staging reserve, then the compact windows */
    const akv__route_kind *k = akv__route_kind_tiered(pl->kind, pl->tier);
    const double exact = (double)k->need(pl, g, max_history) * S * g->n_layers *
                         (double)akv_geom_page_bytes(g);
    const uint32_t exact_gib = (uint32_t)((exact + GiB - 1) / GiB);
    pl->compact_staging_pages = akv_route_compact_staging_pages(g, max_history, S);
    akv_dev_pool_params cpp = {.device_gib = device_gib > exact_gib ? device_gib - exact_gib : 0,
                               .staging_pages = pl->compact_staging_pages,
                               .repr = pl->tier};
    akv_dev_pool_stats cl = {0};
    /* (a reserve the pool cannot hold is found here, before the layout would log it) */
    const uint64_t cpages = ((uint64_t)cpp.device_gib << 30) / akv_geom_repr_page_bytes(g, pl->tier);
    const bool fits = cpp.device_gib > 0 && cpages > cpp.staging_pages &&
                      akv_dev_pool_layout(g, &cpp, &cl) == AKV_OK &&
                      cl.window_capacity >= 2ull * S;
    if (!fits && quiet) return AKV_EFULL;
    if (!fits) {
        const double need = (double)pl->compact_staging_pages * akv_geom_repr_page_bytes(g, pl->tier) +
                            2.0 * S * g->n_layers * akv_geom_repr_page_bytes(g, pl->tier);
        AKV_LOG_E("route: the staged compact route of {=max_seqs} %u histories of %llu tokens "
                  "needs %u GiB for their exact windows and %.2f GiB for the compact pool's "
                  "staging reserve and windows; {=device_gib} is %u: raise it to at least %u",
                  S, (unsigned long long)max_history, exact_gib, need / GiB, device_gib,
                  exact_gib + (uint32_t)((need + GiB - 1) / GiB));
        return AKV_EFULL;
    }
    pl->compact_gib = cpp.device_gib;
    const uint64_t whole = akv_geom_pages_for_tokens(g, max_history);
    const uint64_t share = cl.window_capacity / S;
    pl->compact_target = (uint32_t)(share < whole ? share : whole);
    if (pl->compact_target < 2) pl->compact_target = 2;
    const uint64_t left = cl.window_capacity - (uint64_t)pl->compact_target * S;
    const uint64_t more = whole > pl->compact_target ? whole - pl->compact_target : 0;
    pl->compact_burst = (uint32_t)(left < more ? left : more);
    /* host: the least GiB of compact copies with a page id for every exact host page */
    for (uint32_t c = 1; c < host_gib; c++) {
        akv_host_pool_params hx = akv_host_pool_default_params(), hc = hx;
        hx.limit_gib = host_gib - c;
        hc.limit_gib = c, hc.repr = pl->tier;
        akv_host_pool_stats sx, sc;
        if (akv_host_pool_layout(g, &hx, &sx) || akv_host_pool_layout(g, &hc, &sc)) break;
        if (sc.capacity_pages >= sx.capacity_pages) {
            pl->compact_host_gib = c;
            return AKV_OK;
        }
    }
    if (!quiet)
        AKV_LOG_E("route: the staged compact route keeps a compact copy beside each exact host "
                  "page: {=host_gib} %u cannot hold both (at least 2 GiB)",
                  host_gib);
    return AKV_EFULL;
}

akv_status akv_route_plan_finish(const akv_geom *g, uint64_t max_history, const akv_fit *fit,
                                 akv_route_plan *pl) {
    const akv__route_kind *k = akv__route_kind_tiered(pl->kind, pl->tier);
    if (!k) return akv_route_plan_tier(pl, pl->tier, pl->exact_recent, pl->max_step, g,
                                       max_history, fit->concurrency); /* logs why */
    return k->plan_windows(g, max_history, fit->concurrency, fit, pl);
}

size_t akv_route_plan_format(const akv_route_plan *pl, uint32_t max_seqs,
                             uint32_t window_capacity, char *buf, size_t cap) {
    const char *name = akv_route_kind_name(pl->kind);
    int n = pl->tier != AKV_REPR_EXACT
                ? snprintf(buf, cap,
                           "route:       %s: %u sequences at once, each reserving its exact "
                           "window (the sink, the last {=exact_recent} tokens and a step's) of the "
                           "%u window pages per layer\n",
                           name, max_seqs, window_capacity)
            : pl->target
                ? snprintf(buf, cap,
                           "route:       %s: %u sequences at once, each with a window of %u "
                           "pages by right + %u borrowable ({=window_pages} %u), staging reserve %u "
                           "pages (2 slots)\n",
                           name, max_seqs, pl->target, pl->burst, pl->window_pages,
                           pl->staging_pages)
                : snprintf(buf, cap,
                           "route:       %s: %u sequences at once, each reserving its whole "
                           "history (prompt + {=max_tokens}) of the %u window pages per layer\n",
                           name, max_seqs, window_capacity);
    if (n > 0 && pl->kind == AKV_ROUTE_HOST && (size_t)n < cap)
        n += pl->host_bps > 0
                 ? snprintf(buf + n, cap - (size_t)n,
                            "host:        in decode steps the host's cores attend %.0f %% of each "
                            "history's pages outside its window, the bus stages the rest: host "
                            "%.1f GB/s / (host + the bus's %.1f GB/s at the page's size), each "
                            "measured alone ({=host_share} 0: planned)\n",
                            100.0 * pl->host_share, pl->host_bps / 1e9, pl->bus_bps / 1e9)
                 : snprintf(buf + n, cap - (size_t)n,
                            "host:        in decode steps the host's cores attend %.0f %% of each "
                            "history's pages outside its window ({=host_share}), the bus stages "
                            "the rest\n",
                            100.0 * pl->host_share);
    if (n > 0 && pl->tier != AKV_REPR_EXACT && !pl->compact_host_gib && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      "compact:     {=kv_tier} %s: every page older than the last "
                      "{=exact_recent} %llu tokens, in %u GiB of the device pool\n",
                      akv_repr_name(pl->tier), (unsigned long long)pl->exact_recent,
                      pl->compact_gib);
    else if (n > 0 && pl->compact_host_gib && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n,
                      "compact:     {=kv_tier} %s: every page older than the last "
                      "{=exact_recent} %llu tokens, a compact copy of each in %u GiB of "
                      "{=host_gib}; %u GiB of the device pool keep each history's newest %u "
                      "compact pages per layer by right + %u borrowable and stage the rest, "
                      "staging reserve %u compact pages (%u slots)\n",
                      akv_repr_name(pl->tier), (unsigned long long)pl->exact_recent,
                      pl->compact_host_gib, pl->compact_gib, pl->compact_target,
                      pl->compact_burst, pl->compact_staging_pages, (unsigned)AKV__ROUTE_CSTAGE_SLOTS);
    return n > 0 ? (size_t)n : 0;
}

akv_status akv_route_plan_host(akv_route_plan *pl, const akv_geom *g, float share, uint32_t n_heads,
                               uint32_t threads, const struct akv_gate_rates *rates) {
    if (pl->kind != AKV_ROUTE_HOST) return AKV_OK;
    if (!(share >= 0.0f && share <= 1.0f)) {
        AKV_LOG_E("route: {=host_share} %g is not in 0..1 (0: planned from the rates)", (double)share);
        return AKV_EINVAL;
    }
    pl->host_share = share, pl->host_bps = pl->bus_bps = 0;
    if (share > 0.0f) return AKV_OK;
    akv_status st = akv_route_host_rate(g, n_heads, threads, &pl->host_bps);
    if (st) return st;
    const double pb = (double)akv_geom_page_bytes(g);
    pl->bus_bps = akv_gate_bus_rate(rates, pb);
    pl->host_share = akv_gate_host_share(rates, pb, pl->host_bps);
    return AKV_OK;
}

uint32_t akv_route_need(akv_route_kind kind, const akv_geom *g, uint64_t n_tokens) {
    const akv_route_plan pl = {.kind = kind};
    return akv_route_plan_need(&pl, g, n_tokens, false);
}

uint32_t akv_route_plan_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens,
                             bool exact) {
    /* a history kept exact on a tiered route holds every page in its window (resident or
     * staged: the staged hybrid's exact part is resident) */
    if (exact && pl->tier != AKV_REPR_EXACT) return akv__route_floor_pages(g, n_tokens);
    const akv__route_kind *k = akv__route_kind_tiered(pl->kind, pl->tier);
    return k ? k->need(pl, g, n_tokens) : 0;
}

/* ---- small helpers ------------------------------------------------------------------------- */

static bool route_same_geom(const akv_geom *a, const akv_geom *b) {
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->page_tokens == b->page_tokens && a->dtype == b->dtype;
}

uint32_t akv_route_slot_pages(const akv_geom *g, uint64_t max_history, uint32_t window_pages,
                              uint32_t max_seqs) {
    uint64_t n_lp = akv_geom_pages_for_tokens(g, max_history);
    uint32_t w = window_pages ? window_pages : AKV_ROUTE_WINDOW_PAGES;
    uint64_t per = n_lp <= w ? 1 : n_lp - w, n = max_seqs ? max_seqs : 1;
    return per > UINT32_MAX / n ? UINT32_MAX : (uint32_t)(per * n); /* saturated: no pool holds it */
}

static void seq_list_push(akv_route_seq **head, akv_route_seq *s) {
    s->prev = NULL, s->next = *head;
    if (*head) (*head)->prev = s;
    *head = s;
}

static void seq_list_remove(akv_route_seq **head, akv_route_seq *s) {
    if (s->prev) s->prev->next = s->next;
    else *head = s->next;
    if (s->next) s->next->prev = s->prev;
    s->next = s->prev = NULL;
}

static bool route_has_open(const akv_route *r, const akv_route_seq *s) {
    for (const akv_route_seq *x = r->open_list; x; x = x->next)
        if (x == s) return true;
    return false;
}

/* A call naming s: AKV_OK when it is open in r, else AKV_EINVAL, logged naming the call. */
static akv_status route_seq_ok(const akv_route *r, const akv_route_seq *s, const char *call) {
    if (r && s && route_has_open(r, s)) return AKV_OK;
    AKV_LOG_E("route: %s of a sequence that is not open in this route", call);
    return AKV_EINVAL;
}

/* A call that reads or changes s's history: route_seq_ok, and AKV_ESTATE (logged) while its
 * host copy is still being filled (akv_route_seq_open_unfilled). */
static akv_status route_seq_ready(const akv_route *r, const akv_route_seq *s, const char *call) {
    akv_status st = route_seq_ok(r, s, call);
    if (st || !s->unfilled) return st;
    AKV_LOG_E("route: %s of sequence %llu, whose host copy is still being filled", call,
              (unsigned long long)s->p.tag);
    return AKV_ESTATE;
}

/* s's history is now n_tokens long: its compact pages from the one holding token n_tokens on
 * are encodings of rows that will be written again. */
static void seq_shortened(akv_route_seq *s, uint64_t n_tokens) {
    const uint64_t keep = n_tokens / s->r->geom.page_tokens;
    if (s->c_valid > keep) s->c_valid = (uint32_t)keep;
    if (s->hc_valid > keep) s->hc_valid = (uint32_t)keep;
}

/* s's host copies (the exact one, and the compact copies' table with it) to n_tokens. The
 * compact copies first, since only they may be leased (by a compact stage: AKV_EBUSY, nothing
 * changed), and to the last whole page: a partial page's compact copy is never made (hc_valid
 * counts whole pages), so no shared compact page is left partial and nothing is copied. Then
 * the exact copy, whose shared partial page is copied: when the pool cannot hold that copy
 * (AKV_EFULL), the exact copy is as it was and the compact table shorter, which the next
 * growth of both mends; hc_valid is clamped to what it holds. */
static akv_status seq_host_truncate(akv_route_seq *s, uint64_t n_tokens) {
    if (s->cht) {
        const uint64_t whole = n_tokens / s->r->geom.page_tokens * s->r->geom.page_tokens;
        const uint64_t have = akv_host_table_n_tokens(s->cht);
        akv_status st = akv_host_table_truncate(s->cht, whole < have ? whole : have);
        if (st) return st;
    }
    akv_status st = akv_host_table_truncate(s->ht, n_tokens);
    if (st && s->cht && s->hc_valid > akv_host_table_n_pages(s->cht))
        s->hc_valid = akv_host_table_n_pages(s->cht);
    return st;
}

/* Every open sequence's device window becomes untrusted (a queue failed): the next step
 * refills it and uploads the whole table. */
static void route_distrust_all(akv_route *r) {
    for (akv_route_seq *s = r->open_list; s; s = s->next) s->refill = true;
    r->tab_dirty = r->ctab_dirty = true;
}

akv_status akv__route_wait(akv_route *r) {
    if (!r->queued) return AKV_OK;
    akv_status st = akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    akv_status st2 = akv_dev_queue_sync(r->dev, AKV_QUEUE_D2H); /* both drained either way */
    if (!st) st = st2;
    if (r->fills_h2d) { /* fills whose layers never began (an abort) are done too */
        st2 = akv_dev_queue_sync(r->dev, AKV_QUEUE_H2D);
        if (!st) st = st2;
        r->fills_h2d = false;
        memset(r->lfill_wait, 0, r->geom.n_layers);
    }
    /* a queue failed: what it held may not have run, the tables and fills on the device
     * included (accepted is not done): the next step rewrites them all */
    if (st) route_distrust_all(r);
    return st;
}

/* ---- sequences ---------------------------------------------------------------------------- */

/* Frees a sequence's pages and record (nothing may touch them any more). */
/* A host table freed now, or (still leased by a record a stage retains) at its release. */
static akv_status seq_table_free(akv_host_table *t) {
    akv_status st = akv_host_table_destroy(t);
    if (st == AKV_EBUSY) {
        akv_host_table_destroy_deferred(t);
        st = AKV_OK;
    }
    return st;
}

static akv_status seq_free(akv_route *r, akv_route_seq *s) {
    akv_status st = seq_table_free(s->ht);
    if (!st && s->cht) st = seq_table_free(s->cht);
    if (st) return st;
    if (s->ctx) akv_dev_pool_ctx_close(r->dp, s->ctx);
    if (s->cctx) akv_dev_pool_ctx_close(r->dpc, s->cctx);
    if (s->slot >= 0) r->step[s->slot] = NULL; /* the last step keeps its positions */
    for (uint32_t i = 0; r->pf_seqs && i < r->pf_n_seq; i++) /* a prefetch for it cannot serve */
        if (r->pf_seqs[i] == s) r->pf_seqs[i] = NULL;
    akv__free(s->staged);
    akv__free(s->cstaged);
    akv__free(s->runs);
    akv__free(s);
    return AKV_OK;
}

/* Closed sequences whose fences are all behind us: nothing enqueued that no sync has seen
 * complete, and not in a step whose pass may still run (a step ends at its last end_layer, at
 * an abort, or when the next step begins). */
static void route_finish_closes(akv_route *r) {
    if (r->pending) return;
    for (akv_route_seq *s = r->closing_list, *next; s; s = next) {
        next = s->next;
        if (s->slot >= 0 && !r->step_done) continue;
        seq_list_remove(&r->closing_list, s);
        if (seq_free(r, s) != AKV_OK) seq_list_push(&r->closing_list, s); /* cannot happen */
    }
}

/* The params a sequence runs with: defaults resolved, then checked against the route and (its
 * window, by its kind) the device pool. */
static akv_status seq_params_resolve(const akv_route *r, const akv_route_seq_params *in,
                                     akv_route_seq_params *out) {
    akv_route_seq_params p = in ? *in : (akv_route_seq_params){0};
    if (p.max_history == 0) p.max_history = r->max_history;
    if (p.exact > 1) {
        AKV_LOG_E("route: a sequence's exact flag is %u (0 or 1)", p.exact);
        return AKV_EINVAL;
    }
    if (p.max_history > r->max_history) {
        AKV_LOG_E("route: a sequence of {=max_history} %llu; the route's tables hold %llu "
                  "({=max_history})",
                  (unsigned long long)p.max_history, (unsigned long long)r->max_history);
        return AKV_EINVAL;
    }
    akv_dev_pool_stats ps;
    akv_dev_pool_get_stats(r->dp, &ps);
    akv_status st = r->kind->window(r, &p, ps.window_capacity);
    if (st) return st;
    *out = p;
    return AKV_OK;
}

akv_status akv_route_seq_open(akv_route *r, const akv_route_seq_params *p, akv_route_seq **out) {
    if (!r || !out) {
        AKV_LOG_E("route: seq_open with a NULL %s", !r ? "route" : "output");
        return AKV_EINVAL;
    }
    akv_route_seq_params sp;
    akv_status st = seq_params_resolve(r, p, &sp);
    if (st) return st;
    akv_route_seq *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    s->r = r, s->p = sp, s->slot = -1;
    s->stats.tag = sp.tag;
    if (!(s->staged = akv__calloc(r->max_pages, sizeof *s->staged)) ||
        !(s->runs = akv__calloc(r->max_pages, sizeof *s->runs)))
        st = AKV_ENOMEM;
    akv_dev_pool_ctx_params cp = {.target = sp.target, .burst = sp.burst, .tag = sp.tag};
    if (!st && (st = akv_host_table_create(r->hp, &s->ht)) == AKV_OK)
        st = akv_dev_pool_ctx_open(r->dp, &cp, &s->ctx);
    if (!st && r->dpc) { /* its compact pages: every one of its history's, resident; or
                            (staged) a window of them, and its compact copies */
        akv_dev_pool_ctx_params ccp = {.target = akv__route_floor_pages(&r->geom, sp.max_history),
                                       .tag = sp.tag};
        if (r->hpc) ccp.target = r->ctarget, ccp.burst = r->cburst;
        st = akv_dev_pool_ctx_open(r->dpc, &ccp, &s->cctx);
        if (!st && r->hpc && (st = akv_host_table_create(r->hpc, &s->cht)) == AKV_OK)
            st = (s->cstaged = akv__calloc(r->max_pages, sizeof *s->cstaged)) ? AKV_OK : AKV_ENOMEM;
    }
    s->x0 = 1;
    if (st) {
        (void)seq_free(r, s);
        return st;
    }
    seq_list_push(&r->open_list, s);
    r->n_open++;
    *out = s;
    return AKV_OK;
}

akv_status akv_route_seq_set_params(akv_route *r, akv_route_seq *s, const akv_route_seq_params *p) {
    akv_status st = route_seq_ready(r, s, "set_params");
    if (st) return st;
    akv_route_seq_params sp;
    akv_route_seq_params keep = p ? *p : (akv_route_seq_params){0};
    keep.exact = s->p.exact; /* fixed at open: its compact part is what it is */
    if ((st = seq_params_resolve(r, &keep, &sp))) return st;
    if (sp.max_history < s->n_tokens) {
        AKV_LOG_E("route: set_params: {=max_history} %llu is below the history's %llu tokens",
                  (unsigned long long)sp.max_history, (unsigned long long)s->n_tokens);
        return AKV_EINVAL;
    }
    if ((st = akv_dev_pool_ctx_set_target(r->dp, s->ctx, sp.target, sp.burst))) return st;
    if (r->dpc && !r->hpc &&
        (st = akv_dev_pool_ctx_set_target(r->dpc, s->cctx,
                                          akv__route_floor_pages(&r->geom, sp.max_history), 0)))
        return st;
    sp.tag = s->p.tag; /* the pool's context keeps its tag */
    s->p = sp;
    return AKV_OK;
}

akv_status akv_route_seq_close(akv_route *r, akv_route_seq *s) {
    if (!s) return AKV_OK;
    akv_status st = route_seq_ok(r, s, "close");
    if (st) return st;
    seq_list_remove(&r->open_list, s);
    r->n_open--;
    s->closing = true;
    seq_list_push(&r->closing_list, s);
    route_finish_closes(r); /* now, when nothing of a step is in flight */
    return AKV_OK;
}

/* ---- create / destroy ----------------------------------------------------------------------- */

/* A compact tier asked of the route: a compact pool of that representation over the same
 * geometry and a kind that serves one. */
static akv_status route_tier_check(const akv_route_params *p, const akv_host_pool *host_pool,
                                   const akv_dev_pool *dev_pool) {
    if (p->tier == AKV_REPR_EXACT) {
        if (!p->compact_pool && !p->compact_host_pool) return AKV_OK;
        AKV_LOG_E("route: a compact pool is given with no compact {=kv_tier}");
        return AKV_EINVAL;
    }
    if ((unsigned)p->tier >= AKV_REPR_COUNT || !p->compact_pool) {
        AKV_LOG_E("route: {=kv_tier} %d needs a compact pool of that representation",
                  (int)p->tier);
        return AKV_EINVAL;
    }
    if (!akv__route_kind_tiered(p->kind, p->tier)) {
        AKV_LOG_E("route: {=kv_tier} %s: no compact tier serves the %s route",
                  akv_repr_name(p->tier), akv_route_kind_name(p->kind));
        return AKV_EUNSUPPORTED;
    }
    const akv_geom *g = akv_dev_pool_geom(dev_pool), *gc = akv_dev_pool_geom(p->compact_pool);
    const size_t cbytes = akv_geom_repr_page_bytes(g, p->tier);
    akv_dev_pool_stats cs;
    akv_dev_pool_get_stats(p->compact_pool, &cs);
    if (!route_same_geom(g, gc) || cs.page_bytes != cbytes) {
        AKV_LOG_E("route: the compact pool is not one of %s pages of the exact pool's geometry",
                  akv_repr_name(p->tier));
        return AKV_EINVAL;
    }
    const bool staged = p->kind == AKV_ROUTE_STAGED;
    if (staged != (p->compact_host_pool != NULL)) {
        AKV_LOG_E("route: %s", staged ? "the staged compact route needs a host pool of compact "
                                        "pages for the compact copies"
                                      : "a host pool of compact pages serves the staged route only");
        return AKV_EINVAL;
    }
    if (staged && (!route_same_geom(g, akv_host_pool_geom(p->compact_host_pool)) ||
                   akv_host_pool_page_bytes(p->compact_host_pool) != cbytes)) {
        AKV_LOG_E("route: the compact host pool is not one of %s pages of the exact pool's "
                  "geometry",
                  akv_repr_name(p->tier));
        return AKV_EINVAL;
    }
    if (staged) { /* every exact host page may have its compact copy */
        akv_host_pool_stats hs, chs;
        akv_host_pool_get_stats(host_pool, &hs);
        akv_host_pool_get_stats(p->compact_host_pool, &chs);
        if (chs.capacity_pages < hs.capacity_pages) {
            AKV_LOG_E("route: the compact host pool holds %llu pages; the host pool %llu, and "
                      "each may have its compact copy (akv_route_plan_split sizes both)",
                      (unsigned long long)chs.capacity_pages,
                      (unsigned long long)hs.capacity_pages);
            return AKV_EINVAL;
        }
    }
    return AKV_OK;
}

static akv_status route_free(akv_route *r);

akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out) {
    if (!dev || !host_pool || !dev_pool || !p || !out) {
        AKV_LOG_E("route: create with a NULL %s", !dev ? "device" : !host_pool ? "host pool" : !dev_pool ? "device pool" : !p ? "params" : "output");
        return AKV_EINVAL;
    }
    const akv__route_kind *kind = route_kind_logged(p->kind);
    if (!kind) return AKV_EINVAL;
    akv_dev_info info;
    akv_status st = akv_dev_get_info(dev, &info);
    if (st) return st;
    if ((st = route_tier_check(p, host_pool, dev_pool))) return st;
    if (p->tier != AKV_REPR_EXACT && !(kind = akv__route_kind_tiered(p->kind, p->tier))) {
        AKV_LOG_E("route: the %s route has no compact tier ({=kv_tier} %s): use the resident or "
                  "the staged route for one",
                  akv_route_kind_name(p->kind), akv_repr_name(p->tier));
        return AKV_EUNSUPPORTED;
    }
    if (!info.is_host && !p->queued) {
        AKV_LOG_E("route: device '%s': the direct mode (host tables, host forward pass) needs the "
                  "host backend; use the queued mode",
                  info.name);
        return AKV_EUNSUPPORTED;
    }
    const akv_geom *g = akv_dev_pool_geom(dev_pool);
    if (!route_same_geom(g, akv_host_pool_geom(host_pool))) {
        AKV_LOG_E("route: the host pool and the device pool have different geometries");
        return AKV_EINVAL;
    }
    const uint32_t max_seqs = p->max_seqs ? p->max_seqs : 1;
    uint64_t n_lp = akv_geom_pages_for_tokens(g, p->max_history);
    if (p->max_history == 0 || max_seqs > AKV_ROUTE_MAX_SEQS ||
        n_lp * max_seqs > INT32_MAX / g->n_layers) {
        AKV_LOG_E("route: {=max_history} %llu x {=max_seqs} %u is out of range (at most %u sequences, "
                  "and page ids of every layer below 2^31)",
                  (unsigned long long)p->max_history, max_seqs, AKV_ROUTE_MAX_SEQS);
        return AKV_EINVAL;
    }
    akv_dev_pool_stats ps;
    akv_dev_pool_get_stats(dev_pool, &ps);
    /* the kind's window for a sequence of the route's longest history must fit the pool */
    akv_route_plan tp = {.kind = p->kind};
    (void)akv_route_plan_tier(&tp, AKV_REPR_EXACT, p->exact_recent, p->max_step, g,
                              p->max_history, max_seqs); /* the defaults it resolves */
    const akv_route probe = {.geom = *g,
                             .kind = kind,
                             .max_history = p->max_history,
                             .exact_recent = tp.exact_recent,
                             .max_step = tp.max_step,
                             .window_pages = p->window_pages ? p->window_pages
                                                             : AKV_ROUTE_WINDOW_PAGES};
    akv_route_seq_params longest = {.max_history = p->max_history};
    if ((st = kind->window(&probe, &longest, ps.window_capacity))) return st;

    akv_route *r = akv__calloc(1, sizeof *r);
    if (!r) return AKV_ENOMEM;
    r->dev = dev, r->hp = host_pool, r->dp = dev_pool, r->geom = *g, r->kind = kind;
    r->max_history = p->max_history;
    r->max_pages = (uint32_t)n_lp;
    r->max_seqs = max_seqs;
    r->window_pages = probe.window_pages;
    r->exact_recent = probe.exact_recent, r->max_step = probe.max_step;
    r->queued = p->queued;
    r->open_layer = -1, r->copen_layer = -1;
    r->head_ints = (2 * (size_t)max_seqs + 1 + AKV__ROUTE_HEAD_ALIGN - 1) / AKV__ROUTE_HEAD_ALIGN *
                   AKV__ROUTE_HEAD_ALIGN;
    r->cap = (size_t)max_seqs * n_lp;
    const size_t tab_bytes = (r->head_ints + r->cap * g->n_layers) * sizeof(int32_t);
    r->step = akv__calloc(max_seqs, sizeof *r->step);
    r->order = akv__calloc(r->cap, sizeof *r->order);
    st = r->step && r->order ? AKV_OK : AKV_ENOMEM;
    if (!st && r->queued) {
        r->ev = akv__calloc(g->n_layers, sizeof *r->ev);
        st = r->ev ? AKV_OK : AKV_ENOMEM;
        if (!st && (st = akv_dev_pinned_alloc(dev, tab_bytes, (void **)&r->tab_h)) == AKV_OK) {
            memset(r->tab_h, 0, tab_bytes);
            st = akv_dev_mem_alloc(dev, tab_bytes, &r->tab_d);
        }
        for (uint32_t l = 0; l < g->n_layers && !st; l++)
            st = akv_dev_event_create(dev, 0, &r->ev[l]);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_wb);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_fill);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_fill_h2d);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_fill_c);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_tab);
        if (!st) {
            r->ev_lfill = akv__calloc(g->n_layers, sizeof *r->ev_lfill);
            r->lfill_wait = akv__calloc(g->n_layers, 1);
            r->fill_end = akv__calloc((size_t)g->n_layers + 1, sizeof *r->fill_end);
            st = r->ev_lfill && r->lfill_wait && r->fill_end ? AKV_OK : AKV_ENOMEM;
        }
        for (uint32_t l = 0; l < g->n_layers && !st; l++)
            st = akv_dev_event_create(dev, 0, &r->ev_lfill[l]);
    } else if (!st) {
        r->tab_h = akv__calloc(tab_bytes / sizeof(int32_t), sizeof(int32_t));
        st = r->tab_h ? AKV_OK : AKV_ENOMEM;
    }
    if (r->tab_h) {
        r->indptr = r->tab_h;
        r->last = r->tab_h + max_seqs + 1;
        r->indices = r->tab_h + r->head_ints;
    }
    if (!st && p->tier != AKV_REPR_EXACT) { /* the compact part's table, laid out the same */
        r->dpc = p->compact_pool, r->tier = p->tier;
        (void)akv_repr_layout_of(p->tier, g->dtype, g->n_kv_heads, g->page_tokens, g->head_dim,
                                 &r->clayout); /* checked: route_tier_check */
        r->c_order = akv__calloc(r->cap, sizeof *r->c_order);
        r->cpage = akv__malloc(r->clayout.page_bytes);
        st = r->c_order && r->cpage ? AKV_OK : AKV_ENOMEM;
        const size_t cstage_bytes = (size_t)AKV__ROUTE_CSTAGE_PAGES * r->clayout.page_bytes;
        if (!st && r->queued) {
            if ((st = akv_dev_pinned_alloc(dev, tab_bytes, (void **)&r->ctab)) == AKV_OK) {
                memset(r->ctab, 0, tab_bytes);
                st = akv_dev_mem_alloc(dev, tab_bytes, &r->ctab_d);
            }
            if (!st) st = akv_dev_pinned_alloc(dev, cstage_bytes, (void **)&r->cstage);
            /* a step makes at most every compact page of every layer on the device */
            r->dpairs_cap = (uint32_t)(r->cap * g->n_layers);
            const size_t pb = (size_t)r->dpairs_cap * 2 * sizeof(int32_t);
            if (!st && (st = akv_dev_pinned_alloc(dev, pb, (void **)&r->dpairs_h)) == AKV_OK)
                st = akv_dev_mem_alloc(dev, pb, &r->dpairs_d);
        } else if (!st) {
            r->ctab = akv__calloc(tab_bytes / sizeof(int32_t), sizeof(int32_t));
            r->cstage = akv__malloc(cstage_bytes);
            st = r->ctab && r->cstage ? AKV_OK : AKV_ENOMEM;
        }
        if (!st) st = akv__par_create(p->encode_threads, &r->cpar);
        r->hpc = p->compact_host_pool;
        if (r->ctab) {
            r->c_indptr = r->ctab;
            r->c_last = r->ctab + max_seqs + 1;
            r->c_indices = r->ctab + r->head_ints;
        }
    }
    if (!st && r->kind->open) st = r->kind->open(r, p);
    if (st) {
        (void)route_free(r); /* nothing was enqueued: no wait */
        return st;
    }
    *out = r;
    return AKV_OK;
}

/* Frees what the route holds (nothing may touch it any more). */
static akv_status route_free(akv_route *r) {
    akv_status st;
    if (r->own_stage && r->stage && (st = akv_stage_destroy(r->stage))) return st;
    if (r->kind->free) r->kind->free(r);
    r->own_stage = false;
    if (r->cst && (st = akv_stage_destroy(r->cst))) return st;
    r->cst = NULL;
    akv__free(r->hpages);
    akv__free(r->slot_ids);
    akv__free(r->pf_pages);
    akv__free(r->pf_seqs);
    akv__free(r->pf_len);
    akv__free(r->lease);
    akv__free(r->lease_live);
    akv__free(r->cslot_ids);
    akv__free(r->chpages);
    akv__free(r->clease);
    akv__free(r->clease_live);
    akv__free(r->step);
    akv__free(r->order);
    akv__free(r->times);
    akv__free(r->c_order);
    akv__free(r->cpage);
    akv__free(r->cjobs);
    akv__par_destroy(r->cpar);
    if (r->queued) {
        if (r->ctab) akv_dev_pinned_free(r->dev, r->ctab);
        if (r->cstage) akv_dev_pinned_free(r->dev, r->cstage);
        if (r->dpairs_h) akv_dev_pinned_free(r->dev, r->dpairs_h);
        akv_dev_mem_free(r->dev, r->dpairs_d);
        akv_dev_mem_free(r->dev, r->ctab_d);
        for (uint32_t l = 0; r->ev && l < r->geom.n_layers; l++)
            akv_dev_event_destroy(r->dev, r->ev[l]);
        akv_dev_event_destroy(r->dev, r->ev_wb);
        akv_dev_event_destroy(r->dev, r->ev_fill);
        akv_dev_event_destroy(r->dev, r->ev_fill_h2d);
        akv_dev_event_destroy(r->dev, r->ev_fill_c);
        akv_dev_event_destroy(r->dev, r->ev_tab);
        for (uint32_t l = 0; r->ev_lfill && l < r->geom.n_layers; l++)
            akv_dev_event_destroy(r->dev, r->ev_lfill[l]);
        akv__free(r->ev_lfill);
        akv__free(r->lfill_wait);
        akv__free(r->fill_end);
        akv__free(r->ev);
        akv_dev_mem_free(r->dev, r->tab_d);
        if (r->tab_h) akv_dev_pinned_free(r->dev, r->tab_h);
    } else {
        akv__free(r->tab_h);
        akv__free(r->ctab);
        akv__free(r->cstage);
    }
    akv__free(r->fills);
    akv__free(r->fill_layer);
    akv__free(r->fills_by);
    akv__free(r);
    return AKV_OK;
}

akv_status akv_route_destroy(akv_route *r) {
    if (!r) return AKV_OK;
    if (r->n_open || (r->kind->live && r->kind->live(r))) {
        AKV_LOG_E("route: destroy refused: %s (close the sequences and akv_route_sync first)",
                  r->n_open ? "sequences are open" : "staged leases are not retired");
        return AKV_EBUSY;
    }
    /* queued: no copy may still touch a table or a closed sequence's page that is about to be
     * freed (a step it was in is not settled: it goes away with the route) */
    akv_status st = akv__route_wait(r);
    if (st) return st;
    r->pending = false, r->step_done = true;
    route_finish_closes(r);
    return route_free(r);
}

/* ---- fills, write-back, settle -------------------------------------------------------------- */

/* Copies a fresh device page's earlier tokens from the host copy (the whole page: its unused
 * slots are overwritten before anything reads them). Queued, the copy joins the step's fills,
 * which route_fills_send sends as one batched copy a layer (a returning conversation's window is
 * thousands of pages: one copy each would run the bus at its small-copy rate). */
static akv_status route_fill(akv_route *r, akv_route_seq *s, uint32_t layer, uint32_t logical,
                             uint32_t page_id) {
    akv_host_page hpg = akv_host_table_page(s->ht, layer, logical);
    void *src = akv_host_pool_page_addr(r->hp, hpg);
    size_t n = akv_geom_page_bytes(&r->geom);
    akv_dptr dst = akv_dev_pool_page_addr(r->dp, page_id);
    akv_status st = AKV_OK;
    if (r->queued) {
        st = akv__array_reserve((void **)&r->fills, &r->cap_fills, r->n_fills + 1, sizeof *r->fills);
        if (!st)
            st = akv__array_reserve((void **)&r->fill_layer, &r->cap_fill_layer, r->n_fills + 1,
                                    sizeof *r->fill_layer);
        if (!st) {
            r->fill_layer[r->n_fills] = layer;
            r->fills[r->n_fills++] = (akv_dev_xfer){.d = dst, .h = src, .n_bytes = n};
        }
    } else {
        st = akv_dev_copy_h2d_sync(r->dev, dst, src, n);
    }
    if (st == AKV_OK) r->stats.h2d_bytes += n, s->stats.h2d_bytes += n;
    return st;
}

/* The step's fills on the H2D queue, one batched copy a layer, each followed by its event,
 * which the compute queue waits for at that layer's begin_layer: a layer's fills cross the bus
 * while the layers before it compute (a returning conversation's whole window is filled in its
 * first step). Sent at the first begin_layer, not at begin_step: copies to the device from any
 * queue share the copy engine in the order they are sent, so the step's own small uploads
 * (the tables, the pass's token ids) go first and the pass starts at once. Nothing enqueued
 * earlier still reads a fresh page: begin_step's sync drained the compute and D2H queues; the
 * H2D queue waits for ev_fill all the same (as the compute queue does, route_order_fills), so
 * the order holds without that drain, and for the compute queue's work of this step so far
 * (ev_fill_c: a hybrid step's compact pages are encoded there from exact pages that may leave
 * the window this step). The host pages are pinned and hold earlier tokens only: nothing
 * rewrites them while the copies are pending. */
static akv_status route_fills_send(akv_route *r) {
    const size_t n = r->n_fills;
    const uint32_t L = r->geom.n_layers;
    r->n_fills = 0;
    if (!n) return AKV_OK;
    /* ordered by layer, a layer's in the order given: end[l] moves from where layer l's fills
     * start in fills_by to where they end */
    akv_status st = akv__array_reserve((void **)&r->fills_by, &r->cap_fills_by, n, sizeof *r->fills_by);
    if (st) return st;
    size_t *end = r->fill_end;
    memset(end, 0, ((size_t)L + 1) * sizeof *end);
    for (size_t i = 0; i < n; i++) end[r->fill_layer[i] + 1]++;
    for (uint32_t l = 0; l < L; l++) end[l + 1] += end[l];
    for (size_t i = 0; i < n; i++) r->fills_by[end[r->fill_layer[i]]++] = r->fills[i];
    st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_H2D, r->ev_fill);
    if (!st) st = akv_dev_event_record(r->dev, r->ev_fill_c, AKV_QUEUE_COMPUTE);
    if (!st) st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_H2D, r->ev_fill_c);
    if (!st) r->fills_h2d = true;
    for (uint32_t l = 0, from = 0; l < L && !st; from = (uint32_t)end[l], l++) {
        const size_t k = end[l] - from;
        if (!k) continue;
        st = akv_dev_copy_h2d_batch_async(r->dev, AKV_QUEUE_H2D, r->fills_by + from, k);
        if (!st) st = akv_dev_event_record(r->dev, r->ev_lfill[l], AKV_QUEUE_H2D);
        if (!st) r->lfill_wait[l] = 1;
    }
    return st;
}

/* The bytes of page p of a table's layer l, to be written: a page only this table holds (a
 * shared page is full and never written again, akv/host_table.h; this is where that holds). */
static uint8_t *route_page_to_write(akv_host_pool *pool, const akv_host_table *t, uint32_t l, uint64_t p) {
    const akv_host_page h = akv_host_table_page(t, l, (uint32_t)p);
    AKV_ASSERT(akv_host_pool_page_n_owners(pool, h) == 1);
    return akv_host_pool_page_addr(pool, h);
}

/* One sequence's new rows of `layer` to its host copy, per page touched: queued, one 2D copy on
 * the D2H queue (2*n_kv_heads runs of rows at a pitch of P rows); direct, one synchronous copy
 * per run. */
akv_status akv__route_copy_rows(akv_route *r, akv_route_seq *s, uint32_t layer) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype), pitch = (size_t)P * row;
    for (uint64_t p = s->step_first / P; p * P < s->n_tokens; p++) {
        uint64_t t0, t1;
        akv__route_page_rows(r, s, p, &t0, &t1);
        akv_dptr dpage = akv_dev_pool_page_addr(r->dp, akv__route_page_id(r, s, layer, p));
        uint8_t *hpage = route_page_to_write(r->hp, s->ht, layer, p);
        size_t w = (size_t)(t1 - t0) * row;
        if (r->queued) {
            size_t off = (size_t)t0 * row;
            akv_status st = akv_dev_copy_d2h_2d_async(r->dev, AKV_QUEUE_D2H, hpage + off, pitch,
                                                      akv_dptr_offset(dpage, off), pitch, w,
                                                      2 * (size_t)g->n_kv_heads);
            if (st) return st;
            r->stats.d2h_bytes += w * 2 * g->n_kv_heads, s->stats.d2h_bytes += w * 2 * g->n_kv_heads;
            continue;
        }
        for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
            size_t off = kvh * pitch + (size_t)t0 * row;
            akv_status st = akv_dev_copy_d2h_sync(r->dev, hpage + off, akv_dptr_offset(dpage, off), w);
            if (st) return st;
            r->stats.d2h_bytes += w, s->stats.d2h_bytes += w;
        }
    }
    return AKV_OK;
}

/* Before a step fills or writes its fresh pages: a page the device pool placed may have left
 * another context's window (reclaimed) or this one's, a write-back of another route may still
 * be reading it, and a fill of another route's step that never reached that layer (its pass
 * failed) may still be writing it (docs/mem.md, "Fences"). Queued: the compute queue (the
 * pass's kernels) waits for every write-back and every copy to the device enqueued so far;
 * direct: the host waits for the write-back and compute queues. */
static akv_status route_order_fills(akv_route *r) {
    if (!r->queued) {
        akv_status st = akv_dev_queue_sync(r->dev, AKV_QUEUE_D2H);
        return st ? st : akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    }
    akv_status st = akv_dev_event_record(r->dev, r->ev_fill, AKV_QUEUE_D2H);
    if (!st) st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_COMPUTE, r->ev_fill);
    if (!st) st = akv_dev_event_record(r->dev, r->ev_fill_h2d, AKV_QUEUE_H2D);
    return st ? st : akv_dev_queue_wait_event(r->dev, AKV_QUEUE_COMPUTE, r->ev_fill_h2d);
}

/* A sequence's part of the step route_settle cannot establish: its history goes back to
 * where the step began, its next step refills its window, and the caller hears it (*lost;
 * `why` for the log). */
static akv_status seq_undo(akv_route *r, akv_route_seq *s, const char *why, bool *lost) {
    if (s->closing) return AKV_OK; /* going away: nothing to keep */
    AKV_LOG_E("route: the step of sequence %llu to %llu tokens %s; its history is back to %llu "
              "tokens (feed them again)",
              (unsigned long long)s->p.tag, (unsigned long long)s->n_tokens, why,
              (unsigned long long)s->step_first);
    akv_status st = seq_host_truncate(s, s->step_first);
    if (st) return st;
    s->n_tokens = s->step_first;
    seq_shortened(s, s->n_tokens);
    s->refill = true;
    *lost = true;
    return AKV_OK;
}

/* Whether every device page that received the step's rows of s is still its own (a page only
 * changes owner through some context's step, so one still in the window was written by no one
 * else since). */
static bool seq_holds_step(const akv_route *r, const akv_route_seq *s) {
    const uint32_t P = r->geom.page_tokens;
    for (uint32_t l = 0; l < r->geom.n_layers; l++)
        for (uint64_t p = s->step_first / P; p * P < s->n_tokens; p++)
            if (akv_dev_pool_ctx_find(r->dp, s->ctx, l, (uint32_t)p) !=
                (int64_t)akv__route_page_id(r, s, l, p))
                return false;
    return true;
}

/* Resident, queued, once the queues are idle (akv__route_wait returned OK): makes sure the rows
 * of a step whose write-backs were all enqueued are in the host copies. Its kernels and
 * write-backs completed, but maybe not without error (a queue failed while they ran, then the
 * device recovered):
 *   - kernels failed: the device pages lack the rows too, so every sequence of the step is
 *     undone (seq_undo) and *lost is set: the pass may have returned OK (a prompt chunk that
 *     reads no logits), the caller must hear it;
 *   - write-backs failed: enqueued again from the device pages, which hold the rows, and
 *     waited for; except for a sequence another context's step has taken one of those pages
 *     from since (a reclaim: it may have written its own rows there), which is undone.
 * A backend that cannot tell how they ended (CUDA after an error) leaves the check pending:
 * the next call tries again. (A step whose pass failed before its last write-back is the
 * caller's to abort; a staged route's stage reports a failed write-back at retire and stays
 * failed.) */
static akv_status route_settle(akv_route *r, bool *lost) {
    *lost = false;
    if (!r->wb_check) return AKV_OK;
    const uint32_t n_layers = r->geom.n_layers;
    int failed = 0;
    akv_status st = akv_dev_event_outcome(r->dev, r->ev[n_layers - 1], &failed);
    if (st) return st;
    if (failed) {
        for (uint32_t i = 0; i < r->n_step && !st; i++)
            if (r->step[i] && r->step[i]->n_tokens > r->step[i]->step_first)
                st = seq_undo(r, r->step[i], "failed on the device after its pass returned", lost);
        if (st == AKV_OK) r->wb_check = false; /* else the next call tries again */
        return st;
    }
    if ((st = akv_dev_event_outcome(r->dev, r->ev_wb, &failed))) return st;
    if (failed) {
        bool redone = false;
        for (uint32_t i = 0; i < r->n_step && !st; i++) {
            akv_route_seq *s = r->step[i];
            if (!s || s->closing) continue;
            if (!seq_holds_step(r, s)) {
                st = seq_undo(r, s, "lost its write-back to a device failure, and another "
                                    "context has taken its device pages since", lost);
                continue;
            }
            AKV_LOG_W("route: the write-back of sequence %llu's tokens %llu..%llu failed; writing "
                      "it back again from the device pages",
                      (unsigned long long)s->p.tag, (unsigned long long)s->step_first,
                      (unsigned long long)s->n_tokens - 1);
            for (uint32_t l = 0; l < n_layers && !st; l++) st = akv__route_copy_rows(r, s, l);
            redone = true;
        }
        if (!st && redone) st = akv_dev_event_record(r->dev, r->ev_wb, AKV_QUEUE_D2H);
        if (st || (redone && (st = akv__route_wait(r)))) return st;
    }
    r->wb_check = false;
    return AKV_OK;
}

/* The last step's transport retired (and a prefetch with it unless keep_prefetch), the queues
 * waited for, the step settled; then closed sequences freed. *lost: a step (or part of one)
 * was undone. */
static akv_status route_sync(akv_route *r, bool keep_prefetch, bool *lost) {
    bool quarantined = false;
    *lost = false;
    akv_status first = r->kind->retire ? r->kind->retire(r, keep_prefetch, &quarantined) : AKV_OK;
    /* a lease retained (its completion unknown) keeps its pages; one released after a failure
     * does not: the stage has quarantined, the rest of the sync goes on */
    if (first && r->kind->live && r->kind->live(r)) return first;
    akv_status st;
    if ((st = akv__route_wait(r)) || (st = route_settle(r, lost))) return st;
    if (r->transport_lost) {
        /* staged: a lease of the last step failed; its write-backs may be missing from the
         * host copies (and its slots are gone with the stage): the step is undone, and every
         * window refilled */
        for (uint32_t i = 0; i < r->n_step && !st; i++)
            if (r->step[i] && r->step[i]->n_tokens > r->step[i]->step_first)
                st = seq_undo(r, r->step[i], "lost its staging to a device failure", lost);
        if (st) return st;
        route_distrust_all(r);
        r->transport_lost = false;
    }
    r->pending = false;
    route_finish_closes(r);
    return first;
}

akv_status akv_route_sync(akv_route *r) {
    if (!r) return AKV_EINVAL;
    bool lost;
    akv_status st = route_sync(r, false, &lost);
    return st ? st : lost ? AKV_EDEVICE : AKV_OK;
}

akv_status akv_route_abort_step(akv_route *r) {
    if (!r) return AKV_EINVAL;
    /* queued: a failed step may have write-backs in flight into pages truncation frees;
     * staged: its leases hold those pages until they retire */
    bool lost;
    akv_status st = route_sync(r, false, &lost);
    if (st) return st;
    for (uint32_t i = 0; i < r->n_step; i++) {
        akv_route_seq *s = r->step[i];
        /* (a sequence truncated below the step's start since has nothing of it left) */
        if (!s || s->closing || s->n_tokens <= s->step_first) continue;
        if ((st = seq_host_truncate(s, s->step_first))) return st;
        s->n_tokens = s->step_first;
        seq_shortened(s, s->n_tokens);
    }
    r->step_done = true; /* the step is over: closed sequences of it may go */
    route_finish_closes(r);
    return AKV_OK;
}

/* Hands each of s's host pages holding its first n_tokens, layer by layer, each layer's pages
 * in order, to fn (a fill writes them: its pointer is the page's; a read only reads). */
static akv_status seq_pages_walk(akv_route *r, const akv_route_seq *s, uint64_t n_tokens,
                                 akv_route_fill_fn fn, void *user) {
    const uint32_t pages = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_tokens);
    const size_t pb = akv_host_pool_page_bytes(r->hp);
    akv_status st = AKV_OK;
    for (uint32_t l = 0; !st && l < r->geom.n_layers; l++)
        for (uint32_t lp = 0; !st && lp < pages; lp++)
            st = fn(user, l, lp, akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, lp)), pb);
    return st;
}

/* A sequence opened (params p) to hold a history of n_tokens: AKV_EINVAL (logged, nothing
 * opened) when its params allow fewer. */
static akv_status seq_open_for(akv_route *r, const akv_route_seq_params *p, uint64_t n_tokens,
                               akv_route_seq **out) {
    akv_route_seq *s;
    akv_status st = akv_route_seq_open(r, p, &s);
    if (st) return st;
    if (n_tokens > s->p.max_history) {
        AKV_LOG_E("route: a history of %llu tokens into a sequence of {=max_history} %llu",
                  (unsigned long long)n_tokens, (unsigned long long)s->p.max_history);
        (void)akv_route_seq_close(r, s);
        return AKV_EINVAL;
    }
    *out = s;
    return AKV_OK;
}

/* A sequence opened (params p) with host pages for n_tokens, their contents not yet written
 * (the compact copies and pages are made from the exact copy as they are needed: c_valid and
 * hc_valid 0; the device window is filled from it at the first step, its pages fresh). */
static akv_status seq_open_sized(akv_route *r, const akv_route_seq_params *p, uint64_t n_tokens,
                                 akv_route_seq **out) {
    akv_route_seq *s;
    akv_status st = seq_open_for(r, p, n_tokens, &s);
    if (st) return st;
    st = akv_host_table_grow(s->ht, n_tokens);
    if (!st && s->cht) st = akv_host_table_grow(s->cht, n_tokens);
    if (st == AKV_EFULL) AKV_LOG_E("route: the host pool is full: raise {=host_gib}");
    if (st) {
        (void)akv_route_seq_close(r, s);
        return st;
    }
    s->n_tokens = n_tokens;
    *out = s;
    return AKV_OK;
}

akv_status akv_route_seq_open_filled(akv_route *r, const akv_route_seq_params *p,
                                     uint64_t n_tokens, akv_route_fill_fn fill, void *user,
                                     akv_route_seq **out) {
    if (!r || !fill || !out) return AKV_EINVAL;
    akv_route_seq *s;
    akv_status st = seq_open_sized(r, p, n_tokens, &s);
    if (!st && (st = seq_pages_walk(r, s, n_tokens, fill, user))) (void)akv_route_seq_close(r, s);
    if (!st) *out = s;
    return st;
}

akv_status akv_route_seq_open_unfilled(akv_route *r, const akv_route_seq_params *p,
                                       uint64_t n_tokens, void **pages, akv_route_seq **out) {
    if (!r || !pages || !out || n_tokens == 0) return AKV_EINVAL;
    akv_route_seq *s;
    akv_status st = seq_open_sized(r, p, n_tokens, &s);
    if (st) return st;
    const uint32_t n_pages = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_tokens);
    for (uint32_t l = 0; l < r->geom.n_layers; l++)
        for (uint32_t lp = 0; lp < n_pages; lp++)
            pages[(size_t)l * n_pages + lp] =
                akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, lp));
    s->unfilled = true;
    *out = s;
    return AKV_OK;
}

akv_status akv_route_seq_mark_filled(akv_route *r, akv_route_seq *s) {
    akv_status st = route_seq_ok(r, s, "mark_filled");
    if (st) return st;
    if (!s->unfilled) {
        AKV_LOG_E("route: mark_filled of sequence %llu, which was not opened unfilled",
                  (unsigned long long)s->p.tag);
        return AKV_ESTATE;
    }
    s->unfilled = false;
    return AKV_OK;
}

/* A read of pages through the walker (which hands them as a fill would). */
typedef struct seq_read {
    akv_route_read_fn read;
    void *user;
} seq_read;

static akv_status seq_read_page(void *user, uint32_t layer, uint32_t page, void *bytes, size_t n) {
    const seq_read *r = user;
    return r->read(r->user, layer, page, bytes, n);
}

akv_status akv_route_seq_read_pages(akv_route *r, akv_route_seq *s, akv_route_read_fn read,
                                    void *user) {
    akv_status st = route_seq_ready(r, s, "read_pages");
    if (st || !read) return st ? st : AKV_EINVAL;
    /* the host copy complete: every write-back landed */
    if ((st = akv_route_sync(r))) return st;
    seq_read r_ = {read, user};
    return seq_pages_walk(r, s, s->n_tokens, seq_read_page, &r_);
}

akv_status akv_route_seq_fork(akv_route *r, akv_route_seq *src, uint64_t n_tokens,
                              const akv_route_seq_params *p, akv_route_seq **out) {
    akv_status st = route_seq_ready(r, src, "fork");
    if (st || !out) return st ? st : AKV_EINVAL;
    /* the host copies complete: every write-back landed (lost: AKV_EDEVICE, logged: the
     * caller's lengths are not the route's now) */
    if ((st = akv_route_sync(r))) return st;
    if (n_tokens > src->n_tokens) {
        AKV_LOG_E("route: fork of %llu tokens: the history holds %llu",
                  (unsigned long long)n_tokens, (unsigned long long)src->n_tokens);
        return AKV_EINVAL;
    }
    akv_route_seq *s;
    if ((st = seq_open_for(r, p, n_tokens, &s))) return st;
    /* src's full pages shared (neither writes them again: akv/host_table.h), with the compact
     * copies made of them; the partial last page copied, since both write on from there */
    const uint32_t P = r->geom.page_tokens, full = (uint32_t)(n_tokens / P);
    const uint32_t hc = s->cht ? (src->hc_valid < full ? src->hc_valid : full) : 0;
    st = akv_host_table_share(s->ht, src->ht, full);
    if (!st) st = akv_host_table_grow(s->ht, n_tokens);
    if (!st && s->cht && !(st = akv_host_table_share(s->cht, src->cht, hc)))
        st = akv_host_table_grow(s->cht, n_tokens);
    if (st == AKV_EFULL) AKV_LOG_E("route: the host pool is full: raise {=host_gib}");
    if (st) {
        (void)akv_route_seq_close(r, s);
        return st;
    }
    const size_t pb = akv_host_pool_page_bytes(r->hp);
    for (uint32_t l = 0; n_tokens % P && l < r->geom.n_layers; l++)
        memcpy(route_page_to_write(r->hp, s->ht, l, full),
               akv_host_pool_page_addr(r->hp, akv_host_table_page(src->ht, l, full)), pb);
    s->hc_valid = hc; /* the device window, and the compact pages, made at its first step */
    s->n_tokens = n_tokens;
    *out = s;
    return AKV_OK;
}

akv_status akv_route_seq_truncate(akv_route *r, akv_route_seq *s, uint64_t n_tokens) {
    akv_status st = route_seq_ready(r, s, "truncate");
    if (st) return st;
    /* a step the sync undoes (its kernels failed) is what the caller is truncating away */
    bool lost;
    if ((st = route_sync(r, false, &lost))) return st;
    if (n_tokens > s->n_tokens) {
        AKV_LOG_E("route: truncate to %llu tokens: the history holds %llu",
                  (unsigned long long)n_tokens, (unsigned long long)s->n_tokens);
        return lost ? AKV_EDEVICE : AKV_EINVAL; /* lost: the sync just undid that step */
    }
    st = seq_host_truncate(s, n_tokens);
    if (st == AKV_OK) s->n_tokens = n_tokens, seq_shortened(s, n_tokens);
    return st;
}

/* ---- a step --------------------------------------------------------------------------------- */

/* The batch against the route: distinct open sequences, at most max_seqs, lengths that grow
 * within each one's limit (checked after the settle, which may shorten a history). */
static akv_status route_check_batch(akv_route *r, const akv_route_req *reqs, uint32_t n) {
    if (!reqs || n == 0 || n > r->max_seqs) {
        AKV_LOG_E("route: a step of %u sequences; the route takes 1..%u ({=max_seqs})", n,
                  r->max_seqs);
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        const akv_route_seq *s = reqs[i].seq;
        if (!s || !route_has_open(r, s)) {
            AKV_LOG_E("route: sequence %u of the step is not open in this route", i);
            return AKV_EINVAL;
        }
        if (s->unfilled) {
            AKV_LOG_E("route: sequence %llu of the step: its host copy is still being filled",
                      (unsigned long long)s->p.tag);
            return AKV_ESTATE;
        }
        for (uint32_t j = 0; j < i; j++)
            if (reqs[j].seq == s) {
                AKV_LOG_E("route: sequence %llu is named twice in one step (%u and %u)",
                          (unsigned long long)s->p.tag, j, i);
                return AKV_EINVAL;
            }
        if (reqs[i].n_tokens > s->p.max_history) {
            AKV_LOG_E("route: a step of sequence %llu to %llu tokens; its limit is %llu",
                      (unsigned long long)s->p.tag, (unsigned long long)reqs[i].n_tokens,
                      (unsigned long long)s->p.max_history);
            return AKV_EINVAL;
        }
        if (r->dpc && reqs[i].n_tokens > s->n_tokens && reqs[i].n_tokens - s->n_tokens > r->max_step) {
            AKV_LOG_E("route: a step of sequence %llu adds %llu tokens; the compact tier keeps a "
                      "step's tokens exact and was planned for at most %u ({=step_tokens})",
                      (unsigned long long)s->p.tag,
                      (unsigned long long)(reqs[i].n_tokens - s->n_tokens), r->max_step);
            return AKV_EINVAL;
        }
        if (reqs[i].n_tokens <= s->n_tokens) {
            AKV_LOG_E("route: a step of sequence %llu to %llu tokens from %llu does not grow the "
                      "history",
                      (unsigned long long)s->p.tag, (unsigned long long)reqs[i].n_tokens,
                      (unsigned long long)s->n_tokens);
            return AKV_EINVAL;
        }
    }
    return AKV_OK;
}

/* Host copies back to their lengths before the step (the first n of reqs grew). */
static void route_ungrow(akv_route *r, const akv_route_req *reqs, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) (void)seq_host_truncate(reqs[i].seq, reqs[i].seq->n_tokens);
    (void)r;
}

/* A run of pages of s in one residence, joined to the run before it when it continues it. */
static void seq_run_push(akv_route_seq *s, uint32_t first, uint32_t n, akv_kv_residence res,
                         akv_repr repr) {
    akv_kv_run *last = s->n_runs ? &s->runs[s->n_runs - 1] : NULL;
    if (last && last->residence == res && last->repr == repr &&
        last->first + last->n_pages == first) {
        last->n_pages += n;
        return;
    }
    s->runs[s->n_runs++] = (akv_kv_run){first, n, res, repr};
}

/* The placement of s for the step, once the device pool has placed its window: runs of window
 * pages, and of the pages outside it in the kind's residence for them (windows are uniform
 * over layers: layer 0 says it); the staged list is every page of a STAGED run. */
static void route_place(akv_route *r, akv_route_seq *s, uint32_t n_lp) {
    const uint32_t window = akv_dev_pool_ctx_window(s->ctx);
    s->n_runs = 0;
    s->n_staged = 0;
    if (r->dpc) { /* hybrid: the sink, the compact part, the exact part from x0 */
        seq_run_push(s, 0, 1, AKV_KV_WINDOW, AKV_REPR_EXACT);
        for (uint32_t lp = 1, j = 0; lp <= s->n_compact; lp++) { /* staged: outside its window */
            const bool staged = j < s->n_cstaged && s->cstaged[j] == lp;
            j += staged;
            seq_run_push(s, lp, 1, staged ? AKV_KV_STAGED : AKV_KV_WINDOW, r->tier);
        }
        if (n_lp > s->x0) seq_run_push(s, s->x0, n_lp - s->x0, AKV_KV_WINDOW, AKV_REPR_EXACT);
        return;
    }
    for (uint32_t w = 0, lp = 0; w <= window; w++) {
        const uint32_t next = w < window ? akv_dev_pool_ctx_slot(r->dp, s->ctx, 0, w).logical
                                         : n_lp;
        if (next > lp && lp < s->x0 && lp > 0) { /* host-attended: the host's, 1 .. x0-1 */
            AKV_ASSERT(next >= s->x0);
            seq_run_push(s, lp, s->x0 - lp, AKV_KV_HOST, AKV_REPR_EXACT);
            lp = s->x0;
        }
        if (next > lp) {
            AKV_ASSERT(r->kind->outside != AKV_KV_WINDOW); /* begin_step refused it */
            seq_run_push(s, lp, next - lp, r->kind->outside, AKV_REPR_EXACT);
            if (r->kind->outside == AKV_KV_STAGED)
                for (uint32_t k = lp; k < next; k++) s->staged[s->n_staged++] = k;
        }
        if (w < window) seq_run_push(s, next, 1, AKV_KV_WINDOW, AKV_REPR_EXACT);
        lp = next + 1;
    }
}

/* Per sequence of the placed step: its placement (route_place), and its window pages (filled
 * when fresh and holding earlier tokens, or when its window is not trusted) into its rows of
 * the table (the staged pages' entries are written at begin_layer, from the slot the copy
 * used). */
static akv_status route_write_table(akv_route *r, const akv_route_req *reqs, uint32_t n,
                                    const bool *refill) {
    const uint32_t P = r->geom.page_tokens;
    uint32_t off = 0;
    r->n_staged = 0;
    bool decode = r->kind->host_pages != NULL; /* every sequence one new token: a host part's */
    for (uint32_t i = 0; decode && i < n; i++) decode = reqs[i].n_tokens == reqs[i].seq->n_tokens + 1;
    for (uint32_t i = 0; i < n; i++) {
        akv_route_seq *s = reqs[i].seq;
        const uint64_t n_old = s->n_tokens, n_total = reqs[i].n_tokens;
        const uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_total);
        const uint32_t window = akv_dev_pool_ctx_window(s->ctx);
        /* the exact table packs the sink and the pages from x0: hybrid, the window in logical
         * order; host-attended, every page the host does not attend (the window's now, the
         * staged ones' at begin_layer); else x0 = 1, every logical page */
        const uint32_t n_cold = n_lp > window ? n_lp - window : 0;
        s->x0 = r->dpc                ? akv__route_exact_from(r, s, n_old, n_total)
                : r->kind->host_pages ? 1 + r->kind->host_pages(r, s, n_cold, decode)
                                      : 1;
        AKV_ASSERT(r->dpc || s->x0 <= 1 + n_cold);
        const uint32_t n_entries = r->dpc ? window : n_lp ? n_lp - s->x0 + 1 : 0;
        r->indptr[i] = (int32_t)off;
        r->last[i] = (int32_t)(n_total - (uint64_t)(n_lp - 1) * P);
        route_place(r, s, n_lp);
        s->stage_off = r->n_staged;
        for (uint32_t l = 0; l < r->geom.n_layers; l++) {
            int32_t *row = r->indices + (size_t)l * r->cap + off;
            for (uint32_t w = 0; w < window; w++) {
                akv_dev_pool_slot sl = akv_dev_pool_ctx_slot(r->dp, s->ctx, l, w);
                if ((sl.fresh || refill[i]) && (uint64_t)sl.logical * P < n_old) {
                    akv_status st = route_fill(r, s, l, sl.logical, sl.page_id);
                    if (st) return r->n_fills = 0, st;
                }
                const uint32_t at = r->dpc ? w : akv__route_table_at(s, sl.logical);
                if (row[at] != (int32_t)sl.page_id || sl.fresh || refill[i]) r->tab_dirty = true;
                row[at] = (int32_t)sl.page_id;
            }
        }
        r->n_staged += s->n_staged;
        off += n_entries;
    }
    r->indptr[n] = (int32_t)off;
    if (off != r->n_idx) r->tab_dirty = true; /* the packing moved */
    r->n_idx = off;
    return AKV_OK; /* the fills wait for the step's first begin_layer (route_fills_send) */
}

/* Queued: a table laid out as tab_h (the exact one, or the compact one) to its device copy
 * in compute-queue order: the head every step (indptr[max_seqs+1] then last[n]), the n_idx
 * indices of every layer (one 2D copy) when a page id changed (*dirty, cleared once that copy
 * is enqueued). */
static akv_status route_table_upload(akv_route *r, akv_dptr dst, const int32_t *tab, uint32_t n,
                                     uint32_t n_idx, bool *dirty) {
    const size_t head = (size_t)r->max_seqs + 1 + n, pitch = r->cap * sizeof(int32_t);
    akv_status st = akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, dst, tab, head * sizeof(int32_t));
    if (st || !*dirty || n_idx == 0) return st;
    st = akv_dev_copy_h2d_2d_async(r->dev, AKV_QUEUE_COMPUTE,
                                   akv_dptr_offset(dst, r->head_ints * sizeof(int32_t)), pitch,
                                   tab + r->head_ints, pitch, (size_t)n_idx * sizeof(int32_t),
                                   r->geom.n_layers);
    if (st == AKV_OK) *dirty = false;
    return st;
}

static akv_status route_upload(akv_route *r, uint32_t n) {
    return r->queued ? route_table_upload(r, r->tab_d, r->tab_h, n, r->n_idx, &r->tab_dirty) : AKV_OK;
}

/* A compact page job, the array grown on demand. */
static akv_status route_cjob_push(akv_route *r, akv__route_cjob job) {
    if (r->n_cjobs == r->cjobs_cap) {
        const uint32_t cap = r->cjobs_cap ? 2 * r->cjobs_cap : 256;
        akv__route_cjob *j = akv__realloc(r->cjobs, (size_t)cap * sizeof *j);
        if (!j) return AKV_ENOMEM;
        r->cjobs = j, r->cjobs_cap = cap;
    }
    r->cjobs[r->n_cjobs++] = job;
    return AKV_OK;
}

/* Hybrid: compact page (layer, logical) of s to be made into compact pool page page_id: on the
 * device from its exact page when the queued route has it in s's window (and the window is
 * trusted), else on the host from the host copy (route_compact_run makes them). The step's
 * compact work runs before the device-pool step, so an exact page leaving the window this step
 * is still there, and its encoding precedes whatever reuses it: the pass's kernels on the
 * compute queue, and the step's fills, which wait for the compute queue (route_fills_send). Staged
 * hybrid: copied from its compact copy (made before, route_compact_copies). */
static akv_status route_compact_page(akv_route *r, akv_route_seq *s, uint32_t layer,
                                     uint32_t logical, uint32_t page_id, bool trusted) {
    if (r->hpc) {
        const akv_dptr dst = akv_dev_pool_page_addr(r->dpc, page_id);
        const void *src = akv_host_pool_page_addr(r->hpc, akv_host_table_page(s->cht, layer, logical));
        const size_t n = r->clayout.page_bytes;
        akv_status st = r->queued ? akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, dst, src, n)
                                  : akv_dev_copy_h2d_sync(r->dev, dst, src, n);
        if (!st) r->stats.h2d_bytes += n, r->stats.compact_bytes += n, s->stats.h2d_bytes += n;
        return st;
    }
    const int64_t id = r->queued && trusted ? akv_dev_pool_ctx_find(r->dp, s->ctx, layer, logical) : -1;
    if (id >= 0) {
        AKV_ASSERT(r->n_dpairs < r->dpairs_cap);
        r->dpairs_h[2 * r->n_dpairs] = (int32_t)id, r->dpairs_h[2 * r->n_dpairs + 1] = (int32_t)page_id;
        r->n_dpairs++;
        return AKV_OK;
    }
    return route_cjob_push(
        r, (akv__route_cjob){.src = akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, layer, logical)),
                             .page_id = page_id});
}

/* The op that makes compact pages on the device (akv/kvq.h): the host backend's is the codec
 * itself, CUDA's a kernel found by the name. */
static akv_status route_kvq_encode_host(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_kvq_encode_pairs(args);
}
static const akv_dev_op route_op_kvq_encode = {.name = AKV_KVQ_OP_ENCODE,
                                               .args_bytes = sizeof(akv_kvq_encode_args),
                                               .host = route_kvq_encode_host};

typedef struct route_cbatch {
    const akv_route *r;
    const akv__route_cjob *jobs;
    void *dst[AKV__ROUTE_CSTAGE_PAGES];
    akv_status st[AKV__ROUTE_CSTAGE_PAGES];
} route_cbatch;

static void route_encode_task(void *ctx, uint32_t t) {
    route_cbatch *b = ctx;
    const akv_route *r = b->r;
    const akv_kvq_page_shape sh = {r->geom.n_kv_heads, r->geom.page_tokens, r->geom.head_dim,
                                   r->geom.dtype};
    b->st[t] = akv_kvq_encode_page(&r->clayout, &sh, b->jobs[t].src, b->dst[t],
                                   r->geom.page_tokens);
}

/* Encodes the step's jobs, AKV__ROUTE_CSTAGE_PAGES at a time on the encoders' threads; a job
 * without a host destination is encoded into cstage and copied into its compact pool page.
 * Direct: synchronous copies. Queued: on the compute queue, so the layers' kernels see them;
 * before cstage is reused, the compute queue is waited for (its copies have read it). The host
 * copies are complete: begin_step settled the step that wrote their rows. */
static akv_status route_encode_jobs(akv_route *r) {
    const size_t n = r->clayout.page_bytes;
    route_cbatch *b = r->n_cjobs ? akv__malloc(sizeof *b) : NULL; /* a decode step has none */
    if (r->n_cjobs && !b) return AKV_ENOMEM;
    akv_status st = AKV_OK;
    bool staged_copies = false; /* cstage holds copies the compute queue may still read */
    for (uint32_t at = 0; at < r->n_cjobs && !st; at += AKV__ROUTE_CSTAGE_PAGES) {
        const uint32_t m = r->n_cjobs - at < AKV__ROUTE_CSTAGE_PAGES ? r->n_cjobs - at
                                                                      : AKV__ROUTE_CSTAGE_PAGES;
        if (staged_copies && r->queued && (st = akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE))) break;
        const akv__route_cjob *jobs = r->cjobs + at;
        for (uint32_t i = 0; i < m; i++)
            b->dst[i] = jobs[i].dst ? jobs[i].dst : r->cstage + (size_t)i * n;
        b->r = r, b->jobs = jobs;
        akv__par_for(r->cpar, m, route_encode_task, b);
        staged_copies = false;
        for (uint32_t i = 0; i < m && !st; i++) {
            if ((st = b->st[i])) break;
            r->stats.compact_pages++;
            if (jobs[i].dst) continue; /* a compact copy on the host: made */
            const akv_dptr dst = akv_dev_pool_page_addr(r->dpc, jobs[i].page_id);
            st = r->queued ? akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, dst, b->dst[i], n)
                           : akv_dev_copy_h2d_sync(r->dev, dst, b->dst[i], n);
            if (!st) r->stats.compact_bytes += n, staged_copies = true;
        }
    }
    akv__free(b);
    r->n_cjobs = 0;
    return st;
}

/* Makes the step's compact pages: the host's (route_encode_jobs), then the pages made on the
 * device, their pairs up and one launch. */
static akv_status route_compact_run(akv_route *r) {
    akv_status st = route_encode_jobs(r);
    if (st || !r->n_dpairs) return st;
    const size_t pb = (size_t)r->n_dpairs * 2 * sizeof(int32_t);
    const akv_kvq_encode_args a = {.src_pool = akv_dev_pool_base(r->dp).addr,
                                       .dst_pool = akv_dev_pool_base(r->dpc).addr,
                                       .pairs = r->dpairs_d.addr,
                                       .n_pages = r->n_dpairs,
                                       .repr = (uint32_t)r->tier,
                                       .n_kv_heads = r->geom.n_kv_heads,
                                       .page_tokens = r->geom.page_tokens,
                                       .head_dim = r->geom.head_dim,
                                       .dtype = r->geom.dtype};
    if ((st = akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, r->dpairs_d, r->dpairs_h, pb)) ||
        (st = akv_dev_op_launch(r->dev, &route_op_kvq_encode, &a, sizeof a)))
        return st;
    r->stats.compact_pages += r->n_dpairs, r->stats.compact_device += r->n_dpairs;
    r->n_dpairs = 0;
    return AKV_OK;
}

/* Staged hybrid: the compact copies of the pages that leave the exact part this step (and of
 * any a truncate made stale), encoded on the host from the exact host copies (complete:
 * begin_step settled the step that wrote their rows) straight into the compact host pages. */
static akv_status route_compact_copies(akv_route *r, const akv_route_req *reqs, uint32_t n) {
    akv_status st = AKV_OK;
    r->n_cjobs = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        akv_route_seq *s = reqs[i].seq;
        const uint32_t x0 = akv__route_exact_from(r, s, s->n_tokens, reqs[i].n_tokens);
        for (uint32_t lp = s->hc_valid > 1 ? s->hc_valid : 1; lp < x0 && !st; lp++)
            for (uint32_t l = 0; l < r->geom.n_layers && !st; l++)
                st = route_cjob_push(
                    r, (akv__route_cjob){
                           .src = akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, lp)),
                           .dst = route_page_to_write(r->hpc, s->cht, l, lp)});
    }
    if (!st) st = route_encode_jobs(r);
    for (uint32_t i = 0; i < n && !st; i++) {
        akv_route_seq *s = reqs[i].seq;
        const uint32_t x0 = akv__route_exact_from(r, s, s->n_tokens, reqs[i].n_tokens);
        if (s->hc_valid < x0) s->hc_valid = x0;
    }
    r->n_cjobs = 0;
    return st;
}

/* Hybrid: ONE step of the compact pool over the batch's sequences that have a compact part
 * (the kind's compact order: pages 1 .. x0-1; resident, all needed; staged, newest first as
 * far as its compact window goes, the rest staged at begin_layer), then every compact page
 * placed fresh, not yet made from the host copy as it is now, or of a sequence whose windows
 * are not trusted, made (staged: copied from its compact copy, made first); and the compact
 * table (a sequence's compact pages in logical order; staged entries at begin_layer). */
static akv_status route_compact_step(akv_route *r, const akv_route_req *reqs, uint32_t n,
                                     const bool *refill) {
    akv_dev_pool_req *cq = akv__calloc(n, sizeof *cq);
    akv_dev_pool_result *cr = akv__calloc(n, sizeof *cr);
    akv_status st = cq && cr ? AKV_OK : AKV_ENOMEM;
    if (!st && r->hpc) st = route_compact_copies(r, reqs, n);
    uint32_t m = 0, at = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        akv_route_seq *s = reqs[i].seq;
        uint32_t n_floor, *order = r->c_order + at;
        s->n_compact = r->kind->compact_order(r, s, reqs[i].n_tokens, order, &n_floor);
        if (!s->n_compact) continue;
        cq[m++] = (akv_dev_pool_req){.ctx = s->cctx, .n_tokens = reqs[i].n_tokens, .order = order,
                                     .n_order = s->n_compact, .n_floor = n_floor};
        at += s->n_compact;
    }
    if (!st && m) st = akv_dev_pool_step(r->dpc, cq, m, cr);
    for (uint32_t k = 0; k < m && (st == AKV_OK || st == AKV_EFULL); k++) {
        if (cr[k].status == AKV_OK && (r->hpc || cr[k].window >= cq[k].n_order)) continue;
        AKV_LOG_E("route: the compact pool holds %u of the %u compact pages per layer a history "
                  "of %llu tokens needs: raise {=device_gib}",
                  cr[k].window, cq[k].n_order, (unsigned long long)cq[k].n_tokens);
        st = AKV_EFULL;
        break;
    }
    akv__free(cq), akv__free(cr);
    if (st) return st;
    r->n_cjobs = 0, r->n_dpairs = 0, r->n_cstaged = 0;
    uint32_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        akv_route_seq *s = reqs[i].seq;
        const uint32_t window = s->n_compact ? akv_dev_pool_ctx_window(s->cctx) : 0;
        r->c_indptr[i] = (int32_t)off;
        r->c_last[i] = s->n_compact ? (int32_t)r->geom.page_tokens : 0;
        if (refill[i]) s->c_valid = 1;
        for (uint32_t l = 0; l < r->geom.n_layers; l++) {
            int32_t *row = r->c_indices + (size_t)l * r->cap + off;
            for (uint32_t w = 0; w < window; w++) {
                akv_dev_pool_slot sl = akv_dev_pool_ctx_slot(r->dpc, s->cctx, l, w);
                if ((sl.fresh || sl.logical >= s->c_valid) &&
                    (st = route_compact_page(r, s, l, sl.logical, sl.page_id, !refill[i])))
                    return st;
                int32_t *at_lp = row + sl.logical - 1; /* the table holds pages 1 .. x0-1 */
                if (*at_lp != (int32_t)sl.page_id || sl.fresh || refill[i]) r->ctab_dirty = true;
                *at_lp = (int32_t)sl.page_id;
            }
        }
        /* staged: the compact pages outside its window (windows are uniform over layers) */
        s->cstage_off = r->n_cstaged, s->n_cstaged = 0;
        for (uint32_t w = 0, lp = 1; w <= window && r->hpc; w++) {
            const uint32_t next = w < window ? akv_dev_pool_ctx_slot(r->dpc, s->cctx, 0, w).logical
                                             : s->n_compact + 1;
            for (; lp < next; lp++) s->cstaged[s->n_cstaged++] = lp;
            lp = next + 1;
        }
        r->n_cstaged += s->n_cstaged;
        if (s->n_compact && s->c_valid < s->n_compact + 1) s->c_valid = s->n_compact + 1;
        off += s->n_compact;
    }
    r->c_indptr[n] = (int32_t)off;
    if (off != r->n_cidx) r->ctab_dirty = true; /* the packing moved */
    r->n_cidx = off;
    if (r->n_cstaged > r->cslot_pages) {
        AKV_LOG_E("route: the step stages %u compact pages per layer; a staging slot holds %u",
                  r->n_cstaged, r->cslot_pages);
        return AKV_EFULL;
    }
    if ((st = route_compact_run(r)) || !r->queued) return st;
    return route_table_upload(r, r->ctab_d, r->ctab, n, off, &r->ctab_dirty);
}

akv_status akv_route_begin_step(akv_route *r, const akv_route_req *reqs, uint32_t n) {
    if (!r) return AKV_EINVAL;
    /* 0. the previous step's transport retires (fences waited on); queued: its kernels and
     * write-backs are done, so the host copies are complete (a failed write-back redone, or
     * the step undone if its kernels failed: route_settle) and the tables may be rewritten */
    bool lost = false;
    akv_status st = route_sync(r, true, &lost);
    if (st) return st;
    if (lost) return AKV_EDEVICE; /* logged: the caller's lengths are not the route's now */
    if ((st = route_check_batch(r, reqs, n))) return st;
    for (uint32_t i = 0; i < r->n_step; i++)
        if (r->step[i]) r->step[i]->slot = -1;
    r->n_step = 0;
    r->n_fills = 0; /* fills of a step that never began its layers: its pages are refilled */
    r->step_done = true; /* the previous step is over */
    route_finish_closes(r);
    /* 1. the host copies grow first: they are where the rows land for good */
    for (uint32_t i = 0; i < n; i++) {
        akv_route_seq *s = reqs[i].seq;
        const char *pool = "host pool";
        st = akv_host_table_grow(s->ht, reqs[i].n_tokens);
        if (!st && s->cht && (st = akv_host_table_grow(s->cht, reqs[i].n_tokens))) {
            pool = "compact copies' host pool";
            (void)akv_host_table_truncate(s->ht, s->n_tokens); /* i is undone by hand */
        }
        if (st) {
            if (st == AKV_EFULL) AKV_LOG_E("route: the %s is full: raise {=host_gib}", pool);
            route_ungrow(r, reqs, i);
            return st;
        }
    }
    /* 2. ONE device-pool step over the batch: every page of each history (resident), or its
     * window up to target + burst (staged). From here a failure may leave placed pages
     * unfilled: until one of its steps completes, every step of a sequence refills its whole
     * window (and uploads the whole table) */
    akv_dev_pool_req *preq = akv__calloc(n, sizeof *preq);
    akv_dev_pool_result *pres = akv__calloc(n, sizeof *pres);
    bool *refill = akv__calloc(n, sizeof *refill);
    if (!preq || !pres || !refill) {
        st = AKV_ENOMEM;
        goto fail;
    }
    /* the place: what each sequence wants in the device window, by its kind (the pool holds
     * a prefix of it, as far as floors, targets and the budget allow) */
    for (uint32_t i = 0, at = 0; i < n; i++) {
        uint32_t n_floor, *order = r->order + at;
        uint32_t n_order = r->kind->order(r, reqs[i].seq, reqs[i].n_tokens, order, &n_floor);
        preq[i] = (akv_dev_pool_req){.ctx = reqs[i].seq->ctx,
                                     .n_tokens = reqs[i].n_tokens,
                                     .order = order,
                                     .n_order = n_order,
                                     .n_floor = n_floor};
        at += n_order;
        refill[i] = reqs[i].seq->refill;
        reqs[i].seq->refill = true;
    }
    /* hybrid: the compact part first, while the exact pages leaving the window this step are
     * still in it (route_compact_page) */
    if (r->dpc && (st = route_compact_step(r, reqs, n, refill))) goto fail;
    st = akv_dev_pool_step(r->dp, preq, n, pres);
    for (uint32_t i = 0; i < n && (st == AKV_OK || st == AKV_EFULL); i++) {
        const akv_route_seq *s = reqs[i].seq;
        /* a kind with no residence outside the window needs every page in it */
        const uint32_t need = r->kind->outside == AKV_KV_WINDOW ? preq[i].n_order
                                                                : preq[i].n_floor;
        if (pres[i].status == AKV_OK && pres[i].window >= need) continue;
        AKV_LOG_E("route: the device pool holds %u of the %u window pages per layer a %s history "
                  "of %llu tokens (sequence %llu) needs: raise {=device_gib}",
                  pres[i].window, need, r->kind->name, (unsigned long long)reqs[i].n_tokens,
                  (unsigned long long)s->p.tag);
        st = AKV_EFULL;
        break;
    }
    if (st) goto fail;
    /* 3. fills of fresh window pages that hold earlier tokens, after every write-back in
     * flight, and the table over the batch (the staged pages' entries are written at
     * begin_layer, from the slot the copy used) */
    bool any_fill = false;
    for (uint32_t i = 0; i < n; i++) any_fill |= pres[i].n_fresh || refill[i];
    if (any_fill && (st = route_order_fills(r))) goto fail;
    if ((st = route_write_table(r, reqs, n, refill))) goto fail;
    if (r->n_staged > r->slot_pages) {
        AKV_LOG_E("route: the step stages %u pages per layer; a staging slot holds %u (a window "
                  "below its target: {=device_gib})",
                  r->n_staged, r->slot_pages);
        st = AKV_EFULL;
        goto fail;
    }
    /* 4. the tables to the device, in compute-queue order; the rows the staging copies on the
     * H2D queue (a layer's slot ids, with its pages) after them */
    if ((st = route_upload(r, n))) goto fail;
    if (r->queued && ((st = akv_dev_event_record(r->dev, r->ev_tab, AKV_QUEUE_COMPUTE)) ||
                      (st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_H2D, r->ev_tab))))
        goto fail;
    /* 5. the kind's part: a prefetch made for another step is dropped */
    if (r->kind->placed && (st = r->kind->placed(r, reqs, n))) goto fail;
    akv__free(preq), akv__free(pres), akv__free(refill);
    for (uint32_t i = 0; i < n; i++) {
        akv_route_seq *s = reqs[i].seq;
        s->refill = r->queued; /* until the step's last end_layer */
        s->step_first = s->n_tokens;
        s->n_tokens = reqs[i].n_tokens;
        s->slot = (int32_t)i;
        s->stats.n_steps++;
        r->step[i] = s;
    }
    r->n_step = n;
    r->pending = true;
    r->step_done = false;
    r->stats.n_steps++;
    return AKV_OK;
fail:
    akv__free(preq), akv__free(pres), akv__free(refill);
    route_ungrow(r, reqs, n);
    return st;
}

/* ---- the forward hooks ---------------------------------------------------------------------- */

/* A forward hook's layer: one of the geometry's, of a step still whole. */
static akv_status route_layer_ok(const akv_route *r, uint32_t layer, const char *hook) {
    if (layer >= r->geom.n_layers) {
        AKV_LOG_E("route: %s of layer %u; the history has %u layers", hook, layer,
                  r->geom.n_layers);
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; i < r->n_step; i++)
        if (!r->step[i]) {
            AKV_LOG_E("route: %s of a step whose sequence %u was closed and freed (abort or "
                      "begin the next step)",
                      hook, i);
            return AKV_ESTATE;
        }
    return AKV_OK;
}

static akv_status route_begin_layer(void *user, uint32_t layer, akv_kv_parts *parts) {
    akv_route *r = user;
    akv_status st = route_layer_ok(r, layer, "begin_layer");
    if (st) return st;
    r->pending = true; /* the pass enqueues work (a sync may have come between) */
    if (r->queued && r->n_fills && (st = route_fills_send(r))) return st;
    if (r->queued && r->lfill_wait[layer]) { /* the layer's fills, before its kernels */
        if ((st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_COMPUTE, r->ev_lfill[layer]))) return st;
        r->lfill_wait[layer] = 0;
    }
    if (r->kind->begin_layer && (st = r->kind->begin_layer(r, layer))) return st;
    /* queued: the device copy of the tables (tab_d, laid out as tab_h); direct: host arrays */
    const size_t at_idx = (r->head_ints + (size_t)layer * r->cap) * sizeof(int32_t),
                 at_last = ((size_t)r->max_seqs + 1) * sizeof(int32_t);
    akv_dptr base = r->queued ? r->tab_d : akv_attn_host_ptr(r->tab_h);
    parts->n_parts = 1;
    parts->part[0].kv = (akv_attn_pages){.pool = akv_dev_pool_base(r->dp),
                                         .indptr = base,
                                         .indices = akv_dptr_offset(base, at_idx),
                                         .last_page_len = akv_dptr_offset(base, at_last),
                                         .n_seq = r->n_step,
                                         .n_pages = akv_dev_pool_n_pages(r->dp),
                                         .max_pages = r->max_pages,
                                         .n_kv_heads = r->geom.n_kv_heads,
                                         .head_dim = r->geom.head_dim,
                                         .page_tokens = r->geom.page_tokens,
                                         .dtype = r->geom.dtype};
    if (r->kind->host_part) return r->kind->host_part(r, layer, parts);
    if (!r->dpc) return AKV_OK;
    /* hybrid: the compact part (queued: ctab_d, laid out as ctab), every key before every query */
    akv_attn_pages c = parts->part[0].kv;
    akv_dptr cbase = r->queued ? r->ctab_d : akv_attn_host_ptr(r->ctab);
    c.pool = akv_dev_pool_base(r->dpc);
    c.indptr = cbase;
    c.indices = akv_dptr_offset(cbase, at_idx);
    c.last_page_len = akv_dptr_offset(cbase, at_last);
    c.n_pages = akv_dev_pool_n_pages(r->dpc);
    c.repr = r->tier, c.past = 1;
    parts->n_parts = 2;
    parts->part[1] = (akv_kv_part){.kv = c};
    return AKV_OK;
}

/* The step's new rows of `layer` to the host copies. */
static akv_status route_end_layer(void *user, uint32_t layer) {
    akv_route *r = user;
    akv_status st = route_layer_ok(r, layer, "end_layer");
    if (st || (st = r->kind->end_layer(r, layer))) return st;
    if (layer + 1 == r->geom.n_layers) {
        for (uint32_t i = 0; i < r->n_step; i++) r->step[i]->refill = false;
        r->step_done = true;
    }
    return AKV_OK;
}

akv_kv_hooks akv_route_hooks(akv_route *r) {
    /* resident and queued: the tables are uploaded at begin_step and never move, begin_layer
     * enqueues nothing, and the write-backs may follow the whole step */
    return (akv_kv_hooks){.user = r,
                            .begin_layer = route_begin_layer,
                            .end_layer = route_end_layer,
                            .replayable = r->queued && r->kind->replayable};
}

/* ---- stats and the walker ------------------------------------------------------------------- */

void akv_route_get_stats(const akv_route *r, akv_route_stats *out) {
    *out = r->stats;
    out->host_ns = atomic_load(&r->host_ns);
    out->n_open = r->n_open;
    out->n_closing = 0;
    for (const akv_route_seq *s = r->closing_list; s; s = s->next) out->n_closing++;
    for (int i = 0; i < 2; i++) {
        const akv_stage *st = i ? r->cst : r->stage;
        if (!st) continue;
        akv_stage_stats ss;
        akv_stage_get_stats(st, &ss);
        out->n_quarantines += ss.n_quarantines;
    }
}

void akv_route_seq_get_stats(const akv_route_seq *s, akv_route_seq_stats *out) {
    *out = s->stats;
    out->n_tokens = s->n_tokens;
    out->window_pages = akv_dev_pool_ctx_window(s->ctx);
    out->host_pages = akv_host_table_n_pages(s->ht);
}

uint64_t akv_route_seq_n_tokens(const akv_route_seq *s) {
    return s->n_tokens;
}

uint32_t akv_route_seq_runs(const akv_route_seq *s, akv_kv_run *runs, uint32_t cap) {
    if (s->slot < 0) return 0;
    for (uint32_t i = 0; i < s->n_runs && i < cap; i++) runs[i] = s->runs[i];
    return s->n_runs;
}

const akv_host_table *akv_route_seq_host_table(const akv_route_seq *s) {
    return s->ht;
}

uint32_t akv_route_closing_host_tables(const akv_route *r, const akv_host_table **out, uint32_t cap) {
    uint32_t n = 0;
    for (const akv_route_seq *s = r->closing_list; s; s = s->next, n++)
        if (n < cap) out[n] = s->ht;
    return n;
}

uint32_t akv_route_step_times(const akv_route *r, akv_route_layer_times *out, uint32_t cap) {
    if (!r || !r->times) return 0;
    for (uint32_t l = 0; out && l < cap && l < r->n_times; l++) out[l] = r->times[l];
    return r->n_times;
}

akv_route_params akv_route_get_params(const akv_route *r) {
    return (akv_route_params){.kind = r->kind->kind,
                              .tier = r->tier,
                              .compact_pool = r->dpc,
                              .exact_recent = r->exact_recent,
                              .max_step = r->max_step,
                              .max_history = r->max_history,
                              .max_seqs = r->max_seqs,
                              .queued = r->queued,
                              .window_pages = r->window_pages,
                              .compact_host_pool = r->hpc,
                              .compact_target = r->ctarget,
                              .compact_burst = r->cburst,
                              .stage = r->stage,
                              .prefetch = r->prefetch ? 1 : -1};
}

/* One sequence: host copy length, and every used row of every resident page against it. */
static akv_status seq_check(const akv_route *r, const akv_route_seq *s) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(g, s->n_tokens);
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype);
    if (akv_host_table_n_pages(s->ht) != n_lp || akv_host_table_n_tokens(s->ht) != s->n_tokens) {
        AKV_LOG_E("route check: sequence %llu: the host copy has %u pages for %llu tokens; "
                  "expected %u",
                  (unsigned long long)s->p.tag, akv_host_table_n_pages(s->ht),
                  (unsigned long long)s->n_tokens, n_lp);
        return AKV_ESTATE;
    }
    /* after a failed step the device window is not trusted: the next step refills it */
    for (uint32_t l = 0; !s->refill && l < g->n_layers; l++) {
        for (uint32_t p = 0; p < n_lp; p++) {
            /* a page another context reclaimed is not resident: the host copy holds it */
            int64_t id = akv_dev_pool_ctx_find(r->dp, s->ctx, l, p);
            if (id < 0) continue;
            const uint8_t *h = akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, p));
            /* host backend: the device address is a host address */
            const uint8_t *d =
                (const uint8_t *)(uintptr_t)akv_dev_pool_page_addr(r->dp, (uint32_t)id).addr;
            uint64_t used = s->n_tokens - (uint64_t)p * P < P ? s->n_tokens - (uint64_t)p * P : P;
            for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
                size_t off = (size_t)kvh * P * row;
                if (memcmp(h + off, d + off, (size_t)used * row)) {
                    AKV_LOG_E("route check: sequence %llu layer %u page %u %s head %u: the device "
                              "copy differs from the host copy",
                              (unsigned long long)s->p.tag, l, p,
                              kvh < g->n_kv_heads ? "K" : "V", kvh % g->n_kv_heads);
                    return AKV_ESTATE;
                }
            }
        }
    }
    return AKV_OK;
}

/* Hybrid: every compact page it holds below c_valid, and (staged) every compact copy below
 * hc_valid, is the encoding of its host copy. */
static akv_status seq_check_compact(const akv_route *r, const akv_route_seq *s) {
    const akv_kvq_page_shape sh = {r->geom.n_kv_heads, r->geom.page_tokens, r->geom.head_dim,
                                   r->geom.dtype};
    for (uint32_t lp = 1; s->cht && lp < s->hc_valid; lp++)
        for (uint32_t l = 0; l < r->geom.n_layers; l++) {
            const void *h = akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, lp));
            const void *c = akv_host_pool_page_addr(r->hpc, akv_host_table_page(s->cht, l, lp));
            if (akv_kvq_encode_page(&r->clayout, &sh, h, r->cpage, r->geom.page_tokens)) return AKV_ESTATE;
            if (memcmp(c, r->cpage, r->clayout.page_bytes)) {
                AKV_LOG_E("route check: sequence %llu layer %u page %u: the compact copy is not the "
                          "encoding of the host copy",
                          (unsigned long long)s->p.tag, l, lp);
                return AKV_ESTATE;
            }
        }
    if (s->cht && (uint64_t)s->hc_valid * r->geom.page_tokens > s->n_tokens) {
        AKV_LOG_E("route check: sequence %llu: compact copies to page %u of a history of %llu tokens",
                  (unsigned long long)s->p.tag, s->hc_valid, (unsigned long long)s->n_tokens);
        return AKV_ESTATE;
    }
    const uint32_t window = akv_dev_pool_ctx_window(s->cctx);
    /* every copy is done: direct mode, or queued with nothing pending (after a sync) */
    for (uint32_t l = 0; (!r->queued || !r->pending) && !s->refill && l < r->geom.n_layers; l++)
        for (uint32_t w = 0; w < window; w++) {
            akv_dev_pool_slot sl = akv_dev_pool_ctx_slot(r->dpc, s->cctx, l, w);
            if (sl.logical >= s->c_valid || (uint64_t)(sl.logical + 1) * r->geom.page_tokens > s->n_tokens)
                continue; /* made again before it is read */
            const void *h =
                akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, l, sl.logical));
            if (akv_kvq_encode_page(&r->clayout, &sh, h, r->cpage, r->geom.page_tokens)) return AKV_ESTATE;
            const void *d = (const void *)(uintptr_t)akv_dev_pool_page_addr(r->dpc, sl.page_id).addr;
            if (memcmp(d, r->cpage, r->clayout.page_bytes)) {
                AKV_LOG_E("route check: sequence %llu layer %u page %u: the compact page is not the "
                          "encoding of the host copy",
                          (unsigned long long)s->p.tag, l, sl.logical);
                return AKV_ESTATE;
            }
        }
    return AKV_OK;
}

akv_status akv__route_check(const akv_route *r) {
    akv_dev_info info;
    if (akv_dev_get_info(r->dev, &info) != AKV_OK || !info.is_host) {
        AKV_LOG_E("route check: reads device memory as host memory: the host backend only");
        return AKV_EUNSUPPORTED;
    }
    uint32_t n = 0;
    for (const akv_route_seq *s = r->open_list; s; s = s->next, n++) {
        akv_status st = seq_check(r, s);
        if (!st && r->dpc) st = seq_check_compact(r, s);
        if (st) return st;
    }
    if (n != r->n_open) {
        AKV_LOG_E("route check: %u sequences on the open list; the count says %u", n, r->n_open);
        return AKV_ESTATE;
    }
    for (uint32_t i = 0; i < r->n_step; i++)
        if (r->step[i] && r->step[i]->slot != (int32_t)i) {
            AKV_LOG_E("route check: step position %u holds a sequence that says %d", i,
                      r->step[i]->slot);
            return AKV_ESTATE;
        }
    return AKV_OK;
}
