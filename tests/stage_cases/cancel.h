/*
 * tests/stage_cases/cancel.h — cancellation: a lease or one owner revoked at once, its pages reused only
 * after every fence.
 */
#ifndef AKV_TESTS_STAGE_CANCEL_H
#define AKV_TESTS_STAGE_CANCEL_H

#include "stage_cases/misuse.h"

/* ---- cancellation -------------------------------------------------------------------------- */

/* Holds the H2D queue back: it waits on an event recorded after a long op on the compute
 * queue. On the host backend the op is a gate that opens only at sc_hold_release (exact); on a
 * device it is a busy kernel of roughly 0.1 s. */
static volatile int sc_gate_open; /* written by the test thread, read by the compute worker */

static inline akv_status sc_gate_host(akv_dev *dev, const void *args) {
    (void)dev;
    (void)args;
    while (!__atomic_load_n(&sc_gate_open, __ATOMIC_ACQUIRE))
        akv_clock_sleep_ns(100000);
    return AKV_OK;
}
static const akv_dev_op sc_gate_op = {.name = "test_gate", .args_bytes = 0, .host = sc_gate_host};

static inline int sc_hold(sc_fx *f, akv_event *ev, akv_dptr sink) {
    akv_dev_info info;
    if (!REQUIRE_OK(akv_dev_get_info(f->dev, &info))) return 0;
    __atomic_store_n(&sc_gate_open, 0, __ATOMIC_RELEASE);
    akv_dev_busy_args b = {.n_iters = 50u * 1000 * 1000, .sink = sink};
    akv_status s = info.is_host ? akv_dev_op_launch(f->dev, &sc_gate_op, NULL, 0)
                                : akv_dev_op_launch(f->dev, &akv_dev_op_busy, &b, sizeof b);
    return REQUIRE_OK(s) && REQUIRE_OK(akv_dev_event_record(f->dev, ev, AKV_QUEUE_COMPUTE)) &&
           REQUIRE_OK(akv_dev_queue_wait_event(f->dev, AKV_QUEUE_H2D, ev));
}

static inline void sc_hold_release(void) {
    __atomic_store_n(&sc_gate_open, 1, __ATOMIC_RELEASE);
}

/* I7: a cancelled lease is revoked at once (nothing more submitted for it, its context's host
 * pages doomed, not freed), while its copies still wait behind the hold; the pages are freed
 * only at retire, after every fence completed. */
static inline void sc_cancel(const sc_params *p) {
    mu m;
    TEST_CASE(stage_cancel_revokes_at_once_reuses_after_fences) {
        if (!mu_open(&m, p)) break;
        akv_stage *st = m.f.st;
        akv_event *hold = NULL;
        akv_dptr sink = {0};
        if (!REQUIRE_OK(akv_dev_event_create(m.f.dev, 0, &hold)) ||
            !REQUIRE_OK(akv_dev_mem_alloc(m.f.dev, 8, &sink)) || !sc_hold(&m.f, hold, sink)) {
            sc_hold_release();
            break;
        }
        akv_host_page own = akv_host_table_page(m.t, 0, 2), mid = akv_host_table_page(m.t, 0, 1);
        akv_stage_lease h;
        uint32_t id;
        int ready = 1;
        CHECK_OK(akv_stage_begin(st, 0, 1, &own, 1, &h));
        m.live[m.n_live++] = h;
        CHECK_OK(akv_stage_copy(st, h, &mid, 1, &id));
        CHECK_OK(akv_stage_cancel(st, h));
        /* revoked at once: nothing more of it is accepted */
        akv_stage_probe_args a = mu_probe(&m, id);
        akv_event *ev = NULL;
        akv_stage_tail tl;
        CHECK_STATUS(akv_stage_copy(st, h, &mid, 1, &id), AKV_ECANCELED);
        CHECK_STATUS(akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a, &ev),
                     AKV_ECANCELED);
        CHECK_STATUS(akv_stage_writeback(st, h, 0, own, m.tail, 1, 1, &tl), AKV_ECANCELED);
        /* ... but its copy has not run: the fences are pending */
        CHECK_OK(akv_stage_poll(st, h, &ready));
        CHECK_EQ_INT(ready, 0);
        /* the context goes away: the pages the lease holds are doomed, not freed */
        akv_host_pool_stats hs;
        akv_host_table_destroy_deferred(m.t);
        m.t = NULL;
        akv_host_pool_get_stats(m.f.hp, &hs);
        CHECK_EQ_U64(hs.n_doomed, 2); /* the owner and the copied page */
        CHECK(akv_host_pool_page_is_live(m.f.hp, own) && akv_host_pool_page_is_live(m.f.hp, mid));
        /* a new context cannot be given them */
        akv_host_table *t2 = NULL;
        if (REQUIRE_OK(akv_host_table_create(m.f.hp, &t2)) &&
            REQUIRE_OK(akv_host_table_grow(t2, 40)))
            for (uint32_t k = 0; k < akv_host_table_n_pages(t2); k++) {
                akv_host_page q = akv_host_table_page(t2, 0, k);
                CHECK(q.id != own.id && q.id != mid.id);
            }
        /* physical release only at retire, after every fence */
        sc_hold_release();
        akv_stage_receipt rc;
        CHECK_OK(akv_stage_retire(st, h, &rc));
        mu_forget(&m, h);
        CHECK_EQ_INT(rc.cancelled, 1);
        int done = 0;
        CHECK_OK(akv_dev_event_query(m.f.dev, hold, &done));
        CHECK_EQ_INT(done, 1);
        akv_host_pool_get_stats(m.f.hp, &hs);
        CHECK_EQ_U64(hs.n_doomed, 0);
        CHECK(!akv_host_pool_page_is_live(m.f.hp, own) && !akv_host_pool_page_is_live(m.f.hp, mid));
        if (t2) CHECK_OK(akv_host_table_destroy(t2));
        CHECK_OK(akv_dev_mem_free(m.f.dev, sink));
        CHECK_OK(akv_dev_event_destroy(m.f.dev, hold));
        mu_close(&m);
    }
}

#endif
