/* bench_engine.c (bench) — the engine's batch step on the synthetic Llama-3-8B shape (bf16,
 * generated on the device), in three parts.
 *
 * A. Resident batches: B sequences of C tokens of history decoding together (B = 1, 8, 32, 64
 *    at C = 128; 1, 4, 8, 16, 32, 64 at C = 4K; 1, 4, 8, 16 at 32K). One step = akv_route_begin_step over the batch + one
 *    akv_forward_dev_step with every sequence's logits back on the host (the engine's step
 *    without its sampling, which runs on the host between steps). Aggregate decode tokens/s,
 *    and step time / the physics floor: every weight byte plus every history byte read once,
 *    at the device copy rate measured in the same run (1 GiB d2d, bytes read + written / s).
 *    Goal: at most 1.15.
 * B. Capacity: 16 conversations of 32K tokens (64 GiB of history) on an 8 GiB device pool,
 *    staged, all decoding at once: step time / (bytes staged per step / the large-copy bus rate
 *    measured in the same run), goal at most 1.05; and every sequence's logits at every step
 *    bit-identical to the same batch on the resident route with a pool that holds it all
 *    (part A's 32K x 16 row).
 * P. Where a resident batch step's time goes (AKV_BENCH_PARTS=P; not in the default parts): at
 *    B = 1, 8, 32, 64 over 128-token and 4K histories, the graphed step (as in A) against the
 *    floor, and 4 more steps launched op by op (a second pass over the same weights,
 *    params.no_graphs) under the device's op profile (akv_dev_profile_start), split into the
 *    weight products (fwd_matmul: their time against their own floor, the weight bytes at the
 *    copy rate), attention (fwd_attn_*), the small kernels (the rest), the host's route step
 *    (begin_step) and what is left of the graphed step (launches, the logits' copy, gaps).
 * D. The gate's predictions (akv/gate.h) against measured steps, every placement it weighs
 *    (AKV_BENCH_PARTS=D; not in the default parts; AKV_BENCH_D_ONLY=staged: the staged ones,
 *    with their last step's timeline from the stage's events). The gate's rates in D and C: the file
 *    AKV_BENCH_GATE_RATES names (akv calibrate), else its defaults.
 * S. The staged compact route (akv/route.h: staged with a tier) against the staged exact one:
 *    one history of 32K, 64K, 128K through a small pool (AKV_BENCH_PARTS=S; not in the
 *    default parts).
 * R. A returning conversation (AKV_BENCH_PARTS=R; not in the default parts): through the
 *    engine (resident, a 5 GiB pool that holds one 32K history), a conversation of 32K tokens
 *    whose device pages another conversation took comes back with a new turn of 128 tokens:
 *    its time to first token against recomputing its whole prompt, and against (history bytes
 *    / the bus's large-copy rate + the new turn's prefill with the history on the device);
 *    then the same from the session directory (session_dir, a directory under TMPDIR or /tmp)
 *    with the file's pages dropped from the page cache (posix_fadvise; the one idle context
 *    left, 16 tokens, is written out when X comes back, inside its time), against (file bytes /
 *    the disk's read rate measured in the same run on a 1 GiB file + the new turn's prefill).
 * C. 4 conversations of 32K on a pool that holds one, through the engine (akv/engine.h) with
 *    real prompts (random tokens, prefilled in chunks of 1024) and 16 new tokens each
 *    (AKV_BENCH_C_NEW): served one after another (resident, max_seqs 1: the others wait in the
 *    queue) against served together (staged, max_seqs 4, the same pool; and resident with the
 *    q4 compact tier): the whole job's wall time against the queue's, each request's wait and
 *    time to its last token, and the aggregate decode rate; and as the gate chooses, and staged
 *    with the q4 tier.
 *
 * Histories in A and B are synthetic: one begin_step to C tokens without a pass, the host pages
 * filled from a fixed pseudo-random bf16 pattern (the same bytes for both routes; the first
 * decode step refills every device window page from them), then one untimed step and N timed
 * ones. Decode speed does not depend on the values; the bitwise check in B needs them to be
 * the same, not meaningful. AKV_BENCH_LAYERS=N (1..32) for fewer layers; AKV_BENCH_PARTS=ABC
 * picks the parts. Appends markdown to $AKV_BENCH_OUT. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/engine.h"
#include "akv/forward_dev.h"
#include "akv/forward_ops.h"
#include "akv/gate.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/route.h"
#include "akv/trace.h"
#include "core/clock.h"
#include "core/half.h"
#include "core/par.h"
#include "llama3_shape.h"

#define AKV_BENCH_NAME "bench_engine"
#include "bench_try.h"
#include "bench_copy_rate.h"
#include "bench_route.h"

enum { MAX_B = 64, PATTERN_FLOATS = 8u << 20 };

/* Large-copy host->device rate, bytes/s: 256 MiB from pinned memory, best of 5. */
static double h2d_rate(akv_dev *dev) {
    size_t n = (size_t)256 << 20;
    void *h = NULL;
    akv_dptr d;
    TRY(akv_dev_pinned_alloc(dev, n, &h));
    TRY(akv_dev_mem_alloc(dev, n, &d));
    memset(h, 1, n);
    double best = INFINITY;
    for (int i = 0; i < 6; i++) {
        double t0 = akv_clock_s();
        TRY(akv_dev_copy_h2d_sync(dev, d, h, n));
        double t = akv_clock_s() - t0;
        if (i && t < best) best = t;
    }
    TRY(akv_dev_mem_free(dev, d));
    akv_dev_pinned_free(dev, h);
    return (double)n / best;
}

/* ---- synthetic histories -------------------------------------------------------------------- */

static uint16_t *pattern; /* [PATTERN_FLOATS] bf16 in [-1, 1) */

typedef struct fill_job {
    akv_host_pool *hp;
    const akv_host_table *const *ht;
    uint32_t n_seq, n_layers, n_pages;
    size_t page_bytes;
} fill_job;

/* Task t = (sequence, layer): every page from the pattern at an offset of its own. */
static void fill_task(void *ctx, uint32_t t) {
    const fill_job *j = ctx;
    uint32_t s = t / j->n_layers, l = t % j->n_layers;
    size_t span = (size_t)PATTERN_FLOATS * 2 - j->page_bytes;
    for (uint32_t p = 0; p < j->n_pages; p++) {
        uint64_t h = ((uint64_t)s * 1000003u + l) * 1000033u + p;
        h = (h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ull;
        size_t off = (size_t)(h % span) & ~(size_t)1;
        memcpy(akv_host_pool_page_addr(j->hp, akv_host_table_page(j->ht[s], l, p)),
               (const char *)pattern + off, j->page_bytes);
    }
}

/* A route of B sequences of ctx tokens each, ready to decode. */
typedef struct bset {
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_dev_pool *cp; /* the compact tier's pool (a route with one), else NULL */
    akv_host_pool *hc; /* the staged compact route's compact copies, else NULL */
    uint32_t target;  /* each context's window pages by right */
    akv_route *r;
    akv_route_seq *s[MAX_B];
    uint32_t B, ctx;
    double staged_per_step; /* bytes, measured */
    double copy_ms;         /* the staged copies' device time a step (akv_route_stats) */
    double step_ms;
    double begin_ms;        /* of it, akv_route_begin_step (the wait for the last step's
                               write-backs, the table) */
    double one_row_ms;      /* the same steps asking for the first sequence's logits only */
} bset;

static int bset_open(bset *b, akv_dev *dev, const akv_model_config *c, akv_route_kind kind,
                     akv_repr tier, uint32_t B, uint32_t ctx, uint32_t n_steps, uint32_t device_gib,
                     akv_par *par) {
    memset(b, 0, sizeof *b);
    b->B = B, b->ctx = ctx;
    akv_geom g;
    TRY(akv_geom_init(&g, c->n_layers, c->n_kv_heads, c->head_dim, AKV_DTYPE_BF16, 0));
    uint64_t total = (uint64_t)ctx + n_steps + 2;
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = (uint32_t)ceil(bench_history_gib(&g, total) * B) + 1;
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = device_gib ? device_gib : (uint32_t)ceil(bench_history_gib(&g, total) * B * 1.02) + 1;
    akv_route_plan rpl; /* the kind's staging reserve (none for resident) */
    TRY(akv_route_plan_begin(kind, 0, &g, total, B, &rpl));
    dpp.staging_pages = rpl.staging_pages;
    const bool staged_tier = tier != AKV_REPR_EXACT && akv_route_need(kind, &g, total) == 0;
    if (staged_tier) { /* the exact pool holds the first step (the whole history, exact) */
        dpp.device_gib = (uint32_t)ceil(bench_history_gib(&g, total) * B * 1.02) + 1;
        dpp.staging_pages = 0;
    }
    TRY(akv_host_pool_create(dev, &g, &hpp, &b->hp));
    if (akv_dev_pool_create(dev, &g, &dpp, &b->dp) != AKV_OK) return 0;
    akv_dev_pool_stats ps;
    akv_dev_pool_get_stats(b->dp, &ps);
    akv_route_params rp = {.kind = kind, .max_history = total, .max_seqs = B, .queued = true};
    if (tier != AKV_REPR_EXACT) {
        /* resident: the compact pool holds every history's older pages; the first step (the
         * whole history at once, no pass) is exact, as a step's own tokens are: the exact pool
         * holds it, and the first decode step makes the compact pages. Staged: a compact pool
         * of device_gib (its staging reserve, then the compact windows) and compact copies on
         * the host with a page for every exact host page */
        const double cfrac = akv_repr_bits(tier, AKV_DTYPE_BF16, c->head_dim) / 16;
        akv_dev_pool_params cpp = akv_dev_pool_default_params();
        cpp.device_gib = staged_tier ? device_gib
                                     : (uint32_t)ceil(bench_history_gib(&g, total) * B * cfrac * 1.02) + 1;
        cpp.repr = tier;
        if (staged_tier) cpp.staging_pages = akv_route_compact_staging_pages(&g, total, B);
        if (akv_dev_pool_create(dev, &g, &cpp, &b->cp) != AKV_OK) return 0;
        rp.tier = tier, rp.compact_pool = b->cp, rp.exact_recent = 256, rp.max_step = (uint32_t)total;
        if (staged_tier) {
            akv_host_pool_params chp = akv_host_pool_default_params();
            chp.limit_gib = chp.keep_gib = (uint32_t)ceil(hpp.limit_gib * cfrac) + 1;
            chp.repr = tier;
            TRY(akv_host_pool_create(dev, &g, &chp, &b->hc));
            rp.compact_host_pool = b->hc;
        }
    }
    if (akv_route_create(dev, b->hp, b->dp, &rp, &b->r) != AKV_OK) return 0;
    akv_route_req reqs[MAX_B];
    const akv_host_table *ht[MAX_B];
    /* a window's target: the window part shared out, as the engine's plan does (a kind whose
     * window is the whole history ignores it); too small a share is no row */
    uint32_t target = ps.window_capacity / B;
    b->target = target;
    if (akv_route_need(kind, &g, total) == 0 && target < rpl.window_pages) return 0;
    for (uint32_t i = 0; i < B; i++) {
        akv_route_seq_params sp = {.target = target, .tag = i + 1};
        TRY(akv_route_seq_open(b->r, &sp, &b->s[i]));
        reqs[i] = (akv_route_req){b->s[i], ctx};
    }
    TRY(akv_route_begin_step(b->r, reqs, B)); /* the history placed, no pass */
    for (uint32_t i = 0; i < B; i++) ht[i] = akv_route_seq_host_table(b->s[i]);
    fill_job fj = {.hp = b->hp, .ht = ht, .n_seq = B, .n_layers = g.n_layers,
                   .n_pages = akv_host_table_n_pages(ht[0]), .page_bytes = akv_geom_page_bytes(&g)};
    akv__par_for(par, B * g.n_layers, fill_task, &fj);
    return 1;
}

static void bset_close(bset *b) {
    if (b->r) {
        TRY(akv_route_sync(b->r));
        for (uint32_t i = 0; i < b->B; i++)
            if (b->s[i]) TRY(akv_route_seq_close(b->r, b->s[i]));
        TRY(akv_route_destroy(b->r));
    }
    if (b->cp) TRY(akv_dev_pool_destroy(b->cp));
    if (b->dp) TRY(akv_dev_pool_destroy(b->dp));
    if (b->hp) TRY(akv_host_pool_destroy(b->hp));
    if (b->hc) TRY(akv_host_pool_destroy(b->hc));
    memset(b, 0, sizeof *b);
}

/* Decode step `step` of every sequence (position ctx + step; mode: each row's logits, NULL:
 * all) through pass f; returns the seconds its route step (begin_step) took. */
static double bset_step(bset *b, akv_forward_dev *f, uint32_t step, const uint8_t *mode) {
    const akv_model_config *c = akv_forward_dev_config(f);
    uint32_t n_new[MAX_B], pos0[MAX_B];
    int32_t tok[MAX_B];
    akv_route_req reqs[MAX_B];
    akv_kv_hooks kv = akv_route_hooks(b->r);
    for (uint32_t i = 0; i < b->B; i++) {
        n_new[i] = 1, pos0[i] = b->ctx + step;
        tok[i] = (int32_t)((step * 7919u + i * 104729u) % c->n_vocab);
        reqs[i] = (akv_route_req){b->s[i], (uint64_t)b->ctx + step + 1};
    }
    int32_t argmax[MAX_B];
    akv_forward_batch fb = {.n_seq = b->B, .n_new = n_new, .pos0 = pos0, .tokens = tok,
                            .logits = mode, .chosen = argmax};
    const double tb = akv_clock_s();
    TRY(akv_route_begin_step(b->r, reqs, b->B));
    const double begin_s = akv_clock_s() - tb;
    TRY(akv_forward_dev_step(f, &fb, &kv, akv_forward_dev_logits_buffer(f)));
    return begin_s;
}

/* One untimed step and n timed ones of every sequence; the first n_keep timed steps' logits
 * (B rows each) copied into keep[step] outside the timing; with one_row, n more steps asking
 * for the first sequence's logits only (what the logits cost). */
static void bset_run(bset *b, akv_forward_dev *f, uint32_t n, float **keep, uint32_t n_keep,
                     bool one_row) {
    const akv_model_config *c = akv_forward_dev_config(f);
    const float *lg = akv_forward_dev_logits_buffer(f); /* the engine's way: no host copy */
    akv_route_stats s0, s1;
    double t_steps = 0;
    b->begin_ms = 0;
    for (uint32_t step = 0; step <= n; step++) {
        if (step == 1) akv_route_get_stats(b->r, &s0);
        const double tb = akv_clock_s();
        const double begin_s = bset_step(b, f, step, NULL);
        if (step >= 1) t_steps += akv_clock_s() - tb, b->begin_ms += begin_s * 1e3 / n;
        if (keep && step >= 1 && step <= n_keep)
            memcpy(keep[step - 1], lg, (size_t)b->B * c->n_vocab * sizeof *lg);
    }
    b->step_ms = t_steps / n * 1e3;
    akv_route_get_stats(b->r, &s1);
    if (one_row) { /* what the logits cost: the same steps with one row back */
        uint8_t mode[MAX_B];
        for (uint32_t i = 0; i < b->B; i++) mode[i] = i ? AKV_FORWARD_LOGITS_NONE : AKV_FORWARD_LOGITS_LAST;
        const double t1 = akv_clock_s();
        for (uint32_t step = n + 1; step <= 2 * n; step++) bset_step(b, f, step, mode);
        b->one_row_ms = (akv_clock_s() - t1) / n * 1e3;
    }
    b->staged_per_step = (double)(s1.staged_bytes - s0.staged_bytes) / n;
    b->copy_ms = (double)(s1.staged_copy_ns - s0.staged_copy_ns) / n / 1e6;
}

/* ---- part P: where a resident batch step's time goes ---------------------------------------- */

/* A step's device time by kind of op, ms a step, from an op profile of n steps. */
typedef struct pshare {
    double products, attn, small, ops, span;
} pshare;

/* n steps of every sequence from step `from` on, launched op by op by pass fe under the op
 * profile, split by op name. */
static pshare profile_steps(akv_dev *dev, bset *b, akv_forward_dev *fe, uint32_t from, uint32_t n) {
    const akv_model_config *c = akv_forward_dev_config(fe);
    TRY(akv_dev_profile_start(dev, (size_t)n * (c->n_layers * 24 + 32)));
    for (uint32_t step = from; step < from + n; step++) bset_step(b, fe, step, NULL);
    TRY(akv_route_sync(b->r));
    akv_dev_profile_row rows[128];
    akv_dev_profile_summary sum;
    TRY(akv_dev_profile_stop(dev, rows, 128, &sum));
    if (sum.untimed || sum.n_keys > 128)
        fprintf(stderr, "bench_engine: the op profile missed %llu launches, %zu keys\n",
                (unsigned long long)sum.untimed, sum.n_keys);
    pshare p = {.ops = sum.ops_ns / 1e6 / n, .span = sum.span_ns / 1e6 / n};
    for (size_t i = 0; i < sum.n_keys && i < 128; i++) {
        const double ms = rows[i].ns / 1e6 / n;
        if (!strncmp(rows[i].key, AKV_FWD_OP_MATMUL, strlen(AKV_FWD_OP_MATMUL))) p.products += ms;
        else if (!strncmp(rows[i].key, "fwd_attn_", 9)) p.attn += ms;
        else p.small += ms;
    }
    return p;
}

static void part_p(akv_dev *dev, const char *dev_name, const akv_model_config *c, akv_forward_dev *f,
                   const akv_forward_params *fp, double wb, double copy_bps, double token_bytes,
                   akv_par *par, FILE *out) {
    akv_forward_params fpe = *fp;
    fpe.no_graphs = 1;
    akv_forward_dev *fe = NULL; /* the same weights (same seed), every op launched by itself */
    TRY(akv_forward_dev_create_synthetic(dev, c, 7, &fpe, &fe));
    bench_emit(out,
               "\n### Where a resident batch step goes (%s): synthetic Llama-3-8B shape, bf16, %u "
               "layers\n\nStep = the graphed step of part A (route step + forward step, every "
               "row's logits back), 16 steps. The split is of 4 more steps launched op by op under "
               "the device's op profile (per step): products = the weight products (their floor: "
               "%.2f GB of weights at the copy rate, %.3f ms), attention = append, decode and "
               "merge, small = every other kernel (norms, RoPE, SwiGLU, adds, casts, embedding), "
               "host = the route's step on the host (begin_step, in the graphed steps), rest = step "
               "- products - attention - small - host (launches, the logits' copy, gaps; the op by "
               "op launches run without the graph's overlap, so rest is low by that), logits = "
               "step - the same step with one row of logits back (what every row's logits cost); "
               "greedy = the step with every row's greedy choice made on the device "
               "(AKV_FORWARD_LOGITS_ARGMAX: ids back, no rows); op-by-op span = the device's time "
               "from the first profiled launch to the last, a step (the host's route step between "
               "steps included); graphs built / launched = the graph pass's over the 33 steps of "
               "part A's measure (one untimed, 16 with every row's logits, 16 with one row; a step "
               "whose launches differ from the last graph's builds a new one). "
               "Device copy rate (same run) **%.0f GB/s**; floor = (weights + every history byte) / "
               "copy rate.\n\n| context | B | step ms | floor ms | step / floor | products ms | "
               "products / their floor | attention ms | small ms | host ms | rest ms | logits ms | "
               "greedy step ms | greedy / floor | op-by-op span ms | graphs built / launched |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
               dev_name, c->n_layers, wb / 1e9, wb / copy_bps * 1e3, copy_bps / 1e9);
    const uint32_t ctxs[] = {128, 4096}, Bs[] = {1, 8, 32, 64};
    for (size_t ic = 0; ic < 2; ic++)
        for (size_t ib = 0; ib < 4; ib++) {
            const uint32_t ctx = ctxs[ic], B = Bs[ib], steps = 16;
            bset b;
            if (!bset_open(&b, dev, c, bench_kind("resident"), AKV_REPR_EXACT, B, ctx, 3 * steps + 16,
                           0, par)) {
                bench_emit(out, "| %u | %u | does not fit | | | | | | | | | | | | | |\n", ctx, B);
                bset_close(&b);
                continue;
            }
            const akv_forward_dev_stats g0 = akv_forward_dev_get_stats(f);
            bset_run(&b, f, steps, NULL, 0, true);
            const akv_forward_dev_stats g1 = akv_forward_dev_get_stats(f);
            uint8_t greedy[MAX_B]; /* every row's greedy choice on the device, no row back */
            memset(greedy, AKV_FORWARD_LOGITS_ARGMAX, sizeof greedy);
            const double tg = akv_clock_s();
            for (uint32_t k = 0; k < steps; k++) bset_step(&b, f, 2 * steps + 1 + k, greedy);
            const double greedy_ms = (akv_clock_s() - tg) / steps * 1e3;
            bset_step(&b, fe, 3 * steps + 1, NULL); /* untimed: the op-by-op pass's first step */
            const pshare p = profile_steps(dev, &b, fe, 3 * steps + 2, 4);
            const double floor_ms = (wb + token_bytes * B * (ctx + 1)) / copy_bps * 1e3;
            bench_emit(out, "| %u | %u | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | "
                            "%.3f | %.3f | %.3f | %.3f | %.3f | %llu / %llu |\n",
                       ctx, B, b.step_ms, floor_ms, b.step_ms / floor_ms, p.products,
                       p.products / (wb / copy_bps * 1e3), p.attn, p.small, b.begin_ms,
                       b.step_ms - p.ops - b.begin_ms, b.step_ms - b.one_row_ms, greedy_ms,
                       greedy_ms / floor_ms, p.span,
                       (unsigned long long)(g1.graph_builds - g0.graph_builds),
                       (unsigned long long)(g1.graph_launches - g0.graph_launches));
            bset_close(&b);
        }
    akv_forward_dev_destroy(fe);
}

/* ---- part C: the engine, a queue against a batch ------------------------------------------- */

typedef struct creq {
    akv_request *rq;
    akv_request_info info;
} creq;

typedef struct crun {
    bool ran; /* false: the configuration does not fit the pool (the engine said why) */
    double wall_s, agg_decode;
    creq r[4];
    char chose[48]; /* kv_tier auto: the placement the gate chose and the sequences it admits */
} crun;

/* One staged placement's timeline line into buf (appended). */
static void timeline_note(char *buf, size_t cap, akv_gate_placement pl, const akv_route_layer_times *lt,
                          uint32_t L) {
    double busy = 0, idle = 0, worst = 0, lag = 0, slot_idle = 0, attn = 0;
    uint32_t worst_at = 0, host_late = 0, n_gaps = 0, slot_bound = 0;
    for (uint32_t l = 0; l < L; l++) { /* in doubles: an unrecorded 0 stays a number */
        busy += (double)lt[l].copy_done_ns - (double)lt[l].copy_start_ns;
        lag += (double)lt[l].attn_start_ns - (double)lt[l].copy_done_ns;
        attn += (double)lt[l].attn_done_ns - (double)lt[l].attn_start_ns;
        if (!l) continue;
        const double gap = (double)lt[l].copy_start_ns - (double)lt[l - 1].copy_done_ns;
        if (gap > 0) idle += gap;
        if (gap > worst) worst = gap, worst_at = l;
        host_late += lt[l].bus_idle_at_copy != 0;
        /* layer l's copies wait for the last reader of their staging slot, an earlier layer's
         * attention (two back with two slots, three with three); a gap that ends within 20 us
         * of an earlier attention's end waited for it */
        if (gap > 10e3) {
            n_gaps++;
            bool at_reader = false;
            for (uint32_t j = 0; j < l && !at_reader; j++)
                at_reader = fabs((double)lt[l].copy_start_ns - (double)lt[j].attn_done_ns) < 20e3;
            if (at_reader) slot_bound++, slot_idle += gap;
        }
    }
    /* the host's cadence: its copies' submissions from layer 1 to the last, against the
     * device's starts of the same copies */
    const double host_ms = L > 1 ? ((double)lt[L - 1].host_copied_ns - (double)lt[1].host_copied_ns) / 1e6 : 0;
    const double dev_ms = L > 1 ? ((double)lt[L - 1].copy_start_ns - (double)lt[1].copy_start_ns) / 1e6 : 0;
    const size_t at = strlen(buf);
    snprintf(buf + at, cap - at,
             "- %s %s, %u layers: copies span %.3f ms, bus busy %.3f ms, idle between layers "
             "%.3f ms (longest %.3f ms, before layer %u); attention starts %.3f ms after its "
             "copies on average; the last attention ends %.3f ms after the last copy. The host "
             "submitted layers 1-%u's copies over %.3f ms (the device started them over %.3f ms); "
             "at %u of %u submissions the bus had already finished the layer before's copies. "
             "Of %u gaps over 10 us, %u (%.3f ms) ended within 20 us of the end of an earlier "
             "layer's attention (a staging slot's last reader); attention takes %.3f ms a layer "
             "(its events' span, on average)\n",
             akv_route_kind_name(pl.kind), akv_repr_name(pl.tier), L,
             ((double)lt[L - 1].copy_done_ns - (double)lt[0].copy_start_ns) / 1e6, busy / 1e6,
             idle / 1e6, worst / 1e6, worst_at, lag / L / 1e6,
             ((double)lt[L - 1].attn_done_ns - (double)lt[L - 1].copy_done_ns) / 1e6, L - 1,
             host_ms, dev_ms, host_late, L - 1, n_gaps, slot_bound, slot_idle / 1e6, attn / L / 1e6);
}

/* The gate's rates: AKV_BENCH_GATE_RATES's file (akv calibrate), else the defaults. */
static akv_gate_rates bench_gate_rates(void) {
    akv_gate_rates rates = akv_gate_default_rates();
    const char *rf = getenv("AKV_BENCH_GATE_RATES");
    if (rf && *rf) TRY(akv_gate_rates_load(rf, &rates));
    return rates;
}

static crun part_c_run(const akv_model_config *c, akv_route_kind kind, akv_repr tier,
                       uint32_t max_seqs, uint32_t ctx, uint32_t n_new, uint32_t device_gib) {
    crun out;
    memset(&out, 0, sizeof out);
    akv_engine_params ep = akv_engine_default_params();
    ep.attn = bench_attn_tuning();
    TRY(akv_dev_create(akv_dev_cuda_backend(), NULL, &ep.dev));
    ep.synthetic = c, ep.synthetic_seed = 7;
    ep.route = kind, ep.max_seqs = max_seqs, ep.max_queue = 4, ep.max_context = ctx + n_new;
    /* the host pool holds the four exact histories (4 GiB each) and, for the staged compact
     * route, their compact copies (1.1 GiB each); it is pinned before the job's clock starts */
    ep.device_gib = device_gib, ep.host_gib = 4 * 6 + 2;
    ep.chunk = 1024;
    ep.kv_tier = tier;
    const akv_gate_rates rates = bench_gate_rates();
    ep.gate_rates = &rates;
    akv_engine *e = NULL;
    if (akv_engine_create(&ep, &e) != AKV_OK) return out; /* the device went with it */
    out.ran = true;
    const akv_engine_plan *pl = akv_engine_get_plan(e);
    for (uint32_t i = 0; i < pl->n_gate; i++)
        if (pl->gate[i].chosen)
            snprintf(out.chose, sizeof out.chose, ": %s %s, %u at once", akv_route_kind_name(pl->gate[i].kind),
                     akv_repr_name(pl->gate[i].tier), pl->max_seqs);
    int32_t *prompt = malloc((size_t)ctx * sizeof *prompt);
    double t0 = akv_clock_s();
    for (int i = 0; i < 4; i++) {
        for (uint32_t t = 0; t < ctx; t++)
            prompt[t] = (int32_t)((t * 2654435761u + (uint32_t)i * 40503u) % c->n_vocab);
        akv_request_params rp = {.prompt = prompt, .n_prompt = ctx, .max_tokens = n_new,
                                 .sample = akv_sample_default_params(), .id = (uint64_t)i + 1};
        rp.sample.temp = 0;
        TRY(akv_engine_submit(e, &rp, &out.r[i].rq, NULL));
    }
    while (akv_engine_busy(e)) TRY(akv_engine_step(e, NULL));
    out.wall_s = akv_clock_s() - t0;
    double first = INFINITY, last = 0;
    uint32_t n_dec = 0;
    for (int i = 0; i < 4; i++) {
        akv_request_get_info(out.r[i].rq, &out.r[i].info);
        const akv_request_info *ri = &out.r[i].info;
        first = fmin(first, ri->t_first), last = fmax(last, ri->t_done);
        n_dec += ri->n_gen;
        akv_engine_release(e, out.r[i].rq);
    }
    out.agg_decode = n_dec / (last - first);
    free(prompt);
    akv_engine_destroy(e);
    return out;
}

/* ---- part R: a returning conversation ------------------------------------------------------ */

/* The first token's time of one request of n prompt tokens (salt: its cache_salt), run alone;
 * *cached: its tokens reused. */
static double r_ttft(akv_engine *e, const int32_t *prompt, uint32_t n, uint64_t salt, uint32_t *cached) {
    akv_request_params rp = {.prompt = prompt, .n_prompt = n, .max_tokens = 1,
                             .sample = akv_sample_default_params(), .cache_salt = salt};
    rp.sample.temp = 0;
    akv_request *rq;
    TRY(akv_engine_submit(e, &rp, &rq, NULL));
    while (akv_engine_busy(e)) TRY(akv_engine_step(e, NULL));
    akv_request_info ri;
    akv_request_get_info(rq, &ri);
    akv_engine_release(e, rq);
    if (cached) *cached = ri.n_cached;
    return ri.t_first - ri.t_submit;
}

/* AKV_BENCH_R_TRACE=PREFIX: each engine of part R traced at the spans level into
 * PREFIX.mem.json and PREFIX.disk.json (akv/trace.h: its steps, starts, placements). */
static akv_trace *r_trace(const char *dir) {
    const char *prefix = getenv("AKV_BENCH_R_TRACE");
    if (!prefix || !*prefix) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s.%s.json", prefix, dir ? "disk" : "mem");
    akv_trace *t = NULL;
    if (akv_trace_create(AKV_TRACE_SPANS, 0, &t) != AKV_OK) return NULL;
    if (akv_trace_attach_file(t, path) != AKV_OK) akv_trace_destroy(t), t = NULL;
    return t;
}

static akv_engine *r_engine(const akv_model_config *c, uint32_t ctx, const char *dir, akv_trace *tr) {
    akv_engine_params ep = akv_engine_default_params();
    ep.trace = tr;
    ep.attn = bench_attn_tuning();
    TRY(akv_dev_create(akv_dev_cuda_backend(), NULL, &ep.dev));
    ep.synthetic = c, ep.synthetic_seed = 7;
    ep.max_seqs = 1, ep.max_queue = 2, ep.max_context = ctx + 512;
    ep.device_gib = 5, ep.host_gib = 3 * 5 + 2, ep.chunk = 1024;
    ep.max_idle = dir ? 1 : 4, ep.session_dir = dir;
    akv_engine *e = NULL;
    return akv_engine_create(&ep, &e) == AKV_OK ? e : NULL;
}

/* Bytes/s reading a 1 GiB file written and dropped from the page cache first. */
static double r_disk_rate(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rate.bin", dir);
    const size_t n = (size_t)1 << 30, blk = (size_t)8 << 20;
    char *buf = malloc(blk);
    memset(buf, 7, blk);
    FILE *f = fopen(path, "wb");
    if (!f) return NAN;
    for (size_t o = 0; o < n; o += blk) fwrite(buf, 1, blk, f);
    fflush(f), fsync(fileno(f));
    posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED);
    fclose(f);
    f = fopen(path, "rb");
    const double t0 = akv_clock_s();
    size_t got = 0, k;
    while ((k = fread(buf, 1, blk, f)) > 0) got += k;
    const double t = akv_clock_s() - t0;
    fclose(f), remove(path), free(buf);
    return got / t;
}

/* fn(path) for every file of dir. */
static void r_each_file(const char *dir, void (*fn)(const char *path)) {
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
        char path[768];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (de->d_name[0] != '.') fn(path);
    }
    if (d) closedir(d);
}

/* A file dropped from the page cache (its pages are on the disk: fsynced). */
static void r_drop_cache(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED), fclose(f);
}

static void r_remove(const char *path) {
    (void)remove(path);
}

static void part_r(const akv_model_config *c, double bus_bps, double token_bytes, const char *dev_name,
                   FILE *out) {
    const uint32_t ctx = 32768, turn = 128;
    int32_t *x = malloc((size_t)(ctx + 2 * turn) * sizeof *x), *y = malloc((size_t)ctx * sizeof *y);
    for (uint32_t t = 0; t < ctx + 2 * turn; t++) x[t] = (int32_t)((t * 2654435761u + 11u) % c->n_vocab);
    for (uint32_t t = 0; t < ctx; t++) y[t] = (int32_t)((t * 2654435761u + 977u) % c->n_vocab);
    /* from host memory: X prefilled, Y takes the device pool, X returns with a turn; then a
     * turn with its history on the device (the prefill term); then X's prompt recomputed
     * (another salt: nothing reused) */
    akv_trace *tr = r_trace(NULL);
    akv_engine *e = r_engine(c, ctx, NULL, tr);
    if (!e) {
        akv_trace_destroy(tr);
        bench_emit(out, "\n(returning conversation: the engine did not fit)\n");
        free(x), free(y);
        return;
    }
    uint32_t cached_mem = 0, cached_turn = 0, cached_disk = 0;
    (void)r_ttft(e, x, ctx, 0, NULL);
    (void)r_ttft(e, y, ctx, 0, NULL);
    const double t_mem = r_ttft(e, x, ctx + turn, 0, &cached_mem);
    const double t_turn = r_ttft(e, x, ctx + 2 * turn, 0, &cached_turn);
    uint32_t cached_fresh = 0;
    const double t_fresh = r_ttft(e, x, ctx + turn, 1, &cached_fresh);
    akv_engine_destroy(e);
    akv_trace_destroy(tr);
    /* from the session directory: X written out when Y finishes (one idle context kept) */
    char dir[] = "/tmp/akv_bench_sdir_XXXXXX";
    double t_disk = NAN, disk_bps = NAN, file_bytes = NAN, restore_s = NAN, restore_disk_s = NAN;
    if (mkdtemp(dir)) {
        disk_bps = r_disk_rate(dir);
        tr = r_trace(dir);
        e = r_engine(c, ctx, dir, tr);
        if (e) {
            (void)r_ttft(e, x, ctx, 0, NULL);
            (void)r_ttft(e, y, ctx, 0, NULL); /* X written out */
            (void)r_ttft(e, y + 7, 16, 5, NULL); /* Y written out: the one idle context kept
                                                     is 16 tokens when X returns */
            akv__engine_flush_sessions(e); /* the files on the disk: the return comes later */
            akv_engine_stats st;
            akv_engine_get_stats(e, &st);
            file_bytes = st.n_spill_files ? (double)st.spill_bytes / st.n_spill_files : NAN; /* X's, Y's: one length */
            r_each_file(dir, r_drop_cache);
            t_disk = r_ttft(e, x, ctx + turn, 0, &cached_disk);
            akv_engine_get_stats(e, &st);
            if (st.n_restored != 1) t_disk = NAN;
            restore_s = st.restore_s, restore_disk_s = st.restore_disk_s;
            akv_engine_destroy(e);
        }
        akv_trace_destroy(tr);
        r_each_file(dir, r_remove);
        rmdir(dir);
    }
    const double hist = token_bytes * ctx;
    const double floor_mem = hist / bus_bps + t_turn, floor_disk = file_bytes / disk_bps + t_turn;
    bench_emit(out,
               "\n### A returning conversation (%s): synthetic Llama-3-8B shape, bf16, 32K history "
               "+ a 128-token turn\n\nThrough the engine, resident, a 5 GiB pool that holds one "
               "32K history: the conversation's device pages were taken by another 32K "
               "conversation before it returns. Time to first token (submit to first token). "
               "Bus (same run) **%.1f GB/s**; the disk's read rate (a 1 GiB file out of the page "
               "cache, same run) **%.2f GB/s**; history %.2f GB, its session file %.2f GB. "
               "Turn = the new turn's prefill with the history on the device. Goals: recompute / "
               "returning >= 30; returning / floor <= 1.1.\n\n"
               "| case | TTFT ms | tokens reused | recompute / this | floor ms | this / floor |\n"
               "|---|---|---|---|---|---|\n"
               "| recompute (32K + 128, another salt) | %.1f | %u | 1.00 | | |\n"
               "| returning, history in host memory | %.1f | %u | %.1f | %.1f (bytes / bus + turn) | %.3f |\n"
               "| returning, history in the session directory | %.1f | %u | %.1f | %.1f (bytes / disk + turn) | %.3f |\n"
               "| the turn, history on the device | %.1f | %u | %.1f | | |\n"
               "\nThe return from the session directory: its read back took %.1f ms from its "
               "start to its adoption (a thread of its own fills the pages while the engine "
               "steps on), %.1f ms of it the reading thread's wait for the disk (the rest: "
               "checking and placing what the read-ahead had not yet overlapped).\n",
               dev_name, bus_bps / 1e9, disk_bps / 1e9, hist / 1e9, file_bytes / 1e9, t_fresh * 1e3,
               cached_fresh, t_mem * 1e3, cached_mem, t_fresh / t_mem, floor_mem * 1e3, t_mem / floor_mem,
               t_disk * 1e3, cached_disk, t_fresh / t_disk, floor_disk * 1e3, t_disk / floor_disk,
               t_turn * 1e3, cached_turn, t_fresh / t_turn, restore_s * 1e3, restore_disk_s * 1e3);
    free(x), free(y);
}

int main(void) {
    akv_dev_info info;
    akv_dev *dev = bench_cuda_or_skip(&info);
    const char *parts = getenv("AKV_BENCH_PARTS") ? getenv("AKV_BENCH_PARTS") : "ABC";
    akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_BENCH_LAYERS", 1, 32, 32));
    akv_forward_params fp = {.max_step_tokens = MAX_B, .max_logits = MAX_B, .attn = bench_attn_tuning()};
    akv_forward_dev *f = NULL;
    TRY(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &f));
    const double wb = (double)akv_forward_dev_weight_bytes(f);
    const double copy_bps = bench_copy_rate_bps(dev, (size_t)1 << 30);
    const double bus_bps = h2d_rate(dev);
    const double token_bytes = 2.0 * c.n_kv_heads * c.head_dim * 2 * c.n_layers;
    akv_par *par = NULL;
    TRY(akv__par_create(0, &par));
    pattern = malloc((size_t)PATTERN_FLOATS * 2);
    uint64_t rs = 99;
    for (uint32_t i = 0; i < PATTERN_FLOATS; i++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        pattern[i] = akv_f32_to_bf16((float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f);
    }
    printf("bench_engine: %u layers, %.2f GB of weights on %s; device copy rate %.0f GB/s, "
           "host->device %.1f GB/s\n",
           c.n_layers, wb / 1e9, info.name, copy_bps / 1e9, bus_bps / 1e9);
    FILE *out = bench_out_open();

    /* A, and B's resident reference */
    const uint32_t nB = 16, n_b_steps = 4;
    float **ref = NULL, **stg = NULL;
    bool have_ref = false; /* part A's 32K x 16 row ran and kept its logits */
    if (strchr(parts, 'A') || strchr(parts, 'B')) {
        ref = calloc(n_b_steps, sizeof *ref), stg = calloc(n_b_steps, sizeof *stg);
        for (uint32_t i = 0; i < n_b_steps; i++) {
            ref[i] = malloc((size_t)nB * c.n_vocab * sizeof(float));
            stg[i] = malloc((size_t)nB * c.n_vocab * sizeof(float));
        }
    }
    if (strchr(parts, 'A')) {
        const struct { uint32_t ctx, B; } rows[] = {
            {128, 1},   {128, 8},   {128, 32},  {128, 64},  {4096, 1},  {4096, 4},  {4096, 8},
            {4096, 16}, {4096, 32}, {4096, 64}, {32768, 1}, {32768, 4}, {32768, 8}, {32768, 16}};
        bench_emit(out,
                   "\n### Engine batch step, resident (%s): synthetic Llama-3-8B shape, bf16, %u "
                   "layers\n\nB sequences decoding together, one route step + one forward step "
                   "each (logits back). Device copy rate (1 GiB d2d, read + written, same run): "
                   "**%.0f GB/s**. Floor = (weights %.2f GB + every history byte) / copy rate; "
                   "ratio = step / floor (goal <= 1.15).\n\n"
                   "| context | B | step ms | of it begin_step ms | step, one row of logits ms | "
                   "tokens/s (all) | floor ms | ratio |\n|---|---|---|---|---|---|---|---|\n",
                   info.name, c.n_layers, copy_bps / 1e9, wb / 1e9);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            bset b;
            uint32_t steps = rows[i].ctx >= 32768 ? 8 : 16;
            if (!bset_open(&b, dev, &c, bench_kind("resident"), AKV_REPR_EXACT, rows[i].B, rows[i].ctx, 40,
                           0, par)) {
                bench_emit(out, "| %u | %u | does not fit | | | | | |\n", rows[i].ctx, rows[i].B);
                bset_close(&b);
                continue;
            }
            bool keep = rows[i].ctx == 32768 && rows[i].B == nB && strchr(parts, 'B');
            bset_run(&b, f, steps, keep ? ref : NULL, n_b_steps, true);
            have_ref |= keep;
            double floor_ms = (wb + token_bytes * rows[i].B * (rows[i].ctx + 1)) / copy_bps * 1e3;
            bench_emit(out, "| %u | %u | %.3f | %.3f | %.3f | %.1f | %.3f | %.3f |\n",
                       rows[i].ctx, rows[i].B, b.step_ms, b.begin_ms, b.one_row_ms,
                       rows[i].B * 1e3 / b.step_ms, floor_ms, b.step_ms / floor_ms);
            bset_close(&b);
        }
    }
    if (strchr(parts, 'B')) {
        bset b;
        if (!bset_open(&b, dev, &c, bench_kind("staged"), AKV_REPR_EXACT, nB, 32768, 16, 8, par)) {
            bench_emit(out, "\n(capacity: 16 x 32K does not fit an 8 GiB staged pool)\n");
        } else {
            akv_dev_pool_stats ps;
            akv_dev_pool_get_stats(b.dp, &ps);
            bset_run(&b, f, n_b_steps, stg, n_b_steps, false);
            double bus_ms = b.staged_per_step / bus_bps * 1e3;
            uint32_t same = 0, n_cmp = 0;
            for (uint32_t s = 0; s < n_b_steps && have_ref; s++)
                for (uint32_t i = 0; i < nB; i++, n_cmp++)
                    same += !memcmp(ref[s] + (size_t)i * c.n_vocab, stg[s] + (size_t)i * c.n_vocab,
                                    c.n_vocab * sizeof(float));
            char cmp_said[96];
            if (have_ref)
                snprintf(cmp_said, sizeof cmp_said, "%u of %u", same, n_cmp);
            else /* not compared: no count that reads as a mismatch */
                snprintf(cmp_said, sizeof cmp_said, "not compared (%s)",
                         strchr(parts, 'A') ? "the resident reference does not fit this device"
                                            : "part A not run");
            bench_emit(out,
                       "\n### Capacity: 16 conversations of 32K (%.1f GiB of history) on an 8 GiB "
                       "device pool, staged (%s)\n\nWindow part %u pages per layer (%u each, by "
                       "right), staging reserve %u pages. Host->device large-copy rate (256 MiB "
                       "pinned, same run): **%.1f GB/s**; bus time = bytes staged per step / that "
                       "rate; ratio = step / bus time (goal <= 1.05). Bitwise: every sequence's "
                       "logits at every step against the same batch on the resident route (64 GiB "
                       "pool).\n\n| staged GiB/step | bus ms | step ms | ratio | tokens/s (all) | "
                       "bit-identical |\n|---|---|---|---|---|---|\n"
                       "| %.2f | %.1f | %.1f | %.3f | %.2f | %s |\n",
                       16 * 32768 * token_bytes / (1u << 30), info.name, ps.window_capacity,
                       ps.window_capacity / nB, ps.staging_reserve, bus_bps / 1e9,
                       b.staged_per_step / (1u << 30), bus_ms, b.step_ms, b.step_ms / bus_ms,
                       nB * 1e3 / b.step_ms, cmp_said);
        }
        bset_close(&b);
    }
    if (strchr(parts, 'P'))
        part_p(dev, info.name, &c, f, &fp, wb, copy_bps, token_bytes, par, out);
    if (strchr(parts, 'D')) {
        /* The gate's predictions against measured steps: each placement it weighs, B = 4
         * histories of AKV_BENCH_D_CTX tokens (32768) decoding together, staged through an
         * AKV_BENCH_D_GIB pool (8), every other placement resident in a pool that holds it;
         * predicted step = the gate's step (akv/gate.h: weights and K/V at the rates from
         * AKV_BENCH_GATE_RATES or the defaults; staged, the bus) + what it leaves out
         * (launches, small kernels, the host: a step over 256-token histories measured, less
         * the gate's step for it). Goal: within 10 %. */
        const uint32_t B = 4, ctx = (uint32_t)akv_test_env_int("AKV_BENCH_D_CTX", 1024, 131072, 32768);
        const uint32_t sgib = (uint32_t)akv_test_env_int("AKV_BENCH_D_GIB", 1, 64, 8);
        const akv_gate_rates rates = bench_gate_rates();
        bset b;
        double base_ms = NAN;
        if (bset_open(&b, dev, &c, bench_kind("resident"), AKV_REPR_EXACT, B, 256, 20, 0, par)) {
            bset_run(&b, f, 16, NULL, 0, false);
            base_ms = b.step_ms;
        }
        bset_close(&b);
        akv_geom g;
        TRY(akv_geom_init(&g, c.n_layers, c.n_kv_heads, c.head_dim, AKV_DTYPE_BF16, 0));
        const double rest_ms =
            base_ms - 1e3 * akv_gate_predict(&rates, &g, bench_kind("resident"), AKV_REPR_EXACT, B, 256, 256, 0, wb).step_s;
        bench_emit(out,
                   "\n### The gate's predictions against measured steps (%s): %u histories of %u "
                   "tokens\n\nRates: %s; weights %.2f GB. Rest = what the gate leaves out "
                   "(launches, small kernels, the host): a step over 256-token histories, %.3f ms, "
                   "less the gate's step for it = %.3f ms; predicted = the gate's step + rest; "
                   "staged through a %u GiB pool. Copies: the staged copies' device time a step "
                   "(the H2D queue's, from the stage's receipts).\n\n| placement | measured ms | "
                   "predicted ms | predicted / measured | MiB staged | copies ms |\n"
                   "|---|---|---|---|---|---|\n",
                   info.name, B, ctx, rates.source, wb / 1e9, base_ms, rest_ms, sgib);
        char timeline[8192] = "";
        for (uint32_t i = 0; i < AKV_GATE_PLACEMENTS; i++) {
            const akv_gate_placement pl = akv_gate_placement_at(i);
            const bool staged = strcmp(akv_route_kind_name(pl.kind), "staged") == 0;
            const char *only = getenv("AKV_BENCH_D_ONLY"); /* a route kind's placements alone */
            if (only && *only && strcmp(only, akv_route_kind_name(pl.kind))) continue;
            if (!bset_open(&b, dev, &c, pl.kind, pl.tier, B, ctx, 20, staged ? sgib : 0, par)) {
                bench_emit(out, "| %s %s | does not fit | | |\n", akv_route_kind_name(pl.kind),
                           akv_repr_name(pl.tier));
                bset_close(&b);
                continue;
            }
            bset_run(&b, f, 8, NULL, 0, false);
            const uint64_t window = !staged                    ? 0
                                    : pl.tier == AKV_REPR_EXACT ? (uint64_t)b.target * g.page_tokens
                                    : (uint64_t)akv_route_get_params(b.r).compact_target * g.page_tokens;
            const akv_gate_option o = akv_gate_predict(&rates, &g, pl.kind, pl.tier, B, ctx, 256, window, wb);
            const double pred = rest_ms + o.step_s * 1e3;
            bench_emit(out, "| %s %s | %.3f | %.3f | %.3f | %.1f | %.3f |\n",
                       akv_route_kind_name(pl.kind), akv_repr_name(pl.tier), b.step_ms, pred,
                       pred / b.step_ms, b.staged_per_step / (1u << 20), b.copy_ms);
            if (staged) { /* where the last step's time went, layer by layer (the stage's events) */
                TRY(akv_route_sync(b.r)); /* its leases retired: their receipts */
                akv_route_layer_times lt[128];
                const uint32_t L = akv_route_step_times(b.r, lt, 128);
                if (L && L <= 128) timeline_note(timeline, sizeof timeline, pl, lt, L);
            }
            bset_close(&b);
        }
        if (*timeline)
            bench_emit(out, "\nThe last step of each staged placement, from the stage's events (device "
                            "time): the copies' span from the first layer's first copy to the last "
                            "layer's fence, the bus busy in it, idle between layers (and the longest "
                            "gap), how long each layer's attention started after its copies on average, "
                            "and the last attention's end after the last copy.\n\n%s", timeline);
    }
    if (strchr(parts, 'S')) {
        /* The staged compact route against the staged exact one: one history of 32K, 64K and
         * 128K tokens decoding through AKV_BENCH_S_GIB (2) GiB of device pool: staged exact
         * (its window and its staging reserve in that pool) against staged q8 and q4 (a
         * compact pool of that size: its staging reserve, then the newest compact pages; the
         * exact part, the sink and the last 256 tokens, beside it). Ratio = step / the staged
         * exact step at that context; bus = bytes staged a step / the large-copy rate.
         * Goal at 128K: q4 at most 0.35. */
        const uint32_t sgib = (uint32_t)akv_test_env_int("AKV_BENCH_S_GIB", 1, 64, 2);
        bench_emit(out,
                   "\n### The staged compact route against the staged exact one (%s): one history "
                   "through %u GiB\n\nStaged exact: its window and staging reserve in a %u GiB "
                   "pool. Staged q8 / q4: a %u GiB compact pool (its staging reserve, then the "
                   "newest compact pages), the exact part (the sink and the last 256 tokens) beside "
                   "it, every older page staged from its compact copy on the host. Host->device "
                   "large-copy rate (same run): **%.1f GB/s**; copies = the staged copies' device time a "
                   "step (the stage's receipts). Bit-identical: each step's logits "
                   "against the same history and tokens on the resident route with that tier.\n\n"
                   "| context | tier | staged GiB/step | bus ms | copies ms | step ms | step / bus | "
                   "step / staged exact | bit-identical to resident |\n"
                   "|---|---|---|---|---|---|---|---|---|\n",
                   info.name, sgib, sgib, sgib, bus_bps / 1e9);
        const uint32_t ctxs[] = {32768, 65536, 131072};
        const akv_repr tiers[] = {AKV_REPR_EXACT, AKV_REPR_Q8, AKV_REPR_Q4};
        enum { S_STEPS = 8 };
        float *ls[S_STEPS], *lr[S_STEPS]; /* the staged run's logits, the resident tier's */
        for (int k = 0; k < S_STEPS; k++)
            ls[k] = malloc(c.n_vocab * sizeof(float)), lr[k] = malloc(c.n_vocab * sizeof(float));
        for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0]; i++) {
            double exact_ms = NAN;
            for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
                bset b;
                if (!bset_open(&b, dev, &c, bench_kind("staged"), tiers[t], 1, ctxs[i], 12, sgib, par)) {
                    bench_emit(out, "| %u | %s | does not fit | | | | | | |\n", ctxs[i], akv_repr_name(tiers[t]));
                    bset_close(&b);
                    continue;
                }
                bset_run(&b, f, S_STEPS, ls, S_STEPS, false);
                if (t == 0) exact_ms = b.step_ms;
                const double bus_ms = b.staged_per_step / bus_bps * 1e3, step_ms = b.step_ms,
                             staged = b.staged_per_step, copy_ms = b.copy_ms;
                bset_close(&b);
                /* the same history and tokens on the resident route with the same tier: every
                 * step's logits bit for bit */
                char same[48] = "-";
                if (t > 0 && bset_open(&b, dev, &c, bench_kind("resident"), tiers[t], 1, ctxs[i], 12, 0, par)) {
                    bset_run(&b, f, S_STEPS, lr, S_STEPS, false);
                    uint32_t n_same = 0;
                    for (int k = 0; k < S_STEPS; k++) n_same += !memcmp(ls[k], lr[k], c.n_vocab * sizeof(float));
                    snprintf(same, sizeof same, "%u of %u steps", n_same, S_STEPS);
                }
                bset_close(&b);
                bench_emit(out, "| %u | %s | %.2f | %.1f | %.1f | %.1f | %.3f | %.3f | %s |\n", ctxs[i],
                           akv_repr_name(tiers[t]), staged / (1u << 30), bus_ms, copy_ms, step_ms,
                           bus_ms > 0 ? step_ms / bus_ms : NAN, step_ms / exact_ms, same);
            }
        }
        for (int k = 0; k < S_STEPS; k++) free(ls[k]), free(lr[k]);
    }
    if (strchr(parts, 'R')) {
        akv_forward_dev_destroy(f); /* the engine's weights and pools in its place */
        f = NULL;
        part_r(&c, bus_bps, token_bytes, info.name, out);
    }
    if (strchr(parts, 'C')) {
        /* AKV_BENCH_C_NEW: new tokens each (16); AKV_BENCH_C_GIB: the pool (5); AKV_BENCH_C_STAGED=0
         * leaves the staged run out (at 1024 new tokens it stages 4 x 4 GiB every step) */
        const uint32_t ctx = 32768;
        const uint32_t n_new = getenv("AKV_BENCH_C_NEW") ? (uint32_t)atoi(getenv("AKV_BENCH_C_NEW")) : 16;
        const uint32_t gib = getenv("AKV_BENCH_C_GIB") ? (uint32_t)atoi(getenv("AKV_BENCH_C_GIB")) : 5;
        const bool staged = !(getenv("AKV_BENCH_C_STAGED") && strcmp(getenv("AKV_BENCH_C_STAGED"), "0") == 0);
        /* the weights and the pools must fit beside each other once: the model of part A is
         * freed first */
        akv_forward_dev_destroy(f);
        f = NULL;
        crun runs[5];
        const char *names[5] = {"queue (resident exact, one at a time)", "together, staged exact",
                                "together, resident q4 tier", "the gate's choice (--kv-tier auto)",
                                "together, staged q4 tier"};
        bench_emit(out,
                   "\n### 4 conversations of 32K on a pool that holds one exact history (%u GiB device "
                   "pool, %s)\n\nThrough the engine: prompts of %u random tokens (prefilled in chunks "
                   "of 1024), %u new tokens each, submitted at once. Queue = resident route, one "
                   "at a time (the others wait); together = all four in every step, staged (exact "
                   "pages through the bus) or resident with the q4 tier (pages older than the last "
                   "256 tokens in 4.5 bits; the exact window and the compact pool share the GiB), "
                   "staged with the q4 tier (compact copies on the host, the newest compact pages in "
                   "the pool, the rest staged), or as the gate "
                   "chooses (up to 4 at once; its default rates). "
                   "Wait = submit to first token; done = submit to last token; wall = the whole job "
                   "(its ratio to the queue's); generated tok/s = every generated token over the time from "
                   "the first first token to the last token (later prompts' prefills inside it).\n\n"
                   "| configuration | wall s | / queue | generated tok/s "
                   "| wait s (1st, 4th) | done s (4th) |\n|---|---|---|---|---|---|\n",
                   gib, info.name, ctx, n_new);
        /* each row as its run ends (a run cut short by a time limit keeps the rows before it) */
        memset(runs, 0, sizeof runs);
        for (int k = 0; k < 5; k++) {
            if (k == 1 && !staged) {
                bench_emit(out, "| %s | not run (AKV_BENCH_C_STAGED=0) | | | | |\n", names[k]);
                continue;
            }
            static const akv_repr tiers[5] = {AKV_REPR_EXACT, AKV_REPR_EXACT, AKV_REPR_Q4,
                                              AKV_ENGINE_TIER_AUTO, AKV_REPR_Q4};
            runs[k] = part_c_run(&c, bench_kind(k == 1 || k == 4 ? "staged" : "resident"), tiers[k],
                                 k ? 4 : 1, ctx, n_new, gib);
            if (!runs[k].ran) {
                bench_emit(out, "| %s | does not fit the pool | | | | |\n", names[k]);
                continue;
            }
            const creq *r = runs[k].r;
            bench_emit(out, "| %s%s | %.2f | %.3f | %.1f | %.2f, %.2f | %.2f |\n", names[k], runs[k].chose, runs[k].wall_s,
                       runs[0].ran ? runs[k].wall_s / runs[0].wall_s : NAN, runs[k].agg_decode,
                       r[0].info.t_first - r[0].info.t_submit, r[3].info.t_first - r[3].info.t_submit,
                       r[3].info.t_done - r[3].info.t_submit);
        }
    }
    if (out) fclose(out);
    for (uint32_t i = 0; ref && i < n_b_steps; i++) free(ref[i]), free(stg[i]);
    free(ref), free(stg), free(pattern);
    akv__par_destroy(par);
    akv_forward_dev_destroy(f);
    TRY(akv_dev_destroy(dev));
    return 0;
}
