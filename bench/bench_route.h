/*
 * bench/bench_route.h — the benchmarks' one-sequence route over fresh pools, torn down in one
 * call. Include after bench_try.h.
 */
#ifndef AKV_BENCH_ROUTE_H
#define AKV_BENCH_ROUTE_H

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/route.h"

/* Closes seq (when open) and destroys the route and both pools (any may be NULL). */
static inline void bench_route_close(akv_route *r, akv_route_seq *seq, akv_dev_pool *dp,
                                     akv_host_pool *hp) {
    if (seq) TRY(akv_route_seq_close(r, seq));
    TRY(akv_route_destroy(r));
    TRY(akv_dev_pool_destroy(dp));
    TRY(akv_host_pool_destroy(hp));
}

#endif
