/*
 * tests/dev_cases.h — device-interface cases that every backend must pass: queues, events,
 * async 1D/2D/batched copies by every available method, ops, misuse, injected submission
 * and wait faults. Included by test_dev.c (host backend) and gpu/test_dev_cuda.c (CUDA).
 */
#ifndef AKV_TESTS_DEV_CASES_H
#define AKV_TESTS_DEV_CASES_H

#include "test.h"

#include "akv/dev.h"
#include "akv/log.h"
#include "akv/testing/dev_faults.h"
#include "akv/forward_ops.h" /* fill and add: ops both backends implement, with exact results */

/* Fills n bytes with a pattern from `seed`. */
static inline void dev_cases_fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t r = seed;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) r = test_rand(&r) | 1;
        p[i] = (unsigned char)(r >> (8 * (i % 8)));
    }
}

/* An async round trip of an awkward size, ordered by events. */
static inline void dev_cases_roundtrip(akv_dev *dev) {
    const size_t n = 3 * 4096 + 17; /* not a multiple of anything nice */
    unsigned char *src = NULL, *dst = NULL;
    akv_dptr d = {0};
    akv_event *ev = NULL;
    TEST_CASE(async_roundtrip_with_event_ordering) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, n, (void **)&src))) break;
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, n, (void **)&dst))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, n, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev))) break;
        dev_cases_fill(src, n, 1);
        memset(dst, 0, n);
        /* H2D on its queue; D2H waits on the device for it; the host syncs only at the end. */
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, src, n));
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D));
        CHECK_EQ_U64(akv_dev_event_serial(ev), 1);
        CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, ev));
        CHECK_OK(akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, dst, d, n));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H));
        CHECK_BYTES(dst, src, n);
        int done = 0;
        CHECK_OK(akv_dev_event_query(dev, ev, &done));
        CHECK_EQ_INT(done, 1);
        CHECK_OK(akv_dev_event_sync(dev, ev));
        int failed = -1;
        CHECK_OK(akv_dev_event_outcome(dev, ev, &failed));
        CHECK_EQ_INT(failed, 0);
    }
    akv_dev_event_destroy(dev, ev);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, src);
    akv_dev_pinned_free(dev, dst);
}

/* A chain that reuses ONE device buffer for many transfers: each H2D overwrite waits (on the
 * device) for the D2H that read the previous contents. Any lost ordering shows as a wrong
 * block on the host. With random queue delays (host backend) the race is wide open. */
static inline void dev_cases_reuse_chain(akv_dev *dev, int n_rounds) {
    const size_t blk = 1024;
    unsigned char *src = NULL, *dst = NULL;
    akv_dptr d = {0};
    akv_event *filled = NULL, *drained = NULL;
    TEST_CASE(buffer_reuse_ordered_by_events) {
        size_t n = blk * (size_t)n_rounds;
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, n, (void **)&src))) break;
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, n, (void **)&dst))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, blk, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &filled))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &drained))) break;
        dev_cases_fill(src, n, 2);
        memset(dst, 0, n);
        for (int r = 0; r < n_rounds; r++) {
            if (r) CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_H2D, drained));
            CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, src + r * blk, blk));
            CHECK_OK(akv_dev_event_record(dev, filled, AKV_QUEUE_H2D));
            CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, filled));
            CHECK_OK(akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, dst + r * blk, d, blk));
            CHECK_OK(akv_dev_event_record(dev, drained, AKV_QUEUE_D2H));
        }
        CHECK_OK(akv_dev_sync(dev));
        CHECK_BYTES(dst, src, n);
        CHECK_EQ_U64(akv_dev_event_serial(filled), (uint64_t)n_rounds);
    }
    akv_dev_event_destroy(dev, filled);
    akv_dev_event_destroy(dev, drained);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, src);
    akv_dev_pinned_free(dev, dst);
}

/* The write-back shape: one token's rows of a page, a 2D copy; nothing else in the host page
 * changes. Page [2][H][P][D] of 2-byte elements, token t. */
static inline void dev_cases_2d(akv_dev *dev) {
    enum { H = 3, P = 16, D = 8, E = 2 };
    const size_t page = 2 * H * P * D * E, pitch = P * D * E, width = D * E;
    unsigned char *host = NULL, *want = NULL, *dev_img = NULL;
    akv_dptr d = {0};
    TEST_CASE(copy_2d_writes_only_the_token_rows) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, page, (void **)&host))) break;
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, page, (void **)&dev_img))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, page, &d))) break;
        want = malloc(page);
        if (!CHECK(want != NULL)) break;
        dev_cases_fill(dev_img, page, 3);
        CHECK_OK(akv_dev_copy_h2d_sync(dev, d, dev_img, page));
        memset(host, 0x5A, page);
        memcpy(want, host, page);
        for (size_t t = 5; t < 7; t++) /* tokens 5 and 6: 2 tokens = one row width of 2*D*E */
            for (size_t r = 0; r < 2 * H; r++)
                memcpy(want + r * pitch + t * width, dev_img + r * pitch + t * width, width);
        CHECK_OK(akv_dev_copy_d2h_2d_async(dev, AKV_QUEUE_D2H, host + 5 * width, pitch,
                                           akv_dptr_offset(d, 5 * width), pitch, 2 * width, 2 * H));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H));
        CHECK_BYTES(host, want, page);
        /* and back: H2D 2D into a cleared device page */
        CHECK_OK(akv_dev_memset_async(dev, AKV_QUEUE_H2D, d, 0, page));
        CHECK_OK(akv_dev_copy_h2d_2d_async(dev, AKV_QUEUE_H2D, akv_dptr_offset(d, 5 * width), pitch,
                                           host + 5 * width, pitch, 2 * width, 2 * H));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_H2D));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, dev_img, d, page));
        memset(want, 0, page);
        for (size_t r = 0; r < 2 * H; r++)
            memcpy(want + r * pitch + 5 * width, host + r * pitch + 5 * width, 2 * width);
        CHECK_BYTES(dev_img, want, page);
    }
    free(want);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, host);
    akv_dev_pinned_free(dev, dev_img);
}

/* Batched page copies, scattered and adjacent, by every method the backend has; then the
 * write-back direction. Awkward span sizes (1, 17, a page, a page + 16) and more spans than
 * one chunk, so every split path runs. */
static inline void dev_cases_batch(akv_dev *dev) {
    enum { N_PAGES = 300 };
    const size_t page = 4096;
    unsigned char *host = NULL, *back = NULL;
    akv_dptr d = {0};
    akv_dev_xfer *x = NULL;
    TEST_CASE(batched_copies_every_method) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, N_PAGES * page, (void **)&host))) break;
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, N_PAGES * page, (void **)&back))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, N_PAGES * page, &d))) break;
        x = calloc(N_PAGES, sizeof *x);
        if (!CHECK(x != NULL)) break;
        akv_copy_config saved = akv_dev_get_copy_config(dev);
        CHECK_NE_INT(saved.method, AKV_COPY_METHOD_DEFAULT);
        for (int m = AKV_COPY_METHOD_EACH; m < AKV_N_COPY_METHODS; m++) {
            akv_copy_config cfg = {.method = (akv_copy_method)m, .kernel_blocks = 3};
            akv_status st = akv_dev_set_copy_config(dev, &cfg);
            if (st == AKV_EUNSUPPORTED) {
                printf("  method %s: unsupported here\n", akv_copy_method_name(cfg.method));
                continue;
            }
            CHECK_OK(st);
            uint64_t seed = 100 + (uint64_t)m, rng = seed;
            dev_cases_fill(host, N_PAGES * page, seed);
            CHECK_OK(akv_dev_memset_sync(dev, d, 0, N_PAGES * page));
            /* First half: adjacent on both sides (coalescable); second half: host page i goes
             * to a scattered device page, with awkward lengths. */
            size_t n = 0;
            for (size_t i = 0; i < N_PAGES / 2; i++)
                x[n++] = (akv_dev_xfer){akv_dptr_offset(d, i * page), host + i * page, page};
            for (size_t i = N_PAGES / 2; i < N_PAGES; i++) {
                size_t j = N_PAGES / 2 + (i * 7919) % (N_PAGES / 2);
                static const size_t lens[] = {1, 17, 4096, 4080, 2048 + 3};
                size_t len = lens[test_rand_below(&rng, 5)];
                x[n++] = (akv_dev_xfer){akv_dptr_offset(d, j * page + (len == 4080 ? 16 : 0)),
                                        host + i * page, len};
            }
            CHECK_OK(akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, x, n));
            CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_H2D));
            memset(back, 0xEE, N_PAGES * page);
            CHECK_OK(akv_dev_copy_d2h_sync(dev, back, d, N_PAGES * page));
            int bad = 0;
            for (size_t k = 0; k < n && !bad; k++)
                bad = memcmp(back + (x[k].d.addr - d.addr), x[k].h, x[k].n_bytes) != 0;
            TEST_CHECK_(!bad, "method %s: an H2D span arrived wrong", akv_copy_method_name(cfg.method));
            /* D2H: the device pages back into a cleared host buffer (spans swapped roles),
             * by the method named for the call alone, the configuration back as it was */
            memset(back, 0, N_PAGES * page);
            for (size_t k = 0; k < n; k++) x[k].h = back + ((char *)x[k].h - (char *)host);
            CHECK_OK(akv_dev_set_copy_config(dev, &saved));
            CHECK_OK(akv_dev_copy_d2h_batch_by_async(dev, AKV_QUEUE_D2H, cfg.method, x, n));
            CHECK_EQ_INT(akv_dev_get_copy_config(dev).method, saved.method);
            CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H));
            bad = 0;
            for (size_t k = 0; k < n && !bad; k++)
                bad = memcmp(x[k].h, host + ((char *)x[k].h - (char *)back), x[k].n_bytes) != 0;
            TEST_CHECK_(!bad, "method %s: a D2H span arrived wrong", akv_copy_method_name(cfg.method));
        }
        CHECK_OK(akv_dev_set_copy_config(dev, &saved));
        akv_copy_config bad_cfg = {.method = (akv_copy_method)99};
        CHECK_STATUS(akv_dev_set_copy_config(dev, &bad_cfg), AKV_EINVAL);
        CHECK_STATUS(akv_dev_copy_h2d_batch_by_async(dev, AKV_QUEUE_H2D, (akv_copy_method)99, x, 1), AKV_EINVAL);
        /* a method the device lacks (here: refused, as on a backend without it) is refused
         * alike by the configuration and by a call, which submits nothing */
        CHECK_OK(akv_dev_refuse_copy_method(dev, AKV_COPY_METHOD_KERNEL, 1));
        int refused = 0;
        for (int m = AKV_COPY_METHOD_EACH; m < AKV_N_COPY_METHODS; m++) {
            akv_copy_config cfg = {.method = (akv_copy_method)m};
            if (akv_dev_set_copy_config(dev, &cfg) != AKV_EUNSUPPORTED) continue;
            refused++;
            CHECK_STATUS(akv_dev_copy_h2d_batch_by_async(dev, AKV_QUEUE_H2D, cfg.method, x, 1),
                         AKV_EUNSUPPORTED);
        }
        CHECK(refused >= 1);
        CHECK_OK(akv_dev_refuse_copy_method(dev, AKV_COPY_METHOD_KERNEL, 0));
        CHECK_STATUS(akv_dev_refuse_copy_method(dev, AKV_COPY_METHOD_DEFAULT, 1), AKV_EINVAL);
        CHECK_OK(akv_dev_set_copy_config(dev, &saved));
    }
    free(x);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, host);
    akv_dev_pinned_free(dev, back);
}

/* The device's address of pinned memory: for ranges inside one live pinned block only (the
 * host backend's is the host address itself). */
static inline void dev_cases_pinned_dptr(akv_dev *dev, int host_backend) {
    TEST_CASE(pinned_memory_has_a_device_address) {
        unsigned char *h = NULL;
        akv_dptr d = {0}, m = {0};
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, 8192, (void **)&h))) break;
        CHECK_OK(akv_dev_pinned_dptr(dev, h, 8192, &d));
        CHECK(d.addr != 0);
        CHECK_OK(akv_dev_pinned_dptr(dev, h + 4096, 100, &m));
        CHECK(m.addr == d.addr + 4096); /* one block maps whole */
        if (host_backend) CHECK(d.addr == (uint64_t)(uintptr_t)h);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        akv_dptr keep = d;
        CHECK_STATUS(akv_dev_pinned_dptr(dev, h + 4096, 8192, &d), AKV_EINVAL); /* past the end */
        unsigned char plain[16];
        CHECK_STATUS(akv_dev_pinned_dptr(dev, plain, 16, &d), AKV_EINVAL); /* not pinned */
        CHECK_STATUS(akv_dev_pinned_dptr(dev, h, 0, &d), AKV_EINVAL);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(d.addr == keep.addr); /* untouched on refusal */
        akv_dev_pinned_free(dev, h);
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        CHECK_STATUS(akv_dev_pinned_dptr(dev, h, 16, &d), AKV_EINVAL); /* freed */
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
}

/* Ops: the busy op holds the compute queue; a record behind it is not complete at once, is
 * after a sync, and timing events measure it. */
static inline void dev_cases_ops(akv_dev *dev, uint64_t busy_iters) {
    akv_event *t0 = NULL, *t1 = NULL;
    akv_dptr sink = {0};
    TEST_CASE(busy_op_timing_and_query) {
        if (!REQUIRE_OK(akv_dev_event_create(dev, AKV_EVENT_TIMING, &t0))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, AKV_EVENT_TIMING, &t1))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, 256, &sink))) break;
        CHECK(akv_dev_op_supported(dev, &akv_dev_op_busy));
        akv_dev_busy_args a = {.n_blocks = 0, .n_threads = 0, .n_iters = busy_iters, .sink = sink};
        CHECK_OK(akv_dev_event_record(dev, t0, AKV_QUEUE_COMPUTE));
        CHECK_OK(akv_dev_op_launch(dev, &akv_dev_op_busy, &a, sizeof a));
        CHECK_OK(akv_dev_event_record(dev, t1, AKV_QUEUE_COMPUTE));
        int done = 1;
        CHECK_OK(akv_dev_event_query(dev, t1, &done));
        CHECK_EQ_INT(done, 0); /* the op takes milliseconds; the query returns at once */
        uint64_t ns = 0;
        CHECK_STATUS(akv_dev_event_elapsed_ns(dev, t0, t1, &ns), AKV_ESTATE);
        CHECK_OK(akv_dev_event_sync(dev, t1));
        CHECK_OK(akv_dev_event_query(dev, t1, &done));
        CHECK_EQ_INT(done, 1);
        CHECK_OK(akv_dev_event_elapsed_ns(dev, t0, t1, &ns));
        printf("  busy op (%llu iterations): %.3f ms\n", (unsigned long long)busy_iters, ns / 1e6);
        CHECK(ns > 100000); /* more than 0.1 ms */
        /* misuse: wrong argument size, an op nobody implements */
        CHECK_STATUS(akv_dev_op_launch(dev, &akv_dev_op_busy, &a, sizeof a - 1), AKV_EINVAL);
        static const akv_dev_op nobody = {.name = "no_such_op", .args_bytes = 0, .host = NULL};
        CHECK(!akv_dev_op_supported(dev, &nobody));
        CHECK_STATUS(akv_dev_op_launch(dev, &nobody, NULL, 0), AKV_EUNSUPPORTED);
    }
    akv_dev_event_destroy(dev, t0);
    akv_dev_event_destroy(dev, t1);
    akv_dev_mem_free(dev, sink);
}

/* Every misuse of queues, events and copies is an error naming the problem; nothing runs. */
static inline void dev_cases_misuse(akv_dev *dev, akv_dev *other) {
    unsigned char *pin = NULL;
    akv_dptr d = {0};
    akv_event *ev = NULL, *foreign = NULL;
    unsigned char stack_buf[64];
    TEST_CASE(queue_event_copy_misuse_table) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, 4096, (void **)&pin))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, 4096, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev))) break;
        if (other && !REQUIRE_OK(akv_dev_event_create(other, 0, &foreign))) break;
        int done;
        uint64_t ns;
        akv_dev_xfer bad_span[2] = {{d, pin, 64}, {akv_dptr_offset(d, 4090), pin, 64}};
        struct {
            const char *what;
            akv_status got, want;
        } rows[] = {
            {"wait on a never-recorded event", akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, ev), AKV_ESTATE},
            {"query a never-recorded event", akv_dev_event_query(dev, ev, &done), AKV_ESTATE},
            {"outcome of a never-recorded event", akv_dev_event_outcome(dev, ev, &done), AKV_ESTATE},
            {"outcome into NULL", akv_dev_event_outcome(dev, ev, NULL), AKV_EINVAL},
            {"sync a never-recorded event", akv_dev_event_sync(dev, ev), AKV_ESTATE},
            {"elapsed without timing", akv_dev_event_elapsed_ns(dev, ev, ev, &ns), AKV_EINVAL},
            {"record on queue 3", akv_dev_event_record(dev, ev, (akv_queue)3), AKV_EINVAL},
            {"record on queue -1", akv_dev_event_record(dev, ev, (akv_queue)-1), AKV_EINVAL},
            {"record a NULL event", akv_dev_event_record(dev, NULL, AKV_QUEUE_H2D), AKV_EINVAL},
            {"record another device's event",
             other ? akv_dev_event_record(dev, foreign, AKV_QUEUE_H2D) : AKV_EINVAL, AKV_EINVAL},
            {"query into NULL", akv_dev_event_query(dev, ev, NULL), AKV_EINVAL},
            {"sync queue 7", akv_dev_queue_sync(dev, (akv_queue)7), AKV_EINVAL},
            {"event flags 2", akv_dev_event_create(dev, 2, &foreign), AKV_EINVAL},
            {"async H2D from the stack", akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, stack_buf, 64), AKV_EINVAL},
            {"async D2H to the stack", akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, stack_buf, d, 64), AKV_EINVAL},
            {"async H2D past the allocation", akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, akv_dptr_offset(d, 4095), pin, 2), AKV_EINVAL},
            {"async H2D from past the pinned block", akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin + 4095, 2), AKV_EINVAL},
            {"async H2D to device address 0", akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, (akv_dptr){0}, pin, 2), AKV_EINVAL},
            {"async copy on queue 3", akv_dev_copy_h2d_async(dev, (akv_queue)3, d, pin, 2), AKV_EINVAL},
            {"2D pitch below width", akv_dev_copy_d2h_2d_async(dev, AKV_QUEUE_D2H, pin, 8, d, 16, 16, 2), AKV_EINVAL},
            {"2D extent past the end", akv_dev_copy_d2h_2d_async(dev, AKV_QUEUE_D2H, pin, 2048, d, 2048, 64, 3), AKV_EINVAL},
            {"2D pitch overflow", akv_dev_copy_d2h_2d_async(dev, AKV_QUEUE_D2H, pin, SIZE_MAX / 2, d, 64, 64, 3), AKV_EINVAL},
            {"batch with a span past the end", akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, bad_span, 2), AKV_EINVAL},
            {"batch with NULL spans", akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, NULL, 2), AKV_EINVAL},
            {"memset past the end", akv_dev_memset_async(dev, AKV_QUEUE_H2D, akv_dptr_offset(d, 1), 0, 4096), AKV_EINVAL},
            {"elapsed of another device's event",
             other ? akv_dev_event_elapsed_ns(dev, foreign, ev, &ns) : AKV_EINVAL, AKV_EINVAL},
            {"destroy another device's event", other ? akv_dev_event_destroy(dev, foreign) : AKV_EINVAL, AKV_EINVAL},
        };
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            TEST_CHECK_(rows[i].got == rows[i].want, "%s: got %s, want %s", rows[i].what,
                        akv_status_name(rows[i].got), akv_status_name(rows[i].want));
        /* nothing above submitted anything: the event is still unrecorded */
        CHECK_EQ_U64(akv_dev_event_serial(ev), 0);
        CHECK_STATUS(akv_dev_destroy(dev), AKV_EBUSY); /* live event (and memory) */
        /* zero-byte copies are no-ops, not errors */
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 0));
        CHECK_OK(akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, NULL, 0));
    }
    if (other) akv_dev_event_destroy(other, foreign);
    akv_dev_event_destroy(dev, ev);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, pin);
}

/* Host functions in queue order: a function on queue q sees every copy submitted to q before
 * it complete (it checks a D2H copy's bytes) and runs before anything submitted after it (an
 * H2D copy of the bytes it writes carries them), while another queue's event orders the first
 * copy. Repeated, so a race under the host backend's delays would show. A failed submission
 * runs nothing. */
typedef struct dev_cases_fn_arg {
    const unsigned char *seen, *want; /* the bytes the function must see */
    unsigned char *out;               /* what it writes for the copy after it */
    size_t n;
    int runs, mismatches;
} dev_cases_fn_arg;

static void dev_cases_fn(void *p) {
    dev_cases_fn_arg *a = p;
    a->runs++;
    if (memcmp(a->seen, a->want, a->n)) a->mismatches++;
    for (size_t i = 0; i < a->n; i++) a->out[i] = (unsigned char)(a->want[i] ^ 0x5a);
}

static inline void dev_cases_host_fn(akv_dev *dev) {
    enum { N = 4096 * 3 + 5, ROUNDS = 20 };
    unsigned char *pin = NULL;
    akv_dptr d = {0};
    akv_event *ev = NULL;
    TEST_CASE(host_functions_run_in_queue_order) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, 5 * N, (void **)&pin))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, 2 * N, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev))) break;
        unsigned char *src = pin, *seen = pin + N, *out = pin + 2 * N, *back = pin + 3 * N,
                      *want = pin + 4 * N;
        dev_cases_fn_arg a = {.seen = seen, .want = src, .out = out, .n = N};
        const akv_dptr d2 = akv_dptr_offset(d, N);
        for (int r = 0; r < ROUNDS; r++) {
            dev_cases_fill(src, N, 100 + (uint64_t)r);
            memset(seen, 0, N), memset(back, 0, N);
            CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, src, N));
            CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D));
            CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, ev));
            CHECK_OK(akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, seen, d, N));
            CHECK_OK(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, dev_cases_fn, &a));
            CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_D2H, d2, out, N));
            CHECK_OK(akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, back, d2, N));
            CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H));
            for (size_t i = 0; i < N; i++) want[i] = (unsigned char)(src[i] ^ 0x5a);
            CHECK(memcmp(back, want, N) == 0);
            CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_H2D)); /* src is rewritten next round */
        }
        CHECK_EQ_INT(a.runs, ROUNDS);
        CHECK_EQ_INT(a.mismatches, 0);
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP, 1, 0));
        CHECK_STATUS(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, dev_cases_fn, &a), AKV_EDEVICE);
        CHECK_STATUS(akv_dev_host_fn_async(dev, AKV_QUEUE_D2H, NULL, &a), AKV_EINVAL);
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_D2H));
        CHECK_EQ_INT(a.runs, ROUNDS); /* neither ran */
    }
    akv_dev_event_destroy(dev, ev);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, pin);
}

/* Submission and wait faults (front-injected, every backend): the nth pass fails, nothing is
 * submitted by a failed submission, counting is exact; a sticky sync fault repeats until
 * cleared. */
static inline void dev_cases_faults(akv_dev *dev) {
    unsigned char *pin = NULL;
    akv_dptr d = {0};
    akv_event *ev = NULL;
    TEST_CASE(injected_submission_and_wait_faults) {
        if (!REQUIRE_OK(akv_dev_pinned_alloc(dev, 4096, (void **)&pin))) break;
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, 4096, &d))) break;
        if (!REQUIRE_OK(akv_dev_event_create(dev, 0, &ev))) break;
        uint64_t c0 = akv_dev_fault_passes(dev, AKV_FAULT_COPY);
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_COPY, 2, 0));
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 16));
        CHECK_STATUS(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 16), AKV_EDEVICE);
        CHECK_OK(akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, d, pin, 16)); /* one-shot */
        CHECK_EQ_U64(akv_dev_fault_passes(dev, AKV_FAULT_COPY) - c0, 3);

        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_RECORD, 1, 0));
        CHECK_STATUS(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D), AKV_EDEVICE);
        CHECK_EQ_U64(akv_dev_event_serial(ev), 0); /* a failed record is no record */
        CHECK_OK(akv_dev_event_record(dev, ev, AKV_QUEUE_H2D));

        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_WAIT, 1, 0));
        CHECK_STATUS(akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, ev), AKV_EDEVICE);
        CHECK_OK(akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, ev));

        akv_dev_busy_args a = {.n_iters = 64};
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP, 1, 0));
        CHECK_STATUS(akv_dev_op_launch(dev, &akv_dev_op_busy, &a, sizeof a), AKV_EDEVICE);

        /* a sticky sync fault: the device "cannot establish completion" until cleared */
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_SYNC, 1, 1));
        CHECK_STATUS(akv_dev_queue_sync(dev, AKV_QUEUE_H2D), AKV_EDEVICE);
        CHECK_STATUS(akv_dev_sync(dev), AKV_EDEVICE);
        CHECK_STATUS(akv_dev_event_sync(dev, ev), AKV_EDEVICE);
        CHECK_OK(akv_dev_clear_faults(dev));
        CHECK_OK(akv_dev_sync(dev));
        CHECK_OK(akv_dev_event_sync(dev, ev));
        CHECK_STATUS(akv_dev_inject_fault(dev, (akv_dev_fault)AKV_N_FAULTS, 1, 0), AKV_EINVAL);
        CHECK_STR(akv_dev_fault_name(AKV_FAULT_SYNC), "sync");
        CHECK_STR(akv_queue_name(AKV_QUEUE_COMPUTE), "compute");
    }
    akv_dev_event_destroy(dev, ev);
    akv_dev_mem_free(dev, d);
    akv_dev_pinned_free(dev, pin);
}

/* Graphs: a fixed sequence of ops replays in order with the arguments it was built with
 * (copied at build), repeatedly; misuse is refused; an injected launch failure submits
 * nothing. y = fill(seed 1) then y += a (a = fill(seed 3)): in another order y would differ. */
static inline void dev_cases_graph(akv_dev *dev, akv_dev *other) {
    enum { N = 1000 };
    akv_dptr y = {0}, a = {0};
    akv_graph *g = NULL;
    float *out = NULL;
    TEST_CASE(graph_replays_in_order_with_its_arguments) {
        if (!REQUIRE_OK(akv_dev_mem_alloc(dev, N * sizeof(float), &y)) ||
            !REQUIRE_OK(akv_dev_mem_alloc(dev, N * sizeof(float), &a)))
            break;
        out = malloc(N * sizeof *out);
        if (!CHECK(out != NULL)) break;
        akv_fwd_fill_args fa = {.y = a, .n = N, .seed = 3, .center = 0, .scale = 1,
                                .y_dtype = AKV_DTYPE_F32};
        akv_fwd_fill_args fy = fa;
        fy.y = y, fy.seed = 1;
        akv_fwd_add_args add = {.y = y, .a = a, .n_rows = 1, .n = N};
        akv_dev_launch ls[3] = {{&akv_fwd_op_fill, &fa}, {&akv_fwd_op_fill, &fy},
                                {&akv_fwd_op_add, &add}};
        if (!REQUIRE_OK(akv_dev_graph_create(dev, ls, 3, &g))) break;
        fy.seed = 99, add.n = 1; /* copied at build: later changes do not reach the graph */
        for (int rep = 0; rep < 3; rep++) {
            CHECK_OK(akv_dev_memset_sync(dev, y, 0xFF, N * sizeof(float))); /* NaN poison */
            CHECK_OK(akv_dev_graph_launch(dev, g));
            CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
            CHECK_OK(akv_dev_copy_d2h_sync(dev, out, y, N * sizeof(float)));
            int bad = 0;
            for (int i = 0; i < N; i++) {
                float want = akv_fwd_fill_value(1, (uint64_t)i, 0, 1) +
                             akv_fwd_fill_value(3, (uint64_t)i, 0, 1);
                bad += out[i] != want;
            }
            TEST_CHECK_(bad == 0, "launch %d: %d of %d values differ", rep, bad, N);
        }
        /* an injected launch failure submits nothing: the poison stays */
        CHECK_OK(akv_dev_memset_sync(dev, y, 0xFF, N * sizeof(float)));
        CHECK_OK(akv_dev_inject_fault(dev, AKV_FAULT_OP, 1, 0));
        CHECK_STATUS(akv_dev_graph_launch(dev, g), AKV_EDEVICE);
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        CHECK_OK(akv_dev_copy_d2h_sync(dev, out, y, N * sizeof(float)));
        CHECK(out[0] != out[0] && out[N - 1] != out[N - 1]);
        /* misuse */
        akv_graph *h = NULL;
        static const akv_dev_op nobody = {.name = "no_such_op", .args_bytes = 0, .host = NULL};
        akv_dev_launch bad_ls[2] = {{&akv_fwd_op_fill, &fa}, {&nobody, NULL}};
        CHECK_STATUS(akv_dev_graph_create(dev, bad_ls, 2, &h), AKV_EUNSUPPORTED);
        bad_ls[1] = (akv_dev_launch){NULL, NULL};
        CHECK_STATUS(akv_dev_graph_create(dev, bad_ls, 2, &h), AKV_EINVAL);
        bad_ls[1] = (akv_dev_launch){&akv_fwd_op_fill, NULL};
        CHECK_STATUS(akv_dev_graph_create(dev, bad_ls, 2, &h), AKV_EINVAL);
        CHECK_STATUS(akv_dev_graph_create(dev, ls, 0, &h), AKV_EINVAL);
        CHECK(h == NULL);
        if (other) {
            CHECK_STATUS(akv_dev_graph_launch(other, g), AKV_EINVAL);
            CHECK_STATUS(akv_dev_graph_destroy(other, g), AKV_EINVAL);
        }
        CHECK_OK(akv_dev_graph_destroy(dev, NULL));
    }
    CHECK_OK(akv_dev_graph_destroy(dev, g));
    free(out);
    akv_dev_mem_free(dev, y);
    akv_dev_mem_free(dev, a);
}

#endif
