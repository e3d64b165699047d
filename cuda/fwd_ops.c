/*
 * fwd_ops.c — CUDA launchers of the forward ops that call a library or another launcher:
 * the matrix product through cuBLAS, and the attention ops through akv/attn.h's launchers.
 *
 * Matrix product (akv_fwd_matmul_args): row-major y[m][n] = x[m][k] · W[n][k]^T is, in
 * cuBLAS's column-major terms, Y^T (n x m, ld n) = op_T(W as k x n, ld k) · (X^T as k x m,
 * ld k): cublasGemmEx(T, N, n, m, k) with bf16 A and B, f32 C and CUBLAS_COMPUTE_32F (tensor
 * cores, f32 accumulation). beta 0 or 1 (1 adds into the residual stream).
 *
 * Decode's skinny products (m <= 4) go to cuda/fwd_gemv.cu instead, and products over block
 * weights to cuda/fwd_qgemv.cu (one warp per output row) or cuda/fwd_qmma.cu (tensor-core
 * tiles) unless they are widened first (akv_fwd_matmul_algo says which AUTO picks).
 *
 * Determinism: cuBLAS gives the same bits for the same call on the same GPU model and library
 * version when the stream and the workspace are the same; atomics stay off (the default). The
 * workspace comes with the arguments (device memory the forward pass owns) and is set after
 * cublasSetStream, which resets it to the library's pool otherwise.
 */
#include <string.h>

#include <cublas_v2.h>

#include "akv/forward_ops.h"
#include "cuda_check.h"
#include "cuda_ops.h"

/* A cuBLAS status: AKV_EDEVICE, logged with the call. */
#define FWD_BLAS_TRY(expr)                                                                         \
    do {                                                                                           \
        cublasStatus_t b_ = (expr);                                                                \
        if (b_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            AKV_LOG_E("cublas: %s failed: %s (%d) at %s:%d", #expr, cublasGetStatusString(b_),     \
                      (int)b_, __FILE__, __LINE__);                                                \
            return AKV_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

akv_status akv__cuda_blas_create(void **out) {
    cublasHandle_t h = NULL;
    FWD_BLAS_TRY(cublasCreate(&h));
    *out = h;
    return AKV_OK;
}

void akv__cuda_blas_destroy(void *blas) {
    /* cublasDestroy synchronises the device (the library's documented behaviour) */
    cublasStatus_t b = cublasDestroy((cublasHandle_t)blas);
    if (b != CUBLAS_STATUS_SUCCESS)
        AKV_LOG_E("cublas: cublasDestroy failed: %s", cublasGetStatusString(b));
}

akv_status akv__cuda_fwd_matmul(const void *args, const akv__cuda_launch *l) {
    akv_fwd_matmul_args a;
    memcpy(&a, args, sizeof a);
    if (!a.m || !a.n || !a.k || a.beta > 1 || a.m > INT32_MAX || a.n > INT32_MAX ||
        a.k > INT32_MAX || !a.y.addr || !a.x.addr || !a.w.addr) {
        AKV_LOG_E("cuda matmul: bad arguments (m %u, n %u, k %u, beta %u)", a.m, a.n, a.k, a.beta);
        return AKV_EINVAL;
    }
    if (a.algo > AKV_FWD_MATMUL_TILES) {
        AKV_LOG_E("cuda matmul: unknown algo %u", a.algo);
        return AKV_EINVAL;
    }
    const bool block = a.w_type && a.w_type != AKV_OPS_W_BF16;
    if (!block && a.algo == AKV_FWD_MATMUL_TILES) {
        AKV_LOG_E("cuda matmul: the tensor-core tiles take block weights only (type %u)", a.w_type);
        return AKV_EINVAL;
    }
    if (block) {
        /* block W: integer dots over the blocks decoded in registers, one warp per output row
         * or tensor-core tiles; CUBLAS widens them into `scratch` first, then the bf16 product
         * below */
        akv_status st;
        const uint32_t algo = a.algo != AKV_FWD_MATMUL_AUTO      ? a.algo
                              : a.m < AKV_FWD_TILES_MIN_ROWS  ? AKV_FWD_MATMUL_GEMV
                              : a.m <= AKV_FWD_TILES_MAX_ROWS ? AKV_FWD_MATMUL_TILES
                                                              : AKV_FWD_MATMUL_CUBLAS;
        if (algo != AKV_FWD_MATMUL_CUBLAS) {
            const bool gemv = algo == AKV_FWD_MATMUL_GEMV;
            st = (gemv ? akv__cuda_qgemv : akv__cuda_qmma)(
                a.y.addr, a.x.addr, a.w.addr, a.w_type, a.m, a.n, a.k, (int)a.beta, a.scratch.addr,
                a.scratch_bytes, l->n_sm, l->stream);
            if (st == AKV_EINVAL)
                AKV_LOG_E("cuda matmul: the block product (%s) does not take m %u, n %u, type %u, "
                          "k %u, this alignment or %llu bytes of scratch (%llu needed)",
                          gemv ? "one warp per row" : "tiles", a.m, a.n, a.w_type, a.k,
                          (unsigned long long)a.scratch_bytes,
                          (unsigned long long)akv_fwd_qgemv_scratch_bytes(a.m, a.k));
            return st;
        }
        if (!a.scratch.addr || a.scratch_bytes < (uint64_t)a.n * a.k * 2) {
            AKV_LOG_E("cuda matmul: widening %u x %u block weights needs %llu bytes of scratch; "
                      "%llu given",
                      a.n, a.k, (unsigned long long)a.n * a.k * 2,
                      (unsigned long long)a.scratch_bytes);
            return AKV_EINVAL;
        }
        if ((st = akv__cuda_dequant_bf16(a.scratch.addr, a.w.addr, a.w_type, a.n, a.k, l->n_sm,
                                         l->stream))) {
            AKV_LOG_E("cuda matmul: cannot widen weights of type %u, k %u", a.w_type, a.k);
            return st;
        }
        a.w = a.scratch, a.w_type = 0, a.algo = AKV_FWD_MATMUL_CUBLAS;
    }
    /* AUTO: the skinny kernel for one row (measured on the H200: at or above cuBLAS for every
     * 8B decode product at m = 1, 0.74 against cuBLAS's 0.95 of the copy rate at m = 4) */
    if (a.algo == AKV_FWD_MATMUL_GEMV || (a.algo == AKV_FWD_MATMUL_AUTO && a.m == 1)) {
        akv_status st = akv__cuda_gemv_bf16(a.y.addr, a.x.addr, a.w.addr, a.m, a.n, a.k, (int)a.beta,
                                            l->stream);
        if (st != AKV_EUNSUPPORTED || a.algo == AKV_FWD_MATMUL_GEMV) {
            if (st == AKV_EUNSUPPORTED)
                AKV_LOG_E("cuda matmul: the skinny kernel does not take m %u, k %u or this alignment",
                          a.m, a.k);
            return st;
        }
    }
    cublasHandle_t h = (cublasHandle_t)l->blas;
    FWD_BLAS_TRY(cublasSetStream(h, l->stream));
    if (a.workspace.addr)
        FWD_BLAS_TRY(cublasSetWorkspace(h, (void *)(uintptr_t)a.workspace.addr,
                                        (size_t)a.workspace_bytes));
    const float alpha = 1.0f, beta = (float)a.beta;
    FWD_BLAS_TRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)a.n, (int)a.m, (int)a.k, &alpha,
                              (const void *)(uintptr_t)a.w.addr, CUDA_R_16BF, (int)a.k,
                              (const void *)(uintptr_t)a.x.addr, CUDA_R_16BF, (int)a.k, &beta,
                              (void *)(uintptr_t)a.y.addr, CUDA_R_32F, (int)a.n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return AKV_OK;
}

akv_status akv__cuda_fwd_attn_append(const void *args, const akv__cuda_launch *l) {
    akv_fwd_attn_append_args a;
    memcpy(&a, args, sizeof a);
    return akv_attn_cuda_append(&a.p, l->stream);
}

akv_status akv__cuda_fwd_attn_decode(const void *args, const akv__cuda_launch *l) {
    akv_fwd_attn_decode_args a;
    memcpy(&a, args, sizeof a);
    return akv_attn_cuda_decode(&a.p, a.workspace, (size_t)a.workspace_bytes, l->stream);
}

akv_status akv__cuda_fwd_attn_prefill(const void *args, const akv__cuda_launch *l) {
    akv_fwd_attn_prefill_args a;
    memcpy(&a, args, sizeof a);
    return akv_attn_cuda_prefill(&a.p, l->stream);
}

akv_status akv__cuda_fwd_attn_merge(const void *args, const akv__cuda_launch *l) {
    akv_fwd_attn_merge_args a;
    memcpy(&a, args, sizeof a);
    return akv_attn_cuda_merge(&a.p, l->stream);
}

akv_status akv__cuda_fwd_attn_widen(const void *args, const akv__cuda_launch *l) {
    akv_fwd_attn_widen_args a;
    memcpy(&a, args, sizeof a);
    return akv_attn_cuda_widen(&a.p, l->stream);
}
