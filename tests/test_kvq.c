/* test_kvq.c — the codec of the compact page forms (akv/kvq.h) against float64 and against
 * its own definition, on awkward sizes and values. */
#include "test.h"

#include <math.h>
#include <string.h>

#include "akv/kvq.h"
#include "core/half.h"
#include "core/rng.h"

/* A normal value (Box-Muller), for rows shaped like K/V. */
static double gauss(akv_rng *r) {
    double u = akv_rng_uniform(r), v = akv_rng_uniform(r);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* A row of n values: normal of scale `scale`, with an outlier channel and the odd exact zero. */
static void fill_row(akv_rng *r, float *x, uint32_t n, double scale) {
    for (uint32_t i = 0; i < n; i++) x[i] = (float)(gauss(r) * scale);
    x[akv_rng_next(r) % n] *= 20.0f; /* a channel far out, as K rows have */
    x[akv_rng_next(r) % n] = 0.0f;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_rng rng = {test_seed(38)};

    TEST_CASE(walsh_hadamard_against_float64_and_its_own_inverse) {
        for (uint32_t n = 2; n <= 4096; n *= 2) {
            float x[4096], y[4096];
            double worst = 0, norm_x = 0, norm_y = 0;
            for (uint32_t i = 0; i < n; i++) x[i] = (float)gauss(&rng);
            memcpy(y, x, n * sizeof *x);
            akv_kvq_fwht(y, n);
            for (uint32_t i = 0; i < n; i++) { /* H[i][j] = (-1)^popcount(i & j) / sqrt(n) */
                double want = 0;
                for (uint32_t j = 0; j < n; j++)
                    want += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * (double)x[j];
                want /= sqrt((double)n);
                worst = fmax(worst, fabs(want - (double)y[i]));
                norm_x += (double)x[i] * x[i], norm_y += (double)y[i] * y[i];
            }
            if (!CHECK(worst < 1e-5 * sqrt((double)n))) printf("  n %u: worst %.3g\n", n, worst);
            CHECK(fabs(norm_x - norm_y) < 1e-4 * norm_x); /* orthonormal */
            akv_kvq_fwht(y, n);
            double back = 0;
            for (uint32_t i = 0; i < n; i++) back = fmax(back, fabs((double)y[i] - x[i]));
            CHECK(back < 1e-5 * sqrt((double)n));
        }
        float odd[3] = {1, 2, 3};
        akv_kvq_fwht(odd, 3); /* not a power of two: untouched */
        CHECK(odd[0] == 1 && odd[1] == 2 && odd[2] == 3);
    }

    TEST_CASE(rows_round_trip_within_half_a_step) {
        const akv_repr reprs[] = {AKV_REPR_Q8, AKV_REPR_Q4};
        const uint32_t dims[] = {32, 48, 64, 96, 128, 256};
        for (size_t ri = 0; ri < 2; ri++)
            for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
                const uint32_t d = dims[di];
                akv_repr_layout l;
                akv_status st = akv_repr_layout_of(reprs[ri], AKV_DTYPE_BF16, 1, 1, d, &l);
                if (st == AKV_EUNSUPPORTED) continue; /* q4 at 48, 96 */
                if (!REQUIRE_OK(st)) continue;
                const float levels = reprs[ri] == AKV_REPR_Q8 ? 127.0f : 7.0f;
                for (int trial = 0; trial < 200; trial++) {
                    float x[256], y[256];
                    uint8_t codes[256];
                    uint16_t scales[8];
                    /* scales from 1e-6 (under f16's normal range) to 1e3 */
                    fill_row(&rng, x, d, pow(10.0, -6.0 + 9.0 * akv_rng_uniform(&rng)));
                    akv_kvq_encode_row(&l, d, x, codes, scales);
                    akv_kvq_decode_row(&l, d, codes, scales, y);
                    for (uint32_t i = 0; i < d; i++) {
                        const float s = akv_f16_to_f32(scales[i / l.group]);
                        /* within half a step (the scale is rounded up: nothing clipped),
                         * and the f32 rounding of x / s and code * s */
                        const float tol = s * 0.5f * (1.0f + 1e-6f) + fabsf(x[i]) * 1e-6f;
                        if (!CHECK(fabsf(x[i] - y[i]) <= tol)) {
                            printf("  %s d %u: x %g y %g s %g\n", akv_repr_name(l.repr), d, x[i], y[i], s);
                            break;
                        }
                        CHECK(fabsf(y[i]) <= levels * s);
                    }
                }
                /* an all-zero row: scale 0, codes 0 (q4 stores 0 as 8), values 0 */
                float zero[256] = {0}, y[256];
                uint8_t codes[256];
                uint16_t scales[8];
                akv_kvq_encode_row(&l, d, zero, codes, scales);
                akv_kvq_decode_row(&l, d, codes, scales, y);
                for (uint32_t i = 0; i < d; i++) CHECK(y[i] == 0.0f);
                CHECK(scales[0] == 0);
                CHECK(codes[0] == (reprs[ri] == AKV_REPR_Q8 ? 0 : 0x88));
            }
    }

    TEST_CASE(the_rotation_pays_for_a_row_with_an_outlier) {
        /* q4's reason to rotate K: a channel far out takes its group's whole range; spread over
         * the row by H, every group keeps its resolution. Mean squared error over many rows. */
        akv_repr_layout l;
        if (!REQUIRE_OK(akv_repr_layout_of(AKV_REPR_Q4, AKV_DTYPE_BF16, 1, 1, 128, &l))) break;
        double err_plain = 0, err_rot = 0;
        for (int trial = 0; trial < 500; trial++) {
            float x[128], r[128], y[128];
            uint8_t codes[64];
            uint16_t scales[4];
            fill_row(&rng, x, 128, 1.0);
            akv_kvq_encode_row(&l, 128, x, codes, scales);
            akv_kvq_decode_row(&l, 128, codes, scales, y);
            for (int i = 0; i < 128; i++) err_plain += (double)(x[i] - y[i]) * (x[i] - y[i]);
            memcpy(r, x, sizeof r);
            akv_kvq_fwht(r, 128);
            akv_kvq_encode_row(&l, 128, r, codes, scales);
            akv_kvq_decode_row(&l, 128, codes, scales, y);
            akv_kvq_fwht(y, 128); /* back: H is its own inverse */
            for (int i = 0; i < 128; i++) err_rot += (double)(x[i] - y[i]) * (x[i] - y[i]);
        }
        printf("  q4 mean squared error: %.4g plain, %.4g rotated\n", err_plain / 64000,
               err_rot / 64000);
        CHECK(err_rot < 0.5 * err_plain);
    }

    TEST_CASE(pages_encode_row_by_row_and_leave_the_rest) {
        const akv_dtype dtypes[] = {AKV_DTYPE_BF16, AKV_DTYPE_F16, AKV_DTYPE_F32};
        for (int ri = AKV_REPR_Q8; ri <= AKV_REPR_Q4; ri++)
            for (size_t ti = 0; ti < 3; ti++) {
                const akv_kvq_page_shape sh = {.n_kv_heads = 3, .page_tokens = 16, .head_dim = 64,
                                               .exact = dtypes[ti]};
                akv_repr_layout le, lc;
                CHECK_OK(akv_repr_layout_of(AKV_REPR_EXACT, sh.exact, 3, 16, 64, &le));
                CHECK_OK(akv_repr_layout_of((akv_repr)ri, sh.exact, 3, 16, 64, &lc));
                uint8_t *exact = malloc(le.page_bytes), *page = malloc(lc.page_bytes);
                if (!CHECK(exact && page)) break;
                for (size_t i = 0; i < le.page_bytes / 2; i++) { /* finite values of each type */
                    float v = (float)gauss(&rng);
                    if (sh.exact == AKV_DTYPE_F32) ((float *)exact)[i / 2] = v;
                    else ((uint16_t *)exact)[i] = sh.exact == AKV_DTYPE_BF16 ? akv_f32_to_bf16(v) : akv_f32_to_f16(v);
                }
                memset(page, 0xA5, lc.page_bytes);
                const uint32_t n_tokens = 11; /* a page not yet full */
                CHECK_OK(akv_kvq_encode_page(&lc, &sh, exact, page, n_tokens));
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t h = 0; h < 3; h++)
                        for (uint32_t t = 0; t < 16; t++) {
                            const uint8_t *c = akv_kvq_codes(&lc, &sh, page, kv, h, t);
                            if (t >= n_tokens) { /* untouched */
                                CHECK(c[0] == 0xA5 && c[lc.code_row_bytes - 1] == 0xA5);
                                continue;
                            }
                            float x[64], y[64];
                            uint8_t codes[64];
                            uint16_t scales[2];
                            akv_kvq_read_row(&le, &sh, exact, kv, h, t, x);
                            if (kv == 0 && lc.rotate_k) akv_kvq_fwht(x, 64);
                            akv_kvq_encode_row(&lc, 64, x, codes, scales);
                            CHECK_BYTES(c, codes, lc.code_row_bytes);
                            CHECK_BYTES(akv_kvq_scales(&lc, &sh, page, kv, h, t), scales,
                                        lc.scales_per_row * 2);
                            akv_kvq_read_row(&lc, &sh, page, kv, h, t, y);
                            float z[64];
                            akv_kvq_decode_row(&lc, 64, codes, scales, z);
                            CHECK_BYTES(y, z, sizeof y);
                        }
                /* a run of rows in one pass: the rows one by one, bit for bit */
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t h = 0; h < 3; h++) {
                        float run[11 * 64], one[64];
                        akv_kvq_read_rows(&lc, &sh, page, kv, h, 2, 9, run);
                        for (uint32_t t = 2; t < 11; t++) {
                            akv_kvq_read_row(&lc, &sh, page, kv, h, t, one);
                            CHECK_BYTES(run + (size_t)(t - 2) * 64, one, sizeof one);
                        }
                    }
                /* refused: an exact layout, another shape's layout, rows past the page */
                CHECK_STATUS(akv_kvq_encode_page(&le, &sh, exact, page, 1), AKV_EINVAL);
                akv_kvq_page_shape other = sh;
                other.page_tokens = 32;
                CHECK_STATUS(akv_kvq_encode_page(&lc, &other, exact, page, 1), AKV_EINVAL);
                CHECK_STATUS(akv_kvq_encode_page(&lc, &sh, exact, page, 17), AKV_EINVAL);
                free(exact), free(page);
            }
    }

    return test_finish();
}
