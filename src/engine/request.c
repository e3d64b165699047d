/* request.c — one request of the engine (akv/engine.h): its copies of the prompt and stop
 * strings, its sampler, and what happens to each token it samples: the end-of-generation
 * check, the streamed text with stop strings held back, the event, the end. */
#include <math.h>
#include <string.h>

#include "akv/tok.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "engine/engine_impl.h"
#include "akv/trace.h"
#include "engine/json_lex.h"

/* The request's format as a machine for its masks (mask.h). */
static bool request_feed_object(void *state, const uint8_t *bytes, size_t n) {
    return akv_json_prefix_feed(state, bytes, n);
}
static bool request_feed_schema(void *state, const uint8_t *bytes, size_t n) {
    return akv_js_feed(state, bytes, n);
}
static akv__mask_machine request_machine(const akv_request *rq) {
    return rq->p.format == AKV_FORMAT_JSON_SCHEMA
               ? (akv__mask_machine){sizeof rq->js, request_feed_schema}
               : (akv__mask_machine){sizeof rq->json, request_feed_object};
}
static const uint8_t *request_piece(const void *tok, int32_t id, size_t *n) {
    return akv_tok_token_piece(tok, id, n);
}

/* The format's machine at the start of a value. */
static void format_reset(akv_request *rq) {
    akv_json_prefix_init(&rq->json, true);
    if (rq->p.format == AKV_FORMAT_JSON_SCHEMA) akv_js_init(&rq->js, rq->p.schema);
}

akv_status akv__request_init(akv_engine *e, akv_request *rq, const akv_request_params *p) {
    rq->e = e;
    rq->p = *p;
    rq->info.id = p->id;
    rq->info.n_prompt = p->n_prompt;
    rq->prompt = akv__malloc((size_t)p->n_prompt * sizeof *rq->prompt);
    if (!rq->prompt) return AKV_ENOMEM;
    memcpy(rq->prompt, p->prompt, (size_t)p->n_prompt * sizeof *rq->prompt);
    rq->p.prompt = rq->prompt;
    if (p->n_stop) {
        rq->stop = akv__calloc(p->n_stop, sizeof *rq->stop);
        rq->stop_len = akv__calloc(p->n_stop, sizeof *rq->stop_len);
        if (!rq->stop || !rq->stop_len) return AKV_ENOMEM;
        for (uint32_t i = 0; i < p->n_stop; i++) {
            if (!(rq->stop[i] = akv__strdup(p->stop[i]))) return AKV_ENOMEM;
            rq->stop_len[i] = strlen(p->stop[i]);
        }
    }
    rq->p.stop = (const char *const *)rq->stop;
    if (p->n_bias) { /* the engine checked them (akv_engine_submit) */
        rq->bias = akv__malloc((size_t)p->n_bias * sizeof *rq->bias);
        rq->biased = akv__malloc((size_t)e->cfg.n_vocab * sizeof *rq->biased);
        if (!rq->bias || !rq->biased) return AKV_ENOMEM;
        memcpy(rq->bias, p->bias, (size_t)p->n_bias * sizeof *rq->bias);
    }
    rq->p.bias = rq->bias;
    if (p->format != AKV_FORMAT_TEXT) {
        format_reset(rq);
        rq->fmt_on = true;
        if (p->format_after && *p->format_after) {
            rq->n_after = strlen(p->format_after);
            if (!(rq->after = akv__strdup(p->format_after)) || !(rq->tail = akv__malloc(rq->n_after)))
                return AKV_ENOMEM;
            rq->fmt_on = false;
        } else if (p->format_at_start) {
            rq->fmt_on = false, rq->at_start = true;
        }
        if (!(rq->masked = akv__malloc((size_t)e->cfg.n_vocab * sizeof *rq->masked))) return AKV_ENOMEM;
        akv_status st = akv__mask_cache_init(&rq->masks, e->cfg.n_vocab, request_machine(rq).size);
        if (!st && e->tok && !e->vocab.order) {
            e->vocab = (akv__vocab){.piece = request_piece, .user = e->tok, .n_vocab = e->cfg.n_vocab};
            st = akv__vocab_order(&e->vocab);
            e->n_eog = 0;
            for (uint32_t id = 0; !st && id < e->cfg.n_vocab; id++) {
                if (!akv__request_is_eog(e, (int32_t)id)) continue;
                size_t cap = e->n_eog;
                if ((st = akv__array_reserve((void **)&e->eog, &cap, (size_t)e->n_eog + 1, sizeof *e->eog)))
                    akv__vocab_free(&e->vocab); /* made again by the next request */
                else
                    e->eog[e->n_eog++] = (int32_t)id;
            }
        }
        if (st) return st;
    }
    akv_status st = akv_sampler_create(&p->sample, (int32_t)e->cfg.n_vocab, &rq->sampler);
    for (uint32_t i = 0; i < p->n_prompt && !st; i++) st = akv_sampler_accept(rq->sampler, p->prompt[i]);
    return st;
}

void akv__request_free(akv_request *rq) {
    if (!rq) return;
    akv__free(rq->prompt);
    akv__free(rq->gen);
    akv__free(rq->masked);
    akv__free(rq->bias), akv__free(rq->biased);
    akv__free(rq->after), akv__free(rq->tail);
    akv__mask_cache_free(&rq->masks);
    for (uint32_t i = 0; rq->stop && i < rq->p.n_stop; i++) akv__free(rq->stop[i]);
    akv__free(rq->stop);
    akv__free(rq->stop_len);
    akv_sampler_destroy(rq->sampler);
    akv_tok_text_free(&rq->held);
    akv_tok_text_free(&rq->piece);
    akv__free(rq);
}

bool akv__request_is_eog(const akv_engine *e, int32_t token) {
    if (!e->tok) return false;
    akv_tok_specials sp = akv_tok_get_specials(e->tok);
    return token == sp.eos_id || token == sp.eot_id ||
           akv_tok_token_type(e->tok, token) == AKV_TOK_TYPE_CONTROL;
}

/* Delivers an event (none after a release). */
static void request_emit(akv_request *rq, int32_t token, const char *text, size_t n_text,
                         const float *logits, akv_finish finish, bool eog) {
    if (rq->released || !rq->p.on_token) return;
    akv_token_event ev = {.token = token,
                          .text = text,
                          .n_text = n_text,
                          .logits = rq->p.want_logits ? logits : NULL,
                          .finish = finish,
                          .eog = eog};
    akv_trace *tr = rq->e->p.trace;
    const uint64_t t0 = akv_trace_level_of(tr) == AKV_TRACE_SPANS ? akv_clock_ns() : 0;
    rq->p.on_token(rq->p.user, rq, &ev);
    if (t0) akv_trace_span(tr, AKV_TRACE_TRACK_REQUEST + (uint32_t)rq->info.serial, "emit", t0, akv_clock_ns(),
                           "token", token, NULL, 0);
}

/* The request has ended: its state and counters (the engine releases its context). */
static void request_finish(akv_request *rq, akv_finish finish) {
    rq->info.state = AKV_REQUEST_DONE;
    rq->info.finish = finish;
    rq->info.t_done = akv_clock_s();
}

void akv__request_end(akv_request *rq, akv_finish finish) {
    request_finish(rq, finish);
    request_emit(rq, -1, NULL, 0, NULL, finish, false);
}

/* Where the earliest stop string begins in held (SIZE_MAX: none). */
static size_t request_find_stop(const akv_request *rq) {
    size_t best = SIZE_MAX;
    for (uint32_t i = 0; i < rq->p.n_stop; i++) {
        size_t k = rq->stop_len[i];
        if (k == 0 || k > rq->held.n_bytes) continue;
        for (size_t at = 0; at + k <= rq->held.n_bytes && at < best; at++)
            if (!memcmp(rq->held.bytes + at, rq->stop[i], k)) best = at;
    }
    return best;
}

/* Bytes at the end of held that could begin a stop string (they wait for the next token). */
static size_t request_hold_back(const akv_request *rq) {
    size_t keep = 0;
    for (uint32_t i = 0; i < rq->p.n_stop; i++) {
        size_t k = rq->stop_len[i] - (rq->stop_len[i] > 0);
        if (k > rq->held.n_bytes) k = rq->held.n_bytes;
        for (; k > keep; k--)
            if (!memcmp(rq->held.bytes + rq->held.n_bytes - k, rq->stop[i], k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

/* Removes the first n bytes of held. */
static void request_drop_held(akv_request *rq, size_t n) {
    memmove(rq->held.bytes, rq->held.bytes + n, rq->held.n_bytes - n);
    rq->held.n_bytes -= n;
    if (rq->held.bytes) rq->held.bytes[rq->held.n_bytes] = 0;
}

/* The text so far under the request's format: whether it is whole, and a piece taken. */
static bool format_complete(const akv_request *rq) {
    return rq->p.format == AKV_FORMAT_JSON_SCHEMA ? akv_js_complete(&rq->js)
                                                   : akv_json_prefix_complete(&rq->json);
}
static bool format_take(akv_request *rq, const uint8_t *piece, size_t n) {
    return rq->p.format == AKV_FORMAT_JSON_SCHEMA ? akv_js_feed(&rq->js, piece, n)
                                                   : akv_json_prefix_feed(&rq->json, piece, n);
}

/* A JSON answer's logits (a format but TEXT) into rq->masked: -inf for every token whose piece
 * cannot follow the text so far under the format, and for the end of generation until the
 * value is complete. A complete value may still go on where it can (a number's next digit), but
 * not by whitespace alone (which could run to max_tokens). A vocabulary that leaves nothing
 * (no token continues it) keeps the end of generation, so the request ends rather than fails. */
static const float *request_mask_json(akv_request *rq, const float *logits) {
    const akv_engine *e = rq->e;
    const bool done = format_complete(rq);
    const akv_tok_specials sp = akv_tok_get_specials(e->tok);
    const akv__mask_machine m = request_machine(rq);
    const void *state = rq->p.format == AKV_FORMAT_JSON_SCHEMA ? (const void *)&rq->js : &rq->json;
    const uint64_t *bits = akv__mask_get(&rq->masks, &m, state, &e->vocab);
    const uint32_t V = e->cfg.n_vocab;
    for (uint32_t id = 0; id < V; id++)
        rq->masked[id] = (bits[id / 64] >> (id % 64)) & 1 ? logits[id] : -INFINITY;
    /* the end of generation only once the value is whole */
    for (uint32_t k = 0; k < e->n_eog; k++)
        rq->masked[e->eog[k]] = done ? logits[e->eog[k]] : -INFINITY;
    if (done) /* a whole value goes on, but not by whitespace alone */
        for (uint32_t w = 0; w < (V + 63) / 64; w++)
            for (uint64_t b = bits[w]; b; b &= b - 1) {
                const uint32_t id = w * 64 + (uint32_t)__builtin_ctzll(b);
                size_t n = 0;
                const uint8_t *piece = akv_tok_token_piece(e->tok, (int32_t)id, &n);
                bool blank = true;
                for (size_t i = 0; i < n; i++)
                    blank &= json_lex_ws(piece[i]);
                if (blank && !akv__request_is_eog(e, (int32_t)id)) rq->masked[id] = -INFINITY;
            }
    bool any = false;
    for (uint32_t id = 0; id < V && !any; id++) any = rq->masked[id] > -INFINITY;
    if (!any && sp.eos_id >= 0 && (uint32_t)sp.eos_id < V) rq->masked[sp.eos_id] = 0.0f;
    return rq->masked;
}

/* Outside a value (format_after): a free token's piece; where it completes the string, the
 * value opens with the piece's bytes after it (a piece that cannot begin one leaves this
 * occurrence free). */
static void request_watch(akv_request *rq, const uint8_t *piece, size_t n) {
    const size_t k = rq->n_after;
    for (size_t i = 0; i < n; i++) { /* the string ends at piece byte i? */
        const size_t from_tail = i + 1 < k ? k - (i + 1) : 0; /* its bytes before the piece */
        if (from_tail > rq->n_tail) continue;
        if (memcmp(rq->tail + rq->n_tail - from_tail, rq->after, from_tail) ||
            memcmp(piece + i + 1 - (k - from_tail), rq->after + from_tail, k - from_tail))
            continue;
        format_reset(rq);
        rq->fmt_on = format_take(rq, piece + i + 1, n - i - 1) && !format_complete(rq);
        rq->n_tail = 0;
        if (rq->fmt_on) return;
        piece += i + 1, n -= i + 1, i = (size_t)-1; /* free again: watch the rest */
    }
    /* the last k - 1 bytes of the text so far */
    if (k < 2) return;
    if (n >= k - 1) {
        memcpy(rq->tail, piece + n - (k - 1), k - 1);
        rq->n_tail = k - 1;
        return;
    }
    const size_t keep = rq->n_tail + n > k - 1 ? k - 1 - n : rq->n_tail;
    memmove(rq->tail, rq->tail + rq->n_tail - keep, keep);
    memcpy(rq->tail + keep, piece, n);
    rq->n_tail = keep + n;
}

/* Whether the pass may choose its token (its row need not come to the host): no format's mask,
 * no logits wanted, no logit bias. */
static bool request_pass_may_choose(const akv_request *rq) {
    return !rq->masked && !rq->p.want_logits && !rq->p.n_bias;
}

bool akv__request_greedy(const akv_request *rq) {
    const akv_sample_params *sp = &rq->p.sample;
    return sp->temp == 0.0f && sp->repeat_penalty == 1.0f && sp->presence_penalty == 0.0f &&
           sp->frequency_penalty == 0.0f && request_pass_may_choose(rq);
}

bool akv__request_draw(akv_request *rq, akv_fwd_sample_row *row, int32_t *ids, int32_t *counts) {
    if (rq->p.sample.temp == 0.0f || !request_pass_may_choose(rq)) return false;
    return akv_sampler_draw_row(rq->sampler, row, ids, counts, AKV_FORWARD_SAMPLE_PEN_MAX) == AKV_OK;
}

bool akv__request_on_logits(akv_request *rq, const float *logits) {
    int32_t token;
    akv_trace *tr = rq->e->p.trace;
    const uint64_t t0 = akv_trace_level_of(tr) == AKV_TRACE_SPANS ? akv_clock_ns() : 0;
    const float *in = logits;
    if (rq->p.n_bias) { /* the biases first, then the format's mask over them */
        memcpy(rq->biased, logits, (size_t)rq->e->cfg.n_vocab * sizeof *rq->biased);
        for (uint32_t i = 0; i < rq->p.n_bias; i++) rq->biased[rq->bias[i].token] += rq->bias[i].bias;
        in = rq->biased;
    }
    const float *from = rq->masked && rq->fmt_on ? request_mask_json(rq, in) : in;
    akv_status st = akv_sampler_sample(rq->sampler, from, &token);
    if (t0) akv_trace_span(tr, AKV_TRACE_TRACK_REQUEST + (uint32_t)rq->info.serial, "sample", t0, akv_clock_ns(),
                           "masked", rq->masked && rq->fmt_on, NULL, 0);
    if (st) {
        rq->info.error = st;
        akv__request_end(rq, AKV_FINISH_ERROR);
        return true;
    }
    return akv__request_on_token(rq, token, logits);
}

bool akv__request_on_token(akv_request *rq, int32_t token, const float *logits) {
    akv_engine *e = rq->e;
    akv_status st;
    if (token < 0) { /* the device's greedy choice found no finite logit */
        AKV_LOG_E("sampler: every logit is NaN or -inf");
        rq->info.error = AKV_EINVAL;
        akv__request_end(rq, AKV_FINISH_ERROR);
        return true;
    }
    size_t cap = rq->gen_cap;
    if ((st = akv__array_reserve((void **)&rq->gen, &cap, (size_t)rq->info.n_gen + 1, sizeof *rq->gen))) {
        rq->info.error = st;
        akv__request_end(rq, AKV_FINISH_ERROR);
        return true;
    }
    rq->gen_cap = (uint32_t)cap;
    rq->gen[rq->info.n_gen] = token;
    if (rq->info.n_gen == 0) rq->info.t_first = akv_clock_s();
    rq->info.n_gen++;
    e->stats.gen_tokens++;
    if (!rq->p.ignore_eog && akv__request_is_eog(e, token)) {
        /* an end of generation: the text so far is final (stop strings could not complete) */
        akv_tok_text_free(&rq->piece);
        if (akv_tok_stream_flush(&rq->stream, &rq->held) != AKV_OK) rq->held.n_bytes = 0;
        request_finish(rq, AKV_FINISH_STOP);
        request_emit(rq, token, e->tok ? (rq->held.bytes ? rq->held.bytes : "") : NULL,
                     rq->held.n_bytes, logits, AKV_FINISH_STOP, true);
        return true;
    }
    (void)akv_sampler_accept(rq->sampler, token);
    if (rq->masked && !akv__request_is_eog(e, token)) {
        size_t n = 0;
        const uint8_t *piece = akv_tok_token_piece(e->tok, token, &n);
        if (rq->fmt_on) { /* its piece continues the value (the mask allowed it) */
            if (!piece || !format_take(rq, piece, n)) AKV_ASSERT(!"masked token");
            if ((rq->after || rq->p.format_at_start) && format_complete(rq)) rq->fmt_on = false, rq->n_tail = 0;
        } else if (piece && rq->after) {
            request_watch(rq, piece, n);
        } else if (piece && rq->at_start) { /* the answer's first bytes: a value, or free text */
            size_t i = 0;
            while (i < n && json_lex_ws(piece[i])) i++;
            if (i < n) {
                rq->at_start = false;
                format_reset(rq);
                rq->fmt_on = format_take(rq, piece, n) && !format_complete(rq);
            }
        }
    }
    const bool last = rq->info.n_gen >= rq->p.max_tokens;
    if (e->tok) {
        rq->piece.n_bytes = 0;
        if ((st = akv_tok_stream_push(e->tok, &rq->stream, token, 0, &rq->held)) ||
            (last && (st = akv_tok_stream_flush(&rq->stream, &rq->held)))) {
            rq->info.error = st;
            akv__request_end(rq, AKV_FINISH_ERROR);
            return true;
        }
        size_t at = request_find_stop(rq);
        if (at != SIZE_MAX) {
            request_finish(rq, AKV_FINISH_STOP);
            request_emit(rq, token, rq->held.bytes ? rq->held.bytes : "", at, logits,
                         AKV_FINISH_STOP, false);
            return true;
        }
        size_t out = last ? rq->held.n_bytes : rq->held.n_bytes - request_hold_back(rq);
        /* the event's text: the bytes that are now final, NUL-terminated in piece */
        if (akv_tok_text_append(&rq->piece, rq->held.bytes ? rq->held.bytes : "", out) != AKV_OK) {
            rq->info.error = AKV_ENOMEM;
            akv__request_end(rq, AKV_FINISH_ERROR);
            return true;
        }
        request_drop_held(rq, out);
    }
    if (last) request_finish(rq, AKV_FINISH_LENGTH);
    const char *text = !e->tok ? NULL : rq->piece.bytes ? rq->piece.bytes : "";
    request_emit(rq, token, text, e->tok ? rq->piece.n_bytes : 0, logits,
                 last ? AKV_FINISH_LENGTH : AKV_FINISH_NONE, false);
    if (!last) rq->info.state = AKV_REQUEST_DECODE; /* the token is fed at the next step */
    return last;
}
