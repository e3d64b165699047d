/*
 * fwd_qmma.cu — the block product of more rows: y[m][n] (+)= x[m][k] · W^T over W in a GGUF
 * block format (akv/ops.h) for any number of rows, on the integer tensor cores, W read from its
 * blocks (never widened).
 *
 * The recipe is the skinny product's (fwd_qgemv.cu): x quantized per 32 elements to int8
 * first (qblock.cuh), each 32-element sub-block of W decoded to signed bytes in registers, an
 * exact integer dot product per sub-block, scaled by the sub-block's scale and x's, plus the
 * minimum times x's scaled sum. Here the dots of 16 rows of W with 8 rows of x at once are one
 * mma.sync (m16n8k32, s8 x s8 -> s32; Q6_K, with a scale per 16 elements, takes two m16n8k16).
 *
 * A block of 8 warps owns 16 rows of W and 8 NT rows of x (NT = 1 or 2 tiles of 8) and
 * splits k among its warps: warp w takes the steps of 8 sub-blocks w, w + 8, ... (a K
 * super-block, 8 of the 32-element blocks). Per step the warp copies its 16 rows' bytes into
 * its part of shared memory with coalesced loads (16-byte pieces where the rows allow, else 4
 * or 2), then each lane reads its fragment there (rows g and g + 8 of the tile, elements
 * 4 t .. 4 t + 3 and 16 + 4 t .. of each sub-block, for lane 4 g + t; the row pitch puts the 8
 * rows of a read on distinct banks). Each lane keeps f32 sums for its fragment's four (row of W,
 * row of x) pairs per x tile; the 8 warps' sums meet in shared memory and are added in warp order:
 * the same bits every run. Blocks of the same W rows and different x tiles are neighbours in launch
 * order (x tiles are grid.x), so W comes from DRAM once and from L2 after.
 *
 * Why staged: the fragment layout puts 8 rows of W in every warp load, so lanes loading their
 * fragments from global memory themselves touched 8 cache lines per 128 bytes and ran at the
 * L1's limit. What limits it now: each 16 rows of W read x again, and a warp computes only
 * after its stage lands (docs/forward.md).
 */
#include <type_traits>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "grid_dep.cuh"
#include "qblock.cuh"

namespace {

constexpr int kRows = 16; /* rows of W per block: the tensor-core tile's m */
constexpr int kSplit = 8; /* warps per block, each a share of k */
constexpr int kStep = 8;  /* sub-blocks a warp takes per step: a K super-block, 8 Q8_0 blocks */

/* Loads from the warp's stage (shared memory): 2 and 4 bytes, and two 2-byte halves as a word. */
__device__ __forceinline__ uint32_t sh16(const uint8_t *p) {
    return *reinterpret_cast<const uint16_t *>(p);
}
__device__ __forceinline__ uint32_t sh32(const uint8_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}
__device__ __forceinline__ uint32_t sh16x2(const uint8_t *p) {
    return sh16(p) | sh16(p + 2) << 16;
}

/* Of sub-block j of the block at blk: the signed quants of elements 4 t .. 4 t + 3 (lo) and
 * 16 + 4 t .. 16 + 4 t + 3 (hi), the words lane 4 g + t holds of a row of the tensor cores'
 * A tile; the sub-block's scales (of elements 0-15 and 16-31) and minimum term as unpack's
 * (qblock.cuh). */
template <int T>
__device__ __forceinline__ void qfrag(const uint8_t *blk, int j, uint32_t t, uint32_t &lo,
                                      uint32_t &hi, float &ws0, float &ws1, float &mw) {
    mw = 0.0f;
    if constexpr (T == AKV_OPS_W_Q8_0) {
        ws0 = ws1 = f16(sh16(blk));
        lo = sh16x2(blk + 2 + 4 * t), hi = sh16x2(blk + 18 + 4 * t);
    } else if constexpr (T == AKV_OPS_W_Q4_0) {
        ws0 = ws1 = f16(sh16(blk));
        const uint32_t q = sh16x2(blk + 2 + 4 * t);
        lo = __vsub4(q & 0x0F0F0F0Fu, 0x08080808u),
        hi = __vsub4((q >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    } else if constexpr (T == AKV_OPS_W_Q4_1) {
        const uint32_t dm = sh32(blk), q = sh32(blk + 4 + 4 * t);
        ws0 = ws1 = f16(dm & 0xffff), mw = f16(dm >> 16);
        lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    } else if constexpr (T == AKV_OPS_W_Q4_K || T == AKV_OPS_W_Q5_K) {
        const uint32_t dm = sh32(blk), sc3[3] = {sh32(blk + 4), sh32(blk + 8), sh32(blk + 12)};
        int sc, mn;
        k_scale_min(sc3, j, &sc, &mn);
        ws0 = ws1 = f16(dm & 0xffff) * (float)sc;
        mw = -(f16(dm >> 16) * (float)mn);
        const uint8_t *qs = blk + 16 + (T == AKV_OPS_W_Q5_K ? 32 : 0) + 32 * (j / 2);
        const int sh = 4 * (j & 1);
        lo = (sh32(qs + 4 * t) >> sh) & 0x0F0F0F0Fu,
        hi = (sh32(qs + 16 + 4 * t) >> sh) & 0x0F0F0F0Fu;
        if constexpr (T == AKV_OPS_W_Q5_K) {
            lo |= ((sh32(blk + 16 + 4 * t) >> j) & 0x01010101u) << 4;
            hi |= ((sh32(blk + 32 + 4 * t) >> j) & 0x01010101u) << 4;
        }
    } else { /* Q6_K */
        const int h = j / 4, u = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (u & 1), *qh = blk + 128 + 32 * h;
        const uint32_t scw = sh16(blk + 192 + 8 * h + 2 * u);
        const float d = f16(sh16(blk + 208));
        ws0 = d * (float)(int8_t)(scw & 255), ws1 = d * (float)(int8_t)(scw >> 8);
        const auto q6 = [&](int o) {
            return __vsub4(((sh16x2(ql + o) >> (u >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) |
                               (((sh16x2(qh + o) >> (2 * u)) & 0x03030303u) << 4),
                           0x20202020u);
        };
        lo = q6(4 * (int)t), hi = q6(16 + 4 * (int)t);
    }
}

/* Bytes of the step of kStep sub-blocks a warp stages per row (a K super-block, 8 of the
 * 32-element blocks). */
template <int T> constexpr int kStepBytes = kSubs<T> == 8 ? kBlockBytes<T> : 8 * kBlockBytes<T>;
/* A staged row's stride: the step's bytes rounded up to 16, and 16 more where that is an even
 * number of 16-byte pieces, so that the 8 rows a fragment load touches (lanes 4 g + t read word
 * t of row g) fall on 8 distinct groups of 4 banks. */
template <int T>
constexpr int kStagePitch = (kStepBytes<T> + 15) / 16 % 2 ? (kStepBytes<T> + 15) / 16 * 16
                                                          : (kStepBytes<T> + 15) / 16 * 16 + 16;

/* The shared memory of a block: each warp's step of 16 rows of W during the loop, the warps'
 * sums ([warp][row of x][row of W]) after it. */
template <int T, int NT> union qmma_smem {
    uint8_t stage[kSplit][kRows][kStagePitch<T>];
    float sum[kSplit][NT * 8][kRows + 1];
};

/* Stages `bytes` of each of the 16 rows at w + row * row_bytes + off (row0 + r, the last row
 * standing in past n) into st, in pieces of P bytes (P divides the row's start and bytes), the
 * warp's lanes taking consecutive pieces: a warp load reads contiguous bytes of one or two
 * rows. */
template <int P>
__device__ __forceinline__ void stage_rows(uint8_t *st, int pitch, const uint8_t *w, uint32_t row0,
                                           uint32_t n, size_t row_bytes, size_t off, uint32_t bytes,
                                           uint32_t lane) {
    using piece = typename std::conditional<
        P == 16, uint4, typename std::conditional<P == 4, uint32_t, uint16_t>::type>::type;
    const uint32_t per_row = bytes / P;
    for (uint32_t q = lane; q < kRows * per_row; q += 32) {
        const uint32_t r = q / per_row, o = (q % per_row) * P;
        const uint32_t row = row0 + r < n ? row0 + r : n - 1;
        *reinterpret_cast<piece *>(st + r * pitch + o) =
            __ldg(reinterpret_cast<const piece *>(w + (size_t)row * row_bytes + off + o));
    }
}

__device__ __forceinline__ void mma_k32(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

/* One sub-block's fragment of A (rows g and g + 8 of the tile) and its scales. */
struct qmma_a {
    uint32_t a[4];
    float w0, w8, v0, v8, m0, m8; /* scales of elements 0-15 (w) and 16-31 (v), minimum terms */
};

/* Sub-block i of the step staged at sa (row g), sb (row g + 8) into f. */
template <int T>
__device__ __forceinline__ void qmma_load(const uint8_t *sa, const uint8_t *sb, uint32_t i,
                                          uint32_t t, qmma_a &f) {
    constexpr int sub = kSubs<T>;
    const uint32_t o = (i / sub) * kBlockBytes<T>;
    qfrag<T>(sa + o, (int)(i % sub), t, f.a[0], f.a[2], f.w0, f.v0, f.m0);
    qfrag<T>(sb + o, (int)(i % sub), t, f.a[1], f.a[3], f.w8, f.v8, f.m8);
}

/* The dots of sub-block bb of 16 rows of W (fragment f) with x's tiles, scaled into acc. */
template <int T, int NT>
__device__ __forceinline__ void
qmma_dot(const qmma_a &f, const int8_t *__restrict__ xq, const float *__restrict__ xd,
         const float *__restrict__ xs, const uint32_t xb[NT], const uint32_t xc[NT][2], uint32_t k,
         uint32_t nb, uint32_t bb, uint32_t t, float acc[NT][4]) {
    constexpr bool has_min = kHasMin<T>, per16 = T == AKV_OPS_W_Q6_K;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint8_t *xp =
            reinterpret_cast<const uint8_t *>(xq + (size_t)xb[j] * k + (size_t)bb * 32);
        const uint32_t b0 = ld32(xp + 4 * t), b1 = ld32(xp + 16 + 4 * t);
        const float d0 = __ldg(xd + (size_t)xc[j][0] * nb + bb),
                    d1 = __ldg(xd + (size_t)xc[j][1] * nb + bb);
        int c[4] = {0, 0, 0, 0};
        if (per16) {
            int e[4] = {0, 0, 0, 0};
            mma_k16(c, f.a[0], f.a[1], b0);
            mma_k16(e, f.a[2], f.a[3], b1);
            acc[j][0] = fmaf((float)e[0], f.v0 * d0, fmaf((float)c[0], f.w0 * d0, acc[j][0]));
            acc[j][1] = fmaf((float)e[1], f.v0 * d1, fmaf((float)c[1], f.w0 * d1, acc[j][1]));
            acc[j][2] = fmaf((float)e[2], f.v8 * d0, fmaf((float)c[2], f.w8 * d0, acc[j][2]));
            acc[j][3] = fmaf((float)e[3], f.v8 * d1, fmaf((float)c[3], f.w8 * d1, acc[j][3]));
        } else {
            mma_k32(c, f.a, b0, b1);
            acc[j][0] = fmaf((float)c[0], f.w0 * d0, acc[j][0]);
            acc[j][1] = fmaf((float)c[1], f.w0 * d1, acc[j][1]);
            acc[j][2] = fmaf((float)c[2], f.w8 * d0, acc[j][2]);
            acc[j][3] = fmaf((float)c[3], f.w8 * d1, acc[j][3]);
        }
        if (has_min) {
            const float s0 = __ldg(xs + (size_t)xc[j][0] * nb + bb),
                        s1 = __ldg(xs + (size_t)xc[j][1] * nb + bb);
            acc[j][0] = fmaf(f.m0, s0, acc[j][0]);
            acc[j][1] = fmaf(f.m0, s1, acc[j][1]);
            acc[j][2] = fmaf(f.m8, s0, acc[j][2]);
            acc[j][3] = fmaf(f.m8, s1, acc[j][3]);
        }
    }
}

template <int T, int NT, int P>
__global__ void __launch_bounds__(kSplit * 32)
    qmma_kernel(float *__restrict__ y, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                const float *__restrict__ xs, const uint8_t *__restrict__ w, uint32_t m, uint32_t n,
                uint32_t k, size_t row_bytes, int beta) {
    constexpr int pitch = kStagePitch<T>, step = kStepBytes<T>;
    __shared__ __align__(16) qmma_smem<T, NT> sm;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t row0 = blockIdx.y * kRows, x0 = blockIdx.x * NT * 8, nb = k / 32;
    uint8_t *st = sm.stage[warp][0];
    const uint8_t *sa = st + g * pitch, *sb = st + (g + 8) * pitch;
    /* this lane's rows of x: the B fragment's (8 j + g) and the sums' (8 j + 2 t, + 1), the
     * last row standing in past m */
    uint32_t xb[NT], xc[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint32_t r = x0 + 8 * j;
        xb[j] = r + g < m ? r + g : m - 1;
        xc[j][0] = r + 2 * t < m ? r + 2 * t : m - 1;
        xc[j][1] = r + 2 * t + 1 < m ? r + 2 * t + 1 : m - 1;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    grid_dep_wait();
    /* steps of kStep sub-blocks: the warp stages its 16 rows' step, then takes the dots */
    for (uint32_t s = warp; s * kStep < nb; s += kSplit) {
        const uint32_t b0 = s * kStep, n_sub = nb - b0 < kStep ? nb - b0 : kStep;
        const auto dots = [&](uint32_t i) { /* sub-block i of the staged step */
                                            qmma_a f;
                                            qmma_load<T>(sa, sb, i, t, f);
                                            qmma_dot<T, NT>(f, xq, xd, xs, xb, xc, k, nb, b0 + i, t,
                                                            acc);
        };
        if (kSubs<T> == 8 || n_sub == kStep) { /* the K formats' rows are whole steps */
            stage_rows<P>(st, pitch, w, row0, n, row_bytes, (size_t)s * step, step, lane);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < kStep; i++)
                dots(i);
        } else if constexpr (kSubs<T> == 1) { /* the last blocks of a row of 32-element blocks */
            stage_rows<2>(st, pitch, w, row0, n, row_bytes, (size_t)s * step,
                          n_sub * kBlockBytes<T>, lane);
            __syncwarp();
#pragma unroll 1
            for (uint32_t i = 0; i < n_sub; i++)
                dots(i);
        }
        __syncwarp();
    }
    __syncthreads(); /* every warp is past its stage: the sums take its room */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        sm.sum[warp][8 * j + 2 * t][g] = acc[j][0];
        sm.sum[warp][8 * j + 2 * t + 1][g] = acc[j][1];
        sm.sum[warp][8 * j + 2 * t][g + 8] = acc[j][2];
        sm.sum[warp][8 * j + 2 * t + 1][g + 8] = acc[j][3];
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < NT * 8 * kRows; i += kSplit * 32) {
        const uint32_t xr = i / kRows, wrow = i % kRows;
        if (x0 + xr >= m || row0 + wrow >= n) continue;
        float v = sm.sum[0][xr][wrow];
#pragma unroll
        for (int ww = 1; ww < kSplit; ww++)
            v += sm.sum[ww][xr][wrow];
        float *out = y + (size_t)(x0 + xr) * n + row0 + wrow;
        *out = beta ? *out + v : v;
    }
}

template <int T, int NT>
akv_status qmma_launch_nt(dim3 grid, cudaStream_t stream, float *y, const qblock_x &xq,
                          const uint8_t *w, uint32_t m, uint32_t n, uint32_t k, size_t row_bytes,
                          int beta) {
    /* the widest piece that every full step's start and length allow (W is 16-byte aligned; a
     * row's last, shorter step of 32-element blocks is staged in 2-byte pieces; piece sizes the
     * step's bytes rule out are not built) */
    constexpr uint32_t step = kStepBytes<T>;
    void (*kern)(float *, const int8_t *, const float *, const float *, const uint8_t *, uint32_t,
                 uint32_t, uint32_t, size_t, int) = qmma_kernel<T, NT, 2>;
    if constexpr (step % 4 == 0)
        if (row_bytes % 4 == 0) kern = qmma_kernel<T, NT, 4>;
    if constexpr (step % 16 == 0)
        if (row_bytes % 16 == 0) kern = qmma_kernel<T, NT, 16>;
    return grid_dep_launch_kernel(kern, grid, dim3(kSplit * 32), 0, stream, y, xq.q, xq.d, xq.s, w,
                                  m, n, k, row_bytes, beta);
}

template <int T>
akv_status qmma_launch(uint64_t y, uint64_t x, uint64_t w, uint32_t m, uint32_t n, uint32_t k,
                       size_t row_bytes, int beta, uint64_t scratch, int n_sm,
                       cudaStream_t stream) {
    qblock_x xq;
    akv_status st = qblock_quantize_x(x, m, k, scratch, n_sm, stream, &xq);
    if (st) return st;
    /* x tiles of 8 rows for m <= 8, else of 16 (tiles of 32 and 64 rows measured no faster than
     * as many tiles of 16: docs/journal.md, 2026-12-03) */
    const int nt = m <= 8 ? 1 : 2;
    const dim3 grid((m + 8 * nt - 1) / (8 * nt), (n + kRows - 1) / kRows);
    float *py = reinterpret_cast<float *>(static_cast<uintptr_t>(y));
    const uint8_t *pw = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(w));
    return nt == 1 ? qmma_launch_nt<T, 1>(grid, stream, py, xq, pw, m, n, k, row_bytes, beta)
                   : qmma_launch_nt<T, 2>(grid, stream, py, xq, pw, m, n, k, row_bytes, beta);
}

} // namespace

extern "C" akv_status akv__cuda_qmma(uint64_t y, uint64_t x, uint64_t w, uint32_t w_type,
                                     uint32_t m, uint32_t n, uint32_t k, int beta, uint64_t scratch,
                                     uint64_t scratch_bytes, int n_sm, void *stream) {
    const size_t rb = qblock_row_bytes(w_type, m, n, k, y, x, w, scratch, scratch_bytes);
    if (!rb || (n + kRows - 1) / kRows > 65535) return AKV_EINVAL;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
#define QG_MMA(T) qmma_launch<T>(y, x, w, m, n, k, rb, beta, scratch, n_sm, s)
    QG_SWITCH(w_type, QG_MMA)
#undef QG_MMA
}
