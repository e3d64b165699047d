/*
 * akv/server.h — an OpenAI-compatible HTTP server over the engine (akv/engine.h).
 *
 *   POST /v1/chat/completions   messages rendered with the model's chat template
 *   POST /v1/completions        a prompt (text or token ids)
 *   GET  /v1/models             the one model served
 *   GET  /health                200 {"status":"ok"} when ready; 503 while loading, after a
 *                               failed load, or while stopping
 *   GET  /metrics               Prometheus text (server/metrics.h names every series)
 * Streaming ("stream": true) is server-sent events: one `data: {chunk}` per piece of text,
 * the finish chunk, the usage chunk when stream_options.include_usage, then `data: [DONE]`.
 *
 * Threads. One engine thread owns the engine (the pools, the route, the pass) and runs its
 * steps; it loads the model after the server listens, so /health answers 503 meanwhile. One
 * I/O thread accepts connections and reads requests under strict HTTP/1.1 framing, with a
 * deadline for each request's head and body, limits on connections (in all and per client
 * address) and answers /health, /metrics and /v1/models itself, so they are served while
 * generations run or slow clients hold connections. A generation gets a thread of its own: it
 * parses and tokenizes (akv_tok and akv_chat are thread-safe; a few prompts at a time), hands
 * the request to the engine thread through a command queue and reads its tokens back through
 * the request's own channel (a buffer under a lock and an eventfd). Only the engine thread
 * touches engine state.
 *
 * Refusals are answers, never crashes or 500s for bad input, in OpenAI's error shape:
 *   400  bad JSON or a bad field (named in "param"); a prompt that does not fit the context
 *        (code context_length_exceeded)
 *   401  --api-key set and the bearer token missing or wrong (every path but /health, known
 *        or not: decided from the headers, before any body byte is kept)
 *   404 / 405  unknown path / wrong method (also from the headers alone)
 *   408  the request's head and body did not arrive within read_timeout_s
 *   413  a body over max_body_bytes
 *   429  no room now and the queue is full (or there is no queue); a connection over
 *        max_connections_per_client (Retry-After: 1)
 *   503  admission cannot ever serve it (its host pages exceed the pool: the reason and the
 *        setting in the message), the model is loading or failed, the server is stopping, or
 *        it holds max_connections already (Retry-After: 1)
 *   504  the request ran past timeout_s (it is cancelled)
 * A client that goes away (streamed or not) is noticed at once (the connection's socket is
 * polled with the request's channel) and its request cancelled before the next engine step;
 * its pages are reused only after their fences (the route defers the free). A client that
 * only shuts its writing side after a whole request is answered (server/http.h: the probe).
 *
 * Shutdown (akv_server_shutdown, then akv_server_stop): the listening socket closes at once,
 * requests in flight get `grace_s` to finish, the rest are cancelled (their streams end with
 * an error event), everything is freed.
 */
#ifndef AKV_SERVER_H
#define AKV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "akv/engine.h"
#include "akv/log.h"
#include "akv/sample.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_server akv_server;

typedef struct akv_server_params {
    akv_engine_params engine;      /* the engine (its dev and model_path are required); the
                                      engine thread creates it; the server owns engine.dev */
    const char *host;              /* address to bind; NULL = "127.0.0.1" (loopback only) */
    uint16_t port;                 /* 0 = any free port (akv_server_port says which) */
    const char *api_key;           /* NULL = no authentication */
    const char *model_name;        /* the served name; NULL = "default" */
    const char *chat_template_name; /* a family ("chatml", "llama3") to force; NULL = the
                                      model's own template, recognised */
    const char *chat_template_text; /* Jinja source to recognise instead of the model's */
    akv_sample_params sample;      /* a request's sampling where it says nothing */
    int fixed_seed;                /* 1 = a request without a seed gets sample.seed; 0 = a
                                      fresh one each (as OpenAI's API and llama-server do) */
    uint32_t max_tokens_default;   /* max_tokens where a request says nothing; 0 = 512 (less
                                      when the prompt leaves less room in the context) */
    size_t max_body_bytes;         /* 0 = 16 MiB */
    uint32_t max_prompt_tokens;    /* 0 = the context */
    double timeout_s;              /* a request's limit, arrival to last token; 0 = 600 */
    double idle_timeout_s;         /* a kept-alive connection waits this long for its next
                                      request, and an answer may stall this long on a client
                                      that does not read; 0 = 60 */
    double read_timeout_s;         /* a request's head and body must arrive within this of its
                                      first byte (bytes that keep dripping do not extend it);
                                      0 = 30 */
    uint32_t max_connections;      /* connections served at once; 0 = 256. Past it a
                                      connection may still ask /health; else 503 */
    uint32_t max_connections_per_client; /* of those, from one client address; 0 = half of
                                      max_connections. Past it: /health, else 429 */
    const char *slot_save_path;    /* an existing directory: POST /slots/N?action=save and
                                      restore read and write files there (NULL: those answer
                                      501, as llama-server's do without --slot-save-path) */
    int content_specials;          /* 1 = control-token texts inside chat message contents are
                                      read as control tokens (llama-server's and vLLM's way);
                                      0 = contents are plain text (OpenAI's way) */
    int verbose;                   /* 1 = a log line per request */
    /* How the front end names settings: library messages name them by params field in
     * markers, {=host_gib} (akv/log.h); answers say each as settings_namer(field,
     * settings_user) says it (a flag, --host-gib). NULL = the field itself. */
    akv_log_namer settings_namer;
    void *settings_user;
} akv_server_params;

/* NULL host and model name, port 8080, the engine's and the sampler's defaults. */
akv_server_params akv_server_default_params(void);

/* Binds and listens, then starts the engine thread, which loads the model. Returns as soon
 * as the server listens. AKV_EINVAL (logged) for bad params; AKV_EIO when the address cannot
 * be bound (logged: in use, not an address of this host); AKV_ENOMEM. The server owns
 * p->engine.dev from the call on, whatever it returns. */
akv_status akv_server_start(const akv_server_params *p, akv_server **out);

/* The port it listens on. */
uint16_t akv_server_port(const akv_server *s);

/* Waits up to timeout_s for the model to load. AKV_OK ready; AKV_EFAILED the load failed
 * (logged by the engine); AKV_EBUSY still loading. */
akv_status akv_server_wait_ready(akv_server *s, double timeout_s);

/* Closes the listening socket (a new connection is refused from the return on), makes
 * /health say "stopping" and answers new requests on open connections 503; what runs goes
 * on. Idempotent; for a caller that waits for the requests in flight itself. */
void akv_server_shutdown(akv_server *s);

/* Requests submitted and not yet ended. Thread-safe. */
uint32_t akv_server_n_inflight(akv_server *s);

/* Shuts down (as above), lets the requests in flight run up to grace_s, cancels the rest,
 * stops the engine and every HTTP thread. Returns when all are done. Idempotent. */
void akv_server_stop(akv_server *s, double grace_s);

/* Stops (grace 0) if needed and frees. NULL is a no-op. */
void akv_server_destroy(akv_server *s);

#ifdef __cplusplus
}
#endif
#endif /* AKV_SERVER_H */
