/* test_sample.c — the sampling chain: greedy, each filter, penalties, seeds, bad input. */
#include "test.h"

#include <math.h>
#include <stdlib.h>

#include "akv/forward.h"
#include "akv/forward_ops.h"
#include "akv/log.h"
#include "akv/sample.h"
#include "core/alloc.h"
#include "core/assert.h"

static akv_sample_params params_off(void) { /* every filter off, temp 1 */
    return (akv_sample_params){.temp = 1, .top_k = 0, .top_p = 1, .min_p = 0,
                               .repeat_penalty = 1, .repeat_last_n = 0, .seed = 1};
}

/* Draws `n` tokens and counts them into hist[n_vocab]. */
static void draw(akv_sampler *s, const float *lg, int n, int *hist) {
    for (int i = 0; i < n; i++) {
        int32_t t = -1;
        if (akv_sampler_sample(s, lg, &t) == AKV_OK) hist[t]++;
    }
}

/* The ids of the k first of lg[n] in the sampler's order (logit descending, then id), NaN and
 * -inf left out; returns how many (fewer than k when fewer are finite). */
static int first_k(const float *lg, int n, int k, int *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(lg[i]) || lg[i] == -INFINITY) continue;
        int j = m++;
        while (j > 0 && (lg[out[j - 1]] < lg[i])) out[j] = out[j - 1], j--; /* stable: ids rise */
        out[j] = i;
    }
    return m < k ? m : k;
}

/* The two-sample chi-square statistic of equal draws a and b over n categories (those with at
 * least 10 draws together; the rest pooled into one), and its degrees of freedom. */
static double chi2_two(const int *a, const int *b, int n, int *df) {
    double x = 0;
    int cats = 0, pa = 0, pb = 0;
    for (int i = 0; i < n; i++) {
        if (a[i] + b[i] < 10) {
            pa += a[i], pb += b[i];
            continue;
        }
        x += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
        cats++;
    }
    if (pa + pb > 0) x += (double)(pa - pb) * (pa - pb) / (pa + pb), cats++;
    *df = cats > 1 ? cats - 1 : 1;
    return x;
}

/* Far in the tail of chi-square with df degrees of freedom (Wilson-Hilferty at z = 5.3, a
 * chance below 1e-7 for equal laws). */
static double chi2_far(int df) {
    const double k = df, z = 5.3, c = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
    return k * c * c * c;
}

/* Draws by the host sampler and by the device's law (akv_sampler_draw_row with the reference
 * op, what the host backend runs) from one sampler's parameters over the same logits, after the
 * same accepted history; `b_temp` != 0 gives the second another temperature (the negative
 * control). Returns the chi-square statistic over the draws, *df its degrees of freedom. */
static double law_compare(const akv_sample_params *sp, const float *lg, int n, int draws,
                          float b_temp, int *df) {
    akv_sampler *a = NULL, *b = NULL;
    akv_sample_params pb = *sp;
    pb.seed = sp->seed + 77;
    if (b_temp) pb.temp = b_temp;
    int *ha = akv__calloc((size_t)n, sizeof *ha), *hb = akv__calloc((size_t)n, sizeof *hb);
    float *row = akv__malloc((size_t)n * sizeof *row);
    int32_t ids[AKV_FORWARD_SAMPLE_PEN_MAX], counts[AKV_FORWARD_SAMPLE_PEN_MAX];
    double x = -1;
    if (!REQUIRE_OK(akv_sampler_create(sp, n, &a)) || !REQUIRE_OK(akv_sampler_create(&pb, n, &b)) || !ha ||
        !hb || !row)
        goto out;
    for (int i = 0; i < 12; i++) { /* a history with repeats: the penalties' counts differ */
        CHECK_OK(akv_sampler_accept(a, (i * 37) % 5 * 11 % n));
        CHECK_OK(akv_sampler_accept(b, (i * 37) % 5 * 11 % n));
    }
    draw(a, lg, draws, ha);
    for (int d = 0; d < draws; d++) {
        akv_fwd_sample_row r;
        if (!REQUIRE_OK(akv_sampler_draw_row(b, &r, ids, counts, AKV_FORWARD_SAMPLE_PEN_MAX))) break;
        memcpy(row, lg, (size_t)n * sizeof *row);
        akv_fwd_sample_row again;
        CHECK_OK(akv_sampler_draw_row(b, &again, ids, counts, AKV_FORWARD_SAMPLE_PEN_MAX));
        CHECK(again.u == r.u); /* not spent until done */
        akv_sampler_draw_done(b);
        const int32_t t = akv_fwd_sample_ref(&r, ids, counts, row, (uint32_t)n);
        if (!CHECK(t >= 0 && t < n)) break;
        hb[t]++;
    }
    x = chi2_two(ha, hb, n, df);
out:
    akv_sampler_destroy(a), akv_sampler_destroy(b);
    akv__free(ha), akv__free(hb), akv__free(row);
    return x;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    const float lg[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.9f};

    TEST_CASE(top_k_selects_as_a_full_sort_would) {
        /* top-k on logits of awkward sizes, with ties, NaN and -inf, draws exactly what the
         * unfiltered chain draws from the same logits with all but those k masked to -inf */
        static const int sizes[] = {2, 3, 7, 64, 1000, 4099, 49152};
        uint64_t x = 12345;
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            const int n = sizes[si];
            float *v = malloc((size_t)n * sizeof *v), *masked = malloc((size_t)n * sizeof *v);
            int *ids = malloc((size_t)n * sizeof *ids);
            CHECK(v && masked && ids);
            const int ks[] = {1, 2, 3, 40, n - 1};
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                const int k = ks[ki];
                if (k < 1 || k >= n) continue;
                for (int i = 0; i < n; i++) {
                    x = x * 6364136223846793005ull + 1442695040888963407ull;
                    unsigned r = (unsigned)(x >> 33);
                    v[i] = (float)(r % 13) * 0.5f - 3.0f; /* few values: many ties */
                    if (r % 97 == 0) v[i] = NAN;
                    if (r % 89 == 0) v[i] = -INFINITY;
                }
                int m = first_k(v, n, k, ids);
                for (int i = 0; i < n; i++) masked[i] = -INFINITY;
                for (int i = 0; i < m; i++) masked[ids[i]] = v[ids[i]];
                akv_sample_params p = params_off();
                p.temp = 0.8f, p.top_p = 0.9f, p.min_p = 0.02f, p.seed = (uint64_t)(n + k);
                akv_sampler *a, *b;
                p.top_k = k;
                CHECK_OK(akv_sampler_create(&p, n, &a));
                p.top_k = 0;
                CHECK_OK(akv_sampler_create(&p, n, &b));
                for (int d = 0; d < 64; d++) {
                    int32_t ta = -1, tb = -2;
                    CHECK_OK(akv_sampler_sample(a, v, &ta));
                    CHECK_OK(akv_sampler_sample(b, masked, &tb));
                    CHECK_EQ_INT(ta, tb);
                }
                akv_sampler_destroy(a);
                akv_sampler_destroy(b);
            }
            free(v);
            free(masked);
            free(ids);
        }
    }

    TEST_CASE(greedy_ties_to_smaller_id) {
        akv_sample_params p = params_off();
        p.temp = 0;
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 6, &s));
        int32_t t;
        CHECK_OK(akv_sampler_sample(s, lg, &t));
        CHECK_EQ_INT(t, 1);
        akv_sampler_destroy(s);
    }

    TEST_CASE(the_passes_greedy_choice_is_the_samplers) {
        /* akv_fwd_argmax_ref (the pass's choice, AKV_FORWARD_LOGITS_ARGMAX) against the
         * sampler at temperature 0 over rows with ties, NaN and -inf, of awkward lengths */
        uint64_t rs = 77;
        const int ns[] = {1, 2, 3, 17, 97, 1000};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int rep = 0; rep < 50; rep++) {
                const int n = ns[k];
                float *row = akv__malloc((size_t)n * sizeof *row);
                for (int i = 0; i < n; i++) {
                    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                    const int v = (int)(rs >> 59); /* 0..31: few distinct values, many ties */
                    row[i] = v == 0 ? NAN : v == 1 ? -INFINITY : (float)(v % 7);
                }
                akv_sample_params p = params_off();
                p.temp = 0;
                akv_sampler *s;
                CHECK_OK(akv_sampler_create(&p, n, &s));
                int32_t t = -1;
                akv_log_set(NULL, NULL, AKV_LOG_OFF);
                const akv_status st = akv_sampler_sample(s, row, &t);
                akv_log_set(NULL, NULL, AKV_LOG_WARN);
                TEST_CHECK_(akv_fwd_argmax_ref(row, (uint32_t)n) == (st ? -1 : t), "n %d rep %d: %d vs %d",
                            n, rep, akv_fwd_argmax_ref(row, (uint32_t)n), st ? -1 : t);
                akv_sampler_destroy(s);
                akv__free(row);
            }
    }

    TEST_CASE(top_k_limits_support) {
        akv_sample_params p = params_off();
        p.top_k = 2;
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 6, &s));
        int hist[6] = {0};
        draw(s, lg, 2000, hist);
        CHECK_EQ_INT(hist[0] + hist[3] + hist[4] + hist[5], 0);
        CHECK(hist[1] > 800 && hist[2] > 800); /* two equal logits: about half each */
        akv_sampler_destroy(s);
    }

    TEST_CASE(distribution_matches_softmax) {
        akv_sample_params p = params_off();
        p.temp = 2.0f;
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 6, &s));
        int hist[6] = {0};
        const int n = 200000;
        draw(s, lg, n, hist);
        double z = 0, pr[6];
        for (int i = 0; i < 6; i++) z += pr[i] = exp(lg[i] / 2.0);
        for (int i = 0; i < 6; i++) CHECK_NEAR((double)hist[i] / n, pr[i] / z, 0.01);
        akv_sampler_destroy(s);
    }

    TEST_CASE(top_p_and_min_p) {
        /* probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 at temp 1 */
        const float l2[5] = {logf(8), logf(4), logf(2), 0, 0};
        akv_sample_params p = params_off();
        p.top_p = 0.7f; /* 0.5 + 0.25 >= 0.7: two kept */
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 5, &s));
        int hist[5] = {0};
        draw(s, l2, 3000, hist);
        CHECK_EQ_INT(hist[2] + hist[3] + hist[4], 0);
        CHECK(hist[0] > hist[1] && hist[1] > 0);
        akv_sampler_destroy(s);
        p = params_off();
        p.min_p = 0.2f; /* keeps p >= 0.1: three kept */
        CHECK_OK(akv_sampler_create(&p, 5, &s));
        int h2[5] = {0};
        draw(s, l2, 3000, h2);
        CHECK_EQ_INT(h2[3] + h2[4], 0);
        CHECK(h2[2] > 0);
        akv_sampler_destroy(s);
    }

    TEST_CASE(repetition_penalty) {
        akv_sample_params p = params_off();
        p.temp = 0;
        p.repeat_penalty = 2.0f;
        p.repeat_last_n = 2;
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 6, &s));
        int32_t t;
        CHECK_OK(akv_sampler_accept(s, 1));
        CHECK_OK(akv_sampler_accept(s, 1)); /* a repeated token is penalised once */
        CHECK_OK(akv_sampler_sample(s, lg, &t));
        CHECK_EQ_INT(t, 2); /* 3/2 = 1.5 < 3.0 */
        CHECK_OK(akv_sampler_accept(s, 2));
        CHECK_OK(akv_sampler_accept(s, 5)); /* window of 2: token 1 is out again, 2 and 5 in */
        CHECK_OK(akv_sampler_sample(s, lg, &t));
        CHECK_EQ_INT(t, 1);
        CHECK_STATUS(akv_sampler_accept(s, 6), AKV_EINVAL);
        akv_sampler_destroy(s);
    }

    TEST_CASE(presence_and_frequency_penalties) {
        /* logits 5, 4.8, 4 (and lower), history {0, 0, 1}: each penalty alone and together
         * moves the greedy choice where the arithmetic says */
        const float l3[4] = {5.0f, 4.8f, 4.0f, -1.0f};
        const struct { float presence, frequency, repeat; int32_t want; } cases[] = {
            {0.0f, 0.0f, 1.0f, 0},  /* off */
            {0.5f, 0.0f, 1.0f, 0},  /* 4.5, 4.3, 4.0 */
            {0.0f, 0.7f, 1.0f, 1},  /* 3.6, 4.1, 4.0 */
            {0.5f, 0.5f, 1.0f, 2},  /* 3.5, 3.8, 4.0 */
            {-2.0f, 0.0f, 1.0f, 0}, /* a negative penalty favours what was seen */
            /* with the repetition penalty too: 5/2 - 0.5 - 2*0.1 = 1.8, 4.8/2 - 0.6 = 1.8, 4 */
            {0.5f, 0.1f, 2.0f, 2},
        };
        for (size_t i = 0; i < AKV_ARRAY_LEN(cases); i++) {
            akv_sample_params p = params_off();
            p.temp = 0, p.repeat_last_n = 8, p.repeat_penalty = cases[i].repeat;
            p.presence_penalty = cases[i].presence, p.frequency_penalty = cases[i].frequency;
            akv_sampler *s;
            CHECK_OK(akv_sampler_create(&p, 4, &s));
            CHECK_OK(akv_sampler_accept(s, 0));
            CHECK_OK(akv_sampler_accept(s, 0));
            CHECK_OK(akv_sampler_accept(s, 1));
            int32_t t = -1;
            CHECK_OK(akv_sampler_sample(s, l3, &t));
            TEST_CHECK_(t == cases[i].want, "presence %g frequency %g repeat %g: token %d, want %d",
                        cases[i].presence, cases[i].frequency, cases[i].repeat, t, cases[i].want);
            akv_sampler_destroy(s);
        }
    }

    TEST_CASE(seed_reproducible) {
        akv_sample_params p = akv_sample_default_params();
        p.seed = 42;
        akv_sampler *a, *b;
        CHECK_OK(akv_sampler_create(&p, 6, &a));
        CHECK_OK(akv_sampler_create(&p, 6, &b));
        int same = 1;
        for (int i = 0; i < 100; i++) {
            int32_t x, y;
            akv_sampler_sample(a, lg, &x);
            akv_sampler_sample(b, lg, &y);
            same &= x == y;
        }
        CHECK(same);
        akv_sampler_destroy(a);
        akv_sampler_destroy(b);
    }

    TEST_CASE(nan_and_inf_never_chosen) {
        const float l3[3] = {NAN, -INFINITY, -5.0f};
        akv_sample_params p = params_off();
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 3, &s));
        int32_t t = -1;
        CHECK_OK(akv_sampler_sample(s, l3, &t));
        CHECK_EQ_INT(t, 2);
        const float l4[3] = {NAN, -INFINITY, NAN};
        CHECK_STATUS(akv_sampler_sample(s, l4, &t), AKV_EINVAL);
        akv_sampler_destroy(s);
    }

    TEST_CASE(plus_inf_takes_all_the_mass) {
        /* +inf logits are the limit of softmax: they share every draw, evenly, whatever the
         * filters (the sampler once returned the least likely token: a NaN sum) */
        const float li[4] = {INFINITY, 5.0f, INFINITY, -3.0f};
        for (int cfg = 0; cfg < 3; cfg++) {
            akv_sample_params p = params_off();
            if (cfg == 1) p.top_p = 0.9f;
            if (cfg == 2) p.min_p = 0.5f;
            akv_sampler *s;
            CHECK_OK(akv_sampler_create(&p, 4, &s));
            int hist[4] = {0};
            draw(s, li, 2000, hist);
            CHECK(hist[1] == 0 && hist[3] == 0);
            CHECK(hist[0] > 800 && hist[2] > 800);
            akv_sampler_destroy(s);
        }
    }

    TEST_CASE(penalty_keeps_finite_logits_finite) {
        /* a penalty below 1 on 3e38 would overflow to +inf, one of 1e38 on -4 to -inf */
        const float big[3] = {3e38f, 5.0f, -3.0f};
        akv_sample_params p = params_off();
        p.repeat_penalty = 0.5f;
        p.repeat_last_n = 4;
        akv_sampler *s;
        CHECK_OK(akv_sampler_create(&p, 3, &s));
        CHECK_OK(akv_sampler_accept(s, 0));
        int hist[3] = {0};
        draw(s, big, 500, hist);
        CHECK_EQ_INT(hist[0], 500); /* still by far the most likely: FLT_MAX */
        akv_sampler_destroy(s);
        const float neg[2] = {-4.0f, -5.0f};
        p.repeat_penalty = 1e38f;
        CHECK_OK(akv_sampler_create(&p, 2, &s));
        CHECK_OK(akv_sampler_accept(s, 0));
        CHECK_OK(akv_sampler_accept(s, 1));
        int32_t t = -1;
        CHECK_OK(akv_sampler_sample(s, neg, &t)); /* both -FLT_MAX, not -inf: still a token */
        CHECK(t == 0 || t == 1);
        akv_sampler_destroy(s);
    }

    TEST_CASE(bad_params) {
        akv_sampler *s = NULL;
        akv_sample_params p = params_off();
        p.temp = -1;
        CHECK_STATUS(akv_sampler_create(&p, 6, &s), AKV_EINVAL);
        p = params_off();
        p.top_p = 0;
        CHECK_STATUS(akv_sampler_create(&p, 6, &s), AKV_EINVAL);
        p = params_off();
        p.min_p = 1;
        CHECK_STATUS(akv_sampler_create(&p, 6, &s), AKV_EINVAL);
        p = params_off();
        p.presence_penalty = NAN;
        CHECK_STATUS(akv_sampler_create(&p, 6, &s), AKV_EINVAL);
        p = params_off();
        p.frequency_penalty = INFINITY;
        CHECK_STATUS(akv_sampler_create(&p, 6, &s), AKV_EINVAL);
        p = params_off();
        CHECK_STATUS(akv_sampler_create(&p, 0, &s), AKV_EINVAL);
        CHECK(s == NULL);
    }

    TEST_CASE(device_draws_follow_the_samplers_law) {
        /* The device's draw (akv/fwd_sample.h: pivots, fixed-point weights, the walk by id)
         * against the host sampler: equal in law under each stage of the chain, ties at the
         * top and at the k-th included; and a temperature 0.8 against 0.9 is told apart. */
        enum { N = 300, DRAWS = 40000 };
        float lgd[N];
        uint64_t r = 99;
        for (int i = 0; i < N; i++) lgd[i] = 3.0f * test_rand_f32(&r);
        lgd[10] = lgd[20] = 4.5f;                 /* a tie at the top */
        lgd[30] = lgd[31] = lgd[32] = lgd[33] = 3.5f; /* ties at the 3rd to 6th */
        lgd[40] = NAN, lgd[41] = -INFINITY;
        akv_sample_params sets[] = {
            {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.3f,
             .presence_penalty = 0.4f, .frequency_penalty = 0.3f, .repeat_last_n = 64, .seed = 5},
            {.temp = 1.5f, .top_p = 0.8f, .repeat_penalty = 1, .repeat_last_n = 64, .seed = 6},
            {.temp = 0.7f, .top_k = 5, .top_p = 1, .repeat_penalty = 1, .seed = 7},
            {.temp = 1.2f, .top_p = 1, .min_p = 0.2f, .repeat_penalty = 1, .seed = 8},
            {.temp = 1, .top_p = 1, .repeat_penalty = 1, .seed = 9},
        };
        for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
            int df = 0;
            const double x = law_compare(&sets[i], lgd, N, DRAWS, 0, &df);
            printf("  set %zu: chi-square %.1f, %d degrees of freedom (bound %.1f)\n", i, x, df, chi2_far(df));
            TEST_CHECK_(x >= 0 && x < chi2_far(df), "set %zu: chi-square %.1f with %d degrees of freedom (bound %.1f)",
                        i, x, df, chi2_far(df));
        }
        int df = 0;
        const double x = law_compare(&sets[4], lgd, N, DRAWS, 0.9f, &df);
        printf("  temperature 1 against 0.9: chi-square %.1f, %d degrees of freedom (bound %.1f)\n", x, df, chi2_far(df));
        TEST_CHECK_(x > chi2_far(df), "temperature 1 against 0.9: chi-square %.1f with %d degrees of freedom "
                    "(bound %.1f) did not tell them apart", x, df, chi2_far(df));
        /* -0 and +0 are equal in the order (then by id), as in the host sampler's */
        float zeros[4] = {-0.0f, 0.0f, -INFINITY, -INFINITY};
        const akv_fwd_sample_row top1 = {.temp = 1, .top_k = 1, .top_p = 1, .repeat_penalty = 1, .u = 0.5};
        CHECK_EQ_INT(akv_fwd_sample_ref(&top1, NULL, NULL, zeros, 4), 0);
        /* a greedy sampler has no draw; a history of more distinct tokens than the room */
        akv_sample_params g = params_off();
        g.temp = 0;
        akv_sampler *s = NULL;
        akv_fwd_sample_row row;
        int32_t ids[4], counts[4];
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        if (REQUIRE_OK(akv_sampler_create(&g, N, &s))) {
            CHECK_STATUS(akv_sampler_draw_row(s, &row, ids, counts, 4), AKV_EINVAL);
            akv_sampler_destroy(s);
        }
        g = params_off();
        g.repeat_penalty = 1.2f, g.repeat_last_n = 16;
        if (REQUIRE_OK(akv_sampler_create(&g, N, &s))) {
            for (int i = 0; i < 5; i++) CHECK_OK(akv_sampler_accept(s, i));
            CHECK_STATUS(akv_sampler_draw_row(s, &row, ids, counts, 4), AKV_EFULL);
            CHECK_OK(akv_sampler_accept(s, 0));
            CHECK_STATUS(akv_sampler_draw_row(s, &row, ids, counts, 4), AKV_EFULL);
            int32_t ids5[5], counts5[5];
            CHECK_OK(akv_sampler_draw_row(s, &row, ids5, counts5, 5));
            ids[0] = ids5[0], counts[0] = counts5[0];
            CHECK(row.pen_n == 5 && ids[0] == 0 && counts[0] == 2 && row.u >= 0 && row.u < 1);
            akv_sampler_destroy(s);
        }
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
    TEST_CASE(alloc_failure_each_site) {
        akv_sample_params p = akv_sample_default_params();
        int64_t live0 = akv__alloc_live();
        for (uint64_t nth = 1; nth < 10; nth++) {
            akv_sampler *s = NULL;
            akv__alloc_fail_nth(nth);
            akv_status st = akv_sampler_create(&p, 100, &s);
            int fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                akv_sampler_destroy(s);
                break;
            }
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK(s == NULL);
            CHECK_EQ_INT(akv__alloc_live(), live0);
        }
    }
    return test_finish();
}
