/*
 * test_admit.c — the admission arithmetic: the published examples term by term, refuse and
 * shrink, the exact minimum settings it names, bad configurations, and the formula checked
 * against real pools (the histories it promises fit, one more does not).
 */
#include "test.h"

#include "akv/admit.h"
#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "pool_order.h"
#include "akv/host_table.h"
#include "akv/log.h"

static akv_admit_params params(uint32_t layers, uint32_t heads, uint32_t dim, uint64_t ctx,
                               uint32_t host_gib, uint32_t device_gib, uint32_t conc,
                               akv_admit_mode mode) {
    akv_admit_params p = {.max_context = ctx,
                          .host_gib = host_gib,
                          .device_gib = device_gib,
                          .concurrency = conc,
                          .mode = mode};
    akv_status st = akv_geom_init(&p.geom, layers, heads, dim, AKV_DTYPE_BF16, 0);
    CHECK_OK(st);
    return p;
}

static void test_examples(void) {
    TEST_CASE(smollm2_135m_128k) {
        akv_admit_params p = params(30, 3, 64, 131072, 32, 4, 8, AKV_ADMIT_REFUSE);
        akv_fit f;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_EQ_U64(f.page_bytes, 196608);
        CHECK_EQ_U64(f.pages_per_layer, 512);
        CHECK_EQ_U64(f.pages_per_history, 15360);
        CHECK_EQ_U64(f.history_bytes, 15360ull * 196608);
        CHECK_EQ_U64(f.host_pages, (32ull << 30) / 196608); /* 174762 */
        CHECK_EQ_U64(f.histories, 11);
        CHECK_EQ_INT(f.pages_per_arena, 1365);
        CHECK_EQ_INT(f.n_arenas, 129);
        CHECK_EQ_U64(f.device_pages, (4ull << 30) / 196608); /* 21845 */
        CHECK_EQ_U64(f.window_capacity, 21845 / 30);          /* 728 */
        CHECK_EQ_INT(f.concurrency, 8);
        CHECK_EQ_INT(f.floor, 2);
        CHECK_EQ_INT(f.target, 728 / 8);
        CHECK_EQ_INT(f.burst, 512 - 728 / 8);
        CHECK_STATUS(f.status, AKV_OK);
        CHECK(f.setting == NULL);
        char text[4096];
        size_t n = akv_fit_format(&f, text, sizeof text);
        CHECK(n < sizeof text && strlen(text) == n);
        CHECK(strstr(text, "histories = floor(174762 / 15360) = 11") != NULL);
        CHECK(strstr(text, "effective = min({=concurrency} 8, histories 11, floors 364) = 8") != NULL);
        printf("%s", text);
    }

    TEST_CASE(llama3_8b_128k_refuse_and_shrink) {
        akv_admit_params p = params(32, 8, 128, 131072, 64, 16, 8, AKV_ADMIT_REFUSE);
        akv_fit f;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_EQ_U64(f.page_bytes, 262144);
        CHECK_EQ_U64(f.pages_per_history, 65536); /* 16 GiB per history */
        CHECK_EQ_U64(f.history_bytes, 16ull << 30);
        CHECK_EQ_U64(f.host_pages, 262144);
        CHECK_EQ_U64(f.histories, 4);
        CHECK_EQ_INT(f.concurrency, 4);
        CHECK_STATUS(f.status, AKV_EFULL);
        CHECK_STR(f.setting, "host_gib");
        CHECK_EQ_INT(f.min_host_gib, 128);
        CHECK(strstr(f.verdict, "raise {=host_gib} to at least 128") != NULL);
        CHECK(strstr(f.verdict, "lower {=concurrency} to 4") != NULL);
        char text[4096];
        akv_fit_format(&f, text, sizeof text);
        printf("%s", text);
        p.mode = AKV_ADMIT_SHRINK;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_STATUS(f.status, AKV_OK);
        CHECK_EQ_INT(f.shrunk, 1);
        CHECK_EQ_INT(f.concurrency, 4);
        CHECK_EQ_INT(f.target, 512);
        CHECK_EQ_INT(f.burst, 1536);
        /* the minimum it names is exact: 128 fits, 127 does not */
        p.mode = AKV_ADMIT_REFUSE;
        p.host_gib = 128;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_STATUS(f.status, AKV_OK);
        CHECK_EQ_INT(f.concurrency, 8);
        p.host_gib = 127;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_STATUS(f.status, AKV_EFULL);
        CHECK_EQ_U64(f.histories, 7);
    }
}

static void test_refusals(void) {
    TEST_CASE(not_one_history) {
        for (int mode = 0; mode < 2; mode++) {
            akv_admit_params p = params(32, 8, 128, 131072, 15, 16, 1, (akv_admit_mode)mode);
            akv_fit f;
            CHECK_OK(akv_admit_fit(&p, &f));
            CHECK_STATUS(f.status, AKV_EFULL);
            CHECK_EQ_U64(f.histories, 0);
            CHECK_EQ_INT(f.concurrency, 0);
            CHECK_STR(f.setting, "host_gib");
            CHECK(strstr(f.verdict, "not even one") != NULL);
            CHECK(strstr(f.verdict, "at least 16") != NULL);
        }
    }

    TEST_CASE(device_floors) {
        /* 1 GiB device = 4096 pages / 32 layers = 128 window pages = 64 floors */
        akv_admit_params p = params(32, 8, 128, 131072, 2048, 1, 100, AKV_ADMIT_REFUSE);
        akv_fit f;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_EQ_U64(f.window_capacity, 128);
        CHECK_EQ_INT(f.max_floors, 64);
        CHECK_STATUS(f.status, AKV_EFULL);
        CHECK_STR(f.setting, "device_gib");
        CHECK_EQ_INT(f.min_device_gib, 2); /* 100 * 2 * 32 pages of 256 KiB = 1.56 GiB */
        p.device_gib = 2;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_STATUS(f.status, AKV_OK);
        CHECK_EQ_INT(f.target, 2);
        p.device_gib = 1;
        p.mode = AKV_ADMIT_SHRINK;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_STATUS(f.status, AKV_OK);
        CHECK_EQ_INT(f.concurrency, 64);
        CHECK_EQ_INT(f.target, 2);
        /* staging eats the window: less than one floor is refused in either mode */
        p.staging_pages = 4096 - 63;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_EQ_U64(f.window_capacity, 1);
        CHECK_STATUS(f.status, AKV_EFULL);
        CHECK_STR(f.setting, "device_gib");
    }

    TEST_CASE(bad_configurations) {
        akv_admit_params good = params(32, 8, 128, 131072, 64, 16, 4, AKV_ADMIT_REFUSE);
        akv_fit f;
        memset(&f, 0x5a, sizeof f);
        akv_admit_params p = good;
        memset(&p.geom, 0, sizeof p.geom);
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL); /* uninitialised geometry */
        p = good, p.max_context = 0;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.max_context = 64ull * INT32_MAX + 1; /* more pages than int32 */
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.concurrency = 0;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.host_gib = 0;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.host_gib = AKV_HOST_POOL_MAX_GIB + 1;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.device_gib = 0;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.staging_pages = 16 * 4096 + 1;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.arena_bytes = 1000; /* holds no page */
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        p = good, p.mode = (akv_admit_mode)7;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EINVAL);
        CHECK_STATUS(akv_admit_fit(NULL, &f), AKV_EINVAL);
        /* an overflowing product: 2^31 pages x 4096 layers x 512 MiB pages */
        p = good;
        CHECK_OK(akv_geom_init(&p.geom, 4096, 1024, 4096, AKV_DTYPE_F32, 16));
        p.max_context = 16ull * INT32_MAX;
        p.arena_bytes = (size_t)512 << 20;
        CHECK_STATUS(akv_admit_fit(&p, &f), AKV_EOVERFLOW);
        unsigned char *b = (unsigned char *)&f;
        int untouched = 1;
        for (size_t i = 0; i < sizeof f; i++) untouched &= b[i] == 0x5a;
        CHECK(untouched); /* all-or-nothing */
    }
}

/* The fit against real pools: a geometry of 64 MiB pages (3 layers, 8 KiB per token,
 * P = 8192) so that 1 GiB holds 16 pages. */
static void test_truth(void) {
    TEST_CASE(formula_matches_the_pools) {
        akv_admit_params p = {.max_context = 2 * 8192 - 5, /* 2 pages per layer */
                              .host_gib = 1,
                              .arena_bytes = (size_t)128 << 20,
                              .device_gib = 1,
                              .staging_pages = 1,
                              .concurrency = 5,
                              .mode = AKV_ADMIT_SHRINK};
        CHECK_OK(akv_geom_init(&p.geom, 3, 8, 128, AKV_DTYPE_F32, 8192));
        akv_fit f;
        CHECK_OK(akv_admit_fit(&p, &f));
        CHECK_EQ_U64(f.pages_per_history, 6);
        CHECK_EQ_U64(f.host_pages, 16);
        CHECK_EQ_U64(f.histories, 2);
        CHECK_EQ_U64(f.window_capacity, 5);
        CHECK_EQ_INT(f.concurrency, 2);
        CHECK_EQ_INT(f.target, 2);
        CHECK_EQ_INT(f.burst, 0);
        akv_dev *dev = NULL;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &dev) == AKV_OK)) break;
        /* host: `histories` full-length tables fit, one more does not */
        akv_host_pool_params hp = {.limit_gib = p.host_gib, .arena_bytes = p.arena_bytes};
        akv_host_pool *hpool = NULL;
        CHECK_OK(akv_host_pool_create(dev, &p.geom, &hp, &hpool));
        akv_host_table *t[3] = {0};
        for (int i = 0; i < 3; i++) {
            CHECK_OK(akv_host_table_create(hpool, &t[i]));
            CHECK_STATUS(akv_host_table_grow(t[i], p.max_context),
                         (uint64_t)i < f.histories ? AKV_OK : AKV_EFULL);
        }
        /* device: `concurrency` contexts at full length all get their target at once; one
         * more in the same step is refused */
        akv_dev_pool_params dp = {.device_gib = p.device_gib, .staging_pages = p.staging_pages};
        akv_dev_pool *dpool = NULL;
        CHECK_OK(akv_dev_pool_create(dev, &p.geom, &dp, &dpool));
        akv_dev_pool_ctx *c[3] = {0};
        akv_dev_pool_req rq[3];
        akv_dev_pool_result rs[3];
        for (int i = 0; i < 3; i++) {
            akv_dev_pool_ctx_params cp = {.target = f.target, .burst = f.burst, .tag = (uint64_t)i};
            CHECK_OK(akv_dev_pool_ctx_open(dpool, &cp, &c[i]));
            rq[i] = (akv_dev_pool_req){.ctx = c[i], .n_tokens = p.max_context};
        }
        pool_orders(akv_dev_pool_geom(dpool), rq, f.concurrency);
        CHECK_OK(akv_dev_pool_step(dpool, rq, f.concurrency, rs));
        for (uint32_t i = 0; i < f.concurrency; i++) CHECK_EQ_INT(rs[i].window, f.target);
        akv_dev_pool_ctx_close(dpool, c[0]); /* start over with all three at once */
        akv_dev_pool_ctx_close(dpool, c[1]);
        akv_dev_pool_ctx_params cp = {.target = f.target, .burst = f.burst};
        CHECK_OK(akv_dev_pool_ctx_open(dpool, &cp, &c[0]));
        CHECK_OK(akv_dev_pool_ctx_open(dpool, &cp, &c[1]));
        rq[0].ctx = c[0], rq[1].ctx = c[1];
        pool_orders(akv_dev_pool_geom(dpool), rq, 3);
        CHECK_STATUS(akv_dev_pool_step(dpool, rq, 3, rs), AKV_EFULL);
        CHECK_STATUS(rs[2].status, AKV_EFULL);
        for (int i = 0; i < 3; i++) akv_dev_pool_ctx_close(dpool, c[i]);
        CHECK_OK(akv_dev_pool_destroy(dpool));
        for (int i = 0; i < 3; i++) CHECK_OK(akv_host_table_destroy(t[i]));
        CHECK_OK(akv_host_pool_destroy(hpool));
        CHECK_OK(akv_dev_destroy(dev));
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* bad configurations log by design */
    test_examples();
    test_refusals();
    test_truth();
    return test_finish();
}
