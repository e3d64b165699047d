/*
 * akv/engine.h — the serving engine: many conversations at once over the memory layer.
 *
 * One engine owns the device, the model (and its tokenizer), the host and device pools, the
 * route (and its stage), the forward pass and the scheduler. Requests are sequences inside
 * it. Every engine step is ONE batch step: one device-pool step over every running sequence,
 * one page table per layer over the batch, one stage lease per layer for the whole batch, one
 * forward pass with mixed query counts (decodes and prefill chunks together).
 *
 * Glossary
 *   plan       the one memory plan the engine is made from (akv_engine_plan): the page
 *              layout, the pools' sizes, the staging reserve, each context's floor / target /
 *              burst, the effective concurrency and the admission formula (akv/admit.h).
 *              Computed once, checked once, at create.
 *   request    one generation: a prompt (token ids), its own sampling parameters and seed,
 *              its stop conditions (max_tokens, end-of-generation tokens, stop strings), and a
 *              callback through which its tokens leave (akv_token_event). States:
 *              queued -> prefill -> decode -> done (finish stop / length / cancelled / error).
 *   admission  on arrival, by arithmetic on prompt + max_tokens: the tokens fit max_context,
 *              the host pages of every running reservation plus this one fit the host pool,
 *              (resident) the device windows of every running reservation fit the device
 *              pool, and fewer than max_seqs run. So a running request never needs preemption
 *              or recompute (preemptions: always 0). What fits runs at the next step; what
 *              could fit later waits in a bounded FIFO (max_queue; full = refused); what can
 *              never fit is refused at once, naming the reason and the params field to change.
 *   step       akv_engine_step: cancelled requests have left already (akv_engine_cancel acts
 *              at once, between steps); queued requests are admitted in arrival order; the
 *              batch is every decoding request (one token each) and then prompt chunks in
 *              arrival order while the token budget (step_tokens) lasts; one route step and
 *              one forward pass; then every sequence whose logits were computed samples its
 *              next token, streams it, and may finish.
 *   chunk      a prompt is fed in pieces that end at multiples of `chunk` tokens from where
 *              its prefill began (or at its end), whatever else is in the batch: a long prompt
 *              holds the running conversations up for at most one chunk per step, and a
 *              sequence's chunks are the same alone or among others.
 *   idle       a finished (or cancelled) request's sequence stays open, holding its K/V, as an
 *              idle context: the device pool may reclaim its window (burst pages first, then
 *              pages above target, then whole idle contexts: akv/dev_pool.h, counted and
 *              explained), and a later request whose prompt starts with its tokens reuses it
 *              (its shared prefix is not computed again). Idle contexts are closed, least
 *              recently used first, when their host pages are needed or more than max_idle
 *              are kept.
 *
 * Determinism. A request's tokens follow from its prompt, its sampling parameters (seed
 * included) and the logits. On the host (CPU) pass a sequence's logits are bit-identical
 * whatever else is in its batch (akv/forward.h, batch invariance), as long as its prompt is
 * fed from the same start (a reused prefix starts its prefill where the reuse ends). On CUDA
 * the staged route is bit-identical to the resident route for the same batch composition;
 * the decode's split depends on the number of sequences in the batch, so a sequence's bits
 * there depend on how many run beside it (docs/engine.md).
 *
 * Thread-safety: none. One thread owns the engine and calls everything, callbacks included
 * (they run inside akv_engine_step, akv_engine_submit and akv_engine_cancel).
 */
#ifndef AKV_ENGINE_H
#define AKV_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/admit.h"
#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/dtype.h"
#include "akv/gate.h"
#include "akv/json_schema.h"
#include "akv/model.h"
#include "akv/route.h"
#include "akv/sample.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_engine akv_engine;
typedef struct akv_request akv_request;
typedef struct akv_tok akv_tok; /* akv/tok.h */

/* Which forward pass runs the steps. */
typedef enum akv_engine_pass {
    AKV_ENGINE_PASS_AUTO = 0,   /* the host pass on the host backend, else the device pass */
    AKV_ENGINE_PASS_DEVICE = 1, /* the device pass, also on the host backend (tests) */
} akv_engine_pass;

/* Progress of the load: `what` ("loading": the file; "uploading": the weights to the device
 * pass, not reported for the host pass; "pinning": the host pool's GiB, pinned at create),
 * done of total. */
typedef void (*akv_engine_progress_fn)(void *user, const char *what, uint64_t done,
                                       uint64_t total);

/* The default step budget, tokens: a prompt prefilled while nothing decodes goes in pieces of
 * this size (8B shape on the H200: docs/benchmarks.md, bench_prefill). */
#define AKV_ENGINE_STEP_TOKENS 4096
/* The default prompt room of a step beside running decodes on a device pass, tokens: the
 * inter-token latency a prefill adds against how fast waiting prompts start (docs/engine.md,
 * "The step"). */
#define AKV_ENGINE_PREFILL_BESIDE 2048

typedef struct akv_engine_params {
    akv_dev *dev;                    /* the device; the engine owns it from create on (it is
                                        destroyed with the engine, or by a failed create) */
    /* the model: exactly one of */
    const char *model_path;          /* a GGUF file, loaded (and its tokenizer) */
    const akv_model *model;          /* a loaded model, borrowed (outlives the engine) */
    const akv_model_config *synthetic; /* a configuration whose weights are filled on the
                                        device from synthetic_seed (benchmarks; device pass
                                        only, no tokenizer) */
    uint64_t synthetic_seed;
    akv_ops_wtype synthetic_type;    /* the synthetic matrices' format (a block format of
                                        akv/ops.h); 0 = bf16 */
    akv_weights weights;             /* how the pass stores the weight matrices (akv/model.h):
                                        the host pass NATIVE or F32, the device pass NATIVE or
                                        BF16; 0 = NATIVE. A borrowed model (model) keeps the
                                        host storage it was loaded with */
    akv_engine_progress_fn progress; /* NULL = no reports */
    void *progress_user;
    /* memory (the plan) */
    uint32_t host_gib;               /* host pool limit, whole GiB (>= 1; 0 is refused: the
                                        operator sizes the pools, nothing is guessed) */
    uint64_t host_pages_max;         /* at most this many of the host pool's pages (every
                                        layer) admitted against: a smaller pool than host_gib's
                                        whole GiB, to see admission and eviction under pressure
                                        (vLLM's num_gpu_blocks_override); 0 = all of them */
    uint32_t device_gib;             /* device pool, whole GiB (>= 1; 0 is refused) */
    akv_dtype kv_dtype;              /* K/V page type (the device pass reads bf16 only) */
    uint32_t page_tokens;            /* tokens per page; 0 = from the K/V row size */
    akv_route_kind route;            /* how the history reaches the attention (akv/route.h;
                                        akv_route_kind_from_name); 0 = resident */
    uint32_t window_pages;           /* staged: a context's window pages at least (the plan
                                        may give more); 0 = AKV_ROUTE_WINDOW_PAGES */
    float host_share;                /* the host-attended route: the share of a decoding
                                        history's pages outside its window the host's cores
                                        attend (akv_route_params.host_share), 0..1; 0 = planned
                                        at create from the host part's rate measured then and
                                        the bus's (gate_rates): akv_route_plan_host */
    akv_repr kv_tier;                /* the compact tier (akv/kv_repr.h): q8 or q4 reads each
                                        history's pages older than exact_recent tokens in that
                                        form, from a compact pool the plan takes out of
                                        device_gib (the resident route); exact (0) = every page
                                        exact; AKV_ENGINE_TIER_AUTO = the economic gate chooses
                                        the route and the tier (akv/gate.h; route is then
                                        ignored) */
    const akv_gate_rates *gate_rates; /* the gate's transfer model (akv calibrate); NULL = its
                                        defaults (akv_gate_default_rates) */
    uint64_t exact_recent;           /* with a compact tier: tokens before the newest kept
                                        exact; 0 = AKV_ROUTE_EXACT_RECENT */
    uint64_t max_context;            /* the longest history of a request, prompt + new
                                        tokens; 0 = the model's training context */
    uint32_t max_seqs;               /* sequences one step runs (concurrency); 0 = 1 */
    akv_admit_mode admit_mode;       /* the plan: refuse a configuration that does not fit,
                                        or shrink max_seqs to what fits (akv/admit.h) */
    uint32_t max_queue;              /* requests that may wait for room; 0 = none: a request
                                        that does not fit now is refused at once */
    uint32_t max_idle;               /* finished conversations kept for reuse; 0 = max_seqs;
                                        UINT32_MAX = as many as the host pool holds */
    bool no_reuse;                   /* never reuse an idle context's prefix (each request
                                        computes its whole prompt) */
    const char *session_dir;         /* an existing directory where idle conversations go
                                        when they would be closed (beyond max_idle, or for
                                        host pages), one session file each, and come back
                                        from when a prompt begins with one (docs/engine.md,
                                        "The session directory"); its files from an earlier
                                        run are found at create. Copied. NULL = none: they
                                        are closed */
    uint32_t session_dir_gib;        /* the session directory's files at most, whole GiB
                                        (the oldest removed first); 0 = no limit but the disk */
    /* scheduling: every running decode, then waiting prompts in arrival order, each in whole
       chunks, while the step's prompt room lasts: prefill_beside tokens beside running decodes
       (their next token waits for that much prompt work at most), step_tokens in a step where
       nothing decodes */
    uint32_t chunk;                  /* prompt chunk, tokens; 0 = 256 */
    uint32_t step_tokens;            /* most tokens one step runs, decodes and chunks
                                        together; >= max_seqs - 1 + chunk (every running decode
                                        and one chunk); 0 = max(AKV_ENGINE_STEP_TOKENS, that) */
    uint32_t prefill_beside;         /* most prompt tokens a step runs beside running decodes;
                                        >= chunk; 0 = AKV_ENGINE_PREFILL_BESIDE on a device pass,
                                        one chunk on the host pass; never more than what
                                        step_tokens leaves beside the decodes */
    /* the pass */
    akv_engine_pass pass;
    uint32_t threads;                /* host pass threads; 0 = one per core */
    bool no_graphs;                  /* device pass: launch decode steps op by op */
    struct akv_trace *trace;         /* borrowed, outlives the engine; NULL = none: the steps,
                                        requests and tokens at its level (akv/trace.h) */
    bool host_sampling;              /* device pass: draws at a temperature made on the host
                                        from the row (as a format or logits wanted always
                                        are), not on the device (akv/fwd_sample.h) */
    akv_attn_tuning attn;            /* device pass: the decode's tuning, for A/B measurement
                                        (akv/attn.h; zero: the measured default) */
} akv_engine_params;

/* The plan (see the glossary). Every term of the formula is a field, so front ends can print
 * it; akv_engine_plan_format writes it as text. */
/* kv_tier: the gate chooses (akv_engine_params.kv_tier). */
#define AKV_ENGINE_TIER_AUTO ((akv_repr)AKV_REPR_COUNT)
enum { AKV_ENGINE_GATE_OPTIONS = AKV_GATE_PLACEMENTS };

typedef struct akv_engine_plan {
    akv_geom geom;             /* the page layout */
    akv_fit fit;               /* the admission arithmetic (akv/admit.h), concurrency max_seqs */
    akv_route_plan route;      /* the route kind's part (akv/route.h): its staging reserve and
                                  each context's window by right / borrowable */
    uint64_t max_context;
    uint32_t max_seqs;         /* effective: what runs at once */
    uint64_t host_pages;       /* pages the host pool holds */
    uint32_t window_capacity;  /* device window pages per layer */
    uint32_t chunk, step_tokens, prefill_beside, max_queue, max_idle;
    /* kv_tier auto: the placements the gate weighed, the chosen one marked (n_gate 0: none) */
    akv_gate_rates gate_rates;
    akv_gate_option gate[AKV_ENGINE_GATE_OPTIONS];
    uint32_t n_gate;
    /* kv_tier auto on a resident route with a tier: a request whose prompt + max_tokens is at
       most this stays exact (akv_gate_exact_below), unless it asks for the tier
       (kv_compact); 0: none */
    uint64_t exact_below;
} akv_engine_plan;

/* Why a request was refused (akv_engine_submit). */
typedef enum akv_refusal_reason {
    AKV_REFUSE_NONE = 0,
    AKV_REFUSE_CONTEXT,   /* prompt + max_tokens exceeds max_context */
    AKV_REFUSE_HOST,      /* its host pages exceed the whole host pool */
    AKV_REFUSE_DEVICE,    /* resident: its device window exceeds the whole device pool */
    AKV_REFUSE_BUSY,      /* no room now and no queue (max_queue 0) */
    AKV_REFUSE_QUEUE,     /* no room now and the queue is full */
    AKV_REFUSE_INVALID,   /* a bad request (no prompt, a token outside the vocabulary, ...) */
    AKV_REFUSE_FAILED,    /* the engine has failed (a device that did not recover) */
    AKV_REFUSE_REASON_COUNT
} akv_refusal_reason;

typedef struct akv_refusal {
    akv_refusal_reason reason;
    const char *field;    /* the params field (engine or request) to change; NULL if none */
    char message[320];    /* one line: what was asked, what fits, what to change */
} akv_refusal;

/* How a request ended. */
typedef enum akv_finish {
    AKV_FINISH_NONE = 0,   /* still running */
    AKV_FINISH_STOP,       /* an end-of-generation token or a stop string */
    AKV_FINISH_LENGTH,     /* max_tokens generated */
    AKV_FINISH_CANCELLED,  /* akv_engine_cancel */
    AKV_FINISH_ERROR,      /* a step failed on it and was not recovered (info.error) */
} akv_finish;

/* One event of a request: a token, its text, and whether the request ended. */
typedef struct akv_token_event {
    int32_t token;         /* the sampled token; -1 when the event carries none (the end) */
    const char *text;      /* text that became final with it (a stop string and what might
                              begin one are held back; an end-of-generation token has none);
                              NULL without a tokenizer. Valid during the call */
    size_t n_text;
    const float *logits;   /* want_logits: [n_vocab] the logits the token was sampled from */
    akv_finish finish;     /* not NONE: the request has ended; its last event */
    bool eog;              /* the token is the end of generation that ended it (it stands for
                              no text of the answer) */
} akv_token_event;

typedef void (*akv_token_fn)(void *user, akv_request *rq, const akv_token_event *ev);

/* What the generated text must be (akv_request_params.format). */
typedef enum akv_format {
    AKV_FORMAT_TEXT = 0,        /* anything */
    AKV_FORMAT_JSON_OBJECT = 1, /* one JSON object (akv/json_prefix.h): each step samples only
                                   among tokens that keep the text a prefix of one, and the
                                   end of generation only once it is complete (then nothing
                                   else); max_tokens may still cut it short (finish LENGTH) */
    AKV_FORMAT_JSON_SCHEMA = 2, /* one JSON value of akv_request_params.schema
                                   (akv/json_schema.h), the same way */
} akv_format;

/* A token's bias (OpenAI's logit_bias): added to its logit before the sampling. */
typedef struct akv_logit_bias {
    int32_t token;
    float bias; /* finite; -100 all but bans a token, +100 all but forces it */
} akv_logit_bias;

/* The most biases one request may carry. */
#define AKV_MAX_LOGIT_BIAS 1024

typedef struct akv_request_params {
    const int32_t *prompt;   /* [n_prompt] token ids (copied), >= 1 */
    uint32_t n_prompt;
    uint32_t max_tokens;     /* new tokens at most, >= 1 */
    akv_sample_params sample;
    const akv_logit_bias *bias; /* [n_bias] (copied): added to those logits before the format's
                                   mask and the sampling; the host samples such a request */
    uint32_t n_bias;
    bool ignore_eog;         /* go on past end-of-generation tokens (they are emitted) */
    const char *const *stop; /* [n_stop] stop strings (copied); generation ends where the
                                text contains one, which is not emitted */
    uint32_t n_stop;
    akv_token_fn on_token;   /* NULL = no events (poll akv_request_get_info) */
    void *user;
    bool want_logits;        /* events carry the logits */
    /* The logits of every prompt position the engine computes, as each of its chunks runs
     * (n rows of n_vocab for positions pos .. pos+n-1; row j predicts the token at pos+j+1;
     * valid during the call, on the engine's thread). Positions reused from an idle context
     * are not computed (akv_request_info.n_cached): such a request reuses an idle context
     * only up to prompt_logits_from. Such a prompt runs one chunk a step (on the device pass
     * a piece of at most 64 tokens, so the logits it copies back stay small) and one such
     * chunk per step. NULL = none. */
    void (*on_prompt_logits)(void *user, akv_request *rq, uint32_t pos, uint32_t n,
                             const float *logits);
    uint32_t prompt_logits_from; /* with on_prompt_logits: a chunk wholly before this prompt
                                    position computes no logits (nor is reported) */
    uint64_t id;             /* the caller's tag (device pool explanations, logs) */
    akv_format format;       /* what the text must be (needs the model's tokenizer: submit
                                refuses it without one); the logits events carry stay the
                                model's own */
    const akv_json_schema *schema; /* format JSON_SCHEMA: the compiled schema, borrowed until
                                      the request's last event */
    const char *format_after;  /* with a format: the text is free until it contains this
                                  string (a tool call's opener, "<tool_call>"); from its next
                                  byte the format holds, until its value is whole; then the
                                  text is free again, and the next occurrence opens another
                                  value. A token whose bytes after the string cannot begin a
                                  value leaves that occurrence free. Copied; NULL or "": the
                                  whole answer is one value */
    bool format_at_start;      /* with a format and no format_after: the answer is free unless
                                  its first token that is not white space can begin a value
                                  (a Llama 3 tool call's '{'); then the format holds from there
                                  until the value is whole */
    bool kv_compact;         /* with kv_tier auto: its older history in the engine's compact
                                tier however short (the gate would keep a short one exact:
                                akv_engine_plan.exact_below) */
    bool kv_exact;           /* keep its whole history exact where the engine has a compact
                                tier (kv_tier q8/q4): it reserves and reads its K/V as the
                                exact route does, and reuses only contexts kept exact too.
                                Without a tier every history is exact: no effect */
    int8_t retention;        /* how long its context is kept once it is idle: when idle
                                contexts are closed (beyond max_idle, or for host pages), the
                                lowest retention goes first, the least recently used among
                                equals; -1 low, 0 normal (the default), 1 high */
    uint64_t cache_salt;     /* its K/V is reused by, and reuses, only requests of the same
                                salt (an idle context's prefix, a running one's copy): 0 for
                                the shared default, another value per tenant so one tenant's
                                prefix never serves another's */
} akv_request_params;

typedef enum akv_request_state {
    AKV_REQUEST_QUEUED = 0,
    AKV_REQUEST_PREFILL,
    AKV_REQUEST_DECODE,
    AKV_REQUEST_DONE,
} akv_request_state;

typedef struct akv_request_info {
    uint64_t id;
    uint64_t serial;         /* the engine's number for it: its submission's, from 1 (a trace's
                                request track is AKV_TRACE_TRACK_REQUEST + serial) */
    akv_request_state state;
    akv_finish finish;
    akv_status error;        /* finish ERROR: the step's status */
    uint32_t n_prompt;       /* prompt tokens */
    uint32_t n_cached;       /* of them, reused from an idle context (not computed) */
    uint32_t n_gen;          /* tokens generated (emitted or not) */
    uint32_t n_retries;      /* steps that failed on it and were redone */
    bool kv_exact;           /* its history is kept exact on an engine with a compact tier:
                                asked (kv_exact), or chosen by the gate per context */
    double t_submit, t_admit, t_first, t_done; /* seconds (core clock); 0 = not yet */
    uint64_t h2d_bytes, staged_bytes, d2h_bytes; /* its sequence's traffic while it ran */
} akv_request_info;

typedef struct akv_engine_stats {
    uint64_t n_steps;            /* steps that ran a forward pass */
    uint64_t n_step_failures;    /* steps undone after a failure */
    uint64_t n_submitted;
    uint64_t n_refused[AKV_REFUSE_REASON_COUNT];
    uint64_t n_finished[AKV_FINISH_ERROR + 1];
    uint64_t n_preemptions;      /* always 0: admission reserves a request's whole need */
    uint64_t prompt_tokens;      /* prompt tokens computed */
    uint64_t cached_tokens;      /* prompt tokens reused from idle contexts or forked from
                                    another context */
    uint64_t n_forked;           /* requests that started from a fork of another context, a
                                    running request's or an idle conversation that holds a
                                    page or more beyond the prefix (akv_route_seq_fork: its full
                                    pages shared) */
    uint64_t gen_tokens;         /* tokens sampled */
    uint64_t pass_draws;         /* of them, drawn at a temperature by the device pass (only
                                    the id crossed the bus: akv/fwd_sample.h) */
    uint64_t n_idle_closed;      /* idle contexts closed to make room or beyond max_idle */
    uint64_t n_unadmitted;       /* admitted requests sent back to the head of the queue at
                                    their start: the prefix their admission counted on sharing
                                    was gone (its context closed meanwhile) */
    uint64_t n_spilled;          /* of them, written to the session directory first */
    uint64_t n_restored;         /* conversations read back from it for a prompt */
    double restore_s;            /* seconds their reads back took, each from its start to
                                    its adoption (the file read, checked and placed in the host
                                    pool by a thread of its own while the batch steps on) ... */
    double restore_disk_s;       /* ... of which the reading thread waited for the disk */
    uint64_t n_spill_files;      /* files the session directory holds now ... */
    uint64_t spill_bytes;        /* ... and their bytes */
    uint32_t n_running, n_queued, n_idle;
    /* host pages, every layer: the running requests' reservations summed (prompt + max_tokens
     * each; a page several share counted for each, so it may pass the pool's size), the pages
     * the pool holds now (each once: running and idle contexts, and freed pages a copy still
     * reads), and what the running requests may still take (their reservations less what
     * their contexts hold). Admission keeps the pages the running contexts hold plus that
     * growth within the pool (docs/engine.md). */
    uint64_t host_pages_reserved, host_pages_used, host_pages_growth;
    uint64_t graph_builds, graph_launches; /* device pass: decode steps replayed as graphs */
    double step_s;               /* time inside akv_engine_step */
    /* decode steps: steps in which every sequence took one token after its prompt, and the
     * route's traffic in them (the bus's cost of a generated token, apart from prefill) */
    uint64_t n_decode_steps;
    uint64_t decode_tokens;      /* tokens those steps computed (one per sequence a step) */
    uint64_t decode_h2d_bytes, decode_staged_bytes, decode_d2h_bytes;
    uint64_t decode_host_bytes;  /* the host-attended route: K/V bytes the host's cores attended
                                    in those steps */
    /* the compact tier (akv_route_stats): compact pages made (one a layer), of them made on the
     * device, and the bytes of those made on the host */
    uint64_t compact_pages, compact_device, compact_bytes;
} akv_engine_stats;

/* Defaults: 1 GiB pools, bf16 K/V, resident, one sequence, refuse mode, no queue, chunk 256,
 * auto pass. */
akv_engine_params akv_engine_default_params(void);

/* Loads the model (or takes it), computes and checks the plan, creates the pools, the route
 * and the pass. The engine owns p->dev either way. AKV_EINVAL (logged, naming the params
 * field) for bad params; AKV_EFULL (logged with the plan's verdict and the field to change)
 * when the plan refuses the configuration; what loading or allocating returned otherwise. */
akv_status akv_engine_create(const akv_engine_params *p, akv_engine **out);

/* Cancels what still runs (no more events), waits for the device, frees everything.
 * NULL is a no-op. Unreleased requests are freed with it. */
void akv_engine_destroy(akv_engine *e);

/* Submits a request. AKV_OK: *out is queued (or runs from the next step); AKV_EFULL: refused
 * (*refusal says why and which field to change; *out NULL, no event); AKV_EINVAL: a bad
 * request (refused the same way). refusal may be NULL. */
akv_status akv_engine_submit(akv_engine *e, const akv_request_params *p, akv_request **out,
                             akv_refusal *refusal);

/* Cancels a request at once: no token event follows; its last event (finish CANCELLED) is
 * delivered now; it leaves the batch (its pages are reused only after their fences: the route
 * defers the free). A finished request is left as it is. */
void akv_engine_cancel(akv_engine *e, akv_request *rq);

/* Forgets a request: a running one is cancelled first; no event follows. The handle is
 * invalid afterwards. NULL is a no-op. */
void akv_engine_release(akv_engine *e, akv_request *rq);

/* Runs one step (see the glossary). *did_work (may be NULL): whether a forward pass ran.
 * AKV_OK also when there was nothing to do. A failed step is undone and the step redone at
 * the next call (a request on which 3 steps in a row fail finishes with ERROR); the status is
 * the failure's. When the undo itself fails (the device has not recovered) the next call
 * tries it again; after 8 such calls in a row the engine gives up on the device: every
 * request finishes with ERROR, new ones are refused, and this returns AKV_EDEVICE. */
akv_status akv_engine_step(akv_engine *e, bool *did_work);

/* Sessions on disk (docs/engine.md, "Sessions on disk"). Save: the finished conversation (an
 * idle context) that holds the longest prefix of tokens[0..n) is written to path, its whole
 * history (token ids and the exact K/V, page size free) with the model's fingerprint and a
 * checksum, through path.tmp renamed over path: AKV_ENOTFOUND when none holds a token of them,
 * AKV_EIO (logged; the context and any earlier file as they were) when the file cannot be
 * written, AKV_EDEVICE or AKV_ESTATE when the device undid a step under it (its host copy
 * is not the engine's), AKV_ENOMEM. Load: the file becomes an idle context, which a request whose prompt begins with
 * its tokens reuses as any finished conversation (*n_tokens: its length): AKV_ENOTFOUND (no
 * such file), AKV_EIO, AKV_EFORMAT (logged: not a session, another model or K/V type, a
 * damaged, cut or lengthened file: nothing loaded), AKV_EFULL (longer than max_context, or the
 * host pool cannot hold it). Between steps, on the engine's thread. */
akv_status akv_engine_session_save(akv_engine *e, const int32_t *tokens, uint32_t n,
                                   const char *path);
akv_status akv_engine_session_load(akv_engine *e, const char *path, uint32_t *n_tokens);

/* Slots, llama-server's numbered view of the conversations the engine holds (docs/engine.md,
 * "Slots"): every context, running or idle, has a number below AKV_ENGINE_MAX_SLOT, given when
 * it first runs or goes idle (the lowest free one) and kept while it lives. Between steps, on
 * the engine's thread. */
#define AKV_ENGINE_MAX_SLOT 65536u
typedef struct akv_engine_slot {
    uint32_t id;
    uint32_t n_tokens;   /* its history */
    bool running;        /* a request runs on it (else idle: a finished conversation) */
    uint64_t request_id; /* the running request's id */
} akv_engine_slot;

/* Returns how many slots there are, n, and fills out[0..min(n, cap)): sorted by number when
 * n <= cap. */
uint32_t akv_engine_slots(const akv_engine *e, akv_engine_slot *out, uint32_t cap);

/* Slot id's conversation to path, as akv_engine_session_save writes it (*n_tokens: its
 * length). AKV_ENOTFOUND (no context holds the slot), AKV_EBUSY (a request runs on it), or the
 * save's errors; all logged. */
akv_status akv_engine_slot_save(akv_engine *e, uint32_t id, const char *path, uint32_t *n_tokens);

/* The conversation saved in path becomes slot id's, idle (*n_tokens: its length); what the
 * slot held (idle) is closed once the file is loaded, so a file that cannot be loaded leaves
 * the slot as it was. AKV_EBUSY (a request runs on the slot), AKV_EINVAL (id not below
 * AKV_ENGINE_MAX_SLOT), or the load's errors (akv_engine_session_load); all logged. */
akv_status akv_engine_slot_restore(akv_engine *e, uint32_t id, const char *path, uint32_t *n_tokens);

/* Closes slot id's idle conversation (*n_tokens: what it held). AKV_ENOTFOUND, AKV_EBUSY. */
akv_status akv_engine_slot_erase(akv_engine *e, uint32_t id, uint32_t *n_tokens);

/* Whether a request is queued or running. */
bool akv_engine_busy(const akv_engine *e);

/* Whether the engine gave up on its device (akv_engine_step). */
bool akv_engine_failed(const akv_engine *e);

void akv_request_get_info(const akv_request *rq, akv_request_info *out);
void akv_engine_get_stats(const akv_engine *e, akv_engine_stats *out);

/* The plan (borrowed, the engine's lifetime). */
const akv_engine_plan *akv_engine_get_plan(const akv_engine *e);

/* Writes the plan's formula and verdict as text lines (snprintf's contract). */
size_t akv_engine_plan_format(const akv_engine_plan *plan, char *buf, size_t cap);

/* The model's configuration, tokenizer (NULL without one), model (NULL for a synthetic
 * one), device, pools and route (borrowed, the engine's lifetime; for reports and checks). */
const akv_model_config *akv_engine_config(const akv_engine *e);
const akv_tok *akv_engine_tok(const akv_engine *e);
const akv_model *akv_engine_model(const akv_engine *e);
akv_dev *akv_engine_dev(const akv_engine *e);
akv_host_pool *akv_engine_host_pool(const akv_engine *e);
akv_dev_pool *akv_engine_dev_pool(const akv_engine *e);
akv_route *akv_engine_route(const akv_engine *e);

/* Bytes of weights one decode step reads, as stored (block matrices at their block size;
 * every matrix but the embedding table, of which a step reads one row): the device pass's
 * (akv_forward_dev_weight_bytes) or the host model's (akv_model_step_weight_bytes); the
 * numerator of the weight-bandwidth limit. */
uint64_t akv_engine_weight_bytes(const akv_engine *e);

/* The validity walker (tests): syncs the route (the host copies complete), then every
 * memory-layer structure (host pool, device pool, route) and the engine's own accounting
 * (reservations = what running requests hold, every sequence owned by exactly one request
 * or the idle list). AKV_ESTATE (logged) on a violation; the sync's status if it failed.
 * Host backend for the route's page contents. */
akv_status akv__engine_check(akv_engine *e);
/* Tests: waits until every conversation queued for the session directory is on the disk and in
 * its index (the writer thread's queue empty). */
void akv__engine_flush_sessions(akv_engine *e);
/* Tests: while held, a conversation being read back from the session directory waits before
 * its K/V is read (the engine steps on meanwhile); released, it goes on. Destroying the engine
 * releases it. */
void akv__engine_hold_restores(akv_engine *e, bool hold);

const char *akv_finish_name(akv_finish f);                 /* "stop", "length", ... */
const char *akv_refusal_reason_name(akv_refusal_reason r); /* "context", "host", ... */

#ifdef __cplusplus
}
#endif
#endif /* AKV_ENGINE_H */
