/*
 * gguf_quant.c — block decoders (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K) and encoders (the same but Q5_0 and Q5_1). akv/gguf_quant.h has the block layouts.
 *
 * Every decoder turns one block at `b` (any alignment) into block_elems floats; the row
 * functions loop over blocks. The bf16 path decodes a block to f32 on the stack and rounds.
 */
#include "akv/gguf_quant.h"

#include <math.h>
#include <string.h>

#include "akv/gguf.h"
#include "core/alloc.h"
#include "core/half.h"
#include "gguf/gguf_impl.h"

enum { QK = 32, QK_K = 256 };

static float ld_f16(const uint8_t *p) {
    return akv_f16_to_f32(akv__gguf_ld16(p));
}

/* ---- decoders: one block each ---------------------------------------------------------------- */

static void dec_f32(const uint8_t *b, float *y) {
    y[0] = akv__f32_from_bits(akv__gguf_ld32(b));
}

static void dec_f16(const uint8_t *b, float *y) {
    y[0] = ld_f16(b);
}

static void dec_bf16(const uint8_t *b, float *y) {
    y[0] = akv_bf16_to_f32(akv__gguf_ld16(b));
}

static void dec_q8_0(const uint8_t *b, float *y) {
    float d = ld_f16(b);
    for (int i = 0; i < QK; i++) y[i] = d * (float)(int8_t)b[2 + i];
}

static void dec_q4_0(const uint8_t *b, float *y) {
    float d = ld_f16(b);
    const uint8_t *qs = b + 2;
    for (int i = 0; i < QK / 2; i++) {
        y[i] = d * (float)((qs[i] & 15) - 8);
        y[i + QK / 2] = d * (float)((qs[i] >> 4) - 8);
    }
}

static void dec_q4_1(const uint8_t *b, float *y) {
    float d = ld_f16(b), m = ld_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int i = 0; i < QK / 2; i++) {
        y[i] = d * (float)(qs[i] & 15) + m;
        y[i + QK / 2] = d * (float)(qs[i] >> 4) + m;
    }
}

/* Q5_0 (m NULL) and Q5_1: element i's fifth bit is bit i of the 32-bit qh, above nib(i). */
static void dec_q5(float d, const float *m, const uint8_t *qh4, float *y) {
    const uint32_t qh = akv__gguf_ld32(qh4);
    const uint8_t *qs = qh4 + 4;
    for (int i = 0; i < QK / 2; i++) {
        const int lo = (qs[i] & 15) | (int)((qh >> i) & 1) << 4;
        const int hi = (qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
        y[i] = m ? d * (float)lo + *m : d * (float)(lo - 16);
        y[i + QK / 2] = m ? d * (float)hi + *m : d * (float)(hi - 16);
    }
}

static void dec_q5_0(const uint8_t *b, float *y) {
    dec_q5(ld_f16(b), NULL, b + 2, y);
}

static void dec_q5_1(const uint8_t *b, float *y) {
    const float m = ld_f16(b + 2);
    dec_q5(ld_f16(b), &m, b + 4, y);
}

/* The 6-bit scale and min of Q4_K sub-block j from the 12 packed bytes. */
static void q4_k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (qh NULL) and Q5_K, whose element l of sub-block j takes bit j of qh[l] as its fifth
 * bit. */
static void dec_k_4_5(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    float d = ld_f16(b), dmin = ld_f16(b + 2);
    const uint8_t *scales = b + 4;
    /* Four chunks of 64 elements; chunk c holds sub-blocks 2c (low nibbles of 32 bytes)
     * and 2c + 1 (high nibbles of the same bytes). */
    for (int c = 0; c < 4; c++) {
        int sc0, mn0, sc1, mn1;
        q4_k_scale_min(scales, 2 * c, &sc0, &mn0);
        q4_k_scale_min(scales, 2 * c + 1, &sc1, &mn1);
        float d0 = d * (float)sc0, m0 = dmin * (float)mn0;
        float d1 = d * (float)sc1, m1 = dmin * (float)mn1;
        const uint8_t *q = qs + 32 * c;
        for (int l = 0; l < 32; l++) {
            int lo = q[l] & 15, hi = q[l] >> 4;
            if (qh) lo |= ((qh[l] >> (2 * c)) & 1) << 4, hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            y[64 * c + l] = d0 * (float)lo - m0;
            y[64 * c + 32 + l] = d1 * (float)hi - m1;
        }
    }
}

static void dec_q4_k(const uint8_t *b, float *y) {
    dec_k_4_5(b, NULL, b + 16, y);
}

static void dec_q5_k(const uint8_t *b, float *y) {
    dec_k_4_5(b, b + 16, b + 48, y);
}

static void dec_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = ld_f16(b + 208);
    /* Two halves of 128 elements; in half h, element 32u + l (quarter u) takes its low
     * nibble from ql[64h + l + 32(u & 1)] (high nibble when u >= 2) and its top two bits
     * from qh[32h + l] >> 2u; its scale is scales[i / 16]. */
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = ql + 64 * h, *H = qh + 32 * h;
        float *yh = y + 128 * h;
        for (int u = 0; u < 4; u++) {
            for (int l = 0; l < 32; l++) {
                uint8_t lo = L[l + 32 * (u & 1)];
                int q = ((u < 2 ? lo & 15 : lo >> 4) | ((H[l] >> (2 * u)) & 3) << 4) - 32;
                int i = 32 * u + l;
                yh[i] = d * (float)scales[8 * h + i / 16] * (float)q;
            }
        }
    }
}

typedef void (*dec_fn)(const uint8_t *b, float *y);

static dec_fn decoder(uint32_t type) {
    switch (type) {
    case AKV_GGUF_TYPE_F32: return dec_f32;
    case AKV_GGUF_TYPE_F16: return dec_f16;
    case AKV_GGUF_TYPE_BF16: return dec_bf16;
    case AKV_GGUF_TYPE_Q8_0: return dec_q8_0;
    case AKV_GGUF_TYPE_Q4_0: return dec_q4_0;
    case AKV_GGUF_TYPE_Q4_1: return dec_q4_1;
    case AKV_GGUF_TYPE_Q5_0: return dec_q5_0;
    case AKV_GGUF_TYPE_Q5_1: return dec_q5_1;
    case AKV_GGUF_TYPE_Q4_K: return dec_q4_k;
    case AKV_GGUF_TYPE_Q5_K: return dec_q5_k;
    case AKV_GGUF_TYPE_Q6_K: return dec_q6_k;
    default: return NULL;
    }
}

bool akv_gguf_can_dequant(uint32_t type) {
    return decoder(type) != NULL;
}

/* Checks a row request; AKV_OK with the decoder and block geometry. */
static akv_status row_args(uint32_t type, const void *src, size_t n_elems, const void *dst,
                           dec_fn *dec, size_t *blk, size_t *blk_bytes) {
    *dec = decoder(type);
    if (!*dec) return AKV_EUNSUPPORTED;
    *blk = akv_gguf_type_block_elems(type);
    *blk_bytes = akv_gguf_type_block_bytes(type);
    if ((!src || !dst) && n_elems) return AKV_EINVAL;
    return n_elems % *blk ? AKV_EINVAL : AKV_OK;
}

akv_status akv_gguf_dequant_f32(uint32_t type, const void *src, size_t n_elems, float *dst) {
    dec_fn dec;
    size_t blk, blk_bytes;
    akv_status st = row_args(type, src, n_elems, dst, &dec, &blk, &blk_bytes);
    if (st) return st;
    const uint8_t *b = src;
    if (type == AKV_GGUF_TYPE_F32) { /* the common plain case: one copy */
        if (n_elems) memcpy(dst, src, n_elems * 4);
        return AKV_OK;
    }
    for (size_t i = 0; i < n_elems; i += blk, b += blk_bytes) dec(b, dst + i);
    return AKV_OK;
}

enum { GGUF_READ_PIECE = 4u << 20 }; /* bytes read from a file per piece (whole blocks) */

akv_status akv_gguf_tensor_f32(const akv_gguf *g, const akv_gguf_tensor *t, float *dst) {
    if (!g || !t || !dst) return AKV_EINVAL;
    if (g->fd < 0) return akv_gguf_dequant_f32(t->type, t->data, (size_t)t->n_elems, dst);
    const size_t blk = akv_gguf_type_block_elems(t->type);
    const size_t blk_bytes = akv_gguf_type_block_bytes(t->type);
    if (!blk || !blk_bytes) return AKV_EUNSUPPORTED; /* not reached: the reader refuses them */
    const uint64_t n_blocks = t->n_elems / blk;
    size_t per = GGUF_READ_PIECE / blk_bytes ? GGUF_READ_PIECE / blk_bytes : 1;
    if (per > n_blocks) per = n_blocks ? (size_t)n_blocks : 1;
    uint8_t *buf = akv__malloc(per * blk_bytes);
    if (!buf) return AKV_ENOMEM;
    akv_status st = AKV_OK;
    for (uint64_t b = 0; b < n_blocks && !st; b += per) {
        size_t k = n_blocks - b < per ? (size_t)(n_blocks - b) : per;
        st = akv_gguf_tensor_read(g, t, b * blk_bytes, buf, k * blk_bytes);
        if (!st) st = akv_gguf_dequant_f32(t->type, buf, k * blk, dst + b * blk);
    }
    akv__free(buf);
    return st;
}

akv_status akv_gguf_dequant_bf16(uint32_t type, const void *src, size_t n_elems, uint16_t *dst) {
    dec_fn dec;
    size_t blk, blk_bytes;
    akv_status st = row_args(type, src, n_elems, dst, &dec, &blk, &blk_bytes);
    if (st) return st;
    const uint8_t *b = src;
    if (type == AKV_GGUF_TYPE_BF16) {
        for (size_t i = 0; i < n_elems; i++) dst[i] = akv__gguf_ld16(b + 2 * i);
        return AKV_OK;
    }
    float tmp[QK_K];
    for (size_t i = 0; i < n_elems; i += blk, b += blk_bytes) {
        dec(b, tmp);
        for (size_t j = 0; j < blk; j++) dst[i + j] = akv_f32_to_bf16(tmp[j]);
    }
    return AKV_OK;
}

/* ---- encoders ------------------------------------------------------------------------------ */

/* x clamped to [lo, hi] and truncated to int; NaN gives lo (no undefined conversion). */
static int clamp_to_int(float x, float lo, float hi) {
    if (!(x > lo)) return (int)lo;
    if (x > hi) return (int)hi;
    return (int)x;
}

static void enc_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    /* Quantise with the scale as stored (f16), so the error is half a stored step. */
    uint16_t d16 = akv_f32_to_f16(amax / 127.0f);
    float d = akv_f16_to_f32(d16), id = d > 0 ? 1.0f / d : 0.0f;
    akv__gguf_st16(b, d16);
    for (int i = 0; i < QK; i++) b[2 + i] = (uint8_t)(int8_t)clamp_to_int(roundf(x[i] * id), -127, 127);
}

static void enc_q4_0(const float *x, uint8_t *b) {
    /* The signed extreme maps to code 0 (-8 d), so d = extreme / -8 and the opposite end
     * of the range reaches code 15 (7 d) at most. */
    float amax = 0, ext = 0;
    for (int i = 0; i < QK; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), ext = x[i];
    uint16_t d16 = akv_f32_to_f16(ext / -8.0f);
    float d = akv_f16_to_f32(d16), id = d != 0 ? 1.0f / d : 0.0f;
    akv__gguf_st16(b, d16);
    for (int i = 0; i < QK / 2; i++) {
        int lo = clamp_to_int(x[i] * id + 8.5f, 0, 15);
        int hi = clamp_to_int(x[i + QK / 2] * id + 8.5f, 0, 15);
        b[2 + i] = (uint8_t)(lo | hi << 4);
    }
}

static void enc_q4_1(const float *x, uint8_t *b) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < QK; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    uint16_t d16 = akv_f32_to_f16((hi - lo) / 15.0f), m16 = akv_f32_to_f16(lo);
    float d = akv_f16_to_f32(d16), m = akv_f16_to_f32(m16), id = d > 0 ? 1.0f / d : 0.0f;
    akv__gguf_st16(b, d16);
    akv__gguf_st16(b + 2, m16);
    for (int i = 0; i < QK / 2; i++) {
        int q0 = clamp_to_int((x[i] - m) * id + 0.5f, 0, 15);
        int q1 = clamp_to_int((x[i + QK / 2] - m) * id + 0.5f, 0, 15);
        b[4 + i] = (uint8_t)(q0 | q1 << 4);
    }
}

/* Q4_K (levels 15, qh NULL) and Q5_K (levels 31): sub-block j's values x map to codes
 * q = round((x + off_j) / step_j) in 0..levels, where off_j = dmin * mn_j >= 0 lifts the
 * sub-block's lowest value (or 0, whichever is lower: the format can only subtract a
 * minimum) to code 0 and step_j = d * sc_j spans the rest. The offsets and then the steps are
 * rounded up to their 6-bit multiples of the block's f16 dmin and d (each the largest over 63),
 * so no value falls outside the codes and the error of one element is half its sub-block's
 * step, which exceeds (range + dmin) / levels by at most d. */
static void enc_k_4_5(const float *x, int levels, uint8_t *b, uint8_t *qh, uint8_t *qs) {
    float lo[8], hi[8], mmax = 0;
    for (int j = 0; j < 8; j++) {
        lo[j] = 0, hi[j] = 0; /* the range always holds 0: the offset is never negative */
        for (int i = 32 * j; i < 32 * j + 32; i++)
            if (x[i] < lo[j])
                lo[j] = x[i];
            else if (x[i] > hi[j])
                hi[j] = x[i];
        mmax = fmaxf(mmax, -lo[j]);
    }
    const uint16_t dmin16 = akv_f32_to_f16(mmax / 63.0f);
    const float dmin = akv_f16_to_f32(dmin16);
    int mn[8], sc[8];
    float smax = 0, want[8];
    for (int j = 0; j < 8; j++) {
        mn[j] = dmin > 0 ? clamp_to_int(ceilf(-lo[j] / dmin), 0, 63) : 0;
        want[j] = (hi[j] + dmin * (float)mn[j]) / (float)levels;
        smax = fmaxf(smax, want[j]);
    }
    const uint16_t d16 = akv_f32_to_f16(smax / 63.0f);
    const float d = akv_f16_to_f32(d16);
    for (int j = 0; j < 8; j++)
        sc[j] = d > 0 ? clamp_to_int(ceilf(want[j] / d), 0, 63) : 0;
    akv__gguf_st16(b, d16);
    akv__gguf_st16(b + 2, dmin16);
    uint8_t *scales = b + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    if (qh) memset(qh, 0, 32);
    memset(qs, 0, 128);
    for (int j = 0; j < 8; j++) {
        const float step = d * (float)sc[j], off = dmin * (float)mn[j];
        const float id = step > 0 ? 1.0f / step : 0.0f;
        for (int l = 0; l < 32; l++) {
            const int q = clamp_to_int((x[32 * j + l] + off) * id + 0.5f, 0, (float)levels);
            qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j & 1)));
            if (qh) qh[l] |= (uint8_t)((q >> 4) << j);
        }
    }
}

/* Q6_K: each 16 values get a signed step s_g = ext / -32 (ext the value of largest
 * magnitude, mapped to code -32; the far end may clamp at 31, a whole step), stored as an
 * int8 multiple of the block's f16 d = max |s_g| / 127 with its magnitude rounded up, so that
 * ext stays within the codes: the error of one element is at most a step, |s_g| + d. */
static void enc_q6_k(const float *x, uint8_t *b) {
    float ext[16], amax = 0;
    for (int g = 0; g < 16; g++) {
        ext[g] = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++)
            if (fabsf(x[i]) > fabsf(ext[g])) ext[g] = x[i];
        amax = fmaxf(amax, fabsf(ext[g]) / 32.0f);
    }
    const uint16_t d16 = akv_f32_to_f16(amax / 127.0f);
    const float d = akv_f16_to_f32(d16);
    uint8_t *ql = b, *qh = b + 128;
    int8_t *scales = (int8_t *)(b + 192);
    memset(b, 0, 192);
    for (int g = 0; g < 16; g++) {
        const float want = d > 0 ? -ext[g] / 32.0f / d : 0.0f;
        const int sc =
            want >= 0 ? clamp_to_int(ceilf(want), 0, 127) : -clamp_to_int(ceilf(-want), 0, 127);
        scales[g] = (int8_t)sc;
        const float step = d * (float)sc, id = step != 0 ? 1.0f / step : 0.0f;
        for (int i = 16 * g; i < 16 * g + 16; i++) {
            const int q = clamp_to_int(x[i] * id + 32.5f, 0, 63); /* q6 = code + 32 */
            const int h = i / 128, u = (i % 128) / 32, l = i % 32;
            ql[64 * h + l + 32 * (u & 1)] |= (uint8_t)((q & 15) << (u < 2 ? 0 : 4));
            qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * u));
        }
    }
    akv__gguf_st16(b + 208, d16);
}

bool akv_gguf_can_quantize(uint32_t type) {
    switch (type) {
    case AKV_GGUF_TYPE_F32:
    case AKV_GGUF_TYPE_F16:
    case AKV_GGUF_TYPE_BF16:
    case AKV_GGUF_TYPE_Q8_0:
    case AKV_GGUF_TYPE_Q4_0:
    case AKV_GGUF_TYPE_Q4_1:
    case AKV_GGUF_TYPE_Q4_K:
    case AKV_GGUF_TYPE_Q5_K:
    case AKV_GGUF_TYPE_Q6_K:
        return true;
    default: return false;
    }
}

akv_status akv_gguf_quantize(uint32_t type, const float *src, size_t n_elems, void *dst) {
    if (!akv_gguf_can_quantize(type)) return AKV_EUNSUPPORTED;
    size_t blk = akv_gguf_type_block_elems(type), blk_bytes = akv_gguf_type_block_bytes(type);
    if (((!src || !dst) && n_elems) || n_elems % blk) return AKV_EINVAL;
    uint8_t *b = dst;
    for (size_t i = 0; i < n_elems; i += blk, b += blk_bytes) {
        switch (type) {
        case AKV_GGUF_TYPE_F32: akv__gguf_st32(b, akv__f32_bits(src[i])); break;
        case AKV_GGUF_TYPE_F16: akv__gguf_st16(b, akv_f32_to_f16(src[i])); break;
        case AKV_GGUF_TYPE_BF16: akv__gguf_st16(b, akv_f32_to_bf16(src[i])); break;
        case AKV_GGUF_TYPE_Q8_0: enc_q8_0(src + i, b); break;
        case AKV_GGUF_TYPE_Q4_0: enc_q4_0(src + i, b); break;
        case AKV_GGUF_TYPE_Q4_1:
            enc_q4_1(src + i, b);
            break;
        case AKV_GGUF_TYPE_Q4_K:
            enc_k_4_5(src + i, 15, b, NULL, b + 16);
            break;
        case AKV_GGUF_TYPE_Q5_K:
            enc_k_4_5(src + i, 31, b, b + 16, b + 48);
            break;
        default:
            enc_q6_k(src + i, b);
            break;
        }
    }
    return AKV_OK;
}
