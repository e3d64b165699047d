/* channel.c — requests, their channels and the command queue (server/channel.h). */
#define _GNU_SOURCE
#include "server/channel.h"

#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/assert.h"

akv_status akv_srv_req_create(akv_srv_req **out) {
    akv_srv_req *r = akv__calloc(1, sizeof *r);
    if (!r) return AKV_ENOMEM;
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        akv__free(r);
        return AKV_EIO;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->refs = 1;
    *out = r;
    return AKV_OK;
}

akv_status akv_srv_req_create_choice(akv_srv_req *lead, akv_srv_req **out) {
    akv_srv_req *r = akv__calloc(1, sizeof *r);
    if (!r) return AKV_ENOMEM;
    akv_srv_req_ref(lead);
    r->owner = lead->owner;
    r->lead = lead;
    r->api = lead->api;
    r->prompt = lead->prompt, r->n_prompt_ids = lead->n_prompt_ids;
    r->created = lead->created, r->t_arrival = lead->t_arrival;
    memcpy(r->id, lead->id, sizeof r->id);
    r->efd = lead->efd;
    pthread_mutex_init(&r->mu, NULL);
    r->refs = 1;
    *out = r;
    return AKV_OK;
}

void akv_srv_req_ref(akv_srv_req *r) {
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->refs > 0);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

void akv_srv_req_unref(akv_srv_req *r) {
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->refs > 0);
    const int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    akv__free(r->text);
    akv__free(r->toks);
    akv__free(r->ptoks);
    akv__free(r->slot.path);
    akv__free(r->slot.list);
    pthread_mutex_destroy(&r->mu);
    if (r->lead) { /* its api, prompt and eventfd are the lead's */
        akv_srv_req_unref(r->lead);
    } else {
        akv_api_request_free(&r->api);
        akv_tok_ids_free(&r->ids);
        close(r->efd);
    }
    akv__free(r);
}

static void req_wake(akv_srv_req *r) {
    uint64_t one = 1;
    ssize_t k = write(r->efd, &one, sizeof one);
    (void)k; /* a full counter still wakes the reader */
}

void akv_srv_req_admit(akv_srv_req *r) {
    pthread_mutex_lock(&r->mu);
    if (r->phase == AKV_SRV_PENDING) r->phase = AKV_SRV_ADMITTED;
    pthread_mutex_unlock(&r->mu);
    req_wake(r);
}

void akv_srv_req_refuse(akv_srv_req *r, const akv_api_error *why) {
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->phase == AKV_SRV_PENDING);
    r->phase = AKV_SRV_REFUSED;
    r->refusal = *why;
    pthread_mutex_unlock(&r->mu);
    req_wake(r);
}

void akv_srv_req_append(akv_srv_req *r, const char *t, size_t n, const akv_srv_tok *tok) {
    if (!n && !tok) return;
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->phase == AKV_SRV_ADMITTED || r->phase == AKV_SRV_PENDING);
    /* the request still ends after a loss; its answer says it lost something */
    if (n && akv__array_reserve((void **)&r->text, &r->cap_text, r->n_text + n + 1, 1)) {
        r->text_cut = true;
    } else if (n) {
        memcpy(r->text + r->n_text, t, n);
        r->n_text += n;
        r->text[r->n_text] = '\0';
    }
    if (tok && akv__array_reserve((void **)&r->toks, &r->cap_toks, r->n_toks + 1, sizeof *r->toks))
        r->text_cut = true;
    else if (tok)
        r->toks[r->n_toks++] = *tok;
    pthread_mutex_unlock(&r->mu);
    req_wake(r);
}

void akv_srv_req_append_prompt(akv_srv_req *r, const akv_srv_tok *tok) {
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->phase == AKV_SRV_ADMITTED || r->phase == AKV_SRV_PENDING);
    if (akv__array_reserve((void **)&r->ptoks, &r->cap_ptoks, r->n_ptoks + 1, sizeof *r->ptoks))
        r->text_cut = true; /* the answer says it lost something */
    else
        r->ptoks[r->n_ptoks++] = *tok;
    pthread_mutex_unlock(&r->mu);
}

void akv_srv_req_finish(akv_srv_req *r, akv_finish finish, uint32_t n_prompt, uint32_t n_cached,
                        uint32_t n_gen) {
    pthread_mutex_lock(&r->mu);
    AKV_ASSERT(r->phase == AKV_SRV_ADMITTED || r->phase == AKV_SRV_PENDING);
    r->phase = AKV_SRV_DONE;
    r->finish = finish;
    r->n_prompt = n_prompt, r->n_cached = n_cached, r->n_gen = n_gen;
    pthread_mutex_unlock(&r->mu);
    req_wake(r);
}

bool akv_srv_req_mark_cancelled(akv_srv_req *r, akv_metrics_end why) {
    pthread_mutex_lock(&r->mu);
    const bool mark =
        !r->cancelled && (r->phase == AKV_SRV_PENDING || r->phase == AKV_SRV_ADMITTED);
    if (mark) r->end = why, r->cancelled = true;
    pthread_mutex_unlock(&r->mu);
    return mark;
}

akv_srv_phase akv_srv_req_phase(akv_srv_req *r) {
    pthread_mutex_lock(&r->mu);
    const akv_srv_phase p = r->phase;
    pthread_mutex_unlock(&r->mu);
    return p;
}

akv_status akv_srv_req_take_text(akv_srv_req *r, char **piece, size_t *n, akv_srv_tok **toks,
                                 size_t *n_toks, akv_srv_phase *phase) {
    akv_status st = AKV_OK;
    *piece = NULL, *n = 0;
    if (toks) *toks = NULL, *n_toks = 0;
    pthread_mutex_lock(&r->mu);
    *phase = r->phase;
    const size_t k = r->n_text - r->sent;
    const size_t m = toks && (k || r->phase == AKV_SRV_DONE) ? r->n_toks - r->sent_toks : 0;
    char *p = k ? akv__malloc(k + 1) : NULL;
    akv_srv_tok *q = m ? akv__malloc(m * sizeof *q) : NULL;
    if ((k && !p) || (m && !q)) {
        akv__free(p), akv__free(q);
        st = AKV_ENOMEM;
    } else {
        if (k) {
            memcpy(p, r->text + r->sent, k);
            p[k] = '\0';
            *piece = p, *n = k;
            r->sent = r->n_text;
        }
        if (m) {
            memcpy(q, r->toks + r->sent_toks, m * sizeof *q);
            *toks = q, *n_toks = m;
            r->sent_toks = r->n_toks;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* ---- the command queue ---------------------------------------------------------------------- */

void akv_srv_queue_init(akv_srv_queue *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

void akv_srv_cmd_free(akv_srv_cmd *c) {
    if (!c) return;
    akv_srv_req_unref(c->r);
    akv__free(c);
}

void akv_srv_queue_deinit(akv_srv_queue *q) {
    for (akv_srv_cmd *c = q->head, *n; c; c = n) {
        n = c->next;
        akv_srv_cmd_free(c);
    }
    q->head = q->tail = NULL;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

akv_status akv_srv_queue_post(akv_srv_queue *q, akv_srv_cmd_kind kind, akv_srv_req *r) {
    akv_srv_cmd *c = akv__malloc(sizeof *c);
    if (!c) return AKV_ENOMEM;
    *c = (akv_srv_cmd){kind, r, NULL};
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->mu);
        akv__free(c);
        return AKV_ESTATE;
    }
    akv_srv_req_ref(r);
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return AKV_OK;
}

akv_srv_cmd *akv_srv_queue_take(akv_srv_queue *q, bool wait, bool *closed) {
    pthread_mutex_lock(&q->mu);
    while (wait && !q->head && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    akv_srv_cmd *c = q->head;
    q->head = q->tail = NULL;
    *closed = q->closed;
    pthread_mutex_unlock(&q->mu);
    return c;
}

void akv_srv_queue_close(akv_srv_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
