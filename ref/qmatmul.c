/* qmatmul.c — the host products over weights kept in their block formats (akv/ops.h,
 * akv_ops_qmatmul_cols): activations quantized per 32-element block to 8 bits, one integer
 * dot product per weight block, one fixed float recipe per output element. */
#include "akv/ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/assert.h"
#include "core/half.h"

enum { QB = AKV_OPS_QBLOCK };

/* The bytes of one block of each format: Q8_0 = f16 d + 32 int8; Q4_0 = f16 d + 16 bytes of
 * nibbles (value (q - 8) d); Q4_1 = f16 d, f16 m + 16 bytes (value q d + m). Element i < 16 of a
 * Q4 block is the low nibble of byte i, element i + 16 its high nibble (GGUF's layout). */
size_t akv_ops_qblock_bytes(akv_ops_wtype t) {
    switch (t) {
    case AKV_OPS_W_Q8_0: return 2 + QB;
    case AKV_OPS_W_Q4_0: return 2 + QB / 2;
    case AKV_OPS_W_Q4_1: return 4 + QB / 2;
    }
    return 0;
}

static float ld_f16(const uint8_t *p) {
    return akv_f16_to_f32((uint16_t)(p[0] | (uint16_t)p[1] << 8));
}

void akv_ops_quantize_rows_q8(const float *x, size_t m, size_t k, akv_ops_q8 *out) {
    AKV_ASSERT(k % QB == 0 && out && out->q && out->d && out->s);
    const size_t nb = k / QB;
    for (size_t r = 0; r < m; r++)
        for (size_t b = 0; b < nb; b++) {
            const float *v = x + r * k + b * QB;
            float amax = 0;
            for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(v[i]));
            const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            int8_t *q = out->q + r * k + b * QB;
            int sum = 0;
            for (int i = 0; i < QB; i++) {
                q[i] = (int8_t)roundf(v[i] * id); /* |v id| <= 127 */
                sum += q[i];
            }
            out->d[r * nb + b] = d;
            out->s[r * nb + b] = d * (float)sum;
            out->sum[r * nb + b] = sum;
        }
}

/* ---- the recipe ----------------------------------------------------------------------------
 * y[r][j] = sum over blocks b, in ascending order, of
 *   Q8_0, Q4_0:  acc = fmaf(dw_b * dx_b, (float)isum_b, acc)
 *   Q4_1:        acc = fmaf(dw_b * dx_b, (float)isum_b, acc); acc = fmaf(mw_b, sx_b, acc)
 * from acc = 0, then + bias[j]; isum_b is the exact integer dot of the block's quants (Q4_0:
 * nibbles minus 8; Q4_1: nibbles) with the activations' int8 quants, sx_b = dx_b * sum(qx).
 * The integer part is exact in any order, so every instruction set and every batch shape
 * gives the same bits. */

static int32_t isum_portable(akv_ops_wtype t, const uint8_t *blk, const int8_t *q) {
    int32_t s = 0;
    if (t == AKV_OPS_W_Q8_0) {
        const int8_t *w = (const int8_t *)(blk + 2);
        for (int i = 0; i < QB; i++) s += (int32_t)w[i] * q[i];
        return s;
    }
    const uint8_t *n = blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2);
    const int off = t == AKV_OPS_W_Q4_0 ? 8 : 0;
    for (int i = 0; i < QB / 2; i++) {
        s += ((int32_t)(n[i] & 15) - off) * q[i];
        s += ((int32_t)(n[i] >> 4) - off) * q[i + QB / 2];
    }
    return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QM_AVX2 __attribute__((target("avx2,fma")))

static QM_AVX2 inline int32_t qm_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The same integer dot: unsigned x signed bytes in pairs (maddubs: exact, |sum| <= 2 * 255 *
 * 128 < 2^15 for nibbles, and for Q8 with |w| <= 127 after the sign move), then pairs of
 * 16-bit sums into 32 bits. Q4_0's minus 8 is taken out as 8 * sum(qx). */
static QM_AVX2 int32_t isum_avx2(akv_ops_wtype t, const uint8_t *blk, const int8_t *q, int32_t qsum) {
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p;
    if (t == AKV_OPS_W_Q8_0) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
        /* |w| * (q with w's sign): the unsigned side must be non-negative */
        p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(qv, wv));
    } else {
        const __m128i nb = _mm_loadu_si128((const __m128i *)(blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2)));
        const __m128i lo = _mm_and_si128(nb, _mm_set1_epi8(15));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(nb, 4), _mm_set1_epi8(15));
        p = _mm256_maddubs_epi16(_mm256_set_m128i(hi, lo), qv);
    }
    int32_t s = qm_hsum_epi32(_mm256_madd_epi16(p, ones));
    return t == AKV_OPS_W_Q4_0 ? s - 8 * qsum : s;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define QM_AVX2F __attribute__((target("avx2,fma,f16c")))

/* The integer dot of one block of column c's weights with the activations, as 8 partial int32
 * sums (their total is the exact isum of isum_portable, before Q4_0's minus 8). */
static QM_AVX2F inline __m256i qm_partial(akv_ops_wtype t, const uint8_t *blk, __m256i qv) {
    __m256i p;
    if (t == AKV_OPS_W_Q8_0) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
        p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(qv, wv));
    } else {
        const __m128i nb = _mm_loadu_si128((const __m128i *)(blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2)));
        const __m128i lo = _mm_and_si128(nb, _mm_set1_epi8(15));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(nb, 4), _mm_set1_epi8(15));
        p = _mm256_maddubs_epi16(_mm256_set_m128i(hi, lo), qv);
    }
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 8 f16 values at p, p + stride, ... as floats (exact, as ld_f16). */
static QM_AVX2F inline __m256 qm_f16x8(const uint8_t *p, size_t stride) {
    uint16_t h[8];
    for (int c = 0; c < 8; c++) h[c] = (uint16_t)(p[c * stride] | (uint16_t)p[c * stride + 1] << 8);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Columns j..j+7 for every row: lane c of each vector is column j + c, running exactly the
 * recipe's operations (the same products, conversions and fused multiply-adds, in block
 * order), so the bits equal the one-column path's. */
static QM_AVX2F void qm_cols8_avx2(float *y, const akv_ops_q8 *x, size_t m, const uint8_t *w,
                                  akv_ops_wtype t, const float *bias, size_t n, size_t k, size_t j) {
    const size_t nb = k / QB, bb = akv_ops_qblock_bytes(t), row_bytes = nb * bb;
    const uint8_t *w0 = w + j * row_bytes;
    for (size_t r = 0; r < m; r++) {
        const int8_t *qx = x->q + r * k;
        const float *dx = x->d + r * nb, *sx = x->s + r * nb;
        const int32_t *sumx = x->sum + r * nb;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const uint8_t *blk = w0 + b * bb;
            const __m256i qv = _mm256_loadu_si256((const __m256i *)(qx + b * QB));
            __m256i p[8];
            for (int c = 0; c < 8; c++) p[c] = qm_partial(t, blk + c * row_bytes, qv);
            const __m256i s01 = _mm256_hadd_epi32(p[0], p[1]), s23 = _mm256_hadd_epi32(p[2], p[3]);
            const __m256i s45 = _mm256_hadd_epi32(p[4], p[5]), s67 = _mm256_hadd_epi32(p[6], p[7]);
            const __m256i a = _mm256_hadd_epi32(s01, s23), c4 = _mm256_hadd_epi32(s45, s67);
            __m256i is = _mm256_add_epi32(_mm256_permute2x128_si256(a, c4, 0x20),
                                          _mm256_permute2x128_si256(a, c4, 0x31));
            if (t == AKV_OPS_W_Q4_0) is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * sumx[b]));
            const __m256 dw = qm_f16x8(blk, row_bytes);
            acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx[b])), _mm256_cvtepi32_ps(is), acc);
            if (t == AKV_OPS_W_Q4_1) acc = _mm256_fmadd_ps(qm_f16x8(blk + 2, row_bytes), _mm256_set1_ps(sx[b]), acc);
        }
        if (bias) acc = _mm256_add_ps(acc, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(y + r * n + j, acc);
    }
}
#endif

static void qm_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w, akv_ops_wtype t,
                    const float *bias, size_t n, size_t k, size_t j0, size_t j1, bool avx2) {
    const size_t nb = k / QB, bb = akv_ops_qblock_bytes(t), row_bytes = nb * bb;
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2)
        for (; j0 + 8 <= j1; j0 += 8) qm_cols8_avx2(y, x, m, (const uint8_t *)w, t, bias, n, k, j0);
#endif
    for (size_t j = j0; j < j1; j++) {
        const uint8_t *wr = (const uint8_t *)w + j * row_bytes;
        for (size_t r = 0; r < m; r++) {
            const int8_t *qx = x->q + r * k;
            const float *dx = x->d + r * nb, *sx = x->s + r * nb;
            const int32_t *sumx = x->sum + r * nb;
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * bb;
                int32_t is;
#if defined(__x86_64__) && defined(__GNUC__)
                if (avx2) is = isum_avx2(t, blk, qx + b * QB, sumx[b]);
                else
#endif
                    is = isum_portable(t, blk, qx + b * QB);
                acc = fmaf(ld_f16(blk) * dx[b], (float)is, acc);
                if (t == AKV_OPS_W_Q4_1) acc = fmaf(ld_f16(blk + 2), sx[b], acc);
            }
            y[r * n + j] = bias ? acc + bias[j] : acc;
        }
    }
}

void akv_ops_qmatmul_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w,
                          akv_ops_wtype t, const float *bias, size_t n, size_t k, size_t j0,
                          size_t j1, akv_ops_isa isa) {
    AKV_ASSERT(m >= 1 && n >= 1 && k >= QB && k % QB == 0 && j0 <= j1 && j1 <= n);
    AKV_ASSERT(akv_ops_qblock_bytes(t) != 0 && x && x->q && x->d && x->s && x->sum);
    qm_cols(y, x, m, w, t, bias, n, k, j0, j1, akv_ops_isa_resolve(isa) == AKV_OPS_ISA_AVX2);
}
