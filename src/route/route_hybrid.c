/* route_hybrid.c — the hybrid kinds of akv/route.h: a route with a compact tier. A sequence's
 * exact part is its sink page and its pages from x0 on (every page holding one of the last
 * exact_recent tokens or one of the step's new tokens), resident in the device pool; its pages
 * 1 .. x0-1 are read as a second part, compact pages of the compact pool. The hybrid (resident)
 * kind holds every compact page in the compact pool, made from the host copy (which stays
 * exact and authoritative) when it is placed there. The staged hybrid makes each compact page
 * once into a compact copy on the host, holds a window of the newest compact pages in the
 * compact pool and stages the rest each step, per layer, from the compact copies. The pass
 * merges the two parts exactly (akv/attn.h). */
#include "akv/host_table.h"
#include "akv/stage.h"
#include "core/alloc.h"
#include "core/log.h"
#include "route/route_impl.h"

uint32_t akv__route_exact_from(const akv_route *r, const akv_route_seq *s, uint64_t n_old,
                               uint64_t n_new) {
    if (s->p.exact) return 1;
    const uint64_t P = r->geom.page_tokens;
    uint64_t x0 = n_new > r->exact_recent ? (n_new - r->exact_recent) / P : 0;
    if (x0 > n_old / P) x0 = n_old / P; /* the step's new tokens are exact */
    return x0 < 1 ? 1 : (uint32_t)x0;
}

/* Exact window pages a history of n_tokens holds at most (its sink, the pages of its last
 * exact_recent tokens and of a step of max_step, and the page a step starts in): never more
 * than its pages. */
static uint32_t hybrid_window_pages(const akv_geom *g, uint64_t exact_recent, uint32_t max_step,
                                    uint64_t n_tokens) {
    const uint32_t all = akv__route_floor_pages(g, n_tokens);
    const uint64_t recent = akv_geom_pages_for_tokens(g, exact_recent + max_step) + 2;
    return recent < all ? (uint32_t)recent : all;
}

/* ---- the policy ------------------------------------------------------------------------------ */

static uint32_t hybrid_plan_staging(const akv_geom *g, uint64_t max_history,
                                    uint32_t window_pages, uint32_t max_seqs) {
    (void)g, (void)max_history, (void)window_pages, (void)max_seqs;
    return 0; /* nothing is staged */
}

static akv_status hybrid_plan_windows(const akv_geom *g, uint64_t max_history, uint32_t max_seqs,
                                      const akv_fit *fit, akv_route_plan *pl) {
    (void)max_seqs;
    const uint32_t need = hybrid_window_pages(g, pl->exact_recent, pl->max_step, max_history);
    if (need > fit->window_capacity) {
        AKV_LOG_E("route: the exact part of a hybrid history ({=exact_recent} %llu tokens and a "
                  "step of %u) needs %u window pages per layer; the device pool's exact part "
                  "holds %llu: raise {=device_gib}",
                  (unsigned long long)pl->exact_recent, pl->max_step, need,
                  (unsigned long long)fit->window_capacity);
        return AKV_EFULL;
    }
    pl->target = pl->burst = 0; /* each context's exact window is resolved per sequence */
    return AKV_OK;
}

static uint32_t hybrid_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens) {
    return hybrid_window_pages(g, pl->exact_recent, pl->max_step, n_tokens);
}

static akv_status hybrid_window(const akv_route *r, akv_route_seq_params *p,
                                uint32_t window_capacity) {
    /* a history kept exact holds every page, as the resident kind's */
    p->target = p->exact ? akv__route_floor_pages(&r->geom, p->max_history)
                         : hybrid_window_pages(&r->geom, r->exact_recent, r->max_step, p->max_history);
    p->burst = 0;
    if (p->target <= window_capacity) return AKV_OK;
    AKV_LOG_E("route: the exact part of a hybrid history of %llu tokens%s needs %u window pages "
              "per layer; the device pool's exact part holds %u: raise {=device_gib}%s",
              (unsigned long long)p->max_history, p->exact ? " kept exact" : "", p->target,
              window_capacity, p->exact ? "" : " or lower {=exact_recent}");
    return AKV_EINVAL;
}

/* The exact part, most wanted first: the newest page and the sink (the floor), then the rest
 * of the exact part newest first. */
static uint32_t hybrid_order(const akv_route *r, const akv_route_seq *s, uint64_t n_tokens,
                             uint32_t *order, uint32_t *n_floor) {
    const uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_tokens);
    const uint32_t x0 = akv__route_exact_from(r, s, s->n_tokens, n_tokens);
    uint32_t k = 0;
    order[k++] = n_lp - 1;
    if (n_lp > 1) order[k++] = 0;
    for (uint32_t lp = n_lp - 1; lp-- > x0;) order[k++] = lp;
    *n_floor = n_lp > 1 ? 2 : 1;
    return k;
}

/* The compact part: pages 1 .. x0-1, newest first, all needed. */
static uint32_t hybrid_compact_order(const akv_route *r, const akv_route_seq *s,
                                     uint64_t n_tokens, uint32_t *order, uint32_t *n_floor) {
    const uint32_t x0 = akv__route_exact_from(r, s, s->n_tokens, n_tokens);
    uint32_t k = 0;
    for (uint32_t lp = x0; lp-- > 1;) order[k++] = lp;
    *n_floor = k;
    return k;
}

const akv__route_kind akv__route_hybrid = {.kind = AKV_ROUTE_RESIDENT,
                                           .name = "resident",
                                           .plan_staging = hybrid_plan_staging,
                                           .plan_windows = hybrid_plan_windows,
                                           .need = hybrid_need,
                                           .window = hybrid_window,
                                           .order = hybrid_order,
                                           .compact_order = hybrid_compact_order,
                                           .outside = AKV_KV_WINDOW,
                                           .replayable = false,
                                           .end_layer = akv__route_write_back};

/* ---- the staged hybrid: the compact part staged from compact copies ------------------------- */

/* The compact part of the staged hybrid: newest first, the newest its floor (the compact
 * window holds as many as its target and burst allow; begin_layer stages the rest). */
static uint32_t hybrid_staged_compact_order(const akv_route *r, const akv_route_seq *s,
                                            uint64_t n_tokens, uint32_t *order,
                                            uint32_t *n_floor) {
    const uint32_t k = hybrid_compact_order(r, s, n_tokens, order, n_floor);
    *n_floor = k ? 1 : 0;
    return k;
}

/* The stage of compact pages: AKV__ROUTE_CSTAGE_SLOTS slots from the compact pool's staging
 * reserve. */
static akv_status hybrid_staged_stage(akv_route *r) {
    akv_stage_params sp = akv_stage_default_params();
    sp.n_slots = AKV__ROUTE_CSTAGE_SLOTS, sp.slot_pages = r->cslot_pages;
    akv_status st = akv_stage_create(r->dev, r->hpc, r->dpc, &sp, &r->cst);
    if (st == AKV_EFULL)
        AKV_LOG_E("route: the staged compact route needs a staging reserve of %u compact pages "
                  "(%u slots x %u) in the compact pool: raise {=device_gib} or lower "
                  "{=max_history} or {=max_seqs}",
                  AKV__ROUTE_CSTAGE_SLOTS * r->cslot_pages, AKV__ROUTE_CSTAGE_SLOTS, r->cslot_pages);
    return st;
}

/* Each sequence's compact window (checked against the compact pool's capacity), the stage and
 * the lane's scratch. */
static akv_status hybrid_staged_open(akv_route *r, const akv_route_params *p) {
    akv_dev_pool_stats cs;
    akv_dev_pool_get_stats(r->dpc, &cs);
    const uint64_t cap = cs.window_capacity;
    r->ctarget = p->compact_target ? p->compact_target : (uint32_t)(cap / r->max_seqs);
    r->cburst = p->compact_burst;
    if (r->ctarget < 2 || (uint64_t)r->ctarget * r->max_seqs + r->cburst > cap) {
        AKV_LOG_E("route: %u compact windows of {=compact_target} %u (at least 2) and a burst of "
                  "%u need %llu compact pages per layer; the compact pool holds %llu beside its "
                  "staging reserve: raise {=device_gib} or lower {=max_seqs}",
                  r->max_seqs, r->ctarget, r->cburst,
                  (unsigned long long)r->ctarget * r->max_seqs + r->cburst,
                  (unsigned long long)cap);
        return AKV_EINVAL;
    }
    r->cslot_pages = akv_route_compact_slot_pages(&r->geom, r->max_history, r->max_seqs);
    const uint32_t L = r->geom.n_layers;
    r->cslot_ids = akv__calloc(r->cslot_pages, sizeof *r->cslot_ids);
    r->chpages = akv__calloc(r->cslot_pages, sizeof *r->chpages);
    r->clease = akv__calloc(L, sizeof *r->clease);
    r->clease_live = akv__calloc(L, sizeof *r->clease_live);
    if (!r->cslot_ids || !r->chpages || !r->clease || !r->clease_live) return AKV_ENOMEM;
    return hybrid_staged_stage(r);
}

static bool hybrid_staged_live(const akv_route *r) {
    for (uint32_t l = 0; r->clease_live && l < r->geom.n_layers; l++)
        if (r->clease_live[l]) return true;
    return false;
}

/* Cancels the compact lease a failed pass left open, then retires every compact lease of the
 * last step (fences waited on, each receipt's copies against what was submitted). A failed
 * stage is replaced once its leases are released. */
static akv_status hybrid_staged_retire(akv_route *r, bool keep_prefetch, bool *quarantined) {
    (void)keep_prefetch; /* nothing is prefetched */
    akv_status first = akv__route_retire_layers(r, r->cst, r->clease, r->clease_live, &r->copen_layer,
                                                r->n_cstaged, "compact lease", quarantined);
    if (!hybrid_staged_live(r) && (!r->cst || akv_stage_status(r->cst) != AKV_OK)) {
        if (r->cst && akv_stage_destroy(r->cst) == AKV_OK) r->cst = NULL;
        akv_status s = r->cst ? AKV_EBUSY : hybrid_staged_stage(r);
        if (s == AKV_OK) AKV_LOG_W("route: the failed compact stage was replaced by a new one");
        else if (first == AKV_OK) first = s; /* tried again at the next retirement */
    }
    return first;
}

/* begin_layer: when the step stages compact pages, the lease (no owners), one copy of every
 * sequence's compact copies outside its compact window, their slot ids into the layer's
 * compact table row, the compute queue's wait. */
static akv_status hybrid_staged_begin_layer(akv_route *r, uint32_t layer) {
    if (r->n_cstaged == 0) return AKV_OK;
    if (!r->cst) {
        AKV_LOG_E("route: the staged compact route has no stage (a failed one could not be "
                  "replaced)");
        return AKV_EFAILED;
    }
    akv_stage_lease *l = &r->clease[layer];
    akv_status st = akv_stage_begin(r->cst, layer, r->stats.n_steps, NULL, 0, l);
    /* AKV_EDEVICE: issued, then a submission failed: live, cancelled and retired like any */
    if (st && st != AKV_EDEVICE) return st;
    r->clease_live[layer] = 1, r->copen_layer = (int32_t)layer;
    if (st) return st;
    uint32_t k = 0;
    for (uint32_t i = 0; i < r->n_step; i++) {
        const akv_route_seq *s = r->step[i];
        for (uint32_t j = 0; j < s->n_cstaged; j++)
            r->chpages[k++] = akv_host_table_page(s->cht, layer, s->cstaged[j]);
    }
    if ((st = akv_stage_copy(r->cst, *l, r->chpages, k, r->cslot_ids))) return st;
    const uint64_t cb = r->clayout.page_bytes;
    for (uint32_t i = 0; i < r->n_step; i++) {
        akv_route_seq *s = r->step[i];
        int32_t *row = r->c_indices + (size_t)layer * r->cap + r->c_indptr[i];
        for (uint32_t j = 0; j < s->n_cstaged; j++)
            row[s->cstaged[j] - 1] = (int32_t)r->cslot_ids[s->cstage_off + j];
        s->stats.h2d_bytes += s->n_cstaged * cb, s->stats.staged_bytes += s->n_cstaged * cb;
    }
    r->stats.h2d_bytes += k * cb, r->stats.staged_bytes += k * cb;
    /* queued: the layer's row of compact indices travels with its pages (ready's wait covers it) */
    if (r->queued) {
        const size_t off = (r->head_ints + (size_t)layer * r->cap) * sizeof(int32_t);
        if ((st = akv_stage_copy_table(r->cst, *l, akv_dptr_offset(r->ctab_d, off),
                                       r->c_indices + (size_t)layer * r->cap,
                                       (size_t)r->n_cidx * sizeof(int32_t))))
            return st;
    }
    if ((st = akv_stage_ready(r->cst, *l))) return st;
    /* direct: the host pass reads the pages now, on this thread */
    return r->queued ? AKV_OK : akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
}

/* end_layer: the compact lease's attention event, the exact part's write-back (as resident),
 * the seal. */
static akv_status hybrid_staged_end_layer(akv_route *r, uint32_t layer) {
    akv_event *ev = NULL;
    akv_status st;
    const bool leased = r->copen_layer == (int32_t)layer;
    if (leased && (st = akv_stage_attended(r->cst, r->clease[layer], &ev))) return st;
    if ((st = akv__route_write_back(r, layer))) return st;
    if (!leased) return AKV_OK;
    if ((st = akv_stage_seal(r->cst, r->clease[layer], (akv_stage_tail){0, 0}, ev))) return st;
    r->copen_layer = -1;
    return AKV_OK;
}

const akv__route_kind akv__route_hybrid_staged = {.kind = AKV_ROUTE_STAGED,
                                                  .name = "staged",
                                                  .plan_staging = hybrid_plan_staging,
                                                  .plan_windows = hybrid_plan_windows,
                                                  .need = hybrid_need,
                                                  .window = hybrid_window,
                                                  .order = hybrid_order,
                                                  .compact_order = hybrid_staged_compact_order,
                                                  .outside = AKV_KV_WINDOW,
                                                  .replayable = false,
                                                  .open = hybrid_staged_open,
                                                  .retire = hybrid_staged_retire,
                                                  .begin_layer = hybrid_staged_begin_layer,
                                                  .end_layer = hybrid_staged_end_layer,
                                                  .live = hybrid_staged_live};
