/*
 * server/http.h — the server's HTTP/1.1 connections: one listening socket, one I/O thread
 * that accepts, reads and frames requests (server/http_parse.h) and writes short answers, and
 * a thread of its own for each long request (a generation), which owns its connection until
 * it has answered.
 *
 * Words
 *   head      a request's request line and headers; decided on before any body byte is kept
 *             (on_head: a 401, 404, 405 or 413 never stores the body)
 *   overflow  a connection accepted while the server is full (max_connections) or its client
 *             address holds max_per_client already: it may ask GET /health within a short
 *             deadline (on_head and on_request see `overflow` set); anything else is refused
 *             by the server's own answer, and the connection closes
 *   probe     after the client shut its writing side, the first bytes of the answer ("HTTP/1.1 "
 *             before a status is known, an SSE comment inside a stream): a client that has
 *             closed altogether answers them with a reset, which ends its request at once; one
 *             that only half-closed reads them as the start of its answer
 *   linger    after an answer that closes the connection: the writing side is shut and the
 *             client's late bytes are read and dropped for a moment, so a reset does not
 *             destroy the answer in flight
 *
 * Deadlines (all from akv_http_params)
 *   - a request's head and body must arrive within read_timeout_s of its first byte (of the
 *     connection's opening, for its first request); past it: 408 and close. Bytes that keep
 *     dripping do not extend it;
 *   - a kept-alive connection waits idle_timeout_s for the next request's first byte;
 *   - an answer that makes no progress for idle_timeout_s (a client that stopped reading) ends
 *     the connection;
 *   - an overflow connection has min(read_timeout_s, 2 s) for its head.
 *
 * Threads: the I/O thread runs on_head, on_request and on_fault (none may block) and owns
 * every connection not handed to a handler; a handler thread runs on_run and the conn calls
 * on its connection only. akv_http_close_listener and akv_http_stop come from one other
 * thread (the server's stop).
 */
#ifndef AKV_SERVER_HTTP_H
#define AKV_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"
#include "server/http_parse.h"

typedef struct akv_http akv_http;
typedef struct akv_http_conn akv_http_conn;

/* A request as the handlers see it. Strings are NUL-terminated; all of it is valid for the
 * call (on_head, on_request) or until on_run returns. */
typedef struct akv_http_request {
    akv_http_method method;
    const char *method_name;
    const char *path;          /* as sent (no percent-decoding), without the query */
    const char *query;         /* what followed '?', as sent ("" when none) */
    const char *authorization; /* the header's value, or NULL */
    int minor;                 /* HTTP/1.<minor> */
    const char *body;          /* the whole body (NULL in on_head, and when there is none) */
    size_t n_body;
    int overflow; /* 0, or the status an overflow connection is refused with:
                     503 (the server is full) or 429 (its address is) */
} akv_http_request;

/* An answer with its whole body. */
typedef struct akv_http_response {
    int status;
    const char *content_type; /* NULL = application/json */
    char *body;               /* from akv__malloc; the layer takes it; NULL = empty */
    size_t n_body;
    const char *allow;      /* 405: the Allow header's value */
    uint32_t retry_after_s; /* 429, 503: Retry-After; 0 = none */
    bool www_authenticate;  /* 401: WWW-Authenticate: Bearer */
    bool close;             /* close the connection after it */
} akv_http_response;

enum {
    AKV_HTTP_READ_BODY = 0, /* on_head: read the body, then on_request */
    AKV_HTTP_ANSWER,        /* *resp holds the answer */
    AKV_HTTP_DETACH,        /* on_request: on_run answers on a thread of its own */
};

typedef struct akv_http_handlers {
    void *user;
    /* The head is in, no body byte kept. AKV_HTTP_READ_BODY, or AKV_HTTP_ANSWER with *resp
     * (a body announced is then not read and the connection closes after the answer). */
    int (*on_head)(void *user, const akv_http_request *rq, akv_http_response *resp);
    /* The whole request is in. AKV_HTTP_ANSWER with *resp, or AKV_HTTP_DETACH. */
    int (*on_request)(void *user, const akv_http_request *rq, akv_http_response *resp);
    /* On a thread of its own: answers rq on c (akv_http_conn_send or the stream calls). When
     * it returns the connection goes back to the I/O thread, kept alive where it can be. */
    void (*on_run)(void *user, akv_http_conn *c, const akv_http_request *rq);
    /* The body of a refusal the layer decides (a malformed message, 408, 413, an overflow
     * connection past its cap): fills resp->body / content_type for status and message. */
    void (*on_fault)(void *user, int status, const char *message, akv_http_response *resp);
} akv_http_handlers;

typedef struct akv_http_params {
    const char *host;         /* a numeric address or a name to bind */
    uint16_t port;            /* 0 = any free port */
    uint32_t max_connections; /* connections served at once (overflow ones apart) */
    uint32_t max_per_client;  /* of those, from one client address */
    double read_timeout_s;    /* a request's head and body, from its first byte */
    double idle_timeout_s;    /* a kept-alive connection's wait; an answer's stall */
    size_t max_head_bytes;    /* request line and headers */
    size_t max_body_bytes;    /* a body (Content-Length refused at once, chunked once past) */
    akv_http_handlers h;
} akv_http_params;

/* What the connections did since the start. */
typedef struct akv_http_stats {
    uint64_t accepted;      /* connections accepted */
    uint32_t open;          /* open now (overflow ones included) */
    uint64_t overflow;      /* accepted over max_connections or max_per_client */
    uint64_t refused;       /* closed at once with a 503: the overflow connections' cap */
    uint64_t read_timeouts; /* requests not in within read_timeout_s (408) */
    uint64_t bad_framing;   /* messages refused by the framing rules */
} akv_http_stats;

/* Binds, listens and starts the I/O thread. AKV_EINVAL (logged) for an address that does not
 * resolve; AKV_EIO (logged) when it cannot be bound; AKV_ENOMEM. */
akv_status akv_http_start(const akv_http_params *p, akv_http **out);

uint16_t akv_http_port(const akv_http *h);
void akv_http_get_stats(akv_http *h, akv_http_stats *out);

/* Closes the listening socket: a new connection is refused by the kernel from the return on.
 * Connections already open are served on. */
void akv_http_close_listener(akv_http *h);

/* Waits up to flush_s for the handler threads to finish, then shuts the sockets of those left
 * (their sends and waits fail at once) and waits for them; stops the I/O thread and closes
 * every connection. Idempotent. */
void akv_http_stop(akv_http *h, double flush_s);

/* Stops (flush 0) if needed and frees. NULL is a no-op. */
void akv_http_destroy(akv_http *h);

/* ---- a handler thread's calls on its connection --------------------------------------------- */

/* Sends a whole answer (takes resp->body). 0, or -1 when the client is gone or stopped
 * reading for idle_timeout_s. */
int akv_http_conn_send(akv_http_conn *c, akv_http_response *resp);

/* Starts a streamed answer of unknown length: chunked for HTTP/1.1, closed at its end for
 * HTTP/1.0. `probe` (e.g. ":\n" for server-sent events) is what may be written between two
 * writes to learn whether a client that half-closed is still there. 0 or -1 as above. */
int akv_http_conn_stream_begin(akv_http_conn *c, int status, const char *content_type,
                               const char *probe);
int akv_http_conn_stream_write(akv_http_conn *c, const char *data, size_t n);
int akv_http_conn_stream_end(akv_http_conn *c);

/* Waits for efd to be readable (drains it: 1), for the deadline (akv_clock_s time: 0), or
 * for the client to go away (-1). A client that shuts only its writing side is probed (see
 * above) and waited on. */
int akv_http_conn_wait(akv_http_conn *c, int efd, double deadline);

#endif
