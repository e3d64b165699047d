/*
 * bench/bench_route.h — the benchmarks' one sequence on a queued route over fresh pools, made
 * and torn down in one call each. Include after bench_try.h.
 */
#ifndef AKV_BENCH_ROUTE_H
#define AKV_BENCH_ROUTE_H

#include <math.h>

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "core/par.h"

/* The engine's default for the host part: every core but the launching thread's. */
static inline int bench_host_threads(void) {
    const uint32_t n = akv__par_cores();
    return n > 1 ? (int)n - 1 : 1;
}

typedef struct bench_route {
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_route *r;
    akv_route_seq *seq; /* open when the route is */
} bench_route;

/* A host pool for a history of max_history (and 1 GiB more), pinned at once as the engine does,
 * a device pool of device_gib (0: that history and 10 %, for a resident route), a queued route
 * of `kind` (window: its window_pages; a staged route's staging reserve follows them; host_share:
 * the host-attended kind's) and one
 * sequence. The device pool's or the route's status when either cannot be made (b then holds
 * what was made, for bench_route_close); any other failure ends the benchmark. */
/* The route kind of a name ("resident", "staged"); a name the route does not know ends the
 * benchmark. */
static inline akv_route_kind bench_kind(const char *name) {
    akv_route_kind k;
    TRY(akv_route_kind_from_name(name, &k));
    return k;
}

static inline akv_status bench_route_open(akv_dev *dev, const akv_geom *g, akv_route_kind kind,
                                          uint64_t max_history, uint32_t device_gib, uint32_t window,
                                          float host_share, bench_route *b) {
    *b = (bench_route){0};
    const double hist_gib = bench_history_gib(g, max_history);
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = (uint32_t)ceil(hist_gib) + 1;
    hpp.keep_gib = hpp.limit_gib;
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = device_gib ? device_gib : (uint32_t)ceil(hist_gib * 1.1) + 1;
    akv_route_plan rpl; /* the kind's staging reserve (none for resident) */
    TRY(akv_route_plan_begin(kind, window, g, max_history, 1, &rpl));
    dpp.staging_pages = rpl.staging_pages;
    TRY(akv_host_pool_create(dev, g, &hpp, &b->hp));
    akv_route_params rp = {.kind = kind,
                           .max_history = max_history,
                           .queued = true,
                           .window_pages = window,
                           .host_share = host_share,
                           /* AKV_BENCH_HOST_THREADS: the host part's threads (default: one
                              core left to the launching thread, as the engine does) */
                           .host_threads = (uint32_t)akv_test_env_int(
                               "AKV_BENCH_HOST_THREADS", 1, 256, bench_host_threads())};
    akv_status st = akv_dev_pool_create(dev, g, &dpp, &b->dp);
    if (st == AKV_OK) st = akv_route_create(dev, b->hp, b->dp, &rp, &b->r);
    if (st == AKV_OK) TRY(akv_route_seq_open(b->r, NULL, &b->seq));
    return st;
}

/* Closes the sequence (when open) and destroys the route and both pools (any may be NULL). */
static inline void bench_route_close(bench_route *b) {
    if (b->seq) TRY(akv_route_seq_close(b->r, b->seq));
    TRY(akv_route_destroy(b->r));
    TRY(akv_dev_pool_destroy(b->dp));
    TRY(akv_host_pool_destroy(b->hp));
    *b = (bench_route){0};
}

#endif
