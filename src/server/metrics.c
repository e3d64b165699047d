/* metrics.c — histograms and the Prometheus text exposition of server/metrics.h. */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* vLLM's buckets for the same series. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0, 160., 640., 2560.};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,
                                    10.0, 15.0, 20.0, 30.0,  40.0,  50.0,  60.0,  120.0,
                                    240., 480., 960., 1920., 7680.};
static const double len_bounds[] = {1,    2,    5,     10,    20,    50,    100,   200,
                                    500,  1000, 2000,  5000,  10000, 20000, 50000, 100000,
                                    200000, 500000, 1000000};

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

void akv_metrics_init(akv_metrics *m) {
    memset(m, 0, sizeof *m);
    m->ttft = (akv_histo){.bounds = ttft_bounds, .n_bounds = NB(ttft_bounds)};
    m->itl = (akv_histo){.bounds = itl_bounds, .n_bounds = NB(itl_bounds)};
    m->e2e = (akv_histo){.bounds = e2e_bounds, .n_bounds = NB(e2e_bounds)};
    m->queue = (akv_histo){.bounds = e2e_bounds, .n_bounds = NB(e2e_bounds)};
    m->prompt_len = (akv_histo){.bounds = len_bounds, .n_bounds = NB(len_bounds)};
    m->gen_len = (akv_histo){.bounds = len_bounds, .n_bounds = NB(len_bounds)};
}

void akv_histo_observe(akv_histo *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v, h->n++;
}

/* A writer into buf that counts what it would need past cap. */
typedef struct out {
    char *buf;
    size_t cap, n;
} out;

__attribute__((format(printf, 2, 3))) static void put(out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(o->n < o->cap ? o->buf + o->n : NULL, o->n < o->cap ? o->cap - o->n : 0,
                      fmt, ap);
    va_end(ap);
    if (k > 0) o->n += (size_t)k;
}

static void head(out *o, const char *name, const char *type, const char *help) {
    put(o, "# HELP akv:%s %s\n# TYPE akv:%s %s\n", name, help, name, type);
}

static void gauge(out *o, const char *name, const char *help, const char *model, double v) {
    head(o, name, "gauge", help);
    put(o, "akv:%s{model_name=\"%s\"} %.17g\n", name, model, v);
}

static void counter(out *o, const char *name, const char *help, const char *model, double v) {
    head(o, name, "counter", help);
    put(o, "akv:%s{model_name=\"%s\"} %.17g\n", name, model, v);
}

static void histo(out *o, const char *name, const char *help, const char *model,
                  const akv_histo *h) {
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(o, "akv:%s_bucket{model_name=\"%s\",le=\"%g\"} %llu\n", name, model, h->bounds[i],
            (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(o, "akv:%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, model,
        (unsigned long long)cum);
    put(o, "akv:%s_sum{model_name=\"%s\"} %.17g\n", name, model, h->sum);
    put(o, "akv:%s_count{model_name=\"%s\"} %llu\n", name, model, (unsigned long long)h->n);
}

size_t akv_metrics_render(const akv_metrics *m, const char *model, char *buf, size_t cap) {
    out o = {buf, cap, 0};
    if (cap) buf[0] = '\0';
    const akv_engine_stats *e = &m->engine;
    const akv_dev_pool_stats *d = &m->dev_pool;
    gauge(&o, "ready", "1 when the model is loaded and requests are served", model, m->ready);
    gauge(&o, "num_requests_running", "Requests in the engine's batch steps", model, e->n_running);
    gauge(&o, "num_requests_waiting", "Requests admitted and waiting for room (the FIFO)", model,
          e->n_queued);
    gauge(&o, "num_idle_contexts", "Finished conversations kept for prefix reuse", model, e->n_idle);
    gauge(&o, "session_dir_files", "Finished conversations in the session directory", model,
          (double)e->n_spill_files);
    gauge(&o, "session_dir_bytes", "Their files' bytes", model, (double)e->spill_bytes);
    counter(&o, "session_dir_written_total", "Idle conversations written to the session "
            "directory instead of dropped", model, (double)e->n_spilled);
    counter(&o, "session_dir_restored_total", "Conversations read back from it for a prompt",
            model, (double)e->n_restored);
    counter(&o, "session_dir_restore_seconds_total", "Seconds their reads back took, each from "
            "its start to its adoption (read, checked, placed in the host pool)", model, e->restore_s);
    counter(&o, "session_dir_restore_disk_seconds_total", "Of them, seconds waiting for the disk",
            model, e->restore_disk_s);
    double win = d->window_capacity ? (double)d->window_used / d->window_capacity : 0;
    gauge(&o, "kv_cache_usage_perc", "Device pool: fraction of window pages held (1 = full)",
          model, win);
    gauge(&o, "device_pool_window_pages_used", "Device pool: window pages held by contexts",
          model, d->window_used);
    gauge(&o, "device_pool_window_pages", "Device pool: window pages it holds", model,
          d->window_capacity);
    gauge(&o, "device_pool_staging_pages_used", "Device pool: pages lent to staging", model,
          d->staging_used);
    gauge(&o, "host_pool_used_bytes", "Host pool: bytes of pages handed out", model,
          (double)m->host_used_bytes);
    gauge(&o, "host_pool_limit_bytes", "Host pool: its limit", model, (double)m->host_limit_bytes);
    gauge(&o, "host_pool_shared_pages", "Host pool: pages held by more contexts than one "
          "(a shared prefix), counted once for each context beyond the first", model,
          (double)m->host_shared_pages);
    gauge(&o, "host_pages_reserved", "Host pages (every layer) the admitted requests reserve, "
          "summed: a page several share counted for each", model, (double)e->host_pages_reserved);
    gauge(&o, "host_pages_growth", "Host pages (every layer) the running requests may still "
          "take: their reservations less what their contexts hold", model,
          (double)e->host_pages_growth);
    histo(&o, "time_to_first_token_seconds", "Arrival to first token", model, &m->ttft);
    histo(&o, "inter_token_latency_seconds", "Between successive tokens of a request", model,
          &m->itl);
    histo(&o, "e2e_request_latency_seconds", "Arrival to the last token", model, &m->e2e);
    histo(&o, "request_queue_time_seconds", "Arrival to admission into a step", model, &m->queue);
    histo(&o, "request_prompt_tokens", "Prompt tokens of finished requests", model, &m->prompt_len);
    histo(&o, "request_generation_tokens", "Generated tokens of finished requests", model,
          &m->gen_len);
    counter(&o, "prompt_tokens_total", "Prompt tokens computed", model, (double)m->prompt_tokens);
    counter(&o, "prompt_tokens_cached_total", "Prompt tokens reused from idle contexts", model,
            (double)m->cached_tokens);
    counter(&o, "generation_tokens_total", "Tokens generated", model, (double)m->gen_tokens);
    counter(&o, "generation_tokens_drawn_by_pass_total",
            "Of the tokens sampled at a temperature, those the device pass drew where the logits "
            "are (only the id crossed the bus)", model, (double)e->pass_draws);
    static const char *const ends[AKV_END_COUNT] = {"stop", "length", "abort", "timeout",
                                                    "shutdown", "error"};
    head(&o, "request_success_total", "counter", "Finished requests by reason");
    for (int i = 0; i < AKV_END_COUNT; i++)
        put(&o, "akv:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %llu\n",
            model, ends[i], (unsigned long long)m->ended[i]);
    head(&o, "request_refused_total", "counter", "Requests refused, by reason");
    for (int i = 1; i < AKV_MREFUSE_COUNT; i++) {
        const char *r = i < AKV_REFUSE_REASON_COUNT ? akv_refusal_reason_name((akv_refusal_reason)i)
                        : i == AKV_MREFUSE_BAD_REQUEST ? "bad_request"
                        : i == AKV_MREFUSE_UNAUTHORIZED ? "unauthorized"
                        : i == AKV_MREFUSE_TOO_LARGE    ? "too_large"
                                                        : "not_ready";
        put(&o, "akv:request_refused_total{model_name=\"%s\",reason=\"%s\"} %llu\n", model, r,
            (unsigned long long)m->refused[i]);
    }
    counter(&o, "num_preemptions_total",
            "Preemptions: always 0 (admission reserves a request's whole need)", model,
            (double)e->n_preemptions);
    counter(&o, "kv_h2d_bytes_total", "Host->device bytes: fills of fresh pages and staged copies",
            model, (double)m->h2d_bytes);
    counter(&o, "kv_staged_bytes_total", "Of them, staged copies of non-window pages", model,
            (double)m->staged_bytes);
    counter(&o, "kv_d2h_bytes_total", "Device->host bytes: write-back of new rows", model,
            (double)m->d2h_bytes);
    counter(&o, "kv_host_attended_bytes_total",
            "K/V bytes the host's cores attended where they lie (--route host)", model,
            (double)m->host_attended_bytes);
    static const struct { akv_dev_pool_reason r; const char *name; } classes[] = {
        {AKV_DEV_POOL_RECLAIM_BORROWED, "borrowed"},
        {AKV_DEV_POOL_RECLAIM_ABOVE_TARGET, "above_target"},
        {AKV_DEV_POOL_RECLAIM_IDLE, "idle"}};
    head(&o, "device_pool_reclaimed_pages_total", "counter",
         "Device window pages reclaimed from other contexts, by class");
    for (int i = 0; i < 3; i++)
        put(&o, "akv:device_pool_reclaimed_pages_total{model_name=\"%s\",class=\"%s\"} %llu\n",
            model, classes[i].name, (unsigned long long)d->counts.n_pages[classes[i].r]);
    counter(&o, "engine_steps_total", "Batch steps that ran a forward pass", model,
            (double)e->n_steps);
    counter(&o, "engine_step_failures_total", "Steps undone after a device failure", model,
            (double)e->n_step_failures);
    counter(&o, "http_requests_total", "HTTP request heads read", model, (double)m->http_requests);
    const akv_http_stats *h = &m->http;
    gauge(&o, "http_connections_open", "HTTP connections open", model, h->open);
    counter(&o, "http_connections_total", "HTTP connections accepted", model, (double)h->accepted);
    counter(&o, "http_overflow_connections_total",
            "Connections accepted past max_connections or max_connections_per_client "
            "(answered /health, else refused)", model, (double)h->overflow);
    counter(&o, "http_refused_connections_total",
            "Connections closed at once with a 503: even the overflow ones were full", model,
            (double)h->refused);
    counter(&o, "http_read_timeouts_total",
            "Requests not received within read_timeout_s or idle_timeout_s (408)", model,
            (double)h->read_timeouts);
    counter(&o, "http_bad_framing_total", "Messages refused by the HTTP framing rules", model,
            (double)h->bad_framing);
    return o.n;
}
