/*
 * bench_copy.c (bench) — staging bandwidth by page size and copy method, on the CUDA device.
 *
 * What it measures, every rate as a ratio of the large-copy rate measured in the same run
 * (one 256 MiB cudaMemcpyAsync host-to-device, pinned):
 *   A. refill alone: 128 MiB of pages host->device by method, page sizes 64 KiB .. 4 MiB.
 *      Host pages are a random permutation of an arena (what a host pool looks like after
 *      a while); device pages are consecutive (a staging slot). "coalesce (adj)" is the one
 *      column whose host pages are consecutive too: what merging adjacent pages can win.
 *   B. the copy kernel's block count at the default page size: rate alone, rate under compute
 *      and what it costs the compute.
 *   C. refill and write-back together: 128 MiB each way at once.
 *   D. refill while a compute kernel keeps every SM busy (the "busy" op, back to back): the
 *      rate, and the compute lost = (compute time with copies - alone) / copy time, i.e. the
 *      fraction of the device's compute the copy took while it ran.
 * Each cell is the median of 3 runs after a warm-up. Times come from device events on the
 * queues; "submit" is host time per page spent in the submitting call.
 *
 * Output: markdown tables on stdout and appended to the file named by AKV_BENCH_OUT (set by
 * scripts/gpu-check). Exit 77 without a CUDA device.
 */
#include "test.h"

#include <stdbool.h>

#include "akv/dev.h"
#include "akv/log.h"
#include "core/assert.h"
#include "core/clock.h"
#include "akv/dev_cuda.h"

#define AKV_BENCH_NAME "bench_copy"
#include "bench_try.h"

#define TOTAL_BYTES ((size_t)128 << 20)  /* per direction per run */
#define ARENA_BYTES ((size_t)256 << 20)  /* host arena the pages are scattered over */
#define LARGE_BYTES ((size_t)256 << 20)  /* the large-copy reference */
#define N_RUNS 3
#define DEFAULT_PAGE ((size_t)256 << 10)

enum { LAYOUT_SCATTERED = 0, LAYOUT_ADJACENT = 1 };
enum { DO_H2D = 1, DO_D2H = 2, DO_COMPUTE = 4 };

typedef struct bench {
    akv_dev *dev;
    unsigned char *arena_h2d, *arena_d2h; /* pinned, ARENA_BYTES each */
    akv_dptr stage_h2d, stage_d2h;        /* device, TOTAL_BYTES each */
    akv_dptr sink;
    akv_event *h0, *h1, *d0, *d1, *c0, *c1, *go;
    akv_dev_xfer *xh, *xd;
    uint32_t *perm;
    uint64_t busy_iters; /* one busy launch is about 1 ms */
    double busy_ms;
    double large_h2d; /* GB/s */
    FILE *out;
    int starred;      /* a cell carries the "outlasted" star: print its footnote */
} bench;

typedef struct result {
    double h2d_gbs, d2h_gbs; /* 0 when not measured */
    double submit_us;        /* host time per page in the submitting calls */
    double compute_loss;     /* fraction of compute lost while copying; 0 without compute */
    int outlasted;           /* the copy ran past the compute it was meant to overlap */
} result;

static double elapsed_ms(bench *b, akv_event *a, akv_event *z) {
    uint64_t ns = 0;
    if (akv_dev_event_elapsed_ns(b->dev, a, z, &ns) != AKV_OK) return -1;
    return ns / 1e6;
}

/* n spans of `page` bytes: device pages consecutive, host pages permuted or consecutive. */
static size_t make_spans(bench *b, akv_dev_xfer *x, unsigned char *arena, akv_dptr stage,
                         size_t page, int layout, uint64_t seed) {
    size_t n = TOTAL_BYTES / page, slots = ARENA_BYTES / page;
    for (size_t i = 0; i < slots; i++) b->perm[i] = (uint32_t)i;
    uint64_t r = seed;
    for (size_t i = slots - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = test_rand_below(&r, i + 1);
        uint32_t t = b->perm[i];
        b->perm[i] = b->perm[j];
        b->perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        size_t slot = layout == LAYOUT_ADJACENT ? i : b->perm[i];
        x[i] = (akv_dev_xfer){akv_dptr_offset(stage, i * page), arena + slot * page, page};
    }
    return n;
}

static int launch_busy(bench *b, uint64_t n) {
    akv_dev_busy_args a = {.n_blocks = 0, .n_threads = 0, .n_iters = b->busy_iters, .sink = b->sink};
    for (uint64_t i = 0; i < n; i++)
        if (akv_dev_op_launch(b->dev, &akv_dev_op_busy, &a, sizeof a) != AKV_OK) return 0;
    return 1;
}

/* Compute alone: n_busy launches, ms. */
static double compute_alone_ms(bench *b, uint64_t n_busy) {
    akv_dev_event_record(b->dev, b->c0, AKV_QUEUE_COMPUTE);
    launch_busy(b, n_busy);
    akv_dev_event_record(b->dev, b->c1, AKV_QUEUE_COMPUTE);
    akv_dev_sync(b->dev);
    return elapsed_ms(b, b->c0, b->c1);
}

/* One run: the copies in `what`, with compute when asked (n_busy launches, the copies starting
 * after the first). Returns 0 on a device error. */
static int run_once(bench *b, const akv_copy_config *cfg, size_t page, int layout, int what,
                    uint64_t n_busy, uint64_t seed, result *res) {
    akv_dev *dev = b->dev;
    if (akv_dev_set_copy_config(dev, cfg) != AKV_OK) return 0;
    size_t n = make_spans(b, b->xh, b->arena_h2d, b->stage_h2d, page, layout, seed);
    make_spans(b, b->xd, b->arena_d2h, b->stage_d2h, page, layout, seed + 1);
    int ok = 1;
    if (what & DO_COMPUTE) {
        ok &= akv_dev_event_record(dev, b->c0, AKV_QUEUE_COMPUTE) == AKV_OK;
        ok &= launch_busy(b, 1);
        ok &= akv_dev_event_record(dev, b->go, AKV_QUEUE_COMPUTE) == AKV_OK;
        ok &= launch_busy(b, n_busy - 1);
        ok &= akv_dev_event_record(dev, b->c1, AKV_QUEUE_COMPUTE) == AKV_OK;
        ok &= akv_dev_queue_wait_event(dev, AKV_QUEUE_H2D, b->go) == AKV_OK;
        ok &= akv_dev_queue_wait_event(dev, AKV_QUEUE_D2H, b->go) == AKV_OK;
    }
    uint64_t t_submit = 0;
    if (what & DO_H2D) {
        ok &= akv_dev_event_record(dev, b->h0, AKV_QUEUE_H2D) == AKV_OK;
        uint64_t t = akv_clock_ns();
        ok &= akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, b->xh, n) == AKV_OK;
        t_submit += akv_clock_ns() - t;
        ok &= akv_dev_event_record(dev, b->h1, AKV_QUEUE_H2D) == AKV_OK;
    }
    if (what & DO_D2H) {
        ok &= akv_dev_event_record(dev, b->d0, AKV_QUEUE_D2H) == AKV_OK;
        uint64_t t = akv_clock_ns();
        ok &= akv_dev_copy_d2h_batch_async(dev, AKV_QUEUE_D2H, b->xd, n) == AKV_OK;
        t_submit += akv_clock_ns() - t;
        ok &= akv_dev_event_record(dev, b->d1, AKV_QUEUE_D2H) == AKV_OK;
    }
    ok &= akv_dev_sync(dev) == AKV_OK;
    if (!ok) return 0;
    memset(res, 0, sizeof *res);
    double t_copy = 0;
    if (what & DO_H2D) {
        double ms = elapsed_ms(b, b->h0, b->h1);
        res->h2d_gbs = TOTAL_BYTES / (ms * 1e6);
        t_copy = ms;
    }
    if (what & DO_D2H) {
        double ms = elapsed_ms(b, b->d0, b->d1);
        res->d2h_gbs = TOTAL_BYTES / (ms * 1e6);
        if (ms > t_copy) t_copy = ms;
    }
    res->submit_us = t_submit / 1e3 / (double)n / ((what & DO_H2D) && (what & DO_D2H) ? 2 : 1);
    if (what & DO_COMPUTE) {
        double with = elapsed_ms(b, b->c0, b->c1);
        double alone = compute_alone_ms(b, n_busy);
        res->compute_loss = with > alone ? (with - alone) / t_copy : 0;
        /* The copies must finish inside the compute window (they start after launch 1). */
        double c_end = elapsed_ms(b, b->go, b->c1);
        res->outlasted = (what & DO_H2D ? elapsed_ms(b, b->go, b->h1) > c_end : 0) ||
                         (what & DO_D2H ? elapsed_ms(b, b->go, b->d1) > c_end : 0);
    }
    return 1;
}

static int cmp_result(const void *a, const void *b) {
    double x = ((const result *)a)->h2d_gbs + ((const result *)a)->d2h_gbs;
    double y = ((const result *)b)->h2d_gbs + ((const result *)b)->d2h_gbs;
    return (x > y) - (x < y);
}

/* Warm-up plus N_RUNS; the median by total rate. Under compute the window grows until the
 * copies fit inside it. */
static int measure(bench *b, const akv_copy_config *cfg, size_t page, int layout, int what,
                   result *out) {
    result r[N_RUNS], warm;
    uint64_t n_busy = 0;
    if (what & DO_COMPUTE) {
        result alone;
        if (!run_once(b, cfg, page, layout, what & ~DO_COMPUTE, 0, 7, &alone)) return 0;
        double rate = alone.h2d_gbs > alone.d2h_gbs ? alone.h2d_gbs : alone.d2h_gbs;
        double ms = TOTAL_BYTES / (rate * 1e6);
        n_busy = (uint64_t)(3 * ms / b->busy_ms) + 3;
    }
    for (int attempt = 0; attempt < 4; attempt++) {
        if (!run_once(b, cfg, page, layout, what, n_busy, 11, &warm)) return 0;
        int outlasted = 0;
        for (int i = 0; i < N_RUNS; i++) {
            if (!run_once(b, cfg, page, layout, what, n_busy, 100 + (uint64_t)i, &r[i])) return 0;
            outlasted |= r[i].outlasted;
        }
        if (!outlasted) break;
        n_busy *= 2;
    }
    qsort(r, N_RUNS, sizeof r[0], cmp_result);
    *out = r[N_RUNS / 2];
    return 1;
}

static int method_ok(bench *b, const akv_copy_config *cfg) {
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    akv_copy_config saved = akv_dev_get_copy_config(b->dev);
    int ok = akv_dev_set_copy_config(b->dev, cfg) == AKV_OK;
    akv_dev_set_copy_config(b->dev, &saved);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    return ok;
}

typedef struct column {
    const char *label;
    akv_copy_config cfg;
    int layout;
} column;

static const size_t page_sizes[] = {64 << 10, 128 << 10, 256 << 10, 512 << 10,
                                    1 << 20,  2 << 20,   4 << 20};
#define N_SIZES (sizeof page_sizes / sizeof page_sizes[0])

static void size_label(size_t page, char *buf, size_t n) {
    if (page >= (1 << 20)) snprintf(buf, n, "%zu MiB", page >> 20);
    else snprintf(buf, n, "%zu KiB", page >> 10);
}

/* One LARGE_BYTES copy alone on queue q (H2D: the h2d arena to stage_h2d; D2H: stage_h2d to
 * the d2h arena), timed by events on q: GB/s. */
static double large_copy_gbs(bench *b, akv_queue q) {
    const bool h2d = q == AKV_QUEUE_H2D;
    akv_event *e0 = h2d ? b->h0 : b->d0, *e1 = h2d ? b->h1 : b->d1;
    akv_dev_event_record(b->dev, e0, q);
    if (h2d) akv_dev_copy_h2d_async(b->dev, q, b->stage_h2d, b->arena_h2d, LARGE_BYTES);
    else akv_dev_copy_d2h_async(b->dev, q, b->arena_d2h, b->stage_h2d, LARGE_BYTES);
    akv_dev_event_record(b->dev, e1, q);
    akv_dev_sync(b->dev);
    return LARGE_BYTES / (elapsed_ms(b, e0, e1) * 1e6);
}

/* Table of ratios: rows page sizes, one column per method. */
static void table_by_size(bench *b, const char *title, const column *cols, size_t n_cols, int what) {
    bench_emit(b->out, "\n### %s\n\n| page |", title);
    for (size_t c = 0; c < n_cols; c++)
        bench_emit(b->out, " %s |", cols[c].label);
    bench_emit(b->out, "\n|---|");
    for (size_t c = 0; c < n_cols; c++)
        bench_emit(b->out, "---|");
    bench_emit(b->out, "\n");
    for (size_t s = 0; s < N_SIZES; s++) {
        char lab[32];
        size_label(page_sizes[s], lab, sizeof lab);
        bench_emit(b->out, "| %s |", lab);
        for (size_t c = 0; c < n_cols; c++) {
            result r;
            if (!method_ok(b, &cols[c].cfg)) {
                bench_emit(b->out, " n/a |");
                continue;
            }
            if (!measure(b, &cols[c].cfg, page_sizes[s], cols[c].layout, what, &r)) {
                bench_emit(b->out, " error |");
                continue;
            }
            if (what == DO_H2D)
                bench_emit(b->out, " %.2f (%.1f us) |", r.h2d_gbs / b->large_h2d, r.submit_us);
            else if (what == (DO_H2D | DO_D2H))
                bench_emit(b->out, " %.2f + %.2f |", r.h2d_gbs / b->large_h2d,
                           r.d2h_gbs / b->large_h2d);
            else
                bench_emit(b->out, " %.2f (-%.0f%%)%s |", r.h2d_gbs / b->large_h2d,
                           100 * r.compute_loss, r.outlasted ? "*" : "");
            b->starred |= what & DO_COMPUTE ? r.outlasted : 0;
        }
        bench_emit(b->out, "\n");
        fflush(stdout);
    }
}

int main(void) {
    bench B = {0}, *b = &B;
    akv_dev_info info;
    b->dev = bench_cuda_or_skip(&info);
    b->out = bench_out_open();
    akv_dev *dev = b->dev;
    const akv_copy_method default_method = akv_dev_get_copy_config(dev).method;
    int ok = akv_dev_pinned_alloc(dev, ARENA_BYTES, (void **)&b->arena_h2d) == AKV_OK &&
             akv_dev_pinned_alloc(dev, ARENA_BYTES, (void **)&b->arena_d2h) == AKV_OK &&
             akv_dev_mem_alloc(dev, LARGE_BYTES, &b->stage_h2d) == AKV_OK &&
             akv_dev_mem_alloc(dev, TOTAL_BYTES, &b->stage_d2h) == AKV_OK &&
             akv_dev_mem_alloc(dev, 256, &b->sink) == AKV_OK;
    akv_event **evs[] = {&b->h0, &b->h1, &b->d0, &b->d1, &b->c0, &b->c1, &b->go};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0] && ok; i++)
        ok = akv_dev_event_create(dev, AKV_EVENT_TIMING, evs[i]) == AKV_OK;
    size_t max_pages = TOTAL_BYTES / (64 << 10);
    b->xh = calloc(max_pages, sizeof *b->xh);
    b->xd = calloc(max_pages, sizeof *b->xd);
    b->perm = calloc(ARENA_BYTES / (64 << 10), sizeof *b->perm);
    if (!ok || !b->xh || !b->xd || !b->perm) {
        fprintf(stderr, "bench_copy: set-up failed\n");
        return 1;
    }
    memset(b->arena_h2d, 0x3C, ARENA_BYTES);
    memset(b->arena_d2h, 0x5A, ARENA_BYTES);

    /* The reference: one large pinned copy each way alone, then 128 MiB each way at once;
     * best of 5. */
    double best_h2d = 0, best_d2h = 0, best_both = 0;
    for (int i = 0; i < 5; i++) {
        best_h2d = fmax(best_h2d, large_copy_gbs(b, AKV_QUEUE_H2D));
        best_d2h = fmax(best_d2h, large_copy_gbs(b, AKV_QUEUE_D2H));
        akv_dev_event_record(dev, b->h0, AKV_QUEUE_H2D);
        akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, b->stage_h2d, b->arena_h2d, TOTAL_BYTES);
        akv_dev_event_record(dev, b->h1, AKV_QUEUE_H2D);
        akv_dev_event_record(dev, b->d0, AKV_QUEUE_D2H);
        akv_dev_copy_d2h_async(dev, AKV_QUEUE_D2H, b->arena_d2h, b->stage_d2h, TOTAL_BYTES);
        akv_dev_event_record(dev, b->d1, AKV_QUEUE_D2H);
        akv_dev_sync(dev);
        double both = 2 * TOTAL_BYTES / (fmax(elapsed_ms(b, b->h0, b->h1), elapsed_ms(b, b->d0, b->d1)) * 1e6);
        if (both > best_both) best_both = both;
    }
    b->large_h2d = best_h2d;

    /* Calibrate the busy op to about 1 ms per launch. */
    b->busy_iters = 1 << 18;
    double ms = 0;
    for (int i = 0; i < 8; i++) {
        ms = compute_alone_ms(b, 1);
        if (ms > 0.5) break;
        b->busy_iters *= 2;
    }
    b->busy_iters = (uint64_t)(b->busy_iters / ms);
    b->busy_ms = compute_alone_ms(b, 4) / 4;

    bench_emit(b->out,
               "\n## Staging copy methods (bench_copy)\n\n"
               "%s, %d SMs. Reference: one %zu MiB pinned copy: host->device %.1f GB/s, "
               "device->host %.1f GB/s, both at once %.1f GB/s total. Every cell below is a ratio "
               "of the host->device reference. Busy op: %.2f ms per launch on every SM.\n",
               info.name, info.n_sm, LARGE_BYTES >> 20, best_h2d, best_d2h, best_both, b->busy_ms);

    const column cols[] = {
        {"each", {AKV_COPY_METHOD_EACH, 0, 0}, LAYOUT_SCATTERED},
        {"coalesce (adj)", {AKV_COPY_METHOD_COALESCE, 0, 0}, LAYOUT_ADJACENT},
        {"batch", {AKV_COPY_METHOD_BATCH, 0, 0}, LAYOUT_SCATTERED},
        {"batch+overlap", {AKV_COPY_METHOD_BATCH, 0, AKV_COPY_PREFER_OVERLAP}, LAYOUT_SCATTERED},
        {"kernel 16", {AKV_COPY_METHOD_KERNEL, 16, 0}, LAYOUT_SCATTERED},
        {"kernel 64", {AKV_COPY_METHOD_KERNEL, 64, 0}, LAYOUT_SCATTERED},
    };
    const size_t n_cols = sizeof cols / sizeof cols[0];
    table_by_size(b, "A. refill alone (ratio, submit time per page)", cols, n_cols, DO_H2D);

    bench_emit(b->out, "\n### B. copy kernel blocks at 256 KiB pages\n\n"
                       "| blocks | alone | under compute | compute lost |\n|---|---|---|---|\n");
    static const uint32_t blocks[] = {4, 8, 16, 32, 64, 132, 264};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        akv_copy_config cfg = {AKV_COPY_METHOD_KERNEL, blocks[i], 0};
        result alone, busy;
        if (!method_ok(b, &cfg) || !measure(b, &cfg, DEFAULT_PAGE, LAYOUT_SCATTERED, DO_H2D, &alone) ||
            !measure(b, &cfg, DEFAULT_PAGE, LAYOUT_SCATTERED, DO_H2D | DO_COMPUTE, &busy)) {
            bench_emit(b->out, "| %u | n/a | n/a | n/a |\n", blocks[i]);
            continue;
        }
        bench_emit(b->out, "| %u | %.2f | %.2f%s | %.0f%% |\n", blocks[i],
                   alone.h2d_gbs / b->large_h2d, busy.h2d_gbs / b->large_h2d,
                   busy.outlasted ? "*" : "", 100 * busy.compute_loss);
        b->starred |= busy.outlasted;
        fflush(stdout);
    }

    table_by_size(b, "C. refill + write-back at once (h2d ratio + d2h ratio)", cols, n_cols,
                  DO_H2D | DO_D2H);
    table_by_size(b, "D. refill under compute (ratio, compute lost while copying)", cols, n_cols,
                  DO_H2D | DO_COMPUTE);
    if (b->starred)
        bench_emit(b->out,
                   "\n(* = the copy outlasted the compute window even after widening it 8x.)\n");
    bench_emit(b->out, "\nDefault method of this build: %s.\n",
               akv_copy_method_name(default_method));

    if (b->out) fclose(b->out);
    free(b->xh);
    free(b->xd);
    free(b->perm);
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) akv_dev_event_destroy(dev, *evs[i]);
    akv_dev_mem_free(dev, b->stage_h2d);
    akv_dev_mem_free(dev, b->stage_d2h);
    akv_dev_mem_free(dev, b->sink);
    akv_dev_pinned_free(dev, b->arena_h2d);
    akv_dev_pinned_free(dev, b->arena_d2h);
    return akv_dev_destroy(dev) == AKV_OK ? 0 : 1;
}
