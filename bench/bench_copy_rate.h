/*
 * bench/bench_copy_rate.h — the device copy rate the benchmarks compare kernels with: one
 * device-to-device copy of n bytes by akv_dev_cuda_copy_d2d_async, timed by
 * akv_dev_cuda_time_us (5 warm-ups, the best of 9); the rate counts bytes read + written
 * (2n per copy). Include after bench_try.h.
 */
#ifndef AKV_BENCH_COPY_RATE_H
#define AKV_BENCH_COPY_RATE_H

#include "akv/dev_cuda.h"

typedef struct copy_work {
    akv_dptr a, b; /* source, destination: n bytes each */
    size_t n;
} copy_work;

static inline akv_status copy_issue(void *arg, void *stream) {
    copy_work *c = (copy_work *)arg;
    return akv_dev_cuda_copy_d2d_async(c->b, c->a, c->n, stream);
}

/* The device copy rate over n bytes, bytes read + written per second. */
static inline double bench_copy_rate_bps(akv_dev *dev, size_t n) {
    copy_work cw = {.n = n};
    TRY(akv_dev_mem_alloc(dev, n, &cw.a));
    TRY(akv_dev_mem_alloc(dev, n, &cw.b));
    TRY(akv_dev_memset_sync(dev, cw.a, 1, n));
    double us = 0;
    TRY(akv_dev_cuda_time_us(copy_issue, &cw, 5, 9, &us));
    TRY(akv_dev_mem_free(dev, cw.a));
    TRY(akv_dev_mem_free(dev, cw.b));
    return 2.0 * (double)n / (us * 1e-6);
}

#endif
