/*
 * server/channel.h — what passes between a request's HTTP thread and the engine thread: the
 * request itself with its channel, and the command queue.
 *
 * Words
 *   request  akv_srv_req: what the HTTP side parsed (read-only once submitted), its channel,
 *            and the engine thread's handle on it. Reference-counted: the HTTP side holds one,
 *            every command in the queue one, the engine thread one while the request is live
 *            there; it is freed when the last is dropped, so a client that leaves and an
 *            engine that finishes may happen in either order.
 *   channel  the request's outcome so far, under its lock: its phase (pending, admitted,
 *            refused, done), its text, its refusal, its finish and token counts, plus an
 *            eventfd the engine side writes after every change.
 *   queue    SUBMIT, CANCEL and SLOT commands from HTTP threads to the engine thread, first in
 *            first out, so a request's CANCEL always reaches the engine after its SUBMIT.
 *            Once closed it takes nothing more; what it still holds is the engine thread's
 *            to drain.
 *
 * Rules
 *   - the phase only moves forward: pending -> admitted -> done, or pending -> refused
 *     (admitted -> refused and done -> anything are refused by assertion);
 *   - text is appended only before the end (the engine may end a request inside its
 *     submit); the HTTP side reads it from where it stopped;
 *   - every function here is thread-safe unless it says "engine thread" or "HTTP side".
 */
#ifndef AKV_SERVER_CHANNEL_H
#define AKV_SERVER_CHANNEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/engine.h"
#include "akv/tok.h"
#include "server/api.h"
#include "server/metrics.h"

typedef enum akv_srv_phase {
    AKV_SRV_PENDING = 0, /* submitted, not yet admitted */
    AKV_SRV_ADMITTED,    /* running (or queued inside the engine) */
    AKV_SRV_REFUSED,     /* never ran: refusal says why */
    AKV_SRV_DONE,        /* ended: finish says how */
} akv_srv_phase;

/* One generated token's log-probabilities as the engine thread took them from its logits
 * (akv_api_token_logprobs): its own, and the n_top most likely tokens', most likely first. */
typedef struct akv_srv_tok {
    int32_t id;
    float logprob;
    uint32_t n_top;
    int32_t top_id[AKV_API_MAX_TOP_LOGPROBS];
    float top_lp[AKV_API_MAX_TOP_LOGPROBS];
} akv_srv_tok;

/* A slot command (GET /slots, POST /slots/N?action=...: slots.c): what the HTTP side asks,
 * and the engine thread's answer, written before the request is done. */
typedef enum akv_srv_slot_action {
    AKV_SRV_SLOTS_LIST = 0,
    AKV_SRV_SLOT_SAVE,
    AKV_SRV_SLOT_RESTORE,
    AKV_SRV_SLOT_ERASE,
} akv_srv_slot_action;

typedef struct akv_srv_slot_op {
    akv_srv_slot_action action;
    uint32_t id;
    char *path;              /* save, restore: the file (freed with the request) */
    akv_status st;           /* the answer: the engine's status ... */
    uint32_t n_tokens;       /* ... the conversation's length ... */
    double ms;               /* ... the action's time ... */
    akv_engine_slot *list;   /* ... list: every slot (freed with the request) */
    uint32_t n_list;
} akv_srv_slot_op;

typedef struct akv_srv_req {
    /* set by the HTTP side before the submit, read-only after */
    void *owner; /* the server */
    struct akv_srv_req *lead; /* a choice after the first (n > 1): its api (a copy whose strings
                                 and arrays are the lead's), prompt and eventfd are the lead's,
                                 and it holds a reference to the lead; NULL: a lead */
    akv_api_request api;
    akv_tok_ids ids;       /* the prompt's tokens, encoded */
    const int32_t *prompt; /* the prompt's tokens: ids.ids, or the request's own ids */
    uint32_t n_prompt_ids;
    uint64_t num;      /* its number (the engine's tag) */
    char id[40];       /* chatcmpl-N / cmpl-N */
    long long created; /* Unix seconds */
    double t_arrival;  /* akv_clock_s */
    int efd;           /* eventfd: the channel changed */
    /* the channel, under mu */
    pthread_mutex_t mu;
    akv_srv_phase phase;
    akv_api_error refusal; /* AKV_SRV_REFUSED */
    char *text;            /* every piece of text so far, NUL-terminated */
    size_t n_text, cap_text;
    bool text_cut;       /* a piece was lost (no memory): the answer is incomplete */
    akv_srv_tok *toks;   /* logprobs asked: a record per generated token, in order */
    size_t n_toks, cap_toks;
    akv_srv_tok *ptoks;  /* echo with logprobs: a record per prompt token after the first */
    size_t n_ptoks, cap_ptoks;
    akv_finish finish;   /* AKV_SRV_DONE */
    akv_metrics_end end; /* why it was cancelled, when it was (set by the canceller) */
    bool cancelled;      /* a canceller set end */
    uint32_t n_prompt, n_cached, n_gen;
    int refs;
    akv_srv_slot_op slot; /* a slot command's: the HTTP side's question, then the answer */
    /* engine thread only */
    akv_request *rq;
    double t_last; /* the last token's time */
    /* HTTP side only */
    size_t sent; /* bytes of text already answered */
    size_t sent_toks; /* token records already answered */
    bool cancel_posted;
} akv_srv_req;

/* A new request with one reference (the caller's) and its eventfd. AKV_ENOMEM, or AKV_EIO
 * when no eventfd can be made (out of descriptors). */
akv_status akv_srv_req_create(akv_srv_req **out);
/* Another choice of a lead's request (the lead fully built: api, prompt): the lead's api by
 * value (borrowing its strings), its prompt and eventfd, one reference on the lead. */
akv_status akv_srv_req_create_choice(akv_srv_req *lead, akv_srv_req **out);
void akv_srv_req_ref(akv_srv_req *r);
void akv_srv_req_unref(akv_srv_req *r); /* the last one frees it */

/* ---- the engine side -------------------------------------------------------------------- */

void akv_srv_req_admit(akv_srv_req *r); /* pending -> admitted (a no-op otherwise) */
void akv_srv_req_refuse(akv_srv_req *r, const akv_api_error *why); /* pending -> refused */
/* Appends text and (tok not NULL) a token's record together, so a reader takes a token's
 * record with its text (or, while a stop string may begin in it, before). */
void akv_srv_req_append(akv_srv_req *r, const char *text, size_t n, const akv_srv_tok *tok);
/* Appends a prompt token's record (echo with logprobs). */
void akv_srv_req_append_prompt(akv_srv_req *r, const akv_srv_tok *tok);
/* -> done, with the finish and the counts the engine reports. */
void akv_srv_req_finish(akv_srv_req *r, akv_finish finish, uint32_t n_prompt, uint32_t n_cached,
                        uint32_t n_gen);
/* Marks the request cancelled for `why` unless it has ended or was cancelled already; the
 * first reason stands. Returns whether this call marked it. */
bool akv_srv_req_mark_cancelled(akv_srv_req *r, akv_metrics_end why);

/* ---- the HTTP side ------------------------------------------------------------------------ */

akv_srv_phase akv_srv_req_phase(akv_srv_req *r);

/* The text added since the last call (a copy from akv__malloc in *piece, NULL when none) and
 * the phase at that moment, so a reader that sees AKV_SRV_DONE has every piece; with toks
 * not NULL, the token records added since the last call too (a copy in *toks, NULL when none;
 * taken when there is text or the request is done, so records go out with their text).
 * AKV_ENOMEM leaves both to the next call. */
akv_status akv_srv_req_take_text(akv_srv_req *r, char **piece, size_t *n, akv_srv_tok **toks,
                                 size_t *n_toks, akv_srv_phase *phase);

/* ---- the command queue -------------------------------------------------------------------- */

typedef enum akv_srv_cmd_kind {
    AKV_SRV_SUBMIT = 0,
    AKV_SRV_CANCEL,
    AKV_SRV_SLOT, /* a slot command (r->slot): answered by finishing r */
} akv_srv_cmd_kind;

typedef struct akv_srv_cmd {
    akv_srv_cmd_kind kind;
    akv_srv_req *r; /* the command's reference */
    struct akv_srv_cmd *next;
} akv_srv_cmd;

typedef struct akv_srv_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a command, or the close */
    akv_srv_cmd *head, *tail;
    bool closed;
} akv_srv_queue;

void akv_srv_queue_init(akv_srv_queue *q);
/* Frees what it still holds (dropping their references). */
void akv_srv_queue_deinit(akv_srv_queue *q);

/* Posts a command that holds its own reference to r. AKV_OK; AKV_ESTATE when the queue is
 * closed; AKV_ENOMEM. Nothing changes on an error. */
akv_status akv_srv_queue_post(akv_srv_queue *q, akv_srv_cmd_kind kind, akv_srv_req *r);

/* Takes every command, in order (the caller frees each with akv_srv_cmd_free), waiting for
 * one first when `wait` and the queue is open and empty. *closed: whether it was closed. */
akv_srv_cmd *akv_srv_queue_take(akv_srv_queue *q, bool wait, bool *closed);

/* Takes nothing more; wakes a waiting taker. */
void akv_srv_queue_close(akv_srv_queue *q);

/* Drops the command's reference and frees it. */
void akv_srv_cmd_free(akv_srv_cmd *c);

#endif
