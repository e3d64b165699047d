/*
 * cuda/cuda_ops.h — the CUDA half of the op table, and the kernels dev_cuda.c launches itself.
 *
 * An op (akv_dev_op, dev.h) is named; its host implementation sits in its descriptor, its CUDA
 * launcher in the table of cuda_ops.c under the same name. A launcher reads its argument
 * struct during the call (the arguments go to the kernel by value), launches on `stream` (a
 * cudaStream_t), checks the launch and returns AKV_EDEVICE, logged, on any CUDA error.
 */
#ifndef AKV_CUDA_OPS_H
#define AKV_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef akv_status (*akv_cuda_op_fn)(const void *args, void *stream);

/* The launcher registered under `name`; NULL when the CUDA backend has none. */
akv_cuda_op_fn akv__cuda_op_find(const char *name);

/* Launchers (one .cu per kernel family). */
akv_status akv__cuda_busy_launch(const void *args, void *stream);         /* copy_kernels.cu */
akv_status akv__cuda_stage_probe_launch(const void *args, void *stream);  /* stage_probe.cu */

/* The copy kernel (AKV_COPY_METHOD_KERNEL): n spans between device memory and mapped pinned
 * host memory, `to_device` = 1 for H2D. n_blocks thread blocks of 512 threads. The host
 * pointers are used by the kernel directly (unified addressing: a cudaHostAlloc'd pointer is
 * its own device pointer). */
cudaError_t akv__cuda_copy_kernel(const akv_dev_xfer *x, size_t n, int to_device,
                                  unsigned n_blocks, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
