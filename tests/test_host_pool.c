/*
 * test_host_pool.c — the host pool on the host backend: arenas, limit, generations, leases,
 * deferred free, allocation failure at every site, and a randomized run with a shadow model.
 * The validity walker (akv__host_pool_check) runs after every operation.
 */
#include "test.h"

#include "akv/dev.h"
#include "akv/testing/dev_faults.h"
#include "akv/host_pool.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "mem/mem_check.h"

static akv_dev *dev;

/* Walker + pinned accounting: the pool is the only pinned user of `dev` in this test. */
static int pool_ok(akv_host_pool *pool) {
    akv_host_pool_stats st;
    akv_host_pool_get_stats(pool, &st);
    akv_dev_usage u = akv_dev_get_usage(dev);
    int ok = CHECK(akv__host_pool_check(pool) == AKV_OK);
    CHECK_EQ_U64(u.pinned_bytes, st.pinned_bytes);
    CHECK_EQ_U64(u.n_pinned, st.n_arenas);
    return ok && u.pinned_bytes == st.pinned_bytes;
}

/* A geometry with page_bytes = 64 * P bytes (1 layer, 1 head, head dim 8, f32). */
static akv_geom geom_p(uint32_t p) {
    akv_geom g;
    akv_status st = akv_geom_init(&g, 1, 1, 8, AKV_DTYPE_F32, p);
    AKV_ASSERT(st == AKV_OK);
    return g;
}

static akv_host_pool *make_pool(uint32_t page_tokens, uint32_t limit_gib, size_t arena_bytes) {
    akv_geom g = geom_p(page_tokens);
    akv_host_pool_params p = akv_host_pool_default_params();
    p.limit_gib = limit_gib;
    p.arena_bytes = arena_bytes;
    akv_host_pool *pool = NULL;
    akv_status st = akv_host_pool_create(dev, &g, &p, &pool);
    CHECK_OK(st);
    return pool;
}

static int same_stats(const akv_host_pool_stats *a, const akv_host_pool_stats *b) {
    return a->n_arenas == b->n_arenas && a->pinned_bytes == b->pinned_bytes &&
           a->n_used == b->n_used && a->n_free == b->n_free && a->n_leases == b->n_leases &&
           a->n_doomed == b->n_doomed && a->n_allocs == b->n_allocs;
}

static void test_bad_config(void) {
    TEST_CASE(bad_config) {
        akv_geom g = geom_p(16); /* 1 KiB pages */
        akv_host_pool_params p = akv_host_pool_default_params();
        akv_host_pool *pool = NULL;
        CHECK_EQ_INT(p.limit_gib, 0);
        CHECK_EQ_U64(p.arena_bytes, 256u << 20);
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL); /* no limit */
        {
            /* a geometry akv_geom_init did not make (zeroed: a division by its page size) */
            akv_host_pool_params ok = {.limit_gib = 1};
            akv_geom z = {0};
            akv_host_pool_stats lay;
            CHECK_STATUS(akv_host_pool_create(dev, &z, &ok, &pool), AKV_EINVAL);
            CHECK_STATUS(akv_host_pool_layout(&z, &ok, &lay), AKV_EINVAL);
            CHECK(pool == NULL);
        }
        p.limit_gib = AKV_HOST_POOL_MAX_GIB + 1;
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.limit_gib = 1;
        p.arena_bytes = 1000; /* less than one 1 KiB page */
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.arena_bytes = ((size_t)1 << 30) + 1024; /* more than the limit */
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.arena_bytes = 1024; /* 2^20 arenas of one page: just allowed */
        CHECK_OK(akv_host_pool_create(dev, &g, &p, &pool));
        CHECK_OK(akv_host_pool_destroy(pool));
        pool = NULL;
        p.limit_gib = 2; /* 2^21 one-page arenas: too many */
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        /* more page ids than int32 indexes: 4-byte pages, 16 GiB */
        akv_geom tiny;
        CHECK_OK(akv_geom_init(&tiny, 1, 1, 1, AKV_DTYPE_F16, 1));
        CHECK_EQ_U64(akv_geom_page_bytes(&tiny), 4);
        p.limit_gib = 16;
        p.arena_bytes = 0;
        CHECK_STATUS(akv_host_pool_create(dev, &tiny, &p, &pool), AKV_EINVAL);
        akv_host_pool_stats lay = {.capacity_pages = 7};
        CHECK_STATUS(akv_host_pool_layout(&tiny, &p, &lay), AKV_EINVAL);
        CHECK_EQ_U64(lay.capacity_pages, 7);
        CHECK_STATUS(akv_host_pool_create(NULL, &g, &p, &pool), AKV_EINVAL);
        CHECK_STATUS(akv_host_pool_create(dev, NULL, &p, &pool), AKV_EINVAL);
        CHECK(pool == NULL);
        CHECK_OK(akv_host_pool_destroy(NULL));
    }
}

static void test_basic(void) {
    TEST_CASE(alloc_free_generations_addresses) {
        akv_host_pool *pool = make_pool(16, 1, 4 * 1024); /* 1 KiB pages, 4 per arena */
        if (!pool) break;
        CHECK_EQ_U64(akv_host_pool_page_bytes(pool), 1024);
        akv_host_page h[6];
        for (int i = 0; i < 6; i++) {
            CHECK_OK(akv_host_pool_page_alloc(pool, &h[i]));
            CHECK(h[i].gen != 0);
            unsigned char *a = akv_host_pool_page_addr(pool, h[i]);
            CHECK(a != NULL);
            memset(a, i + 1, 1024);
            pool_ok(pool);
        }
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, 2);
        CHECK_EQ_U64(st.n_used, 6);
        CHECK_EQ_U64(st.n_free, 2);
        CHECK_EQ_U64(st.pinned_bytes, 8 * 1024);
        for (int i = 0; i < 6; i++) { /* no page overwrote another */
            unsigned char *a = akv_host_pool_page_addr(pool, h[i]);
            CHECK_EQ_INT(a[0], i + 1);
            CHECK_EQ_INT(a[1023], i + 1);
        }
        /* free and reuse: same id, newer generation; the old handle is stale everywhere */
        void *addr1 = akv_host_pool_page_addr(pool, h[1]);
        CHECK_OK(akv_host_pool_page_free(pool, h[1]));
        pool_ok(pool);
        CHECK(akv_host_pool_page_addr(pool, h[1]) == NULL);
        CHECK(!akv_host_pool_page_is_live(pool, h[1]));
        CHECK_STATUS(akv_host_pool_page_free(pool, h[1]), AKV_ESTATE);
        CHECK_STATUS(akv_host_pool_page_lease(pool, h[1]), AKV_ESTATE);
        akv_host_page r;
        CHECK_OK(akv_host_pool_page_alloc(pool, &r));
        CHECK_EQ_INT(r.id, h[1].id);
        CHECK(r.gen > h[1].gen);
        CHECK(akv_host_pool_page_addr(pool, r) == addr1); /* pages never move */
        CHECK(akv_host_pool_page_addr(pool, h[1]) == NULL);
        h[1] = r;
        /* bogus handles */
        CHECK(akv_host_pool_page_addr(pool, (akv_host_page){0, 0}) == NULL);
        CHECK(akv_host_pool_page_addr(pool, (akv_host_page){h[0].id, 0}) == NULL);
        CHECK(akv_host_pool_page_addr(pool, (akv_host_page){UINT32_MAX, 1}) == NULL);
        CHECK_STATUS(akv_host_pool_page_free(pool, (akv_host_page){999999, 1}), AKV_ESTATE);
        /* destroy with pages in use is refused and changes nothing */
        CHECK_STATUS(akv_host_pool_destroy(pool), AKV_EBUSY);
        pool_ok(pool);
        for (int i = 0; i < 6; i++) CHECK_OK(akv_host_pool_page_free(pool, h[i]));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, 0); /* each arena went back with its last page */
        CHECK_EQ_U64(st.n_arena_returns, 2);
        pool_ok(pool);
        CHECK_OK(akv_host_pool_destroy(pool));
    }

    TEST_CASE(generation_survives_arena_return) {
        akv_host_pool *pool = make_pool(16, 1, 2 * 1024);
        if (!pool) break;
        akv_host_page a, b, c;
        CHECK_OK(akv_host_pool_page_alloc(pool, &a));
        CHECK_OK(akv_host_pool_page_alloc(pool, &b));
        CHECK_OK(akv_host_pool_page_alloc(pool, &c)); /* second arena */
        for (int round = 0; round < 5; round++) {
            akv_host_page old = c;
            CHECK_OK(akv_host_pool_page_free(pool, c)); /* returns arena 1 */
            akv_host_pool_stats st;
            akv_host_pool_get_stats(pool, &st);
            CHECK_EQ_INT(st.n_arenas, 1);
            pool_ok(pool);
            CHECK_OK(akv_host_pool_page_alloc(pool, &c)); /* a fresh arena in the same slot */
            CHECK_EQ_INT(c.id, old.id);
            CHECK(c.gen > old.gen);
            CHECK(!akv_host_pool_page_is_live(pool, old));
            pool_ok(pool);
        }
        CHECK_OK(akv_host_pool_page_free(pool, a));
        CHECK_OK(akv_host_pool_page_free(pool, b));
        CHECK_OK(akv_host_pool_page_free(pool, c));
        CHECK_OK(akv_host_pool_destroy(pool));
    }
}

/* keep_gib: the arenas covering it are pinned at create and stay when they empty; arenas
 * above them still come and go. A kept arena that cannot be pinned fails the create and
 * leaves nothing. */
static void test_kept(void) {
    TEST_CASE(kept_arenas_pinned_at_create_and_never_returned) {
        akv_geom g = geom_p(1024); /* 64 KiB pages */
        akv_host_pool_params p = {.limit_gib = 2, .arena_bytes = 384u << 20, .keep_gib = 1};
        akv_host_pool *pool = NULL;
        if (!REQUIRE_OK(akv_host_pool_create(dev, &g, &p, &pool))) break;
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, 3); /* 1 GiB in arenas of 384 MiB: three */
        CHECK_EQ_U64(st.n_used, 0);
        CHECK_EQ_U64(st.n_arena_grows, 3);
        pool_ok(pool);
        const uint32_t per = st.pages_per_arena;
        akv_host_page *pg = akv__calloc(3 * (size_t)per + 1, sizeof *pg);
        if (!CHECK(pg != NULL)) break;
        for (uint32_t i = 0; i < 3 * per + 1; i++)
            CHECK_OK(akv_host_pool_page_alloc(pool, &pg[i]));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, 4); /* the page past the kept ones grows a fourth */
        CHECK_OK(akv_host_pool_page_free(pool, pg[3 * per])); /* and it goes back */
        for (uint32_t i = 0; i < 3 * per; i++)
            CHECK_OK(akv_host_pool_page_free(pool, pg[i]));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, 3);
        CHECK_EQ_U64(st.n_arena_returns, 1);
        CHECK_EQ_U64(st.n_used, 0);
        pool_ok(pool);
        akv__free(pg);
        CHECK_OK(akv_host_pool_destroy(pool));
        CHECK_EQ_U64(akv_dev_get_usage(dev).n_pinned, 0);

        p.keep_gib = 3; /* above the limit */
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.keep_gib = 2; /* all of it: every slot, the short last one included */
        if (!REQUIRE_OK(akv_host_pool_create(dev, &g, &p, &pool))) break;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_arenas, st.n_slots);
        CHECK_EQ_U64(st.pinned_bytes, (size_t)2 << 30);
        CHECK_OK(akv_host_pool_destroy(pool));
        /* the second arena cannot be pinned: the create fails and frees the first */
        p.keep_gib = 1;
        CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, 2));
        pool = NULL;
        CHECK_STATUS(akv_host_pool_create(dev, &g, &p, &pool), AKV_ENOMEM);
        CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, 0));
        CHECK(pool == NULL);
        CHECK_EQ_U64(akv_dev_get_usage(dev).n_pinned, 0);
    }
}

static void test_leases(void) {
    TEST_CASE(leases_and_deferred_free) {
        akv_host_pool *pool = make_pool(16, 1, 4 * 1024);
        if (!pool) break;
        akv_host_page a, b;
        CHECK_OK(akv_host_pool_page_alloc(pool, &a));
        CHECK_OK(akv_host_pool_page_alloc(pool, &b));
        CHECK_STATUS(akv_host_pool_page_release(pool, a), AKV_ESTATE); /* no lease yet */
        CHECK_OK(akv_host_pool_page_lease(pool, a));
        CHECK_OK(akv_host_pool_page_lease(pool, a));
        CHECK_EQ_INT(akv_host_pool_page_n_leases(pool, a), 2);
        pool_ok(pool);
        CHECK_STATUS(akv_host_pool_page_free(pool, a), AKV_EBUSY);
        CHECK(akv_host_pool_page_is_live(pool, a));
        CHECK_STATUS(akv_host_pool_destroy(pool), AKV_EBUSY);
        CHECK_OK(akv_host_pool_page_release(pool, a));
        CHECK_STATUS(akv_host_pool_page_free(pool, a), AKV_EBUSY);
        CHECK_OK(akv_host_pool_page_release(pool, a));
        CHECK_OK(akv_host_pool_page_free(pool, a));
        pool_ok(pool);
        /* deferred: the page stays addressable for its lease holders, refuses new leases and a
         * second free, and is freed by the last release */
        CHECK_OK(akv_host_pool_page_lease(pool, b));
        void *addr = akv_host_pool_page_addr(pool, b);
        CHECK_OK(akv_host_pool_page_free_deferred(pool, b));
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_doomed, 1);
        CHECK_EQ_U64(st.n_used, 1);
        pool_ok(pool);
        CHECK(akv_host_pool_page_addr(pool, b) == addr);
        CHECK_STATUS(akv_host_pool_page_lease(pool, b), AKV_ESTATE);
        CHECK_STATUS(akv_host_pool_page_free(pool, b), AKV_ESTATE);
        CHECK_STATUS(akv_host_pool_page_free_deferred(pool, b), AKV_ESTATE);
        CHECK_OK(akv_host_pool_page_release(pool, b));
        CHECK(!akv_host_pool_page_is_live(pool, b));
        CHECK_STATUS(akv_host_pool_page_release(pool, b), AKV_ESTATE);
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_doomed + st.n_used + st.n_arenas + st.n_leases, 0);
        pool_ok(pool);
        /* deferred free of an unleased page frees at once */
        CHECK_OK(akv_host_pool_page_alloc(pool, &a));
        CHECK_OK(akv_host_pool_page_free_deferred(pool, a));
        CHECK(!akv_host_pool_page_is_live(pool, a));
        pool_ok(pool);
        CHECK_OK(akv_host_pool_destroy(pool));
    }
}

static void test_limit(void) {
    TEST_CASE(limit_and_short_last_arena) {
        /* 32 MiB pages (P = 2^19 tokens of 64 B), 96 MiB arenas: 1 GiB = 32 pages = 10 full
         * arenas of 3 and a last one of 2. Memory is reserved, not touched (one tag byte). */
        akv_geom g;
        CHECK_OK(akv_geom_init(&g, 1, 8, 128, AKV_DTYPE_F32, 4096)); /* 8 KiB/token, 32 MiB */
        CHECK_EQ_U64(akv_geom_page_bytes(&g), 32u << 20);
        akv_host_pool_params p = {.limit_gib = 1, .arena_bytes = 96u << 20};
        akv_host_pool_stats lay;
        CHECK_OK(akv_host_pool_layout(&g, &p, &lay));
        CHECK_EQ_U64(lay.capacity_pages, 32);
        CHECK_EQ_INT(lay.n_slots, 11);
        CHECK_EQ_U64(lay.pinned_bytes, 0);
        akv_host_pool *pool = NULL;
        CHECK_OK(akv_host_pool_create(dev, &g, &p, &pool));
        if (!pool) break;
        akv_host_pool_stats st;
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_slots, 11);
        CHECK_EQ_INT(st.pages_per_arena, 3);
        CHECK_EQ_U64(st.pinned_bytes, 0);
        akv_host_page h[32];
        for (int i = 0; i < 32; i++) {
            CHECK_OK(akv_host_pool_page_alloc(pool, &h[i]));
            *(unsigned char *)akv_host_pool_page_addr(pool, h[i]) = (unsigned char)i;
            pool_ok(pool);
        }
        akv_host_page extra = {0, 0};
        CHECK_STATUS(akv_host_pool_page_alloc(pool, &extra), AKV_EFULL);
        CHECK_EQ_INT(extra.gen, 0); /* untouched */
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.pinned_bytes, (size_t)1 << 30); /* exactly the limit, never above */
        CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, (size_t)1 << 30);
        CHECK_EQ_U64(st.n_refused_full, 1);
        CHECK_EQ_INT(st.n_arenas, 11);
        pool_ok(pool);
        for (int i = 0; i < 32; i++)
            CHECK_EQ_INT(*(unsigned char *)akv_host_pool_page_addr(pool, h[i]), i);
        /* freeing one page of the full pool makes room for exactly one */
        CHECK_OK(akv_host_pool_page_free(pool, h[31]));
        CHECK_OK(akv_host_pool_page_alloc(pool, &h[31]));
        CHECK_STATUS(akv_host_pool_page_alloc(pool, &extra), AKV_EFULL);
        for (int i = 0; i < 32; i++) CHECK_OK(akv_host_pool_page_free(pool, h[i]));
        akv_host_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.pinned_bytes, 0);
        pool_ok(pool);
        CHECK_OK(akv_host_pool_destroy(pool));
    }
}

/* Allocation failure at every site: host allocations (core/alloc.h) and pinned allocations
 * (the device's injection), in create and in a growing page allocation. Each failure must
 * return a clean error with the pool unchanged and nothing leaked. */
static void test_alloc_failures(void) {
    TEST_CASE(create_fails_cleanly_at_every_allocation) {
        akv_geom g = geom_p(16);
        akv_host_pool_params p = {.limit_gib = 1, .arena_bytes = 64 * 1024};
        int n_failed = 0;
        for (uint64_t n = 1; n < 20; n++) {
            int64_t live = akv__alloc_live();
            akv_host_pool *pool = NULL;
            akv__alloc_fail_nth(n);
            akv_status st = akv_host_pool_create(dev, &g, &p, &pool);
            int fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                CHECK_OK(akv_host_pool_destroy(pool));
                break;
            }
            n_failed++;
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK(pool == NULL);
            CHECK_EQ_INT(akv__alloc_live(), live);
        }
        CHECK_EQ_INT(n_failed, 2); /* the pool record and its slot array */
    }

    TEST_CASE(growth_fails_cleanly_at_every_allocation) {
        akv_host_pool *pool = make_pool(16, 1, 4 * 1024);
        if (!pool) break;
        akv_host_page keep[4];
        for (int i = 0; i < 4; i++) CHECK_OK(akv_host_pool_page_alloc(pool, &keep[i]));
        /* the next allocation must grow a second arena */
        int n_host = 0, n_pinned = 0;
        for (int kind = 0; kind < 2; kind++) {
            for (uint64_t n = 1; n < 20; n++) {
                akv_host_pool_stats before, after;
                akv_host_pool_get_stats(pool, &before);
                akv_dev_usage ub = akv_dev_get_usage(dev);
                int64_t live = akv__alloc_live();
                akv_host_page h = {12345, 777};
                if (kind == 0) akv__alloc_fail_nth(n);
                else CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, n));
                akv_status st = akv_host_pool_page_alloc(pool, &h);
                int fired = kind == 0 ? akv__alloc_failure_fired() : st != AKV_OK;
                akv__alloc_fail_nth(0);
                CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, 0));
                if (!fired) {
                    CHECK_OK(st);
                    CHECK_OK(akv_host_pool_page_free(pool, h)); /* returns the new arena */
                    break;
                }
                kind == 0 ? n_host++ : n_pinned++;
                CHECK_STATUS(st, AKV_ENOMEM);
                CHECK(h.id == 12345 && h.gen == 777);
                akv_host_pool_get_stats(pool, &after);
                CHECK(same_stats(&before, &after));
                CHECK_EQ_INT(akv__alloc_live(), live);
                CHECK_EQ_U64(akv_dev_get_usage(dev).pinned_bytes, ub.pinned_bytes);
                pool_ok(pool);
            }
        }
        /* host: the page records, and the device front's allocation table when it grows;
         * pinned: the arena itself */
        CHECK(n_host >= 1);
        CHECK_EQ_INT(n_pinned, 1);
        for (int i = 0; i < 4; i++) CHECK_OK(akv_host_pool_page_free(pool, keep[i]));
        CHECK_OK(akv_host_pool_destroy(pool));
    }
}

/* Randomized run against a shadow model: live handles with a tag written in their page,
 * lease and owner counts, doomed flags, the last generation seen per id (monotone). */
typedef struct shadow_page {
    akv_host_page h;
    uint32_t n_leases, n_owners;
    int doomed;
} shadow_page;

static void random_run(const char *name, uint64_t *rng, uint32_t page_tokens, size_t arena_bytes,
                       int n_ops, int max_live) {
    akv_host_pool *pool = make_pool(page_tokens, 1, arena_bytes);
    if (!pool) return;
    akv_host_pool_stats st;
    akv_host_pool_get_stats(pool, &st);
    shadow_page *live = calloc((size_t)max_live, sizeof *live);
    uint32_t *last_gen = calloc(st.capacity_pages, sizeof *last_gen);
    akv_host_page *stale = calloc(64, sizeof *stale);
    int n_live = 0, n_stale = 0, n_bad = 0;
    uint64_t n_full = 0, n_ok[7] = {0};
    for (int op = 0; op < n_ops && n_bad == 0; op++) {
        uint64_t r = test_rand_below(rng, 100);
        /* bias toward allocation while small, toward frees while large */
        int grow = (int)test_rand_below(rng, (uint64_t)max_live) >= n_live;
        if (r < 45 && (grow || n_live == 0)) { /* alloc */
            if (n_live == max_live) continue;
            akv_host_page h;
            akv_status s = akv_host_pool_page_alloc(pool, &h);
            if (s == AKV_EFULL) {
                n_full++;
                CHECK_EQ_U64(n_live, st.capacity_pages);
            } else if (CHECK(s == AKV_OK)) {
                if (h.gen <= last_gen[h.id]) {
                    n_bad++;
                    CHECK(h.gen > last_gen[h.id]);
                }
                last_gen[h.id] = h.gen;
                uint64_t tag = ((uint64_t)h.id << 32) | h.gen;
                memcpy(akv_host_pool_page_addr(pool, h), &tag, sizeof tag);
                live[n_live++] = (shadow_page){.h = h, .n_owners = 1};
                n_ok[0]++;
            }
        } else if (n_live > 0) {
            int k = (int)test_rand_below(rng, (uint64_t)n_live);
            shadow_page *sp = &live[k];
            uint64_t tag = 0, want = ((uint64_t)sp->h.id << 32) | sp->h.gen;
            void *addr = akv_host_pool_page_addr(pool, sp->h);
            if (!CHECK(addr != NULL)) break;
            memcpy(&tag, addr, sizeof tag);
            if (tag != want) {
                n_bad++;
                CHECK_EQ_U64(tag, want);
            }
            int removed = 0;
            if (r < 60) { /* free: one owner fewer; the last one's refused while leased */
                akv_status s = akv_host_pool_page_free(pool, sp->h);
                CHECK_STATUS(s, sp->doomed ? AKV_ESTATE
                                : sp->n_owners > 1 ? AKV_OK
                                : sp->n_leases ? AKV_EBUSY : AKV_OK);
                if (s == AKV_OK && sp->n_owners > 1) {
                    sp->n_owners--;
                    n_ok[6]++;
                } else {
                    removed = s == AKV_OK;
                    n_ok[1] += removed;
                }
            } else if (r < 65) { /* share: one owner more */
                akv_status s = akv_host_pool_page_share(pool, sp->h);
                CHECK_STATUS(s, sp->doomed ? AKV_ESTATE : AKV_OK);
                if (s == AKV_OK) sp->n_owners++;
            } else if (r < 80) { /* lease */
                akv_status s = akv_host_pool_page_lease(pool, sp->h);
                CHECK_STATUS(s, sp->doomed ? AKV_ESTATE : AKV_OK);
                if (s == AKV_OK) sp->n_leases++, n_ok[2]++;
            } else if (r < 93) { /* release */
                akv_status s = akv_host_pool_page_release(pool, sp->h);
                CHECK_STATUS(s, sp->n_leases ? AKV_OK : AKV_ESTATE);
                if (s == AKV_OK) {
                    sp->n_leases--;
                    n_ok[3]++;
                    removed = sp->doomed && sp->n_leases == 0;
                }
            } else { /* deferred free */
                akv_status s = akv_host_pool_page_free_deferred(pool, sp->h);
                CHECK_STATUS(s, sp->doomed ? AKV_ESTATE : AKV_OK);
                if (s == AKV_OK && sp->n_owners > 1) {
                    sp->n_owners--;
                    n_ok[6]++;
                } else if (s == AKV_OK) {
                    n_ok[4]++;
                    if (sp->n_leases) sp->doomed = 1;
                    else removed = 1;
                }
            }
            if (removed) {
                stale[n_stale++ % 64] = sp->h;
                *sp = live[--n_live];
            }
        }
        /* a stale handle must stay stale whatever happened since */
        if (n_stale && test_rand_below(rng, 4) == 0) {
            akv_host_page h = stale[test_rand_below(rng, n_stale < 64 ? (uint64_t)n_stale : 64)];
            CHECK(akv_host_pool_page_addr(pool, h) == NULL);
            CHECK_STATUS(akv_host_pool_page_lease(pool, h), AKV_ESTATE);
            n_ok[5]++;
        }
        akv_host_pool_get_stats(pool, &st);
        uint64_t n_leases = 0, n_shares = 0;
        for (int i = 0; i < n_live; i++)
            n_leases += live[i].n_leases, n_shares += live[i].n_owners - 1;
        if (!pool_ok(pool) || st.n_used != (uint64_t)n_live || st.n_leases != n_leases ||
            st.n_shares != n_shares ||
            (n_live && akv_host_pool_page_n_owners(pool, live[op % n_live].h) != live[op % n_live].n_owners)) {
            CHECK_EQ_U64(st.n_used, n_live);
            CHECK_EQ_U64(st.n_leases, n_leases);
            CHECK_EQ_U64(st.n_shares, n_shares);
            printf("  %s: diverged at operation %d\n", name, op);
            n_bad++;
        }
    }
    printf("  %s: %d ops: %llu allocs, %llu frees, %llu owners dropped, %llu leases, %llu "
           "releases, %llu deferred, %llu stale probes, %llu full; arenas grown %llu, returned %llu\n",
           name, n_ops, (unsigned long long)n_ok[0], (unsigned long long)n_ok[1],
           (unsigned long long)n_ok[6], (unsigned long long)n_ok[2], (unsigned long long)n_ok[3],
           (unsigned long long)n_ok[4], (unsigned long long)n_ok[5], (unsigned long long)n_full,
           (unsigned long long)st.n_arena_grows, (unsigned long long)st.n_arena_returns);
    CHECK(n_ok[0] > 0 && n_ok[1] > 0 && n_ok[2] > 0 && n_ok[3] > 0 && n_ok[4] > 0 && n_ok[6] > 0);
    CHECK(st.n_arena_returns > 0);
    /* tear down: release every lease (completing deferred frees), free the rest */
    for (int i = 0; i < n_live; i++) {
        while (live[i].n_leases) {
            CHECK_OK(akv_host_pool_page_release(pool, live[i].h));
            live[i].n_leases--;
        }
        for (; !live[i].doomed && live[i].n_owners; live[i].n_owners--)
            CHECK_OK(akv_host_pool_page_free(pool, live[i].h));
    }
    akv_host_pool_get_stats(pool, &st);
    CHECK_EQ_U64(st.n_used + st.pinned_bytes + st.n_arenas, 0);
    pool_ok(pool);
    CHECK_OK(akv_host_pool_destroy(pool));
    free(live);
    free(last_gen);
    free(stale);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* misuse cases log by design */
    if (akv_dev_create(akv_dev_host_backend(), NULL, &dev) != AKV_OK) {
        printf("cannot create the host device\n");
        return 1;
    }
    test_bad_config();
    test_basic();
    test_kept();
    test_leases();
    test_limit();
    test_alloc_failures();
    TEST_CASE(randomized) {
        uint64_t rng = test_seed(0x5eed0001);
        /* 256 KiB pages in 1 MiB arenas: arenas come and go under a moving live set */
        random_run("small arenas", &rng, 4096, 1u << 20, 100000, 300);
        /* 4 MiB pages, 2 per arena: 256 page ids; allocation outpaces frees, so the live set
         * runs into the limit and stays there */
        random_run("at the limit", &rng, 1u << 16, 8u << 20, 30000, 2000);
    }
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
}
