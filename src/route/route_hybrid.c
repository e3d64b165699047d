/* route_hybrid.c — the hybrid kind of akv/route.h: the resident kind with a compact tier. A
 * sequence's exact part is its sink page and its pages from x0 on (every page holding one of
 * the last exact_recent tokens or one of the step's new tokens), resident in the device pool;
 * its pages 1 .. x0-1 are read as a second part, compact pages of the compact pool, made from
 * the host copy (which stays exact and authoritative) when they are placed there. The pass
 * merges the two parts exactly (akv/attn.h). */
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
