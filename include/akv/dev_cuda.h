/*
 * akv/dev_cuda.h — the CUDA backend of akv/dev.h.
 *
 * Present only in builds with the CUDA backend: the akv_cuda library defines AKV_HAVE_CUDA
 * for everything that links it. No CUDA type appears here; callers need no CUDA headers.
 */
#ifndef AKV_DEV_CUDA_H
#define AKV_DEV_CUDA_H

#include "akv/dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend. akv_dev_create() on it returns AKV_EDEVICE (logged with the CUDA
 * message) when no usable device is present, e.g. on a machine without a GPU. */
const akv_dev_backend *akv_dev_cuda_backend(void);

/* Benchmarks: device time of a piece of work. `issue` enqueues one call of the work on the
 * stream it is given (a `void *`: the CUDA stream handle) and returns a status; it is called n_calls
 * times while a CUDA graph is captured (so it must only enqueue), the graph is replayed
 * once to warm up and then n_reps times, each replay timed with device events. *us_out is
 * the median replay time divided by n_calls, in microseconds. Runs on the current device
 * (the one akv_dev_create selected) on a stream of its own; synchronises before returning. */
typedef akv_status (*akv_dev_cuda_issue_fn)(void *arg, void *stream);
akv_status akv_dev_cuda_time_us(akv_dev_cuda_issue_fn issue, void *arg, int n_calls, int n_reps,
                                double *us_out);

/* Enqueues a device-to-device copy of n_bytes on `stream` by a kernel (16-byte vectors, a
 * grid of 4 blocks per SM striding over the range; cudaMemcpyAsync when the addresses or
 * the size are not multiples of 16). With akv_dev_cuda_time_us it gives the device-copy
 * rate that kernels' bandwidth is compared with: what a kernel can read and write, which
 * a memcpy node of a graph did not reach on the H200 (2.8 TB/s against 4.3). */
akv_status akv_dev_cuda_copy_d2d_async(akv_dptr dst, akv_dptr src, size_t n_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif
