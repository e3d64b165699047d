/* test_route.c — the resident route on the host backend: the forward pass over device-pool
 * pages with the host copy authoritative (walker after every step), write-back of exactly the
 * new rows, pages reclaimed by another context refilled from the host copy with bit-identical
 * logits, and bad requests refused. Batches: sequences of one route stepped together give the
 * bits they give alone (host pass), close frees pages only after their fences, a reused
 * sequence takes new limits. The staged route: its window, leases and refusals, and THE
 * BITWISE CELLS (route_cells.h) with both passes on the host backend. */
#include "model_build.h"

#include <pthread.h>

#include "alloc_settled.h"
#include "akv/testing/dev_faults.h"
#include "model_ref64.h"
#include "route_cells.h"

#include "akv/dev_pool.h"
#include "akv/log.h"
#include "akv/forward.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "mem/mem_check.h"
#include "akv/stage.h"
#include "core/alloc.h"
#include "route/route_check.h"

enum { P = 16 }; /* tokens per page: small, so short histories span several pages */

typedef struct pools {
    akv_dev *dev;
    akv_geom g;
    akv_host_pool *hp;
    akv_dev_pool *dp;
} pools;

/* Pools for the model's geometry on the host backend (fx_pools_open). */
static int pools_open(pools *p, const akv_model_config *c, uint32_t window_cap) {
    memset(p, 0, sizeof *p);
    return fx_pools_open(akv_dev_host_backend(), c, P, window_cap, &p->dev, &p->g, &p->hp, &p->dp);
}

static void pools_close(pools *p) {
    CHECK_OK(akv_dev_pool_destroy(p->dp));
    CHECK_OK(akv_host_pool_destroy(p->hp));
    CHECK_OK(akv_dev_destroy(p->dev));
}

/* One step: grow the sequence by n tokens (n >= 1) and run them; logits of the last one. */
static akv_status feed(r1 *r, akv_forward *f, const int32_t *tokens, uint32_t n, float *logits) {
    return fx_feed_route(r, f, NULL, n, tokens, n, logits);
}

/* n tokens fed to the four hybrids of a test (host pass: resident hy, staged sy; device pass:
 * hq, sq), each staged one against its resident twin bit for bit; lh and lq get the resident
 * ones' last logits (n_vocab 23). false: a feed failed. */
static bool feed_four(r1 *hy, r1 *sy, r1 *hq, r1 *sq, akv_forward *fm, akv_forward_dev *fd,
                      const int32_t *t, uint32_t n, float *lh, float *lq) {
    float ls[23], lsq[23];
    if (!CHECK(feed(hy, fm, t, n, lh) == AKV_OK) || !CHECK(feed(sy, fm, t, n, ls) == AKV_OK) ||
        !CHECK(fx_feed_route(hq, NULL, fd, n, t, n, lq) == AKV_OK) ||
        !CHECK(fx_feed_route(sq, NULL, fd, n, t, n, lsq) == AKV_OK))
        return false;
    CHECK_BYTES(ls, lh, sizeof ls);
    CHECK_BYTES(lsq, lq, sizeof lsq);
    return true;
}

/* Two queued resident routes with the device pass on the host backend (a: the one that fails,
 * b: the clean reference), each fed the same first n tokens. 1 on success. */
static int fx_pair_open(fx *a, fx *b, const akv_model *m, const int32_t *tokens, uint32_t n,
                        float *logits) {
    int ok = fx_open(a, akv_dev_host_backend(), m, P, 4 * P, 16, true);
    ok = fx_open(b, akv_dev_host_backend(), m, P, 4 * P, 16, true) && ok;
    return ok && CHECK(fx_feed(a, tokens, n, logits) == AKV_OK) &&
           CHECK(fx_feed(b, tokens, n, logits) == AKV_OK);
}

/* The same n tokens into both: the logits must be bit-identical. */
static void fx_pair_same_step(fx *a, fx *b, const int32_t *tokens, uint32_t n, float *la) {
    float lb[64];
    CHECK_OK(fx_feed(a, tokens, n, la));
    CHECK_OK(fx_feed(b, tokens, n, lb));
    CHECK_BYTES(la, lb, a->n_vocab * sizeof *la);
}

/* a's host copy equals its device pages after a sync; both closed. */
static void fx_pair_close(fx *a, fx *b) {
    if (a->q.r) {
        CHECK_OK(akv_route_sync(a->q.r));
        CHECK_OK(akv__route_check(a->q.r));
    }
    fx_close(a);
    fx_close(b);
}

/* A host-attended route (window 2: the sink and the newest page; host_share 1: every page
 * outside it attended by the host in decode steps) with the device pass on the host backend. */
static int fx_open_host(fx *x, const akv_model *m, uint64_t max_history) {
    memset(x, 0, sizeof *x);
    const akv_model_config *c = akv_model_get_config(m);
    x->n_vocab = c->n_vocab, x->max_step_tokens = 16;
    akv_route_params rp = {.kind = AKV_ROUTE_HOST,
                           .max_history = max_history,
                           .queued = true,
                           .window_pages = 2,
                           .host_share = 1.0f,
                           .host_threads = 2};
    akv_forward_params fp = {.max_step_tokens = 16, .no_graphs = true};
    return fx_pools_open(akv_dev_host_backend(), c, P, 2, &x->dev, &x->g, &x->hp, &x->dp) &&
           CHECK(r1_open(x->dev, x->hp, x->dp, &rp, &x->q) == AKV_OK) &&
           CHECK(akv_forward_dev_create(x->dev, m, &fp, &x->fd) == AKV_OK);
}

/* A history's host copy read out page by page into one buffer: [layer][page][page_bytes]. */
typedef struct page_copy {
    uint8_t *buf;
    uint32_t n_pages;
    size_t page_bytes;
} page_copy;

static akv_status copy_page_out(void *user, uint32_t layer, uint32_t page, const void *bytes,
                                size_t page_bytes) {
    const page_copy *pc = user;
    memcpy(pc->buf + ((size_t)layer * pc->n_pages + page) * pc->page_bytes, bytes, page_bytes);
    return AKV_OK;
}

/* That buffer written into the pages of a sequence opened unfilled, on a thread of its own. */
typedef struct page_fill {
    void **pages;
    const uint8_t *buf;
    uint32_t n;
    size_t page_bytes;
} page_fill;

static void *fill_pages(void *arg) {
    const page_fill *pf = arg;
    for (uint32_t i = 0; i < pf->n; i++)
        memcpy(pf->pages[i], pf->buf + (size_t)i * pf->page_bytes, pf->page_bytes);
    return NULL;
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(5);
    const tm_shape shape = {.arch = "llama",
                            .n_layers = 2,
                            .n_embd = 32,
                            .n_ff = 48,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .n_vocab = 23};
    akv_model *model = tm_load(&shape, rng);
    if (!CHECK(model != NULL)) return test_finish();
    const akv_model_config *c = akv_model_get_config(model);
    akv_forward_params fp = {.max_step_tokens = P};
    akv_forward *f = NULL;
    if (!CHECK(akv_forward_create(model, &fp, &f) == AKV_OK)) return test_finish();
    int32_t tokens[256];
    for (int i = 0; i < 256; i++)
        tokens[i] = (int32_t)test_rand_below(&rng, c->n_vocab);
    float logits[23];
    double want[23];

    TEST_CASE(kinds_by_name_and_their_plan) {
        akv_route_kind k;
        CHECK_OK(akv_route_kind_from_name("staged", &k));
        CHECK(k == AKV_ROUTE_STAGED && !strcmp(akv_route_kind_name(k), "staged"));
        CHECK_OK(akv_route_kind_from_name("resident", &k));
        CHECK(k == AKV_ROUTE_RESIDENT && !strcmp(akv_route_kind_name(k), "resident"));
        CHECK_STATUS(akv_route_kind_from_name("nosuch", &k), AKV_EINVAL);
        CHECK_STATUS(akv_route_kind_from_name(NULL, &k), AKV_EINVAL);
        akv_geom g;
        CHECK_OK(akv_geom_init(&g, 2, 2, 8, AKV_DTYPE_BF16, P));
        /* need: resident reserves every page of the history (at least the floor of 2), staged
         * nothing */
        CHECK_EQ_INT(akv_route_need(AKV_ROUTE_RESIDENT, &g, 1), 2);
        CHECK_EQ_INT(akv_route_need(AKV_ROUTE_RESIDENT, &g, 5 * P + 1), 6);
        CHECK_EQ_INT(akv_route_need(AKV_ROUTE_STAGED, &g, 5 * P + 1), 0);
        /* the plan's windows: a staged share below the route's window is raised to it, and
         * windows that together pass the pool are refused; a resident history over the pool's
         * window capacity is refused */
        akv_route_plan pl;
        akv_fit fit = {.concurrency = 4, .window_capacity = 40, .target = 3, .burst = 5};
        CHECK_OK(akv_route_plan_begin(AKV_ROUTE_STAGED, 0, &g, 100 * P, 4, &pl));
        CHECK_EQ_INT(pl.window_pages, AKV_ROUTE_WINDOW_PAGES);
        CHECK_OK(akv_route_plan_finish(&g, 100 * P, &fit, &pl));
        CHECK(pl.target == 4 && pl.burst == 5);
        fit.window_capacity = 15;
        CHECK_STATUS(akv_route_plan_finish(&g, 100 * P, &fit, &pl), AKV_EFULL);
        CHECK_OK(akv_route_plan_begin(AKV_ROUTE_RESIDENT, 0, &g, 100 * P, 4, &pl));
        CHECK(pl.staging_pages == 0);
        fit.window_capacity = 99; /* a history of 100 pages */
        CHECK_STATUS(akv_route_plan_finish(&g, 100 * P, &fit, &pl), AKV_EFULL);
        fit.window_capacity = 100;
        CHECK_OK(akv_route_plan_finish(&g, 100 * P, &fit, &pl));
        CHECK(pl.target == 0 && pl.burst == 0);
        char line[256];
        akv_route_plan_format(&pl, 4, 101, line, sizeof line);
        CHECK(strstr(line, "resident") != NULL);
        CHECK_STATUS(akv_route_plan_begin((akv_route_kind)7, 0, &g, P, 1, &pl), AKV_EINVAL);
    }

    TEST_CASE(resident_matches_oracle_host_copy_authoritative) {
        pools p;
        if (!pools_open(&p, c, 0)) break;
        r1 r;
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 64};
        CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &r));
        if (!r.r) break;
        /* prefill 37 tokens in chunks of P (16, 16, 5), then 6 decode steps */
        uint32_t pos = 0;
        while (pos < 43) {
            uint32_t n = pos < 37 ? (37 - pos < P ? 37 - pos : P) : 1;
            if (!CHECK(feed(&r, f, tokens + pos, n, logits) == AKV_OK)) break;
            pos += n;
            CHECK_OK(akv__route_check(r.r));
            if (pos < 37) continue;
            ref64_forward(model, tokens, pos, c->n_layers, NULL, want);
            double worst = 0;
            for (int i = 0; i < 23; i++)
                worst = fmax(worst, fabs(logits[i] - want[i]));
            TEST_CHECK_(worst < 0.1, "after %u tokens the logits are off by %g", pos, worst);
        }
        r1_stats rs = r1_get_stats(&r);
        CHECK_EQ_U64(rs.s.n_tokens, 43);
        CHECK_EQ_U64(rs.r.n_steps, 3 + 6);
        CHECK_EQ_U64(rs.s.n_steps, 3 + 6);
        CHECK_EQ_U64(rs.r.h2d_bytes, 0); /* nothing was ever dropped from the device */
        CHECK_EQ_U64(rs.r.d2h_bytes, 43 * c->n_layers * akv_geom_token_bytes(&p.g));
        CHECK_EQ_U64(rs.s.d2h_bytes, rs.r.d2h_bytes);
        CHECK_EQ_INT(rs.s.window_pages, 3);
        CHECK_EQ_INT(rs.s.host_pages, 3);
        /* the placement: the whole history in the window, one run */
        akv_kv_run runs[4];
        const akv_kv_run whole = {0, 3, AKV_KV_WINDOW, AKV_REPR_EXACT};
        CHECK_EQ_INT(akv_route_seq_runs(r.s, runs, 4), 1);
        CHECK_BYTES(runs, &whole, sizeof whole);
        CHECK_OK(r1_close(&r));
        pools_close(&p);
    }

    TEST_CASE(unfilled_sequence_written_on_another_thread_goes_on_as_its_source) {
        /* akv_route_seq_open_unfilled: a 37-token history's host copy read out of one sequence
         * (akv_route_seq_read_pages) and written by another thread into the pages of a
         * sequence opened unfilled; until it is marked filled every call that would read or
         * change it is refused, and afterwards both go on bit for bit (staged, window 2: the
         * filled copy is what the stage reads). */
        pools p;
        if (!pools_open(&p, c, 0)) break;
        r1 a;
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 64, .max_seqs = 2};
        CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &a));
        if (!a.r || !CHECK(fx_feed_route(&a, f, NULL, P, tokens, 37, logits) == AKV_OK)) break;
        const size_t pb = akv_host_pool_page_bytes(p.hp);
        const uint32_t n_pages = 3, n_layers = c->n_layers;
        uint8_t *copy = malloc((size_t)n_layers * n_pages * pb);
        if (!CHECK(copy != NULL)) break;
        page_copy pc = {copy, n_pages, pb};
        CHECK_OK(akv_route_seq_read_pages(a.r, a.s, copy_page_out, &pc));
        void *pages[2 * 3];
        akv_route_seq *b = NULL;
        const akv_route_seq_params bp = {.tag = 2};
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_route_seq_open_unfilled(a.r, &bp, 0, pages, &b), AKV_EINVAL);
        CHECK_STATUS(akv_route_seq_open_unfilled(a.r, &bp, 65, pages, &b), AKV_EINVAL);
        akv_host_pool_stats hs0, hs1;
        akv_host_pool_get_stats(p.hp, &hs0);
        CHECK_OK(akv_route_seq_open_unfilled(a.r, &bp, 37, pages, &b)); /* closed unwritten */
        CHECK_OK(akv_route_seq_close(a.r, b));
        akv_host_pool_get_stats(p.hp, &hs1);
        CHECK_EQ_U64(hs1.n_used, hs0.n_used);
        b = NULL;
        CHECK_OK(akv_route_seq_open_unfilled(a.r, &bp, 37, pages, &b));
        if (!CHECK(b != NULL)) break;
        r1 rb = {a.r, b};
        akv_route_seq *fk = NULL;
        CHECK_STATUS(r1_step(&rb, 38), AKV_ESTATE);
        akv_route_req both[2] = {{a.s, 38}, {b, 38}};
        CHECK_STATUS(akv_route_begin_step(a.r, both, 2), AKV_ESTATE);
        CHECK_STATUS(akv_route_seq_fork(a.r, b, 16, &bp, &fk), AKV_ESTATE);
        CHECK_STATUS(akv_route_seq_read_pages(a.r, b, copy_page_out, &pc), AKV_ESTATE);
        CHECK_STATUS(akv_route_seq_truncate(a.r, b, 20), AKV_ESTATE);
        CHECK_STATUS(akv_route_seq_set_params(a.r, b, &bp), AKV_ESTATE);
        CHECK_STATUS(akv_route_seq_mark_filled(a.r, a.s), AKV_ESTATE);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        page_fill pf = {pages, copy, n_layers * n_pages, pb};
        pthread_t th;
        if (!CHECK(pthread_create(&th, NULL, fill_pages, &pf) == 0)) break;
        CHECK(feed(&a, f, tokens + 37, 1, logits) == AKV_OK); /* a steps while b is written */
        pthread_join(th, NULL);
        CHECK_OK(akv_route_seq_mark_filled(a.r, b));
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_route_seq_mark_filled(a.r, b), AKV_ESTATE);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK_OK(akv__route_check(a.r));
        float lb[23];
        for (uint32_t k = 37; k < 44; k++) { /* b catches up, then both go on together */
            if (!CHECK(feed(&rb, f, tokens + k, 1, lb) == AKV_OK)) break;
            if (k > 37 && !CHECK(feed(&a, f, tokens + k, 1, logits) == AKV_OK)) break;
            if (k == 37) continue; /* a's logits after token 37 came above */
            CHECK_BYTES(lb, logits, sizeof lb);
        }
        CHECK_OK(akv__route_check(a.r));
        CHECK_OK(akv_route_seq_close(a.r, b));
        free(copy);
        CHECK_OK(r1_close(&a));
        pools_close(&p);
    }

    TEST_CASE(reclaimed_pages_are_refilled_from_the_host_copy) {
        /* A window capacity of 8 pages per layer for two contexts of 4 and 5 pages: each step
         * of one reclaims from the other (idle), so the other's next step finds fresh pages
         * that hold old tokens and refills them from its host copy. Their logits must equal,
         * bit for bit, those of the same contexts run alone in a roomy pool. */
        pools tight, roomy;
        if (!pools_open(&tight, c, 8) || !pools_open(&roomy, c, 0)) break;
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 5 * P};
        r1 a, b, a_ref, b_ref;
        CHECK_OK(r1_open(tight.dev, tight.hp, tight.dp, &rp, &a));
        CHECK_OK(r1_open(tight.dev, tight.hp, tight.dp, &rp, &b));
        CHECK_OK(r1_open(roomy.dev, roomy.hp, roomy.dp, &rp, &a_ref));
        CHECK_OK(r1_open(roomy.dev, roomy.hp, roomy.dp, &rp, &b_ref));
        if (!a.r || !b.r || !a_ref.r || !b_ref.r) break;
        const int32_t *ta = tokens, *tb = tokens + 64;
        float la[23], lb[23];
        uint32_t na = 0, nb = 0;
        /* A to 60 tokens (4 pages), B to 70 (5 pages), then alternate decode steps */
        int ok = 1;
        while (ok && (na < 60 || nb < 70)) {
            if (na < 60) {
                uint32_t n = 60 - na < P ? 60 - na : P;
                ok &= CHECK(feed(&a, f, ta + na, n, la) == AKV_OK);
                ok &= CHECK(feed(&a_ref, f, ta + na, n, logits) == AKV_OK);
                ok &= CHECK_BYTES(la, logits, sizeof la);
                na += n;
            } else {
                uint32_t n = 70 - nb < P ? 70 - nb : P;
                ok &= CHECK(feed(&b, f, tb + nb, n, lb) == AKV_OK);
                ok &= CHECK(feed(&b_ref, f, tb + nb, n, logits) == AKV_OK);
                ok &= CHECK_BYTES(lb, logits, sizeof lb);
                nb += n;
            }
            ok &= CHECK(akv__route_check(a.r) == AKV_OK && akv__route_check(b.r) == AKV_OK);
        }
        for (int step = 0; ok && step < 6; step++) {
            r1 *r = step % 2 ? &b : &a, *ref = step % 2 ? &b_ref : &a_ref;
            const int32_t *t = step % 2 ? tb + nb++ : ta + na++;
            if (step == 2) {
                /* a refill that fails (a transient device error): the step fails; its retry
                 * must refill what the failed one placed but never filled */
                CHECK_OK(akv_dev_inject_fault(tight.dev, AKV_FAULT_SYNC, 1, 0));
                ok &= CHECK(feed(r, f, t, 1, la) != AKV_OK);
                CHECK_OK(akv_dev_clear_faults(tight.dev));
            }
            ok &= CHECK(feed(r, f, t, 1, la) == AKV_OK);
            ok &= CHECK(feed(ref, f, t, 1, logits) == AKV_OK);
            if (!CHECK_BYTES(la, logits, sizeof la)) printf("  decode step %d\n", step);
            ok &= CHECK(akv__route_check(a.r) == AKV_OK && akv__route_check(b.r) == AKV_OK);
        }
        r1_stats sa = r1_get_stats(&a), sb = r1_get_stats(&b), sref = r1_get_stats(&a_ref);
        CHECK(sa.s.h2d_bytes > 0 && sb.s.h2d_bytes > 0); /* both were refilled */
        CHECK_EQ_U64(sref.r.h2d_bytes, 0);
        akv_dev_pool_stats ps;
        akv_dev_pool_get_stats(tight.dp, &ps);
        CHECK(ps.counts.n_pages[AKV_DEV_POOL_RECLAIM_IDLE] > 0);
        CHECK_OK(r1_close(&a));
        CHECK_OK(r1_close(&b));
        CHECK_OK(r1_close(&a_ref));
        CHECK_OK(r1_close(&b_ref));
        pools_close(&tight);
        pools_close(&roomy);
    }

    TEST_CASE(bad_requests) {
        pools p;
        if (!pools_open(&p, c, 8)) break;
        akv_route *r = NULL;
        /* staged: a window above the pool's window capacity, or below the floor */
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 64, .window_pages = 9};
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &r), AKV_EINVAL);
        rp.window_pages = 1;
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &r), AKV_EINVAL);
        rp.window_pages = 0;
        rp.kind = AKV_ROUTE_RESIDENT;
        rp.max_history = 9 * P; /* 9 pages per layer: more than the window holds */
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &r), AKV_EINVAL);
        rp.max_history = 0;
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &r), AKV_EINVAL);
        rp.max_history = 2 * P, rp.max_seqs = AKV_ROUTE_MAX_SEQS + 1;
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &r), AKV_EINVAL);
        rp.max_seqs = 0;
        /* slot and reserve sizes saturate instead of wrapping to a small count */
        CHECK_EQ_U64(akv_route_slot_pages(&p.g, (uint64_t)P * ((1ull << 32) + 5), 4, 1), UINT32_MAX);
        akv_route_plan pl;
        CHECK_OK(akv_route_plan_begin(AKV_ROUTE_STAGED, 4, &p.g, (uint64_t)P * ((1ull << 31) + 4),
                                      1, &pl));
        CHECK_EQ_U64(pl.staging_pages, UINT32_MAX);
        CHECK_EQ_U64(akv_route_slot_pages(&p.g, (uint64_t)P * ((1ull << 29) + 4), 4, 9), UINT32_MAX);
        CHECK_EQ_U64(akv_route_slot_pages(&p.g, 10 * P, 4, 1), 6);
        CHECK_EQ_U64(akv_route_slot_pages(&p.g, 10 * P, 4, 3), 18);
        CHECK_OK(akv_route_plan_begin(AKV_ROUTE_STAGED, 4, &p.g, 10 * P, 1, &pl));
        CHECK_EQ_U64(pl.staging_pages, 12);
        CHECK_OK(akv_route_plan_begin(AKV_ROUTE_RESIDENT, 4, &p.g, 10 * P, 1, &pl));
        CHECK_EQ_U64(pl.staging_pages, 0);
        {
            /* a borrowed stage over another device pool (its copies would land where the
             * route's tables do not point) */
            akv_dev_pool_params dpp = akv_dev_pool_default_params();
            dpp.device_gib = 1;
            dpp.staging_pages = 8;
            akv_dev_pool *dp2 = NULL;
            akv_stage *st2 = NULL;
            akv_stage_params sp2 = akv_stage_default_params();
            sp2.slot_pages = 4;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &dpp, &dp2));
            CHECK_OK(akv_stage_create(p.dev, p.hp, dp2, &sp2, &st2));
            akv_route_params rs2 = {.kind = AKV_ROUTE_STAGED, .max_history = 4 * P, .window_pages = 2, .stage = st2};
            if (st2) CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rs2, &r), AKV_EINVAL);
            CHECK(r == NULL);
            CHECK_OK(akv_stage_destroy(st2));
            CHECK_OK(akv_dev_pool_destroy(dp2));
        }
        rp.max_history = 2 * P, rp.max_seqs = 2;
        r1 x;
        CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &x));
        if (!x.r) break;
        /* a sequence's own limit: above the route's is refused; below it, binding */
        akv_route_seq *y = NULL, *z = NULL;
        akv_route_seq_params yp = {.max_history = 2 * P + 1, .tag = 2};
        CHECK_STATUS(akv_route_seq_open(x.r, &yp, &y), AKV_EINVAL);
        yp.max_history = P;
        CHECK_OK(akv_route_seq_open(x.r, &yp, &y));
        CHECK_STATUS(r1_step(&x, 2 * P + 1), AKV_EINVAL); /* past max_history */
        CHECK_OK(feed(&x, f, tokens, 10, logits));
        CHECK_STATUS(r1_step(&x, 10), AKV_EINVAL); /* does not grow */
        {
            akv_route_req two[2] = {{x.s, 11}, {y, P + 1}}; /* y past its own limit */
            CHECK_STATUS(akv_route_begin_step(x.r, two, 2), AKV_EINVAL);
            two[1] = (akv_route_req){x.s, 12}; /* the same sequence twice */
            CHECK_STATUS(akv_route_begin_step(x.r, two, 2), AKV_EINVAL);
            akv_route_req three[3] = {{x.s, 11}, {y, 1}, {y, 2}}; /* more than max_seqs */
            CHECK_STATUS(akv_route_begin_step(x.r, three, 3), AKV_EINVAL);
            CHECK_STATUS(akv_route_begin_step(x.r, three, 0), AKV_EINVAL);
            /* a sequence of another route */
            r1 other;
            rp.max_seqs = 1;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &other));
            akv_route_req foreign = {other.s, 1};
            CHECK_STATUS(akv_route_begin_step(x.r, &foreign, 1), AKV_EINVAL);
            CHECK_STATUS(akv_route_seq_close(x.r, other.s), AKV_EINVAL);
            CHECK_OK(r1_close(&other));
        }
        {
            /* the forward hooks refuse a layer past the geometry's */
            akv_kv_hooks kv = akv_route_hooks(x.r);
            akv_kv_parts pg;
            CHECK_STATUS(kv.begin_layer(kv.user, c->n_layers, &pg), AKV_EINVAL);
            CHECK_STATUS(kv.end_layer(kv.user, c->n_layers), AKV_EINVAL);
            CHECK_OK(akv__route_check(x.r));
        }
        /* a step begun and abandoned (a failed pass) is undone by abort; a sequence closed
         * inside it waits for the sync to be freed, one outside any step is freed at once */
        akv_route_req two[2] = {{x.s, 20}, {y, 3}};
        CHECK_OK(akv_route_begin_step(x.r, two, 2));
        yp.tag = 3;
        CHECK_OK(akv_route_seq_open(x.r, &yp, &z));
        CHECK_OK(akv_route_seq_close(x.r, y));
        akv_route_stats rst;
        akv_route_get_stats(x.r, &rst);
        CHECK_EQ_INT(rst.n_closing, 1);
        CHECK_EQ_INT(rst.n_open, 2);
        CHECK_OK(akv_route_abort_step(x.r));
        akv_route_get_stats(x.r, &rst);
        CHECK_EQ_INT(rst.n_closing, 0);
        CHECK_EQ_U64(r1_len(&x), 10);
        CHECK_OK(akv__route_check(x.r));
        CHECK_STATUS(r1_truncate(&x, 11), AKV_EINVAL);
        CHECK_OK(akv_route_seq_close(x.r, z));
        akv_route_get_stats(x.r, &rst);
        CHECK_EQ_INT(rst.n_closing, 0);
        /* new limits for a reused sequence: not below its history */
        yp.max_history = 2 * P;
        CHECK_OK(akv_route_seq_set_params(x.r, x.s, &yp));
        yp.max_history = 5;
        CHECK_STATUS(akv_route_seq_set_params(x.r, x.s, &yp), AKV_EINVAL);
        /* a forward pass that fails (token outside the vocabulary) leaves the route as before */
        int32_t bad[2] = {1, 23};
        CHECK_STATUS(feed(&x, f, bad, 2, logits), AKV_EINVAL);
        CHECK_EQ_U64(r1_len(&x), 10);
        CHECK_OK(akv__route_check(x.r));
        CHECK_OK(feed(&x, f, tokens + 10, 6, logits));
        CHECK_OK(akv__route_check(x.r));
        CHECK_STATUS(akv_route_destroy(x.r), AKV_EBUSY); /* a sequence is open */
        CHECK_OK(r1_close(&x));
        pools_close(&p);
    }

    TEST_CASE(hybrid_reads_older_history_compact) {
        /* The compact tier on the host pass: a history's pages older than its exact recent
         * window (exact_recent = one page) are compact pages made from the host copy, read as
         * a second part merged by LSE. q8 on the test model (head dim 8), q4 on one of head dim
         * 32 (the rotation needs a power of two of at least 32). */
        const tm_shape wide = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 48,
                               .n_heads = 2, .n_kv_heads = 1, .n_vocab = 23};
        akv_model *m4 = tm_load(&wide, rng);
        for (int ti = 0; ti < 2 && CHECK(m4 != NULL); ti++) {
            const akv_repr tier = ti ? AKV_REPR_Q4 : AKV_REPR_Q8;
            const akv_model *m = ti ? m4 : model;
            const akv_model_config *mc = akv_model_get_config(m);
            akv_forward *fm = NULL;
            if (!REQUIRE_OK(akv_forward_create(m, &fp, &fm))) break;
            pools p;
            if (!pools_open(&p, mc, 0)) break;
            akv_dev_pool_params cpp = akv_dev_pool_default_params();
            cpp.device_gib = 1, cpp.repr = tier;
            akv_dev_pool *cp = NULL;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp));
            /* the exact route, the hybrid one, and a hybrid one whose window holds everything */
            r1 ex, hy, all;
            akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 128};
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &ex));
            akv_route_params hp = rp;
            hp.tier = tier, hp.compact_pool = cp, hp.exact_recent = P, hp.max_step = P;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &hp, &hy));
            akv_dev_pool *cp2 = NULL;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp2));
            akv_route_params hall = hp;
            hall.compact_pool = cp2, hall.exact_recent = 1000;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &hall, &all));
            /* the hybrid route with its sequence kept exact (akv_route_seq_params.exact) */
            akv_dev_pool *cp5 = NULL;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp5));
            akv_route_params hxp = hp;
            hxp.compact_pool = cp5;
            r1 hx = {0};
            const akv_route_seq_params xsp = {.tag = 1, .exact = 1};
            CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &hxp, &hx.r));
            if (hx.r) CHECK_OK(akv_route_seq_open(hx.r, &xsp, &hx.s));
            /* the same hybrid queued, through the device pass (its parts: the exact one and a
             * past one read by the decode, prompt chunks' rows as its queries, merged) */
            akv_dev_pool *cp3 = NULL;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp3));
            akv_forward_params fdp = {.max_step_tokens = P};
            akv_forward_dev *fd = NULL;
            CHECK_OK(akv_forward_dev_create(p.dev, m, &fdp, &fd));
            r1 hq, eq, aq;
            akv_route_params hqp = hp;
            hqp.compact_pool = cp3, hqp.queued = true;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &hqp, &hq));
            akv_route_params eqp = rp;
            eqp.queued = true;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &eqp, &eq));
            akv_dev_pool *cp4 = NULL;
            CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp4));
            akv_route_params aqp = hall;
            aqp.compact_pool = cp4, aqp.queued = true;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &aqp, &aq));
            if (!ex.r || !hy.r || !all.r || !hq.r || !hx.s || !fd) break;
            float le[23], lh[23], la[23], lq[23], leq[23], laq[23], lx[23];
            double worst = 0, span = 0, worst_q = 0, span_q = 0;
            uint32_t pos = 0;
            while (pos < 100) { /* prompt of 70 in chunks of P, then decode steps */
                uint32_t n = pos < 70 ? (70 - pos < P ? 70 - pos : P) : 1;
                if (!CHECK(feed(&ex, fm, tokens + pos, n, le) == AKV_OK) ||
                    !CHECK(feed(&hy, fm, tokens + pos, n, lh) == AKV_OK) ||
                    !CHECK(feed(&all, fm, tokens + pos, n, la) == AKV_OK) ||
                    !CHECK(feed(&hx, fm, tokens + pos, n, lx) == AKV_OK) ||
                    !CHECK(fx_feed_route(&hq, NULL, fd, n, tokens + pos, n, lq) == AKV_OK) ||
                    !CHECK(fx_feed_route(&eq, NULL, fd, n, tokens + pos, n, leq) == AKV_OK) ||
                    !CHECK(fx_feed_route(&aq, NULL, fd, n, tokens + pos, n, laq) == AKV_OK))
                    break;
                /* the device pass's parts where nothing is compact: its one-part bits */
                CHECK_BYTES(laq, leq, sizeof leq);
                pos += n;
                CHECK_OK(akv__route_check(hy.r)); /* compact pages = encodings of the host copy */
                CHECK_OK(akv_route_sync(hq.r)); /* queued: its write-backs done */
                CHECK_OK(akv__route_check(hq.r));
                CHECK_BYTES(la, le, sizeof le); /* nothing compact: the exact route's bits */
                CHECK_BYTES(lx, le, sizeof le); /* kept exact: the same */
                CHECK_OK(akv__route_check(hx.r));
                for (int i = 0; i < 23; i++) {
                    worst = fmax(worst, fabs(lh[i] - le[i])), span = fmax(span, fabs(le[i]));
                    worst_q = fmax(worst_q, fabs(lq[i] - leq[i])), span_q = fmax(span_q, fabs(leq[i]));
                }
            }
            /* the device pass's hybrid against its own exact route moves as the host pass's
             * does (its activations are rounded to bf16, so its host copies, and the compact
             * pages made from them, are not the host pass's: the passes are compared each with
             * its exact route; q4 on a random 2-layer model moves logits by half their span
             * either way, so its bound is loose: the all-exact queued hybrid's bits above are the
             * plumbing's check) */
            printf("  %s: the device pass's hybrid off its exact route by %.3g (logits span %.3g)\n",
                   akv_repr_name(tier), worst_q, span_q);
            /* the queued route made its pages leaving the exact window from their device copies
             * (the walker above compared every one with the codec's encoding of the host copy) */
            const r1_stats qs = r1_get_stats(&hq);
            CHECK(qs.r.compact_device > 0 && qs.r.compact_device <= qs.r.compact_pages);
            CHECK(worst_q > 0 && worst_q < (ti ? 0.75 : 0.05) * span_q);
            /* the compact part is read (the logits move), and within the form's error: the
             * quality of a form is the perplexity tests' to judge (tests/perplexity.sh); here a
             * wrong page or a missed rotation would move them by the logits' whole span */
            printf("  %s: worst logit off the exact route's over 100 tokens: %.3g (logits span "
                   "%.3g)\n",
                   akv_repr_name(tier), worst, span);
            CHECK(worst > 0 && worst < (ti ? 0.6 : 0.05) * span);
            /* placement: the sink exact, pages 1..4 compact, 5..6 exact (x0 = (100-16)/16 = 5) */
            akv_kv_run runs[4];
            const akv_kv_run want_runs[] = {{0, 1, AKV_KV_WINDOW, AKV_REPR_EXACT},
                                            {1, 4, AKV_KV_WINDOW, tier},
                                            {5, 2, AKV_KV_WINDOW, AKV_REPR_EXACT}};
            CHECK_EQ_INT(akv_route_seq_runs(hy.s, runs, 4), 3);
            CHECK_BYTES(runs, want_runs, sizeof want_runs);
            r1_stats hs = r1_get_stats(&hy), as = r1_get_stats(&all);
            CHECK_EQ_U64(hs.r.compact_pages, 4u * mc->n_layers); /* each made once */
            CHECK_EQ_INT(hs.s.window_pages, 3);
            CHECK_EQ_U64(as.r.compact_pages, 0);
            /* kept exact: one exact run over its 7 pages, every one in its window, none compact */
            const akv_kv_run exact_run = {0, 7, AKV_KV_WINDOW, AKV_REPR_EXACT};
            CHECK_EQ_INT(akv_route_seq_runs(hx.s, runs, 4), 1);
            CHECK_BYTES(runs, &exact_run, sizeof exact_run);
            CHECK_EQ_U64(r1_get_stats(&hx).r.compact_pages, 0);
            CHECK_EQ_INT(r1_get_stats(&hx).s.window_pages, 7);
            /* fixed at open: set_params keeps it */
            akv_route_seq_params back = {.tag = 1};
            CHECK_OK(akv_route_seq_set_params(hx.r, hx.s, &back));
            CHECK_EQ_INT(akv_route_seq_runs(hx.s, runs, 4), 1);
            /* truncated and fed again with other tokens: the compact pages of rewritten rows
             * are made again (the walker compares every compact page with the encoding of
             * the host copy after each step) */
            CHECK_OK(r1_truncate(&hy, 20)); /* under one exact window: no compact step until it grows again */
            int32_t other[100];
            for (int i = 0; i < 100; i++) other[i] = (tokens[i] + 5) % 23;
            pos = 20;
            while (pos < 100) {
                uint32_t n = pos < 89 ? (89 - pos < P ? 89 - pos : P) : 1;
                if (!CHECK(feed(&hy, fm, other + pos, n, lh) == AKV_OK)) break;
                pos += n;
                CHECK_OK(akv__route_check(hy.r));
            }
            hs = r1_get_stats(&hy);
            CHECK(hs.r.compact_pages > 4u * mc->n_layers); /* made again: every one */
            CHECK_OK(r1_close(&ex));
            CHECK_OK(r1_close(&hy));
            CHECK_OK(r1_close(&all));
            CHECK_OK(r1_close(&hq));
            CHECK_OK(r1_close(&eq));
            CHECK_OK(r1_close(&aq));
            CHECK_OK(r1_close(&hx));
            CHECK_OK(akv_dev_pool_destroy(cp5));
            akv_forward_dev_destroy(fd);
            CHECK_OK(akv_dev_pool_destroy(cp));
            CHECK_OK(akv_dev_pool_destroy(cp2));
            CHECK_OK(akv_dev_pool_destroy(cp3));
            CHECK_OK(akv_dev_pool_destroy(cp4));
            pools_close(&p);
            akv_forward_destroy(fm);
        }
        akv_model_destroy(m4);
        /* refused: a tier on the staged kind, a tier without its pool, a pool of another form */
        pools p;
        if (!pools_open(&p, c, 0)) break;
        akv_route *bad = NULL;
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 64, .tier = AKV_REPR_Q8};
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad) != AKV_OK);
        rp.kind = AKV_ROUTE_RESIDENT;
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad), AKV_EINVAL);
        akv_dev_pool_params cpp = akv_dev_pool_default_params();
        cpp.device_gib = 1, cpp.repr = AKV_REPR_Q8;
        akv_dev_pool *cp = NULL;
        CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp));
        rp.compact_pool = cp, rp.tier = AKV_REPR_Q4; /* a pool of q8 pages for a q4 tier */
        CHECK(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad) != AKV_OK);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK_OK(akv_dev_pool_destroy(cp));
        pools_close(&p);
    }

    TEST_CASE(staged_hybrid_is_the_resident_hybrid) {
        /* The staged compact route: compact copies made once on the host, a compact window of
         * 2 pages per layer in the compact pool, the older compact pages staged each step.
         * Its logits are the resident hybrid's bit for bit (the same compact bytes, the same
         * table order), on the host pass and through the device pass (queued), across a
         * truncate and a history fed again; the walker compares every compact copy and every
         * compact window page with the codec's encoding of the host copy. */
        const tm_shape wide = {.arch = "llama", .n_layers = 2, .n_embd = 64, .n_ff = 48,
                               .n_heads = 2, .n_kv_heads = 1, .n_vocab = 23};
        akv_model *m4 = tm_load(&wide, rng);
        for (int ti = 0; ti < 2 && CHECK(m4 != NULL); ti++) {
            const akv_repr tier = ti ? AKV_REPR_Q4 : AKV_REPR_Q8;
            const akv_model *m = ti ? m4 : model;
            const akv_model_config *mc = akv_model_get_config(m);
            akv_forward *fm = NULL;
            if (!REQUIRE_OK(akv_forward_create(m, &fp, &fm))) break;
            pools p;
            if (!pools_open(&p, mc, 0)) break;
            akv_dev_pool_params cpp = akv_dev_pool_default_params();
            cpp.device_gib = 1, cpp.repr = tier;
            akv_dev_pool_params spp = cpp; /* the staged ones' compact pools: a staging reserve */
            spp.staging_pages = akv_route_compact_staging_pages(&p.g, 128, 1);
            akv_host_pool_params chp = akv_host_pool_default_params();
            chp.limit_gib = 1, chp.repr = tier;
            akv_dev_pool *cp[4] = {0};
            akv_host_pool *hc[2] = {0};
            for (int i = 0; i < 4; i++)
                CHECK_OK(akv_dev_pool_create(p.dev, &p.g, i < 2 ? &cpp : &spp, &cp[i]));
            for (int i = 0; i < 2; i++) CHECK_OK(akv_host_pool_create(p.dev, &p.g, &chp, &hc[i]));
            akv_forward_params fdp = {.max_step_tokens = P};
            akv_forward_dev *fd = NULL;
            CHECK_OK(akv_forward_dev_create(p.dev, m, &fdp, &fd));
            /* resident hybrid (host pass, device pass) and staged hybrid (the same two) */
            r1 hy, hq, sy, sq;
            akv_route_params hp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 128, .tier = tier,
                                   .compact_pool = cp[0], .exact_recent = P, .max_step = P};
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &hp, &hy));
            hp.compact_pool = cp[1], hp.queued = true;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &hp, &hq));
            akv_route_params sp = hp;
            sp.kind = AKV_ROUTE_STAGED, sp.queued = false, sp.compact_pool = cp[2];
            sp.compact_host_pool = hc[0], sp.compact_target = 2;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &sp, &sy));
            sp.compact_pool = cp[3], sp.compact_host_pool = hc[1], sp.queued = true;
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &sp, &sq));
            if (!hy.r || !hq.r || !sy.r || !sq.r || !fd) break;
            float lh[23], lq[23];
            int32_t other[100];
            for (int i = 0; i < 100; i++) other[i] = (tokens[i] + 5) % 23;
            for (int round = 0; round < 2; round++) {
                /* round 0: a prompt of 70 in chunks of P, then decode steps to 100; round 1:
                 * truncated to 20 and fed other tokens (the compact copies of rewritten rows
                 * are made again) */
                const int32_t *tok = round ? other : tokens;
                uint32_t pos = round ? 20 : 0;
                const uint32_t prompt = round ? 89 : 70;
                while (pos < 100) {
                    uint32_t n = pos < prompt ? (prompt - pos < P ? prompt - pos : P) : 1;
                    if (!feed_four(&hy, &sy, &hq, &sq, fm, fd, tok + pos, n, lh, lq)) break;
                    pos += n;
                    CHECK_OK(akv__route_check(sy.r));
                    CHECK_OK(akv_route_sync(sq.r));
                    CHECK_OK(akv__route_check(sq.r));
                }
                if (round == 0) {
                    /* the sink exact; compact pages 1, 2 staged, 3, 4 in the compact window;
                     * 5, 6 exact (x0 = (100 - 16) / 16 = 5) */
                    akv_kv_run runs[6];
                    const akv_kv_run want_runs[] = {{0, 1, AKV_KV_WINDOW, AKV_REPR_EXACT},
                                                    {1, 2, AKV_KV_STAGED, tier},
                                                    {3, 2, AKV_KV_WINDOW, tier},
                                                    {5, 2, AKV_KV_WINDOW, AKV_REPR_EXACT}};
                    CHECK_EQ_INT(akv_route_seq_runs(sy.s, runs, 6), 4);
                    CHECK_BYTES(runs, want_runs, sizeof want_runs);
                    const r1_stats ss = r1_get_stats(&sy);
                    CHECK_EQ_U64(ss.r.compact_pages, 4u * mc->n_layers); /* each copy made once */
                    CHECK(ss.r.staged_bytes > 0 && ss.r.n_leases > 0);
                    CHECK(ss.s.staged_bytes == ss.r.staged_bytes);
                    CHECK_OK(r1_truncate(&hy, 20));
                    CHECK_OK(r1_truncate(&hq, 20));
                    CHECK_OK(r1_truncate(&sy, 20));
                    CHECK_OK(r1_truncate(&sq, 20));
                }
            }
            CHECK(r1_get_stats(&sy).r.compact_pages > 4u * mc->n_layers); /* made again */
            /* a fork (akv_route_seq_fork) of a 100-token history goes on as the history would:
             * the staged ones forked against the resident twins, then the resident ones forked
             * against the staged forks; every step bit for bit. The fork shares its source's
             * full pages (exact and compact copies), so both stay open while the fork runs on,
             * and the source then gives the fork's logits for the same tokens: neither wrote
             * what the other reads */
            for (int phase = 0; phase < 2; phase++) {
                r1 *fk[2] = {phase ? &hy : &sy, phase ? &hq : &sq};
                akv_route_seq *orig[2] = {fk[0]->s, fk[1]->s};
                akv_host_pool_stats hs0, hs1;
                akv_host_pool_get_stats(p.hp, &hs0);
                for (int i = 0; i < 2; i++) {
                    akv_route_seq *forked = NULL;
                    const akv_route_seq_params fpar = {.tag = 2};
                    if (!CHECK(akv_route_seq_fork(fk[i]->r, fk[i]->s, 100 + 3 * phase, &fpar, &forked) == AKV_OK))
                        continue;
                    fk[i]->s = forked;
                }
                akv_host_pool_get_stats(p.hp, &hs1);
                /* 100 + 3 * phase tokens: 6 full pages of each layer shared by each fork, the
                 * partial seventh copied */
                CHECK_EQ_U64(hs1.n_shares - hs0.n_shares, 2u * 6 * mc->n_layers);
                CHECK_EQ_U64(hs1.n_used - hs0.n_used, 2u * 1 * mc->n_layers);
                float fl[2][3][23];
                for (uint32_t k = 0; k < 3; k++) {
                    if (!feed_four(&hy, &sy, &hq, &sq, fm, fd, other + 3 * phase + k, 1, lh, lq)) break;
                    memcpy(fl[0][k], lh, sizeof lh); /* the staged ones' too: bit for bit */
                    memcpy(fl[1][k], lq, sizeof lq);
                    CHECK_OK(akv__route_check(sy.r));
                    CHECK_OK(akv_route_sync(sq.r));
                    CHECK_OK(akv__route_check(sq.r));
                    CHECK_OK(akv__host_pool_check(p.hp));
                }
                if (phase == 1) {
                    /* every history cut to 40 tokens, into page 2, which the resident forks
                     * share with their sources: each takes a private copy of it (the staged
                     * ones' compact tables cut to page 2's start), and the four go on bit for
                     * bit in pairs; the sources, below, still give the forks' logits */
                    for (int i = 0; i < 4; i++) CHECK_OK(r1_truncate((r1 *[]){&hy, &hq, &sy, &sq}[i], 40));
                    akv_host_pool_stats hs2;
                    akv_host_pool_get_stats(p.hp, &hs2);
                    CHECK_EQ_U64(hs2.n_shares, 2u * 2 * mc->n_layers); /* pages 0 and 1 still shared */
                    for (uint32_t k = 0; k < 2 && feed_four(&hy, &sy, &hq, &sq, fm, fd, tokens + 50 + k, 1, lh, lq); k++)
                        CHECK_OK(akv__host_pool_check(p.hp));
                }
                for (int i = 0; i < 2; i++) { /* the sources, fed the same tokens, then closed */
                    akv_route_seq *forked = fk[i]->s;
                    fk[i]->s = orig[i];
                    for (uint32_t k = 0; k < 3; k++) {
                        const int32_t *t = other + 3 * phase + k;
                        float lo[23];
                        if (!CHECK((i ? fx_feed_route(fk[i], NULL, fd, 1, t, 1, lo) : feed(fk[i], fm, t, 1, lo)) == AKV_OK))
                            break;
                        CHECK_BYTES(lo, fl[i][k], sizeof lo);
                    }
                    CHECK_OK(akv_route_sync(fk[i]->r));
                    CHECK_OK(akv_route_seq_close(fk[i]->r, orig[i]));
                    fk[i]->s = forked;
                }
                CHECK_OK(akv__host_pool_check(p.hp));
            }
            CHECK_OK(r1_close(&hy));
            CHECK_OK(r1_close(&hq));
            CHECK_OK(akv_route_sync(sy.r)); /* its last step's leases retired */
            CHECK_OK(r1_close(&sy));
            CHECK_OK(r1_close(&sq));
            akv_forward_dev_destroy(fd);
            for (int i = 0; i < 4; i++) CHECK_OK(akv_dev_pool_destroy(cp[i]));
            for (int i = 0; i < 2; i++) CHECK_OK(akv_host_pool_destroy(hc[i]));
            pools_close(&p);
            akv_forward_destroy(fm);
        }
        akv_model_destroy(m4);
        /* refused: the staged tier without its compact host pool, a compact host pool on the
         * resident kind, one of another form, a compact pool without a staging reserve, a
         * compact window the pool cannot hold */
        pools p;
        if (!pools_open(&p, c, 0)) break;
        akv_dev_pool_params cpp = akv_dev_pool_default_params();
        cpp.device_gib = 1, cpp.repr = AKV_REPR_Q8;
        akv_host_pool_params chp = akv_host_pool_default_params();
        chp.limit_gib = 1, chp.repr = AKV_REPR_Q8;
        akv_dev_pool *cp = NULL, *cs = NULL;
        akv_host_pool *hc = NULL, *h4 = NULL;
        CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cp));
        cpp.staging_pages = akv_route_compact_staging_pages(&p.g, 64, 1);
        CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cs));
        CHECK_OK(akv_host_pool_create(p.dev, &p.g, &chp, &hc));
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        chp.repr = AKV_REPR_Q4; /* head dim 8: no q4 pages */
        CHECK_STATUS(akv_host_pool_create(p.dev, &p.g, &chp, &h4), AKV_EUNSUPPORTED);
        akv_route *bad = NULL;
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 64, .tier = AKV_REPR_Q8,
                               .compact_pool = cs};
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad), AKV_EINVAL);
        rp.kind = AKV_ROUTE_RESIDENT, rp.compact_host_pool = hc;
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad), AKV_EINVAL);
        rp.kind = AKV_ROUTE_STAGED, rp.compact_pool = cp; /* no staging reserve */
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad), AKV_EFULL);
        rp.compact_pool = cs, rp.compact_target = 1; /* below the floor */
        CHECK_STATUS(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad), AKV_EINVAL);
        rp.compact_target = 0;
        CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &bad));
        CHECK(bad && akv_route_get_params(bad).compact_target >= 2);
        CHECK_OK(akv_route_destroy(bad));
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK_OK(akv_dev_pool_destroy(cp));
        CHECK_OK(akv_dev_pool_destroy(cs));
        CHECK_OK(akv_host_pool_destroy(hc));
        pools_close(&p);
    }

    TEST_CASE(staged_hybrid_batch_of_two) {
        /* Two sequences in each step of a queued staged hybrid (compact window 2, the rest
         * staged: each sequence's compact pages at its own offsets of one copy list and of
         * the compact table) against the resident hybrid with the same two: every step's
         * logits bit for bit; the walker after each step. */
        pools p;
        if (!pools_open(&p, c, 0)) break;
        akv_dev_pool_params cpp = akv_dev_pool_default_params();
        cpp.device_gib = 1, cpp.repr = AKV_REPR_Q8;
        akv_dev_pool_params spp = cpp;
        spp.staging_pages = akv_route_compact_staging_pages(&p.g, 128, 2);
        akv_host_pool_params chp = akv_host_pool_default_params();
        chp.limit_gib = 1, chp.repr = AKV_REPR_Q8;
        akv_dev_pool *cr = NULL, *cs = NULL;
        akv_host_pool *hc = NULL;
        CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &cpp, &cr));
        CHECK_OK(akv_dev_pool_create(p.dev, &p.g, &spp, &cs));
        CHECK_OK(akv_host_pool_create(p.dev, &p.g, &chp, &hc));
        akv_forward_params fdp = {.max_step_tokens = 2 * P, .max_logits = 2};
        akv_forward_dev *fd = NULL;
        CHECK_OK(akv_forward_dev_create(p.dev, model, &fdp, &fd));
        akv_route *rr = NULL, *rs = NULL;
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 128, .max_seqs = 2,
                               .queued = true, .tier = AKV_REPR_Q8, .compact_pool = cr,
                               .exact_recent = P, .max_step = P};
        CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &rr));
        rp.kind = AKV_ROUTE_STAGED, rp.compact_pool = cs, rp.compact_host_pool = hc;
        rp.compact_target = 2;
        CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &rs));
        akv_route_seq *sr[2] = {0}, *ss[2] = {0};
        for (int i = 0; i < 2 && rr && rs; i++) {
            akv_route_seq_params sp = {.tag = (uint64_t)i + 1};
            CHECK_OK(akv_route_seq_open(rr, &sp, &sr[i]));
            CHECK_OK(akv_route_seq_open(rs, &sp, &ss[i]));
        }
        if (!fd || !sr[1] || !ss[1]) break;
        const uint32_t nv = c->n_vocab;
        float *lr = malloc(2 * nv * sizeof *lr), *ls = malloc(2 * nv * sizeof *ls);
        uint32_t len = 0, same = 0, steps = 0;
        while (len < 110) { /* prompts of 64 in chunks of P, then decode steps */
            const uint32_t n = len < 64 ? P : 1;
            uint32_t n_new[2] = {n, n}, pos0[2] = {len, len};
            int32_t tok[2 * P];
            for (uint32_t i = 0; i < 2; i++)
                for (uint32_t k = 0; k < n; k++) tok[i * n + k] = tokens[(len + k + 37 * i) % 100];
            const akv_forward_batch fb = {.n_seq = 2, .n_new = n_new, .pos0 = pos0, .tokens = tok};
            akv_route_req qr[2] = {{sr[0], len + n}, {sr[1], len + n}};
            akv_route_req qs[2] = {{ss[0], len + n}, {ss[1], len + n}};
            akv_kv_hooks kr = akv_route_hooks(rr), ks = akv_route_hooks(rs);
            if (!CHECK(akv_route_begin_step(rr, qr, 2) == AKV_OK) ||
                !CHECK(akv_forward_dev_step(fd, &fb, &kr, lr) == AKV_OK) ||
                !CHECK(akv_route_begin_step(rs, qs, 2) == AKV_OK) ||
                !CHECK(akv_forward_dev_step(fd, &fb, &ks, ls) == AKV_OK))
                break;
            same += !memcmp(lr, ls, 2 * nv * sizeof *lr), steps++;
            len += n;
            CHECK_OK(akv_route_sync(rs));
            CHECK_OK(akv__route_check(rs));
        }
        CHECK_EQ_INT(same, steps);
        CHECK(steps == 4 + 46);
        akv_route_stats st;
        akv_route_get_stats(rs, &st);
        CHECK(st.staged_bytes > 0);
        free(lr), free(ls);
        CHECK_OK(akv_route_sync(rr));
        CHECK_OK(akv_route_sync(rs));
        for (int i = 0; i < 2; i++) {
            CHECK_OK(akv_route_seq_close(rr, sr[i]));
            CHECK_OK(akv_route_seq_close(rs, ss[i]));
        }
        CHECK_OK(akv_route_destroy(rr));
        CHECK_OK(akv_route_destroy(rs));
        akv_forward_dev_destroy(fd);
        CHECK_OK(akv_dev_pool_destroy(cr));
        CHECK_OK(akv_dev_pool_destroy(cs));
        CHECK_OK(akv_host_pool_destroy(hc));
        pools_close(&p);
    }

    TEST_CASE(staged_window_leases_and_refusals) {
        /* a staged route of window 2 over 5 pages: the walker after every step (the window's
         * pages equal the host copy), one lease per layer per step, destroy refused until the
         * leases retire, a pass abandoned inside a layer undone by truncate */
        pools p;
        if (!pools_open(&p, c, 0)) break;
        r1 r;
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 5 * P, .window_pages = 2};
        CHECK_STATUS(r1_open(p.dev, p.hp, p.dp, &rp, &r), AKV_EFULL); /* no reserve */
        pools_close(&p);
        if (!pools_open(&p, c, 64)) break;
        CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &r));
        if (!r.r) break;
        uint32_t pos = 0, n_steps = 0;
        while (pos < 70) {
            uint32_t n = pos < 40 ? P : 1;
            if (!CHECK(feed(&r, f, tokens + pos, n, logits) == AKV_OK)) break;
            pos += n, n_steps++;
            CHECK_OK(akv_route_sync(r.r));
            CHECK_OK(akv__route_check(r.r));
        }
        r1_stats rs = r1_get_stats(&r);
        CHECK_EQ_U64(rs.r.n_leases, (uint64_t)n_steps * c->n_layers);
        CHECK_EQ_INT(rs.s.window_pages, 2);
        /* the placement of the last step: 70 tokens in 5 pages, a window of 2 (the newest and
         * the sink), the 3 between staged */
        akv_kv_run runs[8];
        const akv_kv_run want_runs[] = {{0, 1, AKV_KV_WINDOW, AKV_REPR_EXACT},
                                        {1, 3, AKV_KV_STAGED, AKV_REPR_EXACT},
                                        {4, 1, AKV_KV_WINDOW, AKV_REPR_EXACT}};
        CHECK_EQ_INT(akv_route_seq_runs(r.s, runs, 8), 3);
        CHECK_BYTES(runs, want_runs, sizeof want_runs);
        CHECK(rs.r.staged_bytes > 0 && rs.s.staged_bytes == rs.r.staged_bytes);
        CHECK_EQ_U64(rs.r.d2h_bytes, 70 * c->n_layers * akv_geom_token_bytes(&p.g));
        /* the last step's timeline: every layer staged, each copy before its attention, the
         * layers' copies in order on the one H2D queue */
        akv_route_layer_times lt[8];
        CHECK_EQ_INT(akv_route_step_times(r.r, lt, 8), c->n_layers);
        for (uint32_t l = 0; l < c->n_layers && l < 8; l++) {
            CHECK(lt[l].copy_start_ns <= lt[l].copy_done_ns && lt[l].copy_done_ns <= lt[l].attn_start_ns &&
                  lt[l].attn_start_ns <= lt[l].attn_done_ns && lt[l].attn_done_ns > 0);
            if (l) CHECK(lt[l].copy_start_ns >= lt[l - 1].copy_done_ns);
        }
        /* a pass that stops inside layer 0 (its lease open): abort cancels and retires */
        CHECK_OK(r1_step(&r, 71));
        akv_kv_hooks kv = akv_route_hooks(r.r);
        akv_kv_parts pg;
        CHECK_OK(kv.begin_layer(kv.user, 0, &pg));
        CHECK_OK(akv_route_abort_step(r.r));
        CHECK_EQ_U64(r1_len(&r), 70);
        CHECK_OK(akv_route_sync(r.r));
        CHECK_OK(akv__route_check(r.r));
        CHECK_OK(feed(&r, f, tokens + 70, 1, logits));
        CHECK_OK(akv_route_sync(r.r));
        CHECK_OK(akv__route_check(r.r));
        CHECK_OK(feed(&r, f, tokens + 71, 1, logits));
        /* destroy waits for the step's leases: the sequence closes (its pages wait), the route
         * refuses until a sync retires them */
        CHECK_STATUS(r1_close(&r), AKV_EBUSY);
        rs = (r1_stats){0};
        akv_route_get_stats(r.r, &rs.r);
        CHECK_EQ_INT(rs.r.n_closing, 1);
        CHECK_OK(akv_route_sync(r.r));
        akv_route_get_stats(r.r, &rs.r);
        CHECK_EQ_INT(rs.r.n_closing, 0);
        CHECK_OK(r1_close(&r));
        pools_close(&p);
    }

    for (uint64_t nth = 1; nth <= 2; nth++) TEST_CASE(staged_copy_failure_released_after_recovery) {
        /* a copy that fails while it runs faults its queue: the staged copy of the step's
         * first layer (nth 1: the step fails) or its write-back (nth 2: the step returns and
         * the failure surfaces at retire). The sync fails the stage, which quarantines and,
         * completion unknown, retains the leases; a sync while the device is still faulted
         * drains it once for all of them, not once per lease; once the device recovers the
         * next sync establishes completion, and destroy frees everything */
        pools p;
        if (!pools_open(&p, c, 64)) break;
        r1 r;
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 5 * P, .window_pages = 2};
        CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &r));
        if (!r.r) break;
        for (uint32_t pos = 0; pos < 3 * P; pos += P)
            CHECK_OK(feed(&r, f, tokens + pos, P, logits));
        CHECK_OK(akv_route_sync(r.r));
        CHECK_OK(akv_dev_inject_fault(p.dev, AKV_FAULT_COPY_EXEC, nth, 0));
        CHECK((feed(&r, f, tokens + 3 * P, 1, logits) != AKV_OK) == (nth == 1));
        CHECK(akv_route_sync(r.r) != AKV_OK); /* the queue is still faulted */
        akv_route_stats q0, q1;
        akv_route_get_stats(r.r, &q0);
        CHECK(q0.n_quarantines >= 1);
        CHECK(akv_route_sync(r.r) != AKV_OK); /* every live lease refused: one quarantine */
        akv_route_get_stats(r.r, &q1);
        CHECK_EQ_U64(q1.n_quarantines - q0.n_quarantines, 1);
        CHECK_STATUS(r1_close(&r), AKV_EBUSY); /* the retained leases */
        CHECK_OK(akv_dev_clear_faults(p.dev));
        CHECK_STATUS(akv_route_sync(r.r), AKV_EFAILED); /* the stage stays failed */
        CHECK_OK(r1_close(&r));
        pools_close(&p);
    }

    TEST_CASE(lease_whose_begin_failed_is_retired_after_recovery) {
        /* a borrowed stage that poisons its slots: the first step's lease begins, then its
         * poison copy fails to submit (the stage issued the lease and fails). The route must
         * hold that lease like any, so that after recovery truncate and destroy go through
         * (they answered AKV_EBUSY for ever: a randomized review) */
        pools p;
        if (!pools_open(&p, c, 64)) break;
        akv_stage_params sp = akv_stage_default_params();
        sp.slot_pages = akv_route_slot_pages(&p.g, 4 * P, 2, 1);
        sp.poison_byte = 0xA5;
        akv_stage *st = NULL;
        CHECK_OK(akv_stage_create(p.dev, p.hp, p.dp, &sp, &st));
        r1 r = {0};
        akv_route_params rp = {.kind = AKV_ROUTE_STAGED, .max_history = 4 * P, .window_pages = 2, .stage = st};
        if (st) CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &r));
        if (r.r) {
            CHECK_OK(akv_dev_inject_fault(p.dev, AKV_FAULT_COPY, 1, 0));
            CHECK(feed(&r, f, tokens, 7, logits) != AKV_OK);
            CHECK_OK(akv_dev_clear_faults(p.dev));
            (void)akv_route_sync(r.r); /* the stage stays failed; its leases are released */
            CHECK_OK(r1_truncate(&r, 0));
            CHECK_OK(r1_close(&r));
        }
        CHECK_OK(akv_stage_destroy(st));
        pools_close(&p);
    }

    TEST_CASE(queued_table_upload_failing_while_it_runs_is_redone) {
        /* a queued step whose table upload is accepted and then fails on its queue (the
         * 2-token step crosses into a new page, so the whole table goes up): the step fails;
         * after recovery the retry must upload the table again (accepted is not done) and give
         * the bits of a route that never failed (found by a randomized review) */
        fx a, b;
        if (fx_pair_open(&a, &b, model, tokens, P - 1, logits)) {
            CHECK_OK(akv_dev_inject_fault(a.dev, AKV_FAULT_COPY_EXEC, 1, 0));
            CHECK(fx_feed(&a, tokens + P - 1, 2, logits) != AKV_OK);
            CHECK_OK(akv_dev_clear_faults(a.dev));
            CHECK_OK(r1_truncate(&a.q, P - 1));
            fx_pair_same_step(&a, &b, tokens + P - 1, 2, logits);
            fx_pair_same_step(&a, &b, tokens + P + 1, 1, logits);
        }
        fx_pair_close(&a, &b);
    }

    TEST_CASE(queued_step_failing_while_it_runs_keeps_the_host_copy) {
        /* One queued decode step, replayed as a graph and op by op, with its k-th copy or op
         * failing while it runs, for every k; the caller does what akv run does: truncate only
         * when the feed fails. A write-back failing leaves the feed OK and surfaces at the
         * next sync: after recovery the route writes it again from the device pages (it was
         * forgotten, and the host copy lacked the step's rows: a randomized review). A step
         * whose kernels failed is undone (and said to be, once). Either way the host copy then
         * equals a clean route's. */
        const akv_dev_fault kinds[2] = {AKV_FAULT_COPY_EXEC, AKV_FAULT_OP_EXEC};
        for (int eager = 0; eager < 2; eager++) {
            fx b;
            float clean[23];
            uint64_t passes[AKV_N_FAULTS] = {0};
            if (!fx_open_pass(&b, akv_dev_host_backend(), model, P, 4 * P, 16, true, eager) ||
                !CHECK(fx_feed(&b, tokens, P - 1, logits) == AKV_OK)) {
                fx_close(&b);
                break;
            }
            for (int i = 0; i < 2; i++) passes[kinds[i]] = akv_dev_fault_passes(b.dev, kinds[i]);
            CHECK_OK(fx_feed(&b, tokens + P - 1, 1, clean));
            for (int i = 0; i < 2; i++)
                passes[kinds[i]] = akv_dev_fault_passes(b.dev, kinds[i]) - passes[kinds[i]];
            CHECK_OK(akv_route_sync(b.q.r));
            int kept = 0, undone = 0;
            for (int i = 0; i < 2; i++) {
                for (uint64_t k = 1; k <= passes[kinds[i]]; k++) {
                    fx a;
                    if (!fx_open_pass(&a, akv_dev_host_backend(), model, P, 4 * P, 16, true,
                                      eager) ||
                        !CHECK(fx_feed(&a, tokens, P - 1, logits) == AKV_OK)) {
                        fx_close(&a);
                        break;
                    }
                    CHECK_OK(akv_dev_inject_fault(a.dev, kinds[i], k, 0));
                    bool fed = fx_feed(&a, tokens + P - 1, 1, logits) == AKV_OK;
                    (void)akv_dev_sync(a.dev);
                    CHECK_OK(akv_dev_clear_faults(a.dev));
                    if (akv_route_sync(a.q.r) != AKV_OK) /* once, for a step undone */
                        CHECK_OK(akv_route_sync(a.q.r));
                    if (r1_len(&a.q) == P - 1) {
                        undone++;
                        fed = CHECK(fx_feed(&a, tokens + P - 1, 1, logits) == AKV_OK);
                    } else {
                        kept++;
                    }
                    if (fed) CHECK_BYTES(logits, clean, sizeof clean);
                    CHECK_OK(akv_route_sync(a.q.r));
                    CHECK_EQ_U64(r1_len(&a.q), P);
                    uint64_t bad = rc_host_diff(&a.g, a.hp, akv_route_seq_host_table(a.q.s), b.hp,
                                                akv_route_seq_host_table(b.q.s));
                    TEST_CHECK_(bad == 0, "%s, fault '%s' at pass %llu: %llu rows of the host "
                                "copy differ from a clean route's",
                                eager ? "op by op" : "graphs", akv_dev_fault_name(kinds[i]),
                                (unsigned long long)k, (unsigned long long)bad);
                    CHECK_OK(akv__route_check(a.q.r));
                    fx_close(&a);
                }
            }
            printf("  %s: %d failing steps kept (write-backs redone), %d undone and fed again\n",
                   eager ? "op by op" : "graphs", kept, undone);
            CHECK(kept > 0 && undone > 0);
            fx_close(&b);
        }
    }

    TEST_CASE(step_undone_after_recovery_is_reported_by_the_next_call) {
        /* A decode step whose kernels fail while they run; the caller's truncate fails on the
         * faulted device and is not retried (akv run's order). After recovery the next
         * begin_step, for the length the caller still believes, must settle first: it
         * undoes the step and says so (it answered EINVAL, "does not grow": a review), and the
         * retry runs to a clean route's logits. */
        fx a, b;
        float clean[23];
        if (fx_pair_open(&a, &b, model, tokens, P - 1, logits)) {
            CHECK_OK(fx_feed(&b, tokens + P - 1, 1, clean));
            CHECK_OK(akv_dev_inject_fault(a.dev, AKV_FAULT_OP_EXEC, 1, 0));
            CHECK(fx_feed(&a, tokens + P - 1, 1, logits) != AKV_OK);
            (void)akv_dev_sync(a.dev);
            CHECK_OK(akv_dev_clear_faults(a.dev));
            CHECK_STATUS(r1_step(&a.q, P), AKV_EDEVICE); /* the undo, said once */
            CHECK_EQ_U64(r1_len(&a.q), P - 1);
            CHECK_OK(fx_feed(&a, tokens + P - 1, 1, logits));
            CHECK_BYTES(logits, clean, sizeof clean);
        }
        fx_pair_close(&a, &b);
    }

    TEST_CASE(queued_step_abandoned_before_its_last_layer_is_refilled) {
        /* A queued step that places a new page uploads the whole table; that upload fails
         * while it runs and the pass fails before any layer ends (an op refused). The device
         * recovers, THEN the caller truncates (the queues are healthy by then, so no failed
         * wait marks the device's tables stale). The retry must upload the table again:
         * it kept the stale one and read another page (found by a randomized review) */
        fx a, b;
        if (fx_pair_open(&a, &b, model, tokens, P - 1, logits)) {
            CHECK_OK(akv_dev_inject_fault(a.dev, AKV_FAULT_COPY_EXEC, 1, 0)); /* the table */
            CHECK_OK(akv_dev_inject_fault(a.dev, AKV_FAULT_OP, 1, 0));       /* the pass */
            CHECK_OK(r1_step(&a.q, P + 1));
            akv_kv_hooks kv = akv_route_hooks(a.q.r);
            CHECK(akv_forward_dev_run(a.fd, tokens + P - 1, 2, P - 1, &kv, logits, false) != AKV_OK);
            (void)akv_dev_sync(a.dev);
            CHECK_OK(akv_dev_clear_faults(a.dev));
            CHECK_OK(akv_route_abort_step(a.q.r));
            fx_pair_same_step(&a, &b, tokens + P - 1, 2, logits);
        }
        fx_pair_close(&a, &b);
    }

    TEST_CASE(failed_fence_on_a_shared_stage_spares_other_routes_after_recovery) {
        /* Staged queued routes S1 and S2 share a stage; R, resident, never touches it. S1's
         * decode step has its k-th copy fail while it runs (for every k); the device
         * recovers; S2 then steps, its lease taking the slot S1's lease held. The stage must
         * not make the recovered device wait on S1's failed fence (a wait on a failed record
         * faults the waiting queue: R then failed too, with no fault armed: a randomized
         * review); it reports its own failure instead. R syncs and steps. */
        for (uint64_t k = 1; k <= 8; k++) {
            pools p;
            if (!pools_open(&p, c, 64)) break;
            akv_forward_params fdp = {.max_step_tokens = P};
            akv_forward_dev *fd = NULL;
            akv_stage_params sp = akv_stage_default_params();
            sp.slot_pages = akv_route_slot_pages(&p.g, 4 * P, 2, 1);
            akv_stage *stg = NULL;
            r1 s1 = {0}, s2 = {0}, r = {0};
            CHECK_OK(akv_forward_dev_create(p.dev, model, &fdp, &fd));
            CHECK_OK(akv_stage_create(p.dev, p.hp, p.dp, &sp, &stg));
            akv_route_params ps = {.kind = AKV_ROUTE_STAGED, .max_history = 4 * P, .queued = true,
                                   .window_pages = 2, .stage = stg, .prefetch = -1};
            akv_route_params pr = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P, .queued = true};
            if (stg) CHECK_OK(r1_open(p.dev, p.hp, p.dp, &ps, &s1));
            if (stg) CHECK_OK(r1_open(p.dev, p.hp, p.dp, &ps, &s2));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &pr, &r));
            if (fd && s1.r && s2.r && r.r) {
                CHECK_OK(fx_feed_route(&s1, NULL, fd, P, tokens, 2 * P + 9, NULL));
                CHECK_OK(fx_feed_route(&s2, NULL, fd, P, tokens + 50, 2 * P + 9, NULL));
                CHECK_OK(fx_feed_route(&r, NULL, fd, P, tokens + 100, 5, NULL));
                CHECK_OK(akv_route_sync(s1.r));
                CHECK_OK(akv_route_sync(s2.r));
                CHECK_OK(akv_route_sync(r.r));
                CHECK_OK(akv_dev_inject_fault(p.dev, AKV_FAULT_COPY_EXEC, k, 0));
                (void)fx_feed_route(&s1, NULL, fd, P, tokens + 2 * P + 9, 1, logits);
                (void)akv_dev_sync(p.dev);
                CHECK_OK(akv_dev_clear_faults(p.dev));
                (void)fx_feed_route(&s2, NULL, fd, P, tokens + 60, 3, NULL);
                (void)akv_dev_sync(p.dev);
                akv_status rs = akv_route_sync(r.r);
                TEST_CHECK_(rs == AKV_OK, "copy failing at pass %llu of S1's step: R's sync after "
                            "recovery returned %s", (unsigned long long)k, akv_status_str(rs));
                CHECK_OK(fx_feed_route(&r, NULL, fd, P, tokens + 105, 1, logits));
                CHECK_OK(akv_route_sync(r.r));
                CHECK_OK(akv__route_check(r.r));
            }
            for (int i = 0; i < 2; i++) { /* the stage may have failed: release, then empty */
                r1 *x = i ? &s2 : &s1;
                if (!x->r) continue;
                (void)akv_route_sync(x->r);
                (void)akv_route_sync(x->r);
                CHECK_OK(r1_truncate(x, 0));
                CHECK_OK(r1_close(x));
            }
            CHECK_OK(r1_close(&r));
            if (stg) CHECK_OK(akv_stage_destroy(stg));
            akv_forward_dev_destroy(fd);
            pools_close(&p);
        }
    }

    TEST_CASE(failed_write_back_is_not_redone_from_reclaimed_pages) {
        /* Queued resident routes A and B in one tight pool (4 window pages per layer), the
         * device pass on the host backend. A's 5-token step with its k-th copy failing while
         * it runs, for every k; the device recovers; then B's 4-page history takes A's idle
         * page (a reclaim) and writes its own rows there; then A syncs. A failed write-back
         * must not be redone from that page (A's host copy got B's rows: a review): A keeps
         * its step only with the host copy of a clean route, else the step is undone and
         * said to be. */
        fx ref;
        float lr[23];
        if (!fx_open(&ref, akv_dev_host_backend(), model, P, 4 * P, P, true) ||
            !CHECK(fx_feed(&ref, tokens, 5, lr) == AKV_OK)) {
            fx_close(&ref);
            break;
        }
        CHECK_OK(akv_route_sync(ref.q.r));
        int kept = 0, undone = 0, reclaimed = 0;
        for (uint64_t k = 1; k <= 8; k++) {
            pools p;
            akv_forward_dev *fd = NULL;
            r1 a = {0}, b = {0};
            akv_forward_params fdp = {.max_step_tokens = P};
            akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P, .queued = true};
            if (!pools_open(&p, c, 4)) break;
            CHECK_OK(akv_forward_dev_create(p.dev, model, &fdp, &fd));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &a));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &b));
            if (fd && a.r && b.r) {
                CHECK_OK(akv_dev_inject_fault(p.dev, AKV_FAULT_COPY_EXEC, k, 0));
                (void)fx_feed_route(&a, NULL, fd, P, tokens, 5, NULL); /* no logits read */
                (void)akv_dev_sync(p.dev);
                CHECK_OK(akv_dev_clear_faults(p.dev));
                for (uint32_t n = 0; n < 4 * P; n += P)
                    CHECK_OK(fx_feed_route(&b, NULL, fd, P, tokens + 100 + n, P, NULL));
                CHECK_OK(akv_route_sync(b.r));
                akv_dev_pool_stats ps;
                akv_dev_pool_get_stats(p.dp, &ps);
                reclaimed += ps.counts.n_pages[AKV_DEV_POOL_RECLAIM_IDLE] > 0;
                akv_status st = akv_route_sync(a.r);
                if (st != AKV_OK) CHECK_OK(akv_route_sync(a.r)); /* once, for a step undone */
                if (r1_len(&a) == 5) {
                    kept++;
                    uint64_t bad = rc_host_diff(&p.g, p.hp, akv_route_seq_host_table(a.s), ref.hp,
                                                akv_route_seq_host_table(ref.q.s));
                    TEST_CHECK_(bad == 0, "copy failing at pass %llu: A kept its step and %llu "
                                "rows of its host copy are not its own",
                                (unsigned long long)k, (unsigned long long)bad);
                } else {
                    undone++;
                    CHECK_EQ_U64(r1_len(&a), 0);
                    CHECK_STATUS(st, AKV_EDEVICE);
                }
            }
            CHECK_OK(r1_close(&a));
            CHECK_OK(r1_close(&b));
            akv_forward_dev_destroy(fd);
            pools_close(&p);
        }
        printf("  copy failing at passes 1..8 of A's step: %d kept, %d undone, %d with a reclaim\n",
               kept, undone, reclaimed);
        CHECK(undone > 0 && reclaimed > 0);
        fx_close(&ref);
    }

    TEST_CASE(reclaimed_pages_wait_for_other_routes_write_backs) {
        /* A staged direct route X (its stage writes back on the D2H queue, asynchronously)
         * and a resident direct route Y in one tight pool (4 window pages per layer): Y's steps
         * reclaim X's idle window pages and write them. That must wait for X's write-backs
         * still reading them, or X's host copy gets Y's rows (a randomized review; the host
         * backend's queue delays widen the race). Reference: X's tokens on a resident route
         * of its own. */
        pools p, q;
        bool open = pools_open(&p, c, 4);
        open = pools_open(&q, c, 0) && open;
        r1 x = {0}, y = {0}, xr = {0};
        akv_route_params px = {.kind = AKV_ROUTE_STAGED, .max_history = 4 * P, .window_pages = 2};
        akv_route_params py = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P};
        akv_route_params pr = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P};
        if (open) {
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &px, &x));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &py, &y));
            CHECK_OK(r1_open(q.dev, q.hp, q.dp, &pr, &xr));
        }
        if (x.r && y.r && xr.r) {
            float lr[23];
            CHECK_OK(akv_dev_inject_delays(p.dev, 7, 20000, 1));
            for (uint32_t n = 0; n < 2 * P + 9; n += n + P <= 2 * P + 9 ? P : 9) {
                uint32_t k = n + P <= 2 * P + 9 ? P : 9;
                CHECK_OK(feed(&x, f, tokens + n, k, logits));
                CHECK_OK(feed(&xr, f, tokens + n, k, lr));
            }
            for (uint32_t n = 0; n < 4 * P; n += P) CHECK_OK(feed(&y, f, tokens + 100 + n, P, logits));
            CHECK_OK(akv_route_sync(x.r));
            CHECK_OK(akv_dev_inject_delays(p.dev, 7, 0, 1));
            CHECK_OK(akv_route_sync(xr.r));
            akv_dev_pool_stats ps;
            akv_dev_pool_get_stats(p.dp, &ps);
            CHECK(ps.counts.n_pages[AKV_DEV_POOL_RECLAIM_IDLE] > 0);
            CHECK_EQ_U64(rc_host_diff(&p.g, p.hp, akv_route_seq_host_table(x.s), q.hp,
                                      akv_route_seq_host_table(xr.s)),
                         0);
            CHECK_OK(feed(&x, f, tokens + 2 * P + 9, 1, logits));
            CHECK_OK(feed(&xr, f, tokens + 2 * P + 9, 1, lr));
            CHECK_BYTES(logits, lr, sizeof lr);
            CHECK_OK(akv_route_sync(x.r));
        }
        CHECK_OK(r1_close(&x));
        CHECK_OK(r1_close(&y));
        CHECK_OK(r1_close(&xr));
        if (open) pools_close(&p), pools_close(&q);
    }

    TEST_CASE(fills_of_a_failed_pass_do_not_land_on_another_routes_pages) {
        /* Queued resident routes X and Y in one tight pool (4 window pages per layer), the
         * device pass on the host backend. X's pages were reclaimed by Y; X's step places them
         * fresh (fills), a large copy ahead of them on the H2D queue keeps them in flight, and
         * X's pass fails at its first begin_layer (the compute queue's wait for the fills
         * cannot be submitted), so nothing waits for them. Y's new sequence Z then reclaims
         * those pages and writes its rows: its compute must wait for the fills still in
         * flight, or they land on Z's rows (a review reproduced that). Reference: Z alone. */
        pools p, q;
        bool open = pools_open(&p, c, 4);
        open = pools_open(&q, c, 0) && open;
        akv_forward_params fwp = {.max_step_tokens = 4 * P};
        akv_forward_dev *fd = NULL, *fq = NULL;
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P, .queued = true};
        r1 x = {0};
        akv_route *yr = NULL, *rr = NULL;
        void *hbig = NULL;
        akv_dptr dbig = {0};
        const size_t big = (size_t)256 << 20;
        if (open) {
            CHECK_OK(akv_forward_dev_create(p.dev, model, &fwp, &fd));
            CHECK_OK(akv_forward_dev_create(q.dev, model, &fwp, &fq));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp, &x));
            CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &yr));
            CHECK_OK(akv_route_create(q.dev, q.hp, q.dp, &rp, &rr));
            CHECK_OK(akv_dev_pinned_alloc(p.dev, big, &hbig));
            CHECK_OK(akv_dev_mem_alloc(p.dev, big, &dbig));
        }
        if (fd && fq && x.r && yr && rr && hbig) {
            float lz[23], lr[23];
            akv_route_seq_params sp = {.tag = 2};
            r1 y = {.r = yr}, z = {.r = yr}, zr = {.r = rr};
            CHECK_OK(fx_feed_route(&x, NULL, fd, P, tokens, 2 * P, lz));
            CHECK_OK(akv_route_seq_open(yr, &sp, &y.s)); /* Y takes X's pages */
            CHECK_OK(fx_feed_route(&y, NULL, fd, P, tokens + 100, 4 * P, lz));
            CHECK_OK(akv_route_seq_close(yr, y.s));
            CHECK_OK(akv_route_sync(yr));
            CHECK_OK(r1_step(&x, 2 * P + 1)); /* X's pages back, fresh: fills */
            memset(hbig, 1, big);
            CHECK_OK(akv_dev_copy_h2d_async(p.dev, AKV_QUEUE_H2D, dbig, hbig, big));
            CHECK_OK(akv_dev_inject_fault(p.dev, AKV_FAULT_WAIT, 2, 0));
            akv_kv_hooks kv = akv_route_hooks(x.r);
            akv_kv_parts parts;
            memset(&parts, 0, sizeof parts);
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            CHECK(kv.begin_layer(kv.user, 0, &parts) != AKV_OK);
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            sp.tag = 3;
            CHECK_OK(akv_route_seq_open(yr, &sp, &z.s)); /* Z takes X's pages and writes them */
            CHECK_OK(akv_route_seq_open(rr, &sp, &zr.s));
            CHECK_OK(fx_feed_route(&z, NULL, fd, 4 * P, tokens + 150, 4 * P - 1, lz));
            CHECK_OK(fx_feed_route(&zr, NULL, fq, 4 * P, tokens + 150, 4 * P - 1, lr));
            CHECK_BYTES(lz, lr, sizeof lr);
            CHECK_OK(akv_dev_sync(p.dev));
            CHECK_OK(akv_route_abort_step(x.r));
            CHECK_OK(akv_route_sync(yr));
            CHECK_OK(akv__route_check(yr)); /* Z's device pages are its host copy */
            CHECK_OK(fx_feed_route(&z, NULL, fd, 4 * P, tokens + 230, 1, lz));
            CHECK_OK(fx_feed_route(&zr, NULL, fq, 4 * P, tokens + 230, 1, lr));
            CHECK_BYTES(lz, lr, sizeof lr);
            akv_dev_pool_stats ps;
            akv_dev_pool_get_stats(p.dp, &ps);
            CHECK(ps.counts.n_pages[AKV_DEV_POOL_RECLAIM_IDLE] > 0);
            CHECK_OK(akv_route_sync(yr));
            CHECK_OK(akv_route_sync(rr));
            CHECK_OK(akv_route_seq_close(yr, z.s));
            CHECK_OK(akv_route_seq_close(rr, zr.s));
        }
        CHECK_OK(r1_close(&x));
        if (yr) CHECK_OK(akv_route_destroy(yr));
        if (rr) CHECK_OK(akv_route_destroy(rr));
        if (hbig) CHECK_OK(akv_dev_pinned_free(p.dev, hbig));
        if (dbig.addr) CHECK_OK(akv_dev_mem_free(p.dev, dbig));
        akv_forward_dev_destroy(fd);
        akv_forward_dev_destroy(fq);
        if (open) pools_close(&p), pools_close(&q);
    }

    TEST_CASE(closed_sequences_wait_for_their_step_and_its_fences) {
        /* A sequence closed after a sync that came between begin_step and the pass stays until
         * the pass is over (it crashed: a review); one closed while its step's write-backs are
         * queued (device pass, delays on the queues) waits for the sync; an abort after a
         * truncate below the step's start undoes the rest of the step */
        for (int queued = 0; queued < 2; queued++) {
            pools p;
            if (!pools_open(&p, c, 0)) break;
            akv_forward_params qp = {.max_step_tokens = 4 * P};
            akv_forward_dev *fd = NULL;
            if (queued) CHECK_OK(akv_forward_dev_create(p.dev, model, &qp, &fd));
            akv_route *r = NULL;
            akv_route_seq *a = NULL, *b = NULL;
            akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 4 * P,
                                   .max_seqs = 2, .queued = queued != 0};
            CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &r));
            if (r) CHECK_OK(akv_route_seq_open(r, NULL, &a));
            if (r) CHECK_OK(akv_route_seq_open(r, NULL, &b));
            if (a && b && (fd || !queued)) {
                akv_route_seq *seqs[2] = {a, b};
                const int32_t *tk[2] = {tokens, tokens + 40};
                uint32_t cnt[2] = {5, 7};
                float *lg[2] = {logits, NULL};
                CHECK_OK(fx_batch_step(r, seqs, tk, cnt, 2, f, fd, c->n_vocab, lg));
                /* begin, sync, close a, then the pass */
                akv_route_req rq[2] = {{a, 6}, {b, 8}};
                CHECK_OK(akv_route_begin_step(r, rq, 2));
                CHECK_OK(akv_route_sync(r));
                CHECK_OK(akv_route_seq_close(r, a));
                akv_route_stats rs;
                akv_route_get_stats(r, &rs);
                CHECK_EQ_INT(rs.n_closing, 1);
                uint32_t n_new[2] = {1, 1}, pos0[2] = {5, 7};
                int32_t two[2] = {tokens[5], tokens[47]};
                akv_forward_batch fb1 = {.n_seq = 2, .n_new = n_new, .pos0 = pos0, .tokens = two};
                akv_kv_hooks kv = akv_route_hooks(r);
                float lg2[2 * 23];
                CHECK_OK(fd ? akv_forward_dev_step(fd, &fb1, &kv, lg2) : akv_forward_step(f, &fb1, &kv, lg2));
                if (queued) CHECK_OK(akv_dev_inject_delays(p.dev, 3, 20000, 1));
                /* b alone: a goes at this step's start; b closes while its rows are queued */
                CHECK_OK(fx_batch_step(r, &b, tk + 1, cnt, 1, f, fd, c->n_vocab, lg));
                akv_route_get_stats(r, &rs);
                CHECK_EQ_INT(rs.n_closing, 0);
                CHECK_EQ_U64(akv_route_seq_n_tokens(b), 13);
                /* a step of b, a truncate below its start, an abort: nothing left to undo */
                akv_route_req rb = {b, 14};
                CHECK_OK(akv_route_begin_step(r, &rb, 1));
                CHECK_OK(akv_route_seq_truncate(r, b, 10));
                CHECK_OK(akv_route_abort_step(r));
                CHECK_EQ_U64(akv_route_seq_n_tokens(b), 10);
                CHECK_OK(fx_batch_step(r, &b, tk + 1, cnt, 1, f, fd, c->n_vocab, lg));
                CHECK_OK(akv_route_seq_close(r, b));
                akv_route_get_stats(r, &rs);
                CHECK_EQ_INT(rs.n_closing, 1); /* the step enqueued work: the sync frees it */
                CHECK_OK(akv_route_sync(r));
                akv_route_get_stats(r, &rs);
                CHECK_EQ_INT(rs.n_closing, 0);
                if (queued) CHECK_OK(akv_dev_inject_delays(p.dev, 3, 0, 1));
            }
            CHECK_OK(akv_route_destroy(r));
            akv_forward_dev_destroy(fd);
            pools_close(&p);
        }
    }

    akv_forward_params fbp = {.max_step_tokens = 4 * P};
    akv_forward *fb = NULL;
    CHECK_OK(akv_forward_create(model, &fbp, &fb));
    TEST_CASE(batch_steps_give_each_sequence_its_bits_alone_host_pass) {
        /* Four sequences of one route fed in batch steps (mixed: prefill chunks of different
         * lengths beside one-token decodes), each in the same chunks it gets alone: the host
         * pass's logits of every sequence are bit-identical to its own run on a route of one
         * (batch invariance of the host pass, forward.h) */
        enum { NS = 4 };
        pools p;
        if (!pools_open(&p, c, 0)) break;
        akv_route *r = NULL;
        akv_route_seq *seqs[NS] = {0};
        r1 alone[NS] = {{0}};
        akv_route_params rp = {.kind = AKV_ROUTE_RESIDENT, .max_history = 8 * P, .max_seqs = NS};
        akv_route_params rp1 = rp;
        rp1.max_seqs = 1;
        CHECK_OK(akv_route_create(p.dev, p.hp, p.dp, &rp, &r));
        for (int i = 0; r && i < NS; i++) {
            akv_route_seq_params sq = {.tag = (uint64_t)i + 1};
            CHECK_OK(akv_route_seq_open(r, &sq, &seqs[i]));
            CHECK_OK(r1_open(p.dev, p.hp, p.dp, &rp1, &alone[i]));
        }
        /* prompts of 1, 5, 23 and 40 tokens, fed in chunks of up to P; sequences join the
         * batch at different steps and decode beside the others' prefill */
        const uint32_t prompt[NS] = {1, 5, 23, 40}, start[NS] = {0, 1, 0, 2};
        uint32_t fed[NS] = {0};
        int32_t next[NS];
        float lb[NS][23], la[23];
        int ok = r != NULL, bad = 0, steps = 0;
        for (int step = 0; ok && step < 12; step++) {
            akv_route_seq *sel[NS];
            const int32_t *tk[NS];
            uint32_t cnt[NS], k = 0, who[NS];
            float *lg[NS];
            for (int i = 0; i < NS; i++) {
                if ((uint32_t)step < start[i]) continue;
                bool decoding = fed[i] >= prompt[i];
                uint32_t left = prompt[i] - (decoding ? prompt[i] : fed[i]);
                cnt[k] = decoding ? 1 : left < P ? left : P;
                tk[k] = decoding ? &next[i] : tokens + 64 * i + fed[i];
                lg[k] = decoding || fed[i] + cnt[k] == prompt[i] ? lb[i] : NULL;
                sel[k] = seqs[i], who[k++] = (uint32_t)i;
            }
            ok &= CHECK(fx_batch_step(r, sel, tk, cnt, k, fb, NULL, c->n_vocab, lg) == AKV_OK);
            for (uint32_t j = 0; ok && j < k; j++) {
                uint32_t i = who[j];
                ok &= CHECK(feed(&alone[i], fb, tk[j], cnt[j], la) == AKV_OK);
                fed[i] += cnt[j];
                if (!lg[j]) continue;
                steps++;
                if (memcmp(la, lb[i], sizeof la)) {
                    bad++;
                    printf("  step %d: sequence %u (%u tokens in) differs from its run alone\n",
                           step, i, fed[i]);
                }
                next[i] = fx_argmax(la, c->n_vocab, NULL);
            }
            ok &= CHECK(akv__route_check(r) == AKV_OK);
        }
        printf("  %d logit rows compared: %d differ\n", steps, bad);
        CHECK(steps > 20);
        CHECK_EQ_INT(bad, 0);
        for (int i = 0; i < NS; i++) {
            if (seqs[i]) CHECK_OK(akv_route_seq_close(r, seqs[i]));
            CHECK_OK(r1_close(&alone[i]));
        }
        CHECK_OK(akv_route_destroy(r));
        pools_close(&p);
    }

    TEST_CASE(staged_batch_with_bursts_matches_resident) {
        /* Three staged sequences with target 2 and burst 3 in a window part of 10 pages, in
         * batch steps: they borrow while pages are free and lose borrowed pages to each
         * other's targets as they grow; every step's logits bit-identical to the same batch on
         * a resident route, the walker after every step */
        enum { NS = 3 };
        pools ps, pr;
        bool open = pools_open(&ps, c, 10);
        open = pools_open(&pr, c, 0) && open;
        akv_route *rs = NULL, *rr = NULL;
        akv_route_seq *ss[NS] = {0}, *sr[NS] = {0};
        akv_route_params pst = {.kind = AKV_ROUTE_STAGED, .max_history = 8 * P, .max_seqs = NS,
                                .window_pages = 2};
        akv_route_params pre = {.kind = AKV_ROUTE_RESIDENT, .max_history = 8 * P, .max_seqs = NS};
        if (open) {
            CHECK_OK(akv_route_create(ps.dev, ps.hp, ps.dp, &pst, &rs));
            CHECK_OK(akv_route_create(pr.dev, pr.hp, pr.dp, &pre, &rr));
        }
        for (int i = 0; rs && rr && i < NS; i++) {
            akv_route_seq_params sq = {.target = 2, .burst = 3, .tag = (uint64_t)i + 1};
            CHECK_OK(akv_route_seq_open(rs, &sq, &ss[i]));
            CHECK_OK(akv_route_seq_open(rr, &sq, &sr[i]));
        }
        /* sequences 0 and 1 first (their bursts take every free page), sequence 2 joins once
         * the pool is full: its target reclaims borrowed pages */
        int ok = rs && rr, bad = 0;
        const int start[NS] = {0, 0, 5};
        const uint32_t prompt[NS] = {5 * P, 5 * P, 3 * P};
        uint32_t fed[NS] = {0};
        int32_t nxt[NS][2];
        float ls[NS][23], lr[NS][23];
        for (int step = 0; ok && step < 16; step++) {
            akv_route_seq *bs[NS], *br[NS];
            const int32_t *ts[NS], *tr[NS];
            uint32_t cnt[NS], k = 0, who[NS];
            float *ws[NS], *wr[NS];
            for (int i = 0; i < NS; i++) {
                if (step < start[i]) continue;
                uint32_t n = fed[i] < prompt[i] ? P : 1;
                cnt[k] = n;
                ts[k] = n > 1 ? tokens + 16 * i + fed[i] : &nxt[i][0];
                tr[k] = n > 1 ? tokens + 16 * i + fed[i] : &nxt[i][1];
                ws[k] = ls[i], wr[k] = lr[i];
                bs[k] = ss[i], br[k] = sr[i], who[k++] = (uint32_t)i;
            }
            ok &= CHECK(fx_batch_step(rs, bs, ts, cnt, k, fb, NULL, c->n_vocab, ws) == AKV_OK);
            ok &= CHECK(fx_batch_step(rr, br, tr, cnt, k, fb, NULL, c->n_vocab, wr) == AKV_OK);
            for (uint32_t j = 0; ok && j < k; j++) {
                uint32_t i = who[j];
                bad += memcmp(ls[i], lr[i], sizeof ls[i]) != 0;
                nxt[i][0] = fx_argmax(ls[i], c->n_vocab, NULL);
                nxt[i][1] = fx_argmax(lr[i], c->n_vocab, NULL);
                fed[i] += cnt[j];
            }
            ok &= CHECK(akv_route_sync(rs) == AKV_OK && akv__route_check(rs) == AKV_OK);
        }
        CHECK_EQ_INT(bad, 0);
        if (ok) {
            akv_dev_pool_stats dps;
            akv_dev_pool_get_stats(ps.dp, &dps);
            printf("  borrowed %llu pages, reclaimed %llu borrowed pages\n",
                   (unsigned long long)dps.counts.n_pages[AKV_DEV_POOL_FROM_FREE],
                   (unsigned long long)dps.counts.n_pages[AKV_DEV_POOL_RECLAIM_BORROWED]);
            CHECK(dps.counts.n_pages[AKV_DEV_POOL_RECLAIM_BORROWED] > 0);
            akv_route_stats st;
            akv_route_get_stats(rs, &st);
            CHECK(st.staged_bytes > 0);
        }
        for (int i = 0; i < NS; i++) {
            if (ss[i]) CHECK_OK(akv_route_seq_close(rs, ss[i]));
            if (sr[i]) CHECK_OK(akv_route_seq_close(rr, sr[i]));
        }
        if (rs) CHECK_OK(akv_route_sync(rs));
        CHECK_OK(akv_route_destroy(rs));
        CHECK_OK(akv_route_destroy(rr));
        if (open) pools_close(&ps), pools_close(&pr);
    }

    akv_forward_destroy(fb);

    /* THE BITWISE CELLS on the host backend, both passes */
    const rc_params cells = {.n_layers = c->n_layers,
                             .n_kv_heads = c->n_kv_heads,
                             .head_dim = c->head_dim,
                             .n_vocab = c->n_vocab,
                             .dtype = AKV_DTYPE_BF16,
                             .page_tokens = P,
                             .n_gen = 64,
                             .device_gib = 1,
                             .seed = rng};
    TEST_CASE(staged_bitwise_cells_host_pass) {
        rc_params rc = cells;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &rc.dev) == AKV_OK)) break;
        rc.fh = f, rc.window = 3, rc.max_step_tokens = P;
        rc_cells(&rc, 2000, "host pass, direct routes");
        CHECK_OK(akv_dev_destroy(rc.dev));
    }
    TEST_CASE(staged_bitwise_cells_queue_pass) {
        rc_params rc = cells;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &rc.dev) == AKV_OK)) break;
        akv_forward_params fdp = {.max_step_tokens = 64};
        rc.window = 2, rc.max_step_tokens = 64, rc.seed = rng + 1;
        if (CHECK(akv_forward_dev_create(rc.dev, model, &fdp, &rc.fd) == AKV_OK))
            rc_cells(&rc, 2000, "queue pass (host backend), queued routes");
        akv_forward_dev_destroy(rc.fd);
        CHECK_OK(akv_dev_destroy(rc.dev));
    }
    TEST_CASE(host_attended_step_failing_anywhere_is_undone_or_kept) {
        /* One host-attended decode step (its query copied to the host, the host function, the
         * states' upload, the merge) with its k-th copy, op or host function failing at
         * submission or while it runs, for every k: the step fails cleanly or its write-back
         * is redone, the next step is right (the logits of a clean route's, the same kind,
         * bit for bit), the host copy equals the clean route's, the walker holds. */
        const akv_dev_fault kinds[4] = {AKV_FAULT_COPY, AKV_FAULT_OP, AKV_FAULT_COPY_EXEC,
                                        AKV_FAULT_OP_EXEC};
        const uint32_t n0 = 5 * P - 1; /* 5 pages after the step: 3 attended on the host */
        fx b;
        float clean[23];
        uint64_t passes[AKV_N_FAULTS] = {0};
        if (!fx_open_host(&b, model, 8 * P) || !CHECK(fx_feed(&b, tokens, n0, logits) == AKV_OK)) {
            fx_close(&b);
            break;
        }
        for (int i = 0; i < 4; i++) passes[kinds[i]] = akv_dev_fault_passes(b.dev, kinds[i]);
        akv_route_stats h0, h1;
        akv_route_get_stats(b.q.r, &h0);
        CHECK_OK(fx_feed(&b, tokens + n0, 1, clean));
        akv_route_get_stats(b.q.r, &h1);
        CHECK(h1.host_bytes > h0.host_bytes); /* the step had a host part */
        for (int i = 0; i < 4; i++) passes[kinds[i]] = akv_dev_fault_passes(b.dev, kinds[i]) - passes[kinds[i]];
        CHECK_OK(akv_route_sync(b.q.r));
        int kept = 0, undone = 0, most_syncs = 0;
        for (int i = 0; i < 4; i++)
            for (uint64_t k = 1; k <= passes[kinds[i]]; k++) {
                fx a;
                if (!fx_open_host(&a, model, 8 * P) || !CHECK(fx_feed(&a, tokens, n0, logits) == AKV_OK)) {
                    fx_close(&a);
                    break;
                }
                CHECK_OK(akv_dev_inject_fault(a.dev, kinds[i], k, 0));
                bool fed = fx_feed(&a, tokens + n0, 1, logits) == AKV_OK;
                (void)akv_dev_sync(a.dev);
                CHECK_OK(akv_dev_clear_faults(a.dev));
                /* each sync says once what it found: a lease released after the failure
                 * (EFAILED: its stage replaced), the step undone (EDEVICE); then none */
                int n_sync = 1;
                while (akv_route_sync(a.q.r) != AKV_OK && n_sync < 4) n_sync++;
                TEST_CHECK_(n_sync < 4, "fault '%s' at pass %llu: the route does not recover",
                            akv_dev_fault_name(kinds[i]), (unsigned long long)k);
                most_syncs = n_sync > most_syncs ? n_sync : most_syncs;
                if (r1_len(&a.q) == n0) {
                    undone++;
                    fed = CHECK(fx_feed(&a, tokens + n0, 1, logits) == AKV_OK);
                } else {
                    kept++;
                }
                if (fed) CHECK_BYTES(logits, clean, sizeof clean);
                CHECK_OK(akv_route_sync(a.q.r));
                CHECK_EQ_U64(r1_len(&a.q), n0 + 1);
                uint64_t bad = rc_host_diff(&a.g, a.hp, akv_route_seq_host_table(a.q.s), b.hp,
                                            akv_route_seq_host_table(b.q.s));
                TEST_CHECK_(bad == 0, "fault '%s' at pass %llu: %llu rows of the host copy differ "
                            "from a clean route's",
                            akv_dev_fault_name(kinds[i]), (unsigned long long)k, (unsigned long long)bad);
                CHECK_OK(akv__route_check(a.q.r));
                fx_close(&a);
            }
        printf("  host-attended: %d failing steps kept (write-backs redone), %d undone and fed "
               "again (%llu copy, %llu op submissions; the same executions), at most %d syncs "
               "to recover\n",
               kept, undone, (unsigned long long)passes[AKV_FAULT_COPY],
               (unsigned long long)passes[AKV_FAULT_OP], most_syncs);
        CHECK(undone > 0);
        fx_close(&b);
    }

    /* the host-attended route: a share of the pages outside the window attended by the host's
     * cores in decode steps (all of them at share 1), within a tolerance of resident */
    for (int all = 0; all <= 1; all++) TEST_CASE(host_attended_cells_host_pass) {
        rc_params rc = cells;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &rc.dev) == AKV_OK)) break;
        rc.fh = f, rc.window = 3, rc.max_step_tokens = P, rc.host_share = all ? 1.0f : 0.5f;
        rc_cells(&rc, 2000, "host pass, direct routes");
        CHECK_OK(akv_dev_destroy(rc.dev));
    }
    for (int all = 0; all <= 1; all++) TEST_CASE(host_attended_cells_queue_pass) {
        rc_params rc = cells;
        if (!CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &rc.dev) == AKV_OK)) break;
        /* share 0.5 on a device without the copy kernel: the query rows by the route's
         * fallback (a copy on the compute queue) */
        if (!all) CHECK_OK(akv_dev_refuse_copy_method(rc.dev, AKV_COPY_METHOD_KERNEL, 1));
        akv_forward_params fdp = {.max_step_tokens = 64};
        rc.window = 2, rc.max_step_tokens = 64, rc.seed = rng + 2, rc.host_share = all ? 1.0f : 0.5f;
        if (CHECK(akv_forward_dev_create(rc.dev, model, &fdp, &rc.fd) == AKV_OK))
            rc_cells(&rc, 2000, "queue pass (host backend), queued routes");
        akv_forward_dev_destroy(rc.fd);
        CHECK_OK(akv_dev_destroy(rc.dev));
    }

    akv_forward_destroy(f);
    akv_model_destroy(model);
    CHECK_EQ_INT(test_alloc_live_settled(), 0);
    return test_finish();
}
