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
    "  bus_bps     host to device, large copies from pinned memory (the best of 5)\n"
    "  copy_bps    device to device, bytes read + written (the best of 5)\n"
    "  read_FORM   the decode's read rate of exact, q8 and q4 pages as a fraction of copy_bps\n"
    "              (Llama-3-8B attention: 32 query heads, 8 K/V heads of 128, pages of 64\n"
    "              tokens; 8 sequences of 32768 keys on a GPU, 1 of 8192 on the CPU)\n"
    "and writes them to FILE (default akv-rates.txt), one `key value` a line. On the CPU it\n"
    "measures the host backend's reference decode, not the host pass's attention: the gate's\n"
    "rates are a GPU's.\n"
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

typedef struct cal_decode {
    akv_fwd_attn_decode_args a;
    int calls;
} cal_decode;

static akv_status cal_decode_run(akv_dev *dev, void *ctx) {
    cal_decode *d = ctx;
    for (int i = 0; i < d->calls; i++) {
        akv_status st = akv_dev_op_launch(dev, &akv_fwd_op_attn_decode, &d->a, sizeof d->a);
        if (st) return st;
    }
    return AKV_OK;
}

/* Bytes a second the decode reads from pages of representation r: b sequences of n keys. */
static akv_status cal_read_rate(akv_dev *dev, const akv_dev_info *info, akv_repr r, uint32_t b,
                                uint32_t n, int calls, double *out) {
    const uint32_t hq = 32, hkv = 8, d = 128, P = 64, np = n / P;
    akv_repr_layout l;
    akv_status st = akv_repr_layout_of(r, AKV_DTYPE_BF16, hkv, P, d, &l);
    if (st) return st;
    const size_t pool_bytes = (size_t)b * np * l.page_bytes, q_bytes = (size_t)b * hq * d * 4;
    int32_t *tab = malloc(((size_t)b * np + 2 * b + 1) * sizeof *tab);
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
    akv_dptr pool = {0}, tabs = {0}, q = {0}, o = {0}, ws = {0};
    if (!(st = akv_dev_mem_alloc(dev, pool_bytes, &pool)) &&
        !(st = akv_dev_mem_alloc(dev, ((size_t)b * np + 2 * b + 1) * 4, &tabs)) &&
        !(st = akv_dev_mem_alloc(dev, q_bytes, &q)) && !(st = akv_dev_mem_alloc(dev, q_bytes, &o)))
        st = akv_dev_copy_h2d_sync(dev, tabs, tab, ((size_t)b * np + 2 * b + 1) * 4);
    for (size_t at = 0; !st && at < pool_bytes; at += 1 << 20)
        st = akv_dev_copy_h2d_sync(dev, akv_dptr_offset(pool, at), fill,
                                   pool_bytes - at < (1u << 20) ? pool_bytes - at : 1u << 20);
    if (!st) st = akv_dev_memset_sync(dev, q, 0x3c, q_bytes);
    cal_decode cd = {.calls = calls};
    cd.a.p = (akv_attn_decode){
        .kv = {.pool = pool, .indptr = tabs, .indices = akv_dptr_offset(tabs, (b + 1) * 4),
               .last_page_len = akv_dptr_offset(tabs, ((size_t)b + 1 + (size_t)b * np) * 4), .n_seq = b,
               .n_pages = b * np, .max_pages = np, .n_kv_heads = hkv, .head_dim = d, .page_tokens = P,
               .dtype = AKV_DTYPE_BF16, .repr = (uint32_t)r},
        .n_heads = hq, .n_query = 1, .q = q, .q_dtype = AKV_DTYPE_F32, .o = o, .o_dtype = AKV_DTYPE_F32};
    akv_attn_split sp;
    size_t need = 0;
    if (!st && !info->is_host &&
        !(st = akv_attn_split_plan((uint64_t)np * P, b, hkv, d, (uint32_t)info->n_sm, info->smem_per_block_bytes,
                                   NULL, &sp)) &&
        !(st = akv_attn_decode_workspace_bytes(&cd.a.p, &sp, &need)) && need &&
        !(st = akv_dev_mem_alloc(dev, need, &ws)))
        st = akv_dev_memset_sync(dev, ws, 0, need);
    cd.a.workspace = ws, cd.a.workspace_bytes = need;
    double t = 0;
    if (!st) st = cal_decode_run(dev, &cd); /* warm */
    if (!st) st = akv_dev_sync(dev);
    if (!st) st = cal_best(dev, cal_decode_run, &cd, 3, &t);
    if (!st) *out = (double)pool_bytes * calls / t;
    akv_dev_mem_free(dev, pool), akv_dev_mem_free(dev, tabs), akv_dev_mem_free(dev, q);
    akv_dev_mem_free(dev, o), akv_dev_mem_free(dev, ws);
    free(tab), free(fill);
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
    const uint32_t b = info.is_host ? 1 : 8, n = info.is_host ? 8192 : 32768;
    for (int k = 0; !st && k < AKV_REPR_COUNT; k++) {
        double bps = 0;
        if (!(st = cal_read_rate(dev, &info, (akv_repr)k, b, n, info.is_host ? 2 : 20, &bps))) {
            r.read_frac[k] = bps / r.copy_bps;
            fprintf(stderr, "  decode over %s pages (%u x %u keys): %.1f GB/s, %.3f of the copy rate\n",
                    akv_repr_name((akv_repr)k), b, n, bps / 1e9, r.read_frac[k]);
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
