/*
 * server/server_impl.h — the server's state, shared by its files: server.c (start, stop, the
 * routes and the answers) and engine_loop.c (the engine thread).
 *
 * Locks: s->mu guards the state, n_inflight, the tokenizer slots and the metrics; a
 * request's own lock guards its channel (server/channel.h); the queue has its own. Never
 * take s->mu while holding a request's lock.
 */
#ifndef AKV_SERVER_IMPL_H
#define AKV_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "akv/chat.h"
#include "akv/server.h"
#include "akv/tok.h"
#include "server/channel.h"
#include "server/http.h"
#include "server/metrics.h"

enum { AKV_SRV_LOADING = 0, AKV_SRV_READY, AKV_SRV_FAILED, AKV_SRV_STOPPING };

struct akv_server {
    akv_server_params p; /* with every default filled in */
    char *model_name;    /* sanitised for the metrics' labels */
    akv_http *http;
    pthread_t engine_thread;
    bool thread_started;
    akv_srv_queue q; /* HTTP threads -> the engine thread */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t state_cv; /* the state, n_inflight */
    pthread_cond_t tok_cv;   /* a tokenizer slot came free */
    int state;
    uint32_t n_inflight;   /* submitted (queued or admitted) requests not ended */
    uint32_t n_tokenizing; /* prompts being tokenized now (at most max_tokenizing) */
    uint32_t max_tokenizing;
    akv_metrics m;
    /* set by the engine thread before READY, read-only after */
    akv_engine *engine;
    const akv_tok *tok;
    akv_chat *chat;
    uint64_t max_context;
    akv_repr kv_tier;       /* the engine's compact tier (exact: none) */
    int32_t n_vocab;
    size_t max_piece_bytes; /* the tokenizer's longest token, in bytes */
    atomic_ullong next_id;
    uint64_t seed_base; /* fresh seeds: the start time in ns and the process id */
    bool stopped;
};

/* The engine thread (engine_loop.c): creates the engine, then runs commands and steps until
 * the queue closes. */
void *akv__server_engine_main(void *arg);

/* Sets the state (STOPPING stays, except for FAILED) and wakes its waiters. */
void akv__server_set_state(akv_server *s, int state);

/* An error answer in OpenAI's shape (counted under `refusal` when >= 0), and a text answer
 * (server.c). */
void akv__srv_err(akv_server *s, int status, const char *type, int refusal, const char *msg,
                  akv_http_response *resp);
void akv__srv_text(int status, const char *type, char *text /* akv__malloc'ed */,
                   akv_http_response *resp);

/* A new request of s (one reference, the caller's), or NULL when none can be made: then a
 * 503 saying why has been sent on c (server.c). */
akv_srv_req *akv__srv_req_new(akv_server *s, akv_http_conn *c);

/* The /slots endpoints (slots.c): the HTTP side of GET /slots and POST /slots/N?action=, on the
 * request's own thread; and the engine thread's side of a slot command. */
void akv__server_slots(akv_server *s, akv_http_conn *c, const akv_http_request *rq);
void akv__server_slot_run(akv_server *s, akv_srv_req *r);

#endif
