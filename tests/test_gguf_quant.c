/* test_gguf_quant.c — dequantisation and quantisation of GGUF tensor data: hand-built blocks
 * of every type give the values the layout defines; random blocks decode as gguf-py (an
 * independent implementation) decodes them; quantise -> dequantise stays within each type's
 * error bound; bad arguments are refused. */
#include "test.h"

#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "core/half.h"
#include "gguf/gguf_impl.h"

/* ---- hand-built blocks: encoders written from the layout table in gguf_quant.h ---------- */

static void put_f16(uint8_t *p, float f) {
    akv__gguf_st16(p, akv_f32_to_f16(f));
}

/* Q4_K: sub-block scales sc[8], mins mn[8] (6-bit) and codes q[256] (4-bit). */
static void build_q4_k(uint8_t *b, float d, float dmin, const int *sc, const int *mn,
                       const int *q) {
    memset(b, 0, 144);
    put_f16(b, d);
    put_f16(b + 2, dmin);
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int i = 0; i < 256; i++) {
        int c = i / 64, l = i % 64;
        b[16 + 32 * c + l % 32] |= (uint8_t)(l < 32 ? q[i] : q[i] << 4);
    }
}

/* Q6_K: codes q[256] in 0..63, scales[16], d. */
static void build_q6_k(uint8_t *b, float d, const int8_t *scales, const int *q) {
    memset(b, 0, 210);
    for (int i = 0; i < 256; i++) {
        int h = i / 128, u = (i % 128) / 32, l = i % 32;
        uint8_t *lo = &b[64 * h + l + 32 * (u & 1)];
        *lo |= (uint8_t)(u < 2 ? (q[i] & 15) : (q[i] & 15) << 4);
        b[128 + 32 * h + l] |= (uint8_t)((q[i] >> 4) << (2 * u));
    }
    memcpy(b + 192, scales, 16);
    put_f16(b + 208, d);
}

static void check_decodes_to(uint32_t type, const uint8_t *blocks, size_t n, const float *want) {
    float got[512];
    uint16_t got16[512];
    CHECK_OK(akv_gguf_dequant_f32(type, blocks, n, got));
    TEST_CHECK_(test_check_close_f32(__FILE__, __LINE__, akv_gguf_type_name(type), got, want, n,
                                     0, 0),
                "%s: decoded values differ", akv_gguf_type_name(type));
    CHECK_OK(akv_gguf_dequant_bf16(type, blocks, n, got16));
    int n_bad = 0;
    for (size_t i = 0; i < n; i++) n_bad += got16[i] != akv_f32_to_bf16(want[i]);
    TEST_CHECK_(n_bad == 0, "%s: %d bf16 values differ", akv_gguf_type_name(type), n_bad);
}

/* ---- the gguf-py reference file --------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* Bound on the error of storing v as f16: half an ulp (relative 2^-11), or half the least
 * subnormal (2^-25) near zero. */
static double f16_err(double v) {
    return fabs(v) * 0x1p-11 + 0x1p-25;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t seed = test_seed(7);
    uint64_t rng = seed;

    TEST_CASE(hand_built_plain_types) {
        uint8_t b[16];
        float want[4] = {1.5f, -0.0f, 65504.0f, -3.0e-8f};
        for (int i = 0; i < 4; i++) akv__gguf_st32(b + 4 * i, akv__f32_bits(want[i]));
        check_decodes_to(AKV_GGUF_TYPE_F32, b, 4, want);
        float want16[4] = {1.5f, -2.0f, 65504.0f, 5.9604645e-08f /* least subnormal */};
        uint16_t h16[4] = {0x3e00, 0xc000, 0x7bff, 0x0001};
        for (int i = 0; i < 4; i++) akv__gguf_st16(b + 2 * i, h16[i]);
        check_decodes_to(AKV_GGUF_TYPE_F16, b, 4, want16);
        float wantb[4] = {1.5f, -2.0f, 1.0f / 128, 3.0e38f};
        for (int i = 0; i < 4; i++) akv__gguf_st16(b + 2 * i, akv_f32_to_bf16(wantb[i]));
        wantb[3] = akv_bf16_to_f32(akv_f32_to_bf16(3.0e38f));
        check_decodes_to(AKV_GGUF_TYPE_BF16, b, 4, wantb);
    }

    TEST_CASE(hand_built_q8_0) {
        uint8_t b[68];
        float want[64];
        put_f16(b, 0.5f);
        put_f16(b + 34, -0.25f);
        for (int i = 0; i < 32; i++) {
            b[2 + i] = (uint8_t)(int8_t)(i * 8 - 128); /* -128 .. 120 */
            b[36 + i] = (uint8_t)(int8_t)(127 - i);
            want[i] = 0.5f * (float)(i * 8 - 128);
            want[32 + i] = -0.25f * (float)(127 - i);
        }
        check_decodes_to(AKV_GGUF_TYPE_Q8_0, b, 64, want);
    }

    TEST_CASE(hand_built_q4_0_and_q4_1) {
        uint8_t b[20];
        float want[32];
        put_f16(b, 2.0f);
        for (int i = 0; i < 16; i++) {
            b[2 + i] = (uint8_t)(i | (15 - i) << 4);
            want[i] = 2.0f * (float)(i - 8);        /* low nibbles: elements 0..15 */
            want[16 + i] = 2.0f * (float)(7 - i);   /* high nibbles: elements 16..31 */
        }
        check_decodes_to(AKV_GGUF_TYPE_Q4_0, b, 32, want);
        put_f16(b, 0.25f);
        put_f16(b + 2, -1.0f);
        for (int i = 0; i < 16; i++) {
            b[4 + i] = (uint8_t)((i * 7) % 16 | (i % 5) << 4);
            want[i] = 0.25f * (float)((i * 7) % 16) - 1.0f;
            want[16 + i] = 0.25f * (float)(i % 5) - 1.0f;
        }
        check_decodes_to(AKV_GGUF_TYPE_Q4_1, b, 32, want);
    }

    TEST_CASE(hand_built_q5_0_and_q5_1) {
        uint8_t b[24];
        float want[32];
        const uint32_t qh = 0xA5C3F00Fu; /* element i's fifth bit is bit i */
        put_f16(b, 0.5f);
        memcpy(b + 2, &qh, 4); /* little-endian host, as the file */
        for (int i = 0; i < 16; i++) {
            b[6 + i] = (uint8_t)((i * 5) % 16 | ((i * 3 + 1) % 16) << 4);
            want[i] = 0.5f * (float)(((i * 5) % 16 | (int)((qh >> i) & 1) << 4) - 16);
            want[16 + i] = 0.5f * (float)((((i * 3 + 1) % 16) | (int)((qh >> (16 + i)) & 1) << 4) - 16);
        }
        check_decodes_to(AKV_GGUF_TYPE_Q5_0, b, 32, want);
        put_f16(b, 0.125f);
        put_f16(b + 2, -2.0f);
        memcpy(b + 4, &qh, 4);
        for (int i = 0; i < 16; i++) {
            b[8 + i] = (uint8_t)((15 - i) | (i % 7) << 4);
            want[i] = 0.125f * (float)((15 - i) | (int)((qh >> i) & 1) << 4) - 2.0f;
            want[16 + i] = 0.125f * (float)((i % 7) | (int)((qh >> (16 + i)) & 1) << 4) - 2.0f;
        }
        check_decodes_to(AKV_GGUF_TYPE_Q5_1, b, 32, want);
    }

    TEST_CASE(hand_built_q4_k) {
        /* Scales and mins above 15 exercise the split 6-bit packing of sub-blocks 4..7. */
        int sc[8] = {1, 63, 17, 32, 48, 5, 33, 62}, mn[8] = {0, 12, 63, 40, 31, 47, 16, 1};
        int q[256];
        for (int i = 0; i < 256; i++) q[i] = (i * 11 + i / 7) % 16;
        uint8_t b[144 * 2];
        build_q4_k(b, 0.5f, 0.125f, sc, mn, q);
        /* Second block: swap roles to make sure blocks are independent. */
        build_q4_k(b + 144, -0.25f, 1.0f, mn, sc, q);
        float want[512];
        for (int i = 0; i < 256; i++) {
            want[i] = 0.5f * (float)sc[i / 32] * (float)q[i] - 0.125f * (float)mn[i / 32];
            want[256 + i] = -0.25f * (float)mn[i / 32] * (float)q[i] - 1.0f * (float)sc[i / 32];
        }
        check_decodes_to(AKV_GGUF_TYPE_Q4_K, b, 512, want);
    }

    TEST_CASE(hand_built_q6_k) {
        int8_t scales[16];
        int q[256];
        for (int j = 0; j < 16; j++) scales[j] = (int8_t)(j * 17 - 128);
        for (int i = 0; i < 256; i++) q[i] = (i * 37 + 5) % 64;
        uint8_t b[210];
        build_q6_k(b, 0.0625f, scales, q);
        float want[256];
        for (int i = 0; i < 256; i++)
            want[i] = 0.0625f * (float)scales[i / 16] * (float)(q[i] - 32);
        check_decodes_to(AKV_GGUF_TYPE_Q6_K, b, 256, want);
    }

    TEST_CASE(matches_gguf_py_reference) {
        const char *dir = getenv("AKV_SOURCE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/gguf_dequant_ref.bin", dir ? dir : ".");
        size_t n = 0;
        uint8_t *p = read_file(path, &n);
        if (!CHECK(p != NULL && n >= 4)) {
            fprintf(stderr, "cannot read %s\n", path);
            free(p);
            break;
        }
        uint32_t n_records = akv__gguf_ld32(p);
        size_t at = 4;
        int n_types = 0;
        for (uint32_t r = 0; r < n_records && at + 16 <= n; r++) {
            uint32_t type = akv__gguf_ld32(p + at), n_bytes = akv__gguf_ld32(p + at + 8),
                     n_elems = akv__gguf_ld32(p + at + 12);
            at += 16;
            if (!CHECK(at + n_bytes + 4ull * n_elems <= n)) break;
            size_t want_bytes = 0;
            CHECK_OK(akv_gguf_type_bytes(type, n_elems, &want_bytes));
            CHECK_EQ_U64(want_bytes, n_bytes);
            float *got = malloc(4ull * n_elems), *want = malloc(4ull * n_elems);
            memcpy(want, p + at + n_bytes, 4ull * n_elems);
            CHECK_OK(akv_gguf_dequant_f32(type, p + at, n_elems, got));
            TEST_CHECK_(test_check_close_f32(__FILE__, __LINE__, akv_gguf_type_name(type), got,
                                             want, n_elems, 0, 1e-6),
                        "%s differs from gguf-py", akv_gguf_type_name(type));
            free(got);
            free(want);
            at += n_bytes + 4ull * n_elems;
            n_types++;
        }
        CHECK_EQ_INT(n_types, 8); /* F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q5_K */
        free(p);
    }

    TEST_CASE(bad_arguments) {
        uint8_t b[512] = {0};
        float y[256];
        uint16_t y16[256];
        CHECK_STATUS(akv_gguf_dequant_f32(AKV_GGUF_TYPE_Q3_K, b, 256, y), AKV_EUNSUPPORTED);
        CHECK_STATUS(akv_gguf_dequant_f32(1000, b, 1, y), AKV_EUNSUPPORTED);
        CHECK_STATUS(akv_gguf_dequant_f32(AKV_GGUF_TYPE_Q4_K, b, 255, y), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_dequant_bf16(AKV_GGUF_TYPE_Q8_0, b, 31, y16), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_dequant_f32(AKV_GGUF_TYPE_Q8_0, NULL, 32, y), AKV_EINVAL);
        CHECK_OK(akv_gguf_dequant_f32(AKV_GGUF_TYPE_Q8_0, NULL, 0, NULL));
        CHECK_STATUS(akv_gguf_quantize(AKV_GGUF_TYPE_Q3_K, y, 256, b), AKV_EUNSUPPORTED);
        CHECK_STATUS(akv_gguf_quantize(AKV_GGUF_TYPE_Q4_K, y, 128, b), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_quantize(AKV_GGUF_TYPE_Q4_0, y, 48, b), AKV_EINVAL);
        CHECK(akv_gguf_can_dequant(AKV_GGUF_TYPE_Q6_K));
        CHECK(akv_gguf_can_dequant(AKV_GGUF_TYPE_Q5_0) && !akv_gguf_can_dequant(AKV_GGUF_TYPE_Q3_K));
        CHECK(akv_gguf_can_quantize(AKV_GGUF_TYPE_Q4_1));
        CHECK(akv_gguf_can_quantize(AKV_GGUF_TYPE_Q6_K));
        CHECK(!akv_gguf_can_quantize(AKV_GGUF_TYPE_Q5_0));
    }

    TEST_CASE(quantize_round_trips_within_bounds) {
        /* Blocks of several kinds: gaussian-ish, all zero, constant, one outlier, tiny, and
         * one-sided (all positive). */
        enum { N = 32 * 64 };
        static float x[N], y[N];
        static uint8_t q[N * 4];
        for (int i = 0; i < N; i++) {
            int blk = i / 32, kind = blk % 6;
            float r = test_rand_f32(&rng) + test_rand_f32(&rng);
            x[i] = kind == 0 ? r * 0.05f
                 : kind == 1 ? 0.0f
                 : kind == 2 ? 0.75f
                 : kind == 3 ? (i % 32 == 7 ? 40.0f : r)
                 : kind == 4 ? r * 1e-6f
                             : fabsf(r) + 3.0f;
        }
        const uint32_t types[] = {AKV_GGUF_TYPE_F32, AKV_GGUF_TYPE_F16, AKV_GGUF_TYPE_BF16,
                                  AKV_GGUF_TYPE_Q8_0, AKV_GGUF_TYPE_Q4_0, AKV_GGUF_TYPE_Q4_1};
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            uint32_t type = types[t];
            CHECK_OK(akv_gguf_quantize(type, x, N, q));
            CHECK_OK(akv_gguf_dequant_f32(type, q, N, y));
            int n_bad = 0;
            for (int b0 = 0; b0 < N; b0 += 32) {
                float lo = x[b0], hi = x[b0], amax = 0;
                for (int i = b0; i < b0 + 32; i++) {
                    lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
                    amax = fmaxf(amax, fabsf(x[i]));
                }
                /* Half a step of the block (a whole step at Q4_0's far end), plus the f16
                 * rounding of the scale times the largest code, plus that of the minimum. */
                double bound, d;
                switch (type) {
                case AKV_GGUF_TYPE_F32: bound = 0; break;
                case AKV_GGUF_TYPE_F16: bound = f16_err(amax); break;
                case AKV_GGUF_TYPE_BF16: bound = amax * 0x1p-8; break;
                case AKV_GGUF_TYPE_Q8_0: d = amax / 127, bound = d / 2 + 127 * f16_err(d); break;
                case AKV_GGUF_TYPE_Q4_0: d = amax / 8, bound = d + 8 * f16_err(d); break;
                default:
                    d = (hi - lo) / 15.0;
                    bound = d / 2 + 15 * f16_err(d) + f16_err(lo);
                }
                bound *= 1 + 0x1p-20; /* float arithmetic in the codec */
                for (int i = b0; i < b0 + 32; i++) {
                    double err = fabs((double)y[i] - (double)x[i]);
                    if (err > bound && n_bad++ < 3)
                        fprintf(stderr, "%s: element %d: %.9g -> %.9g, error %.3g > bound %.3g\n",
                                akv_gguf_type_name(type), i, x[i], y[i], err, bound);
                }
            }
            TEST_CHECK_(n_bad == 0, "%s: %d elements beyond the bound", akv_gguf_type_name(type),
                        n_bad);
            /* Exact cases: zero blocks stay zero; F32 is the identity. */
            CHECK_NEAR(y[32], 0.0, 0);
            if (type == AKV_GGUF_TYPE_F32) CHECK_BYTES(y, x, sizeof x);
        }
        /* The Q4_0 block with the outlier keeps the outlier exactly (code 0 = -8 d). */
        CHECK_OK(akv_gguf_quantize(AKV_GGUF_TYPE_Q4_0, x + 96, 32, q));
        CHECK_OK(akv_gguf_dequant_f32(AKV_GGUF_TYPE_Q4_0, q, 32, y));
        CHECK_NEAR(y[7], 40.0, 0);
    }

    TEST_CASE(quantize_k_types_round_trip_within_bounds) {
        /* Super-blocks whose 32-element sub-blocks are of the kinds above, in a different mix
         * per block (gaussian-ish, zero, constant, an outlier, tiny, one-sided positive,
         * one-sided negative, and wide), each element within the bound the encoders promise
         * (gguf_quant.c): half the sub-block's step for Q4_K and Q5_K, the step is at most
         * (range with 0 + dmin) / levels + d; Q6_K a whole step of its 16 values at the far
         * end, the step at most amax / 32 + d. d and dmin are the block's largest over 63
         * (Q6_K: 127), up to f16 rounding. */
        enum { NB = 12, N = 256 * NB };
        static float x[N], y[N];
        static uint8_t q[N];
        for (int i = 0; i < N; i++) {
            const int kind = (i / 32 + i / 256) % 8;
            const float r = test_rand_f32(&rng) + test_rand_f32(&rng);
            x[i] = kind == 0   ? r * 0.05f
                   : kind == 1 ? 0.0f
                   : kind == 2 ? 0.75f
                   : kind == 3 ? (i % 32 == 7 ? 40.0f : r)
                   : kind == 4 ? r * 1e-6f
                   : kind == 5 ? fabsf(r) + 3.0f
                   : kind == 6 ? -fabsf(r) - 3.0f
                               : r * 30.0f;
        }
        const struct {
            uint32_t type;
            int levels;
        } types[] = {{AKV_GGUF_TYPE_Q4_K, 15}, {AKV_GGUF_TYPE_Q5_K, 31}, {AKV_GGUF_TYPE_Q6_K, 0}};
        const double f16 = 1 + 0x1p-10; /* f16 rounding of a scale, relative */
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const uint32_t type = types[t].type;
            CHECK_OK(akv_gguf_quantize(type, x, N, q));
            CHECK_OK(akv_gguf_dequant_f32(type, q, N, y));
            int n_bad = 0;
            double worst = 0;
            for (int b0 = 0; b0 < N; b0 += 256) {
                double bound[256];
                if (types[t].levels) {
                    const int L = types[t].levels;
                    double lo[8], hi[8], mmax = 0, smax = 0;
                    for (int j = 0; j < 8; j++) {
                        lo[j] = hi[j] = 0;
                        for (int i = b0 + 32 * j; i < b0 + 32 * j + 32; i++)
                            lo[j] = fmin(lo[j], x[i]), hi[j] = fmax(hi[j], x[i]);
                        mmax = fmax(mmax, -lo[j]);
                    }
                    const double dmin = mmax / 63 * f16;
                    for (int j = 0; j < 8; j++)
                        smax = fmax(smax, (hi[j] - lo[j] + dmin) / L);
                    const double d = smax / 63 * f16;
                    for (int j = 0; j < 8; j++)
                        for (int i = 0; i < 32; i++)
                            bound[32 * j + i] =
                                ((hi[j] - lo[j] + dmin) / L + d) / 2 + dmin * 0x1p-9;
                } else {
                    double a[16], amax = 0;
                    for (int g = 0; g < 16; g++) {
                        a[g] = 0;
                        for (int i = b0 + 16 * g; i < b0 + 16 * g + 16; i++)
                            a[g] = fmax(a[g], fabs(x[i]));
                        amax = fmax(amax, a[g] / 32);
                    }
                    const double d = amax / 127 * f16;
                    for (int g = 0; g < 16; g++)
                        for (int i = 0; i < 16; i++)
                            bound[16 * g + i] = a[g] / 32 + d;
                }
                for (int i = 0; i < 256; i++) {
                    const double err = fabs((double)y[b0 + i] - x[b0 + i]),
                                 b = bound[i] * (1 + 0x1p-9);
                    worst = fmax(worst, err / (b > 0 ? b : 1));
                    if (!(err <= b) && n_bad++ < 3)
                        fprintf(stderr, "%s: element %d: %.9g -> %.9g, error %.3g > bound %.3g\n",
                                akv_gguf_type_name(type), b0 + i, x[b0 + i], y[b0 + i], err, b);
                }
            }
            TEST_CHECK_(n_bad == 0, "%s: %d elements beyond the bound", akv_gguf_type_name(type),
                        n_bad);
            printf("  %s: worst error %.2f of its bound\n", akv_gguf_type_name(type), worst);
            /* zero sub-blocks decode to zeros */
            for (int i = 32; i < 64; i++)
                CHECK_NEAR(y[i], 0.0, 0);
        }
    }

    TEST_CASE(quantize_survives_non_finite) {
        float x[32];
        uint8_t q[34];
        float y[32];
        for (int i = 0; i < 32; i++) x[i] = (float)i;
        x[3] = NAN;
        x[9] = INFINITY;
        const uint32_t types[] = {AKV_GGUF_TYPE_Q8_0, AKV_GGUF_TYPE_Q4_0, AKV_GGUF_TYPE_Q4_1};
        for (size_t t = 0; t < 3; t++) {
            CHECK_OK(akv_gguf_quantize(types[t], x, 32, q));
            CHECK_OK(akv_gguf_dequant_f32(types[t], q, 32, y));
        }
        float xk[256], yk[256];
        uint8_t qk[256];
        for (int i = 0; i < 256; i++)
            xk[i] = (float)(i % 37) - 18;
        xk[3] = NAN, xk[77] = INFINITY, xk[200] = -INFINITY;
        const uint32_t ktypes[] = {AKV_GGUF_TYPE_Q4_K, AKV_GGUF_TYPE_Q5_K, AKV_GGUF_TYPE_Q6_K};
        for (size_t t = 0; t < 3; t++) {
            CHECK_OK(akv_gguf_quantize(ktypes[t], xk, 256, qk));
            CHECK_OK(akv_gguf_dequant_f32(ktypes[t], qk, 256, yk));
        }
    }

    return test_finish();
}
