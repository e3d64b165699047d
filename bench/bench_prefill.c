/* bench_prefill.c (bench) — prefill (time to first token) of the synthetic Llama-3-8B shape
 * (bf16, generated on the device) through akv_forward_dev on the resident and the staged
 * route, as model FLOP/s over the rate of a large bf16 product measured in the same run.
 *
 * Per prompt length N (1K, 8K, 32K; 128K with AKV_BENCH_LONG=1) and chunk size C
 * (AKV_BENCH_CHUNKS, a comma-separated list; default 256,2048,8192): N random tokens in chunks
 * of C, each chunk one begin_step and one pass, logits for the last token only; time from the
 * first begin_step to the logits on the host.
 *   model FLOPs   2 x the matrix parameters per token x N (Q|K|V, O, gate|up, down of every
 *                 layer), + causal attention 4 x n_heads x head_dim x N (N + 1) / 2 per layer,
 *                 + the output head for one row;
 *   peak          the FLOP/s of one 8192 x 8192 x 8192 product (bf16 in, f32 out, cuBLAS: the
 *                 pass's own product call), best of 3 x 10 launches;
 *   ratio         model FLOP/s / peak (the goal: 0.5 at 8K and 32K).
 * Resident: a device pool that holds the whole history. Staged: a 4 GiB pool, the history
 * staged through the window (akv_route_staging_pages for the chunk), every chunk reading all
 * earlier history across the bus; staged / resident is the other goal (<= 1.1).
 *
 * AKV_BENCH_PROFILE=1 adds, for 8K and 32K at the first and the last chunk size, one more
 * resident prefill under the device's op profile (akv_dev_profile_start): device time per op
 * and product shape, the time the compute queue spent outside ops (copies, waits, idle), and
 * the host's share (wall time not covered by the device span). Profiled runs lose the
 * programmatic-launch overlap; their wall time is not the table's.
 * AKV_BENCH_LAYERS=N runs the first N layers. Markdown goes to $AKV_BENCH_OUT when set. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/forward_dev.h"
#include "akv/forward_ops.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "core/clock.h"
#include "akv/dev_cuda.h"
#include "llama3_shape.h"

#define AKV_BENCH_NAME "bench_prefill"
#include "bench_try.h"
#include "bench_route.h"

enum { STAGED_GIB = 4, MAX_CHUNKS = 8, PROFILE_ROWS = 14 };

typedef struct run {
    int ok;           /* the route was created and the last logits are finite */
    double wall_s;    /* first begin_step to logits on the host */
    double begin_s;   /* of it, in akv_route_begin_step (waits for the previous chunk) */
    double staged_gb; /* staged route: bytes staged over the prefill */
} run;

/* The FLOP/s of one large product through the pass's product op (bf16 x bf16 -> f32). */
static double peak_flops(akv_dev *dev) {
    const uint32_t n = 8192;
    akv_dptr w, x, y, ws;
    TRY(akv_dev_mem_alloc(dev, (size_t)n * n * 2, &w));
    TRY(akv_dev_mem_alloc(dev, (size_t)n * n * 2, &x));
    TRY(akv_dev_mem_alloc(dev, (size_t)n * n * 4, &y));
    TRY(akv_dev_mem_alloc(dev, 32u << 20, &ws));
    TRY(akv_dev_memset_sync(dev, w, 0x3c, (size_t)n * n * 2));
    TRY(akv_dev_memset_sync(dev, x, 0x3c, (size_t)n * n * 2));
    akv_fwd_matmul_args a = {.y = y,
                             .x = x,
                             .w = w,
                             .m = n,
                             .n = n,
                             .k = n,
                             .workspace = ws,
                             .workspace_bytes = 32u << 20,
                             .algo = AKV_FWD_MATMUL_CUBLAS};
    akv_event *e0, *e1;
    TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &e0));
    TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &e1));
    double best = INFINITY;
    for (int rep = 0; rep < 4; rep++) { /* the first warms up */
        TRY(akv_dev_event_record(dev, e0, AKV_QUEUE_COMPUTE));
        for (int l = 0; l < 10; l++)
            TRY(akv_dev_op_launch(dev, &akv_fwd_op_matmul, &a, sizeof a));
        TRY(akv_dev_event_record(dev, e1, AKV_QUEUE_COMPUTE));
        TRY(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        uint64_t ns = 0;
        TRY(akv_dev_event_elapsed_ns(dev, e0, e1, &ns));
        if (rep && ns / 10.0 < best) best = ns / 10.0;
    }
    TRY(akv_dev_event_destroy(dev, e0));
    TRY(akv_dev_event_destroy(dev, e1));
    TRY(akv_dev_mem_free(dev, w));
    TRY(akv_dev_mem_free(dev, x));
    TRY(akv_dev_mem_free(dev, y));
    TRY(akv_dev_mem_free(dev, ws));
    return 2.0 * n * n * (double)n / (best * 1e-9);
}

static double model_flops(const akv_model_config *c, uint64_t n) {
    const double e = c->n_embd, q = (double)c->n_heads * c->head_dim,
                 kv = (double)c->n_kv_heads * c->head_dim, ff = c->n_ff;
    const double per_token = 2.0 * c->n_layers * (e * (q + 2 * kv) + q * e + e * 2 * ff + ff * e);
    const double attn = 4.0 * c->n_layers * q * (double)n * ((double)n + 1) / 2;
    return per_token * (double)n + attn + 2.0 * e * c->n_vocab;
}

static FILE *out_md; /* $AKV_BENCH_OUT */

/* One prefill of n tokens in chunks of `chunk` on a fresh route of this kind. */
static run prefill(akv_dev *dev, akv_forward_dev *f, akv_route_kind kind, uint32_t n,
                   uint32_t chunk, const char *profile) {
    const akv_model_config *c = akv_forward_dev_config(f);
    run out = {0};
    akv_geom g;
    TRY(akv_geom_init(&g, c->n_layers, c->n_kv_heads, c->head_dim, AKV_DTYPE_BF16, 0));
    uint32_t window = AKV_ROUTE_WINDOW_PAGES;
    if (kind == bench_kind("staged")) {
        /* the window holds the sink, a chunk's pages and the page before them */
        window = (uint32_t)akv_geom_pages_for_tokens(&g, chunk) + 2;
        if (window < AKV_ROUTE_WINDOW_PAGES) window = AKV_ROUTE_WINDOW_PAGES;
    }
    bench_route br;
    if (bench_route_open(dev, &g, kind, n, kind == bench_kind("staged") ? STAGED_GIB : 0, window, 0.0f, &br))
        goto done;
    akv_route *r = br.r;
    akv_route_seq *seq = br.seq;
    int32_t *tok = malloc((size_t)chunk * sizeof *tok);
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    uint64_t rs = 12345;
    for (uint32_t i = 0; i < chunk; i++)
        tok[i] = (int32_t)(((rs = rs * 6364136223846793005ull + 1) >> 33) % c->n_vocab);
    akv_kv_hooks kv = akv_route_hooks(r);
    akv_route_stats s0, s1;
    akv_route_get_stats(r, &s0);
    if (profile) TRY(akv_dev_profile_start(dev, (size_t)(n / chunk + 1) * c->n_layers * 24 + 64));
    double t0 = akv_clock_s();
    for (uint32_t pos = 0; pos < n;) {
        uint32_t m = n - pos < chunk ? n - pos : chunk;
        double tb = akv_clock_s();
        TRY(akv_route_begin_step(r, &(akv_route_req){seq, pos + m}, 1));
        out.begin_s += akv_clock_s() - tb;
        TRY(akv_forward_dev_run(f, tok, m, pos, &kv, pos + m == n ? logits : NULL, false));
        pos += m;
    }
    out.wall_s = akv_clock_s() - t0;
    if (profile) bench_print_profile(dev, out_md, profile, out.wall_s, PROFILE_ROWS);
    akv_route_get_stats(r, &s1);
    out.staged_gb = (double)(s1.staged_bytes - s0.staged_bytes) / 1e9;
    int finite = 1;
    for (uint32_t i = 0; i < c->n_vocab; i++)
        finite &= isfinite(logits[i]) != 0;
    if (!finite) fprintf(stderr, "bench_prefill: non-finite logits at %u tokens\n", n);
    out.ok = finite;
    free(tok), free(logits);
    TRY(akv_route_sync(r));
done:
    bench_route_close(&br);
    return out;
}

int main(void) {
    akv_dev_info info;
    akv_dev *dev = bench_cuda_or_skip(&info);
    out_md = bench_out_open();
    uint32_t chunks[MAX_CHUNKS], n_chunks = 0, max_step_tokens = 0;
    const char *cl = getenv("AKV_BENCH_CHUNKS");
    for (const char *p = cl ? cl : "256,2048,8192"; *p && n_chunks < MAX_CHUNKS;) {
        char *end = NULL;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v < 1 || v > 32768) {
            fprintf(stderr,
                    "bench_prefill: AKV_BENCH_CHUNKS '%s': expected chunk sizes 1..32768 "
                    "separated by commas\n",
                    cl);
            return 2;
        }
        chunks[n_chunks++] = (uint32_t)v;
        if (v > max_step_tokens) max_step_tokens = (uint32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_BENCH_LAYERS", 1, 32, 32));
    akv_forward_params fp = {.max_step_tokens = max_step_tokens, .attn = bench_attn_tuning()};
    akv_forward_dev *f = NULL;
    TRY(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &f));
    const double peak = peak_flops(dev);
    /* what a host pool that grows during the prefill would pay per arena */
    double pin_s = akv_clock_s();
    void *arena = NULL;
    TRY(akv_dev_pinned_alloc(dev, (size_t)256 << 20, &arena));
    pin_s = akv_clock_s() - pin_s;
    TRY(akv_dev_pinned_free(dev, arena));
    bench_emit(
        out_md,
        "\n## bench_prefill: %u layers, %s\n\nbf16 product rate (8192 x 8192 x 8192, the "
        "pass's cuBLAS call) in this run: **%.1f TFLOP/s**. Ratio = model FLOP/s / that "
        "rate. begin s = time in akv_route_begin_step (it waits for the chunk before). Pinning one "
        "256 MiB host arena took %.1f ms (the host pools are pinned before the clock starts)."
        "\n\n"
        "| tokens | chunk | resident s | tokens/s | TFLOP/s | ratio | begin s | staged s | "
        "staged / resident | staged GB |\n|---|---|---|---|---|---|---|---|---|---|\n",
        c.n_layers, info.name, peak / 1e12, pin_s * 1e3);
    const uint32_t lens[4] = {1024, 8192, 32768, 131072};
    const int n_lens = getenv("AKV_BENCH_LONG") ? 4 : 3;
    for (int i = 0; i < n_lens; i++) {
        for (uint32_t j = 0; j < n_chunks; j++) {
            const uint32_t n = lens[i], ch = chunks[j];
            run res = prefill(dev, f, bench_kind("resident"), n, ch, NULL);
            run stg = prefill(dev, f, bench_kind("staged"), n, ch, NULL);
            const double fl = model_flops(&c, n) / res.wall_s;
            bench_emit(out_md,
                       "| %u | %u | %.3f | %.0f | %.1f | %.3f | %.3f | %s%.3f | %.2f | %.1f |\n", n,
                       ch, res.wall_s, n / res.wall_s, fl / 1e12, fl / peak, res.begin_s,
                       stg.ok ? "" : "FAILED ", stg.wall_s, stg.wall_s / res.wall_s, stg.staged_gb);
            fflush(stdout);
        }
    }
    if (getenv("AKV_BENCH_PROFILE")) {
        const uint32_t plens[2] = {8192, 32768}, pch[2] = {chunks[0], chunks[n_chunks - 1]};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < (n_chunks > 1 ? 2 : 1); j++) {
                char what[96];
                snprintf(what, sizeof what,
                         "Profile of a resident prefill of %u tokens in chunks "
                         "of %u",
                         plens[i], pch[j]);
                prefill(dev, f, bench_kind("resident"), plens[i], pch[j], what);
            }
    }
    if (out_md) fclose(out_md);
    akv_forward_dev_destroy(f);
    TRY(akv_dev_destroy(dev));
    return 0;
}
