/*
 * tests/stage_cases/faults.h — a failure injected at every submission and wait point in turn (and at the
 * host backend's execution points), each recovered or retained, never reused.
 */
#ifndef AKV_TESTS_STAGE_FAULTS_H
#define AKV_TESTS_STAGE_FAULTS_H

#include "stage_cases/cancel.h"

/* ---- failure at every submission and wait point ------------------------------------------------
 */

/* The scenario: 3 clean steps (retired), then one step plus its retirement with a fault
 * armed at pass k of point f (f < 0: none; then *passes gets each point's count). */
static inline void sc_fault_one(const sc_params *p, int fault, uint64_t k, int sticky,
                                uint64_t passes[AKV_N_FAULTS], int *n_bad) {
    sc_fx f;
    static sc_run r;
    memset(&r, 0, sizeof r);
    int failed_before = test_n_failed_checks;
    if (!sc_open(&f, p)) {
        sc_close(&f);
        return;
    }
    r.f = &f;
    r.rng = 42;
    r.walk = 1;
    for (int i = 0; i < 3; i++)
        sc_step(&r);
    while (r.n_pend)
        sc_retire_at(&r, 0);
    uint32_t committed[SC_MAX_CTX];
    for (int i = 0; i < SC_MAX_CTX; i++)
        committed[i] = r.ctx[i].n_tokens;
    uint64_t before[AKV_N_FAULTS];
    for (int c = 0; c < AKV_N_FAULTS; c++)
        before[c] = akv_dev_fault_passes(f.dev, (akv_dev_fault)c);
    sc_log_capture();
    if (fault >= 0) CHECK_OK(akv_dev_inject_fault(f.dev, (akv_dev_fault)fault, k, sticky));
    r.tolerate = 1;
    if (sc_step(&r))
        while (r.n_pend && sc_retire_at(&r, 0)) {
        }
    if (passes)
        for (int c = 0; c < AKV_N_FAULTS; c++)
            passes[c] = akv_dev_fault_passes(f.dev, (akv_dev_fault)c) - before[c];
    akv_stage_stats ss;
    akv_host_pool_stats hs;
    akv_dev_pool_stats ds;
    if (fault < 0) {
        CHECK_EQ_INT(r.first_err, AKV_OK);
    } else {
        /* a clear error, once, where it happened */
        CHECK_EQ_INT(r.first_err, AKV_EDEVICE);
        CHECK_EQ_INT(sc_log_seen.n_transport_failed, 1);
        CHECK_STATUS(akv_stage_status(f.st), AKV_EFAILED);
        akv_stage_lease h;
        CHECK_STATUS(akv_stage_begin(f.st, 0, 99, NULL, 0, &h), AKV_EFAILED);
        akv_stage_get_stats(f.st, &ss);
        akv_host_pool_get_stats(f.hp, &hs);
        /* what the step did not complete is not committed: check only the rows before it */
        for (int i = 0; i < SC_MAX_CTX; i++)
            if (r.ctx[i].state == SC_LIVE || r.ctx[i].state == SC_FINISHING)
                r.ctx[i].n_tokens = committed[i];
        int expect_retained = sticky || fault == AKV_FAULT_COPY_EXEC || fault == AKV_FAULT_OP_EXEC;
        CHECK_EQ_INT(ss.retained, expect_retained);
        if (expect_retained) {
            /* completion not established: nothing is released or recycled */
            CHECK(ss.n_live >= 1 && hs.n_leases >= 1);
            CHECK_STATUS(akv_stage_destroy(f.st), AKV_EBUSY);
            akv_stage_receipt rc;
            CHECK_STATUS(akv_stage_retire(f.st, r.pend[0].h, &rc), AKV_EFAILED);
            akv_stage_stats again;
            akv_stage_get_stats(f.st, &again);
            CHECK_EQ_U64(again.n_live, ss.n_live);
            CHECK_OK(akv_dev_clear_faults(f.dev));
            CHECK_OK(akv_stage_quarantine(f.st));
        }
        while (r.n_pend)
            CHECK(sc_retire_at(&r, 0));
        akv_stage_get_stats(f.st, &ss);
        akv_host_pool_get_stats(f.hp, &hs);
        akv_dev_pool_get_stats(f.dp, &ds);
        CHECK_EQ_U64(ss.n_live, 0);
        CHECK_EQ_U64(hs.n_leases, 0);
        CHECK_EQ_U64(ds.staging_used, p->n_slots * p->slot_pages + f.n_win); /* slots still held */
    }
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    r.tolerate = 0;
    sc_drain(&r); /* nothing lost: checks every committed row of every context's host copy */
    uint64_t res[4];
    sc_result(&f, res);
    CHECK_EQ_U64(res[0], 0); /* no probe ever saw a wrong row, failure or not */
    sc_close(&f);
    if (test_n_failed_checks != failed_before) {
        (*n_bad)++;
        printf("  ^ fault %s at pass %llu%s (first error at %s: %s)\n",
               fault >= 0 ? akv_dev_fault_name((akv_dev_fault)fault) : "none",
               (unsigned long long)k, sticky ? " (sticky)" : "", r.first_what ? r.first_what : "-",
               sc_log_seen.first);
    }
}

/* The pass after k of a point passed n times: every one, or (quick) only the first and last. */
static inline uint64_t sc_next_pass(uint64_t k, uint64_t n, int quick) {
    return quick && k < n ? n : k + 1;
}

/* Failure injected at each submission and wait point in turn (with_exec: the host backend's
 * execution faults too; quick: only the first and the last pass of each point). */
static inline void sc_fault_sweep(const sc_params *p, int with_exec, int quick) {
    TEST_CASE(stage_failure_at_every_point) {
        uint64_t passes[AKV_N_FAULTS];
        int n_bad = 0, n_cases = 0;
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        sc_fault_one(p, -1, 0, 0, passes, &n_bad);
        static const akv_dev_fault points[] = {
            AKV_FAULT_COPY, AKV_FAULT_RECORD,    AKV_FAULT_WAIT,   AKV_FAULT_OP,
            AKV_FAULT_SYNC, AKV_FAULT_COPY_EXEC, AKV_FAULT_OP_EXEC};
        for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
            akv_dev_fault pt = points[i];
            if (!with_exec && (pt == AKV_FAULT_COPY_EXEC || pt == AKV_FAULT_OP_EXEC)) continue;
            printf("  %s: %llu points\n", akv_dev_fault_name(pt), (unsigned long long)passes[pt]);
            CHECK(passes[pt] > 0);
            for (uint64_t k = 1; k <= passes[pt]; k = sc_next_pass(k, passes[pt], quick), n_cases++)
                sc_fault_one(p, (int)pt, k, 0, NULL, &n_bad);
        }
        uint64_t n_sync = passes[AKV_FAULT_SYNC];
        for (uint64_t k = 1; k <= n_sync; k = sc_next_pass(k, n_sync, quick), n_cases++)
            sc_fault_one(p, AKV_FAULT_SYNC, k, 1, NULL, &n_bad);
        printf("  %d fault cases, %d with failed checks\n", n_cases, n_bad);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
}

#endif
