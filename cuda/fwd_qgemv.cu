/*
 * fwd_qgemv.cu — matrix products over weights in their GGUF block formats (akv/ops.h: Q8_0,
 * Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): the skinny product of decode, y[m][n] (+)= x[m][k] · W^T for
 * m <= AKV_FWD_QGEMV_MAX_ROWS; the widening of W to bf16 for products of more rows (which then
 * take cuBLAS); and the synthetic block fill.
 *
 * The skinny product is the host pass's 8-bit recipe (ref/qmatmul.c) on the GPU: a first
 * kernel quantizes x per 32 elements to int8 (amax / 127, one warp per block), then one warp
 * per output row, lane l taking the row's 32-element sub-blocks l, l + 32, ... (a warp covers a
 * contiguous stretch of the row). A sub-block's quants, unpacked to bytes with the format's
 * offset taken off, meet x's quants in two exact integer dot products of 16 (dp4a; Q6_K has a
 * scale per 16), scaled by the sub-block's scales and x's scale, plus the minimum times x's
 * scaled sum. Each lane keeps one f32 sum per x row and the warp adds its lanes with a fixed
 * butterfly: the same bits every run. Integer dots because they take 8 instructions a
 * sub-block where floats against bf16 x take 32 conversions and 32 multiply-adds; x quantized
 * by a kernel of its own because quantizing it inside every block of the product needs blocks
 * of many rows, too few for the GPU's multiprocessors on the 4096-row products (the
 * measurements: docs/journal.md, 2026-12-02).
 * The formats' decoding: qblock.cuh; the product of more rows over tensor cores: fwd_qmma.cu.
 */
#include <float.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "grid_dep.cuh"
#include "qblock.cuh"

namespace {

constexpr int kWarps = 8; /* rows per block */

/* Byte i of word w minus the offset, as a float, without an integer conversion: the byte
 * placed under the exponent of 2^23 (one byte permute) and 2^23 + o subtracted (one add), exact
 * for every byte. Q8_0's signed bytes come with their sign bit flipped (unpack_dot), so they
 * read as q + 128. */
template <int T> __device__ __forceinline__ float qf(uint32_t w, int i, float base) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)i)) - base;
}

/* 2^23 + the format's offset (+ 128 for Q8_0's flipped sign bit). */
template <int T> __device__ __forceinline__ float qbase(const qsub &s) {
    return 8388608.0f + (float)s.o + (T == AKV_OPS_W_Q8_0 ? 128.0f : 0.0f);
}

/* x quantized for the block products (qblock.cuh: qblock_quantize_x): the host recipe's scale
 * (amax / 127) over bf16 x (the host quantizes f32 x, so the two backends' quants may differ
 * by one). One warp per block. */
__global__ void quantize_x_kernel(const __nv_bfloat16 *__restrict__ x, int8_t *__restrict__ q,
                                  float *__restrict__ d, float *__restrict__ s, uint32_t n_blocks) {
    grid_dep_wait();
    const uint32_t lane = threadIdx.x % 32;
    for (uint32_t g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; g < n_blocks;
         g += gridDim.x * (blockDim.x / 32)) {
        const float v = __bfloat162float(x[(size_t)g * 32 + lane]);
        float amax = fabsf(v);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        /* as the host's akv_ops_quantize_rows_q8: a scale below the normal range (its inverse
         * would be infinite) quantizes to zeros, and every quant is rounded half away from
         * zero and clamped to +-127 (a non-finite element then converts defined) */
        const float dd = amax / 127.0f, id = dd >= FLT_MIN ? 1.0f / dd : 0.0f;
        const int qi = (int)fmaxf(-127.0f, fminf(127.0f, roundf(v * id)));
        int sum = qi;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        q[(size_t)g * 32 + lane] = (int8_t)qi;
        if (lane == 0) d[g] = dd, s[g] = dd * (float)sum;
    }
}

/* One output element per warp by the 8-bit recipe: per sub-block, two integer dot products
 * of 16 quants with 16 quantized x (dp4a, exact), scaled by the sub-block's two scales and
 * x's scale, plus the minimum term with x's scaled sum. */
template <int T, int M>
__global__ void __launch_bounds__(kWarps * 32)
    qgemv_kernel(float *__restrict__ y, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                 const float *__restrict__ xs, const uint8_t *__restrict__ w, uint32_t n,
                 uint32_t k, size_t row_bytes, int beta) {
    constexpr int sub = kSubs<T>;
    constexpr bool has_min = kHasMin<T>;
    const uint32_t lane = threadIdx.x % 32, row = blockIdx.x * kWarps + threadIdx.x / 32;
    grid_dep_wait();
    if (row >= n) return;
    const uint8_t *wr = w + (size_t)row * row_bytes;
    const uint32_t nb = k / 32;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; r++)
        acc[r] = 0.0f;
#pragma unroll 2
    for (uint32_t b = lane; b < nb; b += 32) {
        qsub sb;
        unpack<T>(wr + (size_t)(b / sub) * kBlockBytes<T>, (int)(b % sub), sb);
        uint32_t qw[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            qw[i] = qsigned<T>(sb.q[i], sb.o);
#pragma unroll
        for (int r = 0; r < M; r++) {
            const uint4 *xv = reinterpret_cast<const uint4 *>(xq + (size_t)r * k + (size_t)b * 32);
            const uint4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
            const int xw[8] = {(int)x0.x, (int)x0.y, (int)x0.z, (int)x0.w,
                               (int)x1.x, (int)x1.y, (int)x1.z, (int)x1.w};
            int v0 = 0, v1 = 0;
#pragma unroll
            for (int i = 0; i < 4; i++)
                v0 = __dp4a((int)qw[i], xw[i], v0);
#pragma unroll
            for (int i = 4; i < 8; i++)
                v1 = __dp4a((int)qw[i], xw[i], v1);
            const size_t bi = (size_t)r * nb + b;
            const float dx = __ldg(xd + bi);
            acc[r] = fmaf((float)v0, sb.ws0 * dx, acc[r]);
            acc[r] = fmaf((float)v1, sb.ws1 * dx, acc[r]);
            if (has_min) acc[r] = fmaf(sb.mw, __ldg(xs + bi), acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < M; r++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < M; r++) {
            float *out = y + (size_t)r * n + row;
            *out = beta ? *out + acc[r] : acc[r];
        }
    }
}

template <int T> __device__ __forceinline__ void unpack_dot(const uint8_t *blk, int j, qsub &s) {
    unpack<T>(blk, j, s);
    if (T == AKV_OPS_W_Q8_0)
#pragma unroll
        for (int i = 0; i < 8; i++)
            s.q[i] ^= 0x80808080u;
}

/* W widened to bf16: one thread per 32-element sub-block. A warp's 32 sub-blocks are 32
 * consecutive ones of W, so their 2 KiB of output are contiguous (a row of k elements holds its
 * k / 32 sub-blocks in order); each lane's 64 bytes go through shared memory and the warp
 * writes the 2 KiB as 16-byte pieces lane by lane. (Each lane storing its own 64 bytes, 64
 * bytes apart across the warp, kept L2 busy with partial writes: 146 us for the 6144 x 4096
 * Q4_K matrix, 6 % of the DRAM rate.) A lane's pieces sit in shared memory with their order
 * rotated by lane / 2, so that neither the lanes' stores nor the warp's reads share a bank. */
template <int T>
__global__ void __launch_bounds__(256)
    dequant_kernel(__nv_bfloat16 *__restrict__ dst, const uint8_t *__restrict__ w, uint32_t n,
                   uint32_t k, size_t row_bytes) {
    constexpr int sub = kSubs<T>;
    constexpr bool has_min = kHasMin<T>;
    __shared__ uint4 stage[8][32 * 4];
    grid_dep_wait();
    const uint32_t nb = k / 32, lane = threadIdx.x % 32;
    uint4 *st = stage[threadIdx.x / 32];
    const uint64_t total = (uint64_t)n * nb;
    for (uint64_t g0 = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) - lane; g0 < total;
         g0 += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t g = g0 + lane;
        if (g < total) {
            const uint32_t row = (uint32_t)(g / nb), b = (uint32_t)(g % nb);
            qsub s;
            unpack_dot<T>(w + (size_t)row * row_bytes + (size_t)(b / sub) * kBlockBytes<T>,
                          (int)(b % sub), s);
            const float base = qbase<T>(s);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                uint32_t v[4];
#pragma unroll
                for (int e2 = 0; e2 < 4; e2++) {
                    const int e = 8 * c + 2 * e2;
                    const float sc = e < 16 ? s.ws0 : s.ws1;
                    float lo = sc * qf<T>(s.q[e / 4], e % 4, base),
                          hi = sc * qf<T>(s.q[(e + 1) / 4], (e + 1) % 4, base);
                    if (has_min) lo += s.mw, hi += s.mw;
                    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
                    v[e2] = *reinterpret_cast<const uint32_t *>(&p);
                }
                st[lane * 4 + (c ^ ((lane / 2) & 3))] = make_uint4(v[0], v[1], v[2], v[3]);
            }
        }
        __syncwarp();
        /* piece q of the warp's output: lane q / 4's piece (q % 4) ^ rotation */
        uint4 *o = reinterpret_cast<uint4 *>(dst + g0 * 32);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t q = lane + 32 * i, l = q / 4;
            if (g0 + l < total) o[l * 4 + ((q % 4) ^ ((l / 2) & 3))] = st[q];
        }
        __syncwarp();
    }
}

/* akv_fwd_fill_byte (forward_ops.h), operation for operation. */
__device__ __forceinline__ uint8_t fill_byte(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint8_t)(z >> 56);
}

__global__ void fill_blocks_kernel(uint8_t *y, uint64_t n, uint64_t seed, uint32_t bb, int fa,
                                   int fb, uint32_t h0, uint32_t h1) {
    grid_dep_wait();
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const int o = (int)(i % bb);
        y[i] = o == fa                  ? (uint8_t)h0
               : o == fa + 1            ? (uint8_t)(h0 >> 8)
               : fb >= 0 && o == fb     ? (uint8_t)h1
               : fb >= 0 && o == fb + 1 ? (uint8_t)(h1 >> 8)
                                        : fill_byte(seed, i);
    }
}

template <int T>
akv_status qgemv_launch(uint64_t y, uint64_t x, uint64_t w, uint32_t m, uint32_t n, uint32_t k,
                        size_t row_bytes, int beta, uint64_t scratch, int n_sm,
                        cudaStream_t stream) {
    qblock_x xq;
    akv_status st = qblock_quantize_x(x, m, k, scratch, n_sm, stream, &xq);
    if (st) return st;
    const dim3 grid((n + kWarps - 1) / kWarps), block(kWarps * 32);
    float *py = reinterpret_cast<float *>(static_cast<uintptr_t>(y));
    const uint8_t *pw = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(w));
    void (*kern)(float *, const int8_t *, const float *, const float *, const uint8_t *, uint32_t,
                 uint32_t, size_t, int) = m == 1   ? qgemv_kernel<T, 1>
                                          : m == 2 ? qgemv_kernel<T, 2>
                                          : m == 3 ? qgemv_kernel<T, 3>
                                                   : qgemv_kernel<T, 4>;
    return grid_dep_launch_kernel(kern, grid, block, 0, stream, py, xq.q, xq.d, xq.s, pw, n, k,
                                  row_bytes, beta);
}

template <int T>
akv_status dequant_launch(uint64_t dst, uint64_t w, uint32_t n, uint32_t k, size_t row_bytes,
                          int n_sm, cudaStream_t stream) {
    const uint64_t subs = (uint64_t)n * (k / 32);
    const unsigned blocks =
        (unsigned)((subs + 255) / 256 < (uint64_t)n_sm * 16 ? (subs + 255) / 256
                                                            : (uint64_t)n_sm * 16);
    return grid_dep_launch_kernel(dequant_kernel<T>, dim3(blocks), dim3(256), 0, stream,
                                  reinterpret_cast<__nv_bfloat16 *>(static_cast<uintptr_t>(dst)),
                                  reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(w)), n,
                                  k, row_bytes);
}

} // namespace

akv_status qblock_quantize_x(uint64_t x, uint32_t m, uint32_t k, uint64_t scratch, int n_sm,
                             cudaStream_t stream, qblock_x *out) {
    int8_t *q = reinterpret_cast<int8_t *>(static_cast<uintptr_t>(scratch));
    float *d = reinterpret_cast<float *>(q + (size_t)m * k), *sum = d + (size_t)m * (k / 32);
    const uint32_t n_blocks = m * (k / 32);
    const unsigned blocks =
        (n_blocks + 7) / 8 < (unsigned)n_sm * 8 ? (n_blocks + 7) / 8 : (unsigned)n_sm * 8;
    *out = qblock_x{q, d, sum};
    return grid_dep_launch_kernel(
        quantize_x_kernel, dim3(blocks), dim3(256), 0, stream,
        reinterpret_cast<const __nv_bfloat16 *>(static_cast<uintptr_t>(x)), q, d, sum, n_blocks);
}

extern "C" akv_status akv__cuda_qgemv(uint64_t y, uint64_t x, uint64_t w, uint32_t w_type,
                                      uint32_t m, uint32_t n, uint32_t k, int beta,
                                      uint64_t scratch, uint64_t scratch_bytes, int n_sm,
                                      void *stream) {
    const size_t rb = qblock_row_bytes(w_type, m, n, k, y, x, w, scratch, scratch_bytes);
    if (!rb || m > AKV_FWD_QGEMV_MAX_ROWS) return AKV_EINVAL;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
#define QG_GEMV(T) qgemv_launch<T>(y, x, w, m, n, k, rb, beta, scratch, n_sm, s)
    QG_SWITCH(w_type, QG_GEMV)
#undef QG_GEMV
}

extern "C" akv_status akv__cuda_dequant_bf16(uint64_t dst, uint64_t w, uint32_t w_type, uint32_t n,
                                             uint32_t k, int n_sm, void *stream) {
    const size_t rb = akv_ops_wrow_bytes((akv_ops_wtype)w_type, k);
    if (n == 0 || !rb || k % 32 || w % 16 || dst % 16) return AKV_EINVAL;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
#define QG_DQ(T) dequant_launch<T>(dst, w, n, k, rb, n_sm, s)
    QG_SWITCH(w_type, QG_DQ)
#undef QG_DQ
}

extern "C" akv_status akv__cuda_fill_blocks(uint64_t y, uint64_t n, uint64_t seed, uint32_t w_type,
                                            uint32_t h0, uint32_t h1, int n_sm, void *stream) {
    const uint32_t bb = (uint32_t)akv_ops_wblock_bytes((akv_ops_wtype)w_type);
    if (!akv_ops_wtype_is_block((akv_ops_wtype)w_type) || !bb || n % bb) return AKV_EINVAL;
    if (n == 0) return AKV_OK;
    int fa, fb;
    akv_fwd_block_scales(w_type, &fa, &fb);
    const unsigned blocks =
        (unsigned)((n + 255) / 256 < (uint64_t)n_sm * 16 ? (n + 255) / 256 : (uint64_t)n_sm * 16);
    return grid_dep_launch_kernel(
        fill_blocks_kernel, dim3(blocks), dim3(256), 0, static_cast<cudaStream_t>(stream),
        reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(y)), n, seed, bb, fa, fb, h0, h1);
}
