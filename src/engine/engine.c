/* engine.c — the serving engine of akv/engine.h: the object (model, pools, route, pass), the
 * one memory plan, admission by arithmetic, idle contexts and prefix reuse, and the batch step
 * (continuous batching under a token budget). A request's own sampling and text: request.c. */
#include "akv/engine.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "akv/dev_pool.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
#include "akv/geom.h"
#include "akv/host_pool.h"
#include "akv/tok.h"
#include "akv/trace.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/par.h"
#include "engine/engine_impl.h"
#include "route/route_check.h"
#include "mem/mem_check.h"

/* ---- names ---------------------------------------------------------------------------------- */

const char *akv_finish_name(akv_finish f) {
    switch (f) {
    case AKV_FINISH_NONE: return "none";
    case AKV_FINISH_STOP: return "stop";
    case AKV_FINISH_LENGTH: return "length";
    case AKV_FINISH_CANCELLED: return "cancelled";
    case AKV_FINISH_ERROR: return "error";
    }
    return "?";
}

const char *akv_refusal_reason_name(akv_refusal_reason r) {
    static const char *const names[AKV_REFUSE_REASON_COUNT] = {
        "none", "context", "host", "device", "busy", "queue", "invalid", "failed"};
    return (unsigned)r < AKV_REFUSE_REASON_COUNT ? names[r] : "?";
}

akv_engine_params akv_engine_default_params(void) {
    return (akv_engine_params){.host_gib = 1,
                               .device_gib = 1,
                               .kv_dtype = AKV_DTYPE_BF16,
                               /* .route 0: the route's default kind (akv/route.h) */
                               .max_seqs = 1,
                               .admit_mode = AKV_ADMIT_REFUSE,
                               .chunk = 256};
}

/* A step with no request to step waits this long at most for a conversation being read back
 * from the session directory (a caller that steps in a loop does not spin meanwhile, and a
 * new request or a cancel waits no longer than this). */
static const double ENGINE_RESTORE_WAIT_S = 0.002;

/* ---- the plan ------------------------------------------------------------------------------- */

/* The admission's field names said as the engine's (akv/admit.h names its own params). */
static void engine_rename(const char *in, char *out, size_t cap) {
    static const char *const from[] = {"{=concurrency}", NULL};
    static const char *const to[] = {"{=max_seqs}", NULL};
    size_t o = 0;
    for (const char *t = in; *t && o + 1 < cap;) {
        bool hit = false;
        for (int i = 0; from[i] && !hit; i++) {
            size_t k = strlen(from[i]);
            if (!strncmp(t, from[i], k)) {
                for (const char *q = to[i]; *q && o + 1 < cap; q++) out[o++] = *q;
                t += k, hit = true;
            }
        }
        if (!hit) out[o++] = *t++;
    }
    out[o] = 0;
}

/* The host-attended route's threads: the engine's, or on a device one per core but one (the
 * thread that launches the kernels keeps a core while the host part runs; its pool's workers
 * spin between layers). */
static uint32_t engine_host_threads(const akv_engine *e) {
    if (e->p.threads) return e->p.threads;
    const uint32_t cores = akv__par_cores();
    return !e->info.is_host && cores > 2 ? cores - 1 : 0;
}

/* The one memory plan (akv/engine.h) of params p: geometry, fit, staging, per-context windows.
 * Logs and returns AKV_EFULL when the configuration does not fit, naming the field to change
 * (quiet: returns it without a word, the gate trying a placement). */
static akv_status engine_plan(akv_engine *e, const akv_engine_params *p, bool quiet) {
    akv_engine_plan *pl = &e->plan;
    const akv_model_config *c = &e->cfg;
    memset(pl, 0, sizeof *pl);
    akv_status st = akv_geom_init(&pl->geom, c->n_layers, c->n_kv_heads, c->head_dim,
                                  p->kv_dtype, p->page_tokens);
    if (st) {
        AKV_LOG_E("engine: the K/V geometry of the model with {=kv_dtype} %s and {=page_tokens} %u is "
                  "not valid",
                  akv_dtype_name(p->kv_dtype), p->page_tokens);
        return AKV_EINVAL;
    }
    pl->max_context = p->max_context ? p->max_context : c->n_ctx_train;
    pl->chunk = p->chunk ? p->chunk : 256;
    uint32_t seqs = p->max_seqs ? p->max_seqs : 1;
    /* the route's staging reserve follows the concurrency, which a shrink lowers: fit twice */
    for (int pass = 0; pass < 2; pass++) {
        if ((st = akv_route_plan_begin(p->route, p->window_pages, &pl->geom, pl->max_context,
                                       seqs, &pl->route)) ||
            /* a tier's exact window holds the recent tokens and one step's: a prompt piece
             * is at most a chunk there (engine_piece) */
            (st = akv_route_plan_tier(&pl->route, p->kv_tier, p->exact_recent, pl->chunk, &pl->geom,
                                      pl->max_context, seqs)))
            return st; /* logged */
        /* the staged compact route: the device and host GiB split between the parts */
        if ((st = akv_route_plan_split(&pl->route, &pl->geom, pl->max_context, seqs,
                                       p->device_gib, p->host_gib, quiet)))
            return st; /* logged unless quiet */
        /* the compact tier's pool comes out of the device GiB first */
        const uint32_t compact_gib = pl->route.compact_gib;
        if (compact_gib && p->device_gib <= compact_gib) {
            if (quiet) return AKV_EFULL;
            AKV_LOG_E("engine: {=kv_tier} %s: the compact pages of {=max_seqs} %u histories of "
                      "{=max_context} %llu tokens take %u GiB of the device pool, which needs "
                      "1 GiB more for the exact part: raise {=device_gib} to at least %u",
                      akv_repr_name(p->kv_tier), seqs, (unsigned long long)pl->max_context,
                      compact_gib, compact_gib + 1);
            return AKV_EFULL;
        }
        akv_admit_params ap = {.geom = pl->geom,
                               .max_context = pl->max_context,
                               .host_gib = p->host_gib - pl->route.compact_host_gib,
                               .device_gib = p->device_gib - compact_gib,
                               .staging_pages = pl->route.staging_pages,
                               .concurrency = seqs,
                               .mode = p->admit_mode};
        if ((st = akv_admit_fit(&ap, &pl->fit))) return st; /* logged */
        if (pl->fit.status != AKV_OK || pl->fit.concurrency == seqs) break;
        seqs = pl->fit.concurrency;
    }
    char said[sizeof pl->fit.verdict];
    engine_rename(pl->fit.verdict, said, sizeof said);
    if (pl->fit.status != AKV_OK) {
        if (!quiet) AKV_LOG_E("engine: the memory plan does not fit: %s", said);
        return AKV_EFULL;
    }
    if (pl->fit.shrunk && !quiet) AKV_LOG_W("engine: %s", said);
    pl->max_seqs = pl->fit.concurrency;
    pl->host_pages = p->host_pages_max && p->host_pages_max < pl->fit.host_pages ? p->host_pages_max
                                                                                : pl->fit.host_pages;
    pl->window_capacity = (uint32_t)pl->fit.window_capacity;
    const uint32_t need = pl->max_seqs - 1 + pl->chunk;
    const uint32_t dflt = need > AKV_ENGINE_STEP_TOKENS ? need : AKV_ENGINE_STEP_TOKENS;
    pl->step_tokens = p->step_tokens ? p->step_tokens : dflt;
    if (pl->step_tokens < need) {
        AKV_LOG_E("engine: {=step_tokens} %u is below {=max_seqs} - 1 + {=chunk} = %u (every running "
                  "decode and one prompt chunk must fit in a step)",
                  pl->step_tokens, need);
        return AKV_EINVAL;
    }
    const bool host_pass = p->pass == AKV_ENGINE_PASS_AUTO && e->info.is_host;
    uint32_t beside = host_pass ? pl->chunk : AKV_ENGINE_PREFILL_BESIDE;
    if (beside < pl->chunk) beside = pl->chunk;
    pl->prefill_beside = p->prefill_beside ? p->prefill_beside : beside;
    if (pl->prefill_beside < pl->chunk) { /* only a value given: the default is a chunk at least */
        AKV_LOG_E("engine: {=prefill_beside} %u is below {=chunk} %u (a prompt beside running "
                  "decodes could never take a chunk)",
                  pl->prefill_beside, pl->chunk);
        return AKV_EINVAL;
    }
    /* each context's window, by the route's kind (a compact tier keeps a step's new tokens
     * exact: its prompt pieces are one chunk at most, engine_piece) */
    pl->route.max_step = pl->route.tier != AKV_REPR_EXACT ? pl->chunk : pl->step_tokens;
    if ((st = akv_route_plan_finish(&pl->geom, pl->max_context, &pl->fit, &pl->route)))
        return st; /* logged, naming the field */
    const akv_gate_rates rates = p->gate_rates ? *p->gate_rates : akv_gate_default_rates();
    if ((st = akv_route_plan_host(&pl->route, &pl->geom, p->host_share, c->n_heads,
                                  engine_host_threads(e), &rates)))
        return st; /* logged, naming the field */
    pl->max_queue = p->max_queue;
    pl->max_idle = p->max_idle ? p->max_idle : pl->max_seqs;
    return AKV_OK;
}

/* Weight bytes a decode step reads: the model's in the formats the pass keeps them (a
 * synthetic model's, on the device pass, in bf16). */
static double engine_step_weight_bytes(const akv_engine *e) {
    if (e->model) return (double)akv_model_step_weight_bytes(e->model);
    const akv_model_config *c = &e->cfg;
    const double E = c->n_embd, q = (double)c->n_heads * c->head_dim,
                 kv = (double)c->n_kv_heads * c->head_dim;
    return 2.0 * ((double)c->n_vocab * E + c->n_layers * (E * (q + 2 * kv) + q * E + 3.0 * E * c->n_ff));
}

/* The gate (kv_tier auto): the plan of each placement (resident exact, resident q8 and q4
 * where the head dim takes them, staged exact, staged q8 and q4), its predicted cost a token
 * (akv/gate.h), the
 * least chosen; in refuse mode only placements that admit every max_seqs sequence count. Then
 * the chosen placement's plan, said (the table is in the plan). */
static akv_status engine_gate(akv_engine *e) {
    akv_engine_params q = e->p;
    const akv_gate_rates rates = q.gate_rates ? *q.gate_rates : akv_gate_default_rates();
    akv_gate_placement cand[AKV_ENGINE_GATE_OPTIONS];
    for (uint32_t i = 0; i < AKV_ENGINE_GATE_OPTIONS; i++) cand[i] = akv_gate_placement_at(i);
    akv_gate_option opts[AKV_ENGINE_GATE_OPTIONS];
    const uint32_t want = q.max_seqs ? q.max_seqs : 1;
    for (int i = 0; i < AKV_ENGINE_GATE_OPTIONS; i++) {
        q.route = cand[i].kind, q.kv_tier = cand[i].tier;
        uint32_t seqs = 0;
        /* a form that cannot hold the head dim is passed over (its plan would say why) */
        const bool holds = akv_repr_bits(cand[i].tier, q.kv_dtype, e->cfg.head_dim) > 0;
        if (holds && engine_plan(e, &q, true) == AKV_OK &&
            (q.admit_mode == AKV_ADMIT_SHRINK || e->plan.max_seqs == want))
            seqs = e->plan.max_seqs;
        const akv_engine_plan *pl = &e->plan;
        /* the staged window: of exact pages, or (a tier) of compact ones */
        const uint64_t window = cand[i].tier != AKV_REPR_EXACT ? pl->route.compact_target
                                                               : pl->route.target;
        opts[i] = akv_gate_predict(&rates, &pl->geom, cand[i].kind, cand[i].tier, seqs,
                                   seqs ? pl->max_context : 0, seqs ? pl->route.exact_recent : 0,
                                   seqs ? window * pl->geom.page_tokens : 0,
                                   engine_step_weight_bytes(e));
    }
    const int best = akv_gate_choose(opts, AKV_ENGINE_GATE_OPTIONS);
    if (best < 0) {
        AKV_LOG_E("engine: {=kv_tier} auto: no placement (resident or staged; exact, q8 or q4) "
                  "fits {=max_seqs} %u histories of {=max_context} in {=device_gib} %u and "
                  "{=host_gib} %u",
                  want, e->p.device_gib, e->p.host_gib);
        return AKV_EFULL;
    }
    e->p.route = cand[best].kind, e->p.kv_tier = cand[best].tier;
    akv_status st = engine_plan(e, &e->p, false);
    if (st) return st;
    e->plan.gate_rates = rates;
    memcpy(e->plan.gate, opts, sizeof opts);
    e->plan.n_gate = AKV_ENGINE_GATE_OPTIONS;
    /* per context: short histories stay exact where compacting them saves too little */
    if (cand[best].tier != AKV_REPR_EXACT)
        e->plan.exact_below = akv_gate_exact_below(&rates, &e->plan.geom, cand[best], e->plan.max_seqs,
                                                   e->plan.route.exact_recent, engine_step_weight_bytes(e),
                                                   e->plan.max_context);
    return AKV_OK;
}

size_t akv_engine_plan_format(const akv_engine_plan *pl, char *buf, size_t cap) {
    char fit[4096], said[4096];
    akv_fit_format(&pl->fit, fit, sizeof fit);
    engine_rename(fit, said, sizeof said);
    size_t n = (size_t)snprintf(buf, cap, "%s", said);
    n += akv_route_plan_format(&pl->route, pl->max_seqs, pl->window_capacity,
                               buf + (n < cap ? n : cap), n < cap ? cap - n : 0);
    int k = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0,
                 "steps:       {=chunk} %u tokens, {=step_tokens} %u, {=prefill_beside} %u, "
                 "{=max_queue} %u, {=max_idle} %u\n",
                 pl->chunk, pl->step_tokens, pl->prefill_beside, pl->max_queue, pl->max_idle);
    n += k > 0 ? (size_t)k : 0;
    if (pl->n_gate)
        n += akv_gate_format(&pl->gate_rates, pl->gate, pl->n_gate, pl->max_context,
                             buf + (n < cap ? n : cap), n < cap ? cap - n : 0);
    if (pl->exact_below) {
        k = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0,
                     "gate:        per context: a request of up to %llu tokens (prompt + "
                     "{=max_tokens}) stays exact, where compacting its older pages would save "
                     "under 5 %% of its token at %u sequences; longer ones keep them in %s\n",
                     (unsigned long long)pl->exact_below, pl->max_seqs, akv_repr_name(pl->route.tier));
        n += k > 0 ? (size_t)k : 0;
    }
    return n;
}

/* ---- create / destroy ----------------------------------------------------------------------- */

static void engine_progress(void *user, uint64_t done, uint64_t total) {
    const akv_engine *e = user;
    e->p.progress(e->p.progress_user, "loading", done, total);
}

/* The model, its tokenizer and the pass. */
static akv_status engine_open_model(akv_engine *e) {
    const akv_engine_params *p = &e->p;
    int sources = (p->model_path != NULL) + (p->model != NULL) + (p->synthetic != NULL);
    if (sources != 1) {
        AKV_LOG_E("engine: give exactly one of model_path, model and synthetic (%d given)",
                  sources);
        return AKV_EINVAL;
    }
    akv_status st;
    const bool host_pass = e->info.is_host && p->pass == AKV_ENGINE_PASS_AUTO;
    if (p->synthetic && host_pass) {
        AKV_LOG_E("engine: a synthetic model runs on the device pass (pass, dev)");
        return AKV_EINVAL;
    }
    if (host_pass ? p->weights == AKV_WEIGHTS_BF16 : p->weights == AKV_WEIGHTS_F32) {
        AKV_LOG_E("engine: {=weights} %s: the %s pass stores its matrices %s", akv_weights_name(p->weights),
                  host_pass ? "host" : "device", host_pass ? "native or f32" : "native or bf16");
        return AKV_EINVAL;
    }
    if (p->model_path) {
        akv_model_load_params lp = {.progress = p->progress ? engine_progress : NULL,
                                    .progress_user = e,
                                    .weights = host_pass ? p->weights : AKV_WEIGHTS_NATIVE};
        if ((st = akv_model_load(p->model_path, &lp, &e->own_model))) return st;
        e->model = e->own_model;
    } else if (p->model) {
        e->model = p->model;
    }
    e->cfg = e->model ? *akv_model_get_config(e->model) : *p->synthetic;
    if (e->model && akv_tok_create_from_gguf(akv_model_gguf(e->model), NULL, &e->tok) != AKV_OK)
        e->tok = NULL; /* a model without a (usable) tokenizer: tokens in, tokens out */
    if (!host_pass && p->kv_dtype != AKV_DTYPE_BF16 && !e->info.is_host) {
        AKV_LOG_E("engine: {=kv_dtype} %s: the CUDA attention reads bf16 K/V pages only",
                  akv_dtype_name(p->kv_dtype));
        return AKV_EINVAL;
    }
    return AKV_OK;
}

/* Rows of a prompt's logits the device pass returns in a step (on_prompt_logits): a piece of
 * at most this many tokens, so its pinned logits stay small (64 rows of a 128K vocabulary:
 * 32 MiB) while the host pass takes whole chunks. */
static uint32_t engine_dev_logit_rows(const akv_engine *e) {
    return e->plan.chunk < 64 ? e->plan.chunk : 64;
}

static akv_status engine_open_pass(akv_engine *e) {
    const akv_engine_params *p = &e->p;
    akv_forward_params fp = akv_forward_default_params();
    const bool host_pass = e->info.is_host && p->pass == AKV_ENGINE_PASS_AUTO;
    fp.max_step_tokens = e->plan.step_tokens;
    /* a step's sampled rows, and on the device pass a prompt piece's rows (on_prompt_logits:
     * its pieces are cut to them, engine_piece) */
    fp.max_logits = e->plan.max_seqs + (host_pass ? 0 : engine_dev_logit_rows(e) - 1);
    fp.no_graphs = p->no_graphs;
    fp.attn = p->attn;
    fp.threads = p->threads;
    fp.weights = host_pass ? AKV_WEIGHTS_NATIVE : p->weights;
    fp.synthetic_type = p->synthetic_type;
    const bool report = p->progress && !host_pass; /* the host pass reads the model in place */
    if (report) p->progress(p->progress_user, "uploading", 0, 1);
    akv_status st = host_pass        ? akv_forward_create(e->model, &fp, &e->fh)
                    : p->synthetic   ? akv_forward_dev_create_synthetic(e->dev, p->synthetic,
                                                                      p->synthetic_seed, &fp, &e->fd)
                                     : akv_forward_dev_create(e->dev, e->model, &fp, &e->fd);
    if (report && !st) p->progress(p->progress_user, "uploading", 1, 1);
    return st;
}

static akv_status engine_open_memory(akv_engine *e) {
    const akv_engine_plan *pl = &e->plan;
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = (e->p.host_gib ? e->p.host_gib : 1) - pl->route.compact_host_gib;
    /* the whole budget pinned now: growing the pool later stalls the pass that needs the
     * pages (docs/mem.md), and what admission promises is then memory the pool holds */
    hpp.keep_gib = hpp.limit_gib;
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = (e->p.device_gib ? e->p.device_gib : 1) - pl->route.compact_gib;
    dpp.staging_pages = pl->route.staging_pages;
    akv_route_params rp = {.kind = pl->route.kind,
                           .max_history = pl->max_context,
                           .max_seqs = pl->max_seqs,
                           .queued = e->fd != NULL,
                           .window_pages = pl->route.window_pages,
                           .tier = pl->route.tier,
                           .exact_recent = pl->route.exact_recent,
                           .max_step = pl->route.max_step,
                           .host_share = pl->route.host_share,
                           .host_threads = engine_host_threads(e),
                           /* the host pass's own threads: its encoders take no more cores */
                           .encode_threads = e->p.threads};
    akv_status st;
    if (e->p.progress) e->p.progress(e->p.progress_user, "pinning", 0, hpp.keep_gib);
    if ((st = akv_host_pool_create(e->dev, &pl->geom, &hpp, &e->hp))) return st;
    if (e->p.progress) e->p.progress(e->p.progress_user, "pinning", hpp.keep_gib, hpp.keep_gib);
    if ((st = akv_dev_pool_create(e->dev, &pl->geom, &dpp, &e->dp))) return st;
    if (pl->route.tier != AKV_REPR_EXACT) {
        akv_dev_pool_params cpp = akv_dev_pool_default_params();
        cpp.device_gib = pl->route.compact_gib, cpp.repr = pl->route.tier;
        cpp.staging_pages = pl->route.compact_staging_pages;
        if ((st = akv_dev_pool_create(e->dev, &pl->geom, &cpp, &e->dpc))) return st;
        rp.compact_pool = e->dpc;
        rp.compact_target = pl->route.compact_target, rp.compact_burst = pl->route.compact_burst;
    }
    if (pl->route.compact_host_gib) { /* the staged compact route's compact copies */
        akv_host_pool_params chp = akv_host_pool_default_params();
        chp.limit_gib = chp.keep_gib = pl->route.compact_host_gib, chp.repr = pl->route.tier;
        if ((st = akv_host_pool_create(e->dev, &pl->geom, &chp, &e->hpc))) return st;
        rp.compact_host_pool = e->hpc;
    }
    if ((st = akv_route_create(e->dev, e->hp, e->dp, &rp, &e->route))) return st;
    const uint32_t S = pl->max_seqs, T = pl->step_tokens;
    e->run = akv__calloc(S, sizeof *e->run);
    e->reqs = akv__calloc(S, sizeof *e->reqs);
    e->batch = akv__calloc(S, sizeof *e->batch);
    e->n_new = akv__calloc(S, sizeof *e->n_new);
    e->pos0 = akv__calloc(S, sizeof *e->pos0);
    e->order = akv__calloc(S, sizeof *e->order);
    e->lmode = akv__calloc(S, sizeof *e->lmode);
    e->chosen = akv__calloc(S, sizeof *e->chosen);
    e->draw = akv__calloc(S, sizeof *e->draw);
    e->pen = akv__calloc((size_t)2 * S * AKV_FORWARD_SAMPLE_PEN_MAX, sizeof *e->pen);
    e->tokens = akv__calloc(T, sizeof *e->tokens);
    if (e->fh) e->logits = akv__calloc((size_t)S * e->cfg.n_vocab, sizeof *e->logits);
    return e->run && e->reqs && e->batch && e->n_new && e->pos0 && e->order && e->lmode &&
                   e->chosen && e->draw && e->pen && e->tokens && (e->logits || !e->fh)
               ? AKV_OK
               : AKV_ENOMEM;
}

akv_status akv_engine_create(const akv_engine_params *p, akv_engine **out) {
    if (!p || !out) return AKV_EINVAL;
    if (!p->dev) {
        AKV_LOG_E("engine: create without a device (dev)");
        return AKV_EINVAL;
    }
    akv_engine *e = akv__calloc(1, sizeof *e);
    if (!e) {
        (void)akv_dev_destroy(p->dev);
        return AKV_ENOMEM;
    }
    e->p = *p;
    e->dev = p->dev;
    akv_status st = akv_dev_get_info(e->dev, &e->info);
    if (!st) st = engine_open_model(e);
    if (!st && e->p.kv_tier == AKV_ENGINE_TIER_AUTO && akv_route_kind_has_host_part(e->p.route)) {
        AKV_LOG_E("engine: {=kv_tier} auto chooses the route itself (resident or staged); the %s "
                  "{=route} takes no tier",
                  akv_route_kind_name(e->p.route));
        st = AKV_EINVAL;
    }
    if (!st) st = e->p.kv_tier == AKV_ENGINE_TIER_AUTO ? engine_gate(e) : engine_plan(e, &e->p, false);
    if (!st) st = engine_open_pass(e);
    if (!st) st = engine_open_memory(e);
    if (!st) st = akv__spill_open(e);
    if (st) {
        akv_engine_destroy(e);
        return st;
    }
    *out = e;
    return AKV_OK;
}

/* ---- contexts and reservations ---------------------------------------------------------------- */

static uint64_t engine_pages(const akv_engine *e, uint64_t n_tokens) {
    return akv_geom_pages_for_tokens(&e->plan.geom, n_tokens);
}

/* Host pages a context of n tokens holds (every layer). */
static uint64_t engine_host_pages(const akv_engine *e, uint64_t n_tokens) {
    return engine_pages(e, n_tokens) * e->plan.geom.n_layers;
}

void akv__engine_idle_remove(akv_engine *e, akv__ctx *c) {
    if (c->prev) c->prev->next = c->next;
    else e->idle_head = c->next;
    if (c->next) c->next->prev = c->prev;
    else e->idle_tail = c->prev;
    c->next = c->prev = NULL;
    e->n_idle--;
    e->idle_sole_stale = true;
}

/* What the running requests may still take: each one's reservation less the pages its
 * context holds now (a fork holds what it shares: its growth is only its own; one admitted
 * and not started, less the pages its admission counted on sharing). */
static uint64_t engine_host_growth(const akv_engine *e) {
    uint64_t g = 0;
    for (uint32_t i = 0; i < e->n_run; i++) {
        const akv_request *rq = e->run[i];
        const uint64_t held = rq->ctx ? engine_host_pages(e, rq->ctx->n_tokens) : rq->host_credit;
        g += rq->host_pages > held ? rq->host_pages - held : 0;
    }
    return g;
}

/* The pages that would be free once the closes in flight are done (the route frees a closed
 * sequence's pages at the next sync that finds nothing in flight), the leaving context (a
 * slot's restore) is closed and, with idle, every idle context no admitted request counts on
 * is closed: the pages only they hold (akv_host_tables_sole_pages), each once. The count with
 * the idle ones is kept until the idle set, the pool's pages or who shares them change.
 * Without the memory to count, none (admission then waits as if none could be freed). */
static bool idle_sole_fresh(const akv_engine *e, const akv_host_pool_stats *hs) {
    return !e->idle_sole_stale && hs->n_share_changes == e->idle_sole_shares &&
           hs->n_used == e->idle_sole_used && hs->n_allocs == e->idle_sole_allocs;
}

static uint64_t engine_freeable(akv_engine *e, bool idle) {
    akv_host_pool_stats hs;
    akv_host_pool_get_stats(e->hp, &hs);
    const bool keep = idle && !e->leaving;
    if (keep && idle_sole_fresh(e, &hs)) return e->idle_sole; /* nothing allocated, freed or shared since */
    const uint32_t n_closing = akv_route_closing_host_tables(e->route, NULL, 0);
    if (!n_closing && !e->leaving && !(idle && e->idle_head)) return 0;
    const akv_host_table **t = akv__malloc(((size_t)e->n_idle + n_closing + 1) * sizeof *t);
    uint64_t sole = 0;
    if (t) {
        uint32_t n = akv_route_closing_host_tables(e->route, t, n_closing);
        for (const akv__ctx *c = idle ? e->idle_head : NULL; c; c = c->next)
            if (!c->n_pin) t[n++] = akv_route_seq_host_table(c->seq);
        if (e->leaving) t[n++] = akv_route_seq_host_table(e->leaving->seq);
        if (akv_host_tables_sole_pages(t, n, &sole)) sole = 0;
        else if (keep)
            e->idle_sole = sole, e->idle_sole_stale = false, e->idle_sole_shares = hs.n_share_changes,
            e->idle_sole_used = hs.n_used, e->idle_sole_allocs = hs.n_allocs;
        akv__free(t);
    }
    return sole;
}

/* The pool's pages once the closes in flight are done, each once (pages whose deferred free
 * waits for a copy included): what the running and the idle contexts hold. */
static uint64_t engine_host_kept(akv_engine *e) {
    akv_host_pool_stats hs;
    akv_host_pool_get_stats(e->hp, &hs);
    return hs.n_used - engine_freeable(e, false);
}

/* The host pages the running requests hold (each once) and may still take: what closing the
 * idle contexts would leave them. Admission keeps it within the pool. */
static uint64_t engine_host_committed(akv_engine *e) {
    akv_host_pool_stats hs;
    akv_host_pool_get_stats(e->hp, &hs);
    return hs.n_used - engine_freeable(e, true) + engine_host_growth(e);
}

/* c's slot, given when it first runs or goes idle: the lowest number no other context holds. */
static void ctx_take_slot(akv_engine *e, akv__ctx *c) {
    for (uint32_t k = 1; !c->slot1; k++) {
        bool held = false;
        for (akv__ctx *o = e->idle_head; o && !held; o = o->next) held = o->slot1 == k;
        for (uint32_t i = 0; i < e->n_run && !held; i++)
            held = e->run[i]->ctx && e->run[i]->ctx->slot1 == k;
        if (!held) c->slot1 = k;
    }
}

static void idle_push(akv_engine *e, akv__ctx *c) {
    ctx_take_slot(e, c);
    c->prev = e->idle_tail, c->next = NULL;
    if (e->idle_tail) e->idle_tail->next = c;
    else e->idle_head = c;
    e->idle_tail = c;
    e->n_idle++;
    e->idle_sole_stale = true;
    c->last_used = e->clock;
}

void akv__ctx_close(akv_engine *e, akv__ctx *c) {
    if (!c) return;
    e->idle_sole_stale = true; /* pages it shared with idle ones may be theirs alone now */
    for (uint32_t i = 0; c->n_pin && i < e->n_run; i++) /* their credit is checked at start */
        if (e->run[i]->share_from == c) e->run[i]->share_from = NULL, e->run[i]->host_credit = 0, c->n_pin--;
    if (c->seq && akv_route_seq_close(e->route, c->seq) != AKV_OK)
        AKV_LOG_E("engine: a context could not be closed"); /* cannot happen: it is open */
    akv__free(c->tokens);
    akv__free(c);
}

/* Idle contexts closed, the lowest retention and least recently used first (none an admitted
 * request will start from), until at most max_idle remain and the pool's pages (once the
 * closes in flight are done) and the running requests' growth fit the pool. */
static void engine_trim_idle(akv_engine *e) {
    while (e->idle_head && (e->n_idle > e->plan.max_idle ||
                            engine_host_kept(e) + engine_host_growth(e) > e->plan.host_pages)) {
        akv__ctx *c = NULL; /* the lowest retention, least recently used among equals; not
                             * one an admitted request will start from */
        for (akv__ctx *o = e->idle_head; o; o = o->next)
            if (!o->n_pin && (!c || o->retention < c->retention)) c = o;
        if (!c) break;
        akv__engine_idle_remove(e, c);
        akv__spill_out(e, c); /* with a session directory: written there first */
        akv__ctx_close(e, c);
        e->stats.n_idle_closed++;
    }
}

akv_status akv__engine_idle_adopt(akv_engine *e, akv__ctx *c, bool keep) {
    /* the running requests' room comes first: an idle context that cannot sit beside what
     * they hold and may take, every other idle context closed, would be closed at once (its
     * pages are in the pool already: counted as held) */
    if (engine_host_committed(e) > e->plan.host_pages) {
        akv__ctx_close(e, c);
        return AKV_EFULL;
    }
    idle_push(e, c);
    if (keep) c->n_pin++; /* out of the trim's reach, as a context a request starts from */
    engine_trim_idle(e); /* older idle contexts first: this one is the most recent */
    if (keep) c->n_pin--, e->idle_sole_stale = true;
    return AKV_OK;
}

static akv_status ctx_append(akv__ctx *c, const int32_t *tok, uint32_t n) {
    size_t cap = c->cap;
    akv_status st = akv__array_reserve((void **)&c->tokens, &cap, (size_t)c->n_tokens + n,
                                       sizeof *c->tokens);
    if (st) return st;
    c->cap = (uint32_t)cap;
    memcpy(c->tokens + c->n_tokens, tok, (size_t)n * sizeof *tok);
    c->n_tokens += n;
    return AKV_OK;
}

/* The tokens of rq's prompt that context c holds: none when its compact part (fixed) or its
 * salt is not rq's. */
static uint32_t ctx_shares(const akv__ctx *c, const akv_request *rq) {
    if (c->exact != rq->p.kv_exact || c->salt != rq->p.cache_salt) return 0;
    return akv__common_prefix(c->tokens, c->n_tokens, rq->prompt, rq->p.n_prompt);
}

/* The context sharing the longest prefix with the prompt (NULL: none shares a token): an idle
 * one, or a running request's (*running: it is forked, and keeps running). */
static akv__ctx *engine_find_prefix(const akv_engine *e, const akv_request *rq, uint32_t *lcp,
                                    bool *running) {
    akv__ctx *best = NULL;
    *lcp = 0, *running = false;
    if (e->p.no_reuse) return NULL;
    for (akv__ctx *c = e->idle_head; c; c = c->next) {
        const uint32_t k = ctx_shares(c, rq);
        if (k > *lcp) *lcp = k, best = c;
    }
    for (uint32_t i = 0; i < e->n_run; i++) { /* a running one is forked: from a page on */
        akv__ctx *c = e->run[i]->ctx;
        const uint32_t k = c ? ctx_shares(c, rq) : 0;
        if (k > *lcp && k >= e->plan.geom.page_tokens) *lcp = k, best = c, *running = true;
    }
    return best;
}

/* Of a prefix of lcp tokens another context holds, the tokens rq takes as they are: the last
 * prompt token is always fed again (its logits start the generation), and a prompt whose
 * logits are reported computes every position from prompt_logits_from. */
static uint32_t request_cached(const akv_request *rq, uint32_t lcp) {
    uint32_t cached = lcp < rq->p.n_prompt ? lcp : rq->p.n_prompt - 1;
    if (rq->p.on_prompt_logits && cached > rq->p.prompt_logits_from) cached = rq->p.prompt_logits_from;
    return cached;
}

/* The host pages rq will hold from another context when it starts, as things are now: the full
 * pages of the prefix engine_start reuses (whether it forks that context or takes it over),
 * and that context (NULL: none). */
static uint64_t engine_start_share(const akv_engine *e, const akv_request *rq, akv__ctx **from) {
    uint32_t lcp;
    bool running;
    *from = engine_find_prefix(e, rq, &lcp, &running);
    const uint64_t full = *from ? request_cached(rq, lcp) / e->plan.geom.page_tokens : 0;
    if (!full) *from = NULL;
    return full * e->plan.geom.n_layers;
}

/* Whether a request that is computing its prompt shares at least a chunk more of this prompt
 * than any context holds now, and does not hold it yet: this one then waits for it (and forks
 * it) rather than computing the same prefix beside it (n choices of one prompt, a common
 * system prompt). */
static bool engine_wait_for_prefix(akv_engine *e, const akv_request *rq) {
    if (e->p.no_reuse || rq->p.on_prompt_logits) return false;
    uint32_t now = 0;
    bool running;
    (void)engine_find_prefix(e, rq, &now, &running);
    for (uint32_t i = 0; i < e->n_run; i++) {
        const akv_request *o = e->run[i];
        if (o == rq || !o->ctx || o->info.state != AKV_REQUEST_PREFILL || o->ctx->exact != rq->p.kv_exact ||
            o->ctx->salt != rq->p.cache_salt)
            continue;
        const uint32_t k = akv__common_prefix(o->prompt, o->p.n_prompt, rq->prompt, rq->p.n_prompt);
        if (k >= now + e->plan.chunk && k > o->ctx->n_tokens) return true;
    }
    return false;
}

/* Whether a request not started yet waits for a conversation being read back from the session
 * directory off the engine's thread (one that shares more of its prompt than any context in
 * memory, or one read ahead of it: akv__spill_in). */
static bool engine_wait_for_restore(akv_engine *e, akv_request *rq) {
    if (!e->session_dir || e->p.no_reuse || rq->no_read_back) return false;
    uint32_t lcp = 0;
    bool running;
    (void)engine_find_prefix(e, rq, &lcp, &running);
    return akv__spill_in(e, rq, lcp);
}

/* Its reservation, by arithmetic on prompt + max_tokens. */
static void request_need(const akv_engine *e, const akv_request *rq, uint64_t *host, uint32_t *dev) {
    uint64_t n = (uint64_t)rq->p.n_prompt + rq->p.max_tokens, pages = engine_pages(e, n);
    *host = pages * e->plan.geom.n_layers;
    *dev = akv_route_plan_need(&e->plan.route, &e->plan.geom, n, rq->p.kv_exact);
}

/* Whether it fits now, beside what is admitted, and how: its reservation less the full pages of
 * the prefix it will share (*credit, held by *from, pinned from its admission to its start)
 * beside what the running requests hold and may take, once the closes in flight are done; or,
 * where that leaves no room, with the idle contexts closed (*from's kept: it may hold more
 * than the prefix); or, failing that, its whole reservation with every idle context closed
 * (no credit: it may still share what it finds at its start). */
static bool engine_fits_now(akv_engine *e, const akv_request *rq, uint64_t *credit, akv__ctx **from) {
    uint64_t h;
    uint32_t d;
    request_need(e, rq, &h, &d);
    *credit = 0, *from = NULL;
    if (e->n_run >= e->plan.max_seqs || e->dev_reserved + d > e->plan.window_capacity) return false;
    const uint64_t share = engine_start_share(e, rq, from);
    const uint64_t kept = engine_host_kept(e), growth = engine_host_growth(e);
    *credit = share;
    if (kept + growth + h - share <= e->plan.host_pages) return true;
    if (!e->idle_head) return *credit = 0, *from = NULL, false;
    akv_host_pool_stats hs;
    akv_host_pool_get_stats(e->hp, &hs);
    const uint64_t freeable = engine_freeable(e, true), held = hs.n_used - freeable;
    /* with the credit: what the idle ones free, less at most all of the one it shares from */
    uint64_t its = 0;
    if (*from && !(*from)->owner && !(*from)->n_pin) its = engine_host_pages(e, (*from)->n_tokens);
    const uint64_t freed_less = freeable > its ? freeable - its : 0;
    if (hs.n_used - freed_less + growth + h - share <= e->plan.host_pages) return true;
    *credit = 0, *from = NULL;
    return held + growth + h <= e->plan.host_pages;
}

/* Admits a request that fits now (engine_fits_now's credit and source): its reservation, the
 * pages it will share (the context that holds them pinned until it starts) and its place among
 * the running (its context is found or made at its first step, akv_engine_step: that may touch
 * the device). */
static void engine_admit(akv_engine *e, akv_request *rq, uint64_t credit, akv__ctx *from) {
    request_need(e, rq, &rq->host_pages, &rq->dev_pages);
    rq->host_credit = credit, rq->share_from = from;
    if (from) from->n_pin++, e->idle_sole_stale = true;
    rq->admitted = true;
    e->host_reserved += rq->host_pages, e->dev_reserved += rq->dev_pages;
    e->run[e->n_run++] = rq;
    rq->info.state = AKV_REQUEST_PREFILL;
    rq->info.t_admit = akv_clock_s();
    if (akv_trace_level_of(e->p.trace) == AKV_TRACE_SPANS) { /* its track, its time queued */
        char name[AKV_TRACE_NAME_MAX];
        snprintf(name, sizeof name, "request %llu (id %llu)", (unsigned long long)rq->info.serial,
                 (unsigned long long)rq->p.id);
        akv_trace_track(e->p.trace, AKV_TRACE_TRACK_REQUEST + (uint32_t)rq->info.serial, name);
        akv_trace_span(e->p.trace, AKV_TRACE_TRACK_REQUEST + (uint32_t)rq->info.serial, "queued",
                       (uint64_t)(rq->info.t_submit * 1e9), (uint64_t)(rq->info.t_admit * 1e9),
                       "prompt", rq->p.n_prompt, "max_tokens", rq->p.max_tokens);
    }
}

/* An admitted request's context: the idle one that shares its prefix, truncated to it when what
 * it holds beyond is less than a page (the same conversation, going on), else forked (another
 * conversation sharing a prefix, a system prompt: it stays whole); a fork of a running one's;
 * or a new sequence. A fork shares the full pages of the prefix (akv_route_seq_fork). Idle
 * contexts closed while the host pages would not fit. */
static akv_status engine_start(akv_engine *e, akv_request *rq) {
    uint32_t lcp = 0;
    bool running = false;
    akv__ctx *c = engine_find_prefix(e, rq, &lcp, &running); /* what the directory held is read back */
    uint32_t cached = request_cached(rq, lcp);
    akv_route_seq_params sp = {.max_history = (uint64_t)rq->p.n_prompt + rq->p.max_tokens,
                               .target = e->plan.route.target,
                               .burst = e->plan.route.burst,
                               .tag = rq->p.id,
                               .exact = rq->p.kv_exact};
    akv_status st;
    bool forked = false;
    /* forked, not taken over, where it is another conversation (a page or more beyond) or
     * another admitted request counts on its pages */
    const bool others = c && c->n_pin > (rq->share_from == c);
    if (c && cached > 0 && (running || others || c->n_tokens - cached >= e->plan.geom.page_tokens)) {
        akv__ctx *from = c;
        if (!running) akv__engine_idle_remove(e, from); /* out of the trim's reach while it is forked */
        engine_trim_idle(e); /* room for its growth, its private copy of a partial page too */
        st = (c = akv__calloc(1, sizeof *c)) ? AKV_OK : AKV_ENOMEM;
        if (!st) {
            c->exact = rq->p.kv_exact, c->salt = rq->p.cache_salt;
            if (!(st = ctx_append(c, from->tokens, cached)))
                st = akv_route_seq_fork(e->route, from->seq, cached, &sp, &c->seq);
            if (st) akv__free(c->tokens), akv__free(c), c = NULL;
        }
        /* an idle source is idle again, the most recent; closed (spilled first) by the trim
         * if it cannot stay beside the reservations, the new one's included */
        if (!running) idle_push(e, from), engine_trim_idle(e);
        if (st && st != AKV_EFULL) return st;
        /* EFULL: the idle contexts still hold the pool (their pages are not all reclaimable
         * now): the prompt is computed instead */
        if (st) cached = 0;
        else e->stats.n_forked++, forked = true;
    }
    if (forked) {
        /* the fork is its context */
    } else if (c && cached > 0) {
        if (cached < c->n_tokens) akv__spill_out(e, c); /* the whole conversation kept on disk */
        st = akv_route_seq_truncate(e->route, c->seq, cached);
        if (!st) st = akv_route_seq_set_params(e->route, c->seq, &sp);
        /* a failed truncate leaves it idle as long as it was; one that found no room for the
         * private copy of a page it shares (EFULL): the prompt is computed instead */
        if (st && st != AKV_EFULL) return st; /* the step fails and is tried again */
        if (st) c = NULL, cached = 0;
        else akv__engine_idle_remove(e, c), c->n_tokens = cached;
    } else {
        c = NULL; /* nothing shared */
    }
    if (!c) { /* a new sequence */
        cached = 0;
        c = akv__calloc(1, sizeof *c);
        if (!c) return AKV_ENOMEM;
        if ((st = akv_route_seq_open(e->route, &sp, &c->seq))) {
            akv__free(c);
            return st;
        }
        c->exact = rq->p.kv_exact, c->salt = rq->p.cache_salt;
    }
    ctx_take_slot(e, c);
    c->owner = rq;
    rq->ctx = c;
    rq->prefill0 = cached;
    rq->info.n_cached = cached;
    e->stats.cached_tokens += cached;
    akv_route_seq_get_stats(c->seq, &rq->seq0);
    engine_trim_idle(e);
    return AKV_OK;
}

/* The context rq counted on no longer pinned for it: it has started, or ended before. */
static void request_unpin(akv_engine *e, akv_request *rq) {
    if (rq->share_from) rq->share_from->n_pin--, e->idle_sole_stale = true;
    rq->share_from = NULL, rq->host_credit = 0;
}

bool akv__engine_read_fits(akv_engine *e, const akv_request *rq, uint64_t n_tokens, uint32_t k,
                           uint64_t *credit) {
    *credit = request_cached(rq, k) / e->plan.geom.page_tokens * e->plan.geom.n_layers;
    const uint64_t grows_now = rq->host_pages > rq->host_credit ? rq->host_pages - rq->host_credit : 0;
    const uint64_t grows = rq->host_pages > *credit ? rq->host_pages - *credit : 0;
    return engine_host_committed(e) - grows_now + grows + engine_host_pages(e, n_tokens) <=
           e->plan.host_pages;
}

void akv__engine_read_for(akv_engine *e, akv_request *rq, akv__ctx *c, uint64_t credit) {
    request_unpin(e, rq);
    rq->share_from = c, rq->host_credit = credit;
    c->n_pin++, e->idle_sole_stale = true;
}

/* An admitted request's reservation and place among the running given back (its pin too). */
static void engine_release_admission(akv_engine *e, akv_request *rq) {
    request_unpin(e, rq);
    e->host_reserved -= rq->host_pages, e->dev_reserved -= rq->dev_pages;
    rq->admitted = false;
    uint32_t k = 0;
    for (uint32_t i = 0; i < e->n_run; i++)
        if (e->run[i] != rq) e->run[k++] = e->run[i];
    e->n_run = k;
}

/* Back to the head of the queue, as it was before its admission: a request whose start found
 * less to share than its admission counted on (the context closed meanwhile, or no room for a
 * fork's private page), where the running requests' room would not hold with it. Its context
 * goes idle (a fork, or a conversation it took over) or is closed (new, empty). */
static void engine_unadmit(akv_engine *e, akv_request *rq) {
    akv__ctx *c = rq->ctx;
    c->owner = NULL, rq->ctx = NULL;
    e->stats.cached_tokens -= rq->info.n_cached;
    rq->info.n_cached = 0;
    if (c->n_tokens) idle_push(e, c);
    else akv__ctx_close(e, c);
    engine_release_admission(e, rq);
    rq->info.state = AKV_REQUEST_QUEUED;
    akv_request *after = e->unadmit_after; /* NULL: the head */
    rq->prev_q = after, rq->next_q = after ? after->next_q : e->wait_head;
    if (rq->next_q) rq->next_q->prev_q = rq;
    else e->wait_tail = rq;
    if (after) after->next_q = rq;
    else e->wait_head = rq;
    e->unadmit_after = rq;
    e->n_wait++; /* it had its place: the queue may pass max_queue by it */
    e->stats.n_unadmitted++;
}

/* engine_start, and the promise checked after it: what it shares is known now. */
static akv_status engine_start_checked(akv_engine *e, akv_request *rq, bool *unadmitted) {
    *unadmitted = false;
    akv_status st = engine_start(e, rq);
    if (st) return st; /* still pinned: tried again at the next step */
    request_unpin(e, rq);
    if (engine_host_committed(e) <= e->plan.host_pages) return AKV_OK;
    engine_unadmit(e, rq);
    *unadmitted = true;
    engine_trim_idle(e);
    return AKV_OK;
}

/* A request that ended: its traffic, its place and reservation given back, its context idle
 * (kept for reuse) or closed. */
static void engine_retire(akv_engine *e, akv_request *rq) {
    akv__ctx *c = rq->ctx;
    if (c) {
        akv_route_seq_stats s;
        akv_route_seq_get_stats(c->seq, &s);
        rq->info.h2d_bytes = s.h2d_bytes - rq->seq0.h2d_bytes;
        rq->info.staged_bytes = s.staged_bytes - rq->seq0.staged_bytes;
        rq->info.d2h_bytes = s.d2h_bytes - rq->seq0.d2h_bytes;
        c->owner = NULL;
        rq->ctx = NULL;
        if (rq->info.finish == AKV_FINISH_ERROR || e->p.no_reuse || c->n_tokens == 0) {
            akv__ctx_close(e, c);
        } else {
            c->retention = rq->p.retention < 0 ? -1 : rq->p.retention > 0 ? 1 : 0;
            idle_push(e, c);
        }
    }
    if (rq->admitted) engine_release_admission(e, rq);
    e->stats.n_finished[rq->info.finish]++;
    engine_trim_idle(e);
}

static void wait_remove(akv_engine *e, akv_request *rq) {
    if (rq->prev_q) rq->prev_q->next_q = rq->next_q;
    else e->wait_head = rq->next_q;
    if (rq->next_q) rq->next_q->prev_q = rq->prev_q;
    else e->wait_tail = rq->prev_q;
    rq->next_q = rq->prev_q = NULL;
    e->n_wait--;
}

static void all_remove(akv_engine *e, akv_request *rq) {
    if (rq->prev_all) rq->prev_all->next_all = rq->next_all;
    else e->all = rq->next_all;
    if (rq->next_all) rq->next_all->prev_all = rq->prev_all;
}

/* A request that has ended and been released is freed. */
static void engine_maybe_free(akv_engine *e, akv_request *rq) {
    if (!rq->released || rq->info.state != AKV_REQUEST_DONE) return;
    all_remove(e, rq);
    akv__request_free(rq);
}

/* Waiting requests admitted in arrival order while the head fits. */
static void engine_admit_waiting(akv_engine *e) {
    uint64_t credit;
    akv__ctx *from;
    while (e->wait_head && engine_fits_now(e, e->wait_head, &credit, &from)) {
        akv_request *rq = e->wait_head;
        wait_remove(e, rq);
        engine_admit(e, rq, credit, from);
    }
}

void akv_engine_destroy(akv_engine *e) {
    if (!e) return;
    /* requests: no events any more; contexts closed */
    while (e->all) {
        akv_request *rq = e->all;
        rq->released = true;
        if (rq->info.state != AKV_REQUEST_DONE) {
            if (rq->next_q || rq->prev_q || e->wait_head == rq) wait_remove(e, rq);
            rq->info.state = AKV_REQUEST_DONE, rq->info.finish = AKV_FINISH_CANCELLED;
            engine_retire(e, rq);
        }
        all_remove(e, rq);
        akv__request_free(rq);
    }
    e->plan.max_idle = 0;
    engine_trim_idle(e); /* every idle context (into the session directory, when there is one) */
    akv__spill_close(e);
    if (e->route) {
        if (akv_route_sync(e->route) != AKV_OK) (void)akv_route_sync(e->route);
        if (akv_route_destroy(e->route) != AKV_OK)
            AKV_LOG_E("engine: the route could not be released (its device work did not end)");
    }
    akv_forward_destroy(e->fh);
    akv_forward_dev_destroy(e->fd);
    if (akv_dev_pool_destroy(e->dp) != AKV_OK) AKV_LOG_E("engine: the device pool is still held");
    if (akv_dev_pool_destroy(e->dpc) != AKV_OK)
        AKV_LOG_E("engine: the compact pool is still held");
    if (akv_host_pool_destroy(e->hp) != AKV_OK) AKV_LOG_E("engine: the host pool is still held");
    if (akv_host_pool_destroy(e->hpc) != AKV_OK)
        AKV_LOG_E("engine: the compact copies' host pool is still held");
    akv__vocab_free(&e->vocab);
    akv__free(e->eog);
    akv_tok_destroy(e->tok);
    akv_model_destroy(e->own_model);
    if (akv_dev_destroy(e->dev) != AKV_OK) AKV_LOG_E("engine: the device is still busy");
    akv__free(e->run), akv__free(e->reqs), akv__free(e->batch), akv__free(e->n_new);
    akv__free(e->pos0), akv__free(e->order), akv__free(e->lmode), akv__free(e->tokens);
    akv__free(e->chosen);
    akv__free(e->draw);
    akv__free(e->pen);
    akv__free(e->logits);
    akv__free(e);
}

/* ---- submit, cancel, release ---------------------------------------------------------------- */

static akv_status engine_refuse(akv_engine *e, akv_refusal *rf, akv_refusal_reason why,
                                const char *field, akv_status st, const char *fmt, ...)
    AKV_PRINTF(6, 7);
static akv_status engine_refuse(akv_engine *e, akv_refusal *rf, akv_refusal_reason why,
                                const char *field, akv_status st, const char *fmt, ...) {
    akv_refusal r = {.reason = why, .field = field};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.message, sizeof r.message, fmt, ap);
    va_end(ap);
    e->stats.n_refused[why]++;
    AKV_LOG_I("engine: request refused (%s): %s", akv_refusal_reason_name(why), r.message);
    if (rf) *rf = r;
    return st;
}

akv_status akv_engine_submit(akv_engine *e, const akv_request_params *p, akv_request **out,
                             akv_refusal *rf) {
    if (out) *out = NULL;
    if (rf) memset(rf, 0, sizeof *rf);
    if (!e || !p || !out) return AKV_EINVAL;
    e->stats.n_submitted++;
    if (e->failed)
        return engine_refuse(e, rf, AKV_REFUSE_FAILED, NULL, AKV_EDEVICE,
                             "the engine's device failed and did not recover");
    if (!p->prompt || p->n_prompt == 0)
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "prompt", AKV_EINVAL,
                             "the prompt is empty (at least one token)");
    if (p->max_tokens == 0)
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "max_tokens", AKV_EINVAL,
                             "{=max_tokens} is 0 (at least one new token)");
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= e->cfg.n_vocab)
            return engine_refuse(e, rf, AKV_REFUSE_INVALID, "prompt", AKV_EINVAL,
                                 "prompt token %u is %d, outside the vocabulary [0, %u)", i,
                                 p->prompt[i], e->cfg.n_vocab);
    if (p->n_bias > AKV_MAX_LOGIT_BIAS || (p->n_bias && !p->bias))
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "logit_bias", AKV_EINVAL,
                             "{=logit_bias} holds %u tokens; at most %u", p->n_bias, AKV_MAX_LOGIT_BIAS);
    for (uint32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].token < 0 || (uint32_t)p->bias[i].token >= e->cfg.n_vocab || !isfinite(p->bias[i].bias))
            return engine_refuse(e, rf, AKV_REFUSE_INVALID, "logit_bias", AKV_EINVAL,
                                 "{=logit_bias}: token %d (bias %g) is outside the vocabulary [0, %u) "
                                 "or its bias is not a finite number",
                                 p->bias[i].token, (double)p->bias[i].bias, e->cfg.n_vocab);
    if ((unsigned)p->format > AKV_FORMAT_JSON_SCHEMA)
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "format", AKV_EINVAL,
                             "format %u is no akv_format", (unsigned)p->format);
    if ((p->format == AKV_FORMAT_JSON_SCHEMA) != (p->schema != NULL) ||
        (p->schema && (!p->schema->nodes || p->schema->n_nodes == 0)))
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "schema", AKV_EINVAL,
                             "format JSON_SCHEMA takes a compiled schema, and only it does");
    if (p->format != AKV_FORMAT_TEXT && !e->tok)
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "format", AKV_EUNSUPPORTED,
                             "a JSON answer needs the model's tokenizer (its pieces); this model "
                             "has none");
    for (uint32_t i = 0; i < p->n_stop; i++)
        if (!p->stop || !p->stop[i])
            return engine_refuse(e, rf, AKV_REFUSE_INVALID, "stop", AKV_EINVAL,
                                 "stop string %u is NULL", i);
    const uint64_t total = (uint64_t)p->n_prompt + p->max_tokens;
    if (total > e->plan.max_context)
        return engine_refuse(e, rf, AKV_REFUSE_CONTEXT, "max_context", AKV_EFULL,
                             "the prompt (%u tokens) plus {=max_tokens} %u is %llu tokens; "
                             "{=max_context} is %llu: lower {=max_tokens} or raise {=max_context}",
                             p->n_prompt, p->max_tokens, (unsigned long long)total,
                             (unsigned long long)e->plan.max_context);
    akv_request *rq = akv__calloc(1, sizeof *rq);
    if (!rq) return AKV_ENOMEM;
    akv_status st = akv__request_init(e, rq, p);
    rq->info.serial = e->stats.n_submitted;
    if (e->plan.route.tier == AKV_REPR_EXACT) rq->p.kv_exact = false; /* every history is exact */
    if (st) {
        akv__request_free(rq);
        return engine_refuse(e, rf, AKV_REFUSE_INVALID, "sample", st,
                             "the request could not be set up: %s", akv_status_str(st));
    }
    uint64_t h;
    uint32_t d;
    /* the gate per context: a history too short for compaction to pay stays exact, where its
     * exact reservation fits the device pool at all (else it is compacted as any) */
    if (!rq->p.kv_exact && !rq->p.kv_compact && total <= e->plan.exact_below) {
        rq->p.kv_exact = true;
        request_need(e, rq, &h, &d);
        rq->p.kv_exact = d <= e->plan.window_capacity;
    }
    rq->info.kv_exact = rq->p.kv_exact;
    request_need(e, rq, &h, &d);
    if (h > e->plan.host_pages || d > e->plan.window_capacity) {
        akv__request_free(rq);
        if (h > e->plan.host_pages)
            return engine_refuse(e, rf, AKV_REFUSE_HOST, "host_gib", AKV_EFULL,
                                 "prompt + {=max_tokens} = %llu tokens need %llu host pages; the "
                                 "host pool holds %llu: raise {=host_gib} or lower {=max_tokens}",
                                 (unsigned long long)total, (unsigned long long)h,
                                 (unsigned long long)e->plan.host_pages);
        if (p->kv_exact && e->plan.route.tier != AKV_REPR_EXACT)
            return engine_refuse(e, rf, AKV_REFUSE_DEVICE, "kv_exact", AKV_EFULL,
                                 "prompt + {=max_tokens} = %llu tokens kept exact ({=kv_exact}) "
                                 "need %u window pages per layer; the device pool's exact part "
                                 "holds %u: let its older history be %s, lower {=max_tokens}, "
                                 "or raise {=device_gib}",
                                 (unsigned long long)total, d, e->plan.window_capacity,
                                 akv_repr_name(e->plan.route.tier));
        return engine_refuse(e, rf, AKV_REFUSE_DEVICE, "device_gib", AKV_EFULL,
                             "prompt + {=max_tokens} = %llu tokens need %u resident window pages "
                             "per layer; the device pool holds %u: raise {=device_gib}, lower "
                             "{=max_tokens}, or use the staged route",
                             (unsigned long long)total, d, e->plan.window_capacity);
    }
    rq->info.t_submit = akv_clock_s();
    rq->info.state = AKV_REQUEST_QUEUED;
    uint64_t credit;
    akv__ctx *from;
    if (!e->wait_head && engine_fits_now(e, rq, &credit, &from)) {
        engine_admit(e, rq, credit, from);
    } else if (e->n_wait < e->plan.max_queue) {
        rq->prev_q = e->wait_tail;
        if (e->wait_tail) e->wait_tail->next_q = rq;
        else e->wait_head = rq;
        e->wait_tail = rq;
        e->n_wait++;
    } else {
        akv__request_free(rq);
        if (e->plan.max_queue == 0)
            return engine_refuse(e, rf, AKV_REFUSE_BUSY, "max_seqs", AKV_EFULL,
                                 "%u of {=max_seqs} %u sequences run, holding or reserving %llu "
                                 "of %llu host pages, and this one needs %llu; nothing waits "
                                 "({=max_queue} 0): retry later, or raise {=max_seqs}, {=host_gib} "
                                 "or {=max_queue}",
                                 e->n_run, e->plan.max_seqs,
                                 (unsigned long long)engine_host_committed(e),
                                 (unsigned long long)e->plan.host_pages, (unsigned long long)h);
        return engine_refuse(e, rf, AKV_REFUSE_QUEUE, "max_queue", AKV_EFULL,
                             "the wait queue is full ({=max_queue} %u): retry later, or raise "
                             "{=max_queue} or {=max_seqs}",
                             e->plan.max_queue);
    }
    rq->next_all = e->all;
    if (e->all) e->all->prev_all = rq;
    e->all = rq;
    *out = rq;
    return AKV_OK;
}

void akv_engine_cancel(akv_engine *e, akv_request *rq) {
    if (!e || !rq || rq->info.state == AKV_REQUEST_DONE) return;
    if (!rq->admitted) wait_remove(e, rq);
    akv__request_end(rq, AKV_FINISH_CANCELLED);
    engine_retire(e, rq);
    engine_maybe_free(e, rq);
}

void akv_engine_release(akv_engine *e, akv_request *rq) {
    if (!e || !rq) return;
    rq->released = true; /* no event from here on */
    if (rq->info.state != AKV_REQUEST_DONE) akv_engine_cancel(e, rq); /* frees it */
    else engine_maybe_free(e, rq);
}

bool akv_engine_busy(const akv_engine *e) {
    return e->n_run || e->n_wait || (e->read_back.job && !e->failed); /* a read back is adopted at a step */
}

bool akv_engine_failed(const akv_engine *e) {
    return e->failed;
}

/* ---- the step ------------------------------------------------------------------------------- */

/* The next piece of a request's stream (engine_impl.h). Decoding: everything up to its last
 * sampled token (one token, or more after a step was lost). A prompt: up to the next multiple
 * of chunk from where its prefill began (or the prompt's end), then as many more whole chunks
 * as `room` holds. */
static uint32_t engine_piece(const akv_engine *e, const akv_request *rq, uint32_t room) {
    const uint32_t have = rq->ctx->n_tokens;
    if (rq->info.state == AKV_REQUEST_DECODE) return rq->p.n_prompt + rq->info.n_gen - have;
    uint32_t chunk = e->plan.chunk, left = rq->p.n_prompt - have;
    uint32_t piece = chunk - (have - rq->prefill0) % chunk;
    /* one chunk: a compact tier's exact window holds one step of a sequence (the plan's
     * max_step) */
    if (e->plan.route.tier != AKV_REPR_EXACT) room = 0;
    if (rq->p.on_prompt_logits) { /* one chunk (the device pass: a piece): its logits fit */
        room = 0;
        if (e->fd && piece > engine_dev_logit_rows(e)) piece = engine_dev_logit_rows(e);
    }
    if (room > piece) piece += (room - piece) / chunk * chunk;
    return piece < left ? piece : left;
}

/* The batch: every decoding request, then prompt pieces in arrival order (no overtaking)
 * while the prompts' room lasts: beside decodes prefill_beside tokens (their next token waits
 * for at most that much prompt work), in a step where nothing decodes the whole step budget
 * (larger products run faster). Ordered by count for the pass (stable). Returns its size. */
static uint32_t engine_batch(akv_engine *e) {
    uint32_t n = 0, total = 0, prompt_room = 0;
    bool logit_chunk = false; /* one chunk a step returns its logits */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            prompt_room = total < e->plan.step_tokens ? e->plan.step_tokens - total : 0;
            if (n && prompt_room > e->plan.prefill_beside) prompt_room = e->plan.prefill_beside;
        }
        for (uint32_t i = 0; i < e->n_run; i++) {
            akv_request *rq = e->run[i];
            if ((rq->info.state == AKV_REQUEST_DECODE) != (pass == 0) || !rq->ctx) continue;
            const uint32_t piece = engine_piece(e, rq, prompt_room);
            if (pass == 1) {
                if (piece > prompt_room || (rq->p.on_prompt_logits && logit_chunk))
                    break; /* no overtaking */
                prompt_room -= piece;
                logit_chunk |= rq->p.on_prompt_logits != NULL;
            }
            e->batch[n] = rq, e->n_new[n++] = piece;
            total += piece;
        }
    }
    /* stable order by count (insertion sort of at most max_seqs) */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && e->n_new[j - 1] > e->n_new[j]; j--) {
            akv_request *t = e->batch[j];
            uint32_t k = e->n_new[j];
            e->batch[j] = e->batch[j - 1], e->n_new[j] = e->n_new[j - 1];
            e->batch[j - 1] = t, e->n_new[j - 1] = k;
        }
    return n;
}

/* A step failed on batch[0..n): each request counts it; one on which AKV__ENGINE_MAX_RETRIES
 * steps in a row failed ends with ERROR. */
static void engine_step_failed(akv_engine *e, uint32_t n, akv_status st) {
    e->stats.n_step_failures++;
    for (uint32_t k = 0; k < n; k++) {
        akv_request *rq = e->batch[k];
        rq->info.n_retries++;
        if (++rq->n_fail < AKV__ENGINE_MAX_RETRIES) continue;
        AKV_LOG_E("engine: request %llu: %u steps in a row failed (%s); it ends with an error",
                  (unsigned long long)rq->p.id, rq->n_fail, akv_status_str(st));
        rq->info.error = st;
        akv__request_end(rq, AKV_FINISH_ERROR);
        engine_retire(e, rq);
        engine_maybe_free(e, rq);
    }
}

/* Every context's length is the route's: a call that settled a failed step may have undone
 * it (akv/route.h). A running request then feeds its stream on from what remains. */
static void engine_resync(akv_engine *e) {
    for (uint32_t i = 0; i < e->n_run; i++) {
        akv__ctx *c = e->run[i]->ctx;
        if (!c) continue;
        /* only ever shorter: a route longer than the tokens the context holds is a failed step
         * not yet undone (need_abort), whose positions the engine never took */
        const uint32_t len = (uint32_t)akv_route_seq_n_tokens(c->seq);
        if (len < c->n_tokens) e->idle_sole_stale = true, c->n_tokens = len;
    }
    for (akv__ctx *c = e->idle_head; c; c = c->next) {
        uint32_t len = (uint32_t)akv_route_seq_n_tokens(c->seq);
        if (len < c->n_tokens) {
            e->idle_sole_stale = true;
            c->n_tokens = len;
        }
    }
}

/* The device did not recover: every request ends with ERROR; new ones are refused. */
static akv_status engine_fail(akv_engine *e, akv_status st) {
    AKV_LOG_E("engine: the device did not recover (%s); every request ends with an error",
              akv_status_str(st));
    e->failed = true;
    while (e->wait_head) {
        akv_request *rq = e->wait_head;
        wait_remove(e, rq);
        rq->info.error = st;
        akv__request_end(rq, AKV_FINISH_ERROR);
        e->stats.n_finished[AKV_FINISH_ERROR]++;
        engine_maybe_free(e, rq);
    }
    while (e->n_run) {
        akv_request *rq = e->run[0];
        rq->info.error = st;
        akv__request_end(rq, AKV_FINISH_ERROR);
        engine_retire(e, rq);
        engine_maybe_free(e, rq);
    }
    return AKV_EDEVICE;
}

/* A step's pass failed: the route undoes it (abort); if even that fails (the device has not
 * recovered), the next step tries again, and after AKV__ENGINE_MAX_RECOVERIES tries in a row
 * the engine gives up on the device. */
static akv_status engine_abort(akv_engine *e) {
    akv_status st = akv_route_abort_step(e->route);
    if (st == AKV_OK) {
        e->need_abort = false, e->n_abort_fail = 0;
        return AKV_OK;
    }
    e->need_abort = true;
    if (++e->n_abort_fail >= AKV__ENGINE_MAX_RECOVERIES) return engine_fail(e, st);
    return st;
}

/* ---- the trace (akv/trace.h) ----------------------------------------------------------------- */

/* After a step that ran the pass from t_fwd0 to t_fwd1 (host ns) over n sequences (the batch
 * as it was: e->batch, e->n_new) and n_tok tokens: the step on the engine's track, each
 * request's part on its own, the staged layers of the last retired step on the device's
 * queues (spans level); the figures of one stats snapshot as counters (counters level). */
static void engine_trace_step(akv_engine *e, uint32_t n, uint32_t n_tok, bool decode, uint64_t t_step0,
                              uint64_t t_fwd0, uint64_t t_fwd1) {
    akv_trace *tr = e->p.trace;
    const uint64_t now = akv_clock_ns();
    if (akv_trace_level_of(tr) == AKV_TRACE_SPANS) {
        if (e->stats.n_steps == 1) {
            akv_trace_track(tr, AKV_TRACE_TRACK_ENGINE, "engine");
            akv_trace_track(tr, AKV_TRACE_TRACK_H2D, "device: copies in");
            akv_trace_track(tr, AKV_TRACE_TRACK_COMPUTE, "device: compute");
        }
        akv_trace_span(tr, AKV_TRACE_TRACK_ENGINE, decode ? "decode step" : "step", t_step0, now,
                       "sequences", n, "tokens", n_tok);
        akv_trace_span(tr, AKV_TRACE_TRACK_ENGINE, "forward", t_fwd0, t_fwd1, NULL, 0, NULL, 0);
        for (uint32_t k = 0; k < n; k++)
            akv_trace_span(tr, AKV_TRACE_TRACK_REQUEST + (uint32_t)e->batch[k]->info.serial,
                           e->pos0[k] < e->batch[k]->p.n_prompt ? "prefill" : "decode", t_fwd0, t_fwd1,
                           "tokens", e->n_new[k], "batch", n);
        /* the staged layers, in device time, placed from the host's first submission (the
         * stage's origin is recorded right before it) */
        akv_route_layer_times lt[256];
        const uint32_t L = akv_route_step_times(e->route, lt, 256);
        if (L && L <= 256 && lt[0].step + 1 > e->trace_step && lt[0].host_copied_ns) {
            e->trace_step = lt[0].step + 1;
            const uint64_t base = lt[0].host_copied_ns - lt[0].copy_start_ns;
            for (uint32_t l = 0; l < L; l++) {
                if (lt[l].copy_done_ns > lt[l].copy_start_ns)
                    akv_trace_span(tr, AKV_TRACE_TRACK_H2D, "copies", base + lt[l].copy_start_ns,
                                   base + lt[l].copy_done_ns, "layer", l, "bus waited for the host",
                                   lt[l].bus_idle_at_copy);
                if (lt[l].attn_done_ns > lt[l].attn_start_ns)
                    akv_trace_span(tr, AKV_TRACE_TRACK_COMPUTE, "attention", base + lt[l].attn_start_ns,
                                   base + lt[l].attn_done_ns, "layer", l, NULL, 0);
            }
        }
    }
    akv_engine_stats s;
    akv_engine_get_stats(e, &s);
    akv_trace_counter(tr, "steps", now, (double)s.n_steps);
    akv_trace_counter(tr, "prompt tokens", now, (double)s.prompt_tokens);
    akv_trace_counter(tr, "generated tokens", now, (double)s.gen_tokens);
    akv_trace_counter(tr, "requests running", now, s.n_running);
    akv_trace_counter(tr, "requests waiting", now, s.n_queued);
    akv_trace_counter(tr, "host pages reserved", now, (double)s.host_pages_reserved);
}

akv_status akv_engine_step(akv_engine *e, bool *did_work) {
    if (did_work) *did_work = false;
    if (!e) return AKV_EINVAL;
    if (e->failed) return AKV_EDEVICE;
    const double t0 = akv_clock_s();
    akv_status st = AKV_OK;
    if (e->need_abort) st = engine_abort(e);
    engine_resync(e);
    if (st) goto out;
    akv__spill_poll(e); /* a read back that has ended: its context idle before anyone looks */
    engine_admit_waiting(e);
    /* the admitted requests' first step: their contexts */
    e->unadmit_after = NULL;
    const bool spans = akv_trace_level_of(e->p.trace) == AKV_TRACE_SPANS;
    for (uint32_t i = 0; i < e->n_run && !st; i++) {
        bool back = false; /* an unadmitted one left the list: the next is at i */
        if (!e->run[i]->ctx && !engine_wait_for_prefix(e, e->run[i]) &&
            !engine_wait_for_restore(e, e->run[i])) {
            const uint64_t ts = spans ? akv_clock_ns() : 0;
            const uint64_t serial = e->run[i]->info.serial;
            st = engine_start_checked(e, e->run[i], &back);
            if (spans) /* its context found (read back from the session directory before), forked or made */
                akv_trace_span(e->p.trace, AKV_TRACE_TRACK_ENGINE, "start", ts, akv_clock_ns(),
                               "request", serial, NULL, 0);
        }
        if (back) i--;
    }
    if (st) {
        engine_resync(e);
        goto out;
    }
    const uint32_t n = engine_batch(e);
    if (n == 0) { /* nothing to step: a little of the wait for a read back, if one is under way */
        akv__spill_wait(e, ENGINE_RESTORE_WAIT_S);
        goto out;
    }
    uint32_t n_tok = 0, n_rows = 0, n_pen = 0;
    for (uint32_t k = 0; k < n; k++) {
        akv_request *rq = e->batch[k];
        akv__ctx *c = rq->ctx;
        e->pos0[k] = c->n_tokens;
        e->reqs[k] = (akv_route_req){.seq = c->seq, .n_tokens = (uint64_t)c->n_tokens + e->n_new[k]};
        const bool wants = c->n_tokens + e->n_new[k] == rq->p.n_prompt + rq->info.n_gen;
        const bool all = rq->p.on_prompt_logits && rq->info.state == AKV_REQUEST_PREFILL &&
                         c->n_tokens + e->n_new[k] > rq->p.prompt_logits_from;
        /* a plain greedy choice is the pass's, and so is a draw at a temperature on the
         * device pass: its id comes back, not its row */
        e->lmode[k] = all                               ? AKV_FORWARD_LOGITS_ALL
                      : wants && akv__request_greedy(rq) ? AKV_FORWARD_LOGITS_ARGMAX
                      : wants && e->fd && !e->p.host_sampling &&
                              akv__request_draw(rq, &e->draw[k], e->pen + n_pen,
                                                e->pen + (size_t)e->plan.max_seqs * AKV_FORWARD_SAMPLE_PEN_MAX + n_pen)
                          ? AKV_FORWARD_LOGITS_SAMPLE
                      : wants ? AKV_FORWARD_LOGITS_LAST
                              : AKV_FORWARD_LOGITS_NONE;
        if (e->lmode[k] == AKV_FORWARD_LOGITS_SAMPLE) e->draw[k].pen_off = n_pen, n_pen += e->draw[k].pen_n;
        n_rows += akv_forward_mode_rows(e->lmode[k], e->n_new[k]);
        for (uint32_t j = 0; j < e->n_new[k]; j++)
            e->tokens[n_tok + j] = akv__request_stream(rq, c->n_tokens + j);
        n_tok += e->n_new[k];
    }
    /* a decode step: every sequence one token past its prompt; its traffic is counted apart */
    bool decode = true;
    for (uint32_t k = 0; k < n && decode; k++)
        decode = e->n_new[k] == 1 && e->batch[k]->info.state != AKV_REQUEST_PREFILL;
    akv_route_stats rs0;
    akv_route_get_stats(e->route, &rs0);
    const uint64_t t_place0 = spans ? akv_clock_ns() : 0;
    st = akv_route_begin_step(e->route, e->reqs, n);
    if (spans) /* the last step settled, the pages placed, fills and tables enqueued */
        akv_trace_span(e->p.trace, AKV_TRACE_TRACK_ENGINE, "place", t_place0, akv_clock_ns(),
                       "sequences", n, NULL, 0);
    if (st) {
        engine_resync(e); /* AKV_EDEVICE: the settle of the last step may have undone it */
        engine_step_failed(e, n, st);
        goto out;
    }
    akv_forward_batch b = {.n_seq = n, .n_new = e->n_new, .pos0 = e->pos0, .tokens = e->tokens,
                           .logits = e->lmode, .chosen = e->chosen, .sample = e->draw,
                           .pen = e->pen, .n_pen = e->plan.max_seqs * AKV_FORWARD_SAMPLE_PEN_MAX};
    akv_kv_hooks kv = akv_route_hooks(e->route);
    /* the device pass's logits are read where its copy left them (pinned); a prompt chunk's
     * rows (one chunk a step) take the host pass's buffer to max_seqs + chunk rows */
    if (!e->fd && n_rows > e->plan.max_seqs && !e->logits_wide) {
        float *wide = akv__calloc(((size_t)e->plan.max_seqs + e->plan.chunk) * e->cfg.n_vocab,
                                  sizeof *wide);
        if (!wide) {
            st = AKV_ENOMEM;
            engine_step_failed(e, n, st);
            goto out;
        }
        akv__free(e->logits);
        e->logits = wide, e->logits_wide = true;
    }
    float *logits = e->fd ? akv_forward_dev_logits_buffer(e->fd) : e->logits;
    float *lg = n_rows ? logits : NULL;
    const bool traced = akv_trace_level_of(e->p.trace) != AKV_TRACE_OFF;
    const uint64_t t_fwd0 = traced ? akv_clock_ns() : 0;
    st = e->fd ? akv_forward_dev_step(e->fd, &b, &kv, lg) : akv_forward_step(e->fh, &b, &kv, lg);
    const uint64_t t_fwd1 = traced ? akv_clock_ns() : 0;
    if (st) {
        akv_status ab = engine_abort(e);
        engine_resync(e);
        if (e->failed) st = ab;
        else engine_step_failed(e, n, st);
        goto out;
    }
    /* the step's tokens are in the contexts; then every row of logits samples */
    e->stats.n_steps++;
    if (decode) {
        akv_route_stats rs1;
        akv_route_get_stats(e->route, &rs1);
        e->stats.n_decode_steps++;
        e->stats.decode_tokens += n;
        e->stats.decode_h2d_bytes += rs1.h2d_bytes - rs0.h2d_bytes;
        e->stats.decode_staged_bytes += rs1.staged_bytes - rs0.staged_bytes;
        e->stats.decode_d2h_bytes += rs1.d2h_bytes - rs0.d2h_bytes;
        e->stats.decode_host_bytes += rs1.host_bytes - rs0.host_bytes;
    }
    for (uint32_t k = 0, at = 0, row = 0; k < n; at += e->n_new[k], k++) {
        akv_request *rq = e->batch[k];
        const float *lk = logits + (size_t)row * e->cfg.n_vocab;
        const bool all = e->lmode[k] == AKV_FORWARD_LOGITS_ALL;
        row += akv_forward_mode_rows(e->lmode[k], e->n_new[k]);
        if (all) {
            rq->p.on_prompt_logits(rq->p.user, rq, e->pos0[k], e->n_new[k], lk);
            lk += (size_t)(e->n_new[k] - 1) * e->cfg.n_vocab; /* the last row samples */
        }
        rq->n_fail = 0;
        if (rq->info.state == AKV_REQUEST_PREFILL) e->stats.prompt_tokens += e->n_new[k];
        if (ctx_append(rq->ctx, e->tokens + at, e->n_new[k]) != AKV_OK) {
            /* the context no longer says what its K/V holds: it cannot go on or be reused */
            rq->info.error = AKV_ENOMEM;
            akv__request_end(rq, AKV_FINISH_ERROR);
        } else if (e->lmode[k] == AKV_FORWARD_LOGITS_ARGMAX || e->lmode[k] == AKV_FORWARD_LOGITS_SAMPLE) {
            if (e->lmode[k] == AKV_FORWARD_LOGITS_SAMPLE) /* the draw is made: its uniform spent */
                akv_sampler_draw_done(rq->sampler), e->stats.pass_draws++;
            (void)akv__request_on_token(rq, e->chosen[k], NULL);
        } else if (e->lmode[k] == AKV_FORWARD_LOGITS_LAST ||
                   (all && e->pos0[k] + e->n_new[k] == rq->p.n_prompt)) {
            (void)akv__request_on_logits(rq, lk);
        }
        if (rq->info.state == AKV_REQUEST_DONE) {
            engine_retire(e, rq);
            engine_maybe_free(e, rq);
        }
    }
    if (traced) engine_trace_step(e, n, n_tok, decode, (uint64_t)(t0 * 1e9), t_fwd0, t_fwd1);
    e->clock++;
    if (did_work) *did_work = true;
out:
    e->stats.step_s += akv_clock_s() - t0;
    return st;
}

/* ---- reports and the walker ----------------------------------------------------------------- */

void akv_request_get_info(const akv_request *rq, akv_request_info *out) {
    *out = rq->info;
    if (rq->ctx) { /* running: its traffic so far */
        akv_route_seq_stats s;
        akv_route_seq_get_stats(rq->ctx->seq, &s);
        out->h2d_bytes = s.h2d_bytes - rq->seq0.h2d_bytes;
        out->staged_bytes = s.staged_bytes - rq->seq0.staged_bytes;
        out->d2h_bytes = s.d2h_bytes - rq->seq0.d2h_bytes;
    }
}

void akv_engine_get_stats(const akv_engine *e, akv_engine_stats *out) {
    *out = e->stats;
    out->n_running = e->n_run, out->n_queued = e->n_wait, out->n_idle = e->n_idle;
    out->host_pages_reserved = e->host_reserved;
    if (e->hp) {
        akv_host_pool_stats hs;
        akv_host_pool_get_stats(e->hp, &hs);
        out->host_pages_used = hs.n_used;
    }
    out->host_pages_growth = engine_host_growth(e);
    akv__spill_stats(e, out);
    if (e->route) {
        akv_route_stats rs;
        akv_route_get_stats(e->route, &rs);
        out->compact_pages = rs.compact_pages, out->compact_bytes = rs.compact_bytes;
        out->compact_device = rs.compact_device;
    }
    if (e->fd) {
        akv_forward_dev_stats fs = akv_forward_dev_get_stats(e->fd);
        out->graph_builds = fs.graph_builds, out->graph_launches = fs.graph_launches;
    }
}

const akv_engine_plan *akv_engine_get_plan(const akv_engine *e) {
    return &e->plan;
}
const akv_model_config *akv_engine_config(const akv_engine *e) {
    return &e->cfg;
}
const akv_tok *akv_engine_tok(const akv_engine *e) {
    return e->tok;
}
const akv_model *akv_engine_model(const akv_engine *e) {
    return e->model;
}
akv_dev *akv_engine_dev(const akv_engine *e) {
    return e->dev;
}
akv_host_pool *akv_engine_host_pool(const akv_engine *e) {
    return e->hp;
}
akv_dev_pool *akv_engine_dev_pool(const akv_engine *e) {
    return e->dp;
}
akv_route *akv_engine_route(const akv_engine *e) {
    return e->route;
}

uint64_t akv_engine_weight_bytes(const akv_engine *e) {
    return e->fd ? akv_forward_dev_weight_bytes(e->fd) : akv_model_step_weight_bytes(e->model);
}

#define ENGINE_BAD(...)                                                                            \
    do {                                                                                           \
        AKV_LOG_E("engine check: " __VA_ARGS__);                                                   \
        return AKV_ESTATE;                                                                         \
    } while (0)

akv_status akv__engine_check(akv_engine *e) {
    akv_status st;
    /* the host copies are complete once the queues are idle (akv/route.h); a step the sync
     * undoes is what the next step would resync to: so does the check */
    for (int i = 0; i < 3 && (st = akv_route_sync(e->route)); i++)
        engine_resync(e); /* a failure it reports once (an undone step, a replaced stage) */
    if (st) return st;
    if ((st = akv__host_pool_check(e->hp)) || (st = akv__dev_pool_check(e->dp)) ||
        (e->dpc && (st = akv__dev_pool_check(e->dpc))) ||
        (e->hpc && (st = akv__host_pool_check(e->hpc))))
        return st;
    uint64_t host = 0, dev = 0, pins = 0, pinned = 0;
    uint32_t n_ctx = 0;
    for (uint32_t i = 0; i < e->n_run; i++) {
        const akv_request *rq = e->run[i];
        if (!rq->admitted || rq->info.state == AKV_REQUEST_DONE || (rq->ctx && rq->ctx->owner != rq))
            ENGINE_BAD("running request %llu is not admitted, or its context is another's",
                       (unsigned long long)rq->p.id);
        host += rq->host_pages, dev += rq->dev_pages;
        if (rq->share_from) pins++;
        if ((rq->ctx || !rq->share_from) && rq->host_credit)
            ENGINE_BAD("request %llu counts on %llu shared host pages without a context pinned "
                       "for them", (unsigned long long)rq->p.id, (unsigned long long)rq->host_credit);
        if (!rq->ctx) continue; /* not started yet */
        if (akv_route_seq_n_tokens(rq->ctx->seq) != rq->ctx->n_tokens)
            ENGINE_BAD("request %llu's context says %u tokens; its sequence holds %llu",
                       (unsigned long long)rq->p.id, rq->ctx->n_tokens,
                       (unsigned long long)akv_route_seq_n_tokens(rq->ctx->seq));
        for (uint32_t j = 0; j < rq->ctx->n_tokens; j++)
            if (rq->ctx->tokens[j] != akv__request_stream(rq, j))
                ENGINE_BAD("request %llu's context holds token %d at %u; its stream says %d",
                           (unsigned long long)rq->p.id, rq->ctx->tokens[j], j,
                           akv__request_stream(rq, j));
        if (engine_host_pages(e, rq->ctx->n_tokens) > rq->host_pages)
            ENGINE_BAD("request %llu holds more host pages than it reserved",
                       (unsigned long long)rq->p.id);
        pinned += rq->ctx->n_pin;
        n_ctx++;
    }
    uint32_t n_idle = 0;
    for (const akv__ctx *c = e->idle_head; c; c = c->next, n_idle++) {
        if (c->owner) ENGINE_BAD("an idle context has an owner");
        pinned += c->n_pin;
        if (akv_route_seq_n_tokens(c->seq) != c->n_tokens)
            ENGINE_BAD("an idle context says %u tokens; its sequence holds %llu", c->n_tokens,
                       (unsigned long long)akv_route_seq_n_tokens(c->seq));
        n_ctx++;
    }
    if (e->read_back.job) pinned += akv__restore_ctx(e->read_back.job)->n_pin; /* its request's */
    if (pins != pinned)
        ENGINE_BAD("%llu admitted requests count on a context's pages; the contexts are pinned "
                   "%llu times", (unsigned long long)pins, (unsigned long long)pinned);
    if (host != e->host_reserved || dev != e->dev_reserved || n_idle != e->n_idle || e->leaving)
        ENGINE_BAD("accounting: host %llu/%llu reserved, device %llu/%llu, %u/%u idle contexts%s",
                   (unsigned long long)host, (unsigned long long)e->host_reserved,
                   (unsigned long long)dev, (unsigned long long)e->dev_reserved, n_idle, e->n_idle,
                   e->leaving ? ", a context still leaving" : "");
    if (e->n_run > e->plan.max_seqs || e->dev_reserved > e->plan.window_capacity)
        ENGINE_BAD("over the plan: %u running of %u, %llu window pages of %u", e->n_run,
                   e->plan.max_seqs, (unsigned long long)e->dev_reserved, e->plan.window_capacity);
    /* The host promise: the pages the running contexts hold (the pool's less the idle ones'
     * own and those a copy still reads after their free), each once, and what the running
     * requests may still take fit the pool. The count of the idle ones' own is the cached one
     * where it is not stale. */
    {
        akv_host_pool_stats now;
        akv_host_pool_get_stats(e->hp, &now);
        const bool stale = !idle_sole_fresh(e, &now);
        const uint64_t cached = e->idle_sole;
        e->idle_sole_stale = true;
        const uint64_t sole = engine_freeable(e, true);
        if (!stale && sole != cached)
            ENGINE_BAD("the idle contexts would free %llu host pages; the engine counted %llu",
                       (unsigned long long)sole, (unsigned long long)cached);
        akv_host_pool_stats hs;
        akv_host_pool_get_stats(e->hp, &hs);
        const uint64_t held = hs.n_used - hs.n_doomed - sole, growth = engine_host_growth(e);
        if (held + growth > e->plan.host_pages)
            ENGINE_BAD("the running contexts hold %llu host pages and may take %llu more; the "
                       "pool holds %llu",
                       (unsigned long long)held, (unsigned long long)growth,
                       (unsigned long long)e->plan.host_pages);
    }
    akv_route_stats rs;
    akv_route_get_stats(e->route, &rs);
    n_ctx += e->read_back.job != NULL; /* a conversation being read back: open, in no list yet */
    if (rs.n_open != n_ctx)
        ENGINE_BAD("the route has %u open sequences; the engine knows %u", rs.n_open, n_ctx);
    if ((st = akv__spill_check(e))) return st;
    uint32_t n_wait = 0;
    for (const akv_request *rq = e->wait_head; rq; rq = rq->next_q, n_wait++)
        if (rq->admitted || rq->ctx) ENGINE_BAD("a waiting request holds a reservation");
    if (n_wait != e->n_wait) ENGINE_BAD("%u waiting; the count says %u", n_wait, e->n_wait);
    if (e->info.is_host) return akv__route_check(e->route);
    return AKV_OK;
}
