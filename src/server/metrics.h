/*
 * server/metrics.h — what the server counts, and its Prometheus text exposition (version
 * 0.0.4). Names follow vLLM's where one exists, with the prefix "akv:" (vLLM's "vllm:"):
 * requests running and waiting, K/V usage of the device and host pools, time to first token,
 * inter-token latency, end-to-end latency and queue time histograms, prompt and generation
 * token totals, finished requests by reason, refusals by reason, bytes staged host->device and
 * written back, device-pool reclamations by class, preemptions (always 0: admission reserves a
 * request's whole need, so nothing running is preempted), and the HTTP connections: open,
 * accepted, over a limit, refused at once, timed out, refused by the framing rules.
 *
 * Not thread-safe: the server updates and renders it under its own lock.
 */
#ifndef AKV_SERVER_METRICS_H
#define AKV_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dev_pool.h"
#include "akv/engine.h"
#include "server/http.h"

enum { AKV_HISTO_MAX_BOUNDS = 24 };

typedef struct akv_histo {
    const double *bounds; /* upper bounds, ascending (le); +Inf implied */
    int n_bounds;
    uint64_t counts[AKV_HISTO_MAX_BOUNDS + 1]; /* per bucket (not cumulative) */
    double sum;
    uint64_t n;
} akv_histo;

void akv_histo_observe(akv_histo *h, double v);

/* How a request ended, as the server counts it (the engine's finishes and the server's). */
typedef enum akv_metrics_end {
    AKV_END_STOP = 0,
    AKV_END_LENGTH,
    AKV_END_ABORT,      /* the client went away: cancelled */
    AKV_END_TIMEOUT,    /* --timeout: cancelled */
    AKV_END_SHUTDOWN,   /* cancelled by a shutdown */
    AKV_END_ERROR,      /* a step failed on it */
    AKV_END_COUNT
} akv_metrics_end;

/* Refusals by reason: the engine's admission reasons, then the server's own. */
typedef enum akv_metrics_refusal {
    AKV_MREFUSE_BAD_REQUEST = AKV_REFUSE_REASON_COUNT, /* 400 from the body */
    AKV_MREFUSE_UNAUTHORIZED,                          /* 401 */
    AKV_MREFUSE_TOO_LARGE,                             /* 413 */
    AKV_MREFUSE_NOT_READY,                             /* 503 while loading or stopping */
    AKV_MREFUSE_COUNT
} akv_metrics_refusal;

typedef struct akv_metrics {
    akv_histo ttft, itl, e2e, queue, prompt_len, gen_len;
    uint64_t prompt_tokens, gen_tokens, cached_tokens;
    uint64_t ended[AKV_END_COUNT];
    uint64_t refused[AKV_MREFUSE_COUNT];
    uint64_t http_requests; /* every HTTP request answered */
    akv_http_stats http;    /* the connections (copied in before each render) */
    /* the engine's state, snapshotted by the engine thread after each step */
    akv_engine_stats engine;
    akv_dev_pool_stats dev_pool;
    uint64_t host_used_bytes, host_limit_bytes;
    uint64_t host_shared_pages; /* owners beyond the first over the host pool's pages */
    uint64_t h2d_bytes, staged_bytes, d2h_bytes;
    uint64_t host_attended_bytes; /* the host-attended route: K/V bytes its host part read */
    int ready;
} akv_metrics;

void akv_metrics_init(akv_metrics *m);

/* The exposition into buf (snprintf's contract: returns the length it needs). */
size_t akv_metrics_render(const akv_metrics *m, const char *model, char *buf, size_t cap);

#endif
