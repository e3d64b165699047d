/*
 * bench/bench_copy_rate.h — the device copy rate the benchmarks compare kernels with: one
 * device-to-device copy of n bytes by akv_dev_cuda_copy_d2d_async, timed by
 * akv_dev_cuda_time_us; the rate counts bytes read + written (2n per copy).
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

#endif
