/* server.c — the HTTP server (akv/server.h): start and stop, the routes, and the answers.
 * The connections are server/http.c's, the engine thread engine_loop.c's, and what passes
 * between an HTTP thread and the engine thread server/channel.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/server_impl.h"
#include "akv/trace.h"
#include "server/tools.h"

/* ---- answers ---------------------------------------------------------------------------- */

/* An error answer in OpenAI's shape; counted under `refusal` when >= 0. */
static void error_response(akv_server *s, const akv_api_error *e, int refusal,
                           akv_http_response *resp) {
    if (refusal >= 0) {
        pthread_mutex_lock(&s->mu);
        s->m.refused[refusal]++;
        pthread_mutex_unlock(&s->mu);
    }
    if (s->p.verbose) AKV_LOG_I("server: %d %s", e->status, e->message);
    resp->status = e->status;
    resp->content_type = "application/json";
    resp->body = akv_api_error_json(e);
    resp->n_body = resp->body ? strlen(resp->body) : 0;
    if (e->status == 429 || e->status == 503) resp->retry_after_s = 1;
    if (e->status == 401) resp->www_authenticate = true;
}

void akv__srv_err(akv_server *s, int status, const char *type, int refusal, const char *msg,
                         akv_http_response *resp) {
    akv_api_error e;
    akv_api_error_set(&e, status, type, NULL, NULL, "%s", msg);
    error_response(s, &e, refusal, resp);
}

/* The same for a message that names settings in markers ({=field}, akv/log.h): said in the
 * front end's words (settings_namer). */
static void err_response_named(akv_server *s, int status, const char *type, int refusal,
                               const char *msg, akv_http_response *resp) {
    char said[384];
    akv_log_render(msg, s->p.settings_namer, s->p.settings_user, said, sizeof said);
    akv__srv_err(s, status, type, refusal, said, resp);
}

void akv__srv_text(int status, const char *type, char *text /* akv__malloc'ed */,
                          akv_http_response *resp) {
    resp->status = text ? status : 503;
    resp->content_type = type;
    resp->body = text;
    resp->n_body = text ? strlen(text) : 0;
}

static int get_state(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    const int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void not_ready(akv_server *s, int state, akv_http_response *resp) {
    akv__srv_err(s, 503, "server_error", AKV_MREFUSE_NOT_READY,
                 state == AKV_SRV_LOADING  ? "the model is loading; retry when /health says ok"
                 : state == AKV_SRV_FAILED ? "the model failed to load or the device failed"
                                           : "the server is shutting down",
                 resp);
    if (state == AKV_SRV_STOPPING) resp->close = true;
}

/* ---- routes ------------------------------------------------------------------------------- */

typedef enum srv_route {
    ROUTE_NONE = 0,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_CHAT,
    ROUTE_COMPLETION,
    ROUTE_SLOTS,       /* GET /slots */
    ROUTE_TRACE,       /* GET /trace: the trace's last events (--trace-level) */
    ROUTE_SLOT_ACTION, /* POST /slots/N?action=... (N checked by slots.c) */
} srv_route;

/* The route of a path, matched as sent: no percent-decoding, so "/health%00x" is no route.
 * The /v1 prefix may be left out, as llama-server allows. */
static srv_route route_of(const char *path) {
    static const struct {
        const char *path;
        srv_route r;
    } routes[] = {{"/health", ROUTE_HEALTH},
                  {"/metrics", ROUTE_METRICS},
                  {"/v1/models", ROUTE_MODELS},
                  {"/models", ROUTE_MODELS},
                  {"/v1/chat/completions", ROUTE_CHAT},
                  {"/chat/completions", ROUTE_CHAT},
                  {"/v1/completions", ROUTE_COMPLETION},
                  {"/completions", ROUTE_COMPLETION},
                  {"/v1/slots", ROUTE_SLOTS},
                  {"/slots", ROUTE_SLOTS},
                  {"/trace", ROUTE_TRACE}};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(path, routes[i].path)) return routes[i].r;
    if (!strncmp(path, "/slots/", 7) || !strncmp(path, "/v1/slots/", 10)) return ROUTE_SLOT_ACTION;
    return ROUTE_NONE;
}

/* Whether the bearer token matches (constant time over the key's length). */
static bool auth_ok(const akv_server *s, const char *h) {
    if (!s->p.api_key) return true;
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ')
        h++;
    const char *k = s->p.api_key;
    size_t nh = strlen(h), nk = strlen(k);
    unsigned diff = nh != nk;
    for (size_t i = 0; i < nk; i++)
        diff |= (unsigned)(k[i] ^ (i < nh ? h[i] : 0));
    return diff == 0;
}

/* Decided from the head alone, before any body byte is kept: an overflow connection's
 * refusal, 401 (before 404, so paths cannot be enumerated without the key), 404, 405. */
static int on_head(void *user, const akv_http_request *rq, akv_http_response *resp) {
    akv_server *s = user;
    pthread_mutex_lock(&s->mu);
    s->m.http_requests++;
    pthread_mutex_unlock(&s->mu);
    if (s->p.verbose) AKV_LOG_I("server: %s %s", rq->method_name, rq->path);
    const srv_route r = route_of(rq->path);
    const bool get = rq->method == AKV_HTTP_GET || rq->method == AKV_HTTP_HEAD;
    if (rq->overflow) {
        if (r == ROUTE_HEALTH && get) return AKV_HTTP_READ_BODY;
        err_response_named(
            s, rq->overflow, rq->overflow == 429 ? "rate_limit_error" : "server_error", -1,
            rq->overflow == 429 ? "this client address holds as many connections as the server "
                                  "allows one client ({=max_connections_per_client}); retry"
                                : "the server holds as many connections as it allows "
                                  "({=max_connections}); retry",
            resp);
        resp->close = true;
        return AKV_HTTP_ANSWER;
    }
    if (r != ROUTE_HEALTH && !auth_ok(s, rq->authorization)) {
        akv__srv_err(s, 401, "authentication_error", AKV_MREFUSE_UNAUTHORIZED,
                     "a valid API key is required: Authorization: Bearer KEY", resp);
        return AKV_HTTP_ANSWER;
    }
    if (r == ROUTE_NONE) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such path: %.100s", rq->path);
        akv__srv_err(s, 404, "not_found_error", -1, msg, resp);
        return AKV_HTTP_ANSWER;
    }
    const bool post_route = r == ROUTE_CHAT || r == ROUTE_COMPLETION || r == ROUTE_SLOT_ACTION;
    if (post_route ? rq->method != AKV_HTTP_POST : !get) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s takes %s, not %.16s", rq->path, post_route ? "POST" : "GET",
                 rq->method_name);
        akv__srv_err(s, 405, "invalid_request_error", -1, msg, resp);
        resp->allow = post_route ? "POST" : "GET, HEAD";
        return AKV_HTTP_ANSWER;
    }
    return AKV_HTTP_READ_BODY;
}

static void handle_health(akv_server *s, akv_http_response *resp) {
    const int state = get_state(s);
    const char *word = state == AKV_SRV_READY     ? "ok"
                       : state == AKV_SRV_LOADING ? "loading"
                       : state == AKV_SRV_FAILED  ? "error"
                                                  : "stopping";
    char *b = akv__malloc(64);
    if (b) snprintf(b, 64, "{\"status\":\"%s\"}", word);
    akv__srv_text(state == AKV_SRV_READY ? 200 : 503, "application/json", b, resp);
}

static void handle_metrics(akv_server *s, akv_http_response *resp) {
    akv_http_stats hs;
    akv_http_get_stats(s->http, &hs);
    pthread_mutex_lock(&s->mu);
    s->m.http = hs;
    const size_t n = akv_metrics_render(&s->m, s->model_name, NULL, 0);
    char *b = akv__malloc(n + 1);
    if (b) akv_metrics_render(&s->m, s->model_name, b, n + 1);
    pthread_mutex_unlock(&s->mu);
    akv__srv_text(200, "text/plain; version=0.0.4; charset=utf-8", b, resp);
}

/* The whole request is in: the cheap answers here (this is the I/O thread), a generation on a
 * thread of its own. */
static int on_request(void *user, const akv_http_request *rq, akv_http_response *resp) {
    akv_server *s = user;
    const srv_route r = route_of(rq->path);
    if (r == ROUTE_HEALTH) {
        handle_health(s, resp);
        return AKV_HTTP_ANSWER;
    }
    if (r == ROUTE_METRICS) {
        handle_metrics(s, resp);
        return AKV_HTTP_ANSWER;
    }
    if (r == ROUTE_TRACE) {
        char *b = NULL;
        if (akv_trace_level_of(s->p.engine.trace) == AKV_TRACE_OFF)
            akv__srv_err(s, 404, "not_found_error", -1,
                         "no trace is kept: start the server with --trace-level counters or spans",
                         resp);
        else if (akv_trace_json(s->p.engine.trace, &b, NULL) != AKV_OK)
            akv__srv_err(s, 503, "server_error", -1, "the trace could not be rendered (out of memory)", resp);
        else
            akv__srv_text(200, "application/json", b, resp);
        return AKV_HTTP_ANSWER;
    }
    const int state = get_state(s);
    if (state != AKV_SRV_READY) {
        not_ready(s, state, resp);
        return AKV_HTTP_ANSWER;
    }
    if (r == ROUTE_MODELS) {
        akv__srv_text(200, "application/json",
                      akv_api_models_json(s->p.model_name, (long long)time(NULL), s->max_context),
                      resp);
        return AKV_HTTP_ANSWER;
    }
    return AKV_HTTP_DETACH;
}

static void on_fault(void *user, int status, const char *message, akv_http_response *resp) {
    akv_server *s = user;
    const int refusal = status == 413  ? AKV_MREFUSE_TOO_LARGE
                        : status < 500 ? AKV_MREFUSE_BAD_REQUEST
                                       : -1;
    err_response_named(s, status, status < 500 ? "invalid_request_error" : "server_error", refusal,
                       message, resp);
}

/* ---- a generation: its own thread ------------------------------------------------------- */

/* A slot for a large body's parse and encode (over LARGE_BODY bytes): at most max_tokenizing
 * at once, so many large prompts arriving together cost bounded memory and leave the engine
 * thread its cores; small ones (milliseconds of work) never wait behind them. */
enum { LARGE_BODY = 256u << 10 };

static void tok_slot_take(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    while (s->n_tokenizing >= s->max_tokenizing)
        pthread_cond_wait(&s->tok_cv, &s->mu);
    s->n_tokenizing++;
    pthread_mutex_unlock(&s->mu);
}

static void tok_slot_give(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    s->n_tokenizing--;
    pthread_cond_signal(&s->tok_cv);
    pthread_mutex_unlock(&s->mu);
}

static void context_error(const akv_server *s, akv_api_kind kind, const char *holds,
                          uint64_t max_prompt, akv_api_error *err) {
    akv_api_error_set(err, 400, "invalid_request_error", "context_length_exceeded",
                      kind == AKV_API_CHAT ? "messages" : "prompt",
                      "the prompt holds %s tokens; this server takes at most %llu (and leaves "
                      "room for one new token in its %llu-token context)",
                      holds, (unsigned long long)max_prompt, (unsigned long long)s->max_context);
}

/* Tools offered under tool_choice auto: the call the model may open is held to the tools'
 * schemas (a call's, or a list of calls'), by the opener its template shows it (the rendered
 * prompt's tool instructions): Hermes / Qwen "<tool_call>", Mistral "[TOOL_CALLS]" (its
 * prompt lists the tools in [AVAILABLE_TOOLS]), Llama 3's JSON (no opener: an answer that
 * begins with '{'). A template of another form, or parameters the
 * schema compiler refuses, leave the calls free (still parsed from the answer). */
static akv_status hold_calls(akv_api_request *a, const akv_tok_text *prompt) {
    static const struct {
        const char *shown, *opener; /* opener NULL: the answer itself, when it begins with '{' */
        bool list;
        const char *args_key;
    } forms[] = {{"<tool_call>", "<tool_call>", false, "arguments"},
                 {"[AVAILABLE_TOOLS]", "[TOOL_CALLS]", true, "arguments"},
                 {"\"parameters\": dictionary of argument name and its value", NULL, false, "parameters"}};
    if (!a->tools_json || a->tool_forced || a->schema || a->json_object || !prompt->bytes) return AKV_OK;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        if (!strstr(prompt->bytes, forms[i].shown)) continue;
        char why[256];
        const akv_status st = akv_api_call_schema(a->tools_json, NULL, forms[i].list, a->parallel_tool_calls,
                                                  forms[i].args_key,
                                                  &a->call_schema, why, sizeof why);
        if (st == AKV_OK) a->call_after = forms[i].opener;
        return st == AKV_ENOMEM ? st : AKV_OK;
    }
    return AKV_OK;
}

/* The prompt's tokens: the chat rendered and encoded (control tokens parsed in the template's
 * text, message contents as plain text unless content_specials), the text encoded (BOS where
 * the model asks), or the ids as given; at most max_prompt of them, refused as soon as the
 * encode passes it. */
static bool build_prompt(akv_server *s, akv_srv_req *r, uint64_t max_prompt, akv_api_error *err) {
    akv_api_request *a = &r->api;
    char holds[32];
    if (a->prompt_ids) {
        r->prompt = a->prompt_ids, r->n_prompt_ids = a->n_prompt_ids;
        if (r->n_prompt_ids <= max_prompt) return true;
        snprintf(holds, sizeof holds, "%u", r->n_prompt_ids);
        context_error(s, a->kind, holds, max_prompt, err);
        return false;
    }
    akv_tok_text text = {0};
    akv_tok_spans contents = {0};
    akv_tok_encode_opts o = {.flags = AKV_TOK_ADD_SPECIAL, .max_ids = max_prompt};
    const char *src = a->prompt;
    size_t n = a->prompt_len;
    if (a->kind == AKV_API_CHAT) {
        if (!s->chat) {
            char how[128];
            akv_log_render("start the server with {=chat_template_name}", s->p.settings_namer,
                           s->p.settings_user, how, sizeof how);
            akv_api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                              "the model has no chat template this server recognises; use "
                              "/v1/completions, or %s",
                              how);
            return false;
        }
        akv_tok_spans *plain = s->p.content_specials ? NULL : &contents;
        if (akv_chat_get_kind(s->chat) == AKV_CHAT_JINJA) { /* the model's own template */
            char why[300];
            akv_status rs = akv_chat_render_json(s->chat, a->messages_json, a->tools_json, true,
                                                 &text, plain, why, sizeof why);
            if (rs && rs != AKV_ENOMEM && a->messages_json_text) { /* arguments as text instead */
                char why2[300];
                akv_tok_text_free(&text);
                akv_tok_spans_free(&contents);
                rs = akv_chat_render_json(s->chat, a->messages_json_text, a->tools_json, true, &text,
                                          plain, why2, sizeof why2);
            }
            if (rs == AKV_ENOMEM) goto oom;
            if (rs) {
                akv_tok_text_free(&text);
                akv_tok_spans_free(&contents);
                akv_api_error_set(err, 400, "invalid_request_error", NULL, "messages",
                                  "the model's chat template refuses the conversation (%s)", why);
                return false;
            }
            if (hold_calls(a, &text) == AKV_ENOMEM) goto oom;
        } else if (a->tools_json || a->has_tool_use) {
            akv_api_error_set(err, 400, "invalid_request_error", NULL,
                              a->tools_json ? "tools" : "messages",
                              "the chat template in use is the %s family, which renders plain "
                              "messages: tools and tool calls need the model's own template",
                              akv_chat_kind_name(akv_chat_get_kind(s->chat)));
            return false;
        } else if (akv_chat_render(s->chat, a->msgs, a->n_msgs, true, &text, plain)) {
            goto oom;
        }
        src = text.bytes ? text.bytes : "", n = text.n_bytes;
        o.flags = AKV_TOK_PARSE_SPECIAL;
        o.plain = contents.spans, o.n_plain = contents.n;
    }
    akv_status st = akv_tok_encode_with(s->tok, src, n, &o, &r->ids);
    akv_tok_text_free(&text);
    akv_tok_spans_free(&contents);
    r->prompt = r->ids.ids, r->n_prompt_ids = (uint32_t)r->ids.n_ids;
    if (st == AKV_EFULL) {
        snprintf(holds, sizeof holds, "more than %llu", (unsigned long long)max_prompt);
        context_error(s, a->kind, holds, max_prompt, err);
        return false;
    }
    if (st == AKV_ENOMEM) goto oom;
    if (st) {
        akv_api_error_set(err, 400, "invalid_request_error", NULL,
                          a->kind == AKV_API_CHAT ? "messages" : "prompt",
                          "the prompt cannot be encoded: %s", akv_status_str(st));
        return false;
    }
    return true;
oom:
    akv_tok_text_free(&text);
    akv_tok_spans_free(&contents);
    akv_api_error_set(err, 503, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* A seed for a request that gives none: the server's start time and the request's number,
 * mixed (splitmix64), so no two requests of a run, or of two runs, share one by accident. */
static uint64_t fresh_seed(const akv_server *s, uint64_t num) {
    uint64_t z = s->seed_base + num * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The HTTP side cancels (the client went away, the request timed out), submitted or not yet
 * answered: the queue is first in first out, so a CANCEL always reaches the engine after its
 * SUBMIT, and cancels whatever the submit made of it. */
static void req_cancel(akv_server *s, akv_srv_req *r, akv_metrics_end why) {
    if (r->cancel_posted) return;
    r->cancel_posted = true;
    if (akv_srv_req_mark_cancelled(r, why)) akv_srv_queue_post(&s->q, AKV_SRV_CANCEL, r);
}

/* Cancels every choice of a request (req_cancel). */
static void choices_cancel(akv_server *s, akv_srv_req *const *ch, uint32_t n, akv_metrics_end why) {
    for (uint32_t i = 0; i < n; i++) req_cancel(s, ch[i], why);
}

/* Waits for the channels of a request's admitted choices (one eventfd: the lead's). Past the
 * deadline they are cancelled and their ends have 30 s more to arrive. 1: a channel spoke (or
 * the cancels were just posted); -1: the client went away (cancelled), or no end came even
 * then (the caller stops waiting). */
static int choices_wait(akv_server *s, akv_http_conn *c, akv_srv_req *const *ch, uint32_t n,
                        double deadline) {
    const bool timed_out = ch[0]->cancel_posted;
    const int w = akv_http_conn_wait(c, ch[0]->efd, timed_out ? deadline + 30 : deadline);
    if (w < 0) {
        choices_cancel(s, ch, n, AKV_END_ABORT);
        return -1;
    }
    if (w == 0 && !timed_out) {
        choices_cancel(s, ch, n, AKV_END_TIMEOUT); /* their ends arrive through the channels */
        return 1;
    }
    return w == 0 ? -1 : w; /* no end even 30 s after the cancels: stop waiting */
}

static const char *finish_word(akv_finish f) {
    return f == AKV_FINISH_LENGTH ? "length" : "stop";
}

/* The error of a request that ended without finishing (cancelled, failed, text lost). */
static void ended_error(const akv_server *s, const akv_srv_req *r, akv_api_error *e) {
    if (r->finish == AKV_FINISH_ERROR)
        akv_api_error_set(e, 500, "server_error", NULL, NULL,
                          "the device failed on this request and it could not be redone");
    else if (r->text_cut)
        akv_api_error_set(e, 503, "server_error", NULL, NULL,
                          "out of memory: part of the answer was lost");
    else if (r->end == AKV_END_TIMEOUT)
        akv_api_error_set(e, 504, "timeout", NULL, NULL,
                          "the request ran past the server's "
                          "timeout (%.0f s) and was cancelled",
                          s->p.timeout_s);
    else
        akv_api_error_set(e, 503, "server_error", NULL, NULL,
                          "the server is shutting down; the request was cancelled");
}

static bool finished_well(const akv_srv_req *r) {
    return (r->finish == AKV_FINISH_STOP || r->finish == AKV_FINISH_LENGTH) && !r->text_cut;
}

/* One server-sent event `data: JSON\n\n` (json from akv__malloc, taken). */
static int send_event(akv_http_conn *c, char *json) {
    if (!json) return akv_http_conn_stream_write(c, NULL, 0);
    const size_t n = strlen(json);
    char *ev = akv__malloc(n + 9);
    int rc = -1;
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, json, n);
        memcpy(ev + 6 + n, "\n\n", 2);
        rc = akv_http_conn_stream_write(c, ev, n + 8);
    }
    akv__free(ev);
    akv__free(json);
    return rc;
}

/* Token records t[n] as an answer shows them (each piece borrowed from the tokenizer), into
 * x[n] (zeroed by the caller). */
static void lp_items(const akv_server *s, const akv_srv_tok *t, size_t n, akv_api_logprob *x) {
    for (size_t i = 0; i < n; i++) {
        x[i].tok.piece = akv_tok_token_piece(s->tok, t[i].id, &x[i].tok.n);
        x[i].tok.logprob = t[i].logprob;
        x[i].n_top = t[i].n_top;
        for (uint32_t j = 0; j < t[i].n_top; j++) {
            x[i].top[j].piece = akv_tok_token_piece(s->tok, t[i].top_id[j], &x[i].top[j].n);
            x[i].top[j].logprob = t[i].top_lp[j];
        }
    }
}

/* A finished choice's tool calls (the request offered tools) into *calls and *c: the calls,
 * its content besides them (NULL: none) and the finish "tool_calls", when it wrote any. */
static akv_status choice_calls_in(const akv_srv_req *r, const char *text, size_t n,
                                  akv_srv_tool_calls *calls, akv_api_choice *c) {
    akv_status st = akv_srv_tool_calls_find(text, n, r->api.tools_json, (unsigned long long)r->num, calls);
    if (st || !calls->n) return st;
    while (!r->api.parallel_tool_calls && calls->n > 1) { /* one call at most: the first */
        akv_api_tool_call *last = &calls->v[--calls->n];
        akv__free((char *)last->id), akv__free((char *)last->name), akv__free((char *)last->arguments);
    }
    c->calls = calls->v, c->n_calls = calls->n;
    c->text = calls->content, c->n_text = calls->content ? strlen(calls->content) : 0;
    c->finish = "tool_calls";
    return AKV_OK;
}

static akv_status choice_calls(const akv_srv_req *r, akv_srv_tool_calls *calls, akv_api_choice *c) {
    return choice_calls_in(r, r->text ? r->text : "", r->n_text, calls, c);
}

/* A streamed choice's tool calls sent so far, as deltas: a call's first delta carries its id,
 * type and name, the next ones the new bytes of its arguments (a client joins them). Calls
 * go out as they come only where the engine holds them to their schema (under auto after the
 * opener, or a forced call), so what goes out is a call's whole; other calls go out whole at
 * the end. */
enum { STREAM_CALLS = 16 };
typedef struct call_deltas {
    int8_t held;                /* the held text begins with a held call's opener: 1 yes, 0 no,
                                   -1 not looked yet (it only grows once a call is held) */
    akv_srv_calls_scan scan;    /* how far the calls are read */
    akv_srv_call_part part[STREAM_CALLS];
    size_t n_open;              /* calls whose first delta went out */
    size_t sent[STREAM_CALLS];  /* bytes of each one's arguments sent */
} call_deltas;

/* The deltas of what the held text adds to choice i's calls: 1 when some went out, 0 when
 * none, -1 when the client went away. */
static int send_call_deltas(akv_http_conn *c, const akv_srv_req *r, const char *model, uint32_t i,
                            const char *held, size_t n_held, call_deltas *d) {
    const size_t from = d->scan.first; /* the calls before it went out whole already */
    size_t k = akv_srv_tool_calls_partial(held, n_held, &d->scan, d->part, STREAM_CALLS);
    if (!r->api.parallel_tool_calls && k > 1) k = 1;
    int spoke = 0;
    for (size_t j = from; j < k; j++) {
        const akv_srv_call_part *p = &d->part[j];
        if (j == d->n_open && !p->named) break; /* in order: the next call when its name is whole */
        const bool first = j == d->n_open;
        const size_t have = p->has_args ? p->args_n : 0;
        if (!first && have <= d->sent[j]) continue;
        char id[16];
        akv_srv_tool_call_id((unsigned long long)r->num, j, id);
        if (send_event(c, akv_api_tool_delta_json(r->id, r->created, model, i, (uint32_t)j,
                                                  first ? id : NULL, p->name, p->name_n,
                                                  held + p->args_at + d->sent[j], have - d->sent[j])))
            return -1;
        d->sent[j] = have, spoke = 1;
        if (first) d->n_open++;
    }
    return spoke;
}

/* Whether a held text is a call the engine holds (server/tools.h's stream holds from the
 * opener on): after white space, the request's held opener (a forced call: the whole
 * answer; under auto without one: the '{' that begins it). */
static bool held_call(const akv_api_request *a, const char *held, size_t n) {
    if (a->tool_forced) return true;
    const char *opener = a->call_after ? a->call_after : "{";
    size_t lead = 0;
    while (lead < n && (held[lead] == ' ' || held[lead] == '\n' || held[lead] == '\t' || held[lead] == '\r'))
        lead++;
    return n - lead >= strlen(opener) && !memcmp(held + lead, opener, strlen(opener));
}

/* The usage of a request's choices: the prompt once, every choice's generated tokens. */
static akv_api_usage choices_usage(akv_srv_req *const *ch, uint32_t n) {
    akv_api_usage u = {ch[0]->n_prompt, 0, ch[0]->n_cached};
    for (uint32_t i = 0; i < n; i++) u.completion_tokens += ch[i]->n_gen;
    return u;
}

/* The stream of a request's choices: each choice's role chunk, a chunk per piece of text of
 * any choice as it comes (with its tokens' logprobs when asked; tokens whose text never came,
 * held by a stop string, in a chunk of no text before the finish), each choice's finish (and
 * the usage), [DONE]. false: the client went away (the request is cancelled). */
static bool answer_stream(akv_server *s, akv_http_conn *c, akv_srv_req *const *ch, uint32_t n,
                          double deadline) {
    const char *model = s->p.model_name;
    const akv_srv_req *r = ch[0];
    const akv_api_kind kind = r->api.kind;
    /* tools offered: each choice's text goes out but for what may be a call (server/tools.h) */
    akv_srv_tool_stream ts[AKV_API_MAX_N];
    memset(ts, 0, sizeof ts);
    call_deltas cd[AKV_API_MAX_N];
    memset(cd, 0, sizeof cd);
    for (uint32_t i = 0; i < n; i++) cd[i].held = -1;
    /* calls held to their schema (whole by the end, but for max_tokens or a stop string): a
     * forced call, the whole answer; under auto, what follows the held opener only */
    const bool calls_held = r->api.call_schema || r->api.tool_forced;
    bool ok = false;
    if (akv_http_conn_stream_begin(c, 200, "text/event-stream", ":\n")) goto gone;
    for (uint32_t i = 0; i < n && kind == AKV_API_CHAT; i++)
        if (send_event(c, akv_api_chunk_json(kind, r->id, r->created, model, i, true, "", 0, NULL,
                                             NULL, NULL)))
            goto gone;
    size_t lp_off[AKV_API_MAX_N] = {0}; /* a completion's text_offset: each choice's bytes so far */
    for (;;) {
        bool spoke = false, all_done = true;
        for (uint32_t i = 0; i < n; i++) {
            char *piece;
            size_t k, n_toks = 0;
            akv_srv_tok *toks = NULL;
            akv_srv_phase phase;
            akv_srv_req_take_text(ch[i], &piece, &k, r->api.logprobs ? &toks : NULL, &n_toks, &phase);
            all_done &= phase == AKV_SRV_DONE;
            if (r->api.tools_json) { /* tools offered: the text that cannot be a call */
                const char *out = NULL;
                size_t n_out = 0;
                const akv_status fst = piece ? akv_srv_tool_stream_feed(&ts[i], piece, k, &out, &n_out) : AKV_OK;
                akv__free(piece), akv__free(toks);
                if (fst) goto gone; /* no memory: end the stream */
                if (n_out) {
                    spoke = true;
                    if (send_event(c, akv_api_chunk_json(kind, r->id, r->created, model, i, false, out,
                                                         n_out, NULL, NULL, NULL)))
                        goto gone;
                }
                if (calls_held && ts[i].call && k && cd[i].held) { /* a held call's pieces as they come */
                    size_t n_held;
                    const char *held = akv_srv_tool_stream_held(&ts[i], &n_held);
                    if (cd[i].held < 0) cd[i].held = held_call(&r->api, held, n_held);
                    const int sent = cd[i].held ? send_call_deltas(c, ch[i], model, i, held, n_held, &cd[i]) : 0;
                    if (sent < 0) goto gone;
                    spoke |= sent > 0;
                }
                continue;
            }
            if (!piece && !n_toks) continue;
            spoke = true;
            akv_api_logprob *items = n_toks ? akv__calloc(n_toks, sizeof *items) : NULL;
            const bool lp_ok = !n_toks || items;
            if (items) lp_items(s, toks, n_toks, items);
            const akv_api_logprobs lp = {items, n_toks, lp_off[i]};
            for (size_t j = 0; j < n_toks && items; j++) lp_off[i] += items[j].tok.n;
            char *json = akv_api_chunk_json(kind, r->id, r->created, model, i, false,
                                            piece ? piece : "", k, NULL, NULL,
                                            r->api.logprobs && lp_ok ? &lp : NULL);
            akv__free(piece), akv__free(toks), akv__free(items);
            if (send_event(c, json)) goto gone;
        }
        if (spoke) continue;
        if (all_done) break;
        if (choices_wait(s, c, ch, n, deadline) < 0) {
            for (uint32_t k = 0; k < n; k++) akv_srv_tool_stream_free(&ts[k]);
            return false;
        }
    }
    const akv_srv_req *bad = NULL;
    for (uint32_t i = 0; i < n && !bad; i++)
        if (!finished_well(ch[i])) bad = ch[i];
    if (!bad) {
        for (uint32_t i = 0; i < n; i++) {
            const char *finish = finish_word(ch[i]->finish);
            if (r->api.tools_json) { /* what was held: its calls, the rest of the content */
                akv_srv_tool_calls calls;
                size_t n_held;
                const char *held = akv_srv_tool_stream_held(&ts[i], &n_held);
                akv_api_choice one = {held, n_held, finish, NULL, NULL, 0};
                if (choice_calls_in(ch[i], held, n_held, &calls, &one)) goto gone; /* no memory */
                if (cd[i].n_open > one.n_calls) one.text = NULL, one.n_text = 0;
                int rc = one.text && one.n_text
                             ? send_event(c, akv_api_chunk_json(kind, r->id, r->created, model, i, false,
                                                                one.text, one.n_text, NULL, NULL, NULL))
                             : 0;
                /* each call: what of it has not gone out (a call streamed in pieces: the rest of
                 * its arguments; another: whole). Calls that went out in pieces and did not come
                 * whole (cut by max_tokens or a stop string) are not sent again as text (above). */
                for (size_t j = 0; !rc && j < one.n_calls; j++) {
                    const bool open = j < cd[i].n_open;
                    const size_t an = strlen(one.calls[j].arguments), from = open && cd[i].sent[j] <= an ? cd[i].sent[j] : 0;
                    if (open && from == an) continue;
                    rc = send_event(c, akv_api_tool_delta_json(r->id, r->created, model, i, (uint32_t)j,
                                                               open ? NULL : one.calls[j].id, one.calls[j].name,
                                                               strlen(one.calls[j].name),
                                                               one.calls[j].arguments + from, an - from));
                }
                finish = one.finish;
                akv_srv_tool_calls_free(&calls);
                if (rc) goto gone;
            }
            if (send_event(c, akv_api_chunk_json(kind, r->id, r->created, model, i, false, NULL, 0,
                                                 finish, NULL, NULL)))
                goto gone;
        }
        akv_api_usage u = choices_usage(ch, n);
        if (r->api.include_usage && send_event(c, akv_api_chunk_json(kind, r->id, r->created, model,
                                                                     0, false, NULL, 0, NULL, &u, NULL)))
            goto gone;
    } else {
        akv_api_error e;
        ended_error(s, bad, &e);
        if (send_event(c, akv_api_error_json(&e))) goto gone;
    }
    static const char done[] = "data: [DONE]\n\n";
    if (akv_http_conn_stream_write(c, done, sizeof done - 1) || akv_http_conn_stream_end(c))
        goto gone;
    ok = true;
gone:
    for (uint32_t i = 0; i < n; i++) akv_srv_tool_stream_free(&ts[i]);
    if (!ok) choices_cancel(s, ch, n, AKV_END_ABORT);
    return ok;
}

/* One finished choice's answer: its text (echo: the prompt's first) into *text, and (logprobs
 * asked) its records into *items (akv__calloc'ed) and *lp. AKV_ENOMEM and the like. */
static akv_status choice_answer(akv_server *s, const akv_srv_req *r, akv_tok_text *text,
                                akv_api_logprob **items, akv_api_logprobs *lp) {
    const bool echo = r->api.echo;
    const size_t n_pre = echo && r->api.logprobs ? 1 + r->n_ptoks : 0;
    akv_status st = AKV_OK;
    *items = NULL;
    if (echo)
        st = r->api.prompt ? akv_tok_text_append(text, r->api.prompt, r->api.prompt_len)
                           : akv_tok_decode(s->tok, r->prompt, r->n_prompt_ids, AKV_TOK_DECODE_LOSSY, text);
    if (!st) st = akv_tok_text_append(text, r->text ? r->text : "", r->n_text);
    if (!st && r->api.logprobs && !(*items = akv__calloc(n_pre + r->n_toks + 1, sizeof **items)))
        st = AKV_ENOMEM;
    if (st) return st;
    akv_api_logprob *x = *items;
    if (n_pre) {
        x[0].none = true;
        x[0].tok.piece = akv_tok_token_piece(s->tok, r->prompt[0], &x[0].tok.n);
        lp_items(s, r->ptoks, r->n_ptoks, x + 1);
        /* the echoed text is the prompt as given: a control token's piece (BOS) is not in it */
        for (size_t i = 0; i < n_pre; i++)
            x[i].no_text = akv_tok_token_type(s->tok, r->prompt[i]) == AKV_TOK_TYPE_CONTROL;
    }
    if (x) lp_items(s, r->toks, r->n_toks, x + n_pre);
    *lp = (akv_api_logprobs){x, n_pre + r->n_toks, 0};
    return AKV_OK;
}

akv_srv_req *akv__srv_req_new(akv_server *s, akv_http_conn *c) {
    akv_srv_req *r = NULL;
    akv_status st = akv_srv_req_create(&r);
    if (!st) {
        r->owner = s;
        return r;
    }
    akv_http_response resp = {0};
    akv__srv_err(s, 503, "server_error", -1,
                 st == AKV_ENOMEM ? "out of memory" : "out of file descriptors", &resp);
    akv_http_conn_send(c, &resp);
    return NULL;
}

/* Parses, encodes, submits and answers one generation request on its own thread. */
static void handle_generate(akv_server *s, akv_http_conn *c, const akv_http_request *rq) {
    const akv_api_kind kind = route_of(rq->path) == ROUTE_CHAT ? AKV_API_CHAT : AKV_API_COMPLETION;
    akv_http_response resp = {0};
    akv_api_error err;
    akv_srv_req *r = akv__srv_req_new(s, c);
    if (!r) return;
    akv_srv_req *ch[AKV_API_MAX_N] = {r}; /* its choices, the lead first */
    uint32_t n_ch = 1;
    r->t_arrival = akv_clock_s();
    r->created = (long long)time(NULL);
    r->num = (uint64_t)atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s%llu", kind == AKV_API_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)r->num);
    const double deadline = r->t_arrival + s->p.timeout_s;
    const akv_api_limits lim = {.max_tokens_default = s->p.max_tokens_default,
                                .max_tokens_limit = s->max_context,
                                .n_vocab = s->n_vocab,
                                .kv_tier = s->kv_tier,
                                .sample = s->p.sample};
    const uint64_t ctx_room = s->max_context - 1; /* one new token at least */
    const uint64_t max_prompt = s->p.max_prompt_tokens && s->p.max_prompt_tokens < ctx_room
                                    ? s->p.max_prompt_tokens
                                    : ctx_room;
    const bool large = rq->n_body > LARGE_BODY;
    if (large) tok_slot_take(s);
    akv_status st = akv_api_parse(kind, rq->body ? rq->body : "", rq->n_body, &lim, &r->api, &err);
    const bool built = !st && build_prompt(s, r, max_prompt, &err);
    if (large) tok_slot_give(s);
    if (st == AKV_ENOMEM) {
        akv__srv_err(s, 503, "server_error", -1, "out of memory", &resp);
        goto answer;
    }
    if (st) {
        error_response(s, &err, AKV_MREFUSE_BAD_REQUEST, &resp);
        goto answer;
    }
    if (!built) {
        error_response(s, &err, err.status == 400 ? AKV_MREFUSE_BAD_REQUEST : -1, &resp);
        goto answer;
    }
    const uint64_t n_prompt = r->n_prompt_ids;
    if (n_prompt == 0) {
        akv_api_error_set(&err, 400, "invalid_request_error", NULL,
                          kind == AKV_API_CHAT ? "messages" : "prompt",
                          "the prompt encodes to no tokens");
        error_response(s, &err, AKV_MREFUSE_BAD_REQUEST, &resp);
        goto answer;
    }
    /* a default max_tokens shrinks to the room the prompt leaves; an asked one is admission's */
    if (!r->api.seed_asked && !s->p.fixed_seed) r->api.sample.seed = fresh_seed(s, r->num);
    if (!r->api.max_tokens_asked && n_prompt + r->api.max_tokens > s->max_context)
        r->api.max_tokens = (uint32_t)(s->max_context - n_prompt);
    /* the choices: the lead and n - 1 more, each a request of its own in the engine (choice i
     * samples with the lead's seed + i when a seed was asked or fixed, a fresh one else) */
    n_ch = r->api.n ? r->api.n : 1;
    for (uint32_t i = 1; i < n_ch; i++) {
        if ((st = akv_srv_req_create_choice(r, &ch[i]))) {
            n_ch = i;
            akv__srv_err(s, 503, "server_error", -1, "out of memory", &resp);
            goto answer;
        }
        ch[i]->num = (uint64_t)atomic_fetch_add(&s->next_id, 1);
        ch[i]->api.sample.seed = r->api.seed_asked || s->p.fixed_seed ? r->api.sample.seed + i
                                                                       : fresh_seed(s, ch[i]->num);
    }
    /* submit: counted in flight first, so a stop's grace waits for them */
    pthread_mutex_lock(&s->mu);
    const int state = s->state;
    if (state == AKV_SRV_READY) s->n_inflight += n_ch;
    pthread_mutex_unlock(&s->mu);
    if (state != AKV_SRV_READY) {
        not_ready(s, state, &resp);
        goto answer;
    }
    for (uint32_t i = 0; i < n_ch; i++) {
        if (!(st = akv_srv_queue_post(&s->q, AKV_SRV_SUBMIT, ch[i]))) continue;
        pthread_mutex_lock(&s->mu);
        s->n_inflight -= n_ch - i; /* the rest never reach the engine */
        pthread_cond_broadcast(&s->state_cv);
        pthread_mutex_unlock(&s->mu);
        choices_cancel(s, ch, i, AKV_END_ABORT);
        akv__srv_err(s, 503, "server_error", -1,
                     st == AKV_ESTATE ? "the server is shutting down" : "out of memory", &resp);
        goto answer;
    }
    for (bool pending = true; pending;) { /* admission, of every choice */
        pending = false;
        for (uint32_t i = 0; i < n_ch; i++) pending |= akv_srv_req_phase(ch[i]) == AKV_SRV_PENDING;
        if (!pending) break;
        const int w = akv_http_conn_wait(c, r->efd, deadline);
        if (w < 0) { /* gone before admission: the cancels follow the submits */
            choices_cancel(s, ch, n_ch, AKV_END_ABORT);
            goto out;
        }
        if (w == 0) {
            choices_cancel(s, ch, n_ch, AKV_END_TIMEOUT);
            akv__srv_err(s, 504, "timeout", -1, "no answer from the engine in time", &resp);
            goto answer;
        }
    }
    for (uint32_t i = 0; i < n_ch; i++)
        if (akv_srv_req_phase(ch[i]) == AKV_SRV_REFUSED) { /* the others are not needed */
            choices_cancel(s, ch, n_ch, AKV_END_ABORT);
            error_response(s, &ch[i]->refusal, -1, &resp);
            goto answer;
        }
    if (r->api.stream) {
        answer_stream(s, c, ch, n_ch, deadline);
        goto out;
    }
    for (bool running = true; running;) { /* the whole answer, every choice's */
        running = false;
        for (uint32_t i = 0; i < n_ch; i++) running |= akv_srv_req_phase(ch[i]) != AKV_SRV_DONE;
        if (running && choices_wait(s, c, ch, n_ch, deadline) < 0) goto out;
    }
    for (uint32_t i = 0; i < n_ch; i++)
        if (!finished_well(ch[i])) {
            ended_error(s, ch[i], &err);
            error_response(s, &err, -1, &resp);
            goto answer;
        }
    {
        const akv_api_usage u = choices_usage(ch, n_ch);
        akv_tok_text texts[AKV_API_MAX_N];
        akv_api_logprob *items[AKV_API_MAX_N];
        akv_api_logprobs lps[AKV_API_MAX_N];
        akv_api_choice choices[AKV_API_MAX_N];
        akv_srv_tool_calls calls[AKV_API_MAX_N];
        memset(texts, 0, sizeof texts), memset(items, 0, sizeof items), memset(calls, 0, sizeof calls);
        akv_status est = AKV_OK;
        for (uint32_t i = 0; i < n_ch && !est; i++) {
            est = choice_answer(s, ch[i], &texts[i], &items[i], &lps[i]);
            choices[i] = (akv_api_choice){texts[i].bytes ? texts[i].bytes : "", texts[i].n_bytes,
                                          finish_word(ch[i]->finish), r->api.logprobs ? &lps[i] : NULL,
                                          NULL, 0};
            if (!est && r->api.tools_json) /* the tools offered: the calls it wrote, if any */
                est = choice_calls(ch[i], &calls[i], &choices[i]);
        }
        if (est) {
            akv_api_error_set(&err, 500, "server_error", NULL, NULL,
                              "the answer could not be made: %s", akv_status_str(est));
            error_response(s, &err, -1, &resp);
        } else {
            akv__srv_text(200, "application/json",
                          akv_api_answer_json(kind, r->id, r->created, s->p.model_name, choices, n_ch, &u),
                          &resp);
        }
        for (uint32_t i = 0; i < n_ch; i++)
            akv__free(items[i]), akv_tok_text_free(&texts[i]), akv_srv_tool_calls_free(&calls[i]);
    }
answer:
    if (akv_http_conn_send(c, &resp)) choices_cancel(s, ch, n_ch, AKV_END_ABORT);
out:
    for (uint32_t i = 0; i < n_ch; i++) akv_srv_req_unref(ch[i]);
}

static void on_run(void *user, akv_http_conn *c, const akv_http_request *rq) {
    const srv_route r = route_of(rq->path);
    if (r == ROUTE_SLOTS || r == ROUTE_SLOT_ACTION) akv__server_slots(user, c, rq);
    else handle_generate(user, c, rq);
}

/* ---- start / stop ------------------------------------------------------------------------- */

akv_server_params akv_server_default_params(void) {
    akv_server_params p;
    memset(&p, 0, sizeof p);
    p.engine = akv_engine_default_params();
    p.port = 8080;
    p.sample = akv_sample_default_params();
    return p;
}

uint16_t akv_server_port(const akv_server *s) {
    return akv_http_port(s->http);
}

static char *sanitised_name(const char *name) {
    char *n = akv__strdup(name);
    for (char *p = n; p && *p; p++)
        if (*p == '"' || *p == '\\' || *p == '\n' || (unsigned char)*p < 0x20) *p = '_';
    return n;
}

/* The params with every 0 replaced by its default. */
static void fill_defaults(akv_server_params *p) {
    if (!p->host) p->host = "127.0.0.1";
    if (!p->model_name) p->model_name = "default";
    if (!p->max_tokens_default) p->max_tokens_default = 512;
    if (!p->max_body_bytes) p->max_body_bytes = 16u << 20;
    if (!(p->timeout_s > 0)) p->timeout_s = 600;
    if (!p->max_connections) p->max_connections = 256;
    if (!p->max_connections_per_client)
        p->max_connections_per_client = p->max_connections / 2 ? p->max_connections / 2 : 1;
    if (!(p->idle_timeout_s > 0)) p->idle_timeout_s = 60;
    if (!(p->read_timeout_s > 0)) p->read_timeout_s = 30;
}

akv_status akv_server_start(const akv_server_params *p, akv_server **out) {
    if (!p || !out || !p->engine.dev || !p->engine.model_path) {
        AKV_LOG_E("server: params need engine.dev and engine.model_path");
        if (p && p->engine.dev) akv_dev_destroy(p->engine.dev);
        return AKV_EINVAL;
    }
    akv_server *s = akv__calloc(1, sizeof *s);
    if (!s) {
        akv_dev_destroy(p->engine.dev);
        return AKV_ENOMEM;
    }
    s->p = *p;
    fill_defaults(&s->p);
    s->model_name = sanitised_name(s->p.model_name);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->state_cv, NULL);
    pthread_cond_init(&s->tok_cv, NULL);
    akv_srv_queue_init(&s->q);
    akv_metrics_init(&s->m);
    atomic_init(&s->next_id, 1);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    s->max_tokenizing = cpus > 2 ? (uint32_t)(cpus / 2) : 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s->seed_base =
        (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec + ((uint64_t)getpid() << 40);
    const akv_http_params hp = {.host = s->p.host,
                                .port = s->p.port,
                                .max_connections = s->p.max_connections,
                                .max_per_client = s->p.max_connections_per_client,
                                .read_timeout_s = s->p.read_timeout_s,
                                .idle_timeout_s = s->p.idle_timeout_s,
                                .max_head_bytes = 16384,
                                .max_body_bytes = s->p.max_body_bytes,
                                .h = {.user = s,
                                      .on_head = on_head,
                                      .on_request = on_request,
                                      .on_run = on_run,
                                      .on_fault = on_fault}};
    akv_status st = s->model_name ? akv_http_start(&hp, &s->http) : AKV_ENOMEM;
    if (st) {
        akv_dev_destroy(s->p.engine.dev);
        s->p.engine.dev = NULL;
        akv_server_destroy(s);
        return st;
    }
    if (pthread_create(&s->engine_thread, NULL, akv__server_engine_main, s)) {
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

akv_status akv_server_wait_ready(akv_server *s, double timeout_s) {
    const struct timespec until = akv_clock_deadline(timeout_s);
    pthread_mutex_lock(&s->mu);
    while (s->state == AKV_SRV_LOADING &&
           pthread_cond_timedwait(&s->state_cv, &s->mu, &until) != ETIMEDOUT) {
    }
    const int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st == AKV_SRV_READY ? AKV_OK : st == AKV_SRV_LOADING ? AKV_EBUSY : AKV_EFAILED;
}

void akv_server_shutdown(akv_server *s) {
    if (!s || !s->http) return;
    akv__server_set_state(s, AKV_SRV_STOPPING);
    akv_http_close_listener(s->http);
}

uint32_t akv_server_n_inflight(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    const uint32_t n = s->n_inflight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void akv_server_stop(akv_server *s, double grace_s) {
    if (!s || s->stopped) return;
    s->stopped = true;
    akv_server_shutdown(s);
    const struct timespec grace_until = akv_clock_deadline(grace_s);
    pthread_mutex_lock(&s->mu);
    while (s->n_inflight &&
           pthread_cond_timedwait(&s->state_cv, &s->mu, &grace_until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&s->mu);
    akv_srv_queue_close(&s->q); /* the engine thread cancels the rest; their streams end with
                                   an error event */
    if (s->thread_started) pthread_join(s->engine_thread, NULL);
    s->thread_started = false;
    /* every request has ended: the handler threads get 2 s to send their last bytes, then
     * their sockets are cut; no HTTP thread borrows the tokenizer or the template after */
    akv_http_stop(s->http, 2);
    akv_chat_destroy(s->chat);
    s->chat = NULL;
    akv_engine_destroy(s->engine); /* the device with it */
    s->engine = NULL;
}

void akv_server_destroy(akv_server *s) {
    if (!s) return;
    akv_server_stop(s, 0);
    akv_http_destroy(s->http);
    akv_srv_queue_deinit(&s->q);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->state_cv);
    pthread_cond_destroy(&s->tok_cv);
    akv__free(s->model_name);
    akv__free(s);
}
