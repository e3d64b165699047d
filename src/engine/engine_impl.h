/*
 * engine/engine_impl.h — the engine's insides (akv/engine.h), shared by engine.c (the object,
 * the plan, admission, the step) and request.c (a request's sampling, text and events).
 */
#ifndef AKV_ENGINE_ENGINE_IMPL_H
#define AKV_ENGINE_ENGINE_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "akv/engine.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
#include "akv/json_prefix.h"
#include "akv/tok.h"
#include "engine/mask.h"

enum {
    AKV__ENGINE_MAX_RETRIES = 3,    /* failed steps in a row before a request fails */
    AKV__ENGINE_MAX_RECOVERIES = 8, /* step calls in a row whose undo failed (the device did
                                       not recover) before the engine gives up on it */
};

/* A context: a route sequence and the tokens its K/V holds (what a later prompt may share). */
typedef struct akv__ctx {
    akv_route_seq *seq;
    int32_t *tokens;       /* [n_tokens] = the sequence's history, in order */
    uint32_t n_tokens, cap;
    akv_request *owner;    /* the request running on it; NULL: idle */
    uint32_t slot1;        /* 1 + its slot number (akv_engine_slots); 0 until it first runs or
                              goes idle */
    bool exact;            /* its history is kept exact (akv_request_params.kv_exact) */
    uint64_t salt;         /* the cache_salt of the requests that wrote it */
    int8_t retention;      /* idle: its last request's retention (trimmed lowest first) */
    uint64_t last_used;    /* the engine step it was last released at (LRU) */
    uint32_t n_pin;        /* admitted requests counting on its pages (share_from): never
                              trimmed, never counted as freed by closing it */
    struct akv__ctx *next, *prev; /* the idle list, least recently used first */
} akv__ctx;

struct akv_request {
    akv_engine *e;
    akv_request_params p;  /* prompt and stop point at the copies below */
    int32_t *prompt;       /* [n_prompt] */
    char **stop;           /* [n_stop] NUL-terminated */
    size_t *stop_len;      /* [n_stop] */
    akv_request_info info;
    bool admitted;         /* its reservation is held (running or about to) */
    akv_logit_bias *bias;  /* [p.n_bias] its logit biases (owned) */
    float *biased;         /* [n_vocab] the logits with them added (NULL without) */
    bool released;         /* the caller forgot it: no events; freed when it ends */
    akv_sampler *sampler;
    akv_tok_stream stream; /* bytes of a UTF-8 sequence a token split */
    akv_tok_text held;     /* decoded text not yet emitted (a stop string may begin in it) */
    akv_tok_text piece;    /* scratch: one token's text */
    akv__ctx *ctx;         /* while admitted and started (NULL until its first step) */
    int32_t *gen;          /* [n_gen] the tokens it sampled, in order */
    akv_json_prefix json;  /* format JSON_OBJECT: the text so far as a JSON prefix */
    akv_js_state js;       /* format JSON_SCHEMA: ... as a prefix of a value of the schema */
    float *masked;         /* a format but TEXT: [n_vocab] the logits it samples from */
    char *after;           /* format_after's copy (NULL: the whole answer is the value) */
    size_t n_after;
    bool fmt_on;           /* the format holds the next token (with after: inside a value) */
    bool at_start;         /* format_at_start, before the answer's first byte that is not white
                              space */
    char *tail;            /* with after, outside a value: the answer's last n_after - 1
                              bytes (the string may begin in them) */
    size_t n_tail;
    akv__mask_cache masks; /* ... the masks of its format's states met lately (mask.h) */
    uint32_t gen_cap;
    uint32_t prefill0;     /* where its prefill began: chunks end at prefill0 + k * chunk */
    uint32_t n_fail;       /* failed steps in a row */
    uint64_t host_pages;   /* its reservation: host pages at its longest */
    uint64_t host_credit;  /* admitted, not started: of them, the full pages of its prefix that
                              share_from holds (it will share them), not counted as growth */
    akv__ctx *share_from;  /* ... and that context, pinned (NULL: none, or it was closed); a
                              conversation being read back for it is one too */
    bool no_read_back;     /* a read back for it failed or found no room: it computes instead */
    uint32_t dev_pages;    /* resident: window pages per layer at its longest */
    akv_route_seq_stats seq0; /* its sequence's counters when it was admitted */
    struct akv_request *next_q, *prev_q; /* the wait queue, or the all-requests list */
    struct akv_request *next_all, *prev_all;
};

typedef struct akv__spill_writer akv__spill_writer;

/* A conversation in the session directory (spill.c): its file and what finding it needs. */
typedef struct akv__spilled {
    char *path;
    int32_t *tokens;       /* [n_tokens] */
    uint32_t n_tokens;
    uint64_t salt, bytes;
    bool exact;
    int8_t retention;
    double mtime;          /* its file's time when the index was read at create (their order
                              then; entries added later are appended in order) */
} akv__spilled;

/* A file of the session directory being read back off the engine's thread (spill.c), one at a
 * time: job NULL when none. */
typedef struct akv__read_back {
    struct akv__restore *job;
    akv__spilled entry; /* its index entry, out of the index meanwhile */
    double t0;          /* when it began */
    uint64_t serial;    /* the request it began for */
} akv__read_back;

struct akv_engine {
    akv_engine_params p;
    akv_engine_plan plan;
    akv_dev *dev;
    akv_dev_info info;
    akv_model *own_model;
    const akv_model *model; /* NULL for a synthetic configuration */
    akv_model_config cfg;
    akv_tok *tok;           /* NULL without one */
    akv__vocab vocab;       /* its pieces in byte order for the answers' masks (mask.h), made
                               for the first request with a format */
    int32_t *eog;           /* ... and then its end-of-generation ids (akv__request_is_eog) */
    uint32_t n_eog;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_dev_pool *dpc;         /* the compact tier's pages (NULL: none) */
    akv_host_pool *hpc;        /* the staged compact route's compact copies (NULL: none) */
    akv_route *route;
    akv_forward *fh;        /* host pass */
    akv_forward_dev *fd;    /* device pass */
    /* requests */
    akv_request *all;                 /* every unreleased or unfinished request */
    akv_request *wait_head, *wait_tail; /* arrival order */
    uint32_t n_wait;
    akv_request **run;                /* [max_seqs] admitted, in arrival order */
    uint32_t n_run;
    akv__ctx *idle_head, *idle_tail;  /* least recently used first */
    uint32_t n_idle;
    /* Host pages (every layer). Admission promises each running request room to grow to its
     * prompt + max_tokens: the pages the running contexts hold, each once however many share
     * it, plus what they may still take (their growth), fit the pool once the idle contexts
     * are closed (docs/engine.md). */
    uint64_t host_reserved;           /* the admitted requests' reservations summed (a page
                                         shared by several counted for each) */
    uint64_t idle_sole;               /* engine_freeable(e, true): what closing every idle
                                         context would free, with the closes in flight ... */
    bool idle_sole_stale;             /* ... to be counted again: the idle set changed, */
    uint64_t idle_sole_shares;        /* or the pool's n_share_changes moved from this (a
                                         page's other holder gone, at a close's fence), */
    uint64_t idle_sole_used, idle_sole_allocs; /* or its pages in use or its allocations
                                         from these (a close done at a sync frees pages) */
    akv_request *unadmit_after;       /* the step's last request sent back to the queue (the
                                         next one goes after it: arrival order kept) */
    akv__ctx *leaving;                /* an idle context taken out to be replaced (a slot's
                                         restore): its own pages count as free */
    uint64_t dev_reserved;            /* resident: window pages per layer reserved */
    uint64_t clock;                   /* steps run (the idle list's LRU clock) */
    bool failed;                      /* the device did not recover */
    bool need_abort;                  /* the last step's abort failed: retry it first */
    uint32_t n_abort_fail;
    /* step scratch, [step_tokens] or [max_seqs] */
    akv_route_req *reqs;
    akv_request **batch;
    uint32_t *n_new, *pos0, *order;
    uint8_t *lmode;
    int32_t *chosen;        /* [max_seqs] the pass's tokens (ARGMAX and SAMPLE rows) */
    akv_fwd_sample_row *draw; /* [max_seqs] the SAMPLE rows' draws (the device pass's) */
    int32_t *pen;           /* [2][max_seqs x AKV_FORWARD_SAMPLE_PEN_MAX] their penalties */
    int32_t *tokens;
    float *logits;          /* [max_seqs][n_vocab] */
    bool logits_wide;          /* logits holds max_seqs + chunk rows (a prompt's logits) */
    akv_engine_stats stats;
    uint64_t trace_step; /* the route's last step whose layers the trace has, + 1 */
    /* sessions on disk (session.c) and the session directory (spill.c) */
    uint64_t sess_fingerprint;        /* the model's, computed at the first use */
    bool sess_fingerprint_ok;
    char *session_dir;                /* a copy of params.session_dir; NULL: none */
    struct akv__spill_writer *writer; /* the thread that writes them (spill.c), or NULL */
    akv__spilled *spill;              /* [n_spill] the directory's conversations, oldest first */
    size_t n_spill, cap_spill;
    uint64_t spill_bytes;             /* their files' bytes */
    akv__read_back read_back;         /* a file being read back (spill.c; job NULL: none) */
    atomic_bool restore_hold;         /* tests: reads wait before their K/V while set */
};

/* request.c: a request's life after admission. */
akv_status akv__request_init(akv_engine *e, akv_request *rq, const akv_request_params *p);
void akv__request_free(akv_request *rq);
/* How many tokens a[0..na) and b[0..nb) share from the start. */
static inline uint32_t akv__common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    const uint32_t n = na < nb ? na : nb;
    uint32_t k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* Its stream: the prompt, then the tokens it sampled. Its context holds the stream's first
 * ctx->n_tokens; each step feeds it on from there (a prompt chunk; or, decoding, everything
 * up to and including its last sampled token: one token, or more after a lost step). */
static inline int32_t akv__request_stream(const akv_request *rq, uint32_t i) {
    return i < rq->p.n_prompt ? rq->prompt[i] : rq->gen[i - rq->p.n_prompt];
}

/* Samples from the logits of its stream's last token, streams the token, and ends it when a
 * stop condition holds; returns true when it ended (finish set, its last event delivered). */
bool akv__request_on_logits(akv_request *rq, const float *logits);
/* The same with its token chosen already (the pass's greedy choice: akv__request_greedy; -1:
 * none could be, the request fails); logits the row it came from, or NULL. */
bool akv__request_on_token(akv_request *rq, int32_t token, const float *logits);
/* Whether its next token is the plain greedy choice (temperature 0, no penalty, no format, no
 * logits wanted), which the pass may make itself (AKV_FORWARD_LOGITS_ARGMAX). */
bool akv__request_greedy(const akv_request *rq);
/* Its next draw made where the logits are (AKV_FORWARD_LOGITS_SAMPLE): the sampler's row and
 * penalties (at most AKV_FORWARD_SAMPLE_PEN_MAX, into ids and counts), when it samples at a
 * temperature with no format, no logits wanted and few enough penalised tokens; false (nothing
 * spent) when the host must sample. */
bool akv__request_draw(akv_request *rq, akv_fwd_sample_row *row, int32_t *ids, int32_t *counts);
/* Delivers the last event of a request ending for `finish` with no token (cancelled, error). */
void akv__request_end(akv_request *rq, akv_finish finish);
/* Whether the token ends generation (end of sequence or turn, a control token). */
bool akv__request_is_eog(const akv_engine *e, int32_t token);

/* A context made outside a request (a session read from a file: session.c) becomes idle, the
 * most recently used, and older idle ones beyond max_idle or the host pages are closed (keep:
 * never c itself, which a request is about to start from; else c too, where nothing else can
 * go). AKV_EFULL (c closed) when the running requests' room leaves none for it. */
akv_status akv__engine_idle_adopt(akv_engine *e, akv__ctx *c, bool keep);
/* Takes c off the idle list (it stays open: the caller closes or runs it). */
void akv__engine_idle_remove(akv_engine *e, akv__ctx *c);
/* A read back from the session directory for rq, of a file of n_tokens sharing k of its
 * prompt's tokens: read_fits says whether its pages, held from its start, fit beside the
 * running requests' holdings and growth with rq counting on the full pages it will share
 * (*credit) instead of what it counts on now; read_for pins c, the read's context, for rq
 * with that credit (what rq counted on before unpinned). */
bool akv__engine_read_fits(akv_engine *e, const akv_request *rq, uint64_t n_tokens, uint32_t k,
                           uint64_t *credit);
void akv__engine_read_for(akv_engine *e, akv_request *rq, akv__ctx *c, uint64_t credit);

/* Closes a context (NULL: nothing; its pages are freed after their fences:
 * akv_route_seq_close) and frees it. */
void akv__ctx_close(akv_engine *e, akv__ctx *c);

/* session.c: a context to and from a file (the format in session.c). Write: c's history
 * (salt, exact and retention with it) to path through path.tmp.PID renamed over it: AKV_EIO
 * (logged; any earlier file as it was), AKV_ESTATE (a step was undone under it), AKV_EDEVICE,
 * AKV_ENOMEM. Read: a new context (its sequence open and filled, not idle yet: the caller
 * adopts or closes it): AKV_ENOTFOUND, AKV_EIO, AKV_EFORMAT, AKV_EFULL (logged; nothing open);
 * *disk_s (NULL: not wanted) gets the seconds it waited for the file's K/V to be read.
 * Peek: the header and token ids only, into meta (tokens akv__malloc'ed, no sequence): the
 * same refusals but for the K/V and the checksum. The file's bytes for n tokens: file_bytes. */
akv_status akv__session_write(akv_engine *e, const akv__ctx *c, const char *path);
akv_status akv__session_read(akv_engine *e, const char *path, akv__ctx **out, double *disk_s);
akv_status akv__session_peek(akv_engine *e, const char *path, akv__ctx *meta);
/* The read in two halves, so that the K/V need not be read on the engine's thread. begin (the
 * engine's thread): the header and token ids read and checked, the context's sequence opened
 * unfilled (akv_route_seq_open_unfilled: its host pages taken now), and its K/V read into
 * those pages and checked by a thread of the read's own (threaded; here, before returning,
 * when not or when no thread can be had); read's refusals, nothing open. wait: whether the
 * K/V's read has ended, waiting at most max_s seconds for it. end (the engine's thread, once
 * or instead of waiting): the thread joined; the context (its sequence marked filled, not
 * idle yet) or the K/V's refusal (AKV_EFORMAT: damaged, AKV_EIO, AKV_ENOMEM; the sequence
 * closed); *disk_s as read's. The job is freed. */
typedef struct akv__restore akv__restore;
akv_status akv__restore_begin(akv_engine *e, const char *path, bool threaded, akv__restore **out);
akv__ctx *akv__restore_ctx(const akv__restore *j); /* its context, before end */
bool akv__restore_wait(akv__restore *j, double max_s);
akv_status akv__restore_end(akv_engine *e, akv__restore *j, akv__ctx **out, double *disk_s);
/* c's file as bytes in memory (*out akv__malloc'ed, n bytes), and such bytes written to path
 * (through path.tmp.PID renamed over it; any thread: it touches no engine). */
akv_status akv__session_image(akv_engine *e, const akv__ctx *c, uint8_t **out, size_t *n);
akv_status akv__session_write_image(const char *path, const uint8_t *image, size_t n);
uint64_t akv__session_file_bytes(const akv_engine *e, uint64_t n_tokens);

/* spill.c: the session directory (params.session_dir). open: its files indexed (at create;
 * one that is not this model's session is skipped, and left alone). out: an idle context
 * about to be closed, or cut back to the prefix another prompt shares, is written there first
 * (a failure is logged: the context is closed or cut all the same, as without a directory).
 * in: the directory's conversation sharing the most of rq's prompt, when it shares more than
 * the in_memory tokens of any context in memory, is read back as an idle context and its file
 * removed (a damaged one is removed, logged, and the prompt computed). The read runs off the
 * engine's thread, one at a time, its context pinned for rq (akv__engine_read_fits says
 * whether it fits and what rq counts on; akv__engine_read_for pins it): true while it (or
 * another read, ahead of it) is under way: rq waits, and the other requests step on; false:
 * nothing in the directory serves it better, or no room for the read (it computes). poll: a
 * read that has ended is adopted (or dropped: its request, rq->no_read_back, computes); called
 * at every step, whoever waits. wait: at most max_s seconds for the read under way to end (a
 * step with nothing else to do). close: a read under way ended and dropped (its file stays),
 * the index freed (the files stay). */
akv_status akv__spill_open(akv_engine *e);
void akv__spill_out(akv_engine *e, const akv__ctx *c);
bool akv__spill_in(akv_engine *e, akv_request *rq, uint32_t in_memory);
void akv__spill_poll(akv_engine *e);
void akv__spill_wait(akv_engine *e, double max_s);
void akv__spill_close(akv_engine *e);
/* The directory's counters into out (n_spill_files, spill_bytes, n_spilled), and its walker. */
void akv__spill_stats(const akv_engine *e, akv_engine_stats *out);
akv_status akv__spill_check(const akv_engine *e);

#endif
