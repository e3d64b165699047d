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
 * steps; it loads the model after the server listens, so /health answers 503 meanwhile.
 * HTTP connections run on libmicrohttpd's threads, one per connection; they parse and
 * tokenize (akv_tok and akv_chat are thread-safe), then hand the request to the engine thread
 * through a command queue and read its tokens back through the request's own channel (a
 * buffer under a lock and an eventfd). HTTP threads never touch engine state.
 *
 * Refusals are answers, never crashes or 500s for bad input, in OpenAI's error shape:
 *   400  bad JSON or a bad field (named in "param"); a prompt that does not fit the context
 *        (code context_length_exceeded)
 *   401  --api-key set and the bearer token missing or wrong (every path but /health)
 *   404 / 405  unknown path / wrong method
 *   413  a body over max_body_bytes
 *   429  no room now and the queue is full (or there is no queue)
 *   503  admission cannot ever serve it (its host pages exceed the pool: the reason and the
 *        setting in the message), the model is loading or failed, or the server is stopping
 *   504  the request ran past timeout_s (it is cancelled)
 * A client that goes away (streamed or not) is noticed at once (the connection's socket is
 * polled with the request's channel) and its request cancelled before the next engine step;
 * its pages are reused only after their fences (the route defers the free).
 *
 * Shutdown (akv_server_stop): stop accepting, give requests in flight `grace_s` to finish,
 * cancel the rest (their streams end with an error event), free everything.
 */
#ifndef AKV_SERVER_H
#define AKV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "akv/engine.h"
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
    double idle_timeout_s;         /* a connection with no request in flight and no bytes
                                      moving is closed after this; 0 = 60. While a request
                                      runs, timeout_s governs instead */
    uint32_t max_connections;      /* 0 = 256 */
    int verbose;                   /* 1 = a log line per request */
    /* How the front end names settings: rewrites a library message that names params fields
     * (an admission refusal's "raise host_gib") into its own words (a flag, --host-gib) in
     * buf[cap]. NULL = the field names as they are. */
    void (*rename_settings)(const char *msg, char *buf, size_t cap);
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

/* Stops accepting, lets the requests in flight run up to grace_s, cancels the rest, stops the
 * engine and every HTTP thread. Returns when all are done. Idempotent. */
void akv_server_stop(akv_server *s, double grace_s);

/* Stops (grace 0) if needed and frees. NULL is a no-op. */
void akv_server_destroy(akv_server *s);

#ifdef __cplusplus
}
#endif
#endif /* AKV_SERVER_H */
