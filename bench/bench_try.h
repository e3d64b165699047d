/*
 * bench/bench_try.h — the benchmarks' one error path: a failed call prints the expression, the
 * status and where, and the benchmark exits 1 (a benchmark has nothing to recover).
 */
#ifndef AKV_BENCH_TRY_H
#define AKV_BENCH_TRY_H

#include <stdio.h>
#include <stdlib.h>

#include "akv/status.h"

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        akv_status st_ = (expr);                                                                   \
        if (st_ != AKV_OK) {                                                                       \
            fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", AKV_BENCH_NAME, #expr,                  \
                    akv_status_str(st_), __FILE__, __LINE__);                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
