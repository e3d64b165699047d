/* bench_staged.c (bench) — batch-1 decode of the synthetic Llama-3-8B shape (bf16, generated on
 * the device) through the resident and the staged route, with a 4 GiB device pool, at 1K, 8K
 * and 32K tokens of history (128K with AKV_BENCH_LONG=1; AKV_BENCH_LAYERS=N for fewer layers).
 *
 * The history is filled synthetically, not prefilled: one begin_step to the context length
 * without a pass, the host pages and the device pool set to zero (bf16 0.0). A staged prefill
 * in chunks would stage the whole history once per chunk; decode speed does not depend on the
 * values. Then one untimed decode step and N timed ones (begin_step + forward, which waits for
 * the logits; the staged route retires the previous step's leases in begin_step).
 *
 * The resident route needs every page in the pool: where the history does not fit 4 GiB the
 * row says so. For the staged route: bytes staged per step (non-window pages, every layer),
 * the large-copy host->device rate measured in the same run (256 MiB pinned, best of 5), and
 * ratio = step time / (staged bytes / that rate): 1.0 = the step costs only the bus time of
 * its copies (the staged route's goal: <= 1.05). Appends markdown to $AKV_BENCH_OUT. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/forward_dev.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/route.h"
#include "core/clock.h"
#include "llama3_shape.h"
#include "akv/dev_cuda.h"

#define AKV_BENCH_NAME "bench_staged"
#include "bench_try.h"
#include "bench_route.h"

enum { DEVICE_GIB = 4, WINDOW = AKV_ROUTE_WINDOW_PAGES };

typedef struct row {
    int fits;            /* the route could be created in the pool */
    double step_ms;      /* mean decode step */
    double begin_ms;     /* of it, akv_route_begin_step (host: retire, window, tables) */
    double staged_bytes; /* per step (staged route) */
    double host_bytes;   /* per step (host-attended route): attended by the host's cores */
    double host_ms;      /* per step: the host part's computations, summed over layers */
} row;

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
        if (i && t < best) best = t; /* the first one warms up */
    }
    TRY(akv_dev_mem_free(dev, d));
    akv_dev_pinned_free(dev, h);
    return (double)n / best;
}

/* AKV_BENCH_TRACE=1: the route's hooks wrapped to time the last step layer by layer: the host
 * clock when each layer's copies were enqueued, and timing events recorded after the layer's
 * begin on the H2D queue (complete when the layer's copies are) and the D2H queue (when the
 * D2H work enqueued before it is: the earlier layers' write-backs), and after its end on the
 * compute queue (when the layer is done: its host part runs in that queue's order). Intervals per layer against the copy's bus time show
 * whether the bus idled between layers and whether the host issued late; the three queues'
 * times from the step's first event show which of copies, host part and compute each layer
 * waited on. */
enum { TRACE_MAX = 64 };
typedef struct trace {
    akv_kv_hooks inner;
    akv_dev *dev;
    int on;
    uint32_t n;
    uint64_t host_ns[TRACE_MAX];
    akv_event *base;                                   /* compute queue, layer 0's begin */
    akv_event *ev[TRACE_MAX], *ev_d2h[TRACE_MAX], *ev_cmp[TRACE_MAX];
} trace;

static akv_status trace_begin(void *user, uint32_t layer, akv_kv_parts *parts) {
    trace *t = user;
    akv_status st;
    if (t->on && layer == 0 && (st = akv_dev_event_record(t->dev, t->base, AKV_QUEUE_COMPUTE)))
        return st;
    st = t->inner.begin_layer(t->inner.user, layer, parts);
    if (st || !t->on || layer >= TRACE_MAX) return st;
    t->host_ns[layer] = akv_clock_ns();
    t->n = layer + 1;
    if ((st = akv_dev_event_record(t->dev, t->ev_d2h[layer], AKV_QUEUE_D2H))) return st;
    return akv_dev_event_record(t->dev, t->ev[layer], AKV_QUEUE_H2D);
}

static akv_status trace_end(void *user, uint32_t layer) {
    trace *t = user;
    akv_status st = t->inner.end_layer ? t->inner.end_layer(t->inner.user, layer) : AKV_OK;
    if (st || !t->on || layer >= TRACE_MAX) return st;
    return akv_dev_event_record(t->dev, t->ev_cmp[layer], AKV_QUEUE_COMPUTE);
}

static double trace_at_ms(trace *t, akv_event *e) {
    uint64_t ns = 0;
    TRY(akv_dev_event_elapsed_ns(t->dev, t->base, e, &ns));
    return ns * 1e-6;
}

static void trace_report(trace *t, double layer_bytes, double rate) {
    double dev_sum = 0, host_sum = 0, worst = 0;
    uint32_t n = t->n;
    for (uint32_t l = 1; l < n; l++) {
        uint64_t ns = 0;
        TRY(akv_dev_event_elapsed_ns(t->dev, t->ev[l - 1], t->ev[l], &ns));
        dev_sum += ns * 1e-6, host_sum += (t->host_ns[l] - t->host_ns[l - 1]) * 1e-6;
        if (ns * 1e-6 > worst) worst = ns * 1e-6;
    }
    double bus = layer_bytes / rate * 1e3;
    printf("    trace, layers 1..%u: H2D interval %.3f ms a layer (worst %.3f), host issue "
           "interval %.3f ms, copy bus time %.3f ms\n",
           n - 1, dev_sum / (n - 1), worst, host_sum / (n - 1), bus);
    printf("    layer: ms from layer 0's begin on the compute queue, when the layer's copies "
           "were done (H2D), the D2H queue's work before it was done, its compute was done; "
           "its begin issued by the host\n");
    for (uint32_t l = 0; l < n; l++)
        printf("    %2u: h2d %8.3f  d2h %8.3f  compute %8.3f  issued %8.3f\n", l,
               trace_at_ms(t, t->ev[l]), trace_at_ms(t, t->ev_d2h[l]), trace_at_ms(t, t->ev_cmp[l]),
               (t->host_ns[l] - t->host_ns[0]) * 1e-6);
}

/* rate: the large-copy host->device rate (the trace's bus time). */
static row bench_ctx(akv_dev *dev, akv_forward_dev *f, akv_route_kind kind, uint32_t ctx,
                     int n_steps, double rate, uint32_t device_gib, float host_share) {
    const akv_model_config *c = akv_forward_dev_config(f);
    row out = {0};
    akv_geom g;
    TRY(akv_geom_init(&g, c->n_layers, c->n_kv_heads, c->head_dim, AKV_DTYPE_BF16, 0));
    uint64_t total = (uint64_t)ctx + n_steps + 2;
    bench_route br;
    if (bench_route_open(dev, &g, kind, total, device_gib, WINDOW, host_share, &br)) goto done;
    akv_host_pool *hp = br.hp;
    akv_dev_pool *dp = br.dp;
    akv_route *r = br.r;
    akv_route_seq *seq = br.seq;
    out.fits = 1;
    /* the synthetic history: ctx tokens placed without a pass, every byte zero */
    TRY(akv_route_begin_step(r, &(akv_route_req){seq, ctx}, 1));
    const akv_host_table *ht = akv_route_seq_host_table(seq);
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (uint32_t p = 0; p < akv_host_table_n_pages(ht); p++)
            memset(akv_host_pool_page_addr(hp, akv_host_table_page(ht, l, p)), 0,
                   akv_geom_page_bytes(&g));
    TRY(akv_dev_memset_sync(dev, akv_dev_pool_base(dp), 0,
                            (size_t)akv_dev_pool_n_pages(dp) * akv_dev_pool_page_bytes(dp)));
    trace tr = {.inner = akv_route_hooks(r), .dev = dev};
    int tracing = getenv("AKV_BENCH_TRACE") && (kind == bench_kind("staged") || kind == bench_kind("host"));
    if (tracing) TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &tr.base));
    for (int i = 0; tracing && i < TRACE_MAX; i++) {
        TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &tr.ev[i]));
        TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &tr.ev_d2h[i]));
        TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &tr.ev_cmp[i]));
    }
    akv_kv_hooks kv = tracing ? (akv_kv_hooks){.user = &tr,
                                                   .begin_layer = trace_begin,
                                                   .end_layer = trace_end}
                                : tr.inner;
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    akv_route_stats s0, s1;
    double t1 = 0;
    for (int i = 0; i <= n_steps; i++) {
        if (i == 1) {
            t1 = akv_clock_s();
            akv_route_get_stats(r, &s0);
        }
        int32_t tok = (int32_t)((i * 7919u) % c->n_vocab);
        tr.on = i == n_steps;
        double tb = akv_clock_s();
        TRY(akv_route_begin_step(r, &(akv_route_req){seq, (uint64_t)ctx + i + 1}, 1));
        if (i) out.begin_ms += (akv_clock_s() - tb) * 1e3 / n_steps;
        TRY(akv_forward_dev_run(f, &tok, 1, ctx + (uint32_t)i, &kv, logits, false));
    }
    out.step_ms = (akv_clock_s() - t1) / n_steps * 1e3;
    akv_route_get_stats(r, &s1);
    out.staged_bytes = (double)(s1.staged_bytes - s0.staged_bytes) / n_steps;
    out.host_bytes = (double)(s1.host_bytes - s0.host_bytes) / n_steps;
    out.host_ms = (double)(s1.host_ns - s0.host_ns) * 1e-6 / n_steps;
    TRY(akv_route_sync(r)); /* every event of the trace complete */
    if (tracing) {
        trace_report(&tr, out.staged_bytes / c->n_layers, rate);
        TRY(akv_dev_event_destroy(dev, tr.base));
        for (int i = 0; i < TRACE_MAX; i++) {
            TRY(akv_dev_event_destroy(dev, tr.ev[i]));
            TRY(akv_dev_event_destroy(dev, tr.ev_d2h[i]));
            TRY(akv_dev_event_destroy(dev, tr.ev_cmp[i]));
        }
    }
    free(logits);
done:
    bench_route_close(&br);
    return out;
}

/* The joint ceiling (AKV_BENCH_HOST): the host's memory serves both the bus's copies (DMA
 * reads of pinned pages) and the host part's cores. For JOINT_S seconds each: the launching
 * thread copying 256 MiB host->device again and again (synchronous copies, as the bus runs
 * when staging), the host part's threads summing a 1 GiB pinned buffer in passes (its read
 * rate), and both at once. Rates in GB/s over each side's own span. */
enum { JOINT_COPY_MIB = 256, JOINT_READ_MIB = 1024, JOINT_TASKS = 256 };
_Static_assert(((size_t)JOINT_READ_MIB << 20) / 8 / JOINT_TASKS % 4 == 0, "a task sums whole groups of 4 words");
#define JOINT_S 1.0

typedef struct joint {
    akv_par *par;
    const uint64_t *buf;
    size_t words;
    uint32_t n_tasks;
    uint64_t sums[256];
    atomic_int stop;
    double bytes, secs;
} joint;

static void joint_task(void *ctx, uint32_t t) {
    joint *j = ctx;
    const size_t per = j->words / j->n_tasks, a = (size_t)t * per;
    const uint64_t *w = j->buf + a;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < per; i += 4) s0 += w[i], s1 += w[i + 1], s2 += w[i + 2], s3 += w[i + 3];
    j->sums[t] = s0 + s1 + s2 + s3;
}

static void *joint_reader(void *arg) {
    joint *j = arg;
    const double t0 = akv_clock_s();
    double n = 0;
    do {
        akv__par_for(j->par, j->n_tasks, joint_task, j);
        n += 1;
    } while (!atomic_load(&j->stop));
    j->secs = akv_clock_s() - t0;
    j->bytes = n * (double)j->words * 8;
    return NULL;
}

/* Copies host->device for JOINT_S seconds; their rate, bytes/s. */
static double joint_copy(akv_dev *dev, akv_dptr d, const void *h) {
    const size_t n = (size_t)JOINT_COPY_MIB << 20;
    const double t0 = akv_clock_s();
    double bytes = 0;
    do {
        TRY(akv_dev_copy_h2d_sync(dev, d, h, n));
        bytes += (double)n;
    } while (akv_clock_s() - t0 < JOINT_S);
    return bytes / (akv_clock_s() - t0);
}

static void joint_table(FILE *out, akv_dev *dev, const akv_dev_info *info) {
    const uint32_t threads = (uint32_t)akv_test_env_int("AKV_BENCH_HOST_THREADS", 1, 256, bench_host_threads());
    void *h = NULL, *rd = NULL;
    akv_dptr d;
    TRY(akv_dev_pinned_alloc(dev, (size_t)JOINT_COPY_MIB << 20, &h));
    TRY(akv_dev_pinned_alloc(dev, (size_t)JOINT_READ_MIB << 20, &rd));
    TRY(akv_dev_mem_alloc(dev, (size_t)JOINT_COPY_MIB << 20, &d));
    memset(h, 1, (size_t)JOINT_COPY_MIB << 20);
    memset(rd, 2, (size_t)JOINT_READ_MIB << 20);
    joint j = {.buf = rd, .words = ((size_t)JOINT_READ_MIB << 20) / 8, .n_tasks = JOINT_TASKS};
    TRY(akv__par_create(threads, &j.par));
    pthread_t th;
    /* each alone, then both */
    const double copy_alone = joint_copy(dev, d, h);
    atomic_store(&j.stop, 0);
    if (pthread_create(&th, NULL, joint_reader, &j)) TRY(AKV_EUNSUPPORTED);
    akv_clock_sleep_ns((uint64_t)(JOINT_S * 1e9));
    atomic_store(&j.stop, 1);
    pthread_join(th, NULL);
    const double read_alone = j.bytes / j.secs;
    atomic_store(&j.stop, 0);
    if (pthread_create(&th, NULL, joint_reader, &j)) TRY(AKV_EUNSUPPORTED);
    const double copy_both = joint_copy(dev, d, h);
    atomic_store(&j.stop, 1);
    pthread_join(th, NULL);
    const double read_both = j.bytes / j.secs;
    bench_emit(out,
               "\n### The host's memory shared by the bus and the cores (%s, %u read threads)\n\n"
               "The launching thread copying %u MiB host->device back to back; the host part's "
               "threads summing a %u MiB pinned buffer; each alone, then both at once, %.0f s "
               "each. The joint ceiling is the last row's sum.\n\n"
               "| running | copy GB/s | read GB/s | sum GB/s |\n|---|---:|---:|---:|\n"
               "| copies alone | %.1f | - | %.1f |\n| reads alone | - | %.1f | %.1f |\n"
               "| both | %.1f | %.1f | %.1f |\n",
               info->name, threads, JOINT_COPY_MIB, JOINT_READ_MIB, JOINT_S, copy_alone / 1e9,
               copy_alone / 1e9, read_alone / 1e9, read_alone / 1e9, copy_both / 1e9, read_both / 1e9,
               (copy_both + read_both) / 1e9);
    printf("  joint: copies %.1f GB/s alone, %.1f beside reads; reads %.1f alone, %.1f beside "
           "copies (%u threads)\n",
           copy_alone / 1e9, copy_both / 1e9, read_alone / 1e9, read_both / 1e9, threads);
    akv__par_destroy(j.par);
    TRY(akv_dev_mem_free(dev, d));
    akv_dev_pinned_free(dev, h);
    akv_dev_pinned_free(dev, rd);
}

/* AKV_BENCH_HOST=1 (=only: without the table above): the host-attended route against the
 * staged one on a 1 GiB pool at 32K,
 * 64K and 128K (AKV_BENCH_HOST_CTX), for each host share of AKV_BENCH_HOST_SHARES (default
 * "0.3 0.5 0.7"): step / staged step, the bytes each side moved, the host part's time, and the
 * bound if bus and cores ran at their rates alone: max(staged bytes / bus rate, host time). */
static void host_table(FILE *out, akv_dev *dev, akv_forward_dev *f, double rate, const akv_dev_info *info) {
    const char *cs = getenv("AKV_BENCH_HOST_CTX"), *ss = getenv("AKV_BENCH_HOST_SHARES");
    char cbuf[128], sbuf[128];
    snprintf(cbuf, sizeof cbuf, "%s", cs && *cs ? cs : "32768 65536 131072");
    snprintf(sbuf, sizeof sbuf, "%s", ss && *ss ? ss : "0.3 0.5 0.7");
    const uint32_t gib = (uint32_t)akv_test_env_int("AKV_BENCH_HOST_GIB", 1, 64, 1);
    const akv_model_config *c = akv_forward_dev_config(f);
    bench_emit(out,
               "\n### The host-attended route against the staged one, batch-1 decode (%s): "
               "synthetic Llama-3-8B shape, bf16, %u layers, %u GiB device pool\n\n"
               "Host->device large-copy rate (same run): **%.1f GB/s**. `share`: the part of the "
               "pages outside the window the host's cores attend; host GB/s = the host's bytes / "
               "its part's summed time.\n\n"
               "| context | route | share | step ms | / staged | staged MiB | host MiB | host ms | "
               "host GB/s |\n|---|---|---|---|---|---|---|---|---|\n",
               info->name, c->n_layers, gib, rate / 1e9);
    for (char *sv = NULL, *ct = strtok_r(cbuf, " ,", &sv); ct; ct = strtok_r(NULL, " ,", &sv)) {
        const uint32_t ctx = (uint32_t)strtoul(ct, NULL, 10);
        const row st = bench_ctx(dev, f, bench_kind("staged"), ctx, 6, rate, gib, 0);
        bench_emit(out, "| %u | staged | 0 | %.2f | 1.000 | %.0f | 0 | 0 | - |\n", ctx, st.step_ms,
                   st.staged_bytes / (1 << 20));
        char sb[128];
        snprintf(sb, sizeof sb, "%s", sbuf);
        for (char *s2 = NULL, *sh = strtok_r(sb, " ,", &s2); sh; sh = strtok_r(NULL, " ,", &s2)) {
            const float share = strtof(sh, NULL);
            const row h = bench_ctx(dev, f, bench_kind("host"), ctx, 6, rate, gib, share);
            bench_emit(out, "| %u | host | %.2f | %.2f | %.3f | %.0f | %.0f | %.2f | %.1f |\n", ctx,
                       (double)share, h.step_ms, h.step_ms / st.step_ms, h.staged_bytes / (1 << 20),
                       h.host_bytes / (1 << 20), h.host_ms,
                       h.host_ms > 0 ? h.host_bytes / (h.host_ms * 1e-3) / 1e9 : 0.0);
            printf("  host-attended %u, share %.2f: %.2f ms (staged %.2f ms)\n", ctx, (double)share,
                   h.step_ms, st.step_ms);
        }
    }
}

int main(void) {
    akv_dev_info info;
    akv_dev *dev = bench_cuda_or_skip(&info);
    akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_BENCH_LAYERS", 1, 32, 32));
    akv_forward_params fp = {.max_step_tokens = 16, .attn = bench_attn_tuning()};
    akv_forward_dev *f = NULL;
    TRY(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &f));
    double rate = h2d_rate(dev);
    printf("bench_staged: %u layers on %s; host->device large-copy rate %.1f GB/s\n", c.n_layers,
           info.name, rate / 1e9);

    uint32_t ctxs[4] = {1024, 8192, 32768, 131072};
    const char *host_env = getenv("AKV_BENCH_HOST");
    const bool host_only = host_env && !strcmp(host_env, "only"); /* the host table alone */
    int n_ctx = host_only ? 0 : getenv("AKV_BENCH_LONG") ? 4 : 3;
    row res[4], stg[4], stc[4];
    akv_copy_config dflt = akv_dev_get_copy_config(dev), coal = dflt;
    coal.method = AKV_COPY_METHOD_COALESCE;
    for (int i = 0; i < n_ctx; i++) {
        int n_steps = ctxs[i] >= 32768 ? 8 : 32;
        res[i] = bench_ctx(dev, f, bench_kind("resident"), ctxs[i], n_steps, rate, DEVICE_GIB, 0);
        stg[i] = bench_ctx(dev, f, bench_kind("staged"), ctxs[i], n_steps, rate, DEVICE_GIB, 0);
        /* the same with one cudaMemcpyAsync per merged span instead of the batched call */
        TRY(akv_dev_set_copy_config(dev, &coal));
        stc[i] = bench_ctx(dev, f, bench_kind("staged"), ctxs[i], n_steps, rate, DEVICE_GIB, 0);
        TRY(akv_dev_set_copy_config(dev, &dflt));
        printf("  context %u: resident %s%.3f ms/token, staged %.3f ms/token (%s; %.3f with "
               "coalesce) (%.1f MiB staged per step; begin_step %.3f ms of the step)\n",
               ctxs[i], res[i].fits ? "" : "(does not fit) ", res[i].step_ms, stg[i].step_ms,
               akv_copy_method_name(dflt.method), stc[i].step_ms, stg[i].staged_bytes / (1 << 20),
               stg[i].begin_ms);
    }

    FILE *out = bench_out_open();
    if (n_ctx) bench_emit(out,
               "\n### Staged vs resident route, batch-1 decode (%s): synthetic Llama-3-8B "
               "shape, bf16, %u layers, %u GiB device pool, window %u pages\n\n"
               "History filled synthetically (zeros), not prefilled. Host->device large-copy "
               "rate (256 MiB pinned, same run): **%.1f GB/s**. Bus time = staged bytes / that "
               "rate; ratio = step / bus time (goal <= 1.05). Copies by the default method "
               "(%s); the last two columns: the same staged run with `coalesce` (one "
               "cudaMemcpyAsync per merged span).\n\n"
               "| context | resident tok/s | staged tok/s | staged MiB/step | bus time ms | "
               "staged step ms | ratio | coalesce step ms | ratio |\n"
               "|---|---|---|---|---|---|---|---|---|\n",
               info.name, c.n_layers, DEVICE_GIB, WINDOW, rate / 1e9,
               akv_copy_method_name(dflt.method));
    for (int i = 0; i < n_ctx; i++) {
        double bus_ms = stg[i].staged_bytes / rate * 1e3;
        char rs[32], ratio[32], ratio_c[32] = "-";
        if (res[i].fits)
            snprintf(rs, sizeof rs, "%.1f", 1e3 / res[i].step_ms);
        else
            snprintf(rs, sizeof rs, "does not fit");
        if (bus_ms > 0)
            snprintf(ratio, sizeof ratio, "%.3f", stg[i].step_ms / bus_ms);
        else
            snprintf(ratio, sizeof ratio, "- (nothing staged)");
        if (bus_ms > 0) snprintf(ratio_c, sizeof ratio_c, "%.3f", stc[i].step_ms / bus_ms);
        bench_emit(out, "| %u | %s | %.1f | %.1f | %.3f | %.3f | %s | %.3f | %s |\n", ctxs[i], rs,
                   1e3 / stg[i].step_ms, stg[i].staged_bytes / (1 << 20), bus_ms, stg[i].step_ms,
                   ratio, stc[i].step_ms, ratio_c);
    }
    if (host_env) {
        joint_table(out, dev, &info);
        host_table(out, dev, f, rate, &info);
    }
    if (out) fclose(out);
    akv_forward_dev_destroy(f);
    TRY(akv_dev_destroy(dev));
    return 0;
}
