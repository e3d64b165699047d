/* qmatmul.c — the host products over weights kept in their block formats (akv/ops.h,
 * akv_ops_qmatmul_cols): activations quantized per 32-element block to 8 bits, one integer
 * dot product per weight block, one fixed float recipe per output element. */
#include "akv/ops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/assert.h"
#include "core/half.h"
#include "lanes.h"

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
    AKV_ASSERT(k % QB == 0 && out && out->q && out->d && out->s && out->lsum8);
    const size_t nb = k / QB;
    for (size_t r = 0; r < m; r++)
        for (size_t b = 0; b < nb; b++) {
            const float *v = x + r * k + b * QB;
            float amax = 0;
            for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(v[i]));
            const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            int8_t *q = out->q + r * k + b * QB;
            int32_t *l8 = out->lsum8 + (r * nb + b) * 8;
            int sum = 0;
            for (int i = 0; i < QB; i++) {
                q[i] = (int8_t)roundf(v[i] * id); /* |v id| <= 127 */
                sum += q[i];
            }
            for (int l = 0; l < 8; l++) l8[l] = 8 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
            out->d[r * nb + b] = d;
            out->s[r * nb + b] = d * (float)sum;
        }
}

/* ---- the recipe ----------------------------------------------------------------------------
 * y[r][j] = hsum8(acc) + macc (+ bias[j]), over blocks b in ascending order, from zeros:
 *   lane l (0..7) of block b: v = the exact integer sum over its 4 elements e = 4l..4l+3 of
 *     w_e * qx_e (w_e: the int8 of Q8_0, the nibble of Q4_1, the nibble minus 8 of Q4_0);
 *     acc[l] = fmaf((float)v, dw_b * dx_b, acc[l])
 *   Q4_1 also: macc = fmaf(mw_b, sx_b, macc)
 *   hsum8 = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
 * Element e of a block is its e-th weight (Q4: e < 16 the low nibble of byte e, else the high
 * nibble of byte e - 16). The lanes are what an AVX2 maddubs + madd pair yields, so the vector
 * path runs these operations exactly, and every instruction set and batch shape gives the
 * same bits. */

enum { QM_LANES = AKV_LANES };

/* The weight of element e of a block, as an integer. */
static inline int32_t qm_weight(akv_ops_wtype t, const uint8_t *blk, int e) {
    if (t == AKV_OPS_W_Q8_0) return (int8_t)blk[2 + e];
    const uint8_t *n = blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2);
    const int32_t v = e < QB / 2 ? n[e] & 15 : n[e - QB / 2] >> 4;
    return t == AKV_OPS_W_Q4_0 ? v - 8 : v;
}

static float qm_dot_portable(akv_ops_wtype t, const uint8_t *wr, size_t bb, const int8_t *qx,
                             const float *dx, const float *sx, size_t nb) {
    float acc[QM_LANES] = {0}, macc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + b * bb;
        const float sc = ld_f16(blk) * dx[b];
        for (int l = 0; l < QM_LANES; l++) {
            int32_t v = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) v += qm_weight(t, blk, e) * qx[b * QB + e];
            acc[l] = fmaf((float)v, sc, acc[l]);
        }
        if (t == AKV_OPS_W_Q4_1) macc = fmaf(ld_f16(blk + 2), sx[b], macc);
    }
    return akv__lanes_sum(acc) + macc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QM_AVX2 __attribute__((target("avx2,fma,f16c")))

static QM_AVX2 inline float qm_f16(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | (unsigned)p[1] << 8));
}

/* One element by the recipe: maddubs pairs unsigned by signed bytes (exact: |pair| <= 2 * 255
 * * 127 < 2^15 for nibbles and, after moving Q8_0's sign, 2 * 128 * 127), madd sums pairs into
 * the 8 lanes of 4 elements; Q4_0's minus 8 comes off each lane as 8 * (its qx sum). */
static QM_AVX2 float qm_dot_avx2(akv_ops_wtype t, const uint8_t *wr, size_t bb, const int8_t *qx,
                                 const int32_t *lsum8, const float *dx, const float *sx,
                                 size_t nb) {
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float macc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + b * bb;
        const __m256i qv = _mm256_loadu_si256((const __m256i *)(qx + b * QB));
        __m256i p;
        if (t == AKV_OPS_W_Q8_0) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(qv, wv));
        } else {
            const __m128i nb16 = _mm_loadu_si128((const __m128i *)(blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2)));
            const __m256i nib = _mm256_and_si256(
                _mm256_set_m128i(_mm_srli_epi16(nb16, 4), nb16), m4);
            p = _mm256_maddubs_epi16(nib, qv);
        }
        __m256i v = _mm256_madd_epi16(p, ones);
        if (t == AKV_OPS_W_Q4_0)
            v = _mm256_sub_epi32(v, _mm256_loadu_si256((const __m256i *)(lsum8 + b * QM_LANES)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(qm_f16(blk) * dx[b]), acc);
        if (t == AKV_OPS_W_Q4_1) macc = fmaf(qm_f16(blk + 2), sx[b], macc);
    }
    return akv__lanes_sum_avx2(acc) + macc;
}
#endif

static void qm_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w, akv_ops_wtype t,
                    const float *bias, size_t n, size_t k, size_t j0, size_t j1, bool avx2) {
    const size_t nb = k / QB, bb = akv_ops_qblock_bytes(t), row_bytes = nb * bb;
    (void)avx2;
    for (size_t j = j0; j < j1; j++) {
        const uint8_t *wr = (const uint8_t *)w + j * row_bytes;
        for (size_t r = 0; r < m; r++) {
            const int8_t *qx = x->q + r * k;
            const float *dx = x->d + r * nb, *sx = x->s + r * nb;
            float v;
#if defined(__x86_64__) && defined(__GNUC__)
            if (avx2) v = qm_dot_avx2(t, wr, bb, qx, x->lsum8 + r * nb * QM_LANES, dx, sx, nb);
            else
#endif
                v = qm_dot_portable(t, wr, bb, qx, dx, sx, nb);
            y[r * n + j] = bias ? v + bias[j] : v;
        }
    }
}

void akv_ops_qmatmul_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w,
                          akv_ops_wtype t, const float *bias, size_t n, size_t k, size_t j0,
                          size_t j1, akv_ops_isa isa) {
    AKV_ASSERT(m >= 1 && n >= 1 && k >= QB && k % QB == 0 && j0 <= j1 && j1 <= n);
    AKV_ASSERT(akv_ops_qblock_bytes(t) != 0 && x && x->q && x->d && x->s && x->lsum8);
    qm_cols(y, x, m, w, t, bias, n, k, j0, j1, akv_ops_isa_resolve(isa) == AKV_OPS_ISA_AVX2);
}
