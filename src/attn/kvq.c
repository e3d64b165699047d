/* kvq.c — the codec of the compact page forms (akv/kvq.h). */
#include "akv/kvq.h"

#include <math.h>
#include <string.h>

#include "core/half.h"

void akv_kvq_fwht(float *x, uint32_t n) {
    if (n < 2 || n > 4096 || (n & (n - 1))) return;
    for (uint32_t h = 1; h < n; h *= 2)
        for (uint32_t i = 0; i < n; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
    const float k = (float)(1.0 / sqrt((double)n));
    for (uint32_t i = 0; i < n; i++) x[i] *= k;
}

/* A group's scale as stored, and the codes of its values. */
static void kvq_encode_group(const float *x, uint32_t n, float levels, uint16_t *scale,
                             int32_t *codes) {
    float amax = 0;
    for (uint32_t i = 0; i < n; i++) { /* fmaxf without its call: a NaN is passed over alike */
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    /* the least f16 at or above amax / levels: no value of the group is clipped */
    const float want = amax / levels;
    uint16_t h = akv_f32_to_f16(want);
    if (akv_f16_to_f32(h) < want) h++; /* positive and finite: the next f16 up */
    *scale = h;
    const float s = akv_f16_to_f32(h);
    /* rint by the float trick: adding and taking away 1.5 x 2^23 rounds to the nearest even
     * integer (the rounding mode's), as rintf does, for |v| < 2^22; v = x / s is at most
     * `levels` here (s is at or above amax / levels) */
    const float magic = 12582912.0f;
    for (uint32_t i = 0; i < n; i++) {
        const float t = s > 0 ? x[i] / s + magic : magic; /* C11 does not reassociate it */
        float c = t - magic;
        c = c > levels ? levels : c < -levels ? -levels : c;
        codes[i] = (int32_t)c;
    }
}

void akv_kvq_encode_row(const akv_repr_layout *l, uint32_t head_dim, const float *x,
                        uint8_t *codes, uint16_t *scales) {
    int32_t c[4096];
    if (head_dim > 4096 || !l->group) return;
    const float levels = l->repr == AKV_REPR_Q8 ? 127.0f : 7.0f;
    for (uint32_t g = 0; g < head_dim / l->group; g++)
        kvq_encode_group(x + g * l->group, l->group, levels, &scales[g], c + g * l->group);
    if (l->repr == AKV_REPR_Q8)
        for (uint32_t i = 0; i < head_dim; i++) codes[i] = (uint8_t)(int8_t)c[i];
    else
        for (uint32_t i = 0; i < head_dim; i += 2)
            codes[i / 2] = (uint8_t)((uint32_t)(c[i] + 8) | (uint32_t)(c[i + 1] + 8) << 4);
}

/* A group's scale hoisted, its elements in a loop the compiler vectorizes (the file is built at
 * -O3): code x scale in f32, one rounding. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void akv_kvq_decode_row(const akv_repr_layout *l, uint32_t head_dim, const uint8_t *codes,
                        const uint16_t *scales, float *out) {
    const uint32_t g = l->group;
    for (uint32_t at = 0; at < head_dim; at += g) {
        const float s = akv_f16_to_f32(scales[at / g]);
        if (l->repr == AKV_REPR_Q8) {
            const int8_t *c = (const int8_t *)codes + at;
            for (uint32_t i = 0; i < g; i++) out[at + i] = (float)c[i] * s;
        } else {
            /* a group of 32: bytes 0..15, the even element in the low nibble */
            const uint8_t *c = codes + at / 2;
            float lo[16], hi[16];
            for (uint32_t i = 0; i < 16; i++) {
                lo[i] = (float)((int32_t)(c[i] & 15u) - 8) * s;
                hi[i] = (float)((int32_t)(c[i] >> 4) - 8) * s;
            }
            for (uint32_t i = 0; i < 16; i++) out[at + 2 * i] = lo[i], out[at + 2 * i + 1] = hi[i];
        }
    }
}

/* Row (kv, h, t) of an exact page as f32. */
static void kvq_exact_row(const akv_kvq_page_shape *s, const void *page, uint32_t kv, uint32_t h,
                          uint32_t t, float *out) {
    const size_t at = akv_kvq_row_index(s, kv, h, t) * s->head_dim;
    for (uint32_t i = 0; i < s->head_dim; i++) {
        switch (s->exact) {
        case AKV_DTYPE_F32: out[i] = ((const float *)page)[at + i]; break;
        case AKV_DTYPE_F16: out[i] = akv_f16_to_f32(((const uint16_t *)page)[at + i]); break;
        default: out[i] = akv_bf16_to_f32(((const uint16_t *)page)[at + i]); break;
        }
    }
}

/* Whether l is the layout of representation l->repr for shape s. */
static int kvq_layout_fits(const akv_repr_layout *l, const akv_kvq_page_shape *s) {
    akv_repr_layout want;
    return akv_repr_layout_of(l->repr, s->exact, s->n_kv_heads, s->page_tokens, s->head_dim,
                              &want) == AKV_OK &&
           want.group == l->group && want.code_row_bytes == l->code_row_bytes &&
           want.scales_per_row == l->scales_per_row && want.rotate_k == l->rotate_k &&
           want.scales_offset == l->scales_offset && want.page_bytes == l->page_bytes;
}

akv_status akv_kvq_encode_page(const akv_repr_layout *l, const akv_kvq_page_shape *s,
                               const void *exact_page, void *compact_page, uint32_t n_tokens) {
    if (!l || !s || l->repr == AKV_REPR_EXACT || !kvq_layout_fits(l, s) ||
        n_tokens > s->page_tokens || s->head_dim > 4096)
        return AKV_EINVAL;
    float row[4096];
    for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < s->n_kv_heads; h++)
            for (uint32_t t = 0; t < n_tokens; t++) {
                kvq_exact_row(s, exact_page, kv, h, t, row);
                if (kv == 0 && l->rotate_k) akv_kvq_fwht(row, s->head_dim);
                const size_t r = akv_kvq_row_index(s, kv, h, t);
                akv_kvq_encode_row(l, s->head_dim, row,
                                   (uint8_t *)compact_page + r * l->code_row_bytes,
                                   (uint16_t *)((uint8_t *)compact_page + l->scales_offset) +
                                       r * l->scales_per_row);
            }
    return AKV_OK;
}

akv_status akv_kvq_encode_pairs(const akv_kvq_encode_args *a) {
    akv_repr_layout le, lc;
    if (!a || a->repr == AKV_REPR_EXACT ||
        akv_repr_layout_of(AKV_REPR_EXACT, a->dtype, a->n_kv_heads, a->page_tokens, a->head_dim, &le) ||
        akv_repr_layout_of((akv_repr)a->repr, a->dtype, a->n_kv_heads, a->page_tokens, a->head_dim, &lc))
        return AKV_EINVAL;
    const akv_kvq_page_shape sh = {a->n_kv_heads, a->page_tokens, a->head_dim, a->dtype};
    const int32_t *pairs = (const int32_t *)(uintptr_t)a->pairs;
    for (uint32_t i = 0; i < a->n_pages; i++) {
        const uint8_t *src = (const uint8_t *)(uintptr_t)a->src_pool + (size_t)pairs[2 * i] * le.page_bytes;
        uint8_t *dst = (uint8_t *)(uintptr_t)a->dst_pool + (size_t)pairs[2 * i + 1] * lc.page_bytes;
        akv_status st = akv_kvq_encode_page(&lc, &sh, src, dst, a->page_tokens);
        if (st) return st;
    }
    return AKV_OK;
}

/* n q4 groups of a run (16 code bytes and one scale each) into out (32 floats each)
 * with AVX2: the nibbles interleaved by a byte unpack, so every store is whole and in order;
 * akv_kvq_decode_row's bits (code x scale in f32, one rounding). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void q4_groups_avx2(const uint8_t *c4, const uint16_t *sc,
                                                           uint32_t n, float *out) {
    const __m128i low = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (uint32_t k = 0; k < n; k++) {
        const __m256 f = _mm256_set1_ps(akv_f16_to_f32(sc[k]));
        const __m128i b = _mm_loadu_si128((const __m128i *)(c4 + (size_t)k * 16));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, low), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low), eight);
        const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi); /* in order */
        float *o = out + (size_t)k * 32;
        const __m128i parts[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[j])), f));
    }
}
#define KVQ_Q4_AVX2 1
#endif

/* One loop over a run of rows, the form's branch outside it (a row of 64 elements is too short
 * to pay a call and a branch each: the host attention decodes every row of a history a step). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void akv_kvq_read_rows(const akv_repr_layout *l, const akv_kvq_page_shape *s, const void *page,
                       uint32_t kv, uint32_t head, uint32_t token, uint32_t n, float *out) {
    const int8_t *c8 = (const int8_t *)akv_kvq_codes(l, s, page, kv, head, token);
    const uint8_t *c4 = (const uint8_t *)c8;
    const uint16_t *sc = akv_kvq_scales(l, s, page, kv, head, token);
    const uint32_t d = s->head_dim, g = l->group, n_groups = n * (d / g);
    if (l->repr == AKV_REPR_Q8) { /* one group a row: codes and outputs run on */
        for (uint32_t k = 0; k < n_groups; k++) {
            const float f = akv_f16_to_f32(sc[k]);
            for (uint32_t i = 0; i < g; i++) out[(size_t)k * g + i] = (float)c8[(size_t)k * g + i] * f;
        }
        return;
    }
    /* q4: groups of 32 in 16 bytes, also running on; without AVX2, row by row */
#ifdef KVQ_Q4_AVX2
    if (__builtin_cpu_supports("avx2")) {
        q4_groups_avx2(c4, sc, n_groups, out);
        return;
    }
#endif
    for (uint32_t r = 0; r < n; r++)
        akv_kvq_decode_row(l, d, c4 + (size_t)r * l->code_row_bytes, sc + (size_t)r * l->scales_per_row,
                           out + (size_t)r * d);
}

void akv_kvq_read_row(const akv_repr_layout *l, const akv_kvq_page_shape *s, const void *page,
                      uint32_t kv, uint32_t head, uint32_t token, float *out) {
    if (l->repr == AKV_REPR_EXACT) {
        kvq_exact_row(s, page, kv, head, token, out);
        return;
    }
    akv_kvq_decode_row(l, s->head_dim, akv_kvq_codes(l, s, page, kv, head, token),
                       akv_kvq_scales(l, s, page, kv, head, token), out);
}
