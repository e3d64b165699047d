/* engine_loop.c — the server's engine thread: it owns the engine (device, model, tokenizer,
 * pools, route, pass, scheduler), takes the commands HTTP threads post, runs one engine step
 * while anything is in flight, and reports each request's tokens through its channel. Nothing
 * else touches engine state. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/model.h"
#include "akv/route.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "server/schema.h"
#include "server/server_impl.h"

void akv__server_set_state(akv_server *s, int state) {
    pthread_mutex_lock(&s->mu);
    if (s->state != AKV_SRV_STOPPING || state == AKV_SRV_FAILED) s->state = state;
    s->m.ready = s->state == AKV_SRV_READY;
    pthread_cond_broadcast(&s->state_cv);
    pthread_mutex_unlock(&s->mu);
}

static akv_metrics_end end_of(akv_finish f, akv_metrics_end cancelled_why) {
    switch (f) {
    case AKV_FINISH_STOP:
        return AKV_END_STOP;
    case AKV_FINISH_LENGTH:
        return AKV_END_LENGTH;
    case AKV_FINISH_CANCELLED:
        return cancelled_why;
    default:
        return AKV_END_ERROR;
    }
}

/* A request left the engine's books (ended, or refused at submit): the grace period and
 * akv_server_stop wait on this count. */
static void inflight_done(akv_server *s) {
    pthread_mutex_lock(&s->mu);
    s->n_inflight--;
    pthread_cond_broadcast(&s->state_cv);
    pthread_mutex_unlock(&s->mu);
}

/* The record of token `id` drawn from logits (its log-probability and the request's
 * top_logprobs alternatives, at most the vocabulary). */
static akv_srv_tok tok_record(const akv_server *s, const akv_srv_req *r, const float *logits, int32_t id) {
    akv_srv_tok rec = {.id = id};
    rec.n_top = r->api.top_logprobs < (uint32_t)s->n_vocab ? r->api.top_logprobs : (uint32_t)s->n_vocab;
    akv_api_token_logprobs(logits, (uint32_t)s->n_vocab, id, rec.n_top, &rec.logprob, rec.top_id, rec.top_lp);
    return rec;
}

/* A token event (engine thread, inside a step, a submit or a cancel). */
static void on_token(void *user, akv_request *rq, const akv_token_event *ev) {
    akv_srv_req *r = user;
    akv_server *s = r->owner;
    const double now = akv_clock_s();
    /* logprobs asked: a record of every generated token but the end of generation */
    akv_srv_tok rec, *tok = NULL;
    if (r->api.logprobs && ev->token >= 0 && !ev->eog && ev->logits)
        rec = tok_record(s, r, ev->logits, ev->token), tok = &rec;
    akv_srv_req_append(r, ev->text, ev->text ? ev->n_text : 0, tok);
    pthread_mutex_lock(&r->mu);
    const bool first = ev->token >= 0 && r->n_gen == 0;
    if (ev->token >= 0) r->n_gen++;
    const akv_metrics_end cancelled_why = r->end;
    pthread_mutex_unlock(&r->mu);
    akv_request_info ri;
    if (ev->finish != AKV_FINISH_NONE) akv_request_get_info(rq, &ri);
    pthread_mutex_lock(&s->mu);
    if (ev->token >= 0) {
        if (first)
            akv_histo_observe(&s->m.ttft, now - r->t_arrival);
        else
            akv_histo_observe(&s->m.itl, now - r->t_last);
    }
    if (ev->finish != AKV_FINISH_NONE) {
        s->m.ended[end_of(ev->finish, cancelled_why)]++;
        akv_histo_observe(&s->m.e2e, now - r->t_arrival);
        if (ri.t_admit > 0) akv_histo_observe(&s->m.queue, ri.t_admit - r->t_arrival);
        akv_histo_observe(&s->m.prompt_len, ri.n_prompt);
        akv_histo_observe(&s->m.gen_len, ri.n_gen);
        s->m.prompt_tokens += ri.n_prompt - ri.n_cached;
        s->m.cached_tokens += ri.n_cached;
        s->m.gen_tokens += ri.n_gen;
    }
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    if (ev->finish != AKV_FINISH_NONE) {
        akv_srv_req_finish(r, ev->finish, ri.n_prompt, ri.n_cached, ri.n_gen);
        inflight_done(s);
    }
}

/* An admission refusal as an HTTP answer: its status, type and the setting to change. */
static void refusal_to_error(const akv_server *s, const akv_refusal *rf, akv_api_error *err) {
    int status = 503;
    const char *type = "server_error", *code = NULL, *param = NULL;
    switch (rf->reason) {
    case AKV_REFUSE_CONTEXT:
        status = 400, type = "invalid_request_error", code = "context_length_exceeded";
        param = "max_tokens";
        break;
    case AKV_REFUSE_INVALID:
        status = 400, type = "invalid_request_error";
        break;
    case AKV_REFUSE_BUSY:
    case AKV_REFUSE_QUEUE:
        status = 429, type = "rate_limit_error", code = "server_busy";
        break;
    default:
        break; /* host, device, failed: 503 */
    }
    char msg[sizeof err->message];
    akv_log_render(rf->message, s->p.settings_namer, s->p.settings_user, msg, sizeof msg);
    akv_api_error_set(err, status, type, code, param, "%s (%s)", msg,
                      akv_refusal_reason_name(rf->reason));
}

/* The prompt's logits (echo with logprobs; engine thread): row j of pos.. predicts the prompt
 * token at pos + j + 1; the last prompt row predicts the first generated token (on_token's). */
static void on_prompt_logits(void *user, akv_request *rq, uint32_t pos, uint32_t n,
                             const float *logits) {
    (void)rq;
    akv_srv_req *r = user;
    const akv_server *s = r->owner;
    for (uint32_t j = 0; j < n && pos + j + 1 < r->n_prompt_ids; j++) {
        const akv_srv_tok rec = tok_record(s, r, logits + (size_t)j * (size_t)s->n_vocab, r->prompt[pos + j + 1]);
        akv_srv_req_append_prompt(r, &rec);
    }
}

static void engine_submit(akv_server *s, akv_srv_req *r) {
    akv_request_params rp = {.prompt = r->prompt,
                             .n_prompt = r->n_prompt_ids,
                             .max_tokens = r->api.max_tokens,
                             .sample = r->api.sample,
                             .ignore_eog = r->api.ignore_eos,
                             .kv_exact = r->api.kv_exact,
                             .kv_compact = r->api.kv_compact,
                             .cache_salt = r->api.cache_salt,
                             .retention = r->api.retention,
                             .format = r->api.schema || r->api.call_schema ? AKV_FORMAT_JSON_SCHEMA
                                       : r->api.json_object                 ? AKV_FORMAT_JSON_OBJECT
                                                                            : AKV_FORMAT_TEXT,
                             .schema = r->api.schema        ? akv_srv_schema_view(r->api.schema)
                                       : r->api.call_schema ? akv_srv_schema_view(r->api.call_schema)
                                                            : NULL,
                             .format_after = r->api.call_after, /* (never beside a schema) */
                             .format_at_start = r->api.call_schema && !r->api.call_after,
                             .want_logits = r->api.logprobs,
                             .on_prompt_logits = r->api.echo && r->api.logprobs ? on_prompt_logits
                                                                                : NULL,
                             .stop = (const char *const *)r->api.stop,
                             .n_stop = r->api.n_stop,
                             .bias = r->api.bias,
                             .n_bias = r->api.n_bias,
                             .on_token = on_token,
                             .user = r,
                             .id = r->num};
    akv_refusal rf;
    memset(&rf, 0, sizeof rf);
    akv_status st = akv_engine_submit(s->engine, &rp, &r->rq, &rf);
    if (st == AKV_OK) {
        akv_srv_req_admit(r);
        return;
    }
    const bool reasoned = rf.reason != AKV_REFUSE_NONE;
    akv_api_error err;
    if (reasoned) {
        refusal_to_error(s, &rf, &err);
        pthread_mutex_lock(&s->mu);
        s->m.refused[rf.reason]++;
        pthread_mutex_unlock(&s->mu);
    } else { /* out of memory, or a failure without a reason: not the client's doing */
        akv_api_error_set(&err, 503, "server_error", NULL, NULL,
                          "the request could not be submitted: %s", akv_status_str(st));
    }
    akv_srv_req_refuse(r, &err);
    inflight_done(s); /* engine_reap drops the engine's reference */
}

/* A queued submit the engine thread cannot take: refused, its reference dropped. */
static void submit_refused(akv_server *s, akv_srv_req *r, const char *why) {
    akv_api_error err;
    akv_api_error_set(&err, 503, "server_error", NULL, NULL, "%s", why);
    akv_srv_req_refuse(r, &err);
    inflight_done(s);
    akv_srv_req_unref(r);
}

/* Requests that ended: the engine forgets them and drops its reference. */
static void engine_reap(akv_server *s, akv_srv_req **live, size_t *n_live) {
    size_t k = 0;
    for (size_t i = 0; i < *n_live; i++) {
        akv_srv_req *r = live[i];
        const akv_srv_phase ph = akv_srv_req_phase(r);
        if (ph != AKV_SRV_DONE && ph != AKV_SRV_REFUSED) {
            live[k++] = r;
            continue;
        }
        if (r->rq) akv_engine_release(s->engine, r->rq);
        r->rq = NULL;
        akv_srv_req_unref(r);
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
    s->m.host_shared_pages = hs.n_shares;
    s->m.h2d_bytes = rs.h2d_bytes, s->m.staged_bytes = rs.staged_bytes,
    s->m.d2h_bytes = rs.d2h_bytes, s->m.host_attended_bytes = rs.host_bytes;
    pthread_mutex_unlock(&s->mu);
}

/* The chat template: forced by name, given as source, or the model's own. One the operator
 * named that cannot be used fails the start; the model's own unrecognised one only leaves
 * /v1/chat/completions answering 400. */
static akv_status engine_open_chat(akv_server *s) {
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
    if (st && (p->chat_template_text || p->chat_template_name)) {
        AKV_LOG_E("server: the chat template given ({=chat_template_name} or {=chat_template_text}) "
                  "cannot be used: %s",
                  akv_status_str(st));
        return st;
    }
    if (st)
        AKV_LOG_W("server: the model's chat template is not one this server renders (%s): "
                  "/v1/chat/completions answers 400; name the family with {=chat_template_name} "
                  "(chatml, llama3)",
                  akv_status_str(st));
    return AKV_OK;
}

/* Creates the engine and what the HTTP threads read from it. */
static bool engine_open(akv_server *s) {
    akv_status st = akv_engine_create(&s->p.engine, &s->engine);
    s->p.engine.dev = NULL; /* the engine owns it now, whatever create returned */
    if (st) {
        AKV_LOG_E("server: the engine could not be created: %s", akv_status_str(st));
        return false;
    }
    s->tok = akv_engine_tok(s->engine);
    s->max_context = akv_engine_get_plan(s->engine)->max_context;
    s->kv_tier = akv_engine_get_plan(s->engine)->route.tier;
    s->n_vocab = (int32_t)akv_engine_config(s->engine)->n_vocab;
    s->max_piece_bytes = s->tok ? akv_tok_max_piece_bytes(s->tok) : 1;
    if (engine_open_chat(s)) return false;
    engine_snapshot(s);
    return true;
}

void *akv__server_engine_main(void *arg) {
    akv_server *s = arg;
    akv__server_set_state(s, engine_open(s) ? AKV_SRV_READY : AKV_SRV_FAILED);
    akv_srv_req **live = NULL;
    size_t n_live = 0, cap_live = 0;
    bool busy = false;
    for (;;) {
        bool closed;
        akv_srv_cmd *cmds = akv_srv_queue_take(&s->q, !busy, &closed);
        while (cmds) {
            akv_srv_cmd *c = cmds;
            cmds = c->next;
            akv_srv_req *r = c->r;
            if (c->kind == AKV_SRV_CANCEL) {
                if (r->rq) akv_engine_cancel(s->engine, r->rq);
                akv_srv_cmd_free(c); /* the command's reference */
                continue;
            }
            if (c->kind == AKV_SRV_SLOT) {
                akv__server_slot_run(s, r);
                akv_srv_cmd_free(c);
                inflight_done(s);
                continue;
            }
            akv__free(c);     /* a SUBMIT's reference becomes the engine thread's */
            if (!s->engine) { /* a submit raced a failed load */
                submit_refused(s, r, "the model failed to load");
                continue;
            }
            if (akv__array_reserve((void **)&live, &cap_live, n_live + 1, sizeof *live)) {
                submit_refused(s, r, "out of memory");
                continue;
            }
            live[n_live++] = r;
            engine_submit(s, r);
        }
        if (closed) {
            for (size_t i = 0; i < n_live; i++) {
                akv_srv_req_mark_cancelled(live[i], AKV_END_SHUTDOWN); /* else its reason stands */
                if (live[i]->rq) akv_engine_cancel(s->engine, live[i]->rq);
            }
            if (s->engine) engine_reap(s, live, &n_live);
            break;
        }
        if (s->engine && akv_engine_busy(s->engine)) {
            akv_status st = akv_engine_step(s->engine, NULL);
            if (st && akv_engine_failed(s->engine)) {
                AKV_LOG_E("server: the device failed and did not recover; every request ends");
                akv__server_set_state(s, AKV_SRV_FAILED);
            }
        }
        if (s->engine) {
            engine_reap(s, live, &n_live);
            engine_snapshot(s);
        }
        busy = s->engine && akv_engine_busy(s->engine);
    }
    akv__free(live);
    return NULL; /* the engine outlives the HTTP threads that borrow its tokenizer: stop frees it */
}
