/*
 * bench_host.c (bench) — the host's per-token work, on the CPU: no device needed.
 *
 *   A. The sampler per token over a 49,152-entry vocabulary (SmolLM2's), greedy and with the
 *      default chain (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), as a ratio of one
 *      plain pass that reads the same logits (a sum), timed in the same run.
 *   B. The block-format products (akv_ops_qmatmul_cols: Q8_0, Q4_0, Q4_1, the default
 *      model's formats; activations quantized in the timing) at one row of SmolLM2's FFN shape (n = 1536, k = 576), each
 *      instruction set, as a ratio of the f32 row-invariant product (akv_ops_matmul_cols, AVX2
 *      where the CPU has it) of the same shape in the same run. Weights stay in cache: this
 *      compares the products' arithmetic, not the memory's rate.
 * Best of 5 repetitions of 500 calls each. Appends markdown to $AKV_BENCH_OUT.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "akv/ops.h"
#include "akv/sample.h"
#include "core/half.h"

#define AKV_BENCH_NAME "bench_host"
#include "bench_try.h"

enum { N_VOCAB = 49152, CALLS = 500, REPS = 5, QN = 1536, QK = 576 };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static volatile float sink; /* keeps the baseline's sum alive */

/* Microseconds per call of fn(arg): the best of REPS repetitions of CALLS calls. */
static double best_us(void (*fn)(void *), void *arg) {
    double best = INFINITY;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        for (int i = 0; i < CALLS; i++) fn(arg);
        double us = (now_s() - t0) / CALLS * 1e6;
        if (us < best) best = us;
    }
    return best;
}

typedef struct sample_job {
    akv_sampler *s;
    const float *logits;
} sample_job;

static void run_sample(void *arg) {
    sample_job *j = arg;
    int32_t t;
    TRY(akv_sampler_sample(j->s, j->logits, &t));
}

static void run_read(void *arg) {
    const float *l = arg;
    float sum = 0;
    for (int i = 0; i < N_VOCAB; i++) sum += l[i];
    sink = sum;
}

typedef struct prod_job {
    const float *x, *wf;
    const void *wq;
    akv_ops_q8 xq;
    akv_ops_wtype t;
    akv_ops_isa isa;
    float *y;
} prod_job;

static void run_f32(void *arg) {
    prod_job *j = arg;
    akv_ops_matmul_cols(j->y, j->x, j->wf, NULL, 1, QN, QK, 0, QN, AKV_OPS_ISA_AUTO);
}

static void run_q(void *arg) {
    prod_job *j = arg;
    akv_ops_quantize_rows_q8(j->x, 1, QK, &j->xq, AKV_OPS_ISA_AUTO);
    akv_ops_qmatmul_cols(j->y, &j->xq, 1, j->wq, j->t, NULL, QN, QK, 0, QN, j->isa);
}

int main(void) {
    FILE *f = bench_out_open();
    uint64_t rng = 1;
    float *logits = malloc(N_VOCAB * sizeof *logits);
    for (int i = 0; i < N_VOCAB; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)(rng >> 40) / (float)(1 << 24) * 20.0f - 10.0f;
    }
    const double read_us = best_us(run_read, logits);
    bench_emit(f, "\n### Host: the sampler per token (%d logits)\n\n", N_VOCAB);
    bench_emit(f, "Baseline: one pass summing the logits, same run: **%.1f µs**.\n\n", read_us);
    bench_emit(f, "| chain | µs per token | / baseline |\n|---|---:|---:|\n");
    for (int greedy = 1; greedy >= 0; greedy--) {
        akv_sample_params p = akv_sample_default_params();
        if (greedy) p.temp = 0;
        sample_job j = {.logits = logits};
        TRY(akv_sampler_create(&p, N_VOCAB, &j.s));
        const double us = best_us(run_sample, &j);
        bench_emit(f, "| %s | %.1f | %.2f |\n",
                   greedy ? "greedy" : "temp 0.8, top-k 40, top-p 0.95, min-p 0.05", us,
                   us / read_us);
        akv_sampler_destroy(j.s);
    }

    prod_job j = {.x = malloc(QK * sizeof(float)), .wf = malloc((size_t)QN * QK * sizeof(float)),
                  .y = malloc(QN * sizeof(float))};
    float *x = (float *)j.x, *wf = (float *)j.wf;
    for (int i = 0; i < QK; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (size_t i = 0; i < (size_t)QN * QK; i++) wf[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
    const size_t nb = QK / AKV_OPS_QBLOCK;
    uint8_t *wq = malloc((size_t)QN * akv_ops_wrow_bytes(AKV_OPS_W_Q8_0, QK));
    for (size_t i = 0; i < (size_t)QN * akv_ops_wrow_bytes(AKV_OPS_W_Q8_0, QK); i++)
        wq[i] = (uint8_t)(i * 131 % 251);
    j.wq = wq;
    void *xmem = malloc(akv_ops_q8_bytes(1, QK));
    akv_ops_q8_bind(xmem, 1, QK, &j.xq);
    const double f32_us = best_us(run_f32, &j);
    bench_emit(f, "\n### Host: block-format products, one row, n = %d, k = %d (weights in cache)\n\n",
               QN, QK);
    bench_emit(f, "Baseline: the f32 row-invariant product of the same shape (%s), same run: "
                  "**%.1f µs** (%.1f GB/s of weights).\n\n",
               akv_ops_isa_name(akv_ops_isa_resolve(AKV_OPS_ISA_AUTO)), f32_us,
               (double)QN * QK * 4 / f32_us / 1e3);
    bench_emit(f, "| format | instructions | µs | GB/s of weights | / f32 baseline |\n"
                  "|---|---|---:|---:|---:|\n");
    static const struct { akv_ops_wtype t; const char *name; } fmts[] = {
        {AKV_OPS_W_Q8_0, "Q8_0"}, {AKV_OPS_W_Q4_0, "Q4_0"}, {AKV_OPS_W_Q4_1, "Q4_1"}};
    for (int fi = 0; fi < 3; fi++)
        for (int isa = AKV_OPS_ISA_PORTABLE; isa <= AKV_OPS_ISA_AVX512_VNNI; isa++) {
            if (akv_ops_isa_resolve((akv_ops_isa)isa) != (akv_ops_isa)isa) continue;
            j.t = fmts[fi].t, j.isa = (akv_ops_isa)isa;
            /* the format's scales (and Q4_1's minimums) small and normal; quants as they fell */
            const size_t bb = akv_ops_wrow_bytes(j.t, QK) / nb;
            const uint16_t h = akv_f32_to_f16(0.01f);
            for (size_t b = 0; b < (size_t)QN * nb; b++) {
                uint8_t *blk = wq + b * bb;
                blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
                if (j.t == AKV_OPS_W_Q4_1) blk[2] = (uint8_t)h, blk[3] = (uint8_t)(h >> 8);
            }
            const double us = best_us(run_q, &j);
            const double bytes = (double)QN * akv_ops_wrow_bytes(j.t, QK);
            bench_emit(f, "| %s | %s | %.1f | %.1f | %.2f |\n", fmts[fi].name,
                       akv_ops_isa_name((akv_ops_isa)isa), us, bytes / us / 1e3, us / f32_us);
        }
    if (f) fclose(f);
    free(logits), free(x), free(wf), free(wq), free(j.y);
    free(xmem);
    return 0;
}
