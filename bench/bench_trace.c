/* bench_trace.c (bench) — what the trace costs a step (issue 43), measured in parts because a
 * whole run's rate moves more between runs than the trace's cost: (1) the emit calls' own
 * time at each level (a million spans and counters, ns each, the clock reads the engine makes
 * for them included); (2) how many events a step emits at each level, and the step's time, from
 * the same greedy generation of the default model on the host pass at 1 and 4 sequences with a
 * trace of each level; the predicted share is events x ns / step. Also each level's measured
 * step time (the mean over the run) beside off's, for what it is worth on a shared machine.
 * Host only; skips without the default model. Appends markdown to $AKV_BENCH_OUT. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/engine.h"
#include "akv/model.h"
#include "akv/trace.h"
#include "core/clock.h"
#include "model_path.h"

#define AKV_BENCH_NAME "bench_trace"
#include "bench_try.h"

/* ns per emit (a span with its two clock reads, then a counter) at a level. */
static double ns_per_event(akv_trace_level level) {
    akv_trace *t = NULL;
    if (akv_trace_create(level, 1 << 16, &t) != AKV_OK) return -1;
    enum { N = 1000000 };
    const uint64_t t0 = akv_clock_ns();
    for (int i = 0; i < N; i++) {
        const uint64_t a = akv_trace_level_of(t) == AKV_TRACE_SPANS ? akv_clock_ns() : 0;
        akv_trace_span(t, 1000 + (uint32_t)(i & 7), "emit", a, a ? akv_clock_ns() : 0, "token", i, NULL, 0);
        akv_trace_counter(t, "generated tokens", a, i);
    }
    const double ns = (double)(akv_clock_ns() - t0) / (2.0 * N);
    akv_trace_destroy(t);
    return ns;
}

int main(void) {
    char path[1024];
    if (!test_model_path(path, sizeof path, 0)) {
        printf("bench_trace: no default model (scripts/fetch-model): skipped\n");
        return 77;
    }
    akv_model *m = NULL;
    TRY(akv_model_load(path, NULL, &m));
    FILE *out = bench_out_open();
    double ns[3];
    for (int l = 0; l < 3; l++) ns[l] = ns_per_event((akv_trace_level)l);
    int32_t prompt[64];
    for (int i = 0; i < 64; i++) prompt[i] = 100 + 7 * i;
    double step_ms[3][2] = {{0}}, events[3][2] = {{0}}, snapshot_ns = 0;
    for (int l = 0; l < 3; l++)
        for (int b = 0; b < 2; b++) {
            const uint32_t n_seq = b ? 4 : 1;
            akv_trace *t = NULL;
            TRY(akv_trace_create((akv_trace_level)l, 1 << 20, &t));
            akv_engine_params ep = akv_engine_default_params();
            ep.model = m, ep.max_seqs = n_seq, ep.max_context = 512, ep.trace = t;
            akv_engine *e = NULL;
            TRY(akv_dev_create(akv_dev_host_backend(), NULL, &ep.dev));
            TRY(akv_engine_create(&ep, &e));
            akv_request *rq[4];
            for (uint32_t i = 0; i < n_seq; i++) {
                akv_request_params rp = {.prompt = prompt + i, .n_prompt = 32, .max_tokens = 64,
                                         .sample = akv_sample_default_params()};
                rp.sample.temp = 0;
                TRY(akv_engine_submit(e, &rp, &rq[i], NULL));
            }
            while (akv_engine_busy(e)) TRY(akv_engine_step(e, NULL));
            akv_engine_stats st;
            akv_engine_get_stats(e, &st);
            akv_trace_stats ts;
            akv_trace_get_stats(t, &ts);
            step_ms[l][b] = st.step_s * 1e3 / (double)st.n_steps;
            events[l][b] = (double)ts.n_events / (double)st.n_steps;
            if (l == 0 && b == 0) { /* the counters' snapshot a step: the stats read */
                const uint64_t t0 = akv_clock_ns();
                for (int i = 0; i < 100000; i++) akv_engine_get_stats(e, &st);
                snapshot_ns = (double)(akv_clock_ns() - t0) / 100000;
            }
            for (uint32_t i = 0; i < n_seq; i++) akv_engine_release(e, rq[i]);
            akv_engine_destroy(e);
            akv_trace_destroy(t);
        }
    bench_emit(out, "\n### What the trace costs (bench_trace: the default model, host pass, greedy, 32-token "
                    "prompts, 64 tokens each; the stats snapshot the counters take a step: %.0f ns)\n\n"
                    "| level | ns an event | events a step, 1 / 4 sequences | predicted share of off's step "
                    "(events x ns + the snapshot), 1 / 4 | measured mean step ms, 1 / 4 (off: %.3f / %.3f) |\n"
                    "|---|---|---|---|---|\n",
               snapshot_ns, step_ms[0][0], step_ms[0][1]);
    for (int l = 0; l < 3; l++) {
        const double per_step = l ? snapshot_ns : 0;
        bench_emit(out, "| %s | %.1f | %.1f / %.1f | %.4f %% / %.4f %% | %.3f / %.3f |\n",
                   akv_trace_level_name((akv_trace_level)l), ns[l], events[l][0], events[l][1],
                   100 * (events[l][0] * ns[l] + per_step) / (step_ms[0][0] * 1e6),
                   100 * (events[l][1] * ns[l] + per_step) / (step_ms[0][1] * 1e6), step_ms[l][0], step_ms[l][1]);
    }
    if (out) fclose(out);
    akv_model_destroy(m);
    return 0;
}
