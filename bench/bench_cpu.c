/*
 * bench_cpu.c (bench) — the default model (SmolLM2-135M-Instruct, Q4_1) through the engine on
 * the CPU: prefill of 512 and 4096 tokens and decode at about 0.5K and 4K tokens of history,
 * with the weights native (their blocks) and widened to f32, as a ratio of the machine's
 * memory read rate measured in the same run.
 *
 *   read rate   bytes per second that AKV_BENCH_THREADS threads (default 2) sum from a 512 MiB
 *               buffer each has touched first, best of 5 passes;
 *   floor       (the weight bytes one step reads + the K/V history it reads) / read rate: a
 *               decode step that reads every byte once at the read rate;
 *   ratio       floor / measured decode step (1.0 = at the memory's rate).
 * Prefill is compute-bound and has no such floor: its tokens/s are reported with the model's
 * GFLOP/s (2 x parameters per token, plus the causal attention's 4 x d x n/2 per token per
 * layer), no ratio.
 *
 * Each case submits one request of random tokens (seed fixed) with 64 new tokens (greedy,
 * end-of-generation ignored); the prompt is prefilled in chunks of 512. Decode rate = (tokens -
 * 1) / (last token's time - first token's time). Skips (exit 0, a note) without the model
 * (scripts/fetch-model). AKV_BENCH_WEIGHTS=native leaves the f32 rows out. After them, the peer:
 * llama.cpp on the same file and threads, measured the same way (bench/llama_cpp_peer.py, when
 * llama-cpp-python is installed; AKV_BENCH_LLAMA=0 leaves it out), against the same floor.
 * Appends markdown to $AKV_BENCH_OUT.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/dev.h"
#include "akv/engine.h"
#include "akv/model.h"
#include "core/clock.h"

#define AKV_BENCH_NAME "bench_cpu"
#include "bench_try.h"
#include "bench_peer.h"
#include "model_path.h"

enum { READ_MIB = 512, N_GEN = 64, CHUNK = 512 };

typedef struct read_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} read_job;

static void *read_part(void *arg) {
    read_job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) s0 += j->p[i], s1 += j->p[i + 1], s2 += j->p[i + 2], s3 += j->p[i + 3];
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* Bytes per second `threads` threads read, each its slice (touched once first). */
static double read_rate(int threads) {
    const size_t n = (size_t)READ_MIB << 17; /* uint64 words */
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    read_job jobs[64];
    pthread_t th[64];
    double best = 0;
    for (int pass = 0; pass < 6; pass++) {
        double t0 = akv_clock_s();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (read_job){.p = buf + n / threads * t, .n = n / threads};
            pthread_create(&th[t], NULL, read_part, &jobs[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        double rate = (double)(n / threads * threads * 8) / (akv_clock_s() - t0);
        if (pass > 0 && rate > best) best = rate; /* pass 0 warms the pages and the threads */
    }
    free(buf);
    return best;
}

typedef struct cpu_case {
    double prefill_tps, decode_tps, ctx;
} cpu_case;

static cpu_case run_case(const char *model, akv_weights w, int threads, uint32_t n_prompt) {
    akv_engine_params ep = akv_engine_default_params();
    TRY(akv_dev_create(akv_dev_host_backend(), NULL, &ep.dev));
    ep.model_path = model, ep.weights = w;
    ep.host_gib = 1, ep.device_gib = 1;
    ep.max_context = n_prompt + N_GEN + 1;
    ep.chunk = CHUNK, ep.threads = (uint32_t)threads;
    akv_engine *e = NULL;
    TRY(akv_engine_create(&ep, &e));
    int32_t *prompt = malloc(n_prompt * sizeof *prompt);
    uint64_t rng = 12345;
    for (uint32_t i = 0; i < n_prompt; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)(100 + (rng >> 33) % 40000);
    }
    akv_request_params rp = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = N_GEN,
                             .sample = akv_sample_default_params(), .ignore_eog = true};
    rp.sample.temp = 0;
    akv_request *rq = NULL;
    TRY(akv_engine_submit(e, &rp, &rq, NULL));
    while (akv_engine_busy(e)) TRY(akv_engine_step(e, NULL));
    akv_request_info ri;
    akv_request_get_info(rq, &ri);
    cpu_case c = {.prefill_tps = n_prompt / (ri.t_first - ri.t_admit),
                  .decode_tps = (ri.n_gen - 1) / (ri.t_done - ri.t_first),
                  .ctx = n_prompt + N_GEN / 2.0};
    akv_engine_release(e, rq);
    akv_engine_destroy(e);
    free(prompt);
    return c;
}

/* llama.cpp's rows (bench/llama_cpp_peer.py) against the same floor: it reads the same blocks
 * and an f16 history of the same bytes. Its notes and errors are printed as they are. */
static void llama_cpp_rows(FILE *f, const char *model, int threads, double wbytes,
                           double kv_per_token, double rate, const uint32_t *prompts, int n) {
    if (strchr(model, '\'')) return; /* quoted below */
    char args[6144];
    int len = snprintf(args, sizeof args, "'%s' %d", model, threads);
    for (int i = 0; i < n && len >= 0 && len < (int)sizeof args - 16; i++)
        len += snprintf(args + len, sizeof args - len, " %u", prompts[i]);
    FILE *p = bench_peer_open("llama_cpp_peer.py", args);
    if (!p) return;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        unsigned np;
        double prefill_tps, ctx, decode_tps;
        if (sscanf(line, "llama.cpp %u %lf %lf %lf", &np, &prefill_tps, &ctx, &decode_tps) != 4) {
            printf("llama.cpp: %s", line);
            continue;
        }
        const double floor_s = (wbytes + kv_per_token * ctx) / rate;
        bench_emit(
            f,
            "| llama.cpp (the same file) | %.1f MB | %u | %.1f | | %.0f | %.1f | %.2f | %.2f |\n",
            wbytes / 1e6, np, prefill_tps, ctx, decode_tps, floor_s * 1e3, floor_s * decode_tps);
    }
    bench_peer_close(p, "llama_cpp_peer.py");
}

int main(void) {
    char model[4096];
    if (!test_model_path(model, sizeof model, 0)) {
        printf("bench_cpu: no default model in models/ (scripts/fetch-model): nothing measured\n");
        return 0;
    }
    const char *th = getenv("AKV_BENCH_THREADS");
    const int threads = th && atoi(th) > 0 && atoi(th) <= 64 ? atoi(th) : 2;
    FILE *f = bench_out_open();
    akv_model *m = NULL;
    TRY(akv_model_load(model, NULL, &m));
    const akv_model_config *c = akv_model_get_config(m);
    const double kv_per_token = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * 2; /* bf16 */
    double params = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const akv_model_layer *L = akv_model_get_layer(m, l);
        const akv_model_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) params += (double)ms[i]->rows * ms[i]->cols;
    }
    params += (double)c->n_vocab * c->n_embd; /* the output head */
    akv_model_destroy(m);

    const double rate = read_rate(threads);
    bench_emit(f, "\n### CPU: the default model through the engine, %d threads\n\n", threads);
    bench_emit(f, "Baseline: the memory read rate of %d threads, same run: **%.1f GB/s**. "
                  "Floor = (weight bytes a step reads + K/V history bytes) / that rate; ratio = "
                  "floor / measured step.\n\n", threads, rate / 1e9);
    bench_emit(f, "| weights | bytes a step | prompt | prefill tok/s | GFLOP/s | decode at | "
                  "decode tok/s | floor ms | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    static const akv_weights ws[2] = {AKV_WEIGHTS_NATIVE, AKV_WEIGHTS_F32};
    static const uint32_t prompts[2] = {512, 4096};
    /* AKV_BENCH_WEIGHTS=native runs the native rows alone (an A/B) */
    const char *only = getenv("AKV_BENCH_WEIGHTS");
    double native_wbytes = 0; /* the peer's floor: it reads the same blocks */
    for (int wi = 0; wi < (only && !strcmp(only, "native") ? 1 : 2); wi++) {
        akv_model_load_params lp = {.weights = ws[wi]};
        TRY(akv_model_load(model, &lp, &m));
        const double wbytes = (double)akv_model_step_weight_bytes(m);
        akv_model_destroy(m);
        if (ws[wi] == AKV_WEIGHTS_NATIVE) native_wbytes = wbytes;
        for (int pi = 0; pi < 2; pi++) {
            const cpu_case r = run_case(model, ws[wi], threads, prompts[pi]);
            const double n = prompts[pi];
            const double flops = 2 * params * n + 4.0 * c->n_heads * c->head_dim * n * n / 2 * c->n_layers;
            const double floor_s = (wbytes + kv_per_token * r.ctx) / rate;
            bench_emit(f, "| %s | %.1f MB | %u | %.1f | %.1f | %.0f | %.1f | %.2f | %.2f |\n",
                       akv_weights_name(ws[wi]), wbytes / 1e6, prompts[pi], r.prefill_tps,
                       flops / (n / r.prefill_tps) / 1e9, r.ctx, r.decode_tps, floor_s * 1e3,
                       floor_s * r.decode_tps);
        }
    }
    /* the peer on the same file and cores (AKV_BENCH_LLAMA=0 leaves it out) */
    const char *peer = getenv("AKV_BENCH_LLAMA");
    if (!peer || strcmp(peer, "0"))
        llama_cpp_rows(f, model, threads, native_wbytes, kv_per_token, rate, prompts, 2);
    if (f) fclose(f);
    return 0;
}
