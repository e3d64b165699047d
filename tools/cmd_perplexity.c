/* cmd_perplexity.c — akv perplexity: a model's perplexity over consecutive windows of a text,
 * scored as llama-perplexity scores them, and, with a compact K/V tier, that tier against the
 * exact one in the same run (the KL divergence of its next-token distributions from the exact
 * ones, and how often their most likely tokens agree). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/engine.h"
#include "akv/log.h"
#include "akv/model.h"
#include "akv/ops.h"
#include "akv/tok.h"
#include "cmd.h"
#include "core/clock.h"
#include "engine_opts.h"

static const char ppl_usage[] =
    "usage: akv perplexity [-m MODEL.gguf] -f TEXT [--ctx N] [--chunks N] [--kv-tier exact|q8|q4]\n"
    "                      [options]\n"
    "\n"
    "The model's perplexity over consecutive windows of --ctx tokens of TEXT, each window\n"
    "scored on its second half (as llama-perplexity does: the first token of a window is the\n"
    "BOS token where the model adds one; the last ctx/2 - 1 tokens are predicted from\n"
    "everything before them in the window). Each window is one prompt, computed in chunks of\n"
    "--chunk tokens, so later chunks read the K/V the earlier ones wrote, as a long\n"
    "conversation's steps do. With --kv-tier q8 or q4 the same windows also run with that\n"
    "compact tier in the same run: its perplexity, and against the exact tier's next-token\n"
    "distributions the mean and 99th-percentile KL divergence and the top-1 agreement.\n"
    "\n"
    "options:\n"
    "  -m, --model PATH         GGUF model (default " AKV_TOOL_DEFAULT_MODEL ")\n"
    "  -f, --file TEXT          the text (required)\n"
    "      --ctx N              tokens per window (default 512)\n"
    "      --chunks N           windows at most (default: every whole window of the text)\n"
    "      --max-input-bytes N  the most bytes TEXT may hold (default 64M)\n"
    "  -h, --help               this text\n"
    "Engine (a prompt's logits come from the host pass: --device cpu):\n";

/* One side of the run: an engine and what it has scored. */
typedef struct ppl_side {
    const char *name;
    akv_engine *e;
    double nll, nll2;  /* sums of -log p(next token) and of its square */
    uint64_t n;
    /* the tier side, against the exact one's rows of the same chunk */
    double *kl;        /* [n_scored] per position */
    uint64_t n_kl, n_agree;
} ppl_side;

typedef struct ppl_run {
    const int32_t *window; /* the window's tokens */
    uint32_t ctx, first;   /* scored rows: positions first .. ctx-2 */
    uint32_t n_vocab;
    ppl_side exact, tier;
    bool has_tier;
    /* the exact side's log-probabilities of the current chunk's scored rows, and where */
    float *lp;             /* [chunk][n_vocab] */
    uint32_t lp_pos, lp_n;
    double *row;           /* [n_vocab] scratch */
} ppl_run;

/* log-softmax of logits[n] into out (double), returning the argmax. */
static uint32_t ppl_log_softmax(const float *x, uint32_t n, double *out) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += exp((double)x[i] - x[best]);
    const double lse = (double)x[best] + log(s);
    for (uint32_t i = 0; i < n; i++) out[i] = (double)x[i] - lse;
    return best;
}

/* The scored rows of a chunk of positions pos .. pos+n-1: row j predicts window[pos + j + 1]. */
static void ppl_scored(const ppl_run *r, uint32_t pos, uint32_t n, uint32_t *j0, uint32_t *j1) {
    const uint32_t lo = r->first, hi = r->ctx - 1; /* positions [lo, hi) */
    *j0 = pos < lo ? lo - pos : 0;
    *j1 = pos + n < hi ? n : hi > pos ? hi - pos : 0;
    if (*j0 > *j1) *j0 = *j1;
}

/* Row j of a chunk at pos into r->row as log-probabilities, its negative log-likelihood of
 * the next token counted on side `side`; returns the row's most likely token. */
static uint32_t ppl_score_row(ppl_run *r, ppl_side *side, const float *logits, uint32_t pos,
                              uint32_t j) {
    const uint32_t best = ppl_log_softmax(logits + (size_t)j * r->n_vocab, r->n_vocab, r->row);
    const double nll = -r->row[r->window[pos + j + 1]];
    side->nll += nll, side->nll2 += nll * nll, side->n++;
    return best;
}

static void ppl_on_exact(void *user, akv_request *rq, uint32_t pos, uint32_t n,
                         const float *logits) {
    (void)rq;
    ppl_run *r = user;
    uint32_t j0, j1;
    ppl_scored(r, pos, n, &j0, &j1);
    r->lp_pos = pos + j0, r->lp_n = j1 - j0;
    for (uint32_t j = j0; j < j1; j++) {
        (void)ppl_score_row(r, &r->exact, logits, pos, j);
        if (!r->has_tier) continue;
        float *keep = r->lp + (size_t)(j - j0) * r->n_vocab;
        for (uint32_t i = 0; i < r->n_vocab; i++) keep[i] = (float)r->row[i];
    }
}

static void ppl_on_tier(void *user, akv_request *rq, uint32_t pos, uint32_t n,
                        const float *logits) {
    (void)rq;
    ppl_run *r = user;
    uint32_t j0, j1;
    ppl_scored(r, pos, n, &j0, &j1);
    for (uint32_t j = j0; j < j1; j++) {
        const uint32_t best = ppl_score_row(r, &r->tier, logits, pos, j);
        /* the exact side's row of the same position (the two run the same chunks) */
        if (pos + j < r->lp_pos || pos + j >= r->lp_pos + r->lp_n) continue;
        const float *e = r->lp + (size_t)(pos + j - r->lp_pos) * r->n_vocab;
        double kl = 0;
        uint32_t best_e = 0;
        for (uint32_t i = 0; i < r->n_vocab; i++) {
            kl += exp((double)e[i]) * ((double)e[i] - r->row[i]);
            if (e[i] > e[best_e]) best_e = i;
        }
        r->tier.kl[r->tier.n_kl++] = kl > 0 ? kl : 0;
        r->tier.n_agree += best == best_e;
    }
}

/* An engine for one side: one sequence of ctx tokens (+1 generated), chunks of --chunk. */
static int ppl_open(const akv_tool_eopts *o, akv_model *model, uint32_t ctx, akv_repr tier,
                    akv_engine **out) {
    akv_engine_params ep = akv_engine_default_params();
    akv_status st = akv_tool_open_device(o->device, &ep.dev);
    if (st) return st == AKV_EINVAL ? AKV_EXIT_USAGE : AKV_EXIT_FAIL; /* printed */
    ep.model = model;
    akv_tool_eopts_apply(o, &ep);
    ep.kv_tier = tier;
    ep.max_context = (uint64_t)ctx + 1;
    ep.max_seqs = 1;
    ep.max_idle = 1;
    if ((st = akv_engine_create(&ep, out))) /* the device is freed with the failed engine */
        return akv_tool_engine_failed("perplexity", st);
    return -1;
}

static void ppl_close(akv_engine *e) {
    akv_engine_destroy(e); /* the device with it */
}

/* Runs one window through one side's engine. */
static int ppl_window(akv_engine *e, const int32_t *window, uint32_t ctx,
                      void (*on)(void *, akv_request *, uint32_t, uint32_t, const float *),
                      ppl_run *r, akv_request **rq) {
    akv_request_params p = {.prompt = window,
                            .n_prompt = ctx,
                            .max_tokens = 1,
                            .sample = akv_sample_default_params(),
                            .on_prompt_logits = on,
                            .prompt_logits_from = r->first,
                            .user = r};
    p.sample.temp = 0;
    akv_refusal rf;
    akv_status st = akv_engine_submit(e, &p, rq, &rf);
    if (st) {
        fprintf(stderr, "akv perplexity: the window was refused: %s\n", rf.message);
        return AKV_EXIT_FAIL;
    }
    return -1;
}

/* p-th percentile of v[n] (sorted in place). */
static int ppl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double ppl_pct(double *v, uint64_t n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, ppl_cmp);
    uint64_t k = (uint64_t)ceil(p / 100.0 * (double)n);
    return v[k ? k - 1 : 0];
}

/* perplexity and its uncertainty, from the sums (llama-perplexity's estimate: exp of the mean
 * negative log-likelihood; the standard error of that mean carried through exp) */
static void ppl_of(const ppl_side *s, double *ppl, double *err) {
    const double mean = s->n ? s->nll / (double)s->n : 0;
    const double var = s->n > 1 ? (s->nll2 / (double)s->n - mean * mean) : 0;
    *ppl = exp(mean);
    *err = s->n > 1 ? *ppl * sqrt(var > 0 ? var : 0) / sqrt((double)(s->n - 1)) : 0;
}

int akv_cmd_perplexity(int argc, char **argv) {
    enum { O_CTX = 256, O_CHUNKS, O_MAXIN };
    static const struct option own[] = {{"file", required_argument, 0, 'f'},
                                        {"ctx", required_argument, 0, O_CTX},
                                        {"chunks", required_argument, 0, O_CHUNKS},
                                        {"max-input-bytes", required_argument, 0, O_MAXIN},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option opts[96];
    if (akv_tool_options(own, opts, sizeof opts / sizeof *opts) < 0) return AKV_EXIT_FAIL;
    akv_tool_eopts o;
    akv_tool_eopts_defaults(&o);
    const char *file = NULL;
    unsigned long long ctx = 512, max_chunks = 0, max_input = AKV_TOOL_INPUT_LIMIT;
    int c, r;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:h", opts, NULL)) != -1) {
        if ((r = akv_tool_eopts_parse("perplexity", c, optarg, &o)) < 0) return AKV_EXIT_USAGE;
        if (r) continue;
        switch (c) {
        case 'f': file = optarg; break;
        case O_CTX:
            if (!akv_tool_parse_max("perplexity", "ctx", optarg, 1u << 20, &ctx)) return AKV_EXIT_USAGE;
            if (ctx < 4) {
                fprintf(stderr, "akv perplexity: --ctx must be at least 4 (half of it is scored)\n");
                return AKV_EXIT_USAGE;
            }
            break;
        case O_CHUNKS:
            if (!akv_tool_parse_u64("perplexity", "chunks", optarg, &max_chunks)) return AKV_EXIT_USAGE;
            break;
        case O_MAXIN:
            if (!akv_tool_parse_u64("perplexity", "max-input-bytes", optarg, &max_input))
                return AKV_EXIT_USAGE;
            break;
        case 'h': {
            akv_tool_eopts d;
            akv_tool_eopts_defaults(&d);
            fputs(ppl_usage, stdout);
            akv_tool_eopts_help(stdout, &d);
            return AKV_EXIT_OK;
        }
        default: fputs(ppl_usage, stderr); return AKV_EXIT_USAGE;
        }
    }
    if (optind < argc || !file) {
        fprintf(stderr, "akv perplexity: %s (akv perplexity --help)\n",
                optind < argc ? "unexpected argument" : "-f TEXT is required");
        return AKV_EXIT_USAGE;
    }
    if ((r = akv_tool_eopts_check("perplexity", &o)) >= 0) return r;
    if (o.trace_path || o.trace_level) {
        fprintf(stderr, "akv perplexity: --trace and --trace-level are for akv run and akv serve\n");
        return AKV_EXIT_USAGE;
    }
    if (o.kv_tier == AKV_ENGINE_TIER_AUTO) {
        fprintf(stderr, "akv perplexity: --kv-tier auto: perplexity compares one form with exact; "
                        "name it (q8 or q4)\n");
        return AKV_EXIT_USAGE;
    }

    int rc = AKV_EXIT_FAIL;
    akv_model *model = NULL;
    akv_tok *tok = NULL;
    akv_tok_text text = {0};
    akv_tok_ids ids = {0};
    ppl_run run = {.ctx = (uint32_t)ctx, .first = (uint32_t)ctx / 2,
                   .exact = {.name = "exact"}, .has_tier = o.kv_tier != AKV_REPR_EXACT};
    run.tier.name = akv_repr_name(o.kv_tier);
    int32_t *window = NULL;
    akv_model_load_params lp = {.weights = o.weights == AKV_WEIGHTS_F32 ? AKV_WEIGHTS_F32
                                                                        : AKV_WEIGHTS_NATIVE};
    if (!akv_tool_read_input("perplexity", file, max_input, "max-input-bytes", &text)) {
        rc = AKV_EXIT_USAGE;
        goto done;
    }
    akv_status st = akv_model_load(o.model, &lp, &model);
    if (st) {
        fprintf(stderr, "akv perplexity: cannot load '%s': %s\n", o.model, akv_status_str(st));
        goto done;
    }
    if ((st = akv_tok_create_from_gguf(akv_model_gguf(model), NULL, &tok)) ||
        (st = akv_tok_encode(tok, text.bytes ? text.bytes : "", text.n_bytes, AKV_TOK_ADD_SPECIAL,
                             &ids))) {
        fprintf(stderr, "akv perplexity: the text could not be tokenized: %s\n", akv_status_str(st));
        goto done;
    }
    uint64_t n_windows = ids.n_ids / ctx;
    if (max_chunks && n_windows > max_chunks) n_windows = max_chunks;
    if (n_windows == 0) {
        fprintf(stderr, "akv perplexity: '%s' holds %zu tokens, fewer than one window of --ctx %llu\n",
                file, ids.n_ids, ctx);
        rc = AKV_EXIT_USAGE;
        goto done;
    }
    if (o.threads) akv_ops_ref_set_threads((int)akv_tool_eopts_threads(&o));
    akv_tool_log_flags(AKV_LOG_WARN);
    if ((r = ppl_open(&o, model, run.ctx, AKV_REPR_EXACT, &run.exact.e)) >= 0 ||
        (run.has_tier && (r = ppl_open(&o, model, run.ctx, o.kv_tier, &run.tier.e)) >= 0)) {
        rc = r;
        goto done;
    }
    const akv_engine_plan *pl = akv_engine_get_plan(run.exact.e);
    run.n_vocab = akv_model_get_config(model)->n_vocab;
    const uint64_t n_scored = n_windows * (run.ctx - 1 - run.first);
    run.row = malloc(run.n_vocab * sizeof *run.row);
    window = malloc(run.ctx * sizeof *window);
    run.tier.kl = run.has_tier ? malloc((n_scored + 1) * sizeof *run.tier.kl) : NULL;
    run.lp = run.has_tier ? malloc((size_t)pl->chunk * run.n_vocab * sizeof *run.lp) : NULL;
    if (!run.row || !window || (run.has_tier && (!run.tier.kl || !run.lp))) goto done;
    run.window = window;
    const akv_tok_specials sp = akv_tok_get_specials(tok);
    fprintf(stderr,
            "akv perplexity: %llu window(s) of %llu tokens of '%s' (%zu tokens), each scored on "
            "its last %u predictions, in chunks of %u%s%s\n",
            (unsigned long long)n_windows, ctx, file, ids.n_ids, run.ctx - 1 - run.first,
            pl->chunk, run.has_tier ? "; exact against " : "",
            run.has_tier ? run.tier.name : "");
    const double t0 = akv_clock_s();
    for (uint64_t w = 0; w < n_windows; w++) {
        memcpy(window, ids.ids + w * ctx, run.ctx * sizeof *window);
        if (sp.add_bos && sp.bos_id >= 0) window[0] = sp.bos_id;
        akv_request *re = NULL, *rt = NULL;
        if ((r = ppl_window(run.exact.e, window, run.ctx, ppl_on_exact, &run, &re)) >= 0 ||
            (run.has_tier &&
             (r = ppl_window(run.tier.e, window, run.ctx, ppl_on_tier, &run, &rt)) >= 0)) {
            akv_engine_release(run.exact.e, re);
            rc = r;
            goto done;
        }
        /* lockstep: a chunk of the exact side, then the same chunk of the tier */
        while (akv_engine_busy(run.exact.e) || (rt && akv_engine_busy(run.tier.e))) {
            if ((st = akv_engine_step(run.exact.e, NULL)) ||
                (rt && (st = akv_engine_step(run.tier.e, NULL)))) {
                fprintf(stderr, "akv perplexity: a step failed: %s\n", akv_status_str(st));
                akv_engine_release(run.exact.e, re);
                if (rt) akv_engine_release(run.tier.e, rt);
                goto done;
            }
        }
        akv_engine_release(run.exact.e, re);
        if (rt) akv_engine_release(run.tier.e, rt);
        double pe, ee;
        ppl_of(&run.exact, &pe, &ee);
        fprintf(stderr, "[%llu/%llu] exact %.4f", (unsigned long long)w + 1,
                (unsigned long long)n_windows, pe);
        if (run.has_tier) {
            double pt, et;
            ppl_of(&run.tier, &pt, &et);
            fprintf(stderr, ", %s %.4f", run.tier.name, pt);
        }
        fprintf(stderr, " (%.1f s)\n", akv_clock_s() - t0);
    }
    const double secs = akv_clock_s() - t0;
    double pe, ee;
    ppl_of(&run.exact, &pe, &ee);
    printf("perplexity, exact: %.4f +/- %.4f over %llu predictions (%llu windows of %u, "
           "%.1f tokens/s)\n",
           pe, ee, (unsigned long long)run.exact.n, (unsigned long long)n_windows, run.ctx,
           (double)n_windows * run.ctx * (run.has_tier ? 2 : 1) / secs);
    if (run.has_tier) {
        double pt, et;
        ppl_of(&run.tier, &pt, &et);
        double sum = 0;
        for (uint64_t i = 0; i < run.tier.n_kl; i++) sum += run.tier.kl[i];
        const double p99 = ppl_pct(run.tier.kl, run.tier.n_kl, 99.0);
        printf("perplexity, %s: %.4f +/- %.4f (%+.3f %% of exact); KL divergence from exact: "
               "mean %.6f, p99 %.6f; top-1 agreement %.2f %% (%llu of %llu)\n",
               run.tier.name, pt, et, 100.0 * (pt / pe - 1.0),
               run.tier.n_kl ? sum / (double)run.tier.n_kl : 0, p99,
               run.tier.n_kl ? 100.0 * (double)run.tier.n_agree / (double)run.tier.n_kl : 0,
               (unsigned long long)run.tier.n_agree, (unsigned long long)run.tier.n_kl);
    }
    rc = AKV_EXIT_OK;
done:
    ppl_close(run.tier.e);
    ppl_close(run.exact.e);
    free(run.row), free(window), free(run.tier.kl), free(run.lp);
    akv_tok_ids_free(&ids);
    akv_tok_text_free(&text);
    akv_tok_destroy(tok);
    akv_model_destroy(model);
    return rc;
}
