/*
 * cuda/qblock.cuh — the GGUF block formats (akv/ops.h: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)
 * decoded in registers, shared by the block products (fwd_qgemv.cu: one warp per output row;
 * fwd_qmma.cu: integer tensor-core tiles): a 32-element sub-block's quants as bytes with its
 * scales and minimum, and x quantized per 32 elements to int8 for the integer dots.
 *
 * Loads: Q4_K and Q5_K blocks are 16-byte multiples (144, 176 bytes) and read in 16-byte
 * pieces; Q4_1 (20) in 4-byte pieces; Q8_0, Q4_0 and Q6_K (34, 18, 210) in 2-byte pieces.
 */
#ifndef AKV_CUDA_QBLOCK_CUH
#define AKV_CUDA_QBLOCK_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "akv/forward_ops.h"
#include "akv/ops.h"

namespace {

struct qsub {
    uint32_t q[8];  /* the 32 quant values, one byte each (Q8_0: int8) */
    float ws0, ws1; /* scale of elements 0-15, 16-31 */
    float mw;       /* minimum term (0 without) */
    int o;          /* offset subtracted from q */
};

__device__ __forceinline__ uint32_t ld16(const uint8_t *p) { /* 2-byte aligned */
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { /* 4-byte aligned */
    return __ldg(reinterpret_cast<const unsigned int *>(p));
}
__device__ __forceinline__ uint4 ld128(const uint8_t *p) { /* 16-byte aligned */
    return __ldg(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ float f16(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}
/* 16 bytes from 2-byte aligned p into 4 words */
__device__ __forceinline__ void ld16x8(const uint8_t *p, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = ld16(p + 4 * i) | ld16(p + 4 * i + 2) << 16;
}

/* 32-element sub-blocks per block (the K formats' 256-element super-blocks hold 8), and whether
 * the format has a minimum term. */
template <int T>
constexpr int kSubs = T == AKV_OPS_W_Q4_K || T == AKV_OPS_W_Q5_K || T == AKV_OPS_W_Q6_K ? 8 : 1;
template <int T>
constexpr bool kHasMin = T == AKV_OPS_W_Q4_1 || T == AKV_OPS_W_Q4_K || T == AKV_OPS_W_Q5_K;
/* Bytes of a format's block (akv_ops_wblock_bytes, as a constant of the kernel). */
template <int T>
constexpr int kBlockBytes = T == AKV_OPS_W_Q8_0   ? 34
                            : T == AKV_OPS_W_Q4_0 ? 18
                            : T == AKV_OPS_W_Q4_1 ? 20
                            : T == AKV_OPS_W_Q4_K ? 144
                            : T == AKV_OPS_W_Q5_K ? 176
                                                  : 210;

/* The 6-bit scale and min of K-format sub-block j from the 12 packed bytes s[3]. */
__device__ __forceinline__ void k_scale_min(const uint32_t s[3], int j, int *sc, int *mn) {
    /* byte i of the 12, chosen by selects (a runtime index into s would put it in local memory) */
    const auto b = [&](int i) {
        const uint32_t wd = i < 4 ? s[0] : i < 8 ? s[1] : s[2];
        return (int)((wd >> (8 * (i & 3))) & 255);
    };
    if (j < 4) {
        *sc = b(j) & 63, *mn = b(j + 4) & 63;
    } else {
        *sc = (b(j + 4) & 15) | ((b(j - 4) >> 6) << 4);
        *mn = (b(j + 4) >> 4) | ((b(j) >> 6) << 4);
    }
}

/* Sub-block j of the block at blk (j < 8 for the K formats, 0 otherwise). */
template <int T> __device__ __forceinline__ void unpack(const uint8_t *blk, int j, qsub &s) {
    s.mw = 0.0f, s.o = 0;
    if constexpr (T == AKV_OPS_W_Q8_0) {
        s.ws0 = s.ws1 = f16(ld16(blk));
        ld16x8(blk + 2, s.q), ld16x8(blk + 18, s.q + 4);
    } else if constexpr (T == AKV_OPS_W_Q4_0 || T == AKV_OPS_W_Q4_1) {
        uint32_t n[4];
        if constexpr (T == AKV_OPS_W_Q4_1) {
            const uint32_t dm = ld32(blk);
            s.ws0 = s.ws1 = f16(dm & 0xffff), s.mw = f16(dm >> 16);
#pragma unroll
            for (int i = 0; i < 4; i++)
                n[i] = ld32(blk + 4 + 4 * i);
        } else {
            s.ws0 = s.ws1 = f16(ld16(blk)), s.o = 8;
            ld16x8(blk + 2, n);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            s.q[i] = n[i] & 0x0F0F0F0Fu, s.q[i + 4] = (n[i] >> 4) & 0x0F0F0F0Fu;
    } else if constexpr (T == AKV_OPS_W_Q4_K || T == AKV_OPS_W_Q5_K) {
        const uint32_t dm = ld32(blk), sc3[3] = {ld32(blk + 4), ld32(blk + 8), ld32(blk + 12)};
        int sc, mn;
        k_scale_min(sc3, j, &sc, &mn);
        s.ws0 = s.ws1 = f16(dm & 0xffff) * (float)sc;
        s.mw = -(f16(dm >> 16) * (float)mn);
        const uint8_t *qs = blk + 16 + (T == AKV_OPS_W_Q5_K ? 32 : 0) + 32 * (j / 2);
        const uint4 a = ld128(qs), b = ld128(qs + 16);
        const uint32_t v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s.q[i] = (v[i] >> sh) & 0x0F0F0F0Fu;
        if constexpr (T == AKV_OPS_W_Q5_K) {
            const uint4 c = ld128(blk + 16), d = ld128(blk + 32);
            const uint32_t h[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                s.q[i] |= ((h[i] >> j) & 0x01010101u) << 4;
        }
    } else { /* Q6_K */
        const int h = j / 4, u = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (u & 1), *qh = blk + 128 + 32 * h;
        const uint32_t scw = ld16(blk + 192 + 8 * h + 2 * u);
        const float d = f16(ld16(blk + 208));
        s.ws0 = d * (float)(int8_t)(scw & 255), s.ws1 = d * (float)(int8_t)(scw >> 8), s.o = 32;
        uint32_t l[8], hh[8];
        ld16x8(ql, l), ld16x8(ql + 16, l + 4), ld16x8(qh, hh), ld16x8(qh + 16, hh + 4);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s.q[i] = ((l[i] >> (u >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) |
                     (((hh[i] >> (2 * u)) & 0x03030303u) << 4);
    }
}

/* The quants of a sub-block as signed bytes: the offset taken off each byte (Q4_0: 8, Q6_K:
 * 32; the others' quants are below 128 or signed already). */
template <int T> __device__ __forceinline__ uint32_t qsigned(uint32_t w, int o) {
    return T == AKV_OPS_W_Q4_0 || T == AKV_OPS_W_Q6_K ? __vsub4(w, 0x01010101u * (uint32_t)o) : w;
}

} // namespace

/* x[m][k] (bf16) quantized into scratch for the block products: row r's 32-element block b as
 * int8 at q[r * k + 32 b], its scale d and d * (the sum of its quants) at [r * (k / 32) + b]
 * of the two f32 arrays after the quants (akv_fwd_qgemv_scratch_bytes(m, k) in all). Launched
 * on `stream` (fwd_qgemv.cu). */
struct qblock_x {
    const int8_t *q;
    const float *d, *s;
};
akv_status qblock_quantize_x(uint64_t x, uint32_t m, uint32_t k, uint64_t scratch, int n_sm,
                             cudaStream_t stream, qblock_x *out);

/* The bytes of a row of W for a block product y[m][n] (+)= x[m][k] W^T, or 0 where the
 * product cannot take its arguments: a k that is no whole number of the type's blocks, m or n
 * of 0, x, W or scratch not 16-byte aligned, y not 4-byte aligned, or less scratch than x's
 * quantization needs (QG_SWITCH refuses a type that is no block format). */
static inline size_t qblock_row_bytes(uint32_t w_type, uint32_t m, uint32_t n, uint32_t k,
                                      uint64_t y, uint64_t x, uint64_t w, uint64_t scratch,
                                      uint64_t scratch_bytes) {
    const size_t rb = akv_ops_wrow_bytes((akv_ops_wtype)w_type, k);
    const bool ok = rb && m && n && k % 32 == 0 && x % 16 == 0 && y % 4 == 0 && w % 16 == 0 &&
                    scratch % 16 == 0 && scratch_bytes >= akv_fwd_qgemv_scratch_bytes(m, k);
    return ok ? rb : 0;
}

// clang-format off
#define QG_SWITCH(t, CALL)                                                                         \
    switch (t) {                                                                                   \
    case AKV_OPS_W_Q8_0: return CALL(AKV_OPS_W_Q8_0);                                              \
    case AKV_OPS_W_Q4_0: return CALL(AKV_OPS_W_Q4_0);                                              \
    case AKV_OPS_W_Q4_1: return CALL(AKV_OPS_W_Q4_1);                                              \
    case AKV_OPS_W_Q4_K: return CALL(AKV_OPS_W_Q4_K);                                              \
    case AKV_OPS_W_Q5_K: return CALL(AKV_OPS_W_Q5_K);                                              \
    case AKV_OPS_W_Q6_K: return CALL(AKV_OPS_W_Q6_K);                                              \
    default: return AKV_EINVAL;                                                                    \
    }
// clang-format on

#endif
