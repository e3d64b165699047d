/*
 * bench_host_attn.c (bench) — the host part's attention (akv/attn_host.h) over one layer of a
 * Llama-3-8B-shape history (32 query / 8 K/V heads, head dim 128, bf16, 64-token pages of 256
 * KiB, scattered in memory), on 1, 2, 4, ... threads up to the cores this process may use:
 * the bytes of K and V read per second, against the same threads reading the same pages with
 * a plain sum (the memory's read rate, measured in the same run). Work is cut as a caller of
 * the header cuts it: (K/V head, chunk) tasks over the threads, each K/V head's chunks merged
 * in order on the caller afterwards (timed). No device needed. Histories from
 * $AKV_BENCH_HOST_CTX (tokens, space-separated; default "32768"); the pages' forms from
 * $AKV_BENCH_HOST_REPR (default "exact q8 q4": the compact ones encoded from the same bf16
 * pages; a page's bytes are its form's); best of 5 passes each. Appends markdown to
 * $AKV_BENCH_OUT.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/attn_host.h"
#include "akv/kvq.h"
#include "core/clock.h"
#include "core/par.h"

#define AKV_BENCH_NAME "bench_host_attn"
#include "bench_try.h"

enum { HEADS = 32, KV_HEADS = 8, D = 128, P = 64, REPS = 5 };

typedef struct job {
    akv_attn_host_part part;
    akv_attn_host_isa isa;
    uint32_t n_chunks;
    float *o, *lse;   /* per task: [HEADS / KV_HEADS][D], [HEADS / KV_HEADS] */
    uint64_t *sums;   /* the read baseline's per-task sums */
    akv_repr_layout lay;
    akv_kvq_page_shape sh;
} job;

static void attn_task(void *ctx, uint32_t t) {
    job *j = ctx;
    const uint32_t G = HEADS / KV_HEADS, h = t / j->n_chunks, c = t % j->n_chunks;
    uint32_t a, b;
    akv_attn_host_chunk_pages(&j->part, c, &a, &b);
    akv_attn_host_chunk(&j->part, j->isa, h, a, b, j->o + (size_t)t * G * D, j->lse + (size_t)t * G);
}

static uint64_t sum_words(const void *p, size_t bytes) {
    const uint64_t *w = p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const size_t n = bytes / 8;
    for (size_t i = 0; i + 4 <= n; i += 4) s0 += w[i], s1 += w[i + 1], s2 += w[i + 2], s3 += w[i + 3];
    return s0 + s1 + s2 + s3;
}

/* The same task's bytes (K/V head h's rows of its chunk's pages: a compact form's codes and
 * scales) summed as 64-bit words. */
static void read_task(void *ctx, uint32_t t) {
    job *j = ctx;
    const uint32_t h = t / j->n_chunks, c = t % j->n_chunks;
    uint32_t a, b;
    akv_attn_host_chunk_pages(&j->part, c, &a, &b);
    uint64_t s = 0;
    for (uint32_t pg = a; pg < b; pg++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            const void *page = j->part.pages[pg];
            s += sum_words(akv_kvq_codes(&j->lay, &j->sh, page, kv, h, 0), (size_t)P * j->lay.code_row_bytes);
            if (j->lay.repr != AKV_REPR_EXACT)
                s += sum_words(akv_kvq_scales(&j->lay, &j->sh, page, kv, h, 0), (size_t)P * j->lay.scales_per_row * 2);
        }
    j->sums[t] = s;
}

static void merge_all(job *j) {
    const uint32_t G = HEADS / KV_HEADS;
    for (uint32_t h = 0; h < KV_HEADS; h++)
        for (uint32_t c = 1; c < j->n_chunks; c++) {
            const size_t t0 = (size_t)h * j->n_chunks, t = t0 + c;
            for (uint32_t r = 0; r < G; r++)
                akv_attn_merge_state(D, j->o + (t0 * G + r) * D, j->lse + t0 * G + r, j->o + (t * G + r) * D,
                                     j->lse[t * G + r]);
        }
}

/* Seconds of the best of REPS passes. */
static double best_pass(akv_par *par, job *j, int attend) {
    const uint32_t n_tasks = KV_HEADS * j->n_chunks;
    double best = INFINITY;
    for (int r = 0; r < REPS; r++) {
        const double t0 = akv_clock_s();
        akv__par_for(par, n_tasks, attend ? attn_task : read_task, j);
        if (attend) merge_all(j);
        const double s = akv_clock_s() - t0;
        if (s < best) best = s;
    }
    return best;
}

/* One history of len tokens in form l (its pages encoded from the bf16 pages of exact, in the
 * order perm scatters them): every thread count, every instruction set at the most threads. */
static void run_form(FILE *f, uint32_t len, const unsigned char *exact, const uint32_t *perm,
                     const akv_repr_layout *l) {
    const uint32_t n_pages = (len + P - 1) / P, cores = akv__par_cores();
    const akv_kvq_page_shape sh = {KV_HEADS, P, D, AKV_DTYPE_BF16};
    const size_t exact_bytes = (size_t)2 * KV_HEADS * P * D * 2;
    unsigned char *pool = (unsigned char *)exact;
    if (l->repr != AKV_REPR_EXACT) {
        pool = malloc(l->page_bytes * n_pages);
        for (uint32_t i = 0; i < n_pages; i++)
            TRY(akv_kvq_encode_page(l, &sh, exact + (size_t)i * exact_bytes, pool + (size_t)i * l->page_bytes, P));
    }
    const void **pages = malloc(n_pages * sizeof *pages);
    for (uint32_t i = 0; i < n_pages; i++) pages[i] = pool + (size_t)perm[i] * l->page_bytes;
    float q[HEADS * D];
    for (int i = 0; i < HEADS * D; i++) q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    job j = {.part = {pages, n_pages, len - (n_pages - 1) * P, KV_HEADS, D, P, AKV_DTYPE_BF16, HEADS, q, 0.0f, l->repr},
             .lay = *l,
             .sh = sh};
    TRY(akv_attn_host_part_check(&j.part));
    j.n_chunks = akv_attn_host_chunks(&j.part);
    const uint32_t n_tasks = KV_HEADS * j.n_chunks;
    j.o = malloc((size_t)n_tasks * HEADS / KV_HEADS * D * sizeof *j.o);
    j.lse = malloc((size_t)n_tasks * HEADS / KV_HEADS * sizeof *j.lse);
    j.sums = malloc(n_tasks * sizeof *j.sums);
    const double bytes = (double)len / P * l->page_bytes; /* the form's bytes of the history */
    for (uint32_t th = 1;; th = th * 2 > cores ? cores : th * 2) {
        akv_par *par;
        TRY(akv__par_create(th, &par));
        for (int isa = AKV_ATTN_HOST_PORTABLE; isa < AKV_ATTN_HOST_ISAS; isa++) {
            /* every set at the most threads; the widest alone below it */
            if (akv_attn_host_isa_resolve((akv_attn_host_isa)isa) != (akv_attn_host_isa)isa) continue;
            if (th < cores && (akv_attn_host_isa)isa != akv_attn_host_isa_resolve(AKV_ATTN_HOST_AUTO)) continue;
            j.isa = (akv_attn_host_isa)isa;
            const double rd = best_pass(par, &j, 0), at = best_pass(par, &j, 1);
            bench_emit(f, "| %u | %s | %u | %s | %.1f | %.1f | %.2f | %.3f |\n", len, akv_repr_name(l->repr),
                       th, akv_attn_host_isa_name(j.isa), bytes / rd / 1e9, bytes / at / 1e9, rd / at,
                       at * 1e3);
        }
        akv__par_destroy(par);
        if (th == cores) break;
    }
    if (pool != exact) free(pool);
    free(pages), free(j.o), free(j.lse), free(j.sums);
}

int main(void) {
    FILE *f = bench_out_open();
    const char *ctx_env = getenv("AKV_BENCH_HOST_CTX"), *repr_env = getenv("AKV_BENCH_HOST_REPR");
    char ctxs[256], reprs[64];
    snprintf(ctxs, sizeof ctxs, "%s", ctx_env && *ctx_env ? ctx_env : "32768");
    snprintf(reprs, sizeof reprs, "%s", repr_env && *repr_env ? repr_env : "exact q8 q4");
    bench_emit(f, "\n### Host part: attention over host pages in place (Llama-3-8B shape, one layer)\n\n");
    bench_emit(f, "32 query / 8 K/V heads, head dim 128, 64-token pages scattered (bf16: 256 KiB; q8 "
                  "and q4 encoded from them); tasks of (K/V head, %u keys), merged in order. GB/s of "
                  "the form's bytes. Baseline: the same threads summing the same pages' bytes, same "
                  "run. %u cores; instructions %s.\n\n",
               (unsigned)AKV_ATTN_HOST_CHUNK_TOKENS, akv__par_cores(),
               akv_attn_host_isa_name(akv_attn_host_isa_resolve(AKV_ATTN_HOST_AUTO)));
    bench_emit(f, "| keys | form | threads | instructions | read GB/s | attention GB/s | / read | ms a layer |\n"
                  "|---:|---|---:|---|---:|---:|---:|---:|\n");
    for (char *save = NULL, *tok = strtok_r(ctxs, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
        const uint32_t len = (uint32_t)strtoul(tok, NULL, 10);
        if (len < P) continue;
        const uint32_t n_pages = (len + P - 1) / P;
        const size_t page_bytes = (size_t)2 * KV_HEADS * P * D * 2;
        unsigned char *pool = malloc(page_bytes * n_pages);
        uint32_t *perm = malloc(n_pages * sizeof *perm);
        uint64_t rng = 0x9E3779B97F4A7C15ull;
        for (uint32_t i = 0; i < n_pages; i++) perm[i] = i;
        for (uint32_t i = n_pages; i > 1; i--) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t k = (uint32_t)((rng >> 33) % i), t = perm[i - 1];
            perm[i - 1] = perm[k], perm[k] = t;
        }
        uint16_t *el = (uint16_t *)pool;
        for (size_t i = 0; i < page_bytes * n_pages / 2; i++) { /* bf16 in about [-1, 1] */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            el[i] = (uint16_t)(0x3c00u + ((rng >> 40) & 0x7fu) + ((rng >> 50) & 1u ? 0x8000u : 0u));
        }
        char rb[64];
        snprintf(rb, sizeof rb, "%s", reprs);
        for (char *s2 = NULL, *rt = strtok_r(rb, " ,", &s2); rt; rt = strtok_r(NULL, " ,", &s2)) {
            akv_repr r;
            akv_repr_layout l;
            TRY(akv_repr_from_name(rt, &r));
            TRY(akv_repr_layout_of(r, AKV_DTYPE_BF16, KV_HEADS, P, D, &l));
            run_form(f, len, pool, perm, &l);
        }
        free(pool), free(perm);
    }
    if (f) fclose(f);
    return 0;
}
