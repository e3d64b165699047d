/*
 * bench_attn.c (bench) — the CUDA attention kernels on the GPU, against the device-copy rate
 * and against PyTorch's scaled_dot_product_attention, all measured in the same run.
 *
 * Decode: 1K..128K keys at batch 1, and batch 8 and 32 at 4K..32K, for GQA 32/8 d=128
 * (Llama-3-8B-like, P=64) and SmolLM2's 9/3 d=64 (P=256); one query per sequence (plus a
 * few 4-query rows). Pages are scattered at random over a 4+ GiB pool, and each timed call
 * uses the next of enough page tables that the bytes read exceed the L2 several times
 * (real decode reads each layer's K/V once per step). Achieved bandwidth = K/V bytes read /
 * time, as a ratio of the device-copy rate (bytes read + written by a 1 GiB
 * device-to-device copy). Prefill: one sequence of 4K..32K tokens, causal, its K/V written
 * into the pages by the same call, against PyTorch's flash backend; each prefill kernel
 * (akv_attn_prefill.kernel: mma, and wgmma where it runs) in turn. AKV_BENCH_ATTN_PREFILL=1
 * measures the prefill table only.
 *
 * Timing: each piece of work is captured n times into a CUDA graph and the graph replays
 * are timed with events (median); PyTorch is timed the same way by bench/attn_torch.py,
 * which this program runs first (python3, or $AKV_PYTHON). Results: a markdown table on
 * stdout and appended to $AKV_BENCH_OUT when set. AKV_BENCH_ATTN_VARIANTS=all (or "0,2")
 * prints one decode table per decode variant (akv/attn.h), each over the same page tables,
 * against one PyTorch run. AKV_BENCH_HOST=1 also prints, per decode row, the launcher's
 * host time per eager call (planning, checks, launch; no graph). Decode calls prefetch their
 * history (akv_attn_decode.prefetch_history) unless AKV_BENCH_PREFETCH=0. AKV_BENCH_PAGES=order
 * places each history on consecutive pages instead of scattering them; AKV_BENCH_PAGE_TOKENS=P0:P1
 * sets the two geometries' page sizes (placement experiments).
 */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/dev_cuda.h"
#include "core/assert.h"
#include "core/clock.h"
#include "core/half.h"

#define AKV_BENCH_NAME "bench_attn"
#include "bench_try.h"
#include "bench_peer.h"
#include "bench_copy_rate.h"

#define POOL_BYTES ((size_t)4608 << 20) /* 4.5 GiB: batch 32 x 32K keys x 4 KiB per token */
#define L2_DEFEAT_BYTES ((size_t)256 << 20)
#define MAX_CFG 64

typedef struct geom {
    const char *name;
    uint32_t hq, hkv, d, page_tokens;
} geom;

/* The decode's tuning (bench_attn_tuning: the environment's A/B settings); each variant
 * measured sets its .variant. */
static akv_attn_tuning bench_tune;

static geom GEOMS[2] = {{"32/8 d128", 32, 8, 128, 64}, {"9/3 d64", 9, 3, 64, 256}};

typedef struct torch_row {
    char kind;
    uint32_t hq, hkv, d, b, n;
    double us, us_best;
    char how[32];
} torch_row;

static torch_row torch_rows[MAX_CFG * 2];
static int n_torch;
static akv_dev *dev;
static akv_dptr pool;
static uint64_t rng_state = 0x6a09e667f3bcc909ull;

static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static akv_dptr dalloc(size_t n) {
    akv_dptr d;
    TRY(akv_dev_mem_alloc(dev, n, &d));
    return d;
}

/* Random bf16 in [-1, 1) on the device (a 16 MiB host pattern, repeated). */
static void fill_random(akv_dptr d, size_t n_bytes) {
    size_t chunk = (size_t)16 << 20;
    uint16_t *h = malloc(chunk);
    for (size_t i = 0; i < chunk / 2; i++) h[i] = akv_f32_to_bf16((float)((rnd() >> 11) * 0x1p-53 * 2 - 1));
    for (size_t off = 0; off < n_bytes; off += chunk)
        TRY(akv_dev_copy_h2d_sync(dev, akv_dptr_offset(d, off), h, n_bytes - off < chunk ? n_bytes - off : chunk));
    free(h);
}

static void run_torch(char **cfgs, int n_cfg) {
    char args[7168] = "";
    for (int i = 0, len = 0; i < n_cfg && len >= 0 && len < (int)sizeof args - 64; i++)
        len += snprintf(args + len, sizeof args - len, " %s", cfgs[i]);
    FILE *p = bench_peer_open("attn_torch.py", args);
    if (!p) return;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        torch_row r = {0};
        if (sscanf(line, "decode %u %u %u %u %u %lf %lf %31s", &r.hq, &r.hkv, &r.d, &r.b, &r.n, &r.us, &r.us_best, r.how) == 8) {
            r.kind = 'd';
        } else if (sscanf(line, "prefill %u %u %u %u %lf %31s", &r.hq, &r.hkv, &r.d, &r.n, &r.us, r.how) == 6) {
            r.kind = 'p', r.b = 1, r.us_best = r.us;
        } else {
            printf("torch: %s", line); /* notes and errors, as they are */
            continue;
        }
        if (n_torch < (int)(sizeof torch_rows / sizeof torch_rows[0])) torch_rows[n_torch++] = r;
    }
    bench_peer_close(p, "attn_torch.py");
}

static const torch_row *torch_find(char kind, const geom *g, uint32_t b, uint32_t n) {
    for (int i = 0; i < n_torch; i++) {
        const torch_row *r = &torch_rows[i];
        if (r->kind == kind && r->hq == g->hq && r->hkv == g->hkv && r->d == g->d && r->b == b && r->n == n) return r;
    }
    return NULL;
}

/* ---- decode ------------------------------------------------------------------------------ */

typedef struct dec_work {
    akv_attn_decode p[64]; /* one per page-table set */
    int n_sets, next;
    akv_dptr ws;
    size_t ws_bytes;
} dec_work;

static akv_status dec_issue(void *arg, void *stream) {
    dec_work *w = arg;
    akv_status st = akv_attn_cuda_decode(&w->p[w->next], w->ws, w->ws_bytes, stream);
    w->next = (w->next + 1) % w->n_sets;
    return st;
}

/* The representation of the decode's pages (akv/kv_repr.h): exact, or the compact table's. */
static akv_repr bench_repr = AKV_REPR_EXACT;

static size_t page_bytes_of(const geom *g) {
    akv_repr_layout l;
    AKV_ASSERT(akv_repr_layout_of(bench_repr, AKV_DTYPE_BF16, g->hkv, g->page_tokens, g->d, &l) == AKV_OK);
    return l.page_bytes;
}

/* Whether decode calls prefetch their history (akv_attn_decode.prefetch_history), as the forward
 * pass's do: AKV_BENCH_PREFETCH=0 turns it off. The kernel before each timed call is the previous
 * call, which writes no page and no table, so the promise holds. */
static bool bench_prefetch(void) {
    const char *e = getenv("AKV_BENCH_PREFETCH");
    return !(e && strcmp(e, "0") == 0);
}

/* Random distinct page ids of the pool (a prefix of a shuffled permutation); with
 * AKV_BENCH_PAGES=order, consecutive ids instead (each sequence's history one contiguous run, as
 * a dense tensor holds it: the placement's own cost, measured against the scattered default). */
static int32_t *random_pages(uint32_t n_pool_pages, uint32_t n) {
    int32_t *perm = malloc((size_t)n_pool_pages * sizeof *perm);
    for (uint32_t i = 0; i < n_pool_pages; i++) perm[i] = (int32_t)i;
    const char *order = getenv("AKV_BENCH_PAGES");
    if (order && strcmp(order, "order") == 0) return perm;
    for (uint32_t i = 0; i < n && i < n_pool_pages; i++) {
        uint32_t j = i + (uint32_t)(rnd() % (n_pool_pages - i));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    return perm;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* AKV_BENCH_TIMELINE=1 with a profiling build (cmake -DAKV_ATTN_TIMELINE=ON): where the last
 * timed call's time went, from its per-block stamps (akv_attn_cuda_decode_timeline), in µs:
 * when the last block started (after the first), a block's wait for its first key tile and
 * its key loop (median / max), and the phases of the block that ended last (when its key loop
 * ended, its state write, arrival count and merge), with its end. AKV_BENCH_TIMELINE_DUMP
 * names a file to append every block's stamps to. */
static void decode_timeline(double call_us) {
    static akv_attn_timeline_block tl[16384];
    static uint64_t first[16384], loop[16384];
    uint32_t n = 0;
    TRY(akv_attn_cuda_decode_timeline(tl, 16384, &n));
    if (n > 16384) n = 16384;
    uint64_t t0 = UINT64_MAX, start_max = 0, end = 0;
    uint32_t n_act = 0, n_first = 0, last = 0;
    for (uint32_t i = 0; i < n; i++) t0 = tl[i].ns[0] < t0 ? tl[i].ns[0] : t0;
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t *t = tl[i].ns;
        if (t[3] == 0) continue; /* an empty partition: returned at once */
        if (t[0] > start_max) start_max = t[0];
        if (t[1]) first[n_first] = t[1] - t[0], loop[n_first++] = t[2] - t[1];
        uint64_t e = t[5] ? t[5] : t[4] ? t[4] : t[3];
        if (e > end) end = e, last = i;
        n_act++;
    }
    /* AKV_BENCH_TIMELINE_DUMP=file: every block's stamps appended (block, SM, the 6 stamps in
     * ns from the first block's start, -1 = not reached), for offline analysis */
    const char *dump = getenv("AKV_BENCH_TIMELINE_DUMP");
    FILE *df = dump && *dump ? fopen(dump, "a") : NULL;
    if (dump && *dump && !df) fprintf(stderr, "timeline: cannot open %s\n", dump);
    if (df) {
        fprintf(df, "# call %.2f us; block smid ns0..ns5\n", call_us);
        for (uint32_t i = 0; i < n; i++) {
            fprintf(df, "%u %u", i, tl[i].smid);
            for (int j = 0; j < 6; j++) fprintf(df, " %lld", tl[i].ns[j] ? (long long)(tl[i].ns[j] - t0) : -1LL);
            fputc('\n', df);
        }
        fclose(df);
    }
    if (!n_act) return;
    qsort(first, n_first, sizeof first[0], cmp_u64);
    qsort(loop, n_first, sizeof loop[0], cmp_u64);
    /* the block that ended last: its phases */
    const uint64_t *t = tl[last].ns;
    const double lw = t[3] > t[2] ? (t[3] - t[2]) / 1e3 : 0, lc = t[4] > t[3] ? (t[4] - t[3]) / 1e3 : 0,
                 lm = t[5] > t[4] ? (t[5] - t[4]) / 1e3 : 0;
    printf("    timeline (%u of %u blocks ran): last start %.2f, first tile %.2f / %.2f, key loop %.2f / %.2f; "
           "last block: loop end %.2f, write %.2f, count %.2f, merge %.2f, end %.2f µs; call %.2f µs\n",
           n_act, n, (start_max - t0) / 1e3, n_first ? first[n_first / 2] / 1e3 : 0.0,
           n_first ? first[n_first - 1] / 1e3 : 0.0, n_first ? loop[n_first / 2] / 1e3 : 0.0,
           n_first ? loop[n_first - 1] / 1e3 : 0.0, (t[2] - t0) / 1e3, lw, lc, lm, (end - t0) / 1e3, call_us);
}

/* The call's time in µs; *split and *cluster (its cluster size, 1 = workspace merge) as launched. */
static double bench_decode(const geom *g, uint32_t b, uint32_t n, uint32_t nq, akv_attn_split *split,
                           uint32_t *cluster) {
    size_t pb = page_bytes_of(g);
    uint32_t n_pool_pages = (uint32_t)(POOL_BYTES / pb), np = n / g->page_tokens;
    size_t set_bytes = (size_t)b * np * pb;
    int n_sets = (int)((L2_DEFEAT_BYTES + set_bytes - 1) / set_bytes);
    if (n_sets > 64) n_sets = 64;
    if ((uint64_t)n_sets * b * np > n_pool_pages) n_sets = (int)(n_pool_pages / ((uint64_t)b * np));
    if (n_sets < 1) return NAN;
    int32_t *ids = random_pages(n_pool_pages, (uint32_t)n_sets * b * np);
    /* per set: indptr [b+1], indices [b*np], last [b] in one device array */
    size_t per_set = (size_t)(b + 1) + (size_t)b * np + b;
    int32_t *tab = malloc(per_set * n_sets * sizeof *tab);
    for (int s = 0; s < n_sets; s++) {
        int32_t *t = tab + per_set * s;
        for (uint32_t i = 0; i <= b; i++) t[i] = (int32_t)(i * np);
        memcpy(t + b + 1, ids + (size_t)s * b * np, (size_t)b * np * sizeof *t);
        for (uint32_t i = 0; i < b; i++) t[b + 1 + (size_t)b * np + i] = (int32_t)g->page_tokens;
    }
    akv_dptr tab_d = dalloc(per_set * n_sets * 4);
    TRY(akv_dev_copy_h2d_sync(dev, tab_d, tab, per_set * n_sets * 4));
    size_t q_elems = (size_t)b * nq * g->hq * g->d;
    akv_dptr q = dalloc(q_elems * 2), o = dalloc(q_elems * 2);
    fill_random(q, q_elems * 2);
    dec_work *w = calloc(1, sizeof *w);
    w->n_sets = n_sets;
    for (int s = 0; s < n_sets; s++) {
        akv_dptr t = akv_dptr_offset(tab_d, per_set * s * 4);
        akv_attn_decode p = {
            .kv = {.pool = pool, .indptr = t, .indices = akv_dptr_offset(t, (b + 1) * 4),
                   .last_page_len = akv_dptr_offset(t, ((b + 1) + (size_t)b * np) * 4), .n_seq = b,
                   .n_pages = n_pool_pages, .max_pages = np, .n_kv_heads = g->hkv, .head_dim = g->d,
                   .page_tokens = g->page_tokens, .dtype = AKV_DTYPE_BF16, .repr = bench_repr},
            .n_heads = g->hq, .n_query = nq, .q = q, .q_dtype = AKV_DTYPE_BF16, .o = o, .o_dtype = AKV_DTYPE_BF16,
            .prefetch_history = bench_prefetch(),
            .tuning = bench_tune,
        };
        w->p[s] = p;
    }
    TRY(akv_attn_cuda_decode_split(&w->p[0], split));
    TRY(akv_attn_cuda_decode_cluster_size(&w->p[0], cluster));
    TRY(akv_attn_decode_workspace_bytes(&w->p[0], split, &w->ws_bytes));
    if (w->ws_bytes) { /* zeroed once: the decode keeps its arrival counters at zero */
        w->ws = dalloc(w->ws_bytes);
        TRY(akv_dev_memset_sync(dev, w->ws, 0, w->ws_bytes));
    }
    int n_calls = n_sets;
    while (n_calls < 40) n_calls += n_sets;
    double us = NAN;
    TRY(akv_dev_cuda_time_us(dec_issue, w, n_calls, 15, &us));
    const char *tl = getenv("AKV_BENCH_TIMELINE");
    if (tl && *tl == '1') decode_timeline(us);
    const char *host = getenv("AKV_BENCH_HOST");
    if (host && *host == '1') {
        /* the launcher's host time: eager calls on the default stream, timed on the host
         * (planning, checks and the launch itself; the device runs behind them) */
        enum { N_HOST = 200 };
        double t0 = akv_clock_s();
        for (int i = 0; i < N_HOST; i++) TRY(dec_issue(w, NULL));
        double host_us = (akv_clock_s() - t0) / N_HOST * 1e6;
        TRY(akv_dev_sync(dev));
        printf("    host: %.2f µs per eager call (%d calls)\n", host_us, N_HOST);
    }
    if (w->ws_bytes) TRY(akv_dev_mem_free(dev, w->ws));
    TRY(akv_dev_mem_free(dev, q));
    TRY(akv_dev_mem_free(dev, o));
    TRY(akv_dev_mem_free(dev, tab_d));
    free(w), free(tab), free(ids);
    return us;
}

/* ---- prefill ----------------------------------------------------------------------------- */

static akv_status pf_issue(void *arg, void *stream) {
    return akv_attn_cuda_prefill(arg, stream);
}

static double bench_prefill(const geom *g, uint32_t n, akv_attn_prefill_kernel kernel) {
    size_t pb = page_bytes_of(g);
    uint32_t n_pool_pages = (uint32_t)(POOL_BYTES / pb), np = n / g->page_tokens;
    int32_t *ids = random_pages(n_pool_pages, np);
    int32_t *tab = malloc((np + 5) * sizeof *tab);
    tab[0] = 0, tab[1] = (int32_t)np;
    memcpy(tab + 2, ids, np * sizeof *tab);
    tab[2 + np] = (int32_t)g->page_tokens;
    tab[3 + np] = 0, tab[4 + np] = (int32_t)n; /* qo_indptr */
    akv_dptr tab_d = dalloc((np + 5) * 4);
    TRY(akv_dev_copy_h2d_sync(dev, tab_d, tab, (np + 5) * 4));
    size_t q_elems = (size_t)n * g->hq * g->d, kv_elems = (size_t)n * g->hkv * g->d;
    akv_dptr q = dalloc(q_elems * 2), o = dalloc(q_elems * 2), k = dalloc(kv_elems * 2), v = dalloc(kv_elems * 2);
    fill_random(q, q_elems * 2), fill_random(k, kv_elems * 2), fill_random(v, kv_elems * 2);
    akv_attn_prefill p = {
        .kv = {.pool = pool, .indptr = tab_d, .indices = akv_dptr_offset(tab_d, 8),
               .last_page_len = akv_dptr_offset(tab_d, (2 + (size_t)np) * 4), .n_seq = 1, .n_pages = n_pool_pages,
               .max_pages = np, .n_kv_heads = g->hkv, .head_dim = g->d, .page_tokens = g->page_tokens,
               .dtype = AKV_DTYPE_BF16},
        .n_heads = g->hq, .qo_indptr = akv_dptr_offset(tab_d, (3 + (size_t)np) * 4), .n_tokens = n, .max_chunk = n,
        .q = q, .q_dtype = AKV_DTYPE_BF16, .k_new = k, .v_new = v, .kv_new_dtype = AKV_DTYPE_BF16,
        .o = o, .o_dtype = AKV_DTYPE_BF16, .kernel = kernel,
    };
    double us = NAN;
    TRY(akv_dev_cuda_time_us(pf_issue, &p, 3, 7, &us));
    TRY(akv_dev_mem_free(dev, q));
    TRY(akv_dev_mem_free(dev, o));
    TRY(akv_dev_mem_free(dev, k));
    TRY(akv_dev_mem_free(dev, v));
    TRY(akv_dev_mem_free(dev, tab_d));
    free(tab), free(ids);
    return us;
}

/* Whether this build and device run the wgmma prefill kernel (akv/attn.h). */
static bool bench_have_wgmma(const akv_dev_info *info) {
#ifdef AKV_CUDA_WGMMA
    return info->cc_major == 9;
#else
    (void)info;
    return false;
#endif
}

/* ---- main -------------------------------------------------------------------------------- */

/* The decode variants to measure, as akv_attn_tuning.variant values: AKV_BENCH_ATTN_VARIANTS
 * = "all" or a list of digits ("0,2"); unset or empty: the tuning's (AUTO unless
 * AKV_ATTN_DECODE_VARIANT forces one). */
static int bench_variants(uint32_t out[AKV_ATTN_DECODE_VARIANTS]) {
    const char *e = getenv("AKV_BENCH_ATTN_VARIANTS");
    int n = 0;
    if (e && strcmp(e, "all") == 0) {
        for (uint32_t v = 0; v < AKV_ATTN_DECODE_VARIANTS; v++) out[n++] = AKV_ATTN_VARIANT(v);
        return n;
    }
    for (; e && *e && n < AKV_ATTN_DECODE_VARIANTS; e++) {
        uint32_t v = (uint32_t)(*e - '0');
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= out[i] == AKV_ATTN_VARIANT(v);
        if (*e >= '0' && v < AKV_ATTN_DECODE_VARIANTS && !seen) out[n++] = AKV_ATTN_VARIANT(v);
    }
    if (n == 0) out[n++] = bench_tune.variant;
    return n;
}

typedef struct dcfg {
    int g;
    uint32_t b, n, nq;
} dcfg;

/* The compact decode table (AKV_BENCH_ATTN_COMPACT=1): the same histories read as exact bf16,
 * q8 and q4 pages by the decode kernel, one query per sequence, 32/8 d128 (Llama-3-8B's
 * attention) at 8K..128K keys, batch 1 and 8; each form's time as a ratio of the exact
 * kernel's in the same run, against the goal bits/16 + 0.1 (the bytes it stops reading, plus
 * a tenth for the decoding), and each form's read rate (its own page bytes / time) as a ratio
 * of the device-copy rate. Page contents are random bytes (the kernel's work does not depend
 * on them). */
static int bench_compact(const akv_dev_info *info) {
    double copy_gbs = bench_copy_rate_bps(dev, (size_t)1 << 30) / 1e9;
    pool = dalloc(POOL_BYTES);
    fill_random(pool, POOL_BYTES);
    FILE *f = bench_out_open();
    const geom *g = &GEOMS[0];
    double bits[AKV_REPR_COUNT];
    for (int r = 0; r < AKV_REPR_COUNT; r++) bits[r] = akv_repr_bits((akv_repr)r, AKV_DTYPE_BF16, g->d);
    bench_emit(f, "\n### Compact decode (%s, %d SMs): exact, q8 and q4 pages, %s P=%u\n\n", info->name,
               info->n_sm, g->name, g->page_tokens);
    bench_emit(f, "Device copy rate (1 GiB device-to-device, read + written): **%.0f GB/s**. Goals: q8 %.3f, q4 "
                  "%.3f of the exact kernel's time (bits/16 + 0.1).\n\n",
               copy_gbs, bits[AKV_REPR_Q8] / 16 + 0.1, bits[AKV_REPR_Q4] / 16 + 0.1);
    bench_emit(f, "| batch | keys | exact µs | / copy rate | q8 µs | q8 / exact | / copy rate | q4 µs | q4 / exact | / copy "
                  "rate |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const uint32_t rows[][2] = {{1, 8192}, {1, 32768}, {1, 65536}, {1, 131072}, {8, 8192}, {8, 32768}, {8, 131072}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double us[AKV_REPR_COUNT], rate[AKV_REPR_COUNT];
        for (int r = 0; r < AKV_REPR_COUNT; r++) {
            bench_repr = (akv_repr)r;
            akv_attn_split sp;
            uint32_t cl;
            us[r] = bench_decode(g, rows[i][0], rows[i][1], 1, &sp, &cl);
            const double bytes = (double)rows[i][0] * (rows[i][1] / g->page_tokens) * page_bytes_of(g);
            rate[r] = bytes / us[r] / 1e3 / copy_gbs;
        }
        bench_repr = AKV_REPR_EXACT;
        bench_emit(f, "| %u | %u | %.1f | %.3f | %.1f | %.3f | %.3f | %.1f | %.3f | %.3f |\n", rows[i][0], rows[i][1],
                   us[0], rate[0], us[1], us[1] / us[0], rate[1], us[2], us[2] / us[0], rate[2]);
        fflush(stdout);
    }
    if (f) fclose(f);
    TRY(akv_dev_mem_free(dev, pool));
    TRY(akv_dev_destroy(dev));
    return 0;
}

int main(void) {
    akv_dev_info info;
    dev = bench_cuda_or_skip(&info);
    bench_tune = bench_attn_tuning();
    /* AKV_BENCH_PAGE_TOKENS = "P0:P1": other page sizes for the two geometries (powers of two) */
    const char *pt = getenv("AKV_BENCH_PAGE_TOKENS");
    unsigned p0 = 0, p1 = 0;
    if (pt && *pt) {
        if (sscanf(pt, "%u:%u", &p0, &p1) != 2 || !p0 || !p1 || (p0 & (p0 - 1)) || (p1 & (p1 - 1)) || p0 > 1024 ||
            p1 > 1024) {
            fprintf(stderr, "bench_attn: AKV_BENCH_PAGE_TOKENS=%s: want P0:P1, powers of two up to 1024\n", pt);
            return 2;
        }
        GEOMS[0].page_tokens = p0, GEOMS[1].page_tokens = p1;
    }
    dcfg dc[MAX_CFG];
    int n_dc = 0, n_pf_geoms = 2;
    const uint32_t b1_lens[5] = {1024, 4096, 8192, 32768, 131072}, bn_lens[4] = {4096, 8192, 16384, 32768};
    for (int g = 0; g < 2; g++) {
        for (int i = 0; i < 5; i++) dc[n_dc++] = (dcfg){g, 1, b1_lens[i], 1};
        for (uint32_t b = 8; b <= 32; b *= 4)
            for (int i = 0; i < 4; i++) dc[n_dc++] = (dcfg){g, b, bn_lens[i], 1};
        dc[n_dc++] = (dcfg){g, 1, 32768, 4};
        dc[n_dc++] = (dcfg){g, 8, 32768, 4};
    }
    const uint32_t pf_lens[4] = {4096, 8192, 16384, 32768};
    /* AKV_BENCH_ATTN_ONLY = "G:B:N:Q[,G:B:N:Q...]" (geometry 0 = 32/8 d128, 1 = 9/3 d64; batch;
     * keys; queries): only those decode rows, no PyTorch and no prefill (profiling one
     * configuration, e.g. under ncu) */
    const char *only = getenv("AKV_BENCH_ATTN_ONLY");
    const bool only_some = only && *only;
    if (only_some) {
        char list[512];
        snprintf(list, sizeof list, ",%s,", only); /* each key then sits between commas */
        int kept = 0;
        for (int i = 0; i < n_dc; i++) {
            char key[48];
            snprintf(key, sizeof key, ",%d:%u:%u:%u,", dc[i].g, dc[i].b, dc[i].n, dc[i].nq);
            if (strstr(list, key)) dc[kept++] = dc[i];
        }
        n_dc = kept;
        n_pf_geoms = 0;
    }
    /* AKV_BENCH_ATTN_COMPACT=1: the compact decode table only */
    const char *compact_only = getenv("AKV_BENCH_ATTN_COMPACT");
    if (compact_only && strcmp(compact_only, "1") == 0) return bench_compact(&info);
    /* AKV_BENCH_ATTN_PREFILL=1: the prefill table only (no decode rows) */
    const char *pf_only = getenv("AKV_BENCH_ATTN_PREFILL");
    if (pf_only && strcmp(pf_only, "1") == 0) n_dc = 0;
    /* PyTorch first, before this process takes its 5 GiB */
    char *cfgs[MAX_CFG * 2];
    int n_cfg = 0;
    for (int i = 0; i < n_dc; i++) {
        if (dc[i].nq != 1) continue;
        const geom *g = &GEOMS[dc[i].g];
        cfgs[n_cfg] = malloc(64);
        snprintf(cfgs[n_cfg++], 64, "d:%u:%u:%u:%u:%u", g->hq, g->hkv, g->d, dc[i].b, dc[i].n);
    }
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 4; i++) {
            cfgs[n_cfg] = malloc(64);
            snprintf(cfgs[n_cfg++], 64, "p:%u:%u:%u:%u", GEOMS[g].hq, GEOMS[g].hkv, GEOMS[g].d, pf_lens[i]);
        }
    if (!only_some) run_torch(cfgs, n_cfg);
    for (int i = 0; i < n_cfg; i++) free(cfgs[i]);

    /* the copy rate: 1 GiB device to device, bytes read + written */
    double copy_gbs = bench_copy_rate_bps(dev, (size_t)1 << 30) / 1e9;

    pool = dalloc(POOL_BYTES);
    fill_random(pool, POOL_BYTES);

    FILE *f = bench_out_open();
    bench_emit(f, "\n### Attention kernels (%s, %d SMs): decode\n\n", info.name, info.n_sm);
    bench_emit(f,
               "Device copy rate (1 GiB device-to-device, read + written): **%.0f GB/s**. "
               "PyTorch: `scaled_dot_product_attention(enable_gqa=True)`, default dispatch and the "
               "fastest backend that takes the shape; both timed as CUDA-graph replays with "
               "inputs rotated past L2. Decode history prefetch (akv/attn.h): %s.\n\n",
               copy_gbs, bench_prefetch() ? "on" : "off");
    /* one decode table per variant (AKV_BENCH_ATTN_VARIANTS), the same page tables for each */
    uint32_t variants[AKV_ATTN_DECODE_VARIANTS];
    int n_var = bench_variants(variants);
    const uint64_t rng_decode = rng_state;
    for (int vi = 0; vi < n_var; vi++) {
        bench_tune.variant = variants[vi];
        rng_state = rng_decode;
        if (variants[vi] == AKV_ATTN_VARIANT_AUTO)
            bench_emit(
                f, "\nDecode variant: auto (0 for one sequence, 2 for a batch; akv/attn.h):\n\n");
        else
            bench_emit(f, "\nDecode variant %u (akv/attn.h):\n\n", variants[vi] - 1);
        bench_emit(f, "| geometry | batch | keys | queries | split (parts x keys; cl: cluster merge) | µs | GB/s | / "
                      "copy rate | torch default µs "
                      "| torch best µs (backend) | speed-up vs best |\n");
        bench_emit(f,
                   "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |\n");
        for (int i = 0; i < n_dc; i++) {
            const geom *g = &GEOMS[dc[i].g];
            akv_attn_split sp = {0, 0};
            uint32_t cl = 1;
            double us = bench_decode(g, dc[i].b, dc[i].n, dc[i].nq, &sp, &cl);
            double bytes = (double)dc[i].b * dc[i].n * 2.0 * g->hkv * g->d * 2.0;
            double gbs = bytes / us / 1e3;
            const torch_row *t = dc[i].nq == 1 ? torch_find('d', g, dc[i].b, dc[i].n) : NULL;
            char tdef[32] = "-", tbest[64] = "-", sup[32] = "-";
            if (t) {
                snprintf(tdef, sizeof tdef, "%.1f", t->us);
                snprintf(tbest, sizeof tbest, "%.1f (%s)", t->us_best, t->how);
                snprintf(sup, sizeof sup, "%.2fx", t->us_best / us);
            }
            bench_emit(f, "| %s | %u | %u | %u | %u x %u%s | %.1f | %.0f | %.3f | %s | %s | %s |\n",
                       g->name, dc[i].b, dc[i].n, dc[i].nq, sp.n_parts, sp.part_tokens, cl > 1 ? " cl" : "", us, gbs,
                       gbs / copy_gbs, tdef, tbest, sup);
            fflush(stdout);
        }
    }
    if (n_pf_geoms) {
        bench_emit(f, "\n### Attention kernels: causal prefill (one sequence, K/V written into "
                      "pages by the same call)\n\n");
        bench_emit(
            f, "| geometry | tokens | kernel | µs | TFLOP/s | torch flash µs | speed vs torch flash |\n");
        bench_emit(f, "| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
    }
    /* both kernels where the wgmma one runs (head_dim 128 on an sm_90a build and device) */
    const akv_attn_prefill_kernel pf_kernels[2] = {AKV_ATTN_PREFILL_MMA, AKV_ATTN_PREFILL_WGMMA};
    const char *pf_kname[2] = {"mma", "wgmma"};
    for (int g = 0; g < n_pf_geoms; g++)
        for (int i = 0; i < 4; i++)
            for (int kk = 0; kk < 2; kk++) {
                uint32_t n = pf_lens[i];
                if (pf_kernels[kk] == AKV_ATTN_PREFILL_WGMMA && (GEOMS[g].d != 128 || !bench_have_wgmma(&info)))
                    continue;
                double us = bench_prefill(&GEOMS[g], n, pf_kernels[kk]);
                double flops = 4.0 * GEOMS[g].hq * GEOMS[g].d * (double)n * (n + 1) / 2.0;
                const torch_row *t = torch_find('p', &GEOMS[g], 1, n);
                char tt[48] = "-", sp[32] = "-";
                if (t) {
                    snprintf(tt, sizeof tt, "%.1f (%s)", t->us, t->how);
                    snprintf(sp, sizeof sp, "%.2f", t->us / us);
                }
                bench_emit(f, "| %s | %u | %s | %.1f | %.1f | %s | %s |\n", GEOMS[g].name, n, pf_kname[kk], us,
                           flops / us / 1e6, tt, sp);
                fflush(stdout);
            }
    if (f) fclose(f);
    TRY(akv_dev_mem_free(dev, pool));
    TRY(akv_dev_destroy(dev));
    return 0;
}
