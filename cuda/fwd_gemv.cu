/*
 * fwd_gemv.cu — the skinny matrix product of decode: y[m][n] (+)= x[m][k] · W[n][k]^T for
 * m <= 4 rows, bf16 x and W, f32 accumulation and output (akv_fwd_matmul_args).
 *
 * Decode reads every weight once per token, so the product is a stream over W at the memory
 * rate. One warp per output row: the lanes read the row in 16-byte pieces (8 bf16), four
 * pieces in flight each, with loads that do not allocate in L1 (the weights are read once);
 * x is small and stays in L1/L2 (plain loads, not the read-only path: x is written by the
 * kernel before, which may still be running when this one starts; see below). Each lane
 * keeps one f32 sum per x row and the warp adds its lanes with a fixed butterfly, so the
 * result is deterministic (the same bits every run).
 * It needs k a multiple of 8 and 16-byte aligned x and W; otherwise the caller uses cuBLAS.
 *
 * Launched as a programmatic dependent (grid_dep.cuh): each warp loads its first pieces of W
 * before it waits for the kernel before it, so they overlap that kernel's end (the forward's
 * small kernels let their successor start at once). It does not let its own successor start
 * early: with that trigger too, graph-replayed decode lost 4 % at 1K (docs/forward.md).
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "grid_dep.cuh"

namespace {

constexpr int kWarps = 8; /* rows per block */

__device__ __forceinline__ uint4 gemv_ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Sum of the products of 8 bf16 pairs, in a fixed order. */
__device__ __forceinline__ float gemv_dot8(uint4 a, uint4 b, float acc) {
    const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
        acc = fmaf(fa.x, fb.x, acc);
        acc = fmaf(fa.y, fb.y, acc);
    }
    return acc;
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(float *__restrict__ y, const uint4 *x, const uint4 *__restrict__ w,
                uint32_t n, uint32_t k8, int beta) {
    const uint32_t lane = threadIdx.x % 32, row = blockIdx.x * kWarps + threadIdx.x / 32;
    if (row >= n) return;
    const uint4 *wr = w + (size_t)row * k8;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; r++) acc[r] = 0.0f;
    uint32_t c = lane;
    /* the first pieces of the weights load before the wait for the predecessor (whose
     * outputs, x and y, are read after it): no kernel of a forward pass writes weights */
    uint4 wv[4];
    bool loaded = c + 96 < k8;
    if (loaded) {
#pragma unroll
        for (int u = 0; u < 4; u++) wv[u] = gemv_ld_stream(wr + c + 32 * u);
    }
    grid_dep_wait();
    for (; c + 96 < k8; c += 128) { /* four pieces in flight per lane */
        if (!loaded) {
#pragma unroll
            for (int u = 0; u < 4; u++) wv[u] = gemv_ld_stream(wr + c + 32 * u);
        }
        loaded = false;
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int r = 0; r < M; r++) acc[r] = gemv_dot8(wv[u], x[(size_t)r * k8 + c + 32 * u], acc[r]);
    }
    for (; c < k8; c += 32) {
        const uint4 wv = gemv_ld_stream(wr + c);
#pragma unroll
        for (int r = 0; r < M; r++) acc[r] = gemv_dot8(wv, x[(size_t)r * k8 + c], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < M; r++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < M; r++) {
            float *out = y + (size_t)r * n + row;
            *out = beta ? *out + acc[r] : acc[r];
        }
    }
}

} // namespace

extern "C" akv_status akv__cuda_gemv_bf16(uint64_t y, uint64_t x, uint64_t w, uint32_t m, uint32_t n,
                                         uint32_t k, int beta, void *stream) {
    if (m == 0 || m > 4 || n == 0 || k == 0 || k % 8 != 0 || (x | w) % 16 != 0 || y % 4 != 0)
        return AKV_EUNSUPPORTED;
    const dim3 grid((n + kWarps - 1) / kWarps), block(kWarps * 32);
    float *py = reinterpret_cast<float *>(static_cast<uintptr_t>(y));
    const uint4 *px = reinterpret_cast<const uint4 *>(static_cast<uintptr_t>(x));
    const uint4 *pw = reinterpret_cast<const uint4 *>(static_cast<uintptr_t>(w));
    void (*kern)(float *, const uint4 *, const uint4 *, uint32_t, uint32_t, int) =
        m == 1 ? gemv_kernel<1> : m == 2 ? gemv_kernel<2> : m == 3 ? gemv_kernel<3> : gemv_kernel<4>;
    return grid_dep_launch_kernel(kern, grid, block, 0, static_cast<cudaStream_t>(stream), py, px, pw, n,
                                  k / 8, beta); /* a programmatic dependent */
}
