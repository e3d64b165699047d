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

/* What a launcher gets besides its arguments. */
typedef struct akv__cuda_launch {
    cudaStream_t stream; /* the compute queue's stream */
    void *blas;          /* the device's cuBLAS handle (cublasHandle_t) for ops that asked for
                            one (cuda_ops.c's table); NULL otherwise */
    int n_sm;            /* the device's multiprocessors (grid sizes) */
} akv__cuda_launch;

typedef akv_status (*akv_cuda_op_fn)(const void *args, const akv__cuda_launch *l);

/* The launcher registered under `name`; NULL when the CUDA backend has none. *needs_blas (may
 * be NULL) says whether it uses the cuBLAS handle (dev_cuda.c creates it on first use). */
akv_cuda_op_fn akv__cuda_op_find(const char *name, int *needs_blas);

/* Launchers (one .cu per kernel family). */
/* fwd_gemv.cu: y[m][n] (+)= x[m][k] W[n][k]^T for m <= 4 (bf16 in, f32 out); AKV_EUNSUPPORTED
 * for a shape or alignment it does not take. */
akv_status akv__cuda_gemv_bf16(uint64_t y, uint64_t x, uint64_t w, uint32_t m, uint32_t n,
                               uint32_t k, int beta, void *stream);
/* fwd_qgemv.cu: the same over W in a block format (akv/ops.h) for m <= AKV_FWD_QGEMV_MAX_ROWS,
 * x quantized into scratch first (akv_fwd_qgemv_scratch_bytes); W widened to bf16 rows at dst
 * (n * k); a block fill (akv_fwd_fill_args with w_type). Each AKV_EINVAL for a type, shape,
 * alignment or scratch it does not take. */
akv_status akv__cuda_qgemv(uint64_t y, uint64_t x, uint64_t w, uint32_t w_type, uint32_t m,
                           uint32_t n, uint32_t k, int beta, uint64_t scratch,
                           uint64_t scratch_bytes, int n_sm, void *stream);
/* fwd_qmma.cu: the same over W in a block format for any m, on the integer tensor cores, x
 * quantized into scratch first (akv_fwd_qgemv_scratch_bytes(m, k)); AKV_EINVAL as above. */
akv_status akv__cuda_qmma(uint64_t y, uint64_t x, uint64_t w, uint32_t w_type, uint32_t m,
                          uint32_t n, uint32_t k, int beta, uint64_t scratch,
                          uint64_t scratch_bytes, int n_sm, void *stream);
akv_status akv__cuda_dequant_bf16(uint64_t dst, uint64_t w, uint32_t w_type, uint32_t n,
                                  uint32_t k, int n_sm, void *stream);
akv_status akv__cuda_fill_blocks(uint64_t y, uint64_t n, uint64_t seed, uint32_t w_type,
                                 uint32_t h0, uint32_t h1, int n_sm, void *stream);
akv_status akv__cuda_busy_launch(const void *args, const akv__cuda_launch *l); /* copy_kernels.cu */

/* The staging tests' probe (akv/testing/stage_probe.h): stage_probe.cu. */
akv_status akv__cuda_stage_probe_launch(const void *args, const akv__cuda_launch *l);

/* The forward pass's ops (akv/forward_ops.h). Elementwise and row kernels: fwd_kernels.cu;
 * products (cuBLAS) and attention (akv/attn.h launchers): fwd_ops.c. */
akv_status akv__cuda_fwd_embed(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_rmsnorm(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_rope(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_head_norm(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_swiglu(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_add(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_cast(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_fill(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_argmax(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_sample(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_matmul(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_attn_append(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_attn_decode(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_attn_prefill(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_attn_merge(const void *args, const akv__cuda_launch *l);
akv_status akv__cuda_fwd_attn_widen(const void *args, const akv__cuda_launch *l);
/* The op AKV_KVQ_OP_ENCODE (akv/kvq.h; cuda/kvq_encode.cu): checks its arguments (logged) and
 * enqueues its kernel. */
akv_status akv__cuda_kvq_encode_launch(const void *args, const akv__cuda_launch *l);

/* Creates / destroys a cuBLAS handle on the current device (fwd_ops.c). */
akv_status akv__cuda_blas_create(void **out);
void akv__cuda_blas_destroy(void *blas);

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
