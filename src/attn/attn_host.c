/*
 * attn_host.c (attn) — decode attention over host pages read in place (akv/attn_host.h).
 *
 * A chunk runs its K/V head's query rows in passes of at most HP_ROWS rows (the q rows
 * scaled into a local block), and its keys page by page in blocks of HP_BLOCK:
 *   1. scores S[r][t] = q_r . k_t in tiles of up to 4 rows against 2 (AVX2) or 4 (AVX-512)
 *      keys (each key vector widened once for the tile's rows; lanes summed at the end);
 *   2. per row, the block's maximum, the running maximum and sum rescaled (online softmax),
 *      S[r][t] = e^(S[r][t] - m_r);
 *   3. acc[r] = acc[r] * alpha_r + sum_t S[r][t] v_t, each value row widened once for the
 *      pass's rows.
 * A block's rows are in L1 when steps 1 and 3 read them again for the next row, so memory
 * is read once per pass; a GQA group of at most HP_ROWS rows is one pass. A compact page's
 * rows are read in place as well: steps 1 and 3 widen a vector of codes and multiply it by its
 * scale (the block's scales made f32 first), the values of akv/kvq.h's decode; a q4 part's
 * query rows are rotated once a pass, as its K rows were.
 */
#include "akv/attn_host.h"
#include "attn/attn_host_run.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/kvq.h"
#include "core/assert.h"
#include "core/half.h"
#include "core/log.h"
#include "exp8.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HP_X86 1
#endif

enum { HP_ROWS = 8, HP_BLOCK = 32 };

/* ---- instruction sets ---------------------------------------------------------------- */

static bool hp_have(akv_attn_host_isa isa) {
#ifdef HP_X86
    if (isa == AKV_ATTN_HOST_AVX512) return __builtin_cpu_supports("avx512f");
    if (isa == AKV_ATTN_HOST_AVX2) { /* F16C from CPUID (clang's builtin does not name it) */
        unsigned a, b, c = 0, d;
        const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    }
#endif
    return isa == AKV_ATTN_HOST_PORTABLE;
}

akv_attn_host_isa akv_attn_host_isa_resolve(akv_attn_host_isa isa) {
    if (isa == AKV_ATTN_HOST_AUTO || isa >= AKV_ATTN_HOST_ISAS) isa = AKV_ATTN_HOST_AVX512;
    if (isa == AKV_ATTN_HOST_AVX512 && !hp_have(isa)) isa = AKV_ATTN_HOST_AVX2;
    if (isa == AKV_ATTN_HOST_AVX2 && !hp_have(isa)) isa = AKV_ATTN_HOST_PORTABLE;
    return isa;
}

const char *akv_attn_host_isa_name(akv_attn_host_isa isa) {
    switch (isa) {
    case AKV_ATTN_HOST_AUTO: return "auto";
    case AKV_ATTN_HOST_PORTABLE: return "portable";
    case AKV_ATTN_HOST_AVX2: return "avx2";
    case AKV_ATTN_HOST_AVX512: return "avx512";
    case AKV_ATTN_HOST_ISAS: break;
    }
    return "?";
}

/* ---- checks and chunks ----------------------------------------------------------------- */

akv_status akv_attn_host_part_check(const akv_attn_host_part *p) {
    const char *bad = NULL;
    if (!p) bad = "the part is NULL";
    else if (p->n_kv_heads == 0 || p->n_heads == 0 || p->n_heads % p->n_kv_heads)
        bad = "n_heads must be a positive multiple of n_kv_heads";
    else if (p->head_dim == 0 || p->head_dim > AKV_ATTN_HOST_MAX_HEAD_DIM) bad = "head_dim out of 1..256";
    else if (p->page_tokens == 0) bad = "page_tokens is 0";
    else if (p->dtype != AKV_DTYPE_BF16 && p->dtype != AKV_DTYPE_F16 && p->dtype != AKV_DTYPE_F32)
        bad = "dtype must be bf16, f16 or f32";
    else if (!p->q) bad = "q is NULL";
    else if (!(p->scale == 0.0f || (isfinite(p->scale) && p->scale > 0.0f)))
        bad = "scale must be 0 or finite and > 0";
    else if (p->n_pages && !p->pages) bad = "pages is NULL";
    else if (p->repr >= AKV_REPR_COUNT) bad = "repr is not a representation";
    else if (p->n_pages && (p->last_len == 0 || p->last_len > p->page_tokens))
        bad = "last_len out of 1..page_tokens";
    else if (p->first_skip && p->first_skip >= (p->n_pages == 1 ? p->last_len : p->page_tokens))
        bad = "first_skip leaves the first page no token";
    akv_repr_layout l;
    if (!bad && p->repr != AKV_REPR_EXACT &&
        akv_repr_layout_of((akv_repr)p->repr, p->dtype, p->n_kv_heads, p->page_tokens, p->head_dim,
                           &l) != AKV_OK)
        bad = "the compact representation cannot hold this head_dim (q4: a power of two, >= 32)";
    for (uint32_t i = 0; !bad && i < p->n_pages; i++)
        if (!p->pages[i]) bad = "a page address is NULL";
    if (bad) {
        AKV_LOG_E("attn host part: %s", bad);
        return AKV_EINVAL;
    }
    return AKV_OK;
}

static uint32_t hp_run_pages(const akv_attn_host_part *p) {
    const uint32_t run = AKV_ATTN_HOST_CHUNK_TOKENS / p->page_tokens;
    return run ? run : 1;
}

uint32_t akv_attn_host_chunks(const akv_attn_host_part *p) {
    const uint32_t run = hp_run_pages(p);
    return p->n_pages / run + (p->n_pages % run != 0);
}

void akv_attn_host_chunk_pages(const akv_attn_host_part *p, uint32_t chunk, uint32_t *page0,
                               uint32_t *page1) {
    const uint64_t run = hp_run_pages(p), a = chunk * run, b = a + run;
    *page0 = (uint32_t)(a < p->n_pages ? a : p->n_pages);
    *page1 = (uint32_t)(b < p->n_pages ? b : p->n_pages);
}

/* ---- the three steps, per instruction set ---------------------------------------------- */
/* scores(s, q, R, b, nb, D, f): s[r * HP_BLOCK + t] = q[r] . k_t for r < R, t < nb, the keys
 * rows 0 .. nb-1 of block b in form f. pv(acc, w, R, b, nb, D, f): acc[r] += sum_t w[r *
 * HP_BLOCK + t] v_t. */

/* How a block's rows are stored: an exact element type, or a compact form read in place. */
typedef enum hp_form { HP_BF16, HP_F16, HP_F32, HP_Q8, HP_Q4 } hp_form;

/* A block of rows: row t at rows + t * rb (a compact row's codes); a compact row's scales as
 * f32, spr a row (q8 one, q4 one per 32 elements), at sc + t * spr. */
typedef struct hp_blk {
    const unsigned char *rows;
    size_t rb;
    const float *sc;
    uint32_t spr;
} hp_blk;

static float hp_get(const hp_blk *b, uint32_t t, uint32_t e, hp_form f) {
    const unsigned char *row = b->rows + t * b->rb;
    switch (f) {
    case HP_F32: return ((const float *)row)[e];
    case HP_BF16: return akv_bf16_to_f32(((const uint16_t *)row)[e]);
    case HP_F16: return akv_f16_to_f32(((const uint16_t *)row)[e]);
    case HP_Q8: return (float)(int8_t)row[e] * b->sc[t];
    case HP_Q4: break;
    }
    const int c = (int)((row[e / 2] >> (4 * (e & 1))) & 0xF) - 8;
    return (float)c * b->sc[(size_t)t * b->spr + e / AKV_REPR_Q4_GROUP];
}

static void scores_portable(float *s, const float *q, uint32_t R, const hp_blk *k, uint32_t nb,
                            uint32_t D, hp_form f) {
    float kr[AKV_ATTN_HOST_MAX_HEAD_DIM];
    for (uint32_t t = 0; t < nb; t++) {
        for (uint32_t e = 0; e < D; e++) kr[e] = hp_get(k, t, e, f);
        for (uint32_t r = 0; r < R; r++) {
            const float *qr = q + (size_t)r * D;
            float a = 0.0f;
            for (uint32_t e = 0; e < D; e++) a += qr[e] * kr[e];
            s[r * HP_BLOCK + t] = a;
        }
    }
}

static void pv_portable(float *acc, const float *w, uint32_t R, const hp_blk *v, uint32_t nb,
                        uint32_t D, hp_form f) {
    float vr[AKV_ATTN_HOST_MAX_HEAD_DIM];
    for (uint32_t t = 0; t < nb; t++) {
        for (uint32_t e = 0; e < D; e++) vr[e] = hp_get(v, t, e, f);
        for (uint32_t r = 0; r < R; r++) {
            const float wt = w[r * HP_BLOCK + t];
            float *ar = acc + (size_t)r * D;
            for (uint32_t e = 0; e < D; e++) ar[e] += wt * vr[e];
        }
    }
}

#ifdef HP_X86
/* Both sets run the same tiles (HP_TILES, instantiated for each): scores as RB (<= 4) rows
 * against T keys at once (each key vector widened once for the RB rows, each query vector
 * loaded once for the T keys), the values as RB rows of sums over C vectors of columns held
 * in registers across the block's keys (each value vector widened once for the RB rows).
 * RB, T, C and the dtype are constants where a tile is inlined, so the tiles' accumulators
 * are registers (the unroll pragmas make sure of it). */
#define HP_INLINE inline __attribute__((always_inline))
#define HP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define HP_AVX512 __attribute__((target("avx512f")))

/* W (8 or 16) elements of row t of a block from element e on, as floats (a compact row's
 * codes times their scale; a q4 vector lies in one group of 32: e is a multiple of W). */
static HP_INLINE HP_AVX2 __m256 hp_ld8(const hp_blk *b, uint32_t t, uint32_t e, hp_form f) {
    const unsigned char *row = b->rows + t * b->rb;
    if (f == HP_F32) return _mm256_loadu_ps((const float *)row + e);
    if (f == HP_Q8) {
        const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + e)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(b->sc[t]));
    }
    if (f == HP_Q4) { /* lane i: nibble i of the 4 bytes (the even element low), less 8 */
        uint32_t u;
        memcpy(&u, row + e / 2, 4);
        const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        const __m256i c = _mm256_sub_epi32(
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), sh), _mm256_set1_epi32(0xF)),
            _mm256_set1_epi32(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(c),
                             _mm256_set1_ps(b->sc[(size_t)t * b->spr + e / AKV_REPR_Q4_GROUP]));
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + e));
    if (f == HP_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static HP_INLINE HP_AVX512 __m512 hp_ld16(const hp_blk *b, uint32_t t, uint32_t e, hp_form f) {
    const unsigned char *row = b->rows + t * b->rb;
    if (f == HP_F32) return _mm512_loadu_ps((const float *)row + e);
    if (f == HP_Q8) {
        const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + e)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(b->sc[t]));
    }
    if (f == HP_Q4) { /* lanes 0-7 the first 4 bytes' nibbles, 8-15 the next 4's */
        uint32_t u[2];
        memcpy(u, row + e / 2, 8);
        const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
        const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)u[0])),
                                             _mm256_set1_epi32((int)u[1]), 1);
        const __m512i c = _mm512_sub_epi32(
            _mm512_and_si512(_mm512_srlv_epi32(x, sh), _mm512_set1_epi32(0xF)), _mm512_set1_epi32(8));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(c),
                             _mm512_set1_ps(b->sc[(size_t)t * b->spr + e / AKV_REPR_Q4_GROUP]));
    }
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + e));
    if (f == HP_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static HP_INLINE HP_AVX2 float hp_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
static HP_INLINE HP_AVX512 float hp_hsum16(__m512 v) {
    return _mm512_reduce_add_ps(v);
}

/* The tiles and entry points of one set: SFX names them, ATTR targets them, V is the vector
 * type of W floats, P the intrinsics' prefix, TM the keys a score tile takes, CM the column
 * vectors a value tile takes. */
#define HP_TILES(SFX, ATTR, V, W, P, TM, CM)                                                       \
    /* s[r * HP_BLOCK + t + i] = q[r] . k_(t+i) for r < RB, i < T */                               \
    static HP_INLINE ATTR void scores_tile##SFX(float *s, const float *q, const hp_blk *k,         \
                                                uint32_t t, uint32_t D, const hp_form f,           \
                                                const uint32_t RB, const uint32_t T) {             \
        const uint32_t DW = D / W * W;                                                             \
        V a[4][TM];                                                                                \
        _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++)                                  \
            _Pragma("GCC unroll 4") for (uint32_t i = 0; i < T; i++) a[r][i] = P##_setzero_ps();   \
        for (uint32_t e = 0; e < DW; e += W) {                                                     \
            V kv[TM];                                                                              \
            _Pragma("GCC unroll 4") for (uint32_t i = 0; i < T; i++) kv[i] = hp_ld##W(k, t + i, e, f); \
            _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++) {                            \
                const V qv = P##_loadu_ps(q + (size_t)r * D + e);                                  \
                _Pragma("GCC unroll 4") for (uint32_t i = 0; i < T; i++)                           \
                    a[r][i] = P##_fmadd_ps(qv, kv[i], a[r][i]);                                    \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++)                                  \
            _Pragma("GCC unroll 4") for (uint32_t i = 0; i < T; i++) {                             \
                float x = hp_hsum##W(a[r][i]);                                                     \
                for (uint32_t e = DW; e < D; e++) x += q[(size_t)r * D + e] * hp_get(k, t + i, e, f); \
                s[r * HP_BLOCK + t + i] = x;                                                       \
            }                                                                                      \
    }                                                                                              \
    /* acc[r][e0 .. e0 + W C) += sum_t w[r * HP_BLOCK + t] v_t[e0 ..] for r < RB */                \
    static HP_INLINE ATTR void pv_tile##SFX(float *acc, const float *w, const hp_blk *v,           \
                                            uint32_t nb, uint32_t D, uint32_t e0,                  \
                                            const hp_form f, const uint32_t RB,                    \
                                            const uint32_t C) {                                    \
        V a[4][CM];                                                                                \
        _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++)                                  \
            _Pragma("GCC unroll 4") for (uint32_t c = 0; c < C; c++)                               \
                a[r][c] = P##_loadu_ps(acc + (size_t)r * D + e0 + W * c);                          \
        for (uint32_t t = 0; t < nb; t++) {                                                        \
            V vv[CM];                                                                              \
            _Pragma("GCC unroll 4") for (uint32_t c = 0; c < C; c++) vv[c] = hp_ld##W(v, t, e0 + W * c, f); \
            _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++) {                            \
                const V wr = P##_set1_ps(w[r * HP_BLOCK + t]);                                     \
                _Pragma("GCC unroll 4") for (uint32_t c = 0; c < C; c++)                           \
                    a[r][c] = P##_fmadd_ps(wr, vv[c], a[r][c]);                                    \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (uint32_t r = 0; r < RB; r++)                                  \
            _Pragma("GCC unroll 4") for (uint32_t c = 0; c < C; c++)                               \
                P##_storeu_ps(acc + (size_t)r * D + e0 + W * c, a[r][c]);                          \
    }                                                                                              \
    static HP_INLINE ATTR void scores_rows##SFX(float *s, const float *q, const hp_blk *k,         \
                                                uint32_t nb, uint32_t D, const hp_form f,          \
                                                const uint32_t RB) {                               \
        uint32_t t = 0;                                                                            \
        for (; t + TM <= nb; t += TM) scores_tile##SFX(s, q, k, t, D, f, RB, TM);                  \
        for (; t < nb; t++) scores_tile##SFX(s, q, k, t, D, f, RB, 1);                             \
    }                                                                                              \
    static HP_INLINE ATTR void pv_rows##SFX(float *acc, const float *w, const hp_blk *v,           \
                                            uint32_t nb, uint32_t D, const hp_form f,              \
                                            const uint32_t RB) {                                   \
        const uint32_t DW = D / W * W;                                                             \
        uint32_t e0 = 0;                                                                           \
        for (; e0 + W * CM <= DW; e0 += W * CM) pv_tile##SFX(acc, w, v, nb, D, e0, f, RB, CM);     \
        for (; e0 < DW; e0 += W) pv_tile##SFX(acc, w, v, nb, D, e0, f, RB, 1);                     \
        for (uint32_t e = DW; e < D; e++)                                                          \
            for (uint32_t t = 0; t < nb; t++) {                                                    \
                const float x = hp_get(v, t, e, f);                                                \
                for (uint32_t r = 0; r < RB; r++) acc[(size_t)r * D + e] += w[r * HP_BLOCK + t] * x; \
            }                                                                                      \
    }                                                                                              \
    ATTR static void scores##SFX(float *s, const float *in, uint32_t R, const hp_blk *src,         \
                                 uint32_t nb, uint32_t D, hp_form f) {                             \
        const size_t in_stride = D;                                                                \
        HP_BY_FORM(scores_rows##SFX, s, HP_BLOCK);                                                 \
    }                                                                                              \
    ATTR static void pv##SFX(float *acc, const float *in, uint32_t R, const hp_blk *src,           \
                             uint32_t nb, uint32_t D, hp_form f) {                                 \
        const size_t in_stride = HP_BLOCK;                                                         \
        HP_BY_FORM(pv_rows##SFX, acc, D);                                                          \
    }

/* R rows in tiles of at most 4, each tile's RB and the form constants. */
#define HP_ROWS_BY_TILE(fn, out, rstride, form)                                                    \
    for (uint32_t r0 = 0; r0 < R; r0 += 4) {                                                       \
        const uint32_t n_ = R - r0 < 4 ? R - r0 : 4;                                               \
        float *o_ = (out) + (size_t)r0 * (rstride);                                                \
        const float *x_ = in + (size_t)r0 * (in_stride);                                           \
        if (n_ == 4) fn(o_, x_, src, nb, D, form, 4);                                              \
        else if (n_ == 3) fn(o_, x_, src, nb, D, form, 3);                                         \
        else if (n_ == 2) fn(o_, x_, src, nb, D, form, 2);                                         \
        else fn(o_, x_, src, nb, D, form, 1);                                                      \
    }
#define HP_BY_FORM(fn, out, rstride)                                                               \
    do {                                                                                           \
        switch (f) {                                                                               \
        case HP_BF16: HP_ROWS_BY_TILE(fn, out, rstride, HP_BF16) break;                            \
        case HP_F16: HP_ROWS_BY_TILE(fn, out, rstride, HP_F16) break;                              \
        case HP_F32: HP_ROWS_BY_TILE(fn, out, rstride, HP_F32) break;                              \
        case HP_Q8: HP_ROWS_BY_TILE(fn, out, rstride, HP_Q8) break;                                \
        case HP_Q4: HP_ROWS_BY_TILE(fn, out, rstride, HP_Q4) break;                                \
        }                                                                                          \
    } while (0)

HP_TILES(_avx2, HP_AVX2, __m256, 8, _mm256, 2, 2)
HP_TILES(_avx512, HP_AVX512, __m512, 16, _mm512, 4, 4)
#endif

typedef void (*hp_scores_fn)(float *, const float *, uint32_t, const hp_blk *, uint32_t, uint32_t, hp_form);
typedef void (*hp_pv_fn)(float *, const float *, uint32_t, const hp_blk *, uint32_t, uint32_t, hp_form);

/* ---- a chunk --------------------------------------------------------------------------- */

/* w[t] = e^(w[t] - m) for t < n (<= HP_BLOCK), in place; returns their sum. Eight lanes at a
 * time (exp8.h); a partial last group's spare lanes are computed and dropped. */
static float hp_weights(float *w, uint32_t n, float m) {
    fv8 sum = (fv8){0};
    float tail = 0.0f;
    for (uint32_t t = 0; t < n; t += 8) {
        fv8 x = (fv8){0} + SM_CLAMP;
        const uint32_t k = n - t < 8 ? n - t : 8;
        for (uint32_t i = 0; i < k; i++) x[i] = w[t + i] - m;
        exp_neg8(&x);
        if (k == 8) sum += x;
        for (uint32_t i = 0; i < k; i++) {
            w[t + i] = x[i];
            if (k < 8) tail += x[i];
        }
    }
    return ((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7])) + tail;
}

/* akv_attn_host_chunk with isa already resolved for this CPU (a batch resolves it once: the
 * F16C check is a CPUID, which a virtual machine traps). */
static void hp_chunk(const akv_attn_host_part *p, akv_attn_host_isa isa, uint32_t kv_head,
                     uint32_t page0, uint32_t page1, float *o, float *lse) {
    AKV_ASSERT(kv_head < p->n_kv_heads && page0 <= page1 && page1 <= p->n_pages);
    hp_scores_fn scores = scores_portable;
    hp_pv_fn pv = pv_portable;
#ifdef HP_X86
    switch (isa) {
    case AKV_ATTN_HOST_AVX512: scores = scores_avx512, pv = pv_avx512; break;
    case AKV_ATTN_HOST_AVX2: scores = scores_avx2, pv = pv_avx2; break;
    default: break;
    }
#else
    (void)isa;
#endif
    const uint32_t D = p->head_dim, P = p->page_tokens, G = p->n_heads / p->n_kv_heads;
    const float scale = p->scale != 0.0f ? p->scale : 1.0f / sqrtf((float)D);
    /* the pages' layout, exact or compact: where a row's elements (codes) and scales lie (the
     * part was checked: it exists) */
    akv_repr_layout lay;
    const akv_kvq_page_shape sh = {p->n_kv_heads, P, D, p->dtype};
    AKV_ASSERT(akv_repr_layout_of((akv_repr)p->repr, p->dtype, p->n_kv_heads, P, D, &lay) == AKV_OK);
    const hp_form form = p->repr == AKV_REPR_Q8 ? HP_Q8 : p->repr == AKV_REPR_Q4 ? HP_Q4
                       : p->dtype == AKV_DTYPE_BF16 ? HP_BF16 : p->dtype == AKV_DTYPE_F16 ? HP_F16 : HP_F32;
    const size_t rb = lay.code_row_bytes, sb = (size_t)lay.scales_per_row * 2; /* a row's */
    /* [HP_ROWS][D] scaled queries and sums; [HP_ROWS][HP_BLOCK] scores, then weights */
    float qs[HP_ROWS * AKV_ATTN_HOST_MAX_HEAD_DIM], acc[HP_ROWS * AKV_ATTN_HOST_MAX_HEAD_DIM];
    float s[HP_ROWS * HP_BLOCK], m[HP_ROWS], l[HP_ROWS];
    /* a compact block's K and V scales as f32 */
    float ksc[HP_BLOCK * (AKV_ATTN_HOST_MAX_HEAD_DIM / AKV_REPR_Q4_GROUP)];
    float vsc[HP_BLOCK * (AKV_ATTN_HOST_MAX_HEAD_DIM / AKV_REPR_Q4_GROUP)];
    for (uint32_t r0 = 0; r0 < G; r0 += HP_ROWS) {
        const uint32_t R = G - r0 < HP_ROWS ? G - r0 : HP_ROWS;
        for (uint32_t r = 0; r < R; r++) {
            const float *qr = p->q + ((size_t)kv_head * G + r0 + r) * D;
            for (uint32_t e = 0; e < D; e++) qs[(size_t)r * D + e] = qr[e] * scale;
            if (lay.rotate_k) akv_kvq_fwht(qs + (size_t)r * D, D); /* as the K rows were */
            m[r] = -INFINITY, l[r] = 0.0f;
        }
        memset(acc, 0, (size_t)R * D * sizeof *acc);
        for (uint32_t pg = page0; pg < page1; pg++) {
            const unsigned char *page = p->pages[pg];
            const uint32_t n = pg + 1 == p->n_pages ? p->last_len : P;
            for (uint32_t t0 = pg == 0 ? p->first_skip : 0; t0 < n; t0 += HP_BLOCK) {
                const uint32_t nb = n - t0 < HP_BLOCK ? n - t0 : HP_BLOCK;
                /* the next block's rows (this page's, else the next page's first) requested
                 * while this one computes: the kernel reads memory as one stream */
                const unsigned char *npage = t0 + HP_BLOCK < n ? page : pg + 1 < page1 ? p->pages[pg + 1] : NULL;
                const uint32_t nt = t0 + HP_BLOCK < n ? t0 + HP_BLOCK : 0;
                for (uint32_t kv = 0; npage && kv < 2; kv++) {
                    const unsigned char *c = akv_kvq_codes(&lay, &sh, npage, kv, kv_head, nt);
                    const unsigned char *sc = (const unsigned char *)akv_kvq_scales(&lay, &sh, npage, kv, kv_head, nt);
                    for (size_t b = 0; b < HP_BLOCK * rb; b += 64) __builtin_prefetch(c + b);
                    for (size_t b = 0; b < HP_BLOCK * sb; b += 64) __builtin_prefetch(sc + b);
                }
                const hp_blk kb = {akv_kvq_codes(&lay, &sh, page, 0, kv_head, t0), rb, ksc, lay.scales_per_row};
                const hp_blk vb = {akv_kvq_codes(&lay, &sh, page, 1, kv_head, t0), rb, vsc, lay.scales_per_row};
                const uint16_t *ks = akv_kvq_scales(&lay, &sh, page, 0, kv_head, t0);
                const uint16_t *vs = akv_kvq_scales(&lay, &sh, page, 1, kv_head, t0);
                for (uint32_t i = 0; i < nb * lay.scales_per_row; i++) /* none for exact pages */
                    ksc[i] = akv_f16_to_f32(ks[i]), vsc[i] = akv_f16_to_f32(vs[i]);
                scores(s, qs, R, &kb, nb, D, form);
                for (uint32_t r = 0; r < R; r++) {
                    float *sr = s + r * HP_BLOCK, bm = m[r];
                    for (uint32_t t = 0; t < nb; t++) bm = sr[t] > bm ? sr[t] : bm;
                    const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - bm);
                    const float sum = hp_weights(sr, nb, bm);
                    if (alpha != 1.0f) {
                        float *ar = acc + (size_t)r * D;
                        for (uint32_t e = 0; e < D; e++) ar[e] *= alpha;
                    }
                    l[r] = l[r] * alpha + sum, m[r] = bm;
                }
                pv(acc, s, R, &vb, nb, D, form);
            }
        }
        for (uint32_t r = 0; r < R; r++) {
            float *orow = o + ((size_t)r0 + r) * D;
            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            for (uint32_t e = 0; e < D; e++) orow[e] = acc[(size_t)r * D + e] * inv;
            lse[r0 + r] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
        }
    }
}

void akv_attn_host_chunk(const akv_attn_host_part *p, akv_attn_host_isa isa, uint32_t kv_head,
                         uint32_t page0, uint32_t page1, float *o, float *lse) {
    hp_chunk(p, akv_attn_host_isa_resolve(isa), kv_head, page0, page1, o, lse);
}

/* ---- a batch of parts over threads ------------------------------------------------------ */

typedef struct hp_batch {
    const akv_attn_host_part *parts;
    uint32_t n;
    akv_attn_host_isa isa; /* resolved */
    const uint32_t *task0; /* [n + 1] the first task of each part: n_kv_heads x chunks each */
    float *scratch;        /* a task's states at task * G * (D + 1): o [G][D], then lse [G] */
    uint32_t G, D;
} hp_batch;

static void hp_task(void *ctx, uint32_t t) {
    const hp_batch *b = ctx;
    uint32_t i = 0, hi = b->n; /* the part: task0[i] <= t < task0[i + 1] (task0 ascends) */
    while (hi - i > 1) {
        const uint32_t mid = i + (hi - i) / 2;
        if (b->task0[mid] <= t) i = mid;
        else hi = mid;
    }
    const akv_attn_host_part *p = &b->parts[i];
    const uint32_t nc = akv_attn_host_chunks(p), h = (t - b->task0[i]) / nc, c = (t - b->task0[i]) % nc;
    uint32_t a, e;
    akv_attn_host_chunk_pages(p, c, &a, &e);
    float *st = b->scratch + (size_t)t * b->G * (b->D + 1);
    hp_chunk(p, b->isa, h, a, e, st, st + (size_t)b->G * b->D);
}

size_t akv__attn_host_scratch_floats(const akv_attn_host_part *parts, uint32_t n) {
    size_t f = (size_t)n + 1; /* the parts' first tasks (uint32, a float's size each) */
    for (uint32_t i = 0; i < n; i++) {
        const akv_attn_host_part *p = &parts[i];
        const size_t G = p->n_kv_heads ? p->n_heads / p->n_kv_heads : 0;
        f += (size_t)p->n_kv_heads * akv_attn_host_chunks(p) * G * ((size_t)p->head_dim + 1);
    }
    return f;
}

akv_status akv__attn_host_run(const akv_attn_host_part *parts, uint32_t n, akv_attn_host_isa isa,
                              akv_par *par, float *scratch, float *o, float *lse) {
    if (n == 0) return AKV_OK;
    static_assert(sizeof(uint32_t) == sizeof(float), "task offsets share the scratch's floats");
    uint32_t *t0 = (uint32_t *)scratch; /* [n + 1], then the chunk states */
    scratch += (size_t)n + 1;
    akv_status st = AKV_OK;
    const uint32_t H = parts[0].n_heads, D = parts[0].head_dim;
    t0[0] = 0;
    for (uint32_t i = 0; i < n && st == AKV_OK; i++) {
        if ((st = akv_attn_host_part_check(&parts[i]))) break;
        if (parts[i].n_heads != H || parts[i].head_dim != D) {
            AKV_LOG_E("attn host run: part %u has %u heads of %u, part 0 %u of %u", i,
                      parts[i].n_heads, parts[i].head_dim, H, D);
            st = AKV_EINVAL;
            break;
        }
        t0[i + 1] = t0[i] + parts[i].n_kv_heads * akv_attn_host_chunks(&parts[i]);
    }
    if (st == AKV_OK) {
        const uint32_t G = H / parts[0].n_kv_heads;
        hp_batch b = {parts, n, akv_attn_host_isa_resolve(isa), t0, scratch, G, D};
        akv__par_for(par, t0[n], hp_task, &b);
        for (uint32_t i = 0; i < n; i++) { /* each (part, K/V head): its chunks in order */
            const akv_attn_host_part *p = &parts[i];
            const uint32_t nc = akv_attn_host_chunks(p);
            float *oi = o + (size_t)i * H * D, *li = lse + (size_t)i * H;
            for (uint32_t j = 0; j < H; j++) li[j] = -INFINITY;
            memset(oi, 0, (size_t)H * D * sizeof *oi);
            for (uint32_t h = 0; h < p->n_kv_heads; h++)
                for (uint32_t c = 0; c < nc; c++) {
                    const float *cs = scratch + (size_t)(t0[i] + h * nc + c) * G * (D + 1);
                    for (uint32_t r = 0; r < G; r++)
                        akv_attn_merge_state(D, oi + ((size_t)h * G + r) * D, li + h * G + r,
                                             cs + (size_t)r * D, cs[(size_t)G * D + r]);
                }
        }
    }
    return st;
}
