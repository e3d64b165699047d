/* test_dev.c — the device front and the host backend: memory, accounting, misuse, queues,
 * events, async copies, ops, injected delays and faults (submission, wait and execution). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "akv/dev.h"
#include "akv/testing/dev_faults.h"
#include "akv/log.h"
#include "core/clock.h"
#include "dev_cases.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void count_run(void *p) {
    ++*(int *)p;
}

/* Execution faults (host backend only): an accepted copy fails on its queue; the queue is
 * faulted, its later records fail, a queue that waits on one of them faults too, and every
 * sync reports it until the faults are cleared. Nothing hangs. */
static void exec_fault_cases(akv_dev *dev) {
    unsigned char *pin = NULL;
    akv_dptr d = {0};
    akv_event *ev = NULL, *ev2 = NULL;
    TEST_CASE(exec_fault_propagates_and_clears) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, 4096, (void **)&pin))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, 4096, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev2))) break;
        memset(pin, 7, 4096);
        CHECK_OK(akv_dev_memset_sync(dev, d, 0, 4096));
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_COPY_EXEC, 1, 0));
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 4096)); /* accepted... */
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 16));   /* ...then skipped */
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D));
        CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_COMPUTE, ev));
        CHECK_OK(akv_dev_event_record(dev, ev2, AKV_QUEUE_COMPUTE));
        CHECK_STATUS(akv_dev_event_sync(dev, ev), AKV_EDEVICE);
        CHECK_STATUS(akv_dev_event_sync(dev, ev2), AKV_EDEVICE); /* propagated by the wait */
        int done = 0, failed = 0;
        CHECK_STATUS(akv_dev_event_query(dev, ev, &done), AKV_EDEVICE);
        /* established, not a wait point: an injected sync failure does not touch it */
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_SYNC, 1, 1));
        CHECK_OK(akv_dev_event_outcome(dev, ev, &failed));
        CHECK_EQ_INT(failed, 1);
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_SYNC, 0, 0));
        CHECK_STATUS(akv_dev_queue_sync(dev, AKV_QUEUE_H2D), AKV_EDEVICE);
        CHECK_STATUS(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE), AKV_EDEVICE);
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H)); /* untouched */
        CHECK_STATUS(akv_dev_sync(dev), AKV_EDEVICE);
        unsigned char out[16];
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, d, 16));
        CHECK_EQ_INT(out[0], 0); /* neither copy ran */
        CHECK_OK(akv_dev_clear_faults(dev));
        CHECK_OK(akv_dev_sync(dev));
        failed = 0; /* the failed record stays failed after recovery, until recorded again */
        CHECK_OK(akv_dev_event_outcome(dev, ev2, &failed));
        CHECK_EQ_INT(failed, 1);
        /* ... but waiting on it no longer faults the recovered queue (old, finished work) */
        CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_COMPUTE, ev2));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D));
        CHECK_OK(akv_dev_event_sync(dev, ev)); /* a new record after recovery succeeds */
        CHECK_OK(akv_dev_event_outcome(dev, ev, &failed));
        CHECK_EQ_INT(failed, 0);
        /* an op failing while it runs faults the compute queue the same way */
        akv_dev_busy_args a = {.n_iters = 64};
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP_EXEC, 1, 0));
        CHECK_OK(akv_dev_op_launch(dev, &akv_dev_op_busy, &a, sizeof a));
        CHECK_STATUS(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE), AKV_EDEVICE);
        CHECK_OK(akv_dev_clear_faults(dev));
        CHECK_OK(akv_dev_sync(dev));
        /* a host function failing as it runs (the host's computation): its queue faults, it
         * and the function after it do not run, a record after them reads failed */
        int runs = 0;
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP_EXEC, 1, 0));
        CHECK_OK(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, count_run, &runs));
        CHECK_OK(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, count_run, &runs));
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_D2H));
        CHECK_STATUS(akv_dev_event_sync(dev, ev), AKV_EDEVICE);
        CHECK_OK(akv_dev_event_outcome(dev, ev, &failed));
        CHECK_EQ_INT(failed, 1);
        CHECK_EQ_INT(runs, 0);
        CHECK_OK(akv_dev_clear_faults(dev));
        CHECK_OK(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, count_run, &runs));
        CHECK_OK(akv_dev_sync(dev));
        CHECK_EQ_INT(runs, 1);
    }
    TEST_CASE(clear_faults_lets_accepted_work_end_as_it_would_have) {
        /* the compute queue faults (a failing op), then waits for a slow H2D record before
         * recording ev; the faults are cleared while it waits. ev covers the failed op: it
         * must read failed, not run on the un-faulted queue and read OK (a review) */
        akv_event *evh = NULL;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &evh))) break;
        akv_dev_busy_args a = {.n_iters = 16};
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP_EXEC, 1, 0));
        CHECK_OK(akv_dev_op_launch(dev, &akv_dev_op_busy, &a, sizeof a));
        CHECK_OK(akv_dev_event_record(dev, ev2, AKV_QUEUE_COMPUTE));
        CHECK_OK(akv_dev_inject_delays(dev, 11, 20000, 1)); /* each command sleeps up to 20 ms */
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 16));
        CHECK_OK(akv_dev_event_record(dev, evh, AKV_QUEUE_H2D));
        CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_COMPUTE, evh));
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_COMPUTE));
        int failed = 0;
        while (akv_dev_event_outcome(dev, ev2, &failed) == AKV_ESTATE) akv_clock_sleep_ns(100000);
        CHECK_EQ_INT(failed, 1);
        CHECK_OK(akv_dev_clear_faults(dev)); /* ev's record is still queued behind evh */
        CHECK_OK(akv_dev_inject_delays(dev, 11, 0, 1));
        CHECK_OK(akv_dev_sync(dev));
        failed = 0;
        CHECK_OK(akv_dev_event_outcome(dev, ev, &failed));
        CHECK_EQ_INT(failed, 1);
        akv_dev_event_destroy(dev, evh);
    }
    akv_dev_event_destroy(dev, ev);
    akv_dev_event_destroy(dev, ev2);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, pin);
}

/* An op whose host implementation fails: the error faults the compute queue. */
static akv_status failing_op_host(akv_dev *dev, const void *args) {
    (void)dev, (void)args;
    return AKV_EIO;
}
static const akv_dev_op failing_op = {.name = "test_failing", .args_bytes = 0, .host = failing_op_host};

/* An op that sleeps for its argument's microseconds and says so in its description. */
static akv_status sleep_op_host(akv_dev *dev, const void *args) {
    (void)dev;
    uint32_t us;
    memcpy(&us, args, sizeof us);
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    return AKV_OK;
}
static void sleep_op_describe(const void *args, char *buf, size_t cap) {
    uint32_t us;
    memcpy(&us, args, sizeof us);
    snprintf(buf, cap, "%u us", us);
}
static const akv_dev_op sleep_op = {.name = "test_sleep",
                                    .args_bytes = sizeof(uint32_t),
                                    .host = sleep_op_host,
                                    .describe = sleep_op_describe};

/* The op profile: one row per name and description, device time at least what the ops
 * slept, the gaps outside them, launches past the limit counted and not timed. */
static void profile_cases(akv_dev *dev) {
    TEST_CASE(profile_rows_by_key) {
        akv_dev_profile_row rows[4];
        akv_dev_profile_summary sum;
        CHECK_STATUS(akv_dev_profile_stop(dev, rows, 4, &sum), AKV_ESTATE);
        CHECK_STATUS(akv_dev_profile_start(dev, 0), AKV_EINVAL);
        if (!REQUIRE_OK(akv_dev_profile_start(dev, 5))) break;
        CHECK_STATUS(akv_dev_profile_start(dev, 5), AKV_ESTATE);
        CHECK_STATUS(akv_dev_destroy(dev), AKV_EBUSY);
        /* 40 times apart, so that a loaded machine's late wake-ups cannot reorder the rows */
        const uint32_t us[6] = {20000, 500, 20000, 500, 500, 500};
        for (int i = 0; i < 4; i++)
            CHECK_OK(akv_dev_op_launch(dev, &sleep_op, &us[i], sizeof us[i]));
        /* 2 ms on the compute queue between two launches: a gap, not an op */
        unsigned char *pin = NULL;
        akv_dptr d = {0};
        CHECK_OK(akv_dev_pinned_alloc(dev, 64, (void **)&pin));
        CHECK_OK(akv_dev_mem_alloc(dev, 64, &d));
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_COMPUTE, d, pin, 64));
        struct timespec ts = {0, 2000000};
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        nanosleep(&ts, NULL); /* the queue idles: the host is late */
        akv_dev_busy_args ba = {.n_iters = 64};
        akv_dev_launch bl = {&akv_dev_op_busy, &ba};
        akv_graph *g = NULL;
        CHECK_OK(akv_dev_graph_create(dev, &bl, 1, &g));
        CHECK_OK(akv_dev_graph_launch(dev, g));
        CHECK_OK(akv_dev_op_launch(dev, &sleep_op, &us[5], sizeof us[5])); /* the 6th: untimed */
        CHECK_OK(akv_dev_profile_stop(dev, rows, 2, &sum));
        CHECK_EQ_INT(sum.launches, 5);
        CHECK_EQ_INT(sum.untimed, 1);
        CHECK_EQ_INT(sum.n_keys, 3);
        CHECK_STR(rows[0].key, "test_sleep 20000 us");
        CHECK_EQ_INT(rows[0].launches, 2);
        CHECK_STR(rows[1].key, "test_sleep 500 us");
        CHECK_EQ_INT(rows[1].launches, 2);
        TEST_CHECK_(rows[0].ns >= 40000000 && rows[1].ns >= 1000000 && rows[0].ns > rows[1].ns,
                    "op times %.3f and %.3f ms", rows[0].ns / 1e6, rows[1].ns / 1e6);
        TEST_CHECK_(sum.ops_ns >= rows[0].ns + rows[1].ns && sum.ops_ns < 200000000, "ops %.3f ms",
                    sum.ops_ns / 1e6);
        TEST_CHECK_(sum.span_ns >= sum.ops_ns + 2000000, "span %.3f ms, ops %.3f ms",
                    sum.span_ns / 1e6, sum.ops_ns / 1e6);
        CHECK_STATUS(akv_dev_profile_stop(dev, rows, 2, &sum), AKV_ESTATE);
        CHECK_OK(akv_dev_graph_destroy(dev, g));
        CHECK_OK(akv_dev_mem_free(dev, d));
        CHECK_OK(akv_dev_pinned_free(dev, pin));
        /* a second profile starts clean; rows may be NULL with no room */
        CHECK_OK(akv_dev_profile_start(dev, 1));
        CHECK_OK(akv_dev_op_launch(dev, &sleep_op, &us[1], sizeof us[1]));
        CHECK_OK(akv_dev_profile_stop(dev, NULL, 0, &sum));
        CHECK_EQ_INT(sum.launches, 1);
        CHECK_EQ_INT(sum.n_keys, 1);
        CHECK_EQ_INT(sum.untimed, 0);
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    akv_log_set(NULL, NULL, AKV_LOG_OFF); /* the misuse cases log errors by design */
    /* the devices every case uses are set up before the cases, so --case runs any one alone */
    akv_dev *dev = NULL, *other = NULL;
    if (akv_dev_create(akv_dev_host_backend(), NULL, &dev) ||
        akv_dev_create(akv_dev_host_backend(), NULL, &other)) {
        fprintf(stderr, "test_dev: cannot create the host devices\n");
        return 1;
    }
    TEST_CASE(create_host) {
        akv_dev_info info;
        CHECK_OK(akv_dev_get_info(dev, &info));
        CHECK_STR(info.name, "host");
        CHECK_EQ_INT(info.is_host, 1);
        CHECK_EQ_INT(info.cc_major, 0);
        CHECK_EQ_INT(info.cc_minor, 0);
        CHECK_STR(akv_dev_backend_name(akv_dev_host_backend()), "host");
    }
    TEST_CASE(bad_params) {
        akv_dev_params p = akv_dev_default_params();
        akv_dev *d2 = NULL;
        p.device_index = 1;
        CHECK_STATUS(akv_dev_create(akv_dev_host_backend(), &p, &d2), AKV_EDEVICE);
        p.device_index = -1;
        CHECK_STATUS(akv_dev_create(akv_dev_host_backend(), &p, &d2), AKV_EINVAL);
        CHECK(d2 == NULL);
    }

    TEST_CASE(alloc_accounting) {
        akv_dptr d;
        void *h;
        CHECK_OK(akv_dev_mem_alloc(dev, 1000, &d));
        CHECK(d.addr != 0 && d.addr % 256 == 0);
        CHECK_OK(akv_dev_pinned_alloc(dev, 5000, &h));
        CHECK(((uintptr_t)h % 4096) == 0);
        akv_dev_usage u = akv_dev_get_usage(dev);
        CHECK_EQ_U64(u.device_bytes, 1000);
        CHECK_EQ_U64(u.pinned_bytes, 5000);
        CHECK_STATUS(akv_dev_destroy(dev), AKV_EBUSY);
        CHECK_OK(akv_dev_mem_free(dev, d));
        CHECK_OK(akv_dev_pinned_free(dev, h));
        u = akv_dev_get_usage(dev);
        CHECK_EQ_U64(u.device_bytes + u.pinned_bytes + u.n_device + u.n_pinned, 0);
    }

    TEST_CASE(misuse) {
        akv_dptr d;
        void *h;
        CHECK_STATUS(akv_dev_mem_alloc(dev, 0, &d), AKV_EINVAL);
        CHECK_STATUS(akv_dev_pinned_alloc(dev, 0, &h), AKV_EINVAL);
        CHECK_STATUS(akv_dev_mem_free(dev, (akv_dptr){12345}), AKV_EINVAL);
        int local;
        CHECK_STATUS(akv_dev_pinned_free(dev, &local), AKV_EINVAL);
        CHECK_OK(akv_dev_mem_free(dev, (akv_dptr){0}));
        CHECK_OK(akv_dev_pinned_free(dev, NULL));
        /* a pinned block freed as device memory is refused */
        CHECK_OK(akv_dev_pinned_alloc(dev, 64, &h));
        CHECK_STATUS(akv_dev_mem_free(dev, (akv_dptr){(uint64_t)(uintptr_t)h}), AKV_EINVAL);
        CHECK_OK(akv_dev_pinned_free(dev, h));
        CHECK_OK(akv_dev_destroy(NULL));
    }

    TEST_CASE(sync_copies_and_range_checks) {
        akv_dptr d;
        CHECK_OK(akv_dev_mem_alloc(dev, 256, &d));
        unsigned char in[256], out[256];
        for (int i = 0; i < 256; i++) in[i] = (unsigned char)(i * 7 + 1);
        CHECK_OK(akv_dev_memset_sync(dev, d, 0xAB, 256));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, d, 256));
        CHECK_EQ_INT(out[255], 0xAB);
        CHECK_OK(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d, 16), in, 200));
        CHECK_OK(akv_dev_copy_d2d_sync(dev, d, akv_dptr_offset(d, 16), 16));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, d, 256));
        CHECK_BYTES(out, in, 16);
        CHECK_BYTES(out + 16, in, 200);
        /* one byte past the end, and an address from nowhere */
        CHECK_STATUS(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d, 57), in, 200), AKV_EINVAL);
        CHECK_STATUS(akv_dev_copy_d2h_sync(dev, out, (akv_dptr){8}, 1), AKV_EINVAL);
        CHECK_STATUS(akv_dev_memset_sync(dev, akv_dptr_offset(d, 255), 0, 2), AKV_EINVAL);
        CHECK_OK(akv_dev_mem_free(dev, d));
    }

    TEST_CASE(injected_failures) {
        akv_dptr d = {0};
        void *h = NULL;
        CHECK_OK(akv_dev_inject_alloc_failure(dev, 2, 1));
        CHECK_STATUS(akv_dev_pinned_alloc(dev, 64, &h), AKV_ENOMEM);
        CHECK(h == NULL);
        akv_dptr d1;
        CHECK_OK(akv_dev_mem_alloc(dev, 64, &d1));
        CHECK_STATUS(akv_dev_mem_alloc(dev, 64, &d), AKV_EDEVMEM);
        CHECK(d.addr == 0);
        CHECK_OK(akv_dev_mem_free(dev, d1));
        CHECK_EQ_U64(akv_dev_get_usage(dev).n_device, 0);
    }

    dev_cases_misuse(dev, other);
    dev_cases_roundtrip(dev);
    dev_cases_2d(dev);
    dev_cases_batch(dev);
    dev_cases_pinned_dptr(dev, 1);
    dev_cases_ops(dev, 64ull * 20 * 1000 * 1000);
    dev_cases_faults(dev);
    dev_cases_host_fn(dev);
    dev_cases_graph(dev, other);
    exec_fault_cases(dev);

    TEST_CASE(failing_op_faults_compute) {
        CHECK_OK(akv_dev_op_launch(dev, &failing_op, NULL, 0));
        CHECK_STATUS(akv_dev_sync(dev), AKV_EDEVICE);
        CHECK_OK(akv_dev_clear_faults(dev));
        CHECK_OK(akv_dev_sync(dev));
    }

    TEST_CASE(delay_controls) {
        CHECK_STATUS(akv_dev_inject_delays(NULL, 1, 1, 1), AKV_EINVAL);
        CHECK_OK(akv_dev_inject_delays(dev, 1, 0, 1)); /* off */
    }

    /* The reuse chain under random delays on every queue: the only thing that keeps each
     * block intact is the device-side ordering by events. */
    TEST_CASE(delays_on) {
        uint64_t seed = test_seed(20261129);
        CHECK_OK(akv_dev_inject_delays(dev, seed, 200, 3));
    }
    dev_cases_reuse_chain(dev, 400);
    dev_cases_host_fn(dev);
    TEST_CASE(delays_off) {
        CHECK_OK(akv_dev_inject_delays(dev, 0, 0, 1));
    }

    TEST_CASE(destroy_never_waits_for_running_or_queued_work) {
        /* Two ops of about a second each: destroy returns at once; the running one finishes
         * on its detached thread, the queued one is dropped. */
        akv_dev *d2 = NULL;
        if (!REQUIRE_OK(akv_dev_create(akv_dev_host_backend(), NULL, &d2))) break;
        akv_dev_busy_args a = {.n_iters = 64ull * 1000 * 1000 * 1000};
        CHECK_OK(akv_dev_op_launch(d2, &akv_dev_op_busy, &a, sizeof a));
        CHECK_OK(akv_dev_op_launch(d2, &akv_dev_op_busy, &a, sizeof a));
        uint64_t t0 = akv_clock_ns();
        CHECK_OK(akv_dev_destroy(d2));
        uint64_t dt = akv_clock_ns() - t0;
        TEST_CHECK_(dt < 50 * 1000 * 1000, "destroy took %.1f ms", dt / 1e6);
    }

    profile_cases(dev);

    TEST_CASE(destroy) {
        /* a live graph keeps the device: destroy refuses, nothing changes */
        akv_dev_busy_args ba = {.n_iters = 64};
        akv_dev_launch bl = {&akv_dev_op_busy, &ba};
        akv_graph *g = NULL;
        CHECK_OK(akv_dev_graph_create(other, &bl, 1, &g));
        CHECK_STATUS(akv_dev_destroy(other), AKV_EBUSY);
        CHECK_OK(akv_dev_graph_launch(other, g));
        CHECK_OK(akv_dev_sync(other));
        CHECK_OK(akv_dev_graph_destroy(other, g));
        CHECK_OK(akv_dev_destroy(other));
        CHECK_OK(akv_dev_destroy(dev));
    }
    return test_finish();
}
