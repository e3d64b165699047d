/* test_stage.c — the staging lifecycle on the host backend (real worker-thread queues with
 * random delays): the misuse table, one lease end to end with receipts, prior readers and
 * RAW ordering, failure at every submission, wait and execution point, negative controls
 * that prove the randomized check detects each missing ordering, and the randomized run.
 *   test_stage            the unit run (seconds)
 *   test_stage stress     1,000,000 randomized lease operations (label `stress`) */
#include "test.h"

#include "stage_cases/faults.h" /* with stage_cases/fixture.h, misuse.h and cancel.h */

static sc_params host_params(uint32_t head_dim, uint32_t n_slots) {
    return (sc_params){.backend = akv_dev_host_backend(),
                       .n_layers = 3,
                       .n_kv_heads = 1,
                       .head_dim = head_dim,
                       .page_tokens = 4,
                       .n_slots = n_slots,
                       .slot_pages = 40,
                       .poison = 0xA5,
                       .max_tokens = 40,
                       .arena_bytes = 64 << 10,
                       .delay_us = 100,
                       .delay_one_in = 8,
                       .delay_seed = 7};
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t seed = test_seed(20261129);
    if (argc > 1 && !strcmp(argv[1], "stress")) {
        const char *env = getenv("AKV_STAGE_OPS");
        uint64_t n_ops = env ? strtoull(env, NULL, 0) : 1000000;
        /* a quarter of the operations at each slot count: 1 (the slot's previous occupant
         * is the previous lease), 2 and 3 (fewer than the layers), 4 (more: RAW waits matter) */
        for (uint32_t n_slots = 1; n_slots <= 4; n_slots++) {
            TEST_CASE(stress_randomized_leases) {
                sc_params p = host_params(8, n_slots);
                p.delay_seed = seed + n_slots;
                sc_stress(&p, (n_ops + 3) / 4, seed + 100 * n_slots, 0, 0, NULL);
            }
        }
        return test_finish();
    }
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* misuse and failures log by design */
    sc_params small = host_params(64, 1);
    small.n_layers = 2;
    sc_misuse_table(&small);
    sc_lifecycle(&small);
    small.n_slots = 2;
    sc_lifecycle(&small);
    /* the same through the split attend (ready, the caller's launch, attended) */
    sc_params split = small;
    split.split_attend = 1;
    sc_misuse_table(&split);
    sc_lifecycle(&split);
    small.n_slots = 1;
    sc_cancel(&small);
    TEST_CASE(stage_create_refusals) {
        sc_fx f;
        if (!sc_open(&f, &small)) break;
        akv_stage_params sp = akv_stage_default_params();
        akv_stage *st = NULL;
        CHECK_STATUS(akv_stage_create(f.dev, f.hp, f.dp, &sp, &st), AKV_EINVAL); /* slot_pages 0 */
        sp.slot_pages = 1u << 30;
        CHECK_STATUS(akv_stage_create(f.dev, f.hp, f.dp, &sp, &st), AKV_EFULL);
        sp.slot_pages = 1;
        sp.poison_byte = 256;
        CHECK_STATUS(akv_stage_create(f.dev, f.hp, f.dp, &sp, &st), AKV_EINVAL);
        sp.poison_byte = -1;
        sp.n_slots = 64;
        sp.slot_pages = UINT32_MAX; /* 64 x that many pages: past what a pool can hold */
        CHECK_STATUS(akv_stage_create(f.dev, f.hp, f.dp, &sp, &st), AKV_EINVAL);
        sp.n_slots = 2;
        sp.slot_pages = 1;
        akv_dev *other = NULL; /* pools of another device than the stage's */
        if (CHECK(akv_dev_create(akv_dev_host_backend(), NULL, &other) == AKV_OK)) {
            CHECK_STATUS(akv_stage_create(other, f.hp, f.dp, &sp, &st), AKV_EINVAL);
            CHECK_OK(akv_dev_destroy(other));
        }
        CHECK(st == NULL);
        CHECK_OK(akv_stage_destroy(NULL));
        sc_close(&f);
    }
    sc_fault_sweep(&small, 1, 0);
    TEST_CASE(compact_pages_staged) {
        /* a stage over a host pool and a device pool of q4 pages: the copies bring the host
         * copies' bytes (a page of its own size), no owner is taken, and pools of different
         * forms are refused */
        akv_dev *dev = NULL;
        akv_geom g;
        akv_host_pool *hp = NULL, *hx = NULL;
        akv_dev_pool *dp = NULL;
        akv_stage *st = NULL;
        if (!REQUIRE_OK(akv_dev_create(akv_dev_host_backend(), NULL, &dev)) ||
            !REQUIRE_OK(akv_geom_init(&g, 2, 2, 64, AKV_DTYPE_BF16, 16)))
            break;
        const size_t cb = akv_geom_repr_page_bytes(&g, AKV_REPR_Q4);
        akv_host_pool_params hpp = akv_host_pool_default_params();
        hpp.limit_gib = 1, hpp.arena_bytes = 64 << 10, hpp.repr = AKV_REPR_Q4;
        akv_dev_pool_params dpp = akv_dev_pool_default_params();
        dpp.device_gib = 1, dpp.staging_pages = 8, dpp.repr = AKV_REPR_Q4;
        CHECK_OK(akv_host_pool_create(dev, &g, &hpp, &hp));
        CHECK_OK(akv_dev_pool_create(dev, &g, &dpp, &dp));
        hpp.repr = AKV_REPR_EXACT;
        CHECK_OK(akv_host_pool_create(dev, &g, &hpp, &hx));
        if (!hp || !dp || !hx) goto compact_done;
        CHECK(akv_host_pool_page_bytes(hp) == cb && akv_host_pool_repr(hp) == AKV_REPR_Q4);
        akv_stage_params sp = akv_stage_default_params();
        sp.n_slots = 2, sp.slot_pages = 4;
        CHECK_STATUS(akv_stage_create(dev, hx, dp, &sp, &st), AKV_EINVAL); /* exact over q4 */
        if (!REQUIRE_OK(akv_stage_create(dev, hp, dp, &sp, &st))) goto compact_done;
        akv_host_page pg[3];
        for (uint32_t i = 0; i < 3; i++) {
            CHECK_OK(akv_host_pool_page_alloc(hp, &pg[i]));
            uint8_t *b = akv_host_pool_page_addr(hp, pg[i]);
            for (size_t k = 0; k < cb; k++) b[k] = (uint8_t)(k * 7 + i * 31 + 1);
        }
        akv_stage_lease l;
        CHECK_STATUS(akv_stage_begin(st, 0, 1, pg, 1, &l), AKV_EINVAL); /* no owners here */
        if (REQUIRE_OK(akv_stage_begin(st, 1, 1, NULL, 0, &l))) {
            uint32_t ids[3];
            akv_event *ev = NULL;
            akv_stage_receipt rc;
            CHECK_OK(akv_stage_copy(st, l, pg, 3, ids));
            CHECK_OK(akv_stage_ready(st, l));
            CHECK_OK(akv_stage_attended(st, l, &ev));
            CHECK_OK(akv_stage_seal(st, l, (akv_stage_tail){0, 0}, ev));
            CHECK_OK(akv_stage_retire(st, l, &rc));
            CHECK(rc.n_copies == 3 && rc.h2d_bytes == 3 * cb);
            for (uint32_t i = 0; i < 3; i++)
                CHECK(memcmp((const void *)(uintptr_t)akv_dev_pool_page_addr(dp, ids[i]).addr,
                             akv_host_pool_page_addr(hp, pg[i]), cb) == 0);
        }
        /* Whether the bus waited for the host, in the receipt: lease b's copies are submitted
         * after a's were fenced and done (the H2D queue synced), so the bus had nothing left;
         * c's while b's are still queued (every queued command delayed up to 50 ms), so the
         * bus was busy; a had no lease before it. */
        akv_stage_lease ls[3];
        akv_stage_receipt rs[3];
        uint32_t ids[3];
        const uint64_t t0 = akv_clock_ns();
        for (int i = 0; i < 3; i++) {
            akv_event *ev = NULL;
            if (i == 1) CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_H2D));
            if (!REQUIRE_OK(akv_stage_begin(st, (uint32_t)i % 2, 2, NULL, 0, &ls[i]))) break;
            CHECK_OK(akv_stage_copy(st, ls[i], pg + i, 1, ids + i));
            if (i == 1) CHECK_OK(akv_dev_inject_delays(dev, 11, 50000, 1)); /* b's fence, held */
            CHECK_OK(akv_stage_ready(st, ls[i]));
            CHECK_OK(akv_stage_attended(st, ls[i], &ev));
            CHECK_OK(akv_stage_seal(st, ls[i], (akv_stage_tail){0, 0}, ev));
        }
        CHECK_OK(akv_dev_inject_delays(dev, 0, 0, 1));
        for (int i = 0; i < 3; i++) CHECK_OK(akv_stage_retire(st, ls[i], &rs[i]));
        CHECK(rs[0].bus_idle_at_copy == 0 && rs[1].bus_idle_at_copy == 1 && rs[2].bus_idle_at_copy == 0);
        CHECK(rs[0].t_copied_ns >= t0 && rs[1].t_copied_ns >= rs[0].t_copied_ns &&
              rs[2].t_copied_ns >= rs[1].t_copied_ns && rs[1].t_copied_ns >= rs[1].t_begin_ns);
        for (uint32_t i = 0; i < 3; i++) CHECK_OK(akv_host_pool_page_free(hp, pg[i]));
    compact_done:
        CHECK_OK(akv_stage_destroy(st));
        CHECK_OK(akv_dev_pool_destroy(dp));
        CHECK_OK(akv_host_pool_destroy(hp));
        CHECK_OK(akv_host_pool_destroy(hx));
        CHECK_OK(akv_dev_destroy(dev));
    }

    /* A table copied with the lease (no page copies, so only the table makes the compute queue
     * wait) is what the compute queue reads after ready, and after a cancel of the begun lease;
     * every command of every queue delayed 0..2 ms, so a missing wait shows within a few
     * rounds. */
    TEST_CASE(a_table_copied_with_the_lease_is_read_after_ready) {
        sc_params p = small;
        p.delay_us = 0;
        sc_fx f;
        if (!sc_open(&f, &p)) break;
        akv_dptr d = {0};
        int32_t *tab = NULL, *back = NULL; /* pinned: the copies' host sides */
        const size_t nb = 256 * sizeof(int32_t);
        if (!REQUIRE_OK(akv_dev_mem_alloc(f.dev, nb, &d)) ||
            !REQUIRE_OK(akv_dev_pinned_alloc(f.dev, nb, (void **)&tab)) ||
            !REQUIRE_OK(akv_dev_pinned_alloc(f.dev, nb, (void **)&back)))
            goto table_done;
        CHECK_OK(akv_dev_inject_delays(f.dev, seed + 5, 2000, 1));
        for (int round = 0; round < 16; round++) {
            const int cancel = round % 4 == 3;
            for (int i = 0; i < 256; i++) tab[i] = round * 1000 + i;
            akv_stage_lease l;
            if (!REQUIRE_OK(akv_stage_begin(f.st, (uint32_t)round % 2, (uint64_t)round + 1, NULL,
                                            0, &l)))
                break;
            CHECK_STATUS(akv_stage_copy_table(f.st, l, d, NULL, nb), AKV_EINVAL);
            CHECK_OK(akv_stage_copy_table(f.st, l, d, tab, nb));
            akv_event *ev = NULL;
            if (cancel) CHECK_OK(akv_stage_cancel(f.st, l));
            else CHECK_OK(akv_stage_ready(f.st, l));
            CHECK_OK(akv_dev_copy_d2h_async(f.dev, AKV_QUEUE_COMPUTE, back, d, nb));
            CHECK_OK(akv_dev_queue_sync(f.dev, AKV_QUEUE_COMPUTE));
            TEST_CHECK_(!memcmp(back, tab, nb), "round %d%s: the compute queue read the "
                        "table before its copy", round, cancel ? " (cancelled)" : "");
            if (!cancel) {
                CHECK_STATUS(akv_stage_copy_table(f.st, l, d, tab, nb), AKV_ESTATE);
                CHECK_OK(akv_stage_attended(f.st, l, &ev));
                CHECK_OK(akv_stage_seal(f.st, l, (akv_stage_tail){0, 0}, ev));
            }
            akv_stage_receipt rc;
            CHECK_OK(akv_stage_retire(f.st, l, &rc));
            CHECK(rc.n_copies == 0);
        }
        CHECK_OK(akv_dev_inject_delays(f.dev, 0, 0, 1));
    table_done:
        if (d.addr) CHECK_OK(akv_dev_mem_free(f.dev, d));
        akv_dev_pinned_free(f.dev, tab);
        akv_dev_pinned_free(f.dev, back);
        sc_close(&f);
    }

    /* Negative controls: remove one ordering at a time; the randomized check must see it. */
    /* With fewer slots than layers, a slot's previous occupant began after the lease that
     * wrote a page back, and its write-back fence (same D2H queue, later) already covers the
     * RAW hazard: the RAW control needs more slots than layers to be exposed. */
    static const struct {
        const char *what;
        unsigned flag;
        uint32_t n_slots;
    } broken[] = {
        {"prior readers", AKV__STAGE_BREAK_PRIOR, 1},
        {"attention after copies", AKV__STAGE_BREAK_COPY_WAIT, 2},
        {"write-back after attention", AKV__STAGE_BREAK_ATTN_WAIT, 1},
        {"refill after write-back (RAW)", AKV__STAGE_BREAK_RAW, 4},
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        TEST_CASE(negative_control_detects_missing_ordering) {
            sc_params p = host_params(8, broken[i].n_slots);
            p.delay_us = 300;
            p.delay_one_in = 3;
            uint64_t host_bad = 0,
                     bad = sc_stress(&p, 20000, seed + i, broken[i].flag, 1, &host_bad);
            printf("  without %s: %llu probe mismatches, %llu wrong host rows\n", broken[i].what,
                   (unsigned long long)bad, (unsigned long long)host_bad);
            TEST_CHECK_(bad + host_bad > 0, "removing '%s' went unnoticed", broken[i].what);
        }
    }

    TEST_CASE(negative_control_split_attend_without_copy_wait) {
        sc_params p = host_params(8, 2);
        p.split_attend = 1;
        p.delay_us = 300;
        p.delay_one_in = 3;
        uint64_t host_bad = 0,
                 bad = sc_stress(&p, 20000, seed + 77, AKV__STAGE_BREAK_COPY_WAIT, 1, &host_bad);
        printf("  split attend without the copy wait: %llu probe mismatches\n",
               (unsigned long long)bad);
        TEST_CHECK_(bad + host_bad > 0, "removing the copy wait of ready went unnoticed");
    }

    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    for (uint32_t n_slots = 1; n_slots <= 4; n_slots *= 2) {
        TEST_CASE(randomized_leases_with_delays) {
            sc_params p = host_params(8, n_slots);
            p.delay_seed = seed + n_slots;
            sc_stress(&p, 40000, seed + 100 * n_slots, 0, 0, NULL);
        }
    }
    TEST_CASE(randomized_leases_split_attend) {
        sc_params p = host_params(8, 2);
        p.split_attend = 1;
        p.delay_seed = seed + 9;
        sc_stress(&p, 40000, seed + 900, 0, 0, NULL);
    }
    return test_finish();
}
