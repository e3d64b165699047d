/* server.c — the HTTP server (akv/server.h): libmicrohttpd connections, the engine thread, the
 * command queue between them and each request's channel. */
#define _GNU_SOURCE
#include "akv/server.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "akv/chat.h"
#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/model.h"
#include "akv/route.h"
#include "akv/tok.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/api.h"
#include "server/metrics.h"

enum { SRV_LOADING = 0, SRV_READY, SRV_FAILED, SRV_STOPPING };

/* A request's phase, as its channel says. */
enum { PH_PENDING = 0, PH_ADMITTED, PH_REFUSED, PH_DONE };

typedef struct srv_req srv_req;
typedef struct akv_server akv_server;

struct srv_req {
    akv_server *s;
    /* set by the HTTP thread before the submit, read-only after */
    akv_api_request api;
    akv_tok_ids ids;       /* the prompt's tokens, encoded */
    const int32_t *prompt; /* the prompt's tokens: ids.ids, or the request's own ids */
    uint32_t n_prompt_ids;
    uint64_t num;          /* its number (the engine's tag) */
    char id[40];
    long long created;
    double t_arrival;
    int sock;              /* the client's socket (polled for a hang-up) */
    int efd;               /* eventfd: the engine thread wrote to the channel */
    /* the channel, under mu */
    pthread_mutex_t mu;
    int phase;
    akv_api_error refusal;
    char *text;            /* every piece of text so far */
    size_t n_text, cap_text;
    akv_finish finish;
    akv_metrics_end end;   /* why it was cancelled, when it was (set by the canceller) */
    bool cancelled;        /* a canceller set end */
    uint32_t n_prompt, n_cached, n_gen;
    int refs;              /* the HTTP side and the engine side */
    /* engine thread only */
    akv_request *rq;
    double t_last;
    /* HTTP thread only: the stream */
    size_t sent;           /* bytes of text already in a chunk */
    char *out;             /* SSE bytes ready to send */
    size_t n_out, out_off, cap_out;
    bool started, finished, cancel_posted;
};

typedef struct srv_cmd {
    enum { CMD_SUBMIT, CMD_CANCEL } kind;
    srv_req *r;
    struct srv_cmd *next;
} srv_cmd;

struct akv_server {
    akv_server_params p;
    char *model_name;      /* sanitised for the metrics' labels */
    struct MHD_Daemon *mhd;
    uint16_t port;
    pthread_t engine_thread;
    bool thread_started;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* the engine thread: a command, a stop */
    pthread_cond_t state_cv; /* waiters for the state */
    int state;
    bool stop_engine;      /* the engine thread: cancel what runs and leave */
    srv_cmd *cmd_head, *cmd_tail;
    uint32_t n_inflight;   /* submitted (queued or admitted) requests not ended */
    uint32_t n_answering;  /* connections holding a request (until libmicrohttpd completes it) */
    akv_metrics m;
    /* set by the engine thread before READY, read-only after */
    akv_engine *engine;
    const akv_tok *tok;
    akv_chat *chat;
    uint64_t max_context;
    int32_t n_vocab;
    atomic_ullong next_id;
    uint64_t seed_base;    /* fresh_seed's: the start time in ns and the process id */
    bool stopped;
};

/* ---- requests ------------------------------------------------------------------------------ */

static void req_unref(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    akv_api_request_free(&r->api);
    akv_tok_ids_free(&r->ids);
    free(r->text);
    free(r->out);
    if (r->efd >= 0) close(r->efd);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static void req_wake(srv_req *r) {
    uint64_t one = 1;
    ssize_t k = write(r->efd, &one, sizeof one);
    (void)k; /* a full counter still wakes the reader */
}

/* Waits for the channel (1), the deadline (0) or the client going away (-1). */
static int req_wait(srv_req *r, double deadline) {
    for (;;) {
        double left = deadline - akv_clock_s();
        if (left <= 0) return 0;
        struct pollfd fds[2] = {{.fd = r->efd, .events = POLLIN},
                                {.fd = r->sock, .events = POLLRDHUP}};
        int ms = left > 3600 ? 3600000 : (int)ceil(left * 1e3);
        int k = poll(fds, r->sock >= 0 ? 2 : 1, ms);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (r->sock >= 0 && (fds[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return -1;
        if (fds[0].revents & POLLIN) {
            uint64_t v;
            ssize_t n = read(r->efd, &v, sizeof v);
            (void)n;
            return 1;
        }
    }
}

/* A refused submit: the reason in the channel. */
static void req_refuse(srv_req *r, int status, const char *msg) {
    pthread_mutex_lock(&r->mu);
    r->phase = PH_REFUSED;
    akv_api_error_set(&r->refusal, status, "server_error", NULL, NULL, "%s", msg);
    pthread_mutex_unlock(&r->mu);
    req_wake(r);
}

/* Hands a command to the engine thread; the command holds a reference to r. A submit that
 * cannot reach the engine (out of memory, the engine gone) is refused at once. */
static void post_cmd(akv_server *s, int kind, srv_req *r) {
    srv_cmd *c = malloc(sizeof *c);
    pthread_mutex_lock(&s->mu);
    const bool gone = s->stop_engine;
    if (c && !gone) {
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        *c = (srv_cmd){kind, r, NULL};
        if (kind == CMD_SUBMIT) s->n_inflight++; /* the grace period waits for it */
        if (s->cmd_tail) s->cmd_tail->next = c;
        else s->cmd_head = c;
        s->cmd_tail = c;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (c && !gone) return;
    free(c);
    if (kind == CMD_SUBMIT)
        req_refuse(r, 503, gone ? "the server is shutting down" : "out of memory");
}

/* Whether the request has ended (done or refused). */
static bool req_ended(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    bool ended = r->phase == PH_DONE || r->phase == PH_REFUSED;
    pthread_mutex_unlock(&r->mu);
    return ended;
}

/* The HTTP side cancels (the client went away, the request timed out), submitted or not yet
 * answered: the command queue is FIFO, so a CANCEL always reaches the engine after its
 * SUBMIT, and cancels whatever the submit made of it. */
static void req_cancel(srv_req *r, akv_metrics_end why) {
    if (r->cancel_posted) return;
    r->cancel_posted = true;
    pthread_mutex_lock(&r->mu);
    bool live = r->phase == PH_PENDING || r->phase == PH_ADMITTED;
    if (live) r->end = why, r->cancelled = true;
    pthread_mutex_unlock(&r->mu);
    if (live) post_cmd(r->s, CMD_CANCEL, r);
}

/* Waits for the channel of an admitted request. Past the deadline it is cancelled and its end
 * has 30 s more to arrive. 1: the channel spoke (or the cancel was just posted); 0: no end
 * even then; -1: the client went away (the request is cancelled). */
static int req_wait_running(srv_req *r, double deadline) {
    const bool timed_out = r->cancel_posted;
    int w = req_wait(r, timed_out ? deadline + 30 : deadline);
    if (w < 0) {
        req_cancel(r, AKV_END_ABORT);
        return -1;
    }
    if (w == 0 && !timed_out) {
        req_cancel(r, AKV_END_TIMEOUT); /* its end arrives through the channel */
        return 1;
    }
    return w;
}

/* ---- the engine thread --------------------------------------------------------------------- */

static void text_append(srv_req *r, const char *t, size_t n) {
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = r->cap_text ? r->cap_text : 256;
        while (cap < r->n_text + n + 1) cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p) return; /* the text is cut; the request still ends */
        r->text = p, r->cap_text = cap;
    }
    memcpy(r->text + r->n_text, t, n);
    r->n_text += n;
    r->text[r->n_text] = '\0';
}

static akv_metrics_end end_of(akv_finish f, akv_metrics_end cancelled_why) {
    switch (f) {
    case AKV_FINISH_STOP: return AKV_END_STOP;
    case AKV_FINISH_LENGTH: return AKV_END_LENGTH;
    case AKV_FINISH_CANCELLED: return cancelled_why;
    default: return AKV_END_ERROR;
    }
}

/* A token event (engine thread, inside a step, submit or cancel). */
static void on_token(void *user, akv_request *rq, const akv_token_event *ev) {
    srv_req *r = user;
    akv_server *s = r->s;
    double now = akv_clock_s();
    pthread_mutex_lock(&r->mu);
    if (ev->text && ev->n_text) text_append(r, ev->text, ev->n_text);
    bool first = ev->token >= 0 && r->n_gen == 0;
    if (ev->token >= 0) r->n_gen++;
    akv_metrics_end end = r->end;
    if (ev->finish != AKV_FINISH_NONE) {
        akv_request_info ri;
        akv_request_get_info(rq, &ri);
        r->finish = ev->finish;
        r->n_prompt = ri.n_prompt, r->n_cached = ri.n_cached, r->n_gen = ri.n_gen;
        r->phase = PH_DONE;
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    if (ev->token >= 0) {
        if (first) akv_histo_observe(&s->m.ttft, now - r->t_arrival);
        else akv_histo_observe(&s->m.itl, now - r->t_last);
    }
    if (ev->finish != AKV_FINISH_NONE) {
        akv_request_info ri;
        akv_request_get_info(rq, &ri);
        s->m.ended[end_of(ev->finish, end)]++;
        akv_histo_observe(&s->m.e2e, now - r->t_arrival);
        if (ri.t_admit > 0) akv_histo_observe(&s->m.queue, ri.t_admit - r->t_arrival);
        akv_histo_observe(&s->m.prompt_len, ri.n_prompt);
        akv_histo_observe(&s->m.gen_len, ri.n_gen);
        s->m.prompt_tokens += ri.n_prompt - ri.n_cached;
        s->m.cached_tokens += ri.n_cached;
        s->m.gen_tokens += ri.n_gen;
        s->n_inflight--;
        pthread_cond_broadcast(&s->state_cv);
    }
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    req_wake(r);
}

/* The status and type of a refusal. */
static void refusal_to_error(const akv_refusal *rf, void (*rename)(const char *, char *, size_t),
                             akv_api_error *err) {
    int status = 503;
    const char *type = "server_error", *code = NULL, *param = NULL;
    switch (rf->reason) {
    case AKV_REFUSE_CONTEXT:
        status = 400, type = "invalid_request_error", code = "context_length_exceeded";
        param = "max_tokens";
        break;
    case AKV_REFUSE_INVALID: status = 400, type = "invalid_request_error"; break;
    case AKV_REFUSE_BUSY:
    case AKV_REFUSE_QUEUE: status = 429, type = "rate_limit_error", code = "server_busy"; break;
    default: break; /* host, device, failed: 503 */
    }
    char msg[sizeof err->message];
    if (rename) rename(rf->message, msg, sizeof msg);
    else snprintf(msg, sizeof msg, "%s", rf->message);
    akv_api_error_set(err, status, type, code, param, "%s (%s)", msg,
                      akv_refusal_reason_name(rf->reason));
}

static void engine_submit(akv_server *s, srv_req *r) {
    akv_request_params rp = {.prompt = r->prompt,
                             .n_prompt = r->n_prompt_ids,
                             .max_tokens = r->api.max_tokens,
                             .sample = r->api.sample,
                             .ignore_eog = r->api.ignore_eos,
                             .stop = (const char *const *)r->api.stop,
                             .n_stop = r->api.n_stop,
                             .on_token = on_token,
                             .user = r,
                             .id = r->num};
    akv_refusal rf;
    memset(&rf, 0, sizeof rf);
    akv_status st = akv_engine_submit(s->engine, &rp, &r->rq, &rf);
    if (st == AKV_OK) {
        pthread_mutex_lock(&r->mu);
        if (r->phase == PH_PENDING) r->phase = PH_ADMITTED;
        pthread_mutex_unlock(&r->mu);
        req_wake(r);
        return;
    }
    const bool reasoned = rf.reason != AKV_REFUSE_NONE;
    pthread_mutex_lock(&s->mu);
    s->n_inflight--;
    if (reasoned) s->m.refused[rf.reason]++;
    pthread_cond_broadcast(&s->state_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&r->mu);
    if (reasoned)
        refusal_to_error(&rf, s->p.rename_settings, &r->refusal);
    else /* out of memory, or a failure without a reason: not the client's doing */
        akv_api_error_set(&r->refusal, 503, "server_error", NULL, NULL,
                          "the request could not be submitted: %s", akv_status_str(st));
    r->phase = PH_REFUSED;
    pthread_mutex_unlock(&r->mu);
    req_wake(r); /* engine_reap drops the engine's reference */
}

/* Requests that ended: the engine forgets them and drops its reference. */
static void engine_reap(akv_server *s, srv_req **live, size_t *n_live) {
    size_t k = 0;
    for (size_t i = 0; i < *n_live; i++) {
        srv_req *r = live[i];
        pthread_mutex_lock(&r->mu);
        bool done = r->phase == PH_DONE || r->phase == PH_REFUSED;
        pthread_mutex_unlock(&r->mu);
        if (!done) {
            live[k++] = r;
            continue;
        }
        if (r->rq) akv_engine_release(s->engine, r->rq);
        r->rq = NULL;
        req_unref(r);
    }
    *n_live = k;
}

static void engine_snapshot(akv_server *s) {
    akv_engine_stats es;
    akv_engine_get_stats(s->engine, &es);
    akv_dev_pool_stats ds;
    akv_dev_pool_get_stats(akv_engine_dev_pool(s->engine), &ds);
    akv_host_pool_stats hs;
    akv_host_pool_get_stats(akv_engine_host_pool(s->engine), &hs);
    akv_route_stats rs;
    akv_route_get_stats(akv_engine_route(s->engine), &rs);
    pthread_mutex_lock(&s->mu);
    s->m.engine = es, s->m.dev_pool = ds;
    s->m.host_used_bytes = hs.n_used * hs.page_bytes, s->m.host_limit_bytes = hs.limit_bytes;
    s->m.h2d_bytes = rs.h2d_bytes, s->m.staged_bytes = rs.staged_bytes, s->m.d2h_bytes = rs.d2h_bytes;
    pthread_mutex_unlock(&s->mu);
}

static void set_state(akv_server *s, int state) {
    pthread_mutex_lock(&s->mu);
    if (s->state != SRV_STOPPING || state == SRV_FAILED) s->state = state;
    s->m.ready = s->state == SRV_READY;
    pthread_cond_broadcast(&s->state_cv);
    pthread_mutex_unlock(&s->mu);
}

/* The chat template: forced by name, given as source, or the model's own. */
static void engine_open_chat(akv_server *s) {
    const akv_server_params *p = &s->p;
    const akv_model *model = akv_engine_model(s->engine);
    akv_status st;
    if (p->chat_template_text) {
        akv_chat_params cp = {.template_text = p->chat_template_text,
                              .name = p->chat_template_name};
        st = akv_chat_create(&cp, &s->chat);
    } else if (model) {
        st = akv_chat_create_from_gguf(akv_model_gguf(model), p->chat_template_name, &s->chat);
    } else {
        st = AKV_EUNSUPPORTED;
    }
    if (st)
        AKV_LOG_W("server: no chat template (%s): /v1/chat/completions answers 400; name the "
                  "family with chat_template_name (chatml, llama3)",
                  akv_status_str(st));
}

/* A queued submit the engine thread cannot take: refused, its command's reference dropped. */
static void submit_refused(akv_server *s, srv_req *r, const char *why) {
    pthread_mutex_lock(&s->mu);
    s->n_inflight--;
    pthread_cond_broadcast(&s->state_cv);
    pthread_mutex_unlock(&s->mu);
    req_refuse(r, 503, why);
    req_unref(r);
}

static void *engine_main(void *arg) {
    akv_server *s = arg;
    akv_status st = akv_engine_create(&s->p.engine, &s->engine);
    s->p.engine.dev = NULL; /* the engine owns it now, whatever create returned */
    if (st) {
        AKV_LOG_E("server: the engine could not be created: %s", akv_status_str(st));
        set_state(s, SRV_FAILED);
    } else {
        s->tok = akv_engine_tok(s->engine);
        s->max_context = akv_engine_get_plan(s->engine)->max_context;
        s->n_vocab = (int32_t)akv_engine_config(s->engine)->n_vocab;
        engine_open_chat(s);
        engine_snapshot(s);
        set_state(s, SRV_READY);
    }
    srv_req **live = NULL;
    size_t n_live = 0, cap_live = 0;
    bool busy = false;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->cmd_head && !s->stop_engine && !busy) pthread_cond_wait(&s->cv, &s->mu);
        srv_cmd *cmds = s->cmd_head;
        s->cmd_head = s->cmd_tail = NULL;
        bool stop = s->stop_engine;
        pthread_mutex_unlock(&s->mu);
        while (cmds) {
            srv_cmd *c = cmds;
            cmds = c->next;
            srv_req *r = c->r;
            const int kind = c->kind;
            free(c);
            if (kind == CMD_CANCEL) {
                if (r->rq) akv_engine_cancel(s->engine, r->rq);
                req_unref(r); /* the command's reference */
                continue;
            }
            if (!s->engine) { /* a submit raced a failed load */
                submit_refused(s, r, "the model failed to load");
                continue;
            }
            if (n_live == cap_live) {
                size_t cap = cap_live ? 2 * cap_live : 64;
                srv_req **g = realloc(live, cap * sizeof *g);
                if (!g) {
                    submit_refused(s, r, "out of memory");
                    continue;
                }
                live = g, cap_live = cap;
            }
            live[n_live++] = r;
            engine_submit(s, r);
        }
        if (stop) {
            for (size_t i = 0; i < n_live; i++) {
                pthread_mutex_lock(&live[i]->mu);
                if (live[i]->phase == PH_ADMITTED && !live[i]->cancelled)
                    live[i]->end = AKV_END_SHUTDOWN; /* else its canceller's reason stands */
                pthread_mutex_unlock(&live[i]->mu);
                if (live[i]->rq) akv_engine_cancel(s->engine, live[i]->rq);
            }
            engine_reap(s, live, &n_live);
            break;
        }
        if (s->engine && akv_engine_busy(s->engine)) {
            st = akv_engine_step(s->engine, NULL);
            if (st && akv_engine_failed(s->engine)) {
                AKV_LOG_E("server: the device failed and did not recover; every request ends");
                set_state(s, SRV_FAILED);
            }
        }
        if (s->engine) {
            engine_reap(s, live, &n_live);
            engine_snapshot(s);
        }
        busy = s->engine && akv_engine_busy(s->engine);
    }
    free(live);
    return NULL; /* the engine outlives the HTTP threads that borrow its tokenizer: stop frees it */
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

typedef struct srv_conn {
    char *body;
    size_t n_body, cap_body;
    bool too_large;
    srv_req *r;             /* the request it carries, if any */
} srv_conn;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 char *text /* malloc'ed, taken */) {
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        enum MHD_Result ret = MHD_queue_response(c, 503, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(akv_server *s, struct MHD_Connection *c, const akv_api_error *e,
                                  int refusal) {
    if (refusal >= 0) {
        pthread_mutex_lock(&s->mu);
        s->m.refused[refusal]++;
        pthread_mutex_unlock(&s->mu);
    }
    if (s->p.verbose) AKV_LOG_I("server: %d %s", e->status, e->message);
    return send_text(c, (unsigned)e->status, "application/json", akv_api_error_json(e));
}

static enum MHD_Result send_err(akv_server *s, struct MHD_Connection *c, int status,
                                const char *type, int refusal, const char *msg) {
    akv_api_error e;
    akv_api_error_set(&e, status, type, NULL, NULL, "%s", msg);
    return send_error(s, c, &e, refusal);
}

/* Whether the bearer token matches (constant time over the key's length). */
static bool auth_ok(const akv_server *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    const char *k = s->p.api_key;
    size_t nh = strlen(h), nk = strlen(k);
    unsigned diff = nh != nk;
    for (size_t i = 0; i < nk; i++) diff |= (unsigned)(k[i] ^ (i < nh ? h[i] : 0));
    return diff == 0;
}

static int get_state(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static enum MHD_Result not_ready(akv_server *s, struct MHD_Connection *c, int state) {
    return send_err(s, c, 503, "server_error", AKV_MREFUSE_NOT_READY,
                    state == SRV_LOADING  ? "the model is loading; retry when /health says ok"
                    : state == SRV_FAILED ? "the model failed to load or the device failed"
                                          : "the server is shutting down");
}

static enum MHD_Result handle_health(akv_server *s, struct MHD_Connection *c) {
    int state = get_state(s);
    const char *word = state == SRV_READY     ? "ok"
                       : state == SRV_LOADING ? "loading"
                       : state == SRV_FAILED  ? "error"
                                              : "stopping";
    char *b = malloc(64);
    if (b) snprintf(b, 64, "{\"status\":\"%s\"}", word);
    return send_text(c, state == SRV_READY ? 200 : 503, "application/json", b);
}

static enum MHD_Result handle_metrics(akv_server *s, struct MHD_Connection *c) {
    pthread_mutex_lock(&s->mu);
    size_t n = akv_metrics_render(&s->m, s->model_name, NULL, 0);
    char *b = malloc(n + 1);
    if (b) akv_metrics_render(&s->m, s->model_name, b, n + 1);
    pthread_mutex_unlock(&s->mu);
    return send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", b);
}

static enum MHD_Result handle_models(akv_server *s, struct MHD_Connection *c) {
    return send_text(c, 200, "application/json",
                     akv_api_models_json(s->p.model_name, (long long)time(NULL), s->max_context));
}

/* The prompt's tokens: the chat rendered and encoded (control tokens parsed), the text
 * encoded (BOS where the model asks), or the ids as given. */
static bool build_prompt(akv_server *s, srv_req *r, akv_api_error *err) {
    akv_api_request *a = &r->api;
    if (a->prompt_ids) {
        r->prompt = a->prompt_ids, r->n_prompt_ids = a->n_prompt_ids;
        return true;
    }
    akv_tok_text text = {0};
    const char *src = a->prompt;
    size_t n = a->prompt_len;
    uint32_t flags = AKV_TOK_ADD_SPECIAL;
    if (a->kind == AKV_API_CHAT) {
        if (!s->chat) {
            char how[128];
            const char *msg = "start the server with chat_template_name";
            if (s->p.rename_settings) s->p.rename_settings(msg, how, sizeof how);
            else snprintf(how, sizeof how, "%s", msg);
            akv_api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                              "the model has no chat template this server recognises; use "
                              "/v1/completions, or %s", how);
            return false;
        }
        if (akv_chat_render(s->chat, a->msgs, a->n_msgs, true, &text)) goto oom;
        src = text.bytes ? text.bytes : "", n = text.n_bytes;
        flags = AKV_TOK_PARSE_SPECIAL;
    }
    akv_status st = akv_tok_encode(s->tok, src, n, flags, &r->ids);
    akv_tok_text_free(&text);
    r->prompt = r->ids.ids, r->n_prompt_ids = (uint32_t)r->ids.n_ids;
    if (st == AKV_ENOMEM) goto oom;
    if (st) {
        akv_api_error_set(err, 400, "invalid_request_error", NULL,
                          a->kind == AKV_API_CHAT ? "messages" : "prompt",
                          "the prompt cannot be encoded: %s", akv_status_str(st));
        return false;
    }
    return true;
oom:
    akv_api_error_set(err, 503, "server_error", NULL, NULL, "out of memory");
    return false;
}

static const char *finish_word(akv_finish f) {
    return f == AKV_FINISH_LENGTH ? "length" : "stop";
}

/* The error of a request that ended without finishing (cancelled, failed). */
static void ended_error(const srv_req *r, akv_api_error *e) {
    if (r->finish == AKV_FINISH_ERROR)
        akv_api_error_set(e, 500, "server_error", NULL, NULL,
                          "the device failed on this request and it could not be redone");
    else if (r->end == AKV_END_TIMEOUT)
        akv_api_error_set(e, 504, "timeout", NULL, NULL, "the request ran past the server's "
                          "timeout (%.0f s) and was cancelled", r->s->p.timeout_s);
    else
        akv_api_error_set(e, 503, "server_error", NULL, NULL,
                          "the server is shutting down; the request was cancelled");
}

static void out_put(srv_req *r, const char *a, size_t n) {
    if (r->n_out + n > r->cap_out) {
        size_t cap = r->cap_out ? r->cap_out : 1024;
        while (cap < r->n_out + n) cap *= 2;
        char *p = realloc(r->out, cap);
        if (!p) return;
        r->out = p, r->cap_out = cap;
    }
    memcpy(r->out + r->n_out, a, n);
    r->n_out += n;
}

static void out_event(srv_req *r, char *json) {
    if (!json) return;
    out_put(r, "data: ", 6);
    out_put(r, json, strlen(json));
    out_put(r, "\n\n", 2);
    free(json);
}

/* The stream's next bytes (MHD's content reader, on the connection's thread). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_req *r = cls;
    akv_server *s = r->s;
    (void)pos;
    const double deadline = r->t_arrival + s->p.timeout_s;
    for (;;) {
        if (r->out_off < r->n_out) {
            size_t n = r->n_out - r->out_off < max ? r->n_out - r->out_off : max;
            memcpy(buf, r->out + r->out_off, n);
            r->out_off += n;
            return (ssize_t)n;
        }
        r->n_out = r->out_off = 0;
        if (r->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        const char *model = s->p.model_name;
        if (!r->started) { /* the role first, as OpenAI's first chunk */
            r->started = true;
            if (r->api.kind == AKV_API_CHAT)
                out_event(r, akv_api_chunk_json(r->api.kind, r->id, r->created, model, true, "", 0,
                                                NULL, NULL));
            continue;
        }
        pthread_mutex_lock(&r->mu);
        size_t from = r->sent, to = r->n_text;
        char *piece = to > from ? strndup(r->text + from, to - from) : NULL;
        int phase = r->phase;
        r->sent = to;
        pthread_mutex_unlock(&r->mu);
        if (piece) {
            out_event(r, akv_api_chunk_json(r->api.kind, r->id, r->created, model, false, piece,
                                            to - from, NULL, NULL));
            free(piece);
            continue;
        }
        if (phase == PH_DONE) {
            r->finished = true;
            if (r->finish == AKV_FINISH_STOP || r->finish == AKV_FINISH_LENGTH) {
                out_event(r, akv_api_chunk_json(r->api.kind, r->id, r->created, model, false, NULL,
                                                0, finish_word(r->finish), NULL));
                if (r->api.include_usage) {
                    akv_api_usage u = {r->n_prompt, r->n_gen, r->n_cached};
                    out_event(r, akv_api_chunk_json(r->api.kind, r->id, r->created, model, false,
                                                    NULL, 0, NULL, &u));
                }
            } else {
                akv_api_error e;
                ended_error(r, &e);
                out_event(r, akv_api_error_json(&e));
            }
            out_put(r, "data: [DONE]\n\n", 14);
            continue;
        }
        if (req_wait_running(r, deadline) <= 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* A seed for a request that gives none: the server's start time and the request's number,
 * mixed (splitmix64), so no two requests of a run, or of two runs, share one by accident. */
static uint64_t fresh_seed(const akv_server *s, uint64_t num) {
    uint64_t z = s->seed_base + num * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static enum MHD_Result handle_generate(akv_server *s, struct MHD_Connection *c, srv_conn *sc,
                                       akv_api_kind kind) {
    int state = get_state(s);
    if (state != SRV_READY) return not_ready(s, c, state);
    akv_api_limits lim = {.max_tokens_default = s->p.max_tokens_default,
                          .max_tokens_limit = s->max_context,
                          .n_vocab = s->n_vocab,
                          .sample = s->p.sample};
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return send_err(s, c, 503, "server_error", -1, "out of memory");
    r->s = s, r->refs = 1, r->efd = -1, r->sock = -1;
    pthread_mutex_init(&r->mu, NULL);
    sc->r = r;
    pthread_mutex_lock(&s->mu);
    s->n_answering++;
    pthread_mutex_unlock(&s->mu);
    r->t_arrival = akv_clock_s();
    r->created = (long long)time(NULL);
    r->num = (uint64_t)atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s%llu", kind == AKV_API_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)r->num);
    akv_api_error err;
    akv_status st = akv_api_parse(kind, sc->body ? sc->body : "", sc->n_body, &lim, &r->api, &err);
    if (st == AKV_ENOMEM) return send_err(s, c, 503, "server_error", -1, "out of memory");
    if (st) return send_error(s, c, &err, AKV_MREFUSE_BAD_REQUEST);
    if (!build_prompt(s, r, &err)) return send_error(s, c, &err, AKV_MREFUSE_BAD_REQUEST);
    const uint64_t n_prompt = r->n_prompt_ids;
    if (n_prompt == 0) {
        akv_api_error_set(&err, 400, "invalid_request_error", NULL,
                          kind == AKV_API_CHAT ? "messages" : "prompt",
                          "the prompt encodes to no tokens");
        return send_error(s, c, &err, AKV_MREFUSE_BAD_REQUEST);
    }
    const uint64_t max_prompt = s->p.max_prompt_tokens ? s->p.max_prompt_tokens : s->max_context;
    if (n_prompt > max_prompt || n_prompt >= s->max_context) {
        akv_api_error_set(&err, 400, "invalid_request_error", "context_length_exceeded",
                          kind == AKV_API_CHAT ? "messages" : "prompt",
                          "the prompt holds %llu tokens; this server takes at most %llu (and "
                          "leaves room for one new token in its %llu-token context)",
                          (unsigned long long)n_prompt,
                          (unsigned long long)(max_prompt < s->max_context - 1 ? max_prompt
                                                                               : s->max_context - 1),
                          (unsigned long long)s->max_context);
        return send_error(s, c, &err, AKV_MREFUSE_BAD_REQUEST);
    }
    /* a default max_tokens shrinks to the room the prompt leaves; an asked one is admission's */
    if (!r->api.seed_asked && !s->p.fixed_seed) r->api.sample.seed = fresh_seed(s, r->num);
    if (!r->api.max_tokens_asked && n_prompt + r->api.max_tokens > s->max_context)
        r->api.max_tokens = (uint32_t)(s->max_context - n_prompt);
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->sock = ci ? ci->connect_fd : -1;
    if (r->efd < 0) return send_err(s, c, 503, "server_error", -1, "out of file descriptors");
    /* the connection idles while the request runs (no bytes move before its first token, or
     * before a whole answer): the request's own limit governs it until it completes */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                              (unsigned)ceil(s->p.timeout_s) + 60u);
    post_cmd(s, CMD_SUBMIT, r); /* its reference becomes the engine's */
    const double deadline = r->t_arrival + s->p.timeout_s;
    for (;;) { /* admission */
        pthread_mutex_lock(&r->mu);
        int phase = r->phase;
        pthread_mutex_unlock(&r->mu);
        if (phase == PH_REFUSED) return send_error(s, c, &r->refusal, -1);
        if (phase != PH_PENDING) break;
        int w = req_wait(r, deadline);
        if (w < 0) { /* gone before admission: the cancel follows the submit */
            req_cancel(r, AKV_END_ABORT);
            return MHD_NO;
        }
        if (w == 0) {
            req_cancel(r, AKV_END_TIMEOUT);
            return send_err(s, c, 504, "timeout", -1, "no answer from the engine in time");
        }
    }
    if (r->api.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                      stream_read, r, NULL);
        if (!resp) {
            req_cancel(r, AKV_END_ABORT);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    for (;;) { /* the whole answer */
        pthread_mutex_lock(&r->mu);
        int phase = r->phase;
        pthread_mutex_unlock(&r->mu);
        if (phase == PH_DONE) break;
        if (req_wait_running(r, deadline) <= 0) return MHD_NO;
    }
    if (r->finish != AKV_FINISH_STOP && r->finish != AKV_FINISH_LENGTH) {
        ended_error(r, &err);
        return send_error(s, c, &err, -1);
    }
    akv_api_usage u = {r->n_prompt, r->n_gen, r->n_cached};
    return send_text(c, 200, "application/json",
                     akv_api_answer_json(kind, r->id, r->created, s->p.model_name,
                                         r->text ? r->text : "", r->n_text, finish_word(r->finish),
                                         &u));
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    akv_server *s = cls;
    (void)version;
    srv_conn *sc = *con_cls;
    const bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    if (!sc) { /* the headers are in */
        if (!(sc = calloc(1, sizeof *sc))) return MHD_NO;
        *con_cls = sc;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body_bytes) { /* refused before it is read */
            sc->too_large = true;
            char msg[128];
            snprintf(msg, sizeof msg, "the body is over the server's limit of %zu bytes",
                     s->p.max_body_bytes);
            return send_err(s, c, 413, "invalid_request_error", AKV_MREFUSE_TOO_LARGE, msg);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!sc->too_large && sc->n_body + *upload_size > s->p.max_body_bytes) sc->too_large = true;
        if (!sc->too_large) {
            if (sc->n_body + *upload_size + 1 > sc->cap_body) {
                size_t cap = sc->cap_body ? sc->cap_body : 4096;
                while (cap < sc->n_body + *upload_size + 1) cap *= 2;
                char *b = realloc(sc->body, cap);
                if (!b) return MHD_NO;
                sc->body = b, sc->cap_body = cap;
            }
            memcpy(sc->body + sc->n_body, upload, *upload_size);
            sc->n_body += *upload_size;
            sc->body[sc->n_body] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&s->mu);
    s->m.http_requests++;
    pthread_mutex_unlock(&s->mu);
    if (s->p.verbose) AKV_LOG_I("server: %s %s (%zu bytes)", method, url, sc->n_body);
    const bool health = !strcmp(url, "/health"), metrics = !strcmp(url, "/metrics");
    const bool models = !strcmp(url, "/v1/models") || !strcmp(url, "/models");
    const bool chat = !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions");
    const bool completion = !strcmp(url, "/v1/completions") || !strcmp(url, "/completions");
    if (!health && !metrics && !models && !chat && !completion) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such path: %.100s", url);
        return send_err(s, c, 404, "not_found_error", -1, msg);
    }
    if (!health && !auth_ok(s, c))
        return send_err(s, c, 401, "authentication_error", AKV_MREFUSE_UNAUTHORIZED,
                        "a valid API key is required: Authorization: Bearer KEY");
    if (((chat || completion) && !post) || ((health || metrics || models) && !get)) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s takes %s, not %.16s", url, chat || completion ? "POST" : "GET",
                 method);
        return send_err(s, c, 405, "invalid_request_error", -1, msg);
    }
    if (sc->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is over the server's limit of %zu bytes",
                 s->p.max_body_bytes);
        return send_err(s, c, 413, "invalid_request_error", AKV_MREFUSE_TOO_LARGE, msg);
    }
    if (health) return handle_health(s, c);
    if (metrics) return handle_metrics(s, c);
    int state = get_state(s);
    if (state != SRV_READY) return not_ready(s, c, state);
    if (models) return handle_models(s, c);
    return handle_generate(s, c, sc, chat ? AKV_API_CHAT : AKV_API_COMPLETION);
}

/* The connection's request is over (answered, or the client went away). */
static unsigned idle_timeout_of(const akv_server *s) {
    return (unsigned)ceil(s->p.idle_timeout_s);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why) {
    akv_server *s = cls;
    srv_conn *sc = *con_cls;
    if (!sc) return;
    if (sc->r) {
        if (!req_ended(sc->r)) /* the answer was cut, or never started */
            req_cancel(sc->r, why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? AKV_END_TIMEOUT
                                                                        : AKV_END_ABORT);
        req_unref(sc->r);
        if (why == MHD_REQUEST_TERMINATED_COMPLETED_OK) /* kept alive: idle again */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, idle_timeout_of(s));
        pthread_mutex_lock(&s->mu);
        s->n_answering--;
        pthread_cond_broadcast(&s->state_cv);
        pthread_mutex_unlock(&s->mu);
    }
    free(sc->body);
    free(sc);
    *con_cls = NULL;
}

/* ---- start / stop ----------------------------------------------------------------------------- */

akv_server_params akv_server_default_params(void) {
    akv_server_params p;
    memset(&p, 0, sizeof p);
    p.engine = akv_engine_default_params();
    p.port = 8080;
    p.sample = akv_sample_default_params();
    return p;
}

uint16_t akv_server_port(const akv_server *s) {
    return s->port;
}

/* libmicrohttpd's own messages (a connection closed because its client left, a malformed
 * request line): through the log hook, at info with --verbose and at debug otherwise, since
 * each is one client's event, answered or counted already. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const akv_server *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = '\0';
    akv__log(s->p.verbose ? AKV_LOG_INFO : AKV_LOG_DEBUG, "server: libmicrohttpd: %s", line);
}

static char *sanitised_name(const char *name) {
    char *n = strdup(name);
    for (char *p = n; p && *p; p++)
        if (*p == '"' || *p == '\\' || *p == '\n' || (unsigned char)*p < 0x20) *p = '_';
    return n;
}

akv_status akv_server_start(const akv_server_params *p, akv_server **out) {
    if (!p || !out || !p->engine.dev || !p->engine.model_path) {
        AKV_LOG_E("server: params need engine.dev and engine.model_path");
        if (p && p->engine.dev) akv_dev_destroy(p->engine.dev);
        return AKV_EINVAL;
    }
    akv_server *s = calloc(1, sizeof *s);
    if (!s) {
        akv_dev_destroy(p->engine.dev);
        return AKV_ENOMEM;
    }
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (!s->p.model_name) s->p.model_name = "default";
    if (!s->p.max_tokens_default) s->p.max_tokens_default = 512;
    if (!s->p.max_body_bytes) s->p.max_body_bytes = 16u << 20;
    if (!(s->p.timeout_s > 0)) s->p.timeout_s = 600;
    if (!s->p.max_connections) s->p.max_connections = 256;
    if (!(s->p.idle_timeout_s > 0)) s->p.idle_timeout_s = 60;
    s->model_name = sanitised_name(s->p.model_name);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->state_cv, NULL);
    akv_metrics_init(&s->m);
    atomic_init(&s->next_id, 1);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s->seed_base = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec +
                   ((uint64_t)getpid() << 40);
    /* the address */
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)s->p.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(s->p.host, port, &hints, &ai);
    if (gai || !ai) {
        AKV_LOG_E("server: the address '%s' (host): %s", s->p.host, gai_strerror(gai));
        akv_dev_destroy(s->p.engine.dev);
        s->p.engine.dev = NULL;
        akv_server_destroy(s);
        return AKV_EINVAL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(flags, s->p.port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR,
                              ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, s->p.max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, idle_timeout_of(s), MHD_OPTION_NOTIFY_COMPLETED,
                              completed, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        AKV_LOG_E("server: cannot listen on %s:%u (in use, or not an address of this host)",
                  s->p.host, (unsigned)s->p.port);
        akv_dev_destroy(s->p.engine.dev);
        s->p.engine.dev = NULL;
        akv_server_destroy(s);
        return AKV_EIO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) {
        AKV_LOG_E("server: cannot start the engine thread");
        akv_dev_destroy(s->p.engine.dev);
        s->p.engine.dev = NULL;
        akv_server_destroy(s);
        return AKV_ENOMEM;
    }
    s->thread_started = true;
    *out = s;
    return AKV_OK;
}

/* The absolute time timeout_s from now, for waits on state_cv (which every change of the
 * state, n_inflight and n_answering broadcasts). */
static struct timespec state_deadline(double timeout_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = until.tv_sec + until.tv_nsec * 1e-9 + (timeout_s > 0 ? timeout_s : 0);
    until.tv_sec = (time_t)t, until.tv_nsec = (long)((t - floor(t)) * 1e9);
    return until;
}

akv_status akv_server_wait_ready(akv_server *s, double timeout_s) {
    const struct timespec until = state_deadline(timeout_s);
    pthread_mutex_lock(&s->mu);
    while (s->state == SRV_LOADING &&
           pthread_cond_timedwait(&s->state_cv, &s->mu, &until) != ETIMEDOUT) {
    }
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st == SRV_READY ? AKV_OK : st == SRV_LOADING ? AKV_EBUSY : AKV_EFAILED;
}

void akv_server_stop(akv_server *s, double grace_s) {
    if (!s || s->stopped) return;
    s->stopped = true;
    set_state(s, SRV_STOPPING);
    /* no new connections; the listening socket is ours to close once the daemon stops */
    const int listen_fd = s->mhd ? MHD_quiesce_daemon(s->mhd) : -1;
    const struct timespec grace_until = state_deadline(grace_s);
    pthread_mutex_lock(&s->mu);
    while (s->n_inflight && pthread_cond_timedwait(&s->state_cv, &s->mu, &grace_until) != ETIMEDOUT) {
    }
    s->stop_engine = true; /* cancels the rest; their streams end with an error event */
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->engine_thread, NULL);
    s->thread_started = false;
    /* every request has ended now: give their connections a moment to send the last bytes (a
     * stream's error event and [DONE]) before the daemon closes them */
    const struct timespec flush_until = state_deadline(2);
    pthread_mutex_lock(&s->mu);
    while (s->n_answering && pthread_cond_timedwait(&s->state_cv, &s->mu, &flush_until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&s->mu);
    if (s->mhd) MHD_stop_daemon(s->mhd); /* waits for every connection's thread */
    s->mhd = NULL;
    if (listen_fd >= 0) close(listen_fd);
    /* no HTTP thread is left to borrow the tokenizer or the template */
    akv_chat_destroy(s->chat);
    s->chat = NULL;
    akv_engine_destroy(s->engine); /* the device with it */
    s->engine = NULL;
    /* commands posted after the engine left (cancels of ended requests) */
    for (srv_cmd *c = s->cmd_head, *n; c; c = n) {
        n = c->next;
        req_unref(c->r);
        free(c);
    }
    s->cmd_head = s->cmd_tail = NULL;
}

void akv_server_destroy(akv_server *s) {
    if (!s) return;
    akv_server_stop(s, 0);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->state_cv);
    free(s->model_name);
    free(s);
}
