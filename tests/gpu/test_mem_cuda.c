/*
 * test_mem_cuda.c (gpu) — the memory layer on the CUDA backend: host pool arenas are real
 * pinned memory (cudaHostAlloc) whose byte count matches the device's accounting; the device
 * pool is one real allocation whose every page is reachable at base + id * page_bytes; a
 * window page and a staging page round-trip through host pages by synchronous copies.
 */
#include "test.h"

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "pool_order.h"
#include "akv/host_table.h"
#include "akv/log.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

int main(int argc, char **argv) {
    test_args(argc, argv);
#ifndef AKV_HAVE_CUDA
    test_skip("built without the CUDA backend");
#else
    akv_dev *dev = NULL;
    if (akv_dev_create(akv_dev_cuda_backend(), NULL, &dev) != AKV_OK)
        test_skip("no CUDA device answers on this machine");
    akv_geom g; /* Llama-3-8B: 256 KiB pages */
    if (akv_geom_init(&g, 32, 8, 128, AKV_DTYPE_BF16, 0) != AKV_OK) return 1;
    const size_t pb = akv_geom_page_bytes(&g);
    TEST_CASE(pools_on_the_device) {
        akv_host_pool_params hp = {.limit_gib = 2, .arena_bytes = 0}; /* 256 MiB arenas */
        akv_host_pool *hpool = NULL;
        akv_dev_pool_params dp = {.device_gib = 2, .staging_pages = 64};
        akv_dev_pool *dpool = NULL;
        if (!CHECK(akv_host_pool_create(dev, &g, &hp, &hpool) == AKV_OK)) break;
        if (!CHECK(akv_dev_pool_create(dev, &g, &dp, &dpool) == AKV_OK)) break;
        CHECK_EQ_U64(akv_dev_get_usage(dev).device_bytes, (size_t)2 << 30);
        /* a 5000-token context: 79 pages per layer x 32 layers = 2528 pages = 3 arenas */
        akv_host_table *t = NULL;
        CHECK_OK(akv_host_table_create(hpool, &t));
        CHECK_OK(akv_host_table_grow(t, 5000));
        akv_host_pool_stats hs;
        akv_host_pool_get_stats(hpool, &hs);
        CHECK_EQ_INT(hs.n_arenas, 3);
        CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, hs.pinned_bytes);
        CHECK_EQ_U64(hs.pinned_bytes, (size_t)3 * 1024 * pb);
        /* fill host pages with a pattern; place a window; copy its pages up and back */
        for (uint32_t l = 0; l < g.n_layers; l++)
            for (uint32_t k = 0; k < akv_host_table_n_pages(t); k++)
                memset(akv_host_pool_page_addr(hpool, akv_host_table_page(t, l, k)),
                       (int)((l * 131 + k) & 0xff), pb);
        akv_dev_pool_ctx *c = NULL;
        akv_dev_pool_ctx_params cp = {.target = 8, .burst = 0, .tag = 1};
        CHECK_OK(akv_dev_pool_ctx_open(dpool, &cp, &c));
        akv_dev_pool_req rq = {.ctx = c, .n_tokens = 5000};
        akv_dev_pool_result rs;
        pool_orders(akv_dev_pool_geom(dpool), &rq, 1);
        CHECK_OK(akv_dev_pool_step(dpool, &rq, 1, &rs));
        CHECK_EQ_INT(rs.window, 8);
        unsigned char *back = malloc(pb);
        int n_bad = 0;
        for (uint32_t l = 0; l < g.n_layers; l++) {
            for (uint32_t w = 0; w < rs.window; w++) {
                akv_dev_pool_slot s = akv_dev_pool_ctx_slot(dpool, c, l, w);
                void *h = akv_host_pool_page_addr(hpool, akv_host_table_page(t, l, s.logical));
                akv_dptr d = akv_dev_pool_page_addr(dpool, s.page_id);
                CHECK_OK(akv_dev_copy_h2d_sync(dev, d, h, pb));
                CHECK_OK(akv_dev_copy_d2h_sync(dev, back, d, pb));
                n_bad += memcmp(back, h, pb) != 0;
            }
        }
        CHECK_EQ_INT(n_bad, 0);
        /* staging pages and the very last page of the allocation are reachable */
        uint32_t ids[64];
        CHECK_OK(akv_dev_pool_staging_acquire(dpool, 64, ids));
        for (int i = 0; i < 64; i++)
            CHECK_OK(akv_dev_copy_h2d_sync(dev, akv_dev_pool_page_addr(dpool, ids[i]),
                                           akv_host_pool_page_addr(hpool, akv_host_table_page(t, 0, 0)), pb));
        akv_dptr last = akv_dev_pool_page_addr(dpool, akv_dev_pool_n_pages(dpool) - 1);
        CHECK_OK(akv_dev_memset_sync(dev, last, 0x3c, pb));
        CHECK_OK(akv_dev_pool_staging_release(dpool, 64, ids));
        free(back);
        akv_dev_pool_ctx_close(dpool, c);
        CHECK_OK(akv_host_table_destroy(t));
        akv_host_pool_get_stats(hpool, &hs);
        CHECK_EQ_U64(hs.pinned_bytes, 0);
        CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, 0);
        CHECK_OK(akv_dev_pool_destroy(dpool));
        CHECK_OK(akv_host_pool_destroy(hpool));
    }
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
#endif
}
