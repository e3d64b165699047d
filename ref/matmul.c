/* matmul.c — matrix products of akv/ops.h: OpenBLAS, and the plain-C oracle. */
#include "akv/ops.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>

#include <cblas.h>

#include "lanes.h"
#include "core/assert.h"

/* OpenBLAS's own entry point (not in every cblas.h). */
void openblas_set_num_threads(int num_threads);

void akv_ops_ref_matmul(float *y, const float *x, const float *w, const float *bias, size_t m,
                        size_t n, size_t k) {
    AKV_ASSERT(m >= 1 && n >= 1 && k >= 1);
    AKV_ASSERT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX); /* BLAS counts are int */
    if (m == 1) {
        /* y[n] = W[n][k] x[k] (+ bias): the decode step's matrix-vector path. */
        /* y is set even with beta = 0: some OpenBLAS versions scale it, and 0 * NaN is NaN. */
        for (size_t j = 0; j < n; j++)
            y[j] = bias ? bias[j] : 0.0f;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)k, x, 1,
                    bias ? 1.0f : 0.0f, y, 1);
        return;
    }
    if (bias)
        for (size_t r = 0; r < m; r++)
            for (size_t j = 0; j < n; j++)
                y[r * n + j] = bias[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
                (int)k, bias ? 1.0f : 0.0f, y, (int)n);
}

void akv_ops_ref_matmul_plain(float *y, const float *x, const float *w, const float *bias, size_t m,
                              size_t n, size_t k) {
    for (size_t r = 0; r < m; r++) {
        const float *xr = x + r * k;
        for (size_t j = 0; j < n; j++) {
            const float *wj = w + j * k;
            float acc = 0;
            for (size_t i = 0; i < k; i++)
                acc += xr[i] * wj[i];
            y[r * n + j] = acc + (bias ? bias[j] : 0.0f);
        }
    }
}

void akv_ops_ref_set_threads(int n_threads) {
    AKV_ASSERT(n_threads >= 1);
    openblas_set_num_threads(n_threads);
}

/* ---- the row-invariant product (akv_ops_matmul_cols) --------------------------------------
 * Every y[r][j] is dot(x[r], W[j]) by ONE recipe: 8 lanes, lane i accumulating the products
 * of k = i, i+8, i+16, ... in ascending order with one fused multiply-add each (the last,
 * partial step zero-padded), the lanes summed as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then
 * + bias[j]. Tiles of R rows x C columns only decide how many such recipes run side by side
 * (their accumulators are independent registers), so neither the tile shape, nor m, nor the
 * column range, nor the thread that runs it changes a bit of any element. The AVX2 path and
 * the portable path execute the same IEEE operations (fmaf is a correctly rounded fused
 * multiply-add, as vfmadd is), so they agree bit for bit too. */

enum {
    MM_LANES = AKV_LANES,
    MM_BLOCK_BYTES = 192 << 10, /* W rows kept hot while every row group passes over them */
};


/* One element by the recipe, in portable C. */
static float mm_dot_portable(const float *x, const float *w, size_t k) {
    float l[MM_LANES] = {0};
    for (size_t i = 0; i < k; i += MM_LANES)
        for (size_t e = 0; e < MM_LANES; e++) {
            float a = i + e < k ? x[i + e] : 0.0f, b = i + e < k ? w[i + e] : 0.0f;
            l[e] = fmaf(a, b, l[e]);
        }
    return akv__lanes_sum(l);
}

static void mm_cols_portable(float *y, const float *x, const float *w, const float *bias, size_t m,
                             size_t n, size_t k, size_t j0, size_t j1) {
    for (size_t r = 0; r < m; r++)
        for (size_t j = j0; j < j1; j++) {
            float s = mm_dot_portable(x + r * k, w + j * k, k);
            y[r * n + j] = bias ? s + bias[j] : s;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MM_AVX2 __attribute__((target("avx2,fma")))
#define MM_INLINE inline __attribute__((always_inline))
#define MM_UNROLL _Pragma("GCC unroll 8")


/* One step of 8 k-values of an R x C tile: acc[r][c] += x[r][i..i+8) * w[c][i..i+8) lane by
 * lane. part: the partial last step (masked lanes load 0, and fma(0, 0, a) = a). The side with
 * fewer vectors is held in registers, the other streamed: R*C accumulators + min(R, C) + 1
 * vectors fit the 16 registers for every tile shape used below. */
static MM_AVX2 MM_INLINE void mm_step_avx2(int R, int C, bool part, const float *x,
                                           const float *w, size_t k, size_t i, __m256i tail,
                                           __m256 acc[4][8]) {
#define MM_LOAD(p) (part ? _mm256_maskload_ps((p), tail) : _mm256_loadu_ps(p))
    if (R <= C) {
        __m256 xv[4];
        MM_UNROLL
        for (int r = 0; r < R; r++)
            xv[r] = MM_LOAD(x + r * k + i);
        MM_UNROLL
        for (int c = 0; c < C; c++) {
            __m256 wv = MM_LOAD(w + c * k + i);
            MM_UNROLL
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    } else {
        __m256 wv[8];
        MM_UNROLL
        for (int c = 0; c < C; c++)
            wv[c] = MM_LOAD(w + c * k + i);
        MM_UNROLL
        for (int r = 0; r < R; r++) {
            __m256 xv = MM_LOAD(x + r * k + i);
            MM_UNROLL
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
#undef MM_LOAD
}

/* R rows x C columns: y[r][c] for x rows at x + r*k, W rows at w + c*k. */
static MM_AVX2 MM_INLINE void mm_tile_avx2(int R, int C, const float *x, const float *w, size_t k,
                                           float *y, size_t ldy, const float *bias,
                                           __m256i tail) {
    __m256 acc[4][8];
    MM_UNROLL
    for (int r = 0; r < R; r++)
        MM_UNROLL
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    size_t k8 = k / MM_LANES * MM_LANES;
    /* the next tile's W rows are fetched while this one computes: with few rows a tile has
     * few streams, and one core's DRAM bandwidth wants more in flight (no effect on the bits) */
    const uintptr_t next = (uintptr_t)(w + (size_t)C * k);
    for (size_t i = 0; i < k8; i += MM_LANES) {
        if (i % 16 == 0)
            MM_UNROLL
            for (int c = 0; c < C; c++)
                __builtin_prefetch((const void *)(next + ((size_t)c * k + i) * sizeof(float)));
        mm_step_avx2(R, C, false, x, w, k, i, tail, acc);
    }
    if (k8 < k) mm_step_avx2(R, C, true, x, w, k, k8, tail, acc);
    MM_UNROLL
    for (int r = 0; r < R; r++)
        MM_UNROLL
        for (int c = 0; c < C; c++) {
            float s = akv__lanes_sum_avx2(acc[r][c]);
            y[r * ldy + c] = bias ? s + bias[c] : s;
        }
}

#define MM_TILE(R, C)                                                                          \
    static MM_AVX2 void mm_tile_##R##x##C(const float *x, const float *w, size_t k, float *y,  \
                                          size_t ldy, const float *bias, __m256i tail) {      \
        mm_tile_avx2(R, C, x, w, k, y, ldy, bias, tail);                                       \
    }
MM_TILE(1, 8)
MM_TILE(2, 4)
MM_TILE(3, 4)
MM_TILE(4, 3)
MM_TILE(1, 1)
MM_TILE(2, 1)
MM_TILE(3, 1)
MM_TILE(4, 1)

typedef void (*mm_tile_fn)(const float *, const float *, size_t, float *, size_t, const float *,
                           __m256i);

static MM_AVX2 void mm_cols_avx2(float *y, const float *x, const float *w, const float *bias,
                                 size_t m, size_t n, size_t k, size_t j0, size_t j1) {
    static const mm_tile_fn wide[5] = {NULL, mm_tile_1x8, mm_tile_2x4, mm_tile_3x4, mm_tile_4x3};
    static const mm_tile_fn one[5] = {NULL, mm_tile_1x1, mm_tile_2x1, mm_tile_3x1, mm_tile_4x1};
    static const int width[5] = {0, 8, 4, 4, 3};
    int32_t lanes[MM_LANES];
    for (int e = 0; e < MM_LANES; e++)
        lanes[e] = (size_t)e < k % MM_LANES ? -1 : 0;
    __m256i tail = _mm256_loadu_si256((const __m256i *)lanes);
    size_t jb_n = MM_BLOCK_BYTES / (k * sizeof(float));
    jb_n = jb_n < 24 ? 24 : jb_n / 24 * 24;
    for (size_t jb = j0; jb < j1; jb += jb_n) {
        size_t je = j1 - jb < jb_n ? j1 : jb + jb_n;
        for (size_t r = 0; r < m; r += 4) {
            int R = m - r < 4 ? (int)(m - r) : 4, C = width[R];
            size_t j = jb;
            for (; j + (size_t)C <= je; j += (size_t)C)
                wide[R](x + r * k, w + j * k, k, y + r * n + j, n, bias ? bias + j : NULL, tail);
            for (; j < je; j++)
                one[R](x + r * k, w + j * k, k, y + r * n + j, n, bias ? bias + j : NULL, tail);
        }
    }
}

static bool mm_have_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static bool mm_have_vnni(void) {
    return mm_have_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#else
static bool mm_have_avx2(void) {
    return false;
}
static bool mm_have_vnni(void) {
    return false;
}
#endif

akv_ops_isa akv_ops_isa_resolve(akv_ops_isa isa) {
    if (isa == AKV_OPS_ISA_AUTO) isa = AKV_OPS_ISA_AVX512_VNNI;
    if (isa == AKV_OPS_ISA_AVX512_VNNI && !mm_have_vnni()) isa = AKV_OPS_ISA_AVX2;
    if (isa == AKV_OPS_ISA_AVX2 && !mm_have_avx2()) isa = AKV_OPS_ISA_PORTABLE;
    return isa;
}

const char *akv_ops_isa_name(akv_ops_isa isa) {
    switch (isa) {
    case AKV_OPS_ISA_AUTO: return "auto";
    case AKV_OPS_ISA_PORTABLE: return "portable";
    case AKV_OPS_ISA_AVX2: return "avx2+fma";
    case AKV_OPS_ISA_AVX512_VNNI:
        return "avx2+fma+avx512vnni";
    }
    return "?";
}

void akv_ops_matmul_cols(float *y, const float *x, const float *w, const float *bias, size_t m,
                         size_t n, size_t k, size_t j0, size_t j1, akv_ops_isa isa) {
    AKV_ASSERT(m >= 1 && n >= 1 && k >= 1 && j0 <= j1 && j1 <= n);
#if defined(__x86_64__) && defined(__GNUC__)
    if (akv_ops_isa_resolve(isa) >= AKV_OPS_ISA_AVX2) { /* VNNI: the f32 product is AVX2's */
        mm_cols_avx2(y, x, w, bias, m, n, k, j0, j1);
        return;
    }
#endif
    (void)isa;
    mm_cols_portable(y, x, w, bias, m, n, k, j0, j1);
}
