/* cmd_calibrate.c — akv calibrate: the economic gate's transfer model measured on this machine
 * (akv/gate.h): the bus's large-copy rate, the device-copy rate, and how fast the decode reads
 * each representation's pages, written to a file that `--kv-tier auto --calibration FILE`
 * reads. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/forward_ops.h"
#include "akv/gate.h"
#include "akv/log.h"
#include "cmd.h"
#include "core/clock.h"

static const char cal_usage[] =
    "usage: akv calibrate [--device D] [-o FILE]\n"
    "\n"
    "Measures what the economic gate (--kv-tier auto) weighs, on this machine:\n"
    "  bus_bps         host to device, large copies from pinned memory (the best of 5)\n"
    "  bus_page_Nk     one batch of scattered pages of N KiB (16 to 1024), the stage's way of\n"
    "                  copying, as a fraction of bus_bps\n"
    "  copy_bps        device to device, bytes read + written (the best of 5)\n"
    "  read_FORM_bB    the decode's read rate of exact, q8 and q4 pages at a batch of B\n"
    "                  sequences (1 to 32), a fraction of copy_bps (Llama-3-8B attention: 32\n"
    "                  query heads, 8 K/V heads of 128, pages of 64 tokens, 32768 keys a\n"
    "                  sequence; 1024 on the CPU)\n"
    "  bus_shared      the bus's rate for 256 KiB pages while the decode reads (batch 8),\n"
    "                  a fraction of its rate alone\n"
    "  read_shared     the decode's read rate while the bus copies, a fraction of it alone\n"
    "and writes them to FILE (default akv-rates.txt), one `key value` a line. On the CPU it\n"
    "measures the host backend's reference decode, not the host pass's attention, and its\n"
    "queues run one after another (nothing shared): the gate's rates are a GPU's.\n"
    "\n"
    "options:\n"
    "      --device D   cpu, cuda, cuda:N or auto (default: the GPU when one answers)\n"
    "  -o, --output F   where the rates go\n"
    "  -h, --help       this text\n";

/* Seconds of the best of n runs of `what` (each ended by a device sync). */
typedef akv_status (*cal_fn)(akv_dev *dev, void *ctx);
static akv_status cal_best(akv_dev *dev, cal_fn fn, void *ctx, int n, double *best) {
    *best = INFINITY;
    for (int i = 0; i < n; i++) {
        const double t0 = akv_clock_s();
        akv_status st = fn(dev, ctx);
        if (!st) st = akv_dev_sync(dev);
        if (st) return st;
        const double t = akv_clock_s() - t0;
        if (t < *best) *best = t;
    }
    return AKV_OK;
}

typedef struct cal_copy {
    akv_dptr a, b;
    void *h;
    size_t n;
} cal_copy;

static akv_status cal_h2d(akv_dev *dev, void *ctx) {
    cal_copy *c = ctx;
    return akv_dev_copy_h2d_async(dev, AKV_QUEUE_H2D, c->a, c->h, c->n);
}
static akv_status cal_d2d(akv_dev *dev, void *ctx) {
    cal_copy *c = ctx;
    return akv_dev_copy_d2d_async(dev, AKV_QUEUE_COMPUTE, c->b, c->a, c->n);
}

/* A decode of b sequences of n keys over pages of one form, its buffers its own. */
typedef struct cal_decode {
    akv_fwd_attn_decode_args a;
    akv_dptr pool, tabs, q, o, ws;
    size_t pool_bytes;
    int calls; /* launches a run */
} cal_decode;

static akv_status cal_decode_run(akv_dev *dev, void *ctx) {
    cal_decode *d = ctx;
    for (int i = 0; i < d->calls; i++) {
        akv_status st = akv_dev_op_launch(dev, &akv_fwd_op_attn_decode, &d->a, sizeof d->a);
        if (st) return st;
    }
    return AKV_OK;
}

static void cal_decode_close(akv_dev *dev, cal_decode *d) {
    akv_dev_mem_free(dev, d->pool), akv_dev_mem_free(dev, d->tabs), akv_dev_mem_free(dev, d->q);
    akv_dev_mem_free(dev, d->o), akv_dev_mem_free(dev, d->ws);
    memset(d, 0, sizeof *d);
}

static akv_status cal_decode_open(akv_dev *dev, const akv_dev_info *info, akv_repr r, uint32_t b,
                                  uint32_t n, int calls, cal_decode *d) {
    memset(d, 0, sizeof *d);
    d->calls = calls;
    const uint32_t hq = 32, hkv = 8, hd = 128, P = 64, np = n / P;
    akv_repr_layout l;
    akv_status st = akv_repr_layout_of(r, AKV_DTYPE_BF16, hkv, P, hd, &l);
    if (st) return st;
    d->pool_bytes = (size_t)b * np * l.page_bytes;
    const size_t q_bytes = (size_t)b * hq * hd * 4, n_tab = (size_t)b * np + 2 * b + 1;
    int32_t *tab = malloc(n_tab * sizeof *tab);
    uint8_t *fill = malloc(1 << 20);
    if (!tab || !fill) {
        free(tab), free(fill);
        return AKV_ENOMEM;
    }
    for (uint32_t i = 0; i <= b; i++) tab[i] = (int32_t)(i * np);
    for (size_t i = 0; i < (size_t)b * np; i++) tab[b + 1 + i] = (int32_t)i;
    for (uint32_t i = 0; i < b; i++) tab[b + 1 + (size_t)b * np + i] = (int32_t)P;
    /* finite values everywhere: bf16 0x3c00.. and f16 scales of 2^-10 for compact pages */
    for (size_t i = 0; i < (1 << 20); i++) fill[i] = (uint8_t)(i & 1 ? 0x3c : 0x11 + i % 7);
    if (!(st = akv_dev_mem_alloc(dev, d->pool_bytes, &d->pool)) &&
        !(st = akv_dev_mem_alloc(dev, n_tab * 4, &d->tabs)) &&
        !(st = akv_dev_mem_alloc(dev, q_bytes, &d->q)) && !(st = akv_dev_mem_alloc(dev, q_bytes, &d->o)))
        st = akv_dev_copy_h2d_sync(dev, d->tabs, tab, n_tab * 4);
    for (size_t at = 0; !st && at < d->pool_bytes; at += 1 << 20)
        st = akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d->pool, at), fill,
                                   d->pool_bytes - at < (1u << 20) ? d->pool_bytes - at : 1u << 20);
    if (!st) st = akv_dev_memset_sync(dev, d->q, 0x3c, q_bytes);
    free(tab), free(fill);
    d->a.p = (akv_attn_decode){
        .kv = {.pool = d->pool, .indptr = d->tabs, .indices = akv_dptr_offset(d->tabs, (b + 1) * 4),
               .last_page_len = akv_dptr_offset(d->tabs, ((size_t)b + 1 + (size_t)b * np) * 4),
               .n_seq = b, .n_pages = b * np, .max_pages = np, .n_kv_heads = hkv, .head_dim = hd,
               .page_tokens = P, .dtype = AKV_DTYPE_BF16, .repr = (uint32_t)r},
        .n_heads = hq, .n_query = 1, .q = d->q, .q_dtype = AKV_DTYPE_F32, .o = d->o,
        .o_dtype = AKV_DTYPE_F32};
    akv_attn_split sp;
    size_t need = 0;
    if (!st && !info->is_host &&
        !(st = akv_attn_split_plan((uint64_t)np * P, b, hkv, hd, (uint32_t)info->n_sm,
                                   info->smem_per_block_bytes, NULL, &sp)) &&
        !(st = akv_attn_decode_workspace_bytes(&d->a.p, &sp, &need)) && need &&
        !(st = akv_dev_mem_alloc(dev, need, &d->ws)))
        st = akv_dev_memset_sync(dev, d->ws, 0, need);
    d->a.workspace = d->ws, d->a.workspace_bytes = need;
    if (!st) st = cal_decode_run(dev, d); /* warm */
    if (!st) st = akv_dev_sync(dev);
    if (st) cal_decode_close(dev, d);
    return st;
}

/* Bytes a second the decode reads from pages of representation r: b sequences of n keys. */
static akv_status cal_read_rate(akv_dev *dev, const akv_dev_info *info, akv_repr r, uint32_t b,
                                uint32_t n, int calls, double *out) {
    cal_decode d;
    akv_status st = cal_decode_open(dev, info, r, b, n, calls, &d);
    double t = 0;
    if (!st && !(st = cal_best(dev, cal_decode_run, &d, 3, &t)))
        *out = (double)d.pool_bytes * calls / t;
    cal_decode_close(dev, &d);
    return st;
}

/* One batch of scattered pages across the bus, the stage's way: page i of the host buffer's
 * every other page to a device page in a stride-permuted order (no two adjacent: nothing
 * merges). */
typedef struct cal_pages {
    akv_dev_xfer *x;
    size_t n;
    int reps; /* batches a run */
} cal_pages;

static akv_status cal_pages_run(akv_dev *dev, void *ctx) {
    cal_pages *p = ctx;
    for (int i = 0; i < p->reps; i++) {
        akv_status st = akv_dev_copy_h2d_batch_async(dev, AKV_QUEUE_H2D, p->x, p->n);
        if (st) return st;
    }
    return AKV_OK;
}

/* n pages of page bytes from host (2 n pages) to dst (2 n pages): x[n] written. */
static void cal_pages_fill(akv_dev_xfer *x, size_t n, size_t page, void *host, akv_dptr dst) {
    for (size_t i = 0; i < n; i++) {
        const size_t to = (i * 7 + 3) % n; /* 7 is prime to n (a power of two) */
        x[i] = (akv_dev_xfer){akv_dptr_offset(dst, 2 * to * page), (uint8_t *)host + 2 * i * page,
                              page};
    }
}

/* Device seconds of fn(ctx) on queue q, bracketed by timing events there (the best of n). */
static akv_status cal_timed(akv_dev *dev, akv_queue q, cal_fn fn, void *ctx, cal_fn beside,
                            void *bctx, int n, double *best) {
    akv_event *e0 = NULL, *e1 = NULL;
    akv_status st = akv_dev_event_create(dev, AKV_EVENT_TIMING, &e0);
    if (!st) st = akv_dev_event_create(dev, AKV_EVENT_TIMING, &e1);
    *best = INFINITY;
    for (int i = 0; !st && i < n; i++) {
        if (beside && (st = beside(dev, bctx))) break; /* the other load, first, on its queue */
        uint64_t ns = 0;
        if (!(st = akv_dev_event_record(dev, e0, q)) && !(st = fn(dev, ctx)) &&
            !(st = akv_dev_event_record(dev, e1, q)) && !(st = akv_dev_sync(dev)) &&
            !(st = akv_dev_event_elapsed_ns(dev, e0, e1, &ns)) && ns * 1e-9 < *best)
            *best = ns * 1e-9;
    }
    if (e0) akv_dev_event_destroy(dev, e0);
    if (e1) akv_dev_event_destroy(dev, e1);
    return st;
}

/* The bus by page size, then the two shared fractions: 256 KiB pages against the exact decode
 * at batch 8, each run beside enough of the other to cover it. */
static akv_status cal_bus(akv_dev *dev, const akv_dev_info *info, akv_gate_rates *r) {
    const size_t span = info->is_host ? (size_t)16 << 20 : (size_t)64 << 20; /* bytes a batch */
    void *host = NULL;
    akv_dptr dst = {0};
    akv_dev_xfer *x = malloc((2 * span / 16384) * sizeof *x);
    akv_status st = x ? AKV_OK : AKV_ENOMEM;
    if (!st) st = akv_dev_pinned_alloc(dev, 2 * span, &host);
    if (!st) st = akv_dev_mem_alloc(dev, 2 * span, &dst);
    if (!st) memset(host, 1, 2 * span);
    cal_pages p = {.x = x, .reps = 1};
    for (int i = 0; !st && i < AKV_GATE_PAGE_SIZES; i++) {
        const size_t page = (size_t)16384 << i;
        p.n = span / page;
        cal_pages_fill(x, p.n, page, host, dst);
        double t = 0;
        if (!(st = cal_pages_run(dev, &p)) && !(st = akv_dev_sync(dev)) &&
            !(st = cal_timed(dev, AKV_QUEUE_H2D, cal_pages_run, &p, NULL, NULL, 5, &t))) {
            r->bus_page[i] = (double)span / t / r->bus_bps;
            fprintf(stderr, "  bus, one batch of %zu pages of %zu KiB: %.1f GB/s, %.3f of the "
                            "large-copy rate\n", p.n, page >> 10, span / t / 1e9, r->bus_page[i]);
        }
    }
    cal_decode d;
    bool d_open = false;
    if (!st) st = cal_decode_open(dev, info, AKV_REPR_EXACT, 8, info->is_host ? 2048 : 32768, 1, &d);
    d_open = st == AKV_OK;
    double tb = 0, td = 0, tb2 = 0, td2 = 0;
    if (!st) {
        p.n = span / (256u << 10);
        cal_pages_fill(x, p.n, 256u << 10, host, dst);
        st = cal_timed(dev, AKV_QUEUE_H2D, cal_pages_run, &p, NULL, NULL, 3, &tb);
    }
    if (!st) st = cal_timed(dev, AKV_QUEUE_COMPUTE, cal_decode_run, &d, NULL, NULL, 3, &td);
    if (!st) {
        /* the bus beside three times its length of decoding (launched first) */
        const int calls = d.calls;
        d.calls = (int)ceil(3 * tb / td) + 1;
        st = cal_timed(dev, AKV_QUEUE_H2D, cal_pages_run, &p, cal_decode_run, &d, 3, &tb2);
        d.calls = calls;
    }
    if (!st) {
        /* the decode beside three times its length of copies (submitted first) */
        const int reps = p.reps;
        cal_pages beside = p;
        beside.reps = (int)ceil(3 * td / tb) + 1;
        st = cal_timed(dev, AKV_QUEUE_COMPUTE, cal_decode_run, &d, cal_pages_run, &beside, 3, &td2);
        p.reps = reps;
    }
    if (!st) {
        r->bus_shared = tb / tb2, r->read_shared = td / td2;
        fprintf(stderr, "  shared: the bus keeps %.3f of its rate beside the decode, the decode "
                        "%.3f of its rate beside the bus\n", r->bus_shared, r->read_shared);
    }
    if (d_open) cal_decode_close(dev, &d);
    if (host) akv_dev_pinned_free(dev, host);
    akv_dev_mem_free(dev, dst);
    free(x);
    return st;
}

int akv_cmd_calibrate(int argc, char **argv) {
    const char *device = "auto", *path = "akv-rates.txt";
    static const struct option opts[] = {{"device", required_argument, NULL, 'd'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': device = optarg; break;
        case 'o': path = optarg; break;
        case 'h': fputs(cal_usage, stdout); return AKV_EXIT_OK;
        default: fputs(cal_usage, stderr); return AKV_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "akv calibrate: unexpected argument '%s'\n%s", argv[optind], cal_usage);
        return AKV_EXIT_USAGE;
    }
    akv_dev *dev = NULL;
    if (akv_tool_open_device(device, &dev) != AKV_OK) return AKV_EXIT_FAIL;
    akv_dev_info info;
    akv_status st = akv_dev_get_info(dev, &info);
    const size_t n_bus = (size_t)256 << 20, n_copy = info.is_host ? (size_t)256 << 20 : (size_t)1 << 30;
    cal_copy cc = {.n = n_copy};
    akv_gate_rates r;
    memset(&r, 0, sizeof r);
    double t = 0;
    fprintf(stderr, "akv calibrate: on %s (%s)\n", info.is_host ? "the CPU" : "the GPU", info.name);
    if (!st && !(st = akv_dev_pinned_alloc(dev, n_bus, &cc.h)) && !(st = akv_dev_mem_alloc(dev, n_copy, &cc.a)) &&
        !(st = akv_dev_mem_alloc(dev, n_copy, &cc.b))) {
        memset(cc.h, 1, n_bus);
        cc.n = n_bus;
        if (!(st = cal_best(dev, cal_h2d, &cc, 5, &t))) r.bus_bps = (double)n_bus / t;
        cc.n = n_copy;
        if (!st && !(st = akv_dev_memset_sync(dev, cc.a, 1, n_copy)) && !(st = cal_best(dev, cal_d2d, &cc, 5, &t)))
            r.copy_bps = 2.0 * (double)n_copy / t;
    }
    if (cc.h) akv_dev_pinned_free(dev, cc.h);
    akv_dev_mem_free(dev, cc.a), akv_dev_mem_free(dev, cc.b);
    if (!st) fprintf(stderr, "  bus %.1f GB/s, device copy %.1f GB/s\n", r.bus_bps / 1e9, r.copy_bps / 1e9);
    if (!st) st = cal_bus(dev, &info, &r);
    const uint32_t n = info.is_host ? 1024 : 32768;
    for (int k = 0; !st && k < AKV_REPR_COUNT; k++)
        for (int i = 0; !st && i < AKV_GATE_BATCHES; i++) {
            double bps = 0;
            const uint32_t b = 1u << i;
            /* a few GB of reads a measurement on a GPU */
            const int calls = info.is_host ? 1 : (int)(64 / b) + 4;
            if (!(st = cal_read_rate(dev, &info, (akv_repr)k, b, n, calls, &bps))) {
                r.read_frac[k][i] = bps / r.copy_bps;
                fprintf(stderr, "  decode over %s pages (%u x %u keys): %.1f GB/s, %.3f of the copy rate\n",
                        akv_repr_name((akv_repr)k), b, n, bps / 1e9, r.read_frac[k][i]);
            }
        }
    if (!st) st = akv_gate_rates_save(path, &r);
    akv_status dst = akv_dev_destroy(dev);
    if (st || dst) {
        fprintf(stderr, "akv calibrate: %s\n", akv_status_str(st ? st : dst));
        return AKV_EXIT_FAIL;
    }
    fprintf(stderr, "akv calibrate: wrote %s\n", path);
    return AKV_EXIT_OK;
}
