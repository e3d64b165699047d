/*
 * test_dev_pool.c — the device pool on the host backend: configuration errors, the one
 * allocation, staging, a trace that produces every placement source, reclamation class and
 * wait with its counted reason, allocation failure at every site, and a randomized run of
 * contexts arriving, growing, going idle and leaving under pressure. The walker
 * (akv__dev_pool_check) runs after every operation.
 */
#include "test.h"

#include "akv/dev.h"
#include "akv/testing/dev_faults.h"
#include "akv/dev_pool.h"
#include "pool_order.h"
#include "akv/log.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "mem/mem_check.h"

static akv_dev *dev;

/* 2 layers, 8 heads x 128 x f32 = 8 KiB per token; p tokens per page. */
static akv_geom geom2(uint32_t page_tokens) {
    akv_geom g;
    akv_status st = akv_geom_init(&g, 2, 8, 128, AKV_DTYPE_F32, page_tokens);
    AKV_ASSERT(st == AKV_OK);
    return g;
}

static akv_dev_pool *make_pool(uint32_t page_tokens, uint32_t staging_pages) {
    akv_geom g = geom2(page_tokens);
    akv_dev_pool_params p = {.device_gib = 1, .staging_pages = staging_pages};
    akv_dev_pool *pool = NULL;
    CHECK_OK(akv_dev_pool_create(dev, &g, &p, &pool));
    return pool;
}

static akv_dev_pool_ctx *open_ctx(akv_dev_pool *pool, uint32_t target, uint32_t burst, uint64_t tag) {
    akv_dev_pool_ctx *c = NULL;
    akv_dev_pool_ctx_params p = {.target = target, .burst = burst, .tag = tag};
    CHECK_OK(akv_dev_pool_ctx_open(pool, &p, &c));
    return c;
}

static int pool_ok(akv_dev_pool *pool) {
    return CHECK(akv__dev_pool_check(pool) == AKV_OK);
}

/* The window of c as a string of logical pages, e.g. "0,3,4". */
static const char *window_str(akv_dev_pool *pool, akv_dev_pool_ctx *c) {
    static char buf[256];
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t w = 0; w < akv_dev_pool_ctx_window(c) && n < sizeof buf - 12; w++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%u", w ? "," : "",
                              akv_dev_pool_ctx_slot(pool, c, 0, w).logical);
    return buf;
}

static void test_config(void) {
    TEST_CASE(bad_config) {
        akv_geom g = geom2(8); /* 64 KiB pages */
        akv_dev_pool_params p = akv_dev_pool_default_params();
        akv_dev_pool *pool = NULL;
        CHECK_STATUS(akv_dev_pool_create(dev, &g, &p, &pool), AKV_EINVAL); /* never automatic */
        {
            /* a geometry akv_geom_init did not make (zeroed; P not a power of two) */
            akv_dev_pool_params ok = {.device_gib = 1};
            akv_geom z = {0}, odd = g;
            odd.page_tokens = 3;
            akv_dev_pool_stats lay;
            CHECK_STATUS(akv_dev_pool_create(dev, &z, &ok, &pool), AKV_EINVAL);
            CHECK_STATUS(akv_dev_pool_layout(&odd, &ok, &lay), AKV_EINVAL);
            CHECK(pool == NULL);
        }
        p.device_gib = AKV_DEV_POOL_MAX_GIB + 1;
        CHECK_STATUS(akv_dev_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.device_gib = 1;
        p.staging_pages = 16385; /* 1 GiB holds 16384 */
        CHECK_STATUS(akv_dev_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        p.staging_pages = 16384 - 3; /* 3 pages left: one window page (2 layers), no floor */
        CHECK_STATUS(akv_dev_pool_create(dev, &g, &p, &pool), AKV_EINVAL);
        /* smaller than one floor: 64 layers of 32 MiB pages = 2 GiB per window page */
        akv_geom big;
        CHECK_OK(akv_geom_init(&big, 64, 8, 128, AKV_DTYPE_F32, 4096));
        p.staging_pages = 0;
        CHECK_STATUS(akv_dev_pool_create(dev, &big, &p, &pool), AKV_EINVAL);
        /* more page ids than int32: 4-byte pages, 16 GiB (refused before any allocation) */
        akv_geom tiny;
        CHECK_OK(akv_geom_init(&tiny, 1, 1, 1, AKV_DTYPE_F16, 1));
        p.device_gib = 16;
        CHECK_STATUS(akv_dev_pool_create(dev, &tiny, &p, &pool), AKV_EINVAL);
        CHECK_STATUS(akv_dev_pool_create(NULL, &g, &p, &pool), AKV_EINVAL);
        CHECK(pool == NULL);
        CHECK_EQ_U64(akv_dev_get_usage(dev).device_bytes, 0);
        CHECK_OK(akv_dev_pool_destroy(NULL));
    }

    TEST_CASE(one_allocation_pages_contexts) {
        akv_dev_pool *pool = make_pool(2048, 3); /* 16 MiB pages: 64 pages */
        if (!pool) break;
        akv_dev_usage u = akv_dev_get_usage(dev);
        CHECK_EQ_U64(u.device_bytes, (size_t)1 << 30); /* exactly the GiB asked for, once */
        CHECK_EQ_U64(u.n_device, 1);
        akv_dev_pool_stats st;
        akv_dev_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.n_pages, 64);
        CHECK_EQ_INT(st.window_capacity, 30);
        CHECK_EQ_INT(st.staging_reserve, 4); /* 3 asked + the odd page no window page can use */
        CHECK_EQ_U64(akv_dev_pool_page_addr(pool, 5).addr,
                     akv_dev_pool_base(pool).addr + 5 * (16u << 20));
        /* every page is addressable: write the last byte of the last page */
        unsigned char b = 7;
        CHECK_OK(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(akv_dev_pool_page_addr(pool, 63), (16u << 20) - 1), &b, 1));
        akv_dev_pool_ctx *c = NULL;
        akv_dev_pool_ctx_params cp = {.target = 1, .burst = 0};
        CHECK_STATUS(akv_dev_pool_ctx_open(pool, &cp, &c), AKV_EINVAL); /* below the floor */
        cp.target = 31;
        CHECK_STATUS(akv_dev_pool_ctx_open(pool, &cp, &c), AKV_EINVAL); /* above capacity */
        cp.target = 20, cp.burst = 11;
        CHECK_STATUS(akv_dev_pool_ctx_open(pool, &cp, &c), AKV_EINVAL);
        CHECK(c == NULL);
        c = open_ctx(pool, 2, 0, 1);
        CHECK_STATUS(akv_dev_pool_ctx_set_target(pool, c, 40, 0), AKV_EINVAL);
        {
            /* a context of another pool */
            akv_dev_pool *other = make_pool(8, 0);
            if (other) {
                akv_dev_pool_ctx *oc = open_ctx(other, 2, 0, 9);
                CHECK_STATUS(akv_dev_pool_ctx_set_target(pool, oc, 4, 0), AKV_EINVAL);
                akv_dev_pool_ctx_close(other, oc);
                CHECK_OK(akv_dev_pool_destroy(other));
            }
        }
        /* bad batches change nothing */
        akv_dev_pool_result res[2];
        akv_dev_pool_req bad0[1] = {{.ctx = c, .n_tokens = 0}};
        pool_orders(akv_dev_pool_geom(pool), bad0, 1);
        CHECK_STATUS(akv_dev_pool_step(pool, bad0, 1, res), AKV_EINVAL);
        akv_dev_pool_req dup[2] = {{.ctx = c, .n_tokens = 10}, {.ctx = c, .n_tokens = 10}};
        pool_orders(akv_dev_pool_geom(pool), dup, 2);
        CHECK_STATUS(akv_dev_pool_step(pool, dup, 2, res), AKV_EINVAL);
        akv_dev_pool_req none[1] = {{.ctx = NULL, .n_tokens = 10}};
        pool_orders(akv_dev_pool_geom(pool), none, 1);
        CHECK_STATUS(akv_dev_pool_step(pool, none, 1, res), AKV_EINVAL);
        akv_dev_pool_req huge[1] = {{.ctx = c, .n_tokens = (uint64_t)2048 * INT32_MAX + 1}};
        pool_orders(akv_dev_pool_geom(pool), huge, 1);
        CHECK_STATUS(akv_dev_pool_step(pool, huge, 1, res), AKV_EINVAL);
        akv_dev_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.n_steps, 0);
        pool_ok(pool);
        /* destroy refuses while a context is open or a staging page is lent */
        CHECK_STATUS(akv_dev_pool_destroy(pool), AKV_EBUSY);
        akv_dev_pool_ctx_close(pool, c);
        /* a closed context is refused by address, its freed memory never read (the sanitizer
         * build caught the old check reading it) */
        akv_dev_pool_req closed[1] = {{.ctx = c, .n_tokens = 10}};
        pool_orders(akv_dev_pool_geom(pool), closed, 1);
        CHECK_STATUS(akv_dev_pool_step(pool, closed, 1, res), AKV_EINVAL);
        CHECK_STATUS(akv_dev_pool_ctx_set_target(pool, c, 2, 0), AKV_EINVAL);
        uint32_t ids[4];
        CHECK_OK(akv_dev_pool_staging_acquire(pool, 4, ids));
        CHECK_STATUS(akv_dev_pool_destroy(pool), AKV_EBUSY);
        CHECK_OK(akv_dev_pool_staging_release(pool, 4, ids));
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_destroy(pool));
        CHECK_EQ_U64(akv_dev_get_usage(dev).device_bytes, 0);
    }

    TEST_CASE(staging_reserve) {
        akv_dev_pool *pool = make_pool(2048, 4);
        if (!pool) break;
        uint32_t a[4], b[2];
        CHECK_OK(akv_dev_pool_staging_acquire(pool, 3, a));
        CHECK(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
        pool_ok(pool);
        CHECK_STATUS(akv_dev_pool_staging_acquire(pool, 2, b), AKV_EFULL); /* 1 left */
        akv_dev_pool_stats st;
        akv_dev_pool_get_stats(pool, &st);
        CHECK_EQ_U64(st.counts.n_events[AKV_DEV_POOL_WAIT_STAGING], 1);
        CHECK_EQ_U64(st.counts.n_pages[AKV_DEV_POOL_WAIT_STAGING], 2);
        CHECK_EQ_INT(st.last_wait.reason, AKV_DEV_POOL_WAIT_STAGING);
        CHECK_EQ_INT(st.last_wait.free, 1);
        /* releases: a repeated id, a foreign id, a window page: all refused, nothing changed */
        uint32_t rep[2] = {a[0], a[0]};
        CHECK_STATUS(akv_dev_pool_staging_release(pool, 2, rep), AKV_EINVAL);
        uint32_t foreign[2] = {a[1], 9999};
        CHECK_STATUS(akv_dev_pool_staging_release(pool, 2, foreign), AKV_EINVAL);
        akv_dev_pool_ctx *c = open_ctx(pool, 2, 0, 1);
        akv_dev_pool_req rq = {.ctx = c, .n_tokens = 1};
        akv_dev_pool_result rs;
        pool_orders(akv_dev_pool_geom(pool), &rq, 1);
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, &rs));
        uint32_t win[1] = {akv_dev_pool_ctx_slot(pool, c, 0, 0).page_id};
        CHECK_STATUS(akv_dev_pool_staging_release(pool, 1, win), AKV_EINVAL);
        akv_dev_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.staging_used, 3);
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_staging_release(pool, 3, a));
        CHECK_OK(akv_dev_pool_staging_acquire(pool, 4, a)); /* the whole reserve */
        CHECK_OK(akv_dev_pool_staging_release(pool, 4, a));
        akv_dev_pool_ctx_close(pool, c);
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_destroy(pool));
    }
}

/* ---- the trace ------------------------------------------------------------------------------ */

typedef struct trace {
    akv_dev_pool *pool;
    akv_dev_pool_counts before;
} trace;

static void trace_mark(trace *t) {
    akv_dev_pool_stats st;
    akv_dev_pool_get_stats(t->pool, &st);
    t->before = st.counts;
}

/* Asserts the counts that changed since trace_mark: want[] lists {reason, events, pages}
 * and every reason not listed must not have moved. */
typedef struct want_count {
    akv_dev_pool_reason reason;
    uint64_t n_events, n_pages;
} want_count;

static void trace_expect(trace *t, const char *what, const want_count *want, size_t n_want) {
    akv_dev_pool_stats st;
    akv_dev_pool_get_stats(t->pool, &st);
    for (int r = 0; r < AKV_DEV_POOL_REASON_COUNT; r++) {
        uint64_t de = st.counts.n_events[r] - t->before.n_events[r];
        uint64_t dp = st.counts.n_pages[r] - t->before.n_pages[r];
        uint64_t we = 0, wp = 0;
        for (size_t i = 0; i < n_want; i++)
            if ((int)want[i].reason == r) we = want[i].n_events, wp = want[i].n_pages;
        if (de != we || dp != wp) {
            CHECK_EQ_U64(de, we);
            CHECK_EQ_U64(dp, wp);
            printf("  %s: %s\n", what, akv_dev_pool_reason_str((akv_dev_pool_reason)r));
        }
    }
    pool_ok(t->pool);
    trace_mark(t);
}

#define EXPECT(t, what, ...)                                                                       \
    do {                                                                                           \
        const want_count w_[] = {__VA_ARGS__};                                                     \
        trace_expect((t), (what), w_, AKV_ARRAY_LEN(w_));                                          \
    } while (0)
#define EXPECT_NONE(t, what) trace_expect((t), (what), NULL, 0)

static akv_status step1(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint64_t n_pages_of_tokens,
                        akv_dev_pool_result *res) {
    const akv_geom *g = akv_dev_pool_geom(pool);
    akv_dev_pool_req rq = {.ctx = c, .n_tokens = n_pages_of_tokens * g->page_tokens};
    pool_orders(akv_dev_pool_geom(pool), &rq, 1);
    return akv_dev_pool_step(pool, &rq, 1, res);
}

static void test_trace(void) {
    TEST_CASE(trace_every_reason) {
        /* 64 MiB pages (P = 8192), 2 layers: 16 pages; staging 2 -> 7 window pages */
        akv_dev_pool *pool = make_pool(8192, 2);
        if (!pool) break;
        trace t = {.pool = pool};
        trace_mark(&t);
        akv_dev_pool_stats st;
        akv_dev_pool_get_stats(pool, &st);
        CHECK_EQ_INT(st.window_capacity, 7);
        akv_dev_pool_result r;

        /* 1. A (target 2, burst 3) at 5 pages: floor, then borrows 3 while pages are free */
        akv_dev_pool_ctx *A = open_ctx(pool, 2, 3, 'A');
        CHECK_OK(step1(pool, A, 5, &r));
        CHECK_STR(window_str(pool, A), "0,1,2,3,4");
        CHECK_EQ_INT(r.n_fresh, 5);
        EXPECT(&t, "A grows", {AKV_DEV_POOL_FROM_FREE, 5, 5});
        akv_dev_pool_ctx_stats cs;
        akv_dev_pool_ctx_get_stats(A, &cs);
        CHECK_EQ_INT(cs.borrowed, 3);

        /* 2. B (target 4) at 4 pages: 2 free pages for its floor, then reclaims A's borrowed
         * pages (class 1) for its target, oldest first */
        akv_dev_pool_ctx *B = open_ctx(pool, 4, 0, 'B');
        CHECK_OK(step1(pool, B, 4, &r));
        CHECK_STR(window_str(pool, B), "0,1,2,3");
        CHECK_STR(window_str(pool, A), "0,3,4");
        EXPECT(&t, "B takes A's borrowed pages", {AKV_DEV_POOL_FROM_FREE, 2, 2},
               {AKV_DEV_POOL_RECLAIM_BORROWED, 2, 2});
        akv_dev_pool_ctx_get_stats(A, &cs);
        CHECK_EQ_INT(cs.borrowed, 1);
        CHECK_EQ_U64(cs.as_victim.n_pages[AKV_DEV_POOL_RECLAIM_BORROWED], 2);

        /* 3. A at 6 pages: above its target it may not reclaim; its new tail takes its own
         * oldest page (shrink), and its burst is denied (nothing free) */
        CHECK_OK(step1(pool, A, 6, &r));
        CHECK_STR(window_str(pool, A), "0,4,5");
        CHECK_EQ_INT(r.n_fresh, 1);
        EXPECT(&t, "A slides by shrinking", {AKV_DEV_POOL_SHRINK_OLDEST, 1, 1},
               {AKV_DEV_POOL_BURST_DENIED, 1, 2});

        /* 4. B's target lowered to 2 (+2 burst) while idle: 2 pages above target. C (target
         * 3) at 3 pages reclaims A's last borrowed page (class 1), then B's pages above
         * target (class 2), least recently active first */
        CHECK_OK(akv_dev_pool_ctx_set_target(pool, B, 2, 2));
        akv_dev_pool_ctx *C = open_ctx(pool, 3, 0, 'C');
        CHECK_OK(step1(pool, C, 3, &r));
        CHECK_STR(window_str(pool, C), "0,1,2");
        CHECK_STR(window_str(pool, A), "0,5");
        CHECK_STR(window_str(pool, B), "0,3");
        EXPECT(&t, "C takes borrowed, then above target", {AKV_DEV_POOL_RECLAIM_BORROWED, 1, 1},
               {AKV_DEV_POOL_RECLAIM_ABOVE_TARGET, 2, 2});

        /* 5. D (target 2) at 1 page: nothing borrowed or above target is left; the least
         * recently active idle context (B, step 2) is reclaimed whole (class 3) */
        akv_dev_pool_ctx *D = open_ctx(pool, 2, 0, 'D');
        CHECK_OK(step1(pool, D, 1, &r));
        CHECK_STR(window_str(pool, D), "0");
        CHECK_EQ_INT(akv_dev_pool_ctx_window(B), 0);
        EXPECT(&t, "D reclaims idle B", {AKV_DEV_POOL_RECLAIM_IDLE, 1, 2});
        akv_dev_pool_ctx_get_stats(B, &cs);
        CHECK_EQ_U64(cs.as_victim.n_events[AKV_DEV_POOL_RECLAIM_IDLE], 1);

        /* 6. E and D together: E's floor from the free page and idle A (reclaimed whole);
         * D's new tail from the page A left free */
        akv_dev_pool_ctx *E = open_ctx(pool, 2, 0, 'E');
        akv_dev_pool_req rq2[2] = {{.ctx = E, .n_tokens = 2 * 8192}, {.ctx = D, .n_tokens = 2 * 8192}};
        akv_dev_pool_result r2[2];
        pool_orders(akv_dev_pool_geom(pool), rq2, 2);
        CHECK_OK(akv_dev_pool_step(pool, rq2, 2, r2));
        CHECK_STR(window_str(pool, E), "0,1");
        CHECK_STR(window_str(pool, D), "0,1");
        CHECK_EQ_INT(akv_dev_pool_ctx_window(A), 0);
        EXPECT(&t, "E and D", {AKV_DEV_POOL_FROM_FREE, 2, 2}, {AKV_DEV_POOL_RECLAIM_IDLE, 1, 2});

        /* 7. Four new contexts at once: three floors fit (C is reclaimed whole, then D and E
         * are idle too), the fourth is refused with its reason and nothing changes for it */
        akv_dev_pool_ctx *F[4];
        akv_dev_pool_req rq4[4];
        akv_dev_pool_result r4[4];
        for (int i = 0; i < 4; i++) {
            F[i] = open_ctx(pool, 2, 0, 'F' + (uint64_t)i);
            rq4[i] = (akv_dev_pool_req){.ctx = F[i], .n_tokens = 2 * 8192};
        }
        pool_orders(akv_dev_pool_geom(pool), rq4, 4);
        CHECK_STATUS(akv_dev_pool_step(pool, rq4, 4, r4), AKV_EFULL);
        for (int i = 0; i < 3; i++) CHECK_OK(r4[i].status);
        CHECK_STATUS(r4[3].status, AKV_EFULL);
        CHECK_EQ_INT(akv_dev_pool_ctx_window(F[3]), 0);
        EXPECT(&t, "four floors in seven pages", {AKV_DEV_POOL_RECLAIM_IDLE, 3, 7},
               {AKV_DEV_POOL_FROM_FREE, 3, 3}, {AKV_DEV_POOL_WAIT_FLOOR, 1, 2});
        akv_dev_pool_ctx_get_stats(F[3], &cs);
        CHECK_EQ_U64(cs.last_wait.step, 7);
        CHECK_EQ_INT(cs.last_wait.reason, AKV_DEV_POOL_WAIT_FLOOR);
        CHECK_EQ_INT(cs.last_wait.needed, 2);
        CHECK_EQ_INT(cs.last_wait.free, 1);
        CHECK_EQ_INT(cs.last_wait.reclaimable, 0);
        CHECK_EQ_INT(cs.last_wait.n_active, 4);
        char text[1024];
        size_t n = akv_dev_pool_explain(pool, F[3], text, sizeof text);
        CHECK(n > 0 && n < sizeof text);
        CHECK(strstr(text, "refused: floor not available") != NULL);
        CHECK(strstr(text, "last wait: step 7") != NULL);
        printf("%s", text);
        char tiny[8];
        CHECK_EQ_U64(akv_dev_pool_explain(pool, F[3], tiny, sizeof tiny), n); /* truncated */
        CHECK_EQ_INT(strlen(tiny), 7);
        for (int i = 0; i < 4; i++) akv_dev_pool_ctx_close(pool, F[i]);
        EXPECT_NONE(&t, "closing");

        /* 8. J (target 2, burst 1) slides its full window: its own page outside the window is
         * reused; then a lowered burst releases the page outside the smaller window */
        akv_dev_pool_ctx *J = open_ctx(pool, 2, 1, 'J');
        CHECK_OK(step1(pool, J, 3, &r));
        CHECK_STR(window_str(pool, J), "0,1,2");
        EXPECT(&t, "J", {AKV_DEV_POOL_FROM_FREE, 3, 3});
        CHECK_OK(step1(pool, J, 4, &r));
        CHECK_STR(window_str(pool, J), "0,2,3");
        CHECK_EQ_INT(akv_dev_pool_ctx_slot(pool, J, 1, 2).fresh, 1);
        CHECK_EQ_INT(akv_dev_pool_ctx_slot(pool, J, 1, 1).fresh, 0);
        EXPECT(&t, "J slides", {AKV_DEV_POOL_REUSE_OWN, 1, 1});
        CHECK_OK(akv_dev_pool_ctx_set_target(pool, J, 2, 0));
        CHECK_OK(step1(pool, J, 4, &r));
        CHECK_STR(window_str(pool, J), "0,3");
        EXPECT(&t, "J lowered", {AKV_DEV_POOL_RELEASE_OUTSIDE, 1, 1});

        /* 9. K (target 6) next to J in one batch: J's pages are its by right, so K ends short
         * of its target; 5 free pages of 7 */
        akv_dev_pool_ctx *K = open_ctx(pool, 6, 0, 'K');
        akv_dev_pool_req rq_jk[2] = {{.ctx = J, .n_tokens = 4 * 8192}, {.ctx = K, .n_tokens = 6 * 8192}};
        pool_orders(akv_dev_pool_geom(pool), rq_jk, 2);
        CHECK_OK(akv_dev_pool_step(pool, rq_jk, 2, r2));
        CHECK_EQ_INT(r2[1].window, 5);
        CHECK_STR(window_str(pool, K), "0,2,3,4,5");
        EXPECT(&t, "K short", {AKV_DEV_POOL_FROM_FREE, 5, 5}, {AKV_DEV_POOL_SHORT_OF_TARGET, 1, 1});

        /* 10. a truncated history: K back to 2 pages releases what lies beyond it */
        CHECK_OK(step1(pool, K, 2, &r));
        CHECK_STR(window_str(pool, K), "0,1");
        EXPECT(&t, "K truncated", {AKV_DEV_POOL_REUSE_OWN, 1, 1}, {AKV_DEV_POOL_RELEASE_OUTSIDE, 1, 3});

        akv_dev_pool_stats fin;
        akv_dev_pool_get_stats(pool, &fin);
        for (int rr = 0; rr < AKV_DEV_POOL_REASON_COUNT; rr++)
            if (rr != AKV_DEV_POOL_WAIT_STAGING) /* covered by staging_reserve */
                CHECK(fin.counts.n_events[rr] > 0);
        n = akv_dev_pool_explain(pool, NULL, text, sizeof text);
        CHECK(n > 0 && n < sizeof text);
        printf("%s", text);
        akv_dev_pool_ctx *all[] = {A, B, C, D, E, J, K};
        for (size_t i = 0; i < AKV_ARRAY_LEN(all); i++) akv_dev_pool_ctx_close(pool, all[i]);
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_destroy(pool));
    }
}

/* ---- allocation failure at every site --------------------------------------------------------- */

static void test_alloc_failures(void) {
    TEST_CASE(create_fails_cleanly_at_every_allocation) {
        akv_geom g = geom2(2048);
        akv_dev_pool_params p = {.device_gib = 1, .staging_pages = 0};
        int n_host = 0, n_device = 0;
        for (int kind = 0; kind < 2; kind++) {
            for (uint64_t n = 1; n < 20; n++) {
                int64_t live = akv__alloc_live();
                akv_dev_pool *pool = NULL;
                if (kind == 0) akv__alloc_fail_nth(n);
                else CHECK_OK(akv_dev_inject_alloc_failure(dev, n, 0));
                akv_status st = akv_dev_pool_create(dev, &g, &p, &pool);
                int fired = kind == 0 ? akv__alloc_failure_fired() : st != AKV_OK;
                akv__alloc_fail_nth(0);
                CHECK_OK(akv_dev_inject_alloc_failure(dev, 0, 0));
                if (!fired) {
                    CHECK_OK(st);
                    CHECK_OK(akv_dev_pool_destroy(pool));
                    break;
                }
                kind == 0 ? n_host++ : n_device++;
                CHECK_STATUS(st, kind == 0 ? AKV_ENOMEM : AKV_EDEVMEM);
                CHECK(pool == NULL);
                CHECK_EQ_INT(akv__alloc_live(), live);
                CHECK_EQ_U64(akv_dev_get_usage(dev).device_bytes, 0);
            }
        }
        CHECK(n_host >= 4); /* pool, bitmaps, owners (+ the device front's table) */
        CHECK_EQ_INT(n_device, 1);
    }

    TEST_CASE(open_and_retarget_fail_cleanly) {
        akv_dev_pool *pool = make_pool(2048, 0);
        if (!pool) break;
        akv_dev_pool_ctx *keep = open_ctx(pool, 2, 0, 1);
        int n_failed = 0;
        for (uint64_t n = 1; n < 20; n++) {
            int64_t live = akv__alloc_live();
            akv_dev_pool_ctx *c = NULL;
            akv_dev_pool_ctx_params cp = {.target = 3, .burst = 1};
            akv__alloc_fail_nth(n);
            akv_status st = akv_dev_pool_ctx_open(pool, &cp, &c);
            int fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                akv_dev_pool_ctx_close(pool, c);
                break;
            }
            n_failed++;
            CHECK_STATUS(st, AKV_ENOMEM);
            CHECK(c == NULL);
            CHECK_EQ_INT(akv__alloc_live(), live);
            akv_dev_pool_stats s;
            akv_dev_pool_get_stats(pool, &s);
            CHECK_EQ_INT(s.n_contexts, 1);
            pool_ok(pool);
        }
        CHECK_EQ_INT(n_failed, 2); /* the context and its window arrays */
        /* a raised target grows the window arrays: on failure target and window stay */
        akv_dev_pool_req rq = {.ctx = keep, .n_tokens = 5 * 2048};
        akv_dev_pool_result rs;
        pool_orders(akv_dev_pool_geom(pool), &rq, 1);
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, &rs));
        akv__alloc_fail_nth(1);
        CHECK_STATUS(akv_dev_pool_ctx_set_target(pool, keep, 10, 0), AKV_ENOMEM);
        akv__alloc_fail_nth(0);
        pool_orders(akv_dev_pool_geom(pool), &rq, 1);
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, &rs));
        CHECK_EQ_INT(rs.window, 2); /* still target 2 */
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_ctx_set_target(pool, keep, 10, 0));
        pool_orders(akv_dev_pool_geom(pool), &rq, 1);
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, &rs));
        CHECK_EQ_INT(rs.window, 5);
        CHECK_STR(window_str(pool, keep), "0,1,2,3,4");
        pool_ok(pool);
        akv_dev_pool_ctx_close(pool, keep);
        CHECK_OK(akv_dev_pool_destroy(pool));
    }
}

/* ---- randomized ------------------------------------------------------------------------------ */

#define R_MAX_CTX 12

typedef struct r_ctx {
    akv_dev_pool_ctx *c;
    uint64_t id;       /* unique over the run: tags the page contents */
    uint64_t n_tokens; /* last served length (0 = never served) */
} r_ctx;

/* What a page of (ctx id, logical, layer) holds in this test. */
static uint64_t page_tag(uint64_t id, uint32_t logical, uint32_t layer) {
    return (id << 32) ^ ((uint64_t)logical << 8) ^ layer;
}

/* Writes the tag of every fresh page and checks the tag of every other window page: a page
 * that changed owner without being marked fresh, or was written by another, shows up. */
static int r_check_contents(akv_dev_pool *pool, const r_ctx *cs, int n) {
    uint32_t L = akv_dev_pool_geom(pool)->n_layers;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        for (uint32_t w = 0; w < akv_dev_pool_ctx_window(cs[i].c); w++) {
            for (uint32_t l = 0; l < L; l++) {
                akv_dev_pool_slot s = akv_dev_pool_ctx_slot(pool, cs[i].c, l, w);
                akv_dptr a = akv_dev_pool_page_addr(pool, s.page_id);
                uint64_t want = page_tag(cs[i].id, s.logical, l), got = 0;
                if (s.fresh) {
                    CHECK_OK(akv_dev_copy_h2d_sync(dev, a, &want, sizeof want));
                    continue;
                }
                CHECK_OK(akv_dev_copy_d2h_sync(dev, &got, a, sizeof got));
                if (got != want) {
                    CHECK_EQ_U64(got, want);
                    bad = 1;
                }
            }
        }
    }
    return !bad;
}

static void test_randomized(void) {
    TEST_CASE(the_order_decides_which_pages) {
        /* the pool holds a prefix of what each request's order asks, never a window of its
         * own choosing: an order that wants the oldest pages gets them; a victim loses the page
         * its order wants least; orders that are not an order are refused, nothing changed */
        akv_dev_pool *pool = make_pool(2048, 0);
        if (!pool) break;
        akv_dev_pool_ctx *a = open_ctx(pool, 3, 0, 1), *b = open_ctx(pool, 2, 0, 2);
        akv_dev_pool_result res[2];
        const uint32_t oldest_first[6] = {0, 1, 2, 3, 4, 5};
        akv_dev_pool_req rq = {.ctx = a, .n_tokens = 6 * 2048, .order = oldest_first,
                               .n_order = 6, .n_floor = 2};
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, res));
        CHECK_EQ_INT(res[0].window, 3);
        for (uint32_t w = 0; w < 3; w++)
            CHECK_EQ_INT(akv_dev_pool_ctx_slot(pool, a, 0, w).logical, w);
        pool_ok(pool);
        /* a shorter order: the pages it leaves out go back */
        rq.n_order = 2;
        CHECK_OK(akv_dev_pool_step(pool, &rq, 1, res));
        CHECK(res[0].window == 2 && akv_dev_pool_ctx_find(pool, a, 0, 2) < 0);
        pool_ok(pool);
        /* bad orders: repeated page, a page past the history, no floor, a floor past the order,
         * no order at all */
        const uint32_t rep[3] = {0, 1, 1}, past[2] = {0, 6};
        const akv_dev_pool_req bad[] = {
            {.ctx = b, .n_tokens = 6 * 2048, .order = rep, .n_order = 3, .n_floor = 1},
            {.ctx = b, .n_tokens = 6 * 2048, .order = past, .n_order = 2, .n_floor = 1},
            {.ctx = b, .n_tokens = 6 * 2048, .order = oldest_first, .n_order = 3, .n_floor = 0},
            {.ctx = b, .n_tokens = 6 * 2048, .order = oldest_first, .n_order = 1, .n_floor = 2},
            {.ctx = b, .n_tokens = 6 * 2048, .order = NULL, .n_order = 0, .n_floor = 0}};
        akv_dev_pool_stats st0, st1;
        akv_dev_pool_get_stats(pool, &st0);
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
            CHECK_STATUS(akv_dev_pool_step(pool, &bad[i], 1, res), AKV_EINVAL);
        akv_dev_pool_get_stats(pool, &st1);
        CHECK_EQ_U64(st1.n_steps, st0.n_steps);
        pool_ok(pool);
        akv_dev_pool_ctx_close(pool, a);
        akv_dev_pool_ctx_close(pool, b);
        CHECK_OK(akv_dev_pool_destroy(pool));
    }

    TEST_CASE(randomized_contexts_under_pressure) {
        uint64_t rng = test_seed(0xdeadbeef01);
        /* 16 MiB pages, 2 layers: 64 pages; staging 6 -> 29 window pages */
        akv_dev_pool *pool = make_pool(2048, 6);
        if (!pool) break;
        akv_dev_pool_stats st0;
        akv_dev_pool_get_stats(pool, &st0);
        CHECK_EQ_INT(st0.staging_reserve, 6);
        CHECK_EQ_INT(st0.window_capacity, 29);
        const uint32_t P = 2048;
        r_ctx cs[R_MAX_CTX];
        int n = 0;
        uint64_t next_id = 1, n_ops = 0, n_steps = 0, n_refused = 0, n_served = 0;
        uint32_t staged[16];
        uint32_t n_staged = 0;
        int ok = 1;
        for (int op = 0; op < 100000 && ok; op++, n_ops++) {
            uint64_t r = test_rand_below(&rng, 100);
            if (r < 6 && n < R_MAX_CTX) { /* arrive */
                uint32_t target = 2 + (uint32_t)test_rand_below(&rng, 6);
                uint32_t burst = (uint32_t)test_rand_below(&rng, 5);
                akv_dev_pool_ctx_params p = {.target = target, .burst = burst, .tag = next_id};
                if (!CHECK(akv_dev_pool_ctx_open(pool, &p, &cs[n].c) == AKV_OK)) break;
                cs[n].id = next_id++;
                cs[n].n_tokens = 0;
                n++;
            } else if (r < 11 && n > 0) { /* leave */
                int k = (int)test_rand_below(&rng, (uint64_t)n);
                akv_dev_pool_ctx_close(pool, cs[k].c);
                cs[k] = cs[--n];
            } else if (r < 14 && n > 0) { /* retarget */
                int k = (int)test_rand_below(&rng, (uint64_t)n);
                CHECK_OK(akv_dev_pool_ctx_set_target(pool, cs[k].c, 2 + (uint32_t)test_rand_below(&rng, 8),
                                                     (uint32_t)test_rand_below(&rng, 5)));
            } else if (r < 20) { /* staging buffers come and go */
                if (n_staged && test_rand_below(&rng, 2)) {
                    CHECK_OK(akv_dev_pool_staging_release(pool, n_staged, staged));
                    n_staged = 0;
                } else if (!n_staged) {
                    uint32_t want = 1 + (uint32_t)test_rand_below(&rng, 8);
                    akv_status s = akv_dev_pool_staging_acquire(pool, want, staged);
                    CHECK_STATUS(s, want > st0.staging_reserve ? AKV_EFULL : AKV_OK);
                    if (s == AKV_OK) n_staged = want;
                }
            } else if (n > 0) { /* a step: a random subset is active, the rest idle */
                akv_dev_pool_req rq[R_MAX_CTX];
                akv_dev_pool_result rs[R_MAX_CTX];
                int who[R_MAX_CTX], m = 0;
                for (int i = 0; i < n; i++) {
                    if (test_rand_below(&rng, 3) == 0) continue;
                    uint64_t t = cs[i].n_tokens;
                    uint64_t g = test_rand_below(&rng, 10);
                    /* mostly decode (one token), sometimes a prefill chunk, rarely a rewind */
                    t = g < 6 ? t + 1 : g < 9 ? t + 1 + test_rand_below(&rng, 3 * P) : 1 + test_rand_below(&rng, t + 1);
                    if (t > 40ull * P) t = 1 + test_rand_below(&rng, 40ull * P);
                    who[m] = i;
                    rq[m++] = (akv_dev_pool_req){.ctx = cs[i].c, .n_tokens = t};
                }
                pool_orders(akv_dev_pool_geom(pool), rq, (uint32_t)m);
                akv_status s = akv_dev_pool_step(pool, rq, (uint32_t)m, rs);
                n_steps++;
                int any = 0;
                for (int j = 0; j < m; j++) {
                    r_ctx *x = &cs[who[j]];
                    akv_dev_pool_ctx_stats st;
                    akv_dev_pool_ctx_get_stats(x->c, &st);
                    if (rs[j].status == AKV_EFULL) {
                        any = 1;
                        n_refused++;
                        CHECK_EQ_U64(st.n_tokens, x->n_tokens); /* its length did not move */
                        continue;
                    }
                    n_served++;
                    CHECK_OK(rs[j].status);
                    x->n_tokens = rq[j].n_tokens;
                    uint32_t n_lp = (uint32_t)((x->n_tokens + P - 1) / P);
                    uint32_t full = st.target + st.burst;
                    /* served: floor held, window within sink + newest (target + burst - 1) */
                    CHECK_EQ_INT(rs[j].window, st.window);
                    CHECK(st.window >= (n_lp < 2 ? n_lp : 2u));
                    CHECK(st.window <= (full < n_lp ? full : n_lp));
                    for (uint32_t w = 1; w < st.window; w++) {
                        uint32_t lp = akv_dev_pool_ctx_slot(pool, x->c, 0, w).logical;
                        CHECK(lp + (full < n_lp ? full : n_lp) > n_lp);
                    }
                }
                CHECK_STATUS(s, any ? AKV_EFULL : AKV_OK);
                if (!r_check_contents(pool, cs, n)) ok = 0;
            }
            if (!pool_ok(pool)) {
                printf("  diverged at operation %d\n", op);
                ok = 0;
            }
        }
        akv_dev_pool_stats st;
        akv_dev_pool_get_stats(pool, &st);
        printf("  %llu ops, %llu steps, %llu served, %llu refused\n", (unsigned long long)n_ops,
               (unsigned long long)n_steps, (unsigned long long)n_served,
               (unsigned long long)n_refused);
        for (int r = 0; r < AKV_DEV_POOL_REASON_COUNT; r++) {
            printf("    %-45s %8llu events %8llu pages\n", akv_dev_pool_reason_str((akv_dev_pool_reason)r),
                   (unsigned long long)st.counts.n_events[r], (unsigned long long)st.counts.n_pages[r]);
            CHECK(st.counts.n_events[r] > 0); /* the run reaches every reason */
        }
        CHECK(n_refused > 0 && n_served > 0);
        if (n_staged) CHECK_OK(akv_dev_pool_staging_release(pool, n_staged, staged));
        while (n > 0) akv_dev_pool_ctx_close(pool, cs[--n].c);
        pool_ok(pool);
        CHECK_OK(akv_dev_pool_destroy(pool));
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* misuse cases log by design */
    if (akv_dev_create(akv_dev_host_backend(), NULL, &dev) != AKV_OK) return 1;
    test_config();
    test_trace();
    test_alloc_failures();
    test_randomized();
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
}
