/* qmatmul.c — the host products over weights kept in their block formats (akv/ops.h,
 * akv_ops_qmatmul_cols): activations quantized per 32-element block to 8 bits, one integer
 * dot product per 32 weights, one fixed float recipe per output element. */
#include "akv/ops.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/assert.h"
#include "core/half.h"
#include "lanes.h"

enum { QB = AKV_OPS_QBLOCK, QK = 256, QM_LANES = AKV_LANES };

static float ld_f16(const uint8_t *p) {
    return akv_f16_to_f32((uint16_t)(p[0] | (uint16_t)p[1] << 8));
}

/* ---- activations ---------------------------------------------------------------------------- */

size_t akv_ops_q8_bytes(size_t m, size_t k) {
    const size_t nb = k / QB;
    return m * nb * (2 * sizeof(float) + QM_LANES * sizeof(int32_t)) + m * k;
}

void akv_ops_q8_bind(void *mem, size_t m, size_t k, akv_ops_q8 *out) {
    const size_t nb = k / QB;
    out->d = mem;
    out->s = out->d + m * nb;
    out->lsum = (int32_t *)(out->s + m * nb);
    out->q = (int8_t *)(out->lsum + m * nb * QM_LANES);
}

akv_ops_q8 akv_ops_q8_row(const akv_ops_q8 *x, size_t k, size_t r) {
    const size_t nb = k / QB;
    return (akv_ops_q8){.q = x->q + r * k,
                        .d = x->d + r * nb,
                        .s = x->s + r * nb,
                        .lsum = x->lsum + r * nb * QM_LANES};
}

/* Block b of a row by the rule every instruction set follows: d = amax / 127; each quant
 * v / d rounded half away from zero and clamped to +-127; a scale below the normal range (1 / d
 * would be infinite) quantizes to zeros; a non-finite element clamps (the conversion is then
 * defined, the row garbage, as its input is). */
static void q8_block_portable(const float *v, int8_t *q, int32_t *ls, float *d_out, float *s_out) {
    float amax = 0;
    for (int i = 0; i < QB; i++)
        amax = fmaxf(amax, fabsf(v[i]));
    const float d = amax / 127.0f, id = d >= FLT_MIN ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < QB; i++) {
        q[i] = (int8_t)fmaxf(-127.0f, fminf(127.0f, roundf(v[i] * id))); /* |v id| <= 127 */
        sum += q[i];
    }
    for (int l = 0; l < QM_LANES; l++)
        ls[l] = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
    *d_out = d, *s_out = d * (float)sum;
}

/* ---- the recipe ----------------------------------------------------------------------------
 * y[r][j] = hsum8(acc) + macc (+ bias[j]), over the row's 32-element sub-blocks b in ascending
 * order, from zeros. Each sub-block gives 32 integer weights u_e, 8 lane scales ws_l, an
 * integer offset o and (some formats) a minimum mw:
 *   v_l = sum over e = 4l..4l+3 of u_e * qx_e, minus o * lsum_l   (exact integers)
 *   acc[l] = fmaf((float)v_l, ws_l * dx_b, acc[l])
 *   macc = fmaf(mw, sx_b, macc)                        (Q4_1, Q4_K, Q5_K only)
 *   hsum8 = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
 * per format (w = the weight's value):
 *   Q8_0  u = q (signed), ws = d, o = 0          Q4_K  u = q, ws = d * sc, o = 0, mw = -(dmin * mn)
 *   Q4_0  u = q, ws = d, o = 8                   Q5_K  as Q4_K with 5-bit q
 *   Q4_1  u = q, ws = d, o = 0, mw = m           Q6_K  u = q, ws = d * sc (lanes 0-3 the first
 *   Q5_0  u = q, ws = d, o = 16                        16 elements' sc, 4-7 the second's), o = 32
 *   Q5_1  u = q, ws = d, o = 0, mw = m
 * The lanes are what an AVX2 maddubs + madd pair yields, so the vector path runs these
 * operations exactly, and every instruction set and batch shape gives the same bits. */

typedef struct qm_sub {
    int32_t u[QB];
    float ws[QM_LANES];
    int32_t o;
    bool has_min;
    float mw;
} qm_sub;

/* The 6-bit scale and min of K-format sub-block j from the 12 packed bytes. */
static void qm_k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63, *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Sub-block j of the block at blk (j < 8 for the K formats, 0 otherwise). */
static void qm_unpack(akv_ops_wtype t, const uint8_t *blk, int j, qm_sub *s) {
    s->o = 0, s->has_min = false, s->mw = 0.0f;
    float ws = 0.0f;
    switch (t) {
    case AKV_OPS_W_Q8_0:
        ws = ld_f16(blk);
        for (int e = 0; e < QB; e++)
            s->u[e] = (int8_t)blk[2 + e];
        break;
    case AKV_OPS_W_Q4_0:
    case AKV_OPS_W_Q4_1: {
        const uint8_t *n = blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2);
        ws = ld_f16(blk);
        for (int e = 0; e < QB; e++)
            s->u[e] = e < QB / 2 ? n[e] & 15 : n[e - QB / 2] >> 4;
        if (t == AKV_OPS_W_Q4_0)
            s->o = 8;
        else
            s->has_min = true, s->mw = ld_f16(blk + 2);
        break;
    }
    case AKV_OPS_W_Q5_0:
    case AKV_OPS_W_Q5_1: { /* element e's fifth bit: bit e of the 32-bit qh */
        const uint8_t *qh = blk + (t == AKV_OPS_W_Q5_1 ? 4 : 2), *n = qh + 4;
        const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        ws = ld_f16(blk);
        for (int e = 0; e < QB; e++)
            s->u[e] = (e < QB / 2 ? n[e] & 15 : n[e - QB / 2] >> 4) | (int32_t)((h >> e) & 1) << 4;
        if (t == AKV_OPS_W_Q5_0)
            s->o = 16;
        else
            s->has_min = true, s->mw = ld_f16(blk + 2);
        break;
    }
    case AKV_OPS_W_Q4_K:
    case AKV_OPS_W_Q5_K: {
        int sc, mn;
        qm_k_scale_min(blk + 4, j, &sc, &mn);
        ws = ld_f16(blk) * (float)sc;
        s->has_min = true, s->mw = -(ld_f16(blk + 2) * (float)mn);
        const uint8_t *qh = blk + 16, *qs = blk + 16 + (t == AKV_OPS_W_Q5_K ? QK / 8 : 0);
        for (int e = 0; e < QB; e++) {
            s->u[e] = (qs[32 * (j / 2) + e] >> (4 * (j & 1))) & 15;
            if (t == AKV_OPS_W_Q5_K) s->u[e] |= ((qh[e] >> j) & 1) << 4;
        }
        break;
    }
    case AKV_OPS_W_Q6_K: {
        const int h = j / 4, q = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (q & 1), *qh = blk + QK / 2 + 32 * h;
        const int8_t *sc = (const int8_t *)(blk + QK / 2 + QK / 4) + 8 * h + 2 * q;
        const float d = ld_f16(blk + QK / 2 + QK / 4 + QK / 16);
        for (int e = 0; e < QB; e++)
            s->u[e] = ((q < 2 ? ql[e] & 15 : ql[e] >> 4) | ((qh[e] >> (2 * q)) & 3) << 4);
        for (int l = 0; l < QM_LANES; l++)
            s->ws[l] = d * (float)sc[l / 4];
        s->o = 32;
        return;
    }
    case AKV_OPS_W_F32:
    case AKV_OPS_W_BF16:
        AKV_ASSERT(!"plain rows are no block format");
    }
    for (int l = 0; l < QM_LANES; l++)
        s->ws[l] = ws;
}

void akv_ops_wrow_to_f32(akv_ops_wtype t, const void *row, size_t k, float *out) {
    const size_t be = akv_ops_wblock_elems(t), bb = akv_ops_wblock_bytes(t);
    AKV_ASSERT(akv_ops_wtype_is_block(t) && k >= be && k % be == 0);
    const size_t sub = be / QB;
    qm_sub s;
    for (size_t b = 0; b < k / QB; b++) {
        qm_unpack(t, (const uint8_t *)row + b / sub * bb, (int)(b % sub), &s);
        for (int e = 0; e < QB; e++) {
            const float v = s.ws[e / 4] * (float)(s.u[e] - s.o);
            out[b * QB + e] = s.has_min ? v + s.mw : v;
        }
    }
}

static float qm_dot_portable(akv_ops_wtype t, const uint8_t *wr, size_t sub_per_blk, size_t bb,
                             const int8_t *qx, const int32_t *lsum, const float *dx,
                             const float *sx, size_t nb) {
    float acc[QM_LANES] = {0}, macc = 0.0f;
    qm_sub s;
    for (size_t b = 0; b < nb; b++) {
        qm_unpack(t, wr + b / sub_per_blk * bb, (int)(b % sub_per_blk), &s);
        for (int l = 0; l < QM_LANES; l++) {
            int32_t v = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                v += s.u[e] * qx[b * QB + e];
            v -= s.o * lsum[b * QM_LANES + l];
            acc[l] = fmaf((float)v, s.ws[l] * dx[b], acc[l]);
        }
        if (s.has_min) macc = fmaf(s.mw, sx[b], macc);
    }
    return akv__lanes_sum(acc) + macc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QM_AVX2 __attribute__((target("avx2,fma,f16c")))

static QM_AVX2 inline float qm_f16(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)(p[0] | (unsigned)p[1] << 8));
}

/* Sub-block j's weights as unsigned bytes (Q8_0: its signed bytes), its lane scales, offset
 * and minimum, by qm_unpack's rules. */
static QM_AVX2 inline __attribute__((always_inline)) __m256i
qm_unpack_avx2(akv_ops_wtype t, const uint8_t *blk, int j, __m256 *ws, int *o, float *mw) {
    const __m256i m4 = _mm256_set1_epi8(15);
    *o = 0, *mw = 0.0f;
    switch (t) {
    case AKV_OPS_W_Q8_0:
        *ws = _mm256_set1_ps(qm_f16(blk));
        return _mm256_loadu_si256((const __m256i *)(blk + 2));
    case AKV_OPS_W_Q4_0:
    case AKV_OPS_W_Q4_1: {
        const __m128i n = _mm_loadu_si128((const __m128i *)(blk + (t == AKV_OPS_W_Q4_1 ? 4 : 2)));
        *ws = _mm256_set1_ps(qm_f16(blk));
        if (t == AKV_OPS_W_Q4_0)
            *o = 8;
        else
            *mw = qm_f16(blk + 2);
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(n, 4), n), m4);
    }
    case AKV_OPS_W_Q5_0:
    case AKV_OPS_W_Q5_1: {
        const uint8_t *qh = blk + (t == AKV_OPS_W_Q5_1 ? 4 : 2);
        const __m128i n = _mm_loadu_si128((const __m128i *)(qh + 4));
        *ws = _mm256_set1_ps(qm_f16(blk));
        if (t == AKV_OPS_W_Q5_0)
            *o = 16;
        else
            *mw = qm_f16(blk + 2);
        /* byte e takes byte e / 8 of qh, then keeps bit e % 8 as 0x10 */
        int32_t h;
        memcpy(&h, qh, 4);
        const __m256i hb = _mm256_shuffle_epi8(
            _mm256_set1_epi32(h), _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                    0x0101010101010101LL, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit),
                                            _mm256_set1_epi8(16));
        return _mm256_or_si256(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(n, 4), n), m4), hi);
    }
    case AKV_OPS_W_Q4_K:
    case AKV_OPS_W_Q5_K: {
        int sc, mn;
        qm_k_scale_min(blk + 4, j, &sc, &mn);
        *ws = _mm256_set1_ps(qm_f16(blk) * (float)sc);
        *mw = -(qm_f16(blk + 2) * (float)mn);
        const uint8_t *qh = blk + 16, *qs = blk + 16 + (t == AKV_OPS_W_Q5_K ? QK / 8 : 0);
        const __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        __m256i u = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(b, 4) : b, m4);
        if (t == AKV_OPS_W_Q5_K) {
            const __m256i hb = _mm256_and_si256(
                _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(j)),
                _mm256_set1_epi8(1));
            u = _mm256_or_si256(u, _mm256_slli_epi16(hb, 4));
        }
        return u;
    }
    case AKV_OPS_W_Q6_K: {
        const int h = j / 4, q = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (q & 1), *qh = blk + QK / 2 + 32 * h;
        const int8_t *sc = (const int8_t *)(blk + QK / 2 + QK / 4) + 8 * h + 2 * q;
        const float d = qm_f16(blk + QK / 2 + QK / 4 + QK / 16);
        *ws = _mm256_set_m128(_mm_set1_ps(d * (float)sc[1]), _mm_set1_ps(d * (float)sc[0]));
        *o = 32;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i nib = _mm256_and_si256(q < 2 ? lo : _mm256_srli_epi16(lo, 4), m4);
        const __m256i hb = _mm256_and_si256(
            _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(2 * q)),
            _mm256_set1_epi8(3));
        return _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4));
    }
    case AKV_OPS_W_F32:
    case AKV_OPS_W_BF16:
        break;
    }
    AKV_ASSERT(!"plain rows are no block format");
    return _mm256_setzero_si256();
}

/* One element by the recipe: the 8 lanes of 4 elements' integer dots of unsigned weight bytes
 * and signed x bytes, and the offset off each lane as o * its qx sum. AVX2 takes maddubs
 * (pairs, exact: |pair| <= 2 * 63 * 128 for the K formats and nibbles and, after moving Q8_0's
 * sign, 2 * 128 * 127) and madd with ones; AVX-512 VNNI one dpbusd (the same 4-element lane
 * sums, exact), so both give the same bits. The body is instantiated once per instruction set
 * (QM_DOT_DEFINE: the target of a function fixes the instructions it may use) and inlined once
 * per format (qm_dot_*), so the format's branches and its sub-blocks per block (1 or 8) are
 * constants of the loop. */
#define QM_DOT_DEFINE(NAME, TARGET, IDOT)                                                          \
    static TARGET inline __attribute__((always_inline)) void NAME(                                 \
        const akv_ops_wtype t, const int R, const uint8_t *wr, size_t bb, const akv_ops_q8 *x,     \
        size_t k, size_t r0, size_t nb, float *out) {                                              \
        const bool has_min = t == AKV_OPS_W_Q4_1 || t == AKV_OPS_W_Q5_1 || t == AKV_OPS_W_Q4_K ||  \
                             t == AKV_OPS_W_Q5_K;                                                  \
        const unsigned sub_shift =                                                                 \
            t == AKV_OPS_W_Q4_K || t == AKV_OPS_W_Q5_K || t == AKV_OPS_W_Q6_K ? 3 : 0;             \
        __m256 acc[4];                                                                             \
        float macc[4];                                                                             \
        for (int r = 0; r < R; r++)                                                                \
            acc[r] = _mm256_setzero_ps(), macc[r] = 0.0f;                                          \
        for (size_t b = 0; b < nb; b++) {                                                          \
            __m256 ws;                                                                             \
            int o;                                                                                 \
            float mw;                                                                              \
            const __m256i u = qm_unpack_avx2(t, wr + (b >> sub_shift) * bb,                        \
                                             (int)(b & ((1u << sub_shift) - 1)), &ws, &o, &mw);    \
            const __m256i us = t == AKV_OPS_W_Q8_0 ? _mm256_sign_epi8(u, u) : u;                   \
            for (int r = 0; r < R; r++) { /* the sub-block, unpacked once, for R rows */           \
                const size_t row = r0 + (size_t)r;                                                 \
                const __m256i qv = _mm256_loadu_si256((const __m256i *)(x->q + row * k + b * QB)); \
                __m256i v = IDOT(us, t == AKV_OPS_W_Q8_0 ? _mm256_sign_epi8(qv, u) : qv);          \
                if (o)                                                                             \
                    v = _mm256_sub_epi32(                                                          \
                        v, _mm256_sll_epi32(                                                       \
                               _mm256_loadu_si256(                                                 \
                                   (const __m256i *)(x->lsum + (row * nb + b) * QM_LANES)),        \
                               _mm_cvtsi32_si128(o == 8 ? 3 : o == 16 ? 4 : 5)));                  \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v),                                    \
                                         _mm256_mul_ps(ws, _mm256_set1_ps(x->d[row * nb + b])),    \
                                         acc[r]);                                                  \
                if (has_min) macc[r] = fmaf(mw, x->s[row * nb + b], macc[r]);                      \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < R; r++)                                                                \
            out[r] = akv__lanes_sum_avx2(acc[r]) + macc[r];                                        \
    }

#define QM_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

static QM_AVX2 inline __attribute__((always_inline)) __m256i qm_idot_avx2(__m256i u, __m256i q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
}
static QM_VNNI inline __attribute__((always_inline)) __m256i qm_idot_vnni(__m256i u, __m256i q) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q);
}
QM_DOT_DEFINE(qm_dot_avx2_t, QM_AVX2, qm_idot_avx2)
QM_DOT_DEFINE(qm_dot_vnni_t, QM_VNNI, qm_idot_vnni)

/* y for rows r0..r0+R-1 (R <= 4) of one weight row wr: each row by the recipe, the weights
 * unpacked once for all of them (a row's bits do not depend on R). */
#define QM_SWITCH(T_FN)                                                                            \
    switch (t * 4 + (R - 1)) {                                                                     \
        QM_CASES(T_FN, AKV_OPS_W_Q8_0)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q4_0)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q4_1)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q5_0)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q5_1)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q4_K)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q5_K)                                                             \
        QM_CASES(T_FN, AKV_OPS_W_Q6_K)                                                             \
    }                                                                                              \
    AKV_ASSERT(!"a block format and 1..4 rows")
#define QM_CASE(T_FN, T, RR)                                                                       \
    case T * 4 + RR - 1:                                                                           \
        T_FN(T, RR, wr, bb, x, k, r0, nb, out);                                                    \
        return;
#define QM_CASES(T_FN, T)                                                                          \
    QM_CASE(T_FN, T, 1) QM_CASE(T_FN, T, 2) QM_CASE(T_FN, T, 3) QM_CASE(T_FN, T, 4)

static QM_AVX2 void qm_dot_avx2(akv_ops_wtype t, int R, const uint8_t *wr, size_t bb,
                                const akv_ops_q8 *x, size_t k, size_t r0, size_t nb, float *out) {
    QM_SWITCH(qm_dot_avx2_t);
}
static QM_VNNI void qm_dot_vnni(akv_ops_wtype t, int R, const uint8_t *wr, size_t bb,
                                const akv_ops_q8 *x, size_t k, size_t r0, size_t nb, float *out) {
    QM_SWITCH(qm_dot_vnni_t);
}
#undef QM_CASES
#undef QM_CASE
#undef QM_SWITCH

/* q8_block_portable's rule in vector steps, the same bits: the product v * id as the scalar
 * one; rounding half away from zero as truncation plus one step of the sign where the exact
 * remainder is at least a half; min(r, 127) before max(., -127), where a NaN takes 127 as
 * fminf gives it (max_ps and min_ps return their second operand when either is a NaN). */
static QM_AVX2 void q8_block_avx2(const float *v, int8_t *q, int32_t *ls, float *d_out,
                                  float *s_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
    __m256 x[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_loadu_ps(v + 8 * i);
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, x[i]), amax); /* a NaN: amax, as fmaxf */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float am = _mm_cvtss_f32(m4), d = am / 127.0f, id = d >= FLT_MIN ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) {
        const __m256 t = _mm256_mul_ps(x[i], vid),
                     tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC),
                     up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(t, tr)), half,
                                        _CMP_GE_OQ),
                     step = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0f));
        const __m256 r = _mm256_add_ps(tr, _mm256_and_ps(up, step));
        const __m256 c =
            _mm256_max_ps(_mm256_min_ps(r, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-127.0f));
        qi[i] = _mm256_cvttps_epi32(c);
    }
    /* The packs below and the horizontal adds both leave each 4 quants' group (bytes, or
     * their sum) in the order [0, 2, 4, 6 | 1, 3, 5, 7] (the 128-bit halves interleaved): one
     * permute puts either back in order. */
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    _mm256_storeu_si256((__m256i *)q,
                        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), in_order));
    const __m256i h =
        _mm256_hadd_epi32(_mm256_hadd_epi32(qi[0], qi[1]), _mm256_hadd_epi32(qi[2], qi[3]));
    const __m256i l = _mm256_permutevar8x32_epi32(h, in_order);
    _mm256_storeu_si256((__m256i *)ls, l);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d, *s_out = d * (float)_mm_cvtsi128_si32(s4);
}
#endif

void akv_ops_quantize_rows_q8(const float *x, size_t m, size_t k, akv_ops_q8 *out,
                              akv_ops_isa isa) {
    AKV_ASSERT(k % QB == 0 && out && out->q && out->d && out->s && out->lsum);
    void (*block)(const float *, int8_t *, int32_t *, float *, float *) = q8_block_portable;
#if defined(__x86_64__) && defined(__GNUC__)
    if (akv_ops_isa_resolve(isa) >= AKV_OPS_ISA_AVX2) block = q8_block_avx2;
#endif
    (void)isa;
    const size_t nb = k / QB;
    for (size_t r = 0; r < m; r++)
        for (size_t b = 0; b < nb; b++) {
            const size_t i = r * nb + b;
            block(x + r * k + b * QB, out->q + r * k + b * QB, out->lsum + i * QM_LANES,
                  out->d + i, out->s + i);
        }
}

void akv_ops_qmatmul_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w, akv_ops_wtype t,
                          const float *bias, size_t n, size_t k, size_t j0, size_t j1,
                          akv_ops_isa isa) {
    const size_t be = akv_ops_wblock_elems(t), bb = akv_ops_wblock_bytes(t);
    AKV_ASSERT(akv_ops_wtype_is_block(t) && be && m >= 1 && n >= 1 && k >= be && k % be == 0 &&
               j0 <= j1 && j1 <= n);
    AKV_ASSERT(x && x->q && x->d && x->s && x->lsum);
    const size_t nb = k / QB, sub = be / QB, row_bytes = k / be * bb;
    const akv_ops_isa use = akv_ops_isa_resolve(isa);
    const bool avx2 = use == AKV_OPS_ISA_AVX2 || use == AKV_OPS_ISA_AVX512_VNNI;
    (void)avx2;
    for (size_t j = j0; j < j1; j++) {
        const uint8_t *wr = (const uint8_t *)w + j * row_bytes;
#if defined(__x86_64__) && defined(__GNUC__)
        if (avx2) {
            for (size_t r = 0; r < m; r += 4) {
                const int R = m - r < 4 ? (int)(m - r) : 4;
                float v[4];
                if (use == AKV_OPS_ISA_AVX512_VNNI)
                    qm_dot_vnni(t, R, wr, bb, x, k, r, nb, v);
                else
                    qm_dot_avx2(t, R, wr, bb, x, k, r, nb, v);
                for (int i = 0; i < R; i++)
                    y[(r + i) * n + j] = bias ? v[i] + bias[j] : v[i];
            }
            continue;
        }
#endif
        for (size_t r = 0; r < m; r++) {
            const int8_t *qx = x->q + r * k;
            const int32_t *ls = x->lsum + r * nb * QM_LANES;
            const float *dx = x->d + r * nb, *sx = x->s + r * nb;
            const float v = qm_dot_portable(t, wr, sub, bb, qx, ls, dx, sx, nb);
            y[r * n + j] = bias ? v + bias[j] : v;
        }
    }
}
