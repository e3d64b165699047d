/* test_ops.c — the dense ops of akv/ops.h against float64 references, on awkward sizes. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "akv/gguf_quant.h"
#include "akv/ops.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/half.h"
#include "test.h"

static const size_t sizes[] = {1, 3, 17, 97, 576};

static float *rand_vec(uint64_t *rng, size_t n, float scale) {
    float *v = akv__malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * test_rand_f32(rng);
    return v;
}

/* NaN everywhere: an op that leaves an element unwritten fails the comparison. */
static void poison(float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
}

/* Pair i of a head in a layout: the indices of its two elements. */
static void pair_idx(akv_rope_mode mode, uint32_t n_rot, uint32_t i, uint32_t *a, uint32_t *b) {
    *a = mode == AKV_ROPE_NEOX ? i : 2 * i;
    *b = mode == AKV_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
}

/* want[m][n] = x W^T + bias in float64, rounded; returns the absolute tolerance of a float32
 * accumulation, ~k * eps * max sum |x w|. */
static double product_f64(float *want, const float *x, const float *w, const float *bias,
                          size_t m, size_t n, size_t k) {
    double worst_scale = 0;
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < n; j++) {
            double s = bias ? bias[j] : 0, mag = 0;
            for (size_t i = 0; i < k; i++) {
                s += (double)x[r * k + i] * w[j * k + i];
                mag += fabs((double)x[r * k + i] * w[j * k + i]);
            }
            want[r * n + j] = (float)s;
            worst_scale = fmax(worst_scale, mag);
        }
    return 1e-6 + 2e-7 * (double)k * worst_scale / 8;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(20261201);

    TEST_CASE(rmsnorm_matches_f64) {
        for (size_t si = 0; si < AKV_ARRAY_LEN(sizes); si++) {
            size_t n = sizes[si], rows = 3;
            float *x = rand_vec(&rng, rows * n, 4), *w = rand_vec(&rng, n, 2);
            float *y = akv__malloc(rows * n * sizeof *y), *want = akv__malloc(rows * n * sizeof *y);
            float eps = 1e-5f;
            for (size_t r = 0; r < rows; r++) {
                double ss = 0;
                for (size_t i = 0; i < n; i++)
                    ss += (double)x[r * n + i] * x[r * n + i];
                double s = 1 / sqrt(ss / n + eps);
                for (size_t i = 0; i < n; i++)
                    want[r * n + i] = (float)(x[r * n + i] * s * w[i]);
            }
            poison(y, rows * n);
            akv_ops_ref_rmsnorm(y, x, w, rows, n, eps);
            CHECK_CLOSE_F32(y, want, rows * n, 1e-6, 1e-5);
            akv_ops_ref_rmsnorm(x, x, w, rows, n, eps); /* in place gives the same */
            CHECK_BYTES(x, y, rows * n * sizeof *y);
            akv__free(x), akv__free(w), akv__free(y), akv__free(want);
        }
    }

    TEST_CASE(rope_freqs_formula_and_errors) {
        float inv[64], f[64];
        for (int i = 0; i < 64; i++)
            f[i] = 1.0f + (float)i / 8;
        CHECK_OK(akv_ops_ref_rope_freqs(500000.0, 128, 0.25, f, inv));
        for (int i = 0; i < 64; i++)
            CHECK_NEAR(inv[i], 0.25 * pow(500000.0, -2.0 * i / 128) / f[i], 1e-6 * inv[0]);
        CHECK_OK(akv_ops_ref_rope_freqs(10000.0, 64, 1.0, NULL, inv));
        CHECK_NEAR(inv[0], 1.0, 0);
        CHECK_NEAR(inv[31], pow(10000.0, -62.0 / 64), 1e-9);
        CHECK_STATUS(akv_ops_ref_rope_freqs(10000.0, 63, 1.0, NULL, inv), AKV_EINVAL);
        CHECK_STATUS(akv_ops_ref_rope_freqs(10000.0, 0, 1.0, NULL, inv), AKV_EINVAL);
        CHECK_STATUS(akv_ops_ref_rope_freqs(1.0, 64, 1.0, NULL, inv), AKV_EINVAL);
        CHECK_STATUS(akv_ops_ref_rope_freqs(NAN, 64, 1.0, NULL, inv), AKV_EINVAL);
        CHECK_STATUS(akv_ops_ref_rope_freqs(10000.0, 64, 0.0, NULL, inv), AKV_EINVAL);
        f[7] = 0;
        CHECK_STATUS(akv_ops_ref_rope_freqs(10000.0, 64, 1.0, f, inv), AKV_EINVAL);
        f[7] = NAN;
        CHECK_STATUS(akv_ops_ref_rope_freqs(10000.0, 64, 1.0, f, inv), AKV_EINVAL);
    }

    TEST_CASE(rope_both_layouts_match_f64) {
        /* head_dim 64 fully rotated, and 128 with only 96 rotated (the tail passes through);
         * positions include 0 and a large one. */
        const uint32_t dims[][2] = {{64, 64}, {128, 96}, {6, 2}};
        const int32_t pos[] = {0, 1, 17, 1000003};
        const size_t n_tok = AKV_ARRAY_LEN(pos);
        const uint32_t n_heads = 3;
        for (int mode = 0; mode < 2; mode++) {
            for (size_t di = 0; di < AKV_ARRAY_LEN(dims); di++) {
                uint32_t hd = dims[di][0], n_rot = dims[di][1], np = n_rot / 2;
                float inv[64], ct[4 * 64], st[4 * 64];
                if (!CHECK(akv_ops_ref_rope_freqs(10000.0, n_rot, 1.0, NULL, inv) == AKV_OK)) break;
                akv_ops_ref_rope_table(pos, n_tok, inv, n_rot, ct, st);
                size_t n = n_tok * n_heads * hd;
                float *x = rand_vec(&rng, n, 3), *want = akv__malloc(n * sizeof *want);
                for (size_t t = 0; t < n_tok; t++) {
                    for (uint32_t h = 0; h < n_heads; h++) {
                        const float *v = x + (t * n_heads + h) * hd;
                        float *o = want + (t * n_heads + h) * hd;
                        for (uint32_t i = 0; i < hd; i++)
                            o[i] = v[i];
                        for (uint32_t i = 0; i < np; i++) {
                            uint32_t a, b;
                            pair_idx((akv_rope_mode)mode, n_rot, i, &a, &b);
                            double ang = (double)pos[t] * inv[i];
                            o[a] = (float)(v[a] * cos(ang) - v[b] * sin(ang));
                            o[b] = (float)(v[a] * sin(ang) + v[b] * cos(ang));
                        }
                    }
                }
                akv_ops_ref_rope(x, n_tok, n_heads, hd, n_rot, (akv_rope_mode)mode, ct, st);
                if (!CHECK_CLOSE_F32(x, want, n, 2e-6, 2e-6))
                    printf("  mode %d head_dim %u n_rot %u\n", mode, hd, n_rot);
                akv__free(x), akv__free(want);
            }
        }
    }

    TEST_CASE(rope_normal_on_converter_permutation_equals_neox) {
        /* llama.cpp's converter reorders each head's Q/K rows so that element 2i comes from i
         * and 2i+1 from i + d/2: NORMAL on the permuted vector = the permuted NEOX result. */
        const uint32_t hd = 64;
        const int32_t pos[] = {5, 300};
        float inv[32], ct[2 * 32], st[2 * 32];
        CHECK_OK(akv_ops_ref_rope_freqs(10000.0, hd, 1.0, NULL, inv));
        akv_ops_ref_rope_table(pos, 2, inv, hd, ct, st);
        float x[2 * 64], xp[2 * 64];
        for (int i = 0; i < 2 * 64; i++)
            x[i] = test_rand_f32(&rng);
        for (int t = 0; t < 2; t++)
            for (uint32_t i = 0; i < hd / 2; i++)
                xp[t * 64 + 2 * i] = x[t * 64 + i], xp[t * 64 + 2 * i + 1] = x[t * 64 + i + hd / 2];
        akv_ops_ref_rope(x, 2, 1, hd, hd, AKV_ROPE_NEOX, ct, st);
        akv_ops_ref_rope(xp, 2, 1, hd, hd, AKV_ROPE_NORMAL, ct, st);
        float x_perm[2 * 64];
        for (int t = 0; t < 2; t++)
            for (uint32_t i = 0; i < hd / 2; i++)
                x_perm[t * 64 + 2 * i] = x[t * 64 + i],
                                    x_perm[t * 64 + 2 * i + 1] = x[t * 64 + i + hd / 2];
        CHECK_BYTES(xp, x_perm, sizeof xp);
    }

    TEST_CASE(rope_scores_depend_on_relative_position) {
        /* q at p and k at p - 7 give the same dot product for any p (the point of RoPE). */
        const uint32_t hd = 64;
        float inv[32], q0[64], k0[64];
        CHECK_OK(akv_ops_ref_rope_freqs(10000.0, hd, 1.0, NULL, inv));
        for (uint32_t i = 0; i < hd; i++)
            q0[i] = test_rand_f32(&rng), k0[i] = test_rand_f32(&rng);
        double first = 0;
        const int32_t ps[] = {7, 50, 4099};
        for (size_t j = 0; j < AKV_ARRAY_LEN(ps); j++) {
            int32_t pq = ps[j], pk = ps[j] - 7;
            float q[64], k[64], cq[32], sq[32], ck[32], sk[32];
            memcpy(q, q0, sizeof q), memcpy(k, k0, sizeof k);
            akv_ops_ref_rope_table(&pq, 1, inv, hd, cq, sq);
            akv_ops_ref_rope_table(&pk, 1, inv, hd, ck, sk);
            akv_ops_ref_rope(q, 1, 1, hd, hd, AKV_ROPE_NORMAL, cq, sq);
            akv_ops_ref_rope(k, 1, 1, hd, hd, AKV_ROPE_NORMAL, ck, sk);
            double dot = 0;
            for (uint32_t i = 0; i < hd; i++)
                dot += (double)q[i] * k[i];
            if (j == 0)
                first = dot;
            else
                CHECK_NEAR(dot, first, 1e-4);
        }
    }

    TEST_CASE(swiglu_matches_f64) {
        size_t n = 97;
        float *g = rand_vec(&rng, n, 20), *u = rand_vec(&rng, n, 3), *y = akv__malloc(n * 4),
              *want = akv__malloc(n * 4);
        g[0] = -100, g[1] = 100, g[2] = 0;
        for (size_t i = 0; i < n; i++)
            want[i] = (float)(g[i] / (1 + exp(-(double)g[i])) * u[i]);
        poison(y, n);
        akv_ops_ref_swiglu(y, g, u, n);
        CHECK_CLOSE_F32(y, want, n, 1e-6, 1e-6);
        akv__free(g), akv__free(u), akv__free(y), akv__free(want);
    }

    TEST_CASE(embed_rows_and_bad_ids) {
        const size_t n_vocab = 17, n_embd = 5;
        float *table = rand_vec(&rng, n_vocab * n_embd, 1), y[3 * 5], before[3 * 5];
        int32_t ids[3] = {16, 0, 16};
        CHECK_OK(akv_ops_ref_embed(y, table, n_vocab, n_embd, ids, 3));
        CHECK_BYTES(y, table + 16 * n_embd, n_embd * 4);
        CHECK_BYTES(y + n_embd, table, n_embd * 4);
        CHECK_BYTES(y + 2 * n_embd, table + 16 * n_embd, n_embd * 4);
        memcpy(before, y, sizeof y);
        int32_t bad[2][3] = {{1, 17, 2}, {1, 2, -1}};
        for (int b = 0; b < 2; b++) {
            CHECK_STATUS(akv_ops_ref_embed(y, table, n_vocab, n_embd, bad[b], 3), AKV_EINVAL);
            CHECK_BYTES(y, before, sizeof y); /* nothing written */
        }
        akv__free(table);
    }

    TEST_CASE(softmax_matches_f64_and_empty_rows) {
        for (size_t si = 0; si < AKV_ARRAY_LEN(sizes); si++) {
            size_t n = sizes[si];
            float *x = rand_vec(&rng, 2 * n, 30), *want = akv__malloc(2 * n * 4);
            x[n] = 80; /* exp(80) overflows float without the max subtracted */
            for (size_t r = 0; r < 2; r++) {
                double mx = -INFINITY, s = 0;
                for (size_t i = 0; i < n; i++)
                    mx = fmax(mx, x[r * n + i]);
                for (size_t i = 0; i < n; i++)
                    s += exp(x[r * n + i] - mx);
                for (size_t i = 0; i < n; i++)
                    want[r * n + i] = (float)(exp(x[r * n + i] - mx) / s);
            }
            akv_ops_ref_softmax(x, 2, n);
            CHECK_CLOSE_F32(x, want, 2 * n, 1e-7, 1e-5);
            akv__free(x), akv__free(want);
        }
        float e[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, z[4] = {0, 0, 0, 0};
        akv_ops_ref_softmax(e, 1, 4);
        CHECK_BYTES(e, z, sizeof e);
        float m[3] = {-INFINITY, 1, -INFINITY}, w1[3] = {0, 1, 0};
        akv_ops_ref_softmax(m, 1, 3);
        CHECK_CLOSE_F32(m, w1, 3, 0, 0);
    }

    TEST_CASE(add_residual) {
        float y[3] = {1, 2, 3}, a[3] = {0.5f, -2, 4}, want[3] = {1.5f, 0, 7};
        akv_ops_ref_add(y, a, 3);
        CHECK_CLOSE_F32(y, want, 3, 0, 0);
    }

    TEST_CASE(matmul_blas_and_plain_match_f64) {
        const size_t ms[] = {1, 3, 17}, nk[] = {1, 3, 17, 97, 576};
        for (size_t a = 0; a < AKV_ARRAY_LEN(ms); a++) {
            for (size_t b = 0; b < AKV_ARRAY_LEN(nk); b++) {
                for (size_t c = 0; c < AKV_ARRAY_LEN(nk); c += 2) {
                    for (int with_bias = 0; with_bias < 2; with_bias++) {
                        size_t m = ms[a], n = nk[b], k = nk[(c + b) % AKV_ARRAY_LEN(nk)];
                        float *x = rand_vec(&rng, m * k, 2), *w = rand_vec(&rng, n * k, 1);
                        float *bias = with_bias ? rand_vec(&rng, n, 1) : NULL;
                        float *y = akv__malloc(m * n * 4), *yp = akv__malloc(m * n * 4),
                              *want = akv__malloc(m * n * 4);
                        double atol = product_f64(want, x, w, bias, m, n, k);
                        poison(y, m * n), poison(yp, m * n);
                        akv_ops_ref_matmul(y, x, w, bias, m, n, k);
                        akv_ops_ref_matmul_plain(yp, x, w, bias, m, n, k);
                        int ok = CHECK_CLOSE_F32(y, want, m * n, atol, 1e-6);
                        ok &= CHECK_CLOSE_F32(yp, want, m * n, atol, 1e-6);
                        if (!ok) printf("  m %zu n %zu k %zu bias %d\n", m, n, k, with_bias);
                        akv__free(x), akv__free(w), akv__free(bias), akv__free(y), akv__free(yp),
                            akv__free(want);
                    }
                }
            }
        }
    }

    TEST_CASE(matmul_one_thread_same_result) {
        size_t m = 5, n = 300, k = 576;
        float *x = rand_vec(&rng, m * k, 1), *w = rand_vec(&rng, n * k, 1);
        float *y1 = akv__malloc(m * n * 4), *y2 = akv__malloc(m * n * 4);
        akv_ops_ref_set_threads(2);
        akv_ops_ref_matmul(y2, x, w, NULL, m, n, k);
        akv_ops_ref_set_threads(1);
        akv_ops_ref_matmul(y1, x, w, NULL, m, n, k);
        CHECK_CLOSE_F32(y1, y2, m * n, 1e-4, 1e-5);
        akv__free(x), akv__free(w), akv__free(y1), akv__free(y2);
    }

    TEST_CASE(matmul_cols_batch_invariant_on_every_isa) {
        /* awkward shapes: k around the 8-lane step, m around the 4-row tiles, n around the
         * 8/4/3-column tiles and the W blocks; every element must be the same bits computed
         * in the whole product, as its row alone, in a random column range, and on the
         * portable path; and within float32 error of the float64 sum */
        const size_t ms[] = {1, 2, 3, 4, 5, 13}, ns[] = {1, 7, 37, 100}, ks[] = {1, 5, 8, 77, 577};
        const akv_ops_isa isa = akv_ops_isa_resolve(AKV_OPS_ISA_AUTO);
        printf("  host products on %s\n", akv_ops_isa_name(isa));
        for (size_t a = 0; a < AKV_ARRAY_LEN(ms); a++)
            for (size_t b = 0; b < AKV_ARRAY_LEN(ns); b++)
                for (size_t c = 0; c < AKV_ARRAY_LEN(ks); c++) {
                    size_t m = ms[a], n = ns[b], k = ks[c];
                    float *x = rand_vec(&rng, m * k, 2), *w = rand_vec(&rng, n * k, 1);
                    float *bias = (a + b + c) % 2 ? rand_vec(&rng, n, 1) : NULL;
                    float *y = akv__malloc(m * n * 4), *y1 = akv__malloc(m * n * 4),
                          *yp = akv__malloc(m * n * 4), *want = akv__malloc(m * n * 4);
                    poison(y, m * n), poison(y1, m * n), poison(yp, m * n);
                    akv_ops_matmul_cols(y, x, w, bias, m, n, k, 0, n, isa);
                    akv_ops_matmul_cols(yp, x, w, bias, m, n, k, 0, n, AKV_OPS_ISA_PORTABLE);
                    for (size_t r = 0; r < m; r++) /* each row alone, in two column ranges */
                    {
                        size_t cut = (size_t)test_rand_below(&rng, n + 1);
                        akv_ops_matmul_cols(y1 + r * n, x + r * k, w, bias, 1, n, k, 0, cut, isa);
                        akv_ops_matmul_cols(y1 + r * n, x + r * k, w, bias, 1, n, k, cut, n, isa);
                    }
                    double atol = product_f64(want, x, w, bias, m, n, k);
                    int ok = CHECK_CLOSE_F32(y, want, m * n, atol, 1e-6);
                    ok &= TEST_CHECK_(!memcmp(y, y1, m * n * 4),
                                      "m %zu n %zu k %zu: a row alone differs from the batch", m,
                                      n, k);
                    ok &= TEST_CHECK_(!memcmp(y, yp, m * n * 4),
                                      "m %zu n %zu k %zu: %s differs from portable", m, n, k,
                                      akv_ops_isa_name(isa));
                    if (!ok) printf("  m %zu n %zu k %zu bias %d\n", m, n, k, bias != NULL);
                    akv__free(x), akv__free(w), akv__free(bias), akv__free(y), akv__free(y1),
                        akv__free(yp), akv__free(want);
                }
    }

    TEST_CASE(quantize_rows_q8_same_bytes_on_every_isa) {
        /* blocks of random values at several scales, of ties (k + 1/2 times the step), of
         * zeros, of values below the normal range, and with an infinity or a NaN in them:
         * the portable rule (checked against its definition here) and every vector path this
         * CPU has give the same bytes */
        enum { NB = 40, K = NB * 32 };
        float *x = rand_vec(&rng, K, 3.0f);
        for (int i = 0; i < 32; i++) {
            x[32 + i] = (float)(i - 16) + 0.5f;          /* amax 16.5: ties after scaling */
            x[64 + i] = 127.0f / 2 * (float)(i % 5 - 2); /* step 1 (amax 127): exact ties */
            x[96 + i] = 0.0f;
            x[128 + i] = 1e-39f * (float)(i - 7);      /* d below the normal range */
            x[160 + i] = x[160 + i] * 1e-30f;          /* tiny but normal */
            x[192 + i] = i == 5 ? INFINITY : x[192 + i];
            x[224 + i] = i == 9 ? NAN : x[224 + i];
            x[256 + i] = i == 3 ? -INFINITY : i == 4 ? NAN : x[256 + i] * 1e20f;
        }
        for (int b = 9; b < NB; b++) /* a NaN at each of the positions 31 down to 1 */
            x[32 * b + 31 - (b - 9)] = NAN;
        void *mp = akv__malloc(akv_ops_q8_bytes(1, K)), *mv = akv__malloc(akv_ops_q8_bytes(1, K));
        akv_ops_q8 qp, qv;
        akv_ops_q8_bind(mp, 1, K, &qp), akv_ops_q8_bind(mv, 1, K, &qv);
        akv_ops_quantize_rows_q8(x, 1, K, &qp, AKV_OPS_ISA_PORTABLE);
        int bad = 0;
        for (int b = 0; b < NB; b++) {
            double amax = 0;
            int nonfinite = 0;
            for (int i = 0; i < 32; i++) {
                const float v = x[32 * b + i];
                nonfinite |= !isfinite(v);
                if (!isnan(v) && fabs(v) > amax) amax = fabs(v);
            }
            const float d = (float)amax / 127.0f;
            bad += qp.d[b] != d;
            for (int i = 0; i < 32 && !nonfinite && d >= FLT_MIN; i++) {
                /* the quant is the nearest integer to v / d, ties away from zero, within one
                 * rounding of the product v * (1 / d) */
                const double want = x[32 * b + i] / (double)d;
                bad += fabs(qp.q[32 * b + i] - want) > 0.5 + 1e-4;
            }
            for (int i = 0; i < 32 && d < FLT_MIN; i++)
                bad += qp.q[32 * b + i] != 0;
        }
        CHECK_EQ_INT(bad, 0);
        for (int isa = AKV_OPS_ISA_AVX2; isa <= AKV_OPS_ISA_AVX512_VNNI; isa++) {
            if (akv_ops_isa_resolve((akv_ops_isa)isa) != (akv_ops_isa)isa) continue;
            memset(mv, 0x5a, akv_ops_q8_bytes(1, K));
            akv_ops_quantize_rows_q8(x, 1, K, &qv, (akv_ops_isa)isa);
            CHECK_BYTES(mv, mp, akv_ops_q8_bytes(1, K));
        }
        akv__free(x), akv__free(mp), akv__free(mv);
    }

    TEST_CASE(qmatmul_every_format_vs_f64_bitwise_across_isa_and_batch) {
        /* random blocks (scales of mixed sign and size, every quant value) of awkward shapes,
         * against the float64 product of the weights as GGUF's decoders read them
         * (akv/gguf_quant.h, written apart from the product) with the exact activations,
         * within the bound the activations' quantization allows; every instruction set, every
         * batch size and every column split gives the same bits */
        static const struct { akv_ops_wtype t; uint32_t gguf; } types[] = {
            {AKV_OPS_W_Q8_0, AKV_GGUF_TYPE_Q8_0}, {AKV_OPS_W_Q4_0, AKV_GGUF_TYPE_Q4_0},
            {AKV_OPS_W_Q4_1, AKV_GGUF_TYPE_Q4_1}, {AKV_OPS_W_Q4_K, AKV_GGUF_TYPE_Q4_K},
            {AKV_OPS_W_Q5_K, AKV_GGUF_TYPE_Q5_K}, {AKV_OPS_W_Q6_K, AKV_GGUF_TYPE_Q6_K},
            {AKV_OPS_W_Q5_0, AKV_GGUF_TYPE_Q5_0}, {AKV_OPS_W_Q5_1, AKV_GGUF_TYPE_Q5_1}};
        static const size_t shapes[][3] = {{1, 1, 1}, {3, 7, 3}, {17, 33, 5}, {2, 65, 18}};
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
                const akv_ops_wtype t = types[ti].t;
                const size_t be = akv_ops_wblock_elems(t);
                /* k: the shape's count of blocks of this format */
                const size_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2] * be, nb = k / 32;
                const size_t rb = akv_ops_wrow_bytes(t, k), bb = rb / (k / be);
                uint8_t *w = akv__malloc(n * rb);
                double *w64 = akv__malloc(n * k * sizeof *w64);
                float *wrow = akv__malloc(k * sizeof *wrow), *y1dec = akv__malloc(k * sizeof *wrow);
                for (size_t i = 0; i < n * rb; i++) w[i] = (uint8_t)test_rand(&rng);
                for (size_t b = 0; b < n * (k / be); b++) {
                    /* the f16 fields: d (and m, dmin) finite, of mixed sign and size */
                    uint8_t *blk = w + b * bb;
                    const size_t at = t == AKV_OPS_W_Q6_K ? 208 : 0;
                    const int n16 = t == AKV_OPS_W_Q4_1 || t == AKV_OPS_W_Q5_1 || t == AKV_OPS_W_Q4_K ||
                                            t == AKV_OPS_W_Q5_K
                                        ? 2
                                        : 1;
                    for (int f = 0; f < n16; f++) {
                        const float v = test_rand_f32(&rng) * (b % 3 ? 0.02f : 2.0f);
                        const uint16_t h = akv_f32_to_f16(v);
                        blk[at + 2 * f] = (uint8_t)h, blk[at + 2 * f + 1] = (uint8_t)(h >> 8);
                    }
                }
                for (size_t j = 0; j < n; j++) {
                    if (!CHECK(akv_gguf_dequant_f32(types[ti].gguf, w + j * rb, k, wrow) == AKV_OK)) break;
                    for (size_t i = 0; i < k; i++) w64[j * k + i] = wrow[i];
                    /* the recipe's own decoding gives GGUF's values, bit for bit */
                    akv_ops_wrow_to_f32(t, w + j * rb, k, y1dec);
                    CHECK_BYTES(y1dec, wrow, k * sizeof *wrow);
                }
                float *x = rand_vec(&rng, m * k, 3);
                void *xmem = akv__malloc(akv_ops_q8_bytes(m, k));
                akv_ops_q8 xq;
                akv_ops_q8_bind(xmem, m, k, &xq);
                akv_ops_quantize_rows_q8(x, m, k, &xq, AKV_OPS_ISA_AUTO);
                float *yp = akv__malloc(m * n * 4), *ya = akv__malloc(m * n * 4), *y1 = akv__malloc(n * 4);
                akv_ops_qmatmul_cols(yp, &xq, m, w, t, NULL, n, k, 0, n, AKV_OPS_ISA_PORTABLE);
                /* in two column ranges, on the best instruction set */
                akv_ops_qmatmul_cols(ya, &xq, m, w, t, NULL, n, k, 0, n / 2, AKV_OPS_ISA_AUTO);
                akv_ops_qmatmul_cols(ya, &xq, m, w, t, NULL, n, k, n / 2, n, AKV_OPS_ISA_AUTO);
                if (memcmp(yp, ya, m * n * 4)) printf("  %s m %zu n %zu k %zu\n", akv_ops_wtype_name(t), m, n, k);
                CHECK_BYTES(yp, ya, m * n * 4);
                /* every other instruction set this CPU has gives the same bits (AVX2 where AUTO
                 * is AVX-512 VNNI) */
                for (int isa = AKV_OPS_ISA_AVX2; isa <= AKV_OPS_ISA_AVX512_VNNI; isa++) {
                    if (akv_ops_isa_resolve((akv_ops_isa)isa) != (akv_ops_isa)isa) continue;
                    akv_ops_qmatmul_cols(ya, &xq, m, w, t, NULL, n, k, 0, n, (akv_ops_isa)isa);
                    CHECK_BYTES(yp, ya, m * n * 4);
                }
                int bad = 0;
                for (size_t r = 0; r < m; r++) {
                    /* the row alone: a batch of one */
                    const akv_ops_q8 x1 = akv_ops_q8_row(&xq, k, r);
                    akv_ops_qmatmul_cols(y1, &x1, 1, w, t, NULL, n, k, 0, n, AKV_OPS_ISA_AUTO);
                    CHECK_BYTES(y1, yp + r * n, n * 4);
                    for (size_t j = 0; j < n; j++) {
                        double ref = 0, bound = 0, mag = 0;
                        for (size_t b = 0; b < nb; b++) {
                            double wabs = 0;
                            for (size_t i = 0; i < 32; i++) {
                                const double wv = w64[j * k + b * 32 + i], xv = x[r * k + b * 32 + i];
                                ref += wv * xv, wabs += fabs(wv), mag += fabs(wv * xv);
                            }
                            bound += xq.d[r * nb + b] * 0.5 * wabs; /* |x - dq(x)| <= d / 2 */
                        }
                        const double err = fabs(yp[r * n + j] - ref);
                        if (!(err <= bound * 1.001 + 1e-6 * (double)nb * (mag + bound) + 1e-30) && bad++ < 3)
                            printf("  %s m %zu n %zu k %zu y[%zu][%zu] = %.9g, f64 %.9g, bound %.3g\n",
                                   akv_ops_wtype_name(t), m, n, k, r, j, yp[r * n + j], ref, bound);
                    }
                }
                CHECK_EQ_INT(bad, 0);
                akv__free(w), akv__free(w64), akv__free(wrow), akv__free(y1dec), akv__free(x), akv__free(yp);
                akv__free(ya), akv__free(y1), akv__free(xmem);
            }
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q8_0, 64), 68);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q4_0, 32), 18);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q4_1, 32), 20);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q5_0, 64), 44);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q5_1, 32), 24);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q4_K, 512), 288);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q5_K, 256), 176);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q6_K, 256), 210);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_F32, 3), 12);
        CHECK_EQ_U64(akv_ops_wrow_bytes(AKV_OPS_W_Q4_K, 32), 0); /* not a whole super-block */
        CHECK_EQ_U64(akv_ops_wrow_bytes((akv_ops_wtype)99, 32), 0);
    }

    CHECK_EQ_INT(akv__alloc_live(), 0);
    return test_finish();
}
