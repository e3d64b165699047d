/* route.c — one sequence's history placed for the forward pass (akv/route.h): host table,
 * device-pool window, per-layer CSR tables, fills of fresh pages, write-back of new rows;
 * for the staged route, the non-window pages through one staging lease per layer. */
#include "akv/route.h"

#include <string.h>

#include "akv/host_table.h"
#include "akv/stage.h"
#include "engine/route_check.h"
#include "core/alloc.h"
#include "core/log.h"

struct akv_route {
    akv_dev *dev;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_geom geom;
    akv_route_kind kind;
    uint64_t max_tokens;
    uint32_t max_pages;    /* logical pages per layer at max_tokens */
    akv_host_table *ht;    /* the authoritative copy */
    akv_dev_pool_ctx *ctx; /* the device window */
    uint64_t n_tokens;     /* history length (host table length) */
    uint64_t step_first;   /* first token of the step begun last (its rows are written back) */
    /* the CSR tables of the step begun last (host memory: the host backend's attention reads
     * device addresses as host addresses) */
    int32_t indptr[2];
    int32_t last_page_len;
    int32_t *indices; /* [n_layers][max_pages] device page ids, logical order */
    akv_route_stats stats;
    /* queued mode (route.h): the tables in pinned memory and their device copy, laid out as
     * [indptr 2][last_page_len 1][pad 1][indices n_layers*max_pages] int32 (indices above
     * points into tab_h) */
    bool queued;
    bool tab_dirty;     /* indices changed since the last upload */
    bool refill;        /* the device window is not trusted: a step failed after the device
                           pool placed it (the pool marks pages fresh for one step only), a
                           queue failed, or (queued) the step begun last has not reached its
                           last end_layer (its fills and table upload may have been skipped
                           on a queue that failed, which a wait after a recovery no longer
                           shows). The next step refills every window page that holds earlier
                           tokens and uploads the whole table */
    bool wb_check;      /* resident, queued: the step's write-backs were all enqueued and
                           ev_wb recorded; route_settle has not checked how they ended */
    int32_t *tab_h;     /* pinned */
    akv_dptr tab_d;     /* device */
    akv_event **ev;     /* [n_layers]: the layer's attention enqueued (write-back waits on it) */
    akv_event *ev_wb;   /* resident: recorded on D2H after the step's last write-back */
    akv_event *ev_fill; /* recorded on D2H before fills: fresh pages wait for their readers */
    /* staged (route.h): the window target, the pages staged this step (the same logical pages
     * in every layer: the window is uniform over layers), one lease per layer */
    akv_stage *stage;
    bool own_stage;
    uint32_t window_target;
    uint32_t *staged;          /* [max_pages] logical pages outside the window, ascending */
    uint32_t n_staged;
    akv_host_page *hpages;     /* [max_pages] scratch: the host pages of a copy or the owners */
    uint32_t *slot_ids;        /* [max_pages] where the last copy landed (a prefetch's stays
                                * there, untouched, until the next step's layer 0 reads it) */
    akv_stage_lease *lease;    /* [n_layers] this step's leases */
    uint8_t *lease_live;       /* [n_layers] begun and not yet retired */
    int32_t open_layer;        /* the layer whose lease is begun but not sealed; -1 = none */
    /* prefetch (route.h): the next step's layer-0 lease, begun and copied at the end of a step */
    bool prefetch;             /* on for this route */
    bool pf_live;              /* begun (not yet used or retired) */
    bool pf_cancelled;         /* cancelled: retire it, never use it */
    akv_stage_lease pf;
};

enum { ROUTE_TAB_HEAD = 4 }; /* int32s before the indices in tab_h/tab_d */

/* Queued mode: every copy and kernel enqueued so far is complete (compute first: the
 * write-backs wait on it). */
static akv_status route_wait(akv_route *r) {
    if (!r->queued) return AKV_OK;
    akv_status st = akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    akv_status st2 = akv_dev_queue_sync(r->dev, AKV_QUEUE_D2H); /* both drained either way */
    if (!st) st = st2;
    /* a queue failed: what it held may not have run, the tables and fills on the device
     * included (accepted is not done): the next step rewrites them all */
    if (st) r->refill = true; /* refill re-uploads the whole table too */
    return st;
}

const char *akv_route_kind_name(akv_route_kind kind) {
    return kind == AKV_ROUTE_RESIDENT ? "resident" : kind == AKV_ROUTE_STAGED ? "staged" : "?";
}

static bool route_same_geom(const akv_geom *a, const akv_geom *b) {
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->page_tokens == b->page_tokens && a->dtype == b->dtype;
}

uint32_t akv_route_slot_pages(const akv_geom *g, uint64_t max_tokens, uint32_t window_pages) {
    uint64_t n_lp = akv_geom_pages_for_tokens(g, max_tokens);
    uint32_t w = window_pages ? window_pages : AKV_ROUTE_WINDOW_PAGES;
    if (n_lp <= w) return 1;
    return n_lp - w > UINT32_MAX ? UINT32_MAX : (uint32_t)(n_lp - w); /* saturated: no pool holds it */
}

uint32_t akv_route_staging_pages(const akv_geom *g, uint64_t max_tokens, uint32_t window_pages) {
    uint32_t slot = akv_route_slot_pages(g, max_tokens, window_pages);
    return slot > UINT32_MAX / 2 ? UINT32_MAX : 2 * slot;
}

/* Staged: checks the window and the stage (borrowed, or created from the staging reserve). */
static akv_status route_stage_open(akv_route *r, const akv_route_params *p) {
    const akv_geom *g = &r->geom;
    uint32_t slot = akv_route_slot_pages(g, r->max_tokens, r->window_target);
    r->open_layer = -1;
    if (p->stage) {
        if (akv_stage_check_pools(p->stage, r->hp, r->dp) != AKV_OK) return AKV_EINVAL; /* logged */
        akv_stage_params sp = akv_stage_get_params(p->stage);
        if (sp.slot_pages < slot) {
            AKV_LOG_E("route: the stage's slots hold %u pages; a staged history of %llu tokens "
                      "with a window of %u pages stages up to %u per layer (--max-context)",
                      sp.slot_pages, (unsigned long long)r->max_tokens, r->window_target, slot);
            return AKV_EINVAL;
        }
        r->stage = p->stage;
        return AKV_OK;
    }
    akv_stage_params sp = akv_stage_default_params();
    sp.n_slots = 2, sp.slot_pages = slot;
    akv_status st = akv_stage_create(r->dev, r->hp, r->dp, &sp, &r->stage);
    if (st == AKV_EFULL)
        AKV_LOG_E("route: the staged route needs a staging reserve of %u pages (2 slots x %u "
                  "pages of %zu KiB) in the device pool: raise --device-gib or lower "
                  "--max-context",
                  2 * slot, slot, akv_geom_page_bytes(g) >> 10);
    r->own_stage = st == AKV_OK;
    return st;
}

akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out) {
    if (!dev || !host_pool || !dev_pool || !p || !out) {
        AKV_LOG_E("route: create with a NULL %s", !dev ? "device" : !host_pool ? "host pool" : !dev_pool ? "device pool" : !p ? "params" : "output");
        return AKV_EINVAL;
    }
    if (p->kind != AKV_ROUTE_RESIDENT && p->kind != AKV_ROUTE_STAGED) {
        AKV_LOG_E("route: kind %d is neither resident nor staged", (int)p->kind);
        return AKV_EINVAL;
    }
    akv_dev_info info;
    akv_status st = akv_dev_get_info(dev, &info);
    if (st) return st;
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
    uint64_t n_lp = akv_geom_pages_for_tokens(g, p->max_tokens);
    if (p->max_tokens == 0 || n_lp > INT32_MAX / g->n_layers) {
        AKV_LOG_E("route: max_tokens %llu is out of range", (unsigned long long)p->max_tokens);
        return AKV_EINVAL;
    }
    /* Resident: the whole history is the window, so the target is every page of it (and at
     * least the floor of two). Staged: the window's pages. */
    bool staged = p->kind == AKV_ROUTE_STAGED;
    uint32_t target = n_lp < 2 ? 2 : (uint32_t)n_lp;
    if (staged) target = p->window_pages ? p->window_pages : AKV_ROUTE_WINDOW_PAGES;
    akv_dev_pool_stats ps;
    akv_dev_pool_get_stats(dev_pool, &ps);
    if (staged && (target < 2 || target > ps.window_capacity)) {
        AKV_LOG_E("route: a staged window of %u pages per layer (the sink and the newest: at "
                  "least 2); the device pool holds %u window pages per layer: raise "
                  "--device-gib",
                  target, ps.window_capacity);
        return AKV_EINVAL;
    }
    if (!staged && target > ps.window_capacity) {
        double need_gib = (double)target * g->n_layers * ps.page_bytes / (1u << 30);
        AKV_LOG_E("route: a resident history of %llu tokens needs %u pages per layer x %u layers "
                  "(%.2f GiB of device pool); the pool holds %u pages per layer: raise "
                  "--device-gib or lower the context",
                  (unsigned long long)p->max_tokens, target, g->n_layers, need_gib,
                  ps.window_capacity);
        return AKV_EINVAL;
    }

    akv_route *r = akv__calloc(1, sizeof *r);
    if (!r) return AKV_ENOMEM;
    r->dev = dev, r->hp = host_pool, r->dp = dev_pool, r->geom = *g, r->kind = p->kind;
    r->max_tokens = p->max_tokens;
    r->max_pages = (uint32_t)n_lp;
    r->queued = p->queued;
    r->window_target = target;
    size_t n_idx = (size_t)n_lp * g->n_layers;
    if (r->queued) {
        size_t tab_bytes = (ROUTE_TAB_HEAD + n_idx) * sizeof(int32_t);
        r->ev = akv__calloc(g->n_layers, sizeof *r->ev);
        st = r->ev ? AKV_OK : AKV_ENOMEM;
        if (!st && (st = akv_dev_pinned_alloc(dev, tab_bytes, (void **)&r->tab_h)) == AKV_OK) {
            memset(r->tab_h, 0, tab_bytes);
            r->indices = r->tab_h + ROUTE_TAB_HEAD;
            st = akv_dev_mem_alloc(dev, tab_bytes, &r->tab_d);
        }
        for (uint32_t l = 0; l < g->n_layers && !st; l++)
            st = akv_dev_event_create(dev, 0, &r->ev[l]);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_wb);
        if (!st) st = akv_dev_event_create(dev, 0, &r->ev_fill);
    } else {
        r->indices = akv__calloc(n_idx, sizeof *r->indices);
        st = r->indices ? AKV_OK : AKV_ENOMEM;
    }
    if (!st && staged) {
        r->staged = akv__calloc(n_lp, sizeof *r->staged);
        r->hpages = akv__calloc(n_lp, sizeof *r->hpages);
        r->slot_ids = akv__calloc(n_lp, sizeof *r->slot_ids);
        r->lease = akv__calloc(g->n_layers, sizeof *r->lease);
        r->lease_live = akv__calloc(g->n_layers, sizeof *r->lease_live);
        st = r->staged && r->hpages && r->slot_ids && r->lease && r->lease_live ? AKV_OK : AKV_ENOMEM;
        if (!st) st = route_stage_open(r, p);
        r->prefetch = r->queued && (p->prefetch > 0 || (p->prefetch == 0 && r->own_stage));
    }
    akv_dev_pool_ctx_params cp = {.target = target, .burst = 0, .tag = p->tag};
    if (!st && (st = akv_host_table_create(host_pool, &r->ht)) == AKV_OK)
        st = akv_dev_pool_ctx_open(dev_pool, &cp, &r->ctx);
    if (st) {
        akv_route_destroy(r);
        return st;
    }
    *out = r;
    return AKV_OK;
}

akv_status akv_route_destroy(akv_route *r) {
    if (!r) return AKV_OK;
    if (r->pf_live) {
        AKV_LOG_E("route: destroy refused: the prefetched lease of the next step is not retired "
                  "(akv_route_sync first)");
        return AKV_EBUSY;
    }
    for (uint32_t l = 0; r->lease_live && l < r->geom.n_layers; l++)
        if (r->lease_live[l]) {
            AKV_LOG_E("route: destroy refused: the staged lease of layer %u is not retired "
                      "(akv_route_sync first)",
                      l);
            return AKV_EBUSY;
        }
    /* queued: no copy may still touch a page or a table that is about to be freed */
    akv_status st = route_wait(r);
    if (st) return st;
    if ((st = akv_host_table_destroy(r->ht))) return st;
    if (r->own_stage && (st = akv_stage_destroy(r->stage))) return st;
    r->own_stage = false;
    akv__free(r->staged);
    akv__free(r->hpages);
    akv__free(r->slot_ids);
    akv__free(r->lease);
    akv__free(r->lease_live);
    if (r->ctx) akv_dev_pool_ctx_close(r->dp, r->ctx);
    if (r->queued) {
        for (uint32_t l = 0; r->ev && l < r->geom.n_layers; l++)
            akv_dev_event_destroy(r->dev, r->ev[l]);
        akv_dev_event_destroy(r->dev, r->ev_wb);
        akv_dev_event_destroy(r->dev, r->ev_fill);
        akv__free(r->ev);
        akv_dev_mem_free(r->dev, r->tab_d);
        if (r->tab_h) akv_dev_pinned_free(r->dev, r->tab_h);
    } else {
        akv__free(r->indices);
    }
    akv__free(r);
    return AKV_OK;
}

/* Retires one lease (fences waited on): AKV_OK, or the failure; *released says whether the
 * record is gone (retired, or failed with completion established after a quarantine).
 * *quarantined: whether this pass already quarantined (once per pass: a drain that could
 * not establish completion for one lease will not for the next). */
static akv_status route_retire_one(akv_route *r, akv_stage_lease l, akv_stage_receipt *rc,
                                   bool *released, bool *quarantined) {
    memset(rc, 0, sizeof *rc);
    akv_status s = akv_stage_retire(r->stage, l, rc);
    if (s == AKV_EFAILED && !rc->failed && !*quarantined) {
        /* retained by a quarantine that could not establish completion: the device may
         * have recovered since; only a new quarantine's fences let the lease go */
        *quarantined = true;
        if (akv_stage_quarantine(r->stage) == AKV_OK) {
            memset(rc, 0, sizeof *rc);
            s = akv_stage_retire(r->stage, l, rc);
        }
    }
    *released = s == AKV_OK || (s == AKV_EFAILED && rc->failed);
    return s;
}

/* The prefetched lease, when the next step is not the one it was made for: cancelled and
 * retired (*quarantined: as for route_retire_one, shared by the caller's pass). */
static akv_status route_drop_prefetch(akv_route *r, bool *quarantined) {
    if (!r->pf_live) return AKV_OK;
    akv_status first = AKV_OK;
    if (!r->pf_cancelled) {
        first = akv_stage_cancel(r->stage, r->pf);
        r->pf_cancelled = true; /* even if the cancel failed: never use it */
        r->stats.n_prefetch_dropped++;
    }
    akv_stage_receipt rc;
    bool released = false;
    akv_status s = route_retire_one(r, r->pf, &rc, &released, quarantined);
    if (released) r->pf_live = false, r->pf_cancelled = false;
    return first != AKV_OK ? first : s;
}

/* Staged: cancels the lease a failed pass left open (begun, ready or attended, never
 * sealed), then retires every lease of the last step: waits on their fences and checks each
 * receipt against what was submitted (owner write-backs and staged copies). *quarantined:
 * as for route_retire_one. */
static akv_status route_retire(akv_route *r, bool *quarantined) {
    if (!r->stage) return AKV_OK;
    akv_status first = AKV_OK;
    if (r->open_layer >= 0) {
        akv_status s = akv_stage_cancel(r->stage, r->lease[r->open_layer]);
        if (s != AKV_OK) first = s;
        r->open_layer = -1;
    }
    for (uint32_t l = 0; l < r->geom.n_layers; l++) {
        if (!r->lease_live[l]) continue;
        akv_stage_receipt rc;
        bool released = false;
        akv_status s = route_retire_one(r, r->lease[l], &rc, &released, quarantined);
        /* released: retired, or failed with completion established (a receipt came back);
         * otherwise it stays live (retained, or not sealed: a bug) */
        if (released) r->lease_live[l] = 0;
        if (s != AKV_OK) {
            if (first == AKV_OK) first = s;
            continue;
        }
        r->stats.n_leases++;
        if (!rc.cancelled && (rc.n_copies != r->n_staged || rc.failed)) {
            AKV_LOG_E("route: the lease of layer %u (step %llu) staged %u pages; %u were "
                      "submitted",
                      l, (unsigned long long)rc.step, rc.n_copies, r->n_staged);
            if (first == AKV_OK) first = AKV_ESTATE;
        }
    }
    return first;
}

/* Copies a fresh device page's earlier tokens from the host copy (the whole page: its unused
 * slots are overwritten before anything reads them). */
static akv_status route_fill(akv_route *r, uint32_t layer, uint32_t logical, uint32_t page_id) {
    akv_host_page hpg = akv_host_table_page(r->ht, layer, logical);
    const void *src = akv_host_pool_page_addr(r->hp, hpg);
    size_t n = akv_geom_page_bytes(&r->geom);
    akv_dptr dst = akv_dev_pool_page_addr(r->dp, page_id);
    /* queued: on the compute queue, so the layer's kernels see it (the host page is pinned and
     * holds earlier tokens only: nothing rewrites it while the copy is pending) */
    akv_status st = r->queued ? akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, dst, src, n)
                              : akv_dev_copy_h2d_sync(r->dev, dst, src, n);
    if (st == AKV_OK) r->stats.h2d_bytes += n;
    return st;
}

/* The rows [t0, t1) of logical page p that the step begun last wrote (page-relative). */
static void route_page_rows(const akv_route *r, uint64_t p, uint64_t *t0, uint64_t *t1) {
    uint64_t P = r->geom.page_tokens, lo = p * P, hi = lo + P;
    *t0 = (r->step_first > lo ? r->step_first : lo) - lo;
    *t1 = (r->n_tokens < hi ? r->n_tokens : hi) - lo;
}

/* Resident: the layer's new rows to the host copy, per page touched: queued, one 2D copy on
 * the D2H queue (2*n_kv_heads runs of rows at a pitch of P rows); direct, one synchronous
 * copy per run. */
static akv_status route_copy_rows(akv_route *r, uint32_t layer) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype), pitch = (size_t)P * row;
    for (uint64_t p = r->step_first / P; p * P < r->n_tokens; p++) {
        uint64_t t0, t1;
        route_page_rows(r, p, &t0, &t1);
        uint32_t page_id = (uint32_t)r->indices[(size_t)layer * r->max_pages + p];
        akv_dptr dpage = akv_dev_pool_page_addr(r->dp, page_id);
        uint8_t *hpage =
            akv_host_pool_page_addr(r->hp, akv_host_table_page(r->ht, layer, (uint32_t)p));
        size_t w = (size_t)(t1 - t0) * row;
        if (r->queued) {
            size_t off = (size_t)t0 * row;
            akv_status st = akv_dev_copy_d2h_2d_async(r->dev, AKV_QUEUE_D2H, hpage + off, pitch,
                                                      akv_dptr_offset(dpage, off), pitch, w,
                                                      2 * (size_t)g->n_kv_heads);
            if (st) return st;
            r->stats.d2h_bytes += w * 2 * g->n_kv_heads;
            continue;
        }
        for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
            size_t off = kvh * pitch + (size_t)t0 * row;
            akv_status st = akv_dev_copy_d2h_sync(r->dev, hpage + off, akv_dptr_offset(dpage, off), w);
            if (st) return st;
            r->stats.d2h_bytes += w;
        }
    }
    return AKV_OK;
}

/* Before a step fills or writes its fresh pages: a page the device pool placed may
 * have left another context's window (reclaimed) or this one's, and a write-back of another
 * route may still be reading it (docs/mem.md, "Fences"). Queued: the compute queue (fills,
 * the pass's kernels) waits for every write-back enqueued so far; direct: the host waits for
 * the write-back and compute queues. */
static akv_status route_order_fills(akv_route *r) {
    if (!r->queued) {
        akv_status st = akv_dev_queue_sync(r->dev, AKV_QUEUE_D2H);
        return st ? st : akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    }
    akv_status st = akv_dev_event_record(r->dev, r->ev_fill, AKV_QUEUE_D2H);
    return st ? st : akv_dev_queue_wait_event(r->dev, AKV_QUEUE_COMPUTE, r->ev_fill);
}

/* The step route_settle cannot establish: the history goes back to where it began, the next
 * step refills the window, and the caller hears it (*lost; `why` for the log). */
static akv_status route_undo(akv_route *r, const char *why, bool *lost) {
    AKV_LOG_E("route: the step to %llu tokens %s; the history is back to %llu tokens (feed them "
              "again)",
              (unsigned long long)r->n_tokens, why, (unsigned long long)r->step_first);
    akv_status st = akv_host_table_truncate(r->ht, r->step_first);
    if (st) return st;
    r->n_tokens = r->step_first;
    r->refill = true;
    r->wb_check = false;
    *lost = true;
    return AKV_OK;
}

/* Whether every device page that received the step's rows is still this route's (a page only
 * changes owner through some context's step, so one still in the window was written by no
 * one else since). */
static bool route_holds_step(const akv_route *r) {
    const uint32_t P = r->geom.page_tokens;
    for (uint32_t l = 0; l < r->geom.n_layers; l++)
        for (uint64_t p = r->step_first / P; p * P < r->n_tokens; p++)
            if (akv_dev_pool_ctx_find(r->dp, r->ctx, l, (uint32_t)p) !=
                r->indices[(size_t)l * r->max_pages + p])
                return false;
    return true;
}

/* Resident, queued, once the queues are idle (route_wait returned OK): makes sure the rows of
 * a step whose write-backs were all enqueued are in the host copy. Its kernels and
 * write-backs completed, but maybe not without error (a queue failed while they ran, then the
 * device recovered):
 *   - kernels failed: the device pages lack the rows too, so the step is undone (route_undo)
 *     and *lost is set: the pass may have returned OK (a prompt chunk that reads no logits),
 *     the caller must hear it;
 *   - write-backs failed: enqueued again from the device pages, which hold the rows, and
 *     waited for; unless another context's step has taken one of those pages since (a
 *     reclaim: it may have written its own rows there), and then the step is undone too.
 * A backend that cannot tell how they ended (CUDA after an error) leaves the check pending:
 * the next call tries again. (A step whose pass failed before its last write-back is the
 * caller's to truncate, route.h; a staged route's stage reports a failed write-back at
 * retire and stays failed.) */
static akv_status route_settle(akv_route *r, bool *lost) {
    *lost = false;
    if (!r->wb_check) return AKV_OK;
    const uint32_t n_layers = r->geom.n_layers;
    int failed = 0;
    akv_status st = akv_dev_event_outcome(r->dev, r->ev[n_layers - 1], &failed);
    if (st) return st;
    if (failed) return route_undo(r, "failed on the device after its pass returned", lost);
    if ((st = akv_dev_event_outcome(r->dev, r->ev_wb, &failed))) return st;
    if (failed && !route_holds_step(r))
        return route_undo(r, "lost its write-back to a device failure, and another context "
                             "has taken its device pages since", lost);
    if (failed) {
        AKV_LOG_W("route: the write-back of tokens %llu..%llu failed; writing it back again "
                  "from the device pages",
                  (unsigned long long)r->step_first, (unsigned long long)r->n_tokens - 1);
        for (uint32_t l = 0; l < n_layers && !st; l++) st = route_copy_rows(r, l);
        if (!st) st = akv_dev_event_record(r->dev, r->ev_wb, AKV_QUEUE_D2H);
        if (st || (st = route_wait(r))) return st;
    }
    r->wb_check = false;
    return AKV_OK;
}

akv_status akv_route_begin_step(akv_route *r, uint64_t n_total) {
    if (!r) return AKV_EINVAL;
    if (n_total > r->max_tokens) {
        AKV_LOG_E("route: a step to %llu tokens; the limit is %llu", (unsigned long long)n_total,
                  (unsigned long long)r->max_tokens);
        return AKV_EINVAL;
    }
    /* 0. staged: the previous step's leases retire (their fences waited on). queued: the
     * previous step's kernels and write-backs are done, so the host copy is complete (a
     * failed write-back redone, or the step undone if its kernels failed: route_settle) and
     * the tables may be rewritten */
    bool quarantined = false, lost = false;
    akv_status st = route_retire(r, &quarantined);
    if (st || (st = route_wait(r)) || (st = route_settle(r, &lost))) return st;
    if (lost) return AKV_EDEVICE; /* logged: the caller's length is not the route's now */
    uint64_t n_old = r->n_tokens;
    if (n_total <= n_old) { /* checked after the settle, which may shorten the history */
        AKV_LOG_E("route: a step to %llu tokens from %llu does not grow the history",
                  (unsigned long long)n_total, (unsigned long long)n_old);
        return AKV_EINVAL;
    }
    /* a prefetched lease serves only the one-token step it was made for (made at the end of
     * the step that left n_old tokens; a truncate since drops it) */
    if (n_total != n_old + 1 && (st = route_drop_prefetch(r, &quarantined))) return st;
    /* 1. the host copy grows first: it is where the rows land for good */
    st = akv_host_table_grow(r->ht, n_total);
    if (st == AKV_EFULL) AKV_LOG_E("route: the host pool is full: raise --host-gib");
    if (st) return st;
    /* 2. the device window: every page of the history (resident), or the sink and the
     * newest pages up to the target (staged) */
    akv_dev_pool_req req = {.ctx = r->ctx, .n_tokens = n_total};
    akv_dev_pool_result res;
    st = akv_dev_pool_step(r->dp, &req, 1, &res);
    /* from here a failure may leave placed pages unfilled: until a step completes, every
     * step refills its whole window (and re-uploads the table) */
    const bool refill = r->refill;
    r->refill = true;
    uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_total);
    uint32_t want = r->stage && r->window_target < n_lp ? r->window_target : n_lp;
    if (st == AKV_OK && res.window != want) st = AKV_EFULL;
    if (st) {
        if (st == AKV_EFULL)
            AKV_LOG_E("route: the device pool holds %u of the %u window pages per layer a %s "
                      "history of %llu tokens needs: raise --device-gib",
                      res.window, want, akv_route_kind_name(r->kind),
                      (unsigned long long)n_total);
        akv_host_table_truncate(r->ht, n_old);
        return st;
    }
    /* 3. per layer: fill fresh window pages that hold earlier tokens, and the CSR table (the
     * staged pages' entries are written at begin_layer, from the slot the copy used) */
    uint32_t P = r->geom.page_tokens;
    if ((res.n_fresh || refill) && (st = route_order_fills(r))) {
        akv_host_table_truncate(r->ht, n_old);
        return st;
    }
    r->n_staged = 0;
    for (uint32_t l = 0; l < r->geom.n_layers; l++) {
        for (uint32_t w = 0, next = 0; w < want; w++) {
            akv_dev_pool_slot s = akv_dev_pool_ctx_slot(r->dp, r->ctx, l, w);
            AKV_ASSERT(r->stage || s.logical == w); /* resident: the window is the history */
            for (; l == 0 && next < s.logical; next++) /* the gap before it is staged */
                r->staged[r->n_staged++] = next;
            next = s.logical + 1;
            if ((s.fresh || refill) && (uint64_t)s.logical * P < n_old &&
                (st = route_fill(r, l, s.logical, s.page_id))) {
                akv_host_table_truncate(r->ht, n_old);
                return st;
            }
            int32_t *slot = &r->indices[(size_t)l * r->max_pages + s.logical];
            if (*slot != (int32_t)s.page_id || s.fresh || refill) r->tab_dirty = true;
            *slot = (int32_t)s.page_id;
        }
    }
    AKV_ASSERT(r->n_staged == n_lp - want); /* the window holds the newest page */
    /* a prefetch was made only where the next step keeps the page count, hence the window
     * and the staged set */
    AKV_ASSERT(!r->pf_live || r->pf_cancelled || n_lp == (uint32_t)((n_old + P - 1) / P));
    r->indptr[0] = 0, r->indptr[1] = (int32_t)n_lp;
    r->last_page_len = (int32_t)(n_total - (uint64_t)(n_lp - 1) * P);
    if (r->queued) {
        /* 4. the tables to the device, in compute-queue order (the header every step, the
         * indices when a page changed) */
        r->tab_h[0] = r->indptr[0], r->tab_h[1] = r->indptr[1], r->tab_h[2] = r->last_page_len;
        size_t n_int = ROUTE_TAB_HEAD + (r->tab_dirty ? (size_t)r->geom.n_layers * r->max_pages : 0);
        st = akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, r->tab_d, r->tab_h,
                                    n_int * sizeof(int32_t));
        if (st) {
            akv_host_table_truncate(r->ht, n_old);
            return st;
        }
        r->tab_dirty = false;
    }
    r->refill = r->queued; /* until the step's last end_layer */
    r->step_first = n_old;
    r->n_tokens = n_total;
    r->stats.n_steps++;
    return AKV_OK;
}

/* The copies of the step's staged pages of `layer` under lease l; where they landed into
 * r->slot_ids. */
static akv_status route_copy_staged(akv_route *r, uint32_t layer, akv_stage_lease l) {
    for (uint32_t i = 0; i < r->n_staged; i++)
        r->hpages[i] = akv_host_table_page(r->ht, layer, r->staged[i]);
    akv_status st = akv_stage_copy(r->stage, l, r->hpages, r->n_staged, r->slot_ids);
    if (st == AKV_OK) r->stats.h2d_bytes += (uint64_t)r->n_staged * akv_geom_page_bytes(&r->geom);
    return st;
}

/* Staged begin_layer: the lease (owners = the host pages of the step's new rows), the copies
 * of the non-window pages, their slot ids into the layer's table, the compute queue's wait. */
static akv_status route_stage_layer(akv_route *r, uint32_t layer) {
    uint32_t P = r->geom.page_tokens;
    akv_stage_lease *l = &r->lease[layer];
    akv_status st = AKV_OK;
    const bool prefetched = layer == 0 && r->pf_live && !r->pf_cancelled;
    if (prefetched) {
        /* prefetched at the end of the previous step, for this one (begin_step dropped any
         * other): begun, copies enqueued, their slots in r->slot_ids */
        *l = r->pf;
        r->pf_live = false;
        r->stats.n_prefetched++;
    } else {
        uint32_t p0 = (uint32_t)(r->step_first / P), p1 = (uint32_t)((r->n_tokens - 1) / P);
        for (uint32_t p = p0; p <= p1; p++)
            r->hpages[p - p0] = akv_host_table_page(r->ht, layer, p);
        st = akv_stage_begin(r->stage, layer, r->stats.n_steps, r->hpages, p1 - p0 + 1, l);
        /* AKV_EDEVICE: a device submission of the begin failed after the stage issued the
         * lease (akv_stage_begin): it is live and must be cancelled and retired like any */
        if (st && st != AKV_EDEVICE) return st;
    }
    r->lease_live[layer] = 1;
    r->open_layer = (int32_t)layer;
    if (st) return st;
    if (!prefetched && (st = route_copy_staged(r, layer, *l))) return st;
    int32_t *row = r->indices + (size_t)layer * r->max_pages;
    for (uint32_t i = 0; i < r->n_staged; i++)
        row[r->staged[i]] = (int32_t)r->slot_ids[i];
    r->stats.staged_bytes += (uint64_t)r->n_staged * akv_geom_page_bytes(&r->geom);
    if ((st = akv_stage_ready(r->stage, *l))) return st;
    if (!r->queued) /* direct: the host pass reads the pages now, on this thread */
        return akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    /* the layer's row of indices, in compute-queue order (before the attention) */
    if (r->n_staged == 0) return AKV_OK;
    size_t off = ((size_t)ROUTE_TAB_HEAD + (size_t)layer * r->max_pages) * sizeof(int32_t);
    return akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, akv_dptr_offset(r->tab_d, off), row,
                                  (size_t)r->max_pages * sizeof(int32_t));
}

/* After the last layer of a step: begins the next one-token step's layer-0 lease and enqueues
 * its copies (route.h, prefetch), when that step keeps the window: the next token lands in the
 * current last page. Its owner is that page (the next step's new row). */
static akv_status route_prefetch(akv_route *r) {
    uint32_t P = r->geom.page_tokens;
    if (r->pf_live || r->n_staged == 0 || r->n_tokens % P == 0 || r->n_tokens + 1 > r->max_tokens)
        return AKV_OK;
    akv_host_page owner = akv_host_table_page(r->ht, 0, (uint32_t)(r->n_tokens / P));
    akv_status st = akv_stage_begin(r->stage, 0, r->stats.n_steps + 1, &owner, 1, &r->pf);
    if (st && st != AKV_EDEVICE) return st; /* EDEVICE: issued, then a submission failed */
    r->pf_live = true; /* pf_cancelled is false whenever pf_live is (route_drop_prefetch) */
    if (st) return st;
    bool quarantined = false;
    if ((st = route_copy_staged(r, 0, r->pf)))
        route_drop_prefetch(r, &quarantined); /* the copy's failure is what the caller hears */
    return st;
}

/* Staged end_layer: the attention event, the write-back of the new rows (one 2D copy per owner
 * page, from the device page holding it: window tail or slot page), the seal. */
static akv_status route_seal_layer(akv_route *r, uint32_t layer) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    akv_stage_lease l = r->lease[layer];
    akv_event *ev = NULL;
    akv_status st = akv_stage_attended(r->stage, l, &ev);
    if (st) return st;
    akv_stage_tail tail = {0, 0};
    for (uint64_t p = r->step_first / P; p * P < r->n_tokens; p++) {
        uint64_t t0, t1;
        route_page_rows(r, p, &t0, &t1);
        uint32_t page_id = (uint32_t)r->indices[(size_t)layer * r->max_pages + p];
        akv_host_page host = akv_host_table_page(r->ht, layer, (uint32_t)p);
        st = akv_stage_writeback(r->stage, l, (uint32_t)(p - r->step_first / P), host, page_id,
                                 (uint32_t)t0, (uint32_t)(t1 - t0), &tail);
        if (st) return st;
        r->stats.d2h_bytes += (t1 - t0) * akv_geom_token_bytes(g);
    }
    if ((st = akv_stage_seal(r->stage, l, tail, ev))) return st;
    r->open_layer = -1;
    return layer + 1 == g->n_layers && r->prefetch ? route_prefetch(r) : AKV_OK;
}

/* A forward hook's layer: one of the geometry's. */
static akv_status route_layer_ok(const akv_route *r, uint32_t layer, const char *hook) {
    if (layer < r->geom.n_layers) return AKV_OK;
    AKV_LOG_E("route: %s of layer %u; the history has %u layers", hook, layer, r->geom.n_layers);
    return AKV_EINVAL;
}

/* Resident: the layer's new rows to the host copy. Queued: on the D2H queue after the layer's
 * attention (the last layer's followed by ev_wb, which route_settle reads); direct: now. */
static akv_status route_writeback(akv_route *r, uint32_t layer) {
    if (!r->queued) return route_copy_rows(r, layer);
    akv_status st = akv_dev_event_record(r->dev, r->ev[layer], AKV_QUEUE_COMPUTE);
    if (st || (st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_D2H, r->ev[layer])) ||
        (st = route_copy_rows(r, layer)) || layer + 1 < r->geom.n_layers)
        return st;
    st = akv_dev_event_record(r->dev, r->ev_wb, AKV_QUEUE_D2H);
    r->wb_check = st == AKV_OK;
    return st;
}

static akv_status route_begin_layer(void *user, uint32_t layer, akv_forward_parts *parts) {
    akv_route *r = user;
    parts->n_parts = 1;
    parts->part[0].repr = AKV_KV_EXACT;
    akv_attn_pages *pg = &parts->part[0].kv;
    akv_status st = route_layer_ok(r, layer, "begin_layer");
    if (st) return st;
    st = r->stage ? route_stage_layer(r, layer) : AKV_OK;
    if (st) return st;
    /* queued: the device copy of the tables (tab_d, laid out as tab_h); direct: host arrays */
    size_t idx = ((size_t)ROUTE_TAB_HEAD + (size_t)layer * r->max_pages) * sizeof(int32_t);
    akv_dptr indptr = r->queued ? r->tab_d : akv_attn_host_ptr(r->indptr);
    akv_dptr indices = r->queued ? akv_dptr_offset(r->tab_d, idx)
                                 : akv_attn_host_ptr(r->indices + (size_t)layer * r->max_pages);
    akv_dptr last = r->queued ? akv_dptr_offset(r->tab_d, 2 * sizeof(int32_t))
                              : akv_attn_host_ptr(&r->last_page_len);
    *pg = (akv_attn_pages){.pool = akv_dev_pool_base(r->dp),
                           .indptr = indptr,
                           .indices = indices,
                           .last_page_len = last,
                           .n_seq = 1,
                           .n_pages = akv_dev_pool_n_pages(r->dp),
                           .max_pages = r->max_pages,
                           .n_kv_heads = r->geom.n_kv_heads,
                           .head_dim = r->geom.head_dim,
                           .page_tokens = r->geom.page_tokens,
                           .dtype = r->geom.dtype};
    return AKV_OK;
}

/* The step's new rows of `layer` to the host copy. */
static akv_status route_end_layer(void *user, uint32_t layer) {
    akv_route *r = user;
    akv_status st = route_layer_ok(r, layer, "end_layer");
    if (st) return st;
    st = r->stage ? route_seal_layer(r, layer) : route_writeback(r, layer);
    if (st == AKV_OK && layer + 1 == r->geom.n_layers) r->refill = false;
    return st;
}

akv_forward_kv akv_route_forward_kv(akv_route *r) {
    /* resident and queued: the tables are uploaded at begin_step and never move, begin_layer
     * enqueues nothing, and the write-backs may follow the whole step */
    return (akv_forward_kv){.user = r,
                            .begin_layer = route_begin_layer,
                            .end_layer = route_end_layer,
                            .replayable = r->queued && !r->stage};
}

/* akv_route_sync, saying (*lost) whether the step begun last was undone (route_settle). */
static akv_status route_sync(akv_route *r, bool *lost) {
    bool quarantined = false;
    *lost = false;
    akv_status st = route_retire(r, &quarantined), s2 = route_drop_prefetch(r, &quarantined);
    if (!st) st = s2;
    if (st || (st = route_wait(r))) return st;
    return route_settle(r, lost);
}

akv_status akv_route_sync(akv_route *r) {
    if (!r) return AKV_EINVAL;
    bool lost;
    akv_status st = route_sync(r, &lost);
    return st ? st : lost ? AKV_EDEVICE : AKV_OK;
}

akv_status akv_route_truncate(akv_route *r, uint64_t n_tokens) {
    if (!r) return AKV_EINVAL;
    /* queued: a failed step may have write-backs in flight into pages truncation frees;
     * staged: its leases hold those pages until they retire. A step the sync undoes (its
     * kernels failed) is what the caller is truncating away. */
    bool lost;
    akv_status st = route_sync(r, &lost);
    if (st) return st;
    if (n_tokens > r->n_tokens) {
        AKV_LOG_E("route: truncate to %llu tokens: the history holds %llu",
                  (unsigned long long)n_tokens, (unsigned long long)r->n_tokens);
        return lost ? AKV_EDEVICE : AKV_EINVAL; /* lost: the sync just undid that step */
    }
    st = akv_host_table_truncate(r->ht, n_tokens);
    if (st == AKV_OK) r->n_tokens = n_tokens;
    return st;
}

void akv_route_get_stats(const akv_route *r, akv_route_stats *out) {
    *out = r->stats;
    out->n_tokens = r->n_tokens;
    out->window_pages = akv_dev_pool_ctx_window(r->ctx);
    out->host_pages = akv_host_table_n_pages(r->ht);
    if (r->stage) {
        akv_stage_stats ss;
        akv_stage_get_stats(r->stage, &ss);
        out->n_quarantines = ss.n_quarantines;
    }
}

const akv_host_table *akv_route_host_table(const akv_route *r) {
    return r->ht;
}

akv_status akv__route_check(const akv_route *r) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(g, r->n_tokens);
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype);
    if (akv_host_table_n_pages(r->ht) != n_lp || akv_host_table_n_tokens(r->ht) != r->n_tokens) {
        AKV_LOG_E("route check: the host copy has %u pages for %llu tokens; expected %u",
                  akv_host_table_n_pages(r->ht), (unsigned long long)r->n_tokens, n_lp);
        return AKV_ESTATE;
    }
    /* after a failed step the device window is not trusted: the next step refills it */
    for (uint32_t l = 0; !r->refill && l < g->n_layers; l++) {
        for (uint32_t p = 0; p < n_lp; p++) {
            /* a page another context reclaimed is not resident: the host copy holds it */
            int64_t id = akv_dev_pool_ctx_find(r->dp, r->ctx, l, p);
            if (id < 0) continue;
            const uint8_t *h = akv_host_pool_page_addr(r->hp, akv_host_table_page(r->ht, l, p));
            /* host backend: the device address is a host address */
            const uint8_t *d =
                (const uint8_t *)(uintptr_t)akv_dev_pool_page_addr(r->dp, (uint32_t)id).addr;
            uint64_t used = r->n_tokens - (uint64_t)p * P < P ? r->n_tokens - (uint64_t)p * P : P;
            for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
                size_t off = (size_t)kvh * P * row;
                if (memcmp(h + off, d + off, (size_t)used * row)) {
                    AKV_LOG_E("route check: layer %u page %u %s head %u: the device copy differs "
                              "from the host copy",
                              l, p, kvh < g->n_kv_heads ? "K" : "V", kvh % g->n_kv_heads);
                    return AKV_ESTATE;
                }
            }
        }
    }
    return AKV_OK;
}
