/* test_geom.c — geometry: derived sizes, the automatic tokens-per-page rule, bad input. */
#include "test.h"

#include <math.h>

#include "akv/geom.h"
#include "akv/log.h"
#include "core/assert.h"

/* Reference for the automatic rule in floating point: the power of two whose page size is
 * closest to 256 KiB in log2 terms, ties down, clamped. Independent of the integer method. */
static uint32_t ref_auto(size_t token_bytes) {
    double best_d = INFINITY;
    uint32_t best = 1;
    for (uint32_t p = 1; p <= (1u << 20); p *= 2) {
        double d = fabs(log2((double)token_bytes * p) - 18.0);
        if (d < best_d - 1e-12) best_d = d, best = p; /* strictly closer: ties keep the lower */
    }
    if (best < 16) best = 16;
    if (best > 1024) best = 1024;
    return best;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* bad-input cases log by design */

    TEST_CASE(known_models) {
        static const struct {
            const char *name;
            uint32_t n_layers, n_kv_heads, head_dim, want_p;
            size_t want_token_bytes, want_page_bytes;
            uint64_t tokens, want_pages;
        } cases[] = {
            {"Llama-3-8B", 32, 8, 128, 64, 4096, 256 << 10, 131072, 2048},
            {"SmolLM2-135M", 30, 3, 64, 256, 768, 192 << 10, 131072, 512},
        };
        for (size_t i = 0; i < AKV_ARRAY_LEN(cases); i++) {
            akv_geom g;
            printf("  %s\n", cases[i].name);
            CHECK_OK(akv_geom_init(&g, cases[i].n_layers, cases[i].n_kv_heads, cases[i].head_dim,
                                   AKV_DTYPE_BF16, 0));
            CHECK_EQ_INT(g.page_tokens, cases[i].want_p);
            CHECK_EQ_U64(akv_geom_token_bytes(&g), cases[i].want_token_bytes);
            CHECK_EQ_U64(akv_geom_page_bytes(&g), cases[i].want_page_bytes);
            CHECK_EQ_U64(akv_geom_row_pitch(&g), (uint64_t)cases[i].want_p * cases[i].head_dim);
            CHECK_EQ_U64(akv_geom_pages_for_tokens(&g, cases[i].tokens), cases[i].want_pages);
            CHECK_EQ_U64(akv_geom_pages_for_tokens(&g, 0), 0);
            CHECK_EQ_U64(akv_geom_pages_for_tokens(&g, 1), 1);
            CHECK_EQ_U64(akv_geom_pages_for_tokens(&g, g.page_tokens), 1);
            CHECK_EQ_U64(akv_geom_pages_for_tokens(&g, g.page_tokens + 1), 2);
        }
    }

    TEST_CASE(auto_rule_matches_float_reference) {
        int n_bad = 0;
        for (size_t tb = 1; tb <= ((size_t)1 << 22) && n_bad < 5; tb = tb < 4096 ? tb + 1 : tb + tb / 97) {
            uint32_t got = akv_geom_auto_page_tokens(tb), want = ref_auto(tb);
            if (got != want) {
                n_bad++;
                CHECK_EQ_INT(got, want);
                printf("  token_bytes %zu\n", tb);
            }
        }
        CHECK_EQ_INT(n_bad, 0);
        /* either side of the log-scale midpoint: with 64 tokens, 2896 B/token gives a page
         * just below 2^17.5 (so 128 tokens is closer), 2897 B/token just above it */
        CHECK_EQ_INT(akv_geom_auto_page_tokens(2896), 128);
        CHECK_EQ_INT(akv_geom_auto_page_tokens(2897), 64);
        CHECK_EQ_INT(akv_geom_auto_page_tokens(1), 1024);  /* clamp high */
        CHECK_EQ_INT(akv_geom_auto_page_tokens(1 << 20), 16); /* clamp low */
    }

    TEST_CASE(override_page_tokens) {
        akv_geom g;
        CHECK_OK(akv_geom_init(&g, 2, 1, 8, AKV_DTYPE_F32, 16));
        CHECK_EQ_INT(g.page_tokens, 16);
        CHECK_EQ_U64(akv_geom_page_bytes(&g), 16 * 64);
        CHECK_OK(akv_geom_init(&g, 2, 1, 8, AKV_DTYPE_F32, 1));
        CHECK_EQ_U64(akv_geom_page_bytes(&g), 64);
        akv_geom before = g;
        CHECK_STATUS(akv_geom_init(&g, 2, 1, 8, AKV_DTYPE_F32, 3), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 2, 1, 8, AKV_DTYPE_F32, 1u << 17), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 2, 1, 8, AKV_DTYPE_F32, 96), AKV_EINVAL);
        CHECK(memcmp(&g, &before, sizeof g) == 0); /* all-or-nothing */
    }

    TEST_CASE(check_of_a_given_geometry) {
        akv_geom g, z = {0};
        CHECK_OK(akv_geom_init(&g, 32, 8, 128, AKV_DTYPE_BF16, 64));
        CHECK_OK(akv_geom_check(&g));
        CHECK_STATUS(akv_geom_check(NULL), AKV_EINVAL);
        CHECK_STATUS(akv_geom_check(&z), AKV_EINVAL);
        akv_geom bad = g;
        bad.page_tokens = 48; /* not a power of two */
        CHECK_STATUS(akv_geom_check(&bad), AKV_EINVAL);
        bad = g;
        bad.n_kv_heads = 0;
        CHECK_STATUS(akv_geom_check(&bad), AKV_EINVAL);
    }
    TEST_CASE(bad_values) {
        akv_geom g = {0};
        CHECK_STATUS(akv_geom_init(&g, 0, 8, 128, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 0, 128, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 8, 0, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 4097, 8, 128, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 1025, 128, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 8, 4097, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 8, 128, (akv_dtype)7, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(&g, 32, 8, 128, AKV_DTYPE_COUNT, 0), AKV_EINVAL);
        CHECK_STATUS(akv_geom_init(NULL, 32, 8, 128, AKV_DTYPE_BF16, 0), AKV_EINVAL);
        /* the largest shape: 32 MiB per token; automatic P = 16 gives 512 MiB pages (ok),
         * P = 64 would be 2 GiB, over the page limit */
        CHECK_OK(akv_geom_init(&g, 4096, 1024, 4096, AKV_DTYPE_F32, 0));
        CHECK_EQ_INT(g.page_tokens, 16);
        CHECK_EQ_U64(akv_geom_page_bytes(&g), (size_t)512 << 20);
        CHECK_STATUS(akv_geom_init(&g, 4096, 1024, 4096, AKV_DTYPE_F32, 64), AKV_EINVAL);
        CHECK_EQ_INT(g.page_tokens, 16); /* unchanged */
        CHECK_EQ_INT(g.n_layers, 4096);
    }
    return test_finish();
}
