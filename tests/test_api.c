/* test_api.c — the OpenAI layer's arithmetic (server/api.h): a token's log-probability and the
 * most likely tokens, against a float64 oracle (a sorted copy and a long double log-sum-exp)
 * on random rows of awkward sizes, with ties, -inf (a masked token) and large magnitudes. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

typedef struct ranked {
    float v;
    int32_t id;
} ranked;

static int by_rank(const void *a, const void *b) { /* larger first; a tie: the lower id first */
    const ranked *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    TEST_CASE(token_logprobs_match_a_float64_oracle) {
        uint64_t rng = test_seed(11);
        static const uint32_t sizes[] = {1, 2, 3, 7, 20, 21, 97, 1000, 4099, 49152};
        for (int round = 0; round < 400; round++) {
            const uint32_t n = sizes[test_rand_below(&rng, sizeof sizes / sizeof sizes[0])];
            float *l = malloc(n * sizeof *l);
            ranked *r = malloc(n * sizeof *r);
            const float scale = (float)(1 + test_rand_below(&rng, 4) * 30); /* up to +-91 */
            for (uint32_t i = 0; i < n; i++) {
                l[i] = scale * test_rand_f32(&rng);
                if (test_rand_below(&rng, 5) == 0) l[i] = roundf(l[i]); /* ties */
                if (n > 1 && test_rand_below(&rng, 9) == 0) l[i] = -INFINITY; /* masked */
            }
            l[test_rand_below(&rng, n)] = scale; /* at least one finite */
            long double m = -INFINITY, sum = 0;
            for (uint32_t i = 0; i < n; i++) m = l[i] > m ? l[i] : m;
            for (uint32_t i = 0; i < n; i++) sum += expl((long double)l[i] - m);
            const long double lse = m + logl(sum);
            for (uint32_t i = 0; i < n; i++) r[i] = (ranked){l[i], (int32_t)i};
            qsort(r, n, sizeof *r, by_rank);
            const uint32_t k = (uint32_t)test_rand_below(&rng, AKV_API_MAX_TOP_LOGPROBS + 3);
            const int32_t token = (int32_t)test_rand_below(&rng, n);
            float lp, top_lp[AKV_API_MAX_TOP_LOGPROBS];
            int32_t top_id[AKV_API_MAX_TOP_LOGPROBS];
            akv_api_token_logprobs(l, n, token, k, &lp, top_id, top_lp);
            const long double want = (long double)l[token] - lse;
            if (isinf((double)want)) TEST_CHECK_(isinf(lp) && lp < 0, "a masked token: %g", (double)lp);
            else
                TEST_CHECK_(fabsl((long double)lp - want) <= 1e-6L * (1 + fabsl(want)),
                            "n %u: token %d's log-probability %.9g, the oracle's %.9Lg", n, token,
                            (double)lp, want);
            uint32_t kk = k < AKV_API_MAX_TOP_LOGPROBS ? k : AKV_API_MAX_TOP_LOGPROBS;
            if (kk > n) kk = n;
            for (uint32_t j = 0; j < kk; j++) {
                if (!TEST_CHECK_(top_id[j] == r[j].id, "n %u, k %u: rank %u is %d, the oracle's %d",
                                 n, k, j, top_id[j], r[j].id))
                    break;
                const long double w = (long double)r[j].v - lse;
                TEST_CHECK_(isinf((double)w) ? isinf(top_lp[j]) : fabsl((long double)top_lp[j] - w) <= 1e-6L * (1 + fabsl(w)),
                            "rank %u: %.9g, the oracle's %.9Lg", j, (double)top_lp[j], w);
                if (j) CHECK(top_lp[j] <= top_lp[j - 1]);
            }
            free(l), free(r);
        }
    }
    return test_finish();
}
