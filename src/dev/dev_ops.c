/*
 * dev_ops.c — ops every device has (the built-in part of the op table).
 *
 * "busy": a fixed amount of dependent arithmetic. Benchmarks use it to keep the SMs busy
 * while copies run (and to measure what a copy method costs concurrent compute); tests use
 * it to hold the compute queue back so that a missing event wait shows. Its CUDA launcher is
 * registered under the same name in cuda/cuda_ops.c.
 */
#include "dev/dev_impl.h"

#include <string.h>

static akv_status dev_busy_host(akv_dev *dev, const void *args) {
    akv_dev_busy_args a;
    memcpy(&a, args, sizeof a);
    /* A dependent chain the compiler cannot drop: its result is stored to the sink. */
    uint64_t x = a.n_iters | 1;
    for (uint64_t i = 0; i < a.n_iters / 64; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    if (a.sink.addr) memcpy(akv__dev_host_addr(dev, a.sink), &x, sizeof x);
    return AKV_OK;
}

const akv_dev_op akv_dev_op_busy = {
    .name = "busy",
    .args_bytes = sizeof(akv_dev_busy_args),
    .host = dev_busy_host,
};
