/*
 * bench/bench_try.h — what every benchmark shares: the one error path (a failed call prints
 * the expression, the status and where, and the benchmark exits 1: a benchmark has nothing
 * to recover), the CUDA device or a skip, and output to stdout and to $AKV_BENCH_OUT.
 * Define AKV_BENCH_NAME before including it.
 */
#ifndef AKV_BENCH_TRY_H
#define AKV_BENCH_TRY_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/dev_cuda.h"
#include "akv/geom.h"
#include "akv/status.h"
#include "core/assert.h"
#include "env.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        akv_status st_ = (expr);                                                                   \
        if (st_ != AKV_OK) {                                                                       \
            fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", AKV_BENCH_NAME, #expr,                  \
                    akv_status_str(st_), __FILE__, __LINE__);                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The decode's tuning for an A/B run, from the environment (the library reads none):
 * AKV_ATTN_DECODE_VARIANT = 0..2 forces a variant (unset: AUTO), AKV_ATTN_WAVES = 1..16 the
 * batch split's waves, AKV_ATTN_PARTS = 1..1024 caps the partitions, AKV_ATTN_CLUSTER = 0
 * turns the cluster merge off (akv/attn.h, akv_attn_tuning). Unset: the default. */
static inline akv_attn_tuning bench_attn_tuning(void) {
    akv_attn_tuning t = {0};
    const int v = akv_test_env_int("AKV_ATTN_DECODE_VARIANT", 0, AKV_ATTN_DECODE_VARIANTS - 1, -1);
    if (v >= 0) t.variant = AKV_ATTN_VARIANT(v);
    t.waves = (uint32_t)akv_test_env_int("AKV_ATTN_WAVES", 1, 16, 0);
    t.max_parts = (uint32_t)akv_test_env_int("AKV_ATTN_PARTS", 1, AKV_ATTN_MAX_PARTS, 0);
    t.no_cluster = akv_test_env_int("AKV_ATTN_CLUSTER", 0, 1, 1) == 0;
    return t;
}

/* The CUDA device and its info; without one, prints SKIP and exits 77 (ctest's skip). */
static inline akv_dev *bench_cuda_or_skip(akv_dev_info *info) {
    akv_dev *dev = NULL;
    if (akv_dev_create(akv_dev_cuda_backend(), NULL, &dev) != AKV_OK) {
        printf("SKIP: no CUDA device\n");
        exit(77);
    }
    TRY(akv_dev_get_info(dev, info));
    return dev;
}

/* GiB of one history of n_tokens over every layer of g (whole pages): what a context's pools
 * are sized from. */
static inline double bench_history_gib(const akv_geom *g, uint64_t n_tokens) {
    return (double)akv_geom_pages_for_tokens(g, n_tokens) * g->n_layers *
           (double)akv_geom_page_bytes(g) / (1u << 30);
}

/* $AKV_BENCH_OUT opened for appending (the markdown results), or NULL when unset or when it
 * cannot be opened (said on stderr). */
static inline FILE *bench_out_open(void) {
    const char *path = getenv("AKV_BENCH_OUT");
    if (!path || !*path) return NULL;
    FILE *f = fopen(path, "a");
    if (!f) fprintf(stderr, "%s: cannot append to %s\n", AKV_BENCH_NAME, path);
    return f;
}

/* printf to stdout and to f (when not NULL). */
static inline void bench_emit(FILE *f, const char *fmt, ...) AKV_PRINTF(2, 3);
static inline void bench_emit(FILE *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout); /* a run cut short by a time limit keeps what it printed */
    if (f) {
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fflush(f);
    }
}

/* Ends the device's op profile (akv_dev_profile_start) and prints its table to stdout and f:
 * device time per op (the top `cap` keys, at most 24), the span and what lies outside ops. */
static inline void bench_print_profile(akv_dev *dev, FILE *f, const char *what, double wall_s,
                                       size_t cap) {
    akv_dev_profile_row rows[24];
    akv_dev_profile_summary s;
    if (cap > 24) cap = 24;
    TRY(akv_dev_profile_stop(dev, rows, cap, &s));
    const double span = s.span_ns / 1e9, ops = s.ops_ns / 1e9;
    bench_emit(f,
               "\n%s: wall %.3f s; device span %.3f s = ops %.3f s + outside ops %.3f s; host "
               "outside the span %.3f s; %llu launches (%llu untimed), %zu keys.\n\n"
               "| op | launches | ms | share of ops |\n|---|---:|---:|---:|\n",
               what, wall_s, span, ops, span - ops, wall_s - span, (unsigned long long)s.launches,
               (unsigned long long)s.untimed, s.n_keys);
    for (size_t i = 0; i < s.n_keys && i < cap; i++)
        bench_emit(f, "| %s | %llu | %.3f | %.1f %% |\n", rows[i].key,
                   (unsigned long long)rows[i].launches, rows[i].ns / 1e6,
                   100.0 * rows[i].ns / s.ops_ns);
}

#endif
