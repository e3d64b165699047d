/* bench_fwd.c (bench) — batch-1 decode of a synthetic Llama-3-8B-shape model on CUDA (bf16
 * weights, or a block format with AKV_BENCH_WTYPE=q8_0, q4_K, ...)
 * through akv_forward_dev and the queued resident route, at several context lengths, as a
 * ratio of the weight-bandwidth limit measured in the same run.
 *
 * The model is generated on the device (akv_forward_dev_create_synthetic: no 16 GB file).
 * Shape: 32 layers, n_embd 4096, n_ff 14336, 32 query / 8 K/V heads of 128, vocabulary 128256,
 * RoPE base 500000 (no Llama 3 factors: they do not change the cost). AKV_BENCH_LAYERS=N runs
 * the first N layers only (the output head stays).
 *
 * Per context length C (1K, 8K, 32K; 128K with AKV_BENCH_LONG=1; those up to
 * AKV_BENCH_MAX_CTX only when it is set): prefill C tokens in chunks
 * of 512 (timed, no logits but the last), then decode steps, each one run of the pass with
 * logits back on the host (the step's one synchronisation), alternating blocks of 16 steps
 * replayed as a CUDA graph (the default) and 16 launched op by op (a second pass over the
 * same synthetic weights with params.no_graphs), 32 timed steps each after one untimed step
 * each; step time = wall time / steps.
 *   limit (weights)  weight bytes per token / device copy rate, where the copy rate is bytes
 *                    read + written per second of akv_dev_cuda_copy_d2d_async over 1 GiB
 *                    (akv_dev_cuda_time_us), the rate a kernel can stream memory at;
 *   limit (+K/V)     the same with the K/V history read once per step added to the bytes.
 *   ratio            limit time / measured step time (1.0 = at the bandwidth limit).
 * AKV_BENCH_PROFILE=1 adds the device's op profile (akv_dev_profile_start) of 4 decode steps
 * at 1K launched op by op: device time per op name and product shape. AKV_BENCH_PRODUCTS=0
 * leaves the table of the products alone out (a decode A/B); with block weights that table
 * has PyTorch's 4-bit weight product beside them (bench/qgemv_torch.py; AKV_BENCH_TORCH=0
 * leaves it out, AKV_PYTHON names the interpreter).
 * Results go to stdout and are appended to $AKV_BENCH_OUT (markdown) when set. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
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

#define AKV_BENCH_NAME "bench_fwd"
#include "bench_try.h"
#include "bench_peer.h"
#include "bench_route.h"
#include "bench_copy_rate.h"

enum { CHUNK = 512, N_STEPS = 32 };

typedef struct row {
    uint32_t ctx;
    double prefill_s, step_ms, eager_ms, kv_bytes;
} row;

/* The decode products alone: y = x W^T for one row (and more for the engine's batches and a
 * prefill chunk) at the 8B shapes, by cuBLAS and by the skinny kernel over bf16 W, and, with a
 * block format, over the blocks by each CUDA path (integer dots one warp per row up to
 * AKV_FWD_QGEMV_MAX_ROWS rows, integer tensor-core tiles, W widened for cuBLAS), timed with
 * events around 20 launches on the compute queue; GB/s of weights read (their own bytes), as a
 * ratio of the device copy rate. */
enum { MM_BF16_CUBLAS, MM_BF16_GEMV, MM_Q_DOT, MM_Q_TILES, MM_Q_WIDEN, MM_COLS };
typedef struct mm_row {
    const char *name;
    uint32_t m, n, k;
    double us[MM_COLS];
    double torch_us, torch_bytes; /* the peer (torch_int4); NAN until it fills them */
} mm_row;

/* The peer for the block columns: PyTorch's 4-bit weight product (torch._weight_int4pack_mm,
 * the tinygemm kernel; a bf16 scale and zero per 128 weights) on the rows of up to 16, timed as
 * bench_matmuls times (bench/qgemv_torch.py: 20 launches of the same weights, the best of 5). */
static void torch_int4(mm_row *rows, int n_rows) {
    char args[4096] = "";
    for (int i = 0, len = 0; i < n_rows && len >= 0 && len < (int)sizeof args - 64; i++)
        if (rows[i].m <= 16)
            len += snprintf(args + len, sizeof args - len, " %u:%u:%u:128", rows[i].m, rows[i].n,
                            rows[i].k);
    FILE *p = bench_peer_open("qgemv_torch.py", args);
    if (!p) return;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        unsigned m, n, k, g;
        double bytes, warm, cold;
        if (sscanf(line, "int4 %u %u %u %u %lf %lf %lf", &m, &n, &k, &g, &bytes, &warm, &cold) !=
            7) {
            printf("torch: %s", line); /* the copy rate, notes and errors, as they are */
            continue;
        }
        for (int i = 0; i < n_rows; i++)
            if (rows[i].m == m && rows[i].n == n && rows[i].k == k)
                rows[i].torch_us = warm, rows[i].torch_bytes = bytes;
    }
    bench_peer_close(p, "qgemv_torch.py");
}

static void bench_matmuls(akv_dev *dev, mm_row *rows, int n_rows, akv_ops_wtype wt) {
    size_t max_w = 0, max_q = 0, max_x = 0, max_y = 0, max_xq = 0;
    for (int i = 0; i < n_rows; i++) {
        const mm_row *r = &rows[i];
        if ((size_t)r->n * r->k * 2 > max_w) max_w = (size_t)r->n * r->k * 2;
        if (wt && r->n * akv_ops_wrow_bytes(wt, r->k) > max_q)
            max_q = r->n * akv_ops_wrow_bytes(wt, r->k);
        if ((size_t)r->m * r->k * 2 > max_x) max_x = (size_t)r->m * r->k * 2;
        if ((size_t)r->m * r->n * 4 > max_y) max_y = (size_t)r->m * r->n * 4;
        if (akv_fwd_qgemv_scratch_bytes(r->m, r->k) > max_xq)
            max_xq = akv_fwd_qgemv_scratch_bytes(r->m, r->k);
    }
    const size_t scratch = max_w > max_xq ? max_w : max_xq;
    akv_dptr w, x, y, ws, wq = {0}, sc = {0};
    TRY(akv_dev_mem_alloc(dev, max_w, &w));
    TRY(akv_dev_mem_alloc(dev, max_x, &x));
    TRY(akv_dev_mem_alloc(dev, max_y, &y));
    TRY(akv_dev_mem_alloc(dev, 32u << 20, &ws));
    TRY(akv_dev_memset_sync(dev, w, 0x3c, max_w)); /* bf16 0x3c3c, about 0.0115 */
    TRY(akv_dev_memset_sync(dev, x, 0x3c, max_x));
    if (wt) {
        TRY(akv_dev_mem_alloc(dev, max_q, &wq));
        TRY(akv_dev_mem_alloc(dev, scratch, &sc));
        akv_fwd_fill_args fa = {.y = wq, .n = max_q, .seed = 3, .scale = 0.01f, .w_type = wt};
        TRY(akv_dev_op_launch(dev, &akv_fwd_op_fill, &fa, sizeof fa));
        TRY(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
    }
    akv_event *e0, *e1;
    TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &e0));
    TRY(akv_dev_event_create(dev, AKV_EVENT_TIMING, &e1));
    enum { N_LAUNCH = 20 };
    static const uint32_t algo[MM_COLS] = {AKV_FWD_MATMUL_CUBLAS, AKV_FWD_MATMUL_GEMV,
                                           AKV_FWD_MATMUL_GEMV, AKV_FWD_MATMUL_TILES,
                                           AKV_FWD_MATMUL_CUBLAS};
    for (int i = 0; i < n_rows; i++) {
        for (int col = 0; col < MM_COLS; col++) {
            const bool block = col >= MM_Q_DOT;
            /* the skinny kernels take up to 4 rows */
            if ((block && !wt) || ((col == MM_BF16_GEMV || col == MM_Q_DOT) && rows[i].m > 4)) {
                rows[i].us[col] = NAN;
                continue;
            }
            akv_fwd_matmul_args a = {.y = y, .x = x, .w = block ? wq : w, .m = rows[i].m,
                                     .n = rows[i].n, .k = rows[i].k, .beta = 1, .workspace = ws,
                                     .workspace_bytes = 32u << 20, .algo = algo[col],
                                     .w_type = block ? wt : 0, .scratch = block ? sc : (akv_dptr){0},
                                     .scratch_bytes = block ? scratch : 0};
            double best = INFINITY;
            for (int rep = 0; rep < 3; rep++) {
                TRY(akv_dev_event_record(dev, e0, AKV_QUEUE_COMPUTE));
                for (int l = 0; l < N_LAUNCH; l++)
                    TRY(akv_dev_op_launch(dev, &akv_fwd_op_matmul, &a, sizeof a));
                TRY(akv_dev_event_record(dev, e1, AKV_QUEUE_COMPUTE));
                TRY(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
                uint64_t ns = 0;
                TRY(akv_dev_event_elapsed_ns(dev, e0, e1, &ns));
                if (ns / 1e3 / N_LAUNCH < best) best = ns / 1e3 / N_LAUNCH;
            }
            rows[i].us[col] = best;
        }
    }
    TRY(akv_dev_event_destroy(dev, e0));
    TRY(akv_dev_event_destroy(dev, e1));
    TRY(akv_dev_mem_free(dev, w));
    TRY(akv_dev_mem_free(dev, x));
    TRY(akv_dev_mem_free(dev, y));
    TRY(akv_dev_mem_free(dev, ws));
    if (wt) {
        TRY(akv_dev_mem_free(dev, wq));
        TRY(akv_dev_mem_free(dev, sc));
    }
}

/* The table of bench_matmuls' rows; each column's ratio counts its own weights' bytes over the
 * copy rate. */
static void emit_matmuls(FILE *out, const mm_row *mms, int n_mm, akv_ops_wtype wt,
                         double copy_bps) {
    const char *wname = akv_ops_wtype_name(wt);
    bench_emit(out, "\n### Decode products alone (weights read once; ratio = weight bytes / time / "
                    "copy rate)\n\n| product | m | n x k | bf16 cuBLAS us | ratio | bf16 skinny us "
                    "| ratio |");
    if (wt)
        bench_emit(out,
                   " %s dots us | ratio | %s tiles us | ratio | %s widened + cuBLAS us | "
                   "ratio | PyTorch int4 us | ratio |",
                   wname, wname, wname);
    bench_emit(out, "\n|---|---|---|---|---|---|---|%s\n",
               wt ? "---|---|---|---|---|---|---|---|" : "");
    for (int i = 0; i < n_mm; i++) {
        const double bf16_bytes = (double)mms[i].n * mms[i].k * 2,
                     block_bytes = wt ? (double)mms[i].n * akv_ops_wrow_bytes(wt, mms[i].k) : 0;
        bench_emit(out, "| %s | %u | %u x %u |", mms[i].name, mms[i].m, mms[i].n, mms[i].k);
        for (int col = 0; col < (wt ? MM_COLS : MM_Q_DOT); col++) {
            const double b = col >= MM_Q_DOT ? block_bytes : bf16_bytes;
            bench_emit(out, " %.1f | %.2f |", mms[i].us[col],
                       b / (mms[i].us[col] * 1e-6) / copy_bps);
        }
        if (wt)
            bench_emit(out, " %.1f | %.2f |", mms[i].torch_us,
                       mms[i].torch_bytes / (mms[i].torch_us * 1e-6) / copy_bps);
        bench_emit(out, "\n");
    }
}

/* Prefill ctx tokens and time N_STEPS decode steps on fresh pools sized for the context. */
static row bench_ctx(akv_dev *dev, akv_forward_dev *f, akv_forward_dev *fe, uint32_t ctx) {
    const akv_model_config *c = akv_forward_dev_config(f);
    uint32_t n_layers = c->n_layers;
    akv_geom g;
    TRY(akv_geom_init(&g, n_layers, c->n_kv_heads, c->head_dim, AKV_DTYPE_BF16, 0));
    /* the timed steps, an untimed one per pass and AKV_BENCH_PROFILE's 4 */
    uint64_t total = (uint64_t)ctx + 2 * N_STEPS + 6;
    bench_route br;
    TRY(bench_route_open(dev, &g, bench_kind("resident"), total, 0, 0, 0.0f, &br));
    akv_route *r = br.r;
    akv_route_seq *seq = br.seq;
    akv_kv_hooks kv = akv_route_hooks(r);
    int32_t *tok = malloc(CHUNK * sizeof *tok);
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    uint64_t rs = 12345;
    for (int i = 0; i < CHUNK; i++)
        tok[i] = (int32_t)((rs = rs * 6364136223846793005ull + 1) >> 33) % (int32_t)c->n_vocab;
    double t0 = akv_clock_s();
    for (uint32_t pos = 0; pos < ctx;) {
        uint32_t n = ctx - pos < CHUNK ? ctx - pos : CHUNK;
        TRY(akv_route_begin_step(r, &(akv_route_req){seq, pos + n}, 1));
        TRY(akv_forward_dev_run(f, tok, n, pos, &kv, pos + n == ctx ? logits : NULL, false));
        pos += n;
    }
    TRY(akv_route_sync(r));
    double prefill_s = akv_clock_s() - t0;
    /* one untimed step of each pass (the graph pass builds its graph), then alternating
     * blocks of timed steps: graph, op by op, graph, op by op */
    uint32_t pos = ctx;
    double spent[2] = {0, 0};
    for (int b = -2; b < 4; b++) {
        akv_forward_dev *p = (b & 1) ? fe : f;
        int n = b < 0 ? 1 : N_STEPS / 2;
        double tb = akv_clock_s();
        for (int i = 0; i < n; i++, pos++) {
            TRY(akv_route_begin_step(r, &(akv_route_req){seq, pos + 1}, 1));
            TRY(akv_forward_dev_run(p, tok + (pos % CHUNK), 1, pos, &kv, logits, false));
        }
        if (b >= 0) spent[b & 1] += akv_clock_s() - tb;
    }
    /* AKV_BENCH_PROFILE=1: device time per op over 4 steps launched op by op at 1K (each
     * launch between two timing events, so the steps are slower than the table's) */
    if (getenv("AKV_BENCH_PROFILE") && ctx == 1024) {
        TRY(akv_dev_profile_start(dev, 4u * (c->n_layers * 24 + 16)));
        double tp = akv_clock_s();
        for (int i = 0; i < 4; i++, pos++) {
            TRY(akv_route_begin_step(r, &(akv_route_req){seq, pos + 1}, 1));
            TRY(akv_forward_dev_run(fe, tok + (pos % CHUNK), 1, pos, &kv, logits, false));
        }
        FILE *md = bench_out_open();
        bench_print_profile(dev, md, "Decode at 1K, 4 steps op by op", akv_clock_s() - tp, 16);
        if (md) fclose(md);
    }
    int finite = 1;
    for (uint32_t i = 0; i < c->n_vocab; i++)
        finite &= isfinite(logits[i]) != 0;
    if (!finite) fprintf(stderr, "bench_fwd: non-finite logits at context %u\n", ctx);
    row out = {.ctx = ctx,
               .prefill_s = prefill_s,
               .step_ms = spent[0] / N_STEPS * 1e3,
               .eager_ms = spent[1] / N_STEPS * 1e3,
               .kv_bytes = (double)ctx * n_layers * 2.0 * c->n_kv_heads * c->head_dim * 2};
    bench_route_close(&br);
    free(tok), free(logits);
    return out;
}

int main(void) {
    akv_dev_info info;
    akv_dev *dev = bench_cuda_or_skip(&info);
    akv_model_config c = llama3_8b_shape((uint32_t)akv_test_env_int("AKV_BENCH_LAYERS", 1, 32, 32));
    akv_forward_params fp = {.max_step_tokens = CHUNK, .attn = bench_attn_tuning()};
    /* AKV_BENCH_WTYPE: the matrices' format (bf16, the default, or a block format: q8_0, q4_K,
     * ...), the output head included */
    const char *wt = getenv("AKV_BENCH_WTYPE");
    for (int t = AKV_OPS_W_Q8_0; wt && t <= AKV_OPS_W_Q6_K; t++)
        if (!strcmp(wt, akv_ops_wtype_name((akv_ops_wtype)t))) fp.synthetic_type = (akv_ops_wtype)t;
    if (wt && strcmp(wt, "bf16") && !fp.synthetic_type) {
        fprintf(stderr, "bench_fwd: AKV_BENCH_WTYPE '%s': expected bf16, q8_0, q4_0, q4_1, q4_K, "
                        "q5_K or q6_K\n", wt);
        return 1;
    }
    const char *wname = fp.synthetic_type ? akv_ops_wtype_name(fp.synthetic_type) : "bf16";
    akv_forward_dev *f = NULL;
    double tc = akv_clock_s();
    TRY(akv_forward_dev_create_synthetic(dev, &c, 7, &fp, &f));
    akv_forward_params fpe = fp;
    fpe.no_graphs = 1;
    akv_forward_dev *fe = NULL; /* the same weights (same seed), every op launched by itself */
    TRY(akv_forward_dev_create_synthetic(dev, &c, 7, &fpe, &fe));
    printf("bench_fwd: synthetic model (%u layers, %.2f GB of weights) generated on %s in %.1f s\n",
           c.n_layers, akv_forward_dev_weight_bytes(f) / 1e9, info.name, akv_clock_s() - tc);

    /* the device copy rate: 1 GiB device to device, bytes read + written */
    double copy_bps = bench_copy_rate_bps(dev, (size_t)1 << 30);

    /* a product of the table: the peer's figures NAN until torch_int4 fills them */
#define MM(name, m, n, k) {name, m, n, k, {0}, NAN, NAN}
    mm_row mms[] = {MM("q|k|v", 1, 6144, 4096),
                    MM("o", 1, 4096, 4096),
                    MM("gate|up", 1, 28672, 4096),
                    MM("down", 1, 4096, 14336),
                    MM("output", 1, 128256, 4096),
                    MM("gate|up, 2 rows", 2, 28672, 4096),
                    MM("gate|up, 3 rows", 3, 28672, 4096),
                    MM("gate|up, 4 rows", 4, 28672, 4096),
                    MM("gate|up, 8 rows", 8, 28672, 4096),
                    MM("gate|up, 16 rows", 16, 28672, 4096),
                    MM("gate|up, 32 rows", 32, 28672, 4096),
                    MM("gate|up, 64 rows", 64, 28672, 4096),
                    MM("o, 8 rows", 8, 4096, 4096),
                    MM("down, 8 rows", 8, 4096, 14336),
                    MM("gate|up, prefill chunk", CHUNK, 28672, 4096),
                    MM("down, prefill chunk", CHUNK, 4096, 14336)};
#undef MM
    const int n_mm = (int)(sizeof mms / sizeof mms[0]);
    /* AKV_BENCH_PRODUCTS=0 leaves the products alone out (an A/B of decode settings) */
    const bool products = akv_test_env_int("AKV_BENCH_PRODUCTS", 0, 1, 1);
    if (products) {
        bench_matmuls(dev, mms, n_mm, fp.synthetic_type);
        /* AKV_BENCH_TORCH=0 leaves the peer out */
        if (fp.synthetic_type && akv_test_env_int("AKV_BENCH_TORCH", 0, 1, 1))
            torch_int4(mms, n_mm);
    }

    /* contexts up to AKV_BENCH_MAX_CTX (32K by default, 128K with AKV_BENCH_LONG) */
    const uint32_t ctxs[4] = {1024, 8192, 32768, 131072},
                   max_ctx = (uint32_t)akv_test_env_int("AKV_BENCH_MAX_CTX", 1024, 131072,
                                                        getenv("AKV_BENCH_LONG") ? 131072 : 32768);
    int n_ctx = 0;
    while (n_ctx < 4 && ctxs[n_ctx] <= max_ctx)
        n_ctx++;
    row rows[4];
    for (int i = 0; i < n_ctx; i++) {
        rows[i] = bench_ctx(dev, f, fe, ctxs[i]);
        printf("  context %u: prefill %.2f s, decode %.3f ms/token (op by op %.3f)\n", ctxs[i],
               rows[i].prefill_s, rows[i].step_ms, rows[i].eager_ms);
    }

    double wb = (double)akv_forward_dev_weight_bytes(f);
    FILE *out = bench_out_open();
    bench_emit(out,
               "\n### Forward pass, batch-1 decode (%s, %d SMs): synthetic Llama-3-8B shape, "
               "%s weights, %u layers, resident route\n\n"
               "Weights read per token: %.2f GB; device copy rate (1 GiB d2d, read + written): "
               "**%.0f GB/s**. Limit = bytes / copy rate; ratio = limit / measured step. Decode "
               "steps replayed as one CUDA graph (the default); `op by op` = the same steps "
               "with every kernel launched by itself, timed in alternating blocks.\n\n"
               "| context | prefill s | decode tokens/s | step ms | op by op ms | graph "
               "speed-up | limit (weights) ms | ratio | limit (+K/V) ms | ratio |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n",
               info.name, info.n_sm, wname, c.n_layers, wb / 1e9, copy_bps / 1e9);
    for (int i = 0; i < n_ctx; i++) {
        double lw = wb / copy_bps * 1e3, lkv = (wb + rows[i].kv_bytes) / copy_bps * 1e3;
        bench_emit(out, "| %u | %.2f | %.1f | %.3f | %.3f | %.2fx | %.3f | %.2f | %.3f | %.2f |\n",
                   rows[i].ctx, rows[i].prefill_s, 1e3 / rows[i].step_ms, rows[i].step_ms,
                   rows[i].eager_ms, rows[i].eager_ms / rows[i].step_ms, lw, lw / rows[i].step_ms,
                   lkv, lkv / rows[i].step_ms);
    }
    if (products) emit_matmuls(out, mms, n_mm, fp.synthetic_type, copy_bps);
    if (out) fclose(out);
    akv_forward_dev_destroy(f);
    akv_forward_dev_destroy(fe);
    TRY(akv_dev_destroy(dev));
    return 0;
}
