/*
 * test_host_table.c — per-context host page tables: growth all-or-nothing (at the limit and
 * under allocation failure at every site), truncation, leases, deferred destroy, CSR export,
 * shared prefixes (owners, the private copy a truncate into a shared page takes).
 * The walkers of the table and of its pool run after every operation.
 */
#include "test.h"

#include <string.h>

#include "akv/dev.h"
#include "akv/testing/dev_faults.h"
#include "akv/host_table.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "mem/mem_check.h"

static akv_dev *dev;

static int all_ok(akv_host_pool *pool, akv_host_table *const *t, int n) {
    int ok = CHECK(akv__host_pool_check(pool) == AKV_OK);
    for (int i = 0; i < n; i++)
        if (t[i]) ok &= CHECK(akv__host_table_check(t[i]) == AKV_OK);
    return ok;
}

static akv_host_pool *make_pool(uint32_t n_layers, uint32_t page_tokens, size_t arena_bytes) {
    akv_geom g;
    akv_host_pool *pool = NULL;
    if (akv_geom_init(&g, n_layers, 1, 8, AKV_DTYPE_F32, page_tokens) != AKV_OK) return NULL;
    akv_host_pool_params p = {.limit_gib = 1, .arena_bytes = arena_bytes};
    CHECK_OK(akv_host_pool_create(dev, &g, &p, &pool));
    return pool;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    if (akv_dev_create(akv_dev_host_backend(), NULL, &dev) != AKV_OK) return 1;

    TEST_CASE(grow_truncate_csr) {
        akv_host_pool *pool = make_pool(3, 16, 8 * 1024); /* 3 layers, P = 16, 1 KiB pages */
        akv_host_table *t[3] = {0};
        if (!pool) break;
        for (int i = 0; i < 3; i++) CHECK_OK(akv_host_table_create(pool, &t[i]));
        CHECK_OK(akv_host_table_grow(t[0], 1));
        CHECK_OK(akv_host_table_grow(t[1], 33));
        CHECK_OK(akv_host_table_grow(t[1], 48)); /* fills the third page exactly */
        /* t[2] stays empty: a sequence with no page */
        all_ok(pool, t, 3);
        CHECK_EQ_INT(akv_host_table_n_pages(t[0]), 1);
        CHECK_EQ_INT(akv_host_table_n_pages(t[1]), 3);
        CHECK_EQ_U64(akv_host_table_n_tokens(t[1]), 48);
        CHECK_STATUS(akv_host_table_grow(t[1], 47), AKV_EINVAL);
        CHECK_STATUS(akv_host_table_truncate(t[1], 49), AKV_EINVAL);
        int32_t indptr[4], indices[8], last[3];
        const akv_host_table *const ct[3] = {t[0], t[1], t[2]};
        for (uint32_t layer = 0; layer < 3; layer++) {
            CHECK_OK(akv_host_table_export_csr(ct, 3, layer, indptr, indices, 8, last));
            CHECK_EQ_INT(indptr[0], 0);
            CHECK_EQ_INT(indptr[1], 1);
            CHECK_EQ_INT(indptr[2], 4);
            CHECK_EQ_INT(indptr[3], 4);
            CHECK_EQ_INT(last[0], 1);
            CHECK_EQ_INT(last[1], 16);
            CHECK_EQ_INT(last[2], 0);
            for (int k = 0; k < 3; k++)
                CHECK_EQ_INT(indices[1 + k], akv_host_table_page(t[1], layer, (uint32_t)k).id);
        }
        /* bad exports write nothing */
        indptr[0] = -5;
        CHECK_STATUS(akv_host_table_export_csr(ct, 3, 0, indptr, indices, 3, last), AKV_EINVAL);
        CHECK_STATUS(akv_host_table_export_csr(ct, 3, 3, indptr, indices, 8, last), AKV_EINVAL);
        const akv_host_table *const with_null[2] = {t[0], NULL};
        CHECK_STATUS(akv_host_table_export_csr(with_null, 2, 0, indptr, indices, 8, last), AKV_EINVAL);
        CHECK_EQ_INT(indptr[0], -5);
        /* truncate keeps whole pages that still hold a token */
        CHECK_OK(akv_host_table_truncate(t[1], 17));
        CHECK_EQ_INT(akv_host_table_n_pages(t[1]), 2);
        CHECK_OK(akv_host_table_export_csr(ct + 1, 1, 2, indptr, indices, 8, last));
        CHECK_EQ_INT(last[0], 1);
        all_ok(pool, t, 3);
        CHECK_OK(akv_host_table_truncate(t[1], 0));
        CHECK_EQ_INT(akv_host_table_n_pages(t[1]), 0);
        all_ok(pool, t, 3);
        for (int i = 0; i < 3; i++) CHECK_OK(akv_host_table_destroy(t[i]));
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_used + st.n_arenas, 0);
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(leased_pages_block_destroy_and_truncate) {
        akv_host_pool *pool = make_pool(2, 16, 8 * 1024);
        akv_host_table *t = NULL;
        if (!pool) break;
        CHECK_OK(akv_host_table_create(pool, &t));
        CHECK_OK(akv_host_table_grow(t, 40)); /* 3 pages per layer */
        akv_host_page p = akv_host_table_page(t, 1, 2);
        CHECK_OK(akv_host_pool_page_lease(pool, p));
        CHECK_STATUS(akv_host_table_truncate(t, 20), AKV_EBUSY);
        CHECK_EQ_U64(akv_host_table_n_tokens(t), 40);
        CHECK_STATUS(akv_host_table_destroy(t), AKV_EBUSY);
        all_ok(pool, &t, 1);
        CHECK_OK(akv_host_table_truncate(t, 33)); /* page 2 still holds token 32: kept */
        /* a cancelled context: the table goes now, the leased page at its release */
        akv_host_table_destroy_deferred(t);
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_used, 1);
        CHECK_EQ_U64(st.n_doomed, 1);
        CHECK(akv_host_pool_page_addr(pool, p) != NULL);
        CHECK(akv__host_pool_check(pool) == AKV_OK);
        CHECK_OK(akv_host_pool_page_release(pool, p));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_used + st.n_doomed + st.n_arenas, 0);
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(grow_is_all_or_nothing_at_the_limit) {
        /* 4 MiB pages (P = 65536), 2 layers: 1 GiB = 256 pages = 128 per layer */
        akv_host_pool *pool = make_pool(2, 1u << 16, 8u << 20);
        akv_host_table *a = NULL, *b = NULL;
        if (!pool) break;
        CHECK_OK(akv_host_table_create(pool, &a));
        CHECK_OK(akv_host_table_create(pool, &b));
        CHECK_OK(akv_host_table_grow(a, 100ull << 16)); /* 200 pages */
        CHECK_OK(akv_host_table_grow(b, 20ull << 16));  /* 40 pages: 16 left */
        akv_host_table *both[2] = {a, b};
        all_ok(pool, both, 2);
        akv_host_pool_stats before, after;
        akv_host_pool_get_stats(pool, &before);
        CHECK_STATUS(akv_host_table_grow(b, 29ull << 16), AKV_EFULL); /* needs 18 */
        akv_host_pool_get_stats(pool, &after);
        CHECK_EQ_U64(after.n_used, before.n_used);
        CHECK_EQ_U64(after.pinned_bytes, before.pinned_bytes);
        CHECK_EQ_U64(akv_host_table_n_tokens(b), 20ull << 16);
        all_ok(pool, both, 2);
        CHECK_OK(akv_host_table_grow(b, 28ull << 16)); /* exactly the 16 left */
        CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, (size_t)1 << 30);
        all_ok(pool, both, 2);
        CHECK_OK(akv_host_table_destroy(a));
        CHECK_OK(akv_host_table_destroy(b));
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(grow_fails_cleanly_at_every_allocation) {
        /* 2 pages per arena, 2 layers: growing from 1 to 5 pages per layer grows the page
         * array and 4 arenas, each a host and a pinned allocation. A fresh table each round,
         * so that the n-th allocation is always the same site. */
        akv_host_pool *pool = make_pool(2, 16, 2 * 1024);
        if (!pool) break;
        int n_host = 0, n_pinned = 0;
        for (int kind = 0; kind < 2; kind++) {
            for (uint64_t n = 1; n < 100; n++) {
                akv_host_table *t = NULL;
                CHECK_OK(akv_host_table_create(pool, &t));
                CHECK_OK(akv_host_table_grow(t, 10));
                akv_host_pool_stats before, after;
                akv_host_pool_get_stats(pool, &before);
                int64_t live = akv__alloc_live();
                size_t pinned = akv_dev_get_usage(dev).pinned_bytes;
                if (kind == 0) akv__alloc_fail_nth(n);
                else CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, n));
                akv_status st = akv_host_table_grow(t, 80);
                int fired = kind == 0 ? akv__alloc_failure_fired() : st != AKV_OK;
                akv__alloc_fail_nth(0);
                CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, 0));
                if (fired) {
                    kind == 0 ? n_host++ : n_pinned++;
                    CHECK_STATUS(st, AKV_ENOMEM);
                    CHECK_EQ_U64(akv_host_table_n_tokens(t), 10);
                    akv_host_pool_get_stats(pool, &after);
                    CHECK_EQ_U64(after.n_used, before.n_used);
                    CHECK_EQ_U64(after.pinned_bytes, before.pinned_bytes);
                    CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, pinned);
                    /* the page array may have grown (capacity only: same block count) */
                    CHECK_EQ_INT(akv__alloc_live(), live);
                    all_ok(pool, &t, 1);
                } else {
                    CHECK_OK(st);
                }
                CHECK_OK(akv_host_table_destroy(t));
                if (!fired) break;
            }
        }
        printf("  failed at %d host and %d pinned allocation sites\n", n_host, n_pinned);
        CHECK_EQ_INT(n_host, 5);   /* page array + one record block per new arena */
        CHECK_EQ_INT(n_pinned, 4); /* 8 new pages in 2-page arenas = 4 arenas */
        CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, 0);
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(shared_prefixes) {
        /* 2 layers, P = 16, 1 KiB pages (f32, 1 head of 8: 16 floats a token) */
        akv_host_pool *pool = make_pool(2, 16, 8 * 1024);
        akv_host_table *t[3] = {0};
        if (!pool) break;
        for (int i = 0; i < 3; i++) CHECK_OK(akv_host_table_create(pool, &t[i]));
        const size_t pb = akv_host_pool_page_bytes(pool);
        CHECK_OK(akv_host_table_grow(t[0], 40)); /* pages 0, 1 full; 2 partial */
        for (uint32_t l = 0; l < 2; l++) /* every page's bytes its own: (layer, page) */
            for (uint32_t k = 0; k < 3; k++)
                memset(akv_host_pool_page_addr(pool, akv_host_table_page(t[0], l, k)), (int)(16 * l + k + 1), pb);
        /* only full pages, only into an empty table */
        CHECK_STATUS(akv_host_table_share(t[1], t[0], 3), AKV_EINVAL);
        CHECK_OK(akv_host_table_share(t[1], t[0], 2));
        CHECK_STATUS(akv_host_table_share(t[1], t[0], 1), AKV_EINVAL);
        CHECK_OK(akv_host_table_share(t[2], t[1], 1));
        CHECK_EQ_U64(akv_host_table_n_tokens(t[1]), 32);
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_used, 6);
        CHECK_EQ_U64(st.n_shares, 2 * 2 + 2 * 1);
        CHECK_EQ_INT(akv_host_pool_page_n_owners(pool, akv_host_table_page(t[0], 1, 0)), 3);
        CHECK_EQ_INT(akv_host_table_page(t[2], 1, 0).id, akv_host_table_page(t[0], 1, 0).id);
        all_ok(pool, t, 3);
        /* growing past the shared pages takes private ones */
        CHECK_OK(akv_host_table_grow(t[1], 35));
        CHECK(akv_host_table_page(t[1], 0, 2).id != akv_host_table_page(t[0], 0, 2).id);
        CHECK_EQ_INT(akv_host_pool_page_n_owners(pool, akv_host_table_page(t[1], 0, 2)), 1);
        /* a truncate into a shared page gives a private copy of it (same bytes), and the
         * shared page keeps its bytes and its other owners */
        akv_host_page was = akv_host_table_page(t[1], 1, 1);
        CHECK_OK(akv_host_table_truncate(t[1], 20));
        akv_host_page now = akv_host_table_page(t[1], 1, 1);
        CHECK(now.id != was.id);
        CHECK_EQ_INT(akv_host_pool_page_n_owners(pool, was), 1); /* t[0] alone */
        CHECK_EQ_INT(akv_host_pool_page_n_owners(pool, now), 1);
        const unsigned char *b = akv_host_pool_page_addr(pool, now);
        CHECK(b[0] == 16 + 1 + 1 && b[pb - 1] == 16 + 1 + 1);
        memset(akv_host_pool_page_addr(pool, now), 0x7f, pb); /* t[1]'s next tokens */
        CHECK(*(const unsigned char *)akv_host_pool_page_addr(pool, was) == 16 + 1 + 1);
        CHECK_EQ_INT(akv_host_pool_page_n_owners(pool, akv_host_table_page(t[1], 0, 0)), 3);
        all_ok(pool, t, 3);
        /* a truncate to a page boundary keeps the shared page whole: no copy */
        CHECK_OK(akv_host_table_truncate(t[2], 16));
        CHECK_EQ_INT(akv_host_table_page(t[2], 0, 0).id, akv_host_table_page(t[0], 0, 0).id);
        /* a copy the pool cannot hold changes nothing: the pool full, the truncate refused */
        akv_host_table *fill = NULL;
        CHECK_OK(akv_host_table_create(pool, &fill));
        akv_host_pool_stats full;
        akv_host_pool_get_stats(pool, &full);
        uint64_t left = full.capacity_pages - full.n_used;
        CHECK_OK(akv_host_table_grow(fill, left / 2 * 16));
        akv_host_pool_get_stats(pool, &full);
        CHECK(full.capacity_pages - full.n_used < 2);
        CHECK_STATUS(akv_host_table_truncate(t[2], 5), AKV_EFULL);
        CHECK_EQ_U64(akv_host_table_n_tokens(t[2]), 16);
        CHECK_EQ_INT(akv_host_table_page(t[2], 1, 0).id, akv_host_table_page(t[0], 1, 0).id);
        CHECK_OK(akv_host_table_destroy(fill));
        all_ok(pool, t, 3);
        /* leases: a shared page leased by one owner's copy does not stop another owner from
         * dropping it; the last owner's free waits for the release */
        akv_host_page p0 = akv_host_table_page(t[0], 0, 0);
        CHECK_OK(akv_host_pool_page_lease(pool, p0));
        CHECK_OK(akv_host_table_destroy(t[2]));
        t[2] = NULL;
        CHECK_OK(akv_host_table_truncate(t[1], 0));
        CHECK_STATUS(akv_host_table_destroy(t[0]), AKV_EBUSY); /* the last owner: leased */
        akv_host_table_destroy_deferred(t[0]);
        t[0] = NULL;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_doomed, 1);
        CHECK_EQ_U64(st.n_shares, 0);
        CHECK_OK(akv_host_pool_page_release(pool, p0));
        CHECK_OK(akv_host_table_destroy(t[1]));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_used + st.n_doomed + st.n_arenas, 0);
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(sole_pages_are_what_destroying_frees) {
        /* A forest of tables grown, shared from one another at random prefixes and truncated
         * (private copies), then a random set of them: the pages akv_host_tables_sole_pages
         * counts must be exactly what destroying that set gives back to the pool. */
        uint64_t rng = test_seed(41);
        for (int round = 0; round < 200; round++) {
            akv_host_pool *pool = make_pool(3, 4, 4 * 1024);
            enum { N = 9 };
            akv_host_table *t[N] = {0};
            if (!pool) break;
            for (int i = 0; i < N; i++) {
                CHECK_OK(akv_host_table_create(pool, &t[i]));
                int from = i ? (int)test_rand_below(&rng, (uint64_t)i + 1) - 1 : -1; /* -1: none */
                uint32_t full = from >= 0 ? (uint32_t)(akv_host_table_n_tokens(t[from]) / 4) : 0;
                if (full) CHECK_OK(akv_host_table_share(t[i], t[from], 1 + (uint32_t)test_rand_below(&rng, full)));
                CHECK_OK(akv_host_table_grow(t[i], akv_host_table_n_tokens(t[i]) + test_rand_below(&rng, 30)));
                if (test_rand_below(&rng, 3) == 0 && i) { /* an earlier one cut, maybe into a shared page */
                    akv_host_table *c = t[test_rand_below(&rng, (uint64_t)i)];
                    CHECK_OK(akv_host_table_truncate(c, test_rand_below(&rng, akv_host_table_n_tokens(c) + 1)));
                }
            }
            if (!all_ok(pool, t, N)) break;
            const akv_host_table *set[N];
            uint32_t n = 0;
            for (int i = 0; i < N; i++)
                if (test_rand_below(&rng, 2)) set[n++] = t[i];
            uint64_t sole = ~0ull, none = ~0ull;
            CHECK_OK(akv_host_tables_sole_pages(set, n, &sole));
            CHECK_OK(akv_host_tables_sole_pages(NULL, 0, &none));
            CHECK_EQ_U64(none, 0);
            akv_host_pool_stats before, after;
            akv_host_pool_get_stats(pool, &before);
            for (uint32_t k = 0; k < n; k++)
                for (int i = 0; i < N; i++)
                    if (t[i] == set[k]) {
                        CHECK_OK(akv_host_table_destroy(t[i]));
                        t[i] = NULL;
                    }
            akv_host_pool_get_stats(pool, &after);
            if (!TEST_CHECK_(before.n_used - after.n_used == sole,
                             "round %d: %u tables free %llu pages; counted %llu", round, n,
                             (unsigned long long)(before.n_used - after.n_used),
                             (unsigned long long)sole))
                break;
            for (int i = 0; i < N; i++) CHECK_OK(akv_host_table_destroy(t[i]));
            CHECK_OK(akv_host_pool_destroy(pool));
        }
        /* refused by name */
        akv_host_pool *a = make_pool(1, 4, 4 * 1024), *b = make_pool(1, 4, 4 * 1024);
        akv_host_table *ta = NULL, *tb = NULL;
        uint64_t x;
        if (a && b && REQUIRE_OK(akv_host_table_create(a, &ta)) && REQUIRE_OK(akv_host_table_create(b, &tb))) {
            const akv_host_table *mixed[2] = {ta, tb}, *holes[2] = {ta, NULL};
            CHECK_STATUS(akv_host_tables_sole_pages(mixed, 2, &x), AKV_EINVAL);
            CHECK_STATUS(akv_host_tables_sole_pages(holes, 2, &x), AKV_EINVAL);
            CHECK_STATUS(akv_host_tables_sole_pages(mixed, 1, NULL), AKV_EINVAL);
        }
        akv_host_table_destroy(ta), akv_host_table_destroy(tb);
        akv_host_pool_destroy(a), akv_host_pool_destroy(b);
    }

    TEST_CASE(create_fails_cleanly) {
        akv_host_pool *pool = make_pool(1, 16, 8 * 1024);
        akv_host_table *t = NULL;
        if (!pool) break;
        akv__alloc_fail_nth(1);
        CHECK_STATUS(akv_host_table_create(pool, &t), AKV_ENOMEM);
        akv__alloc_fail_nth(0);
        CHECK(t == NULL);
        CHECK_OK(akv_host_table_destroy(NULL));
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
}
