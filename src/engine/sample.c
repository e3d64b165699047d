/* sample.c — the sampling chain of akv/sample.h. */
#include "akv/sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "akv/forward_ops.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/rng.h"

typedef struct sample_cand {
    float logit;
    int32_t id;
    double p;
} sample_cand;

struct akv_sampler {
    akv_sample_params params;
    int32_t n_vocab;
    akv_rng rng;
    int32_t *history;        /* ring of the last `n_hist_cap` accepted tokens */
    size_t n_hist, hist_head, n_hist_cap;
    sample_cand *cand;       /* [n_vocab] scratch */
    float *penalised;        /* [n_vocab] scratch: logits after the penalty */
    uint32_t *stamp;         /* [n_vocab] last penalty pass that touched a token */
    uint32_t *count;         /* [n_vocab] times a token is in the history (this pass) */
    uint32_t n_pass;         /* penalty passes so far (stamps are compared to it) */
    int32_t *pen_ids;        /* [history] scratch: the distinct penalised tokens */
    int32_t *pen_counts;     /* [history] and their counts */
    size_t pen_cap;
};

akv_sample_params akv_sample_default_params(void) {
    return (akv_sample_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                               .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

akv_status akv_sampler_create(const akv_sample_params *params, int32_t n_vocab, akv_sampler **out) {
    akv_sample_params p = params ? *params : akv_sample_default_params();
    const char *bad = NULL;
    if (!(p.temp >= 0) || isinf(p.temp)) bad = "temp must be >= 0";
    else if (!(p.top_p > 0 && p.top_p <= 1)) bad = "top_p must be in (0, 1]";
    else if (!(p.min_p >= 0 && p.min_p < 1)) bad = "min_p must be in [0, 1)";
    else if (!(p.repeat_penalty > 0) || isinf(p.repeat_penalty)) bad = "repeat_penalty must be > 0";
    else if (!isfinite(p.presence_penalty)) bad = "presence_penalty must be finite";
    else if (!isfinite(p.frequency_penalty)) bad = "frequency_penalty must be finite";
    else if (p.top_k < 0) bad = "top_k must be >= 0";
    else if (p.repeat_last_n < -1) bad = "repeat_last_n must be >= -1";
    else if (n_vocab < 1) bad = "n_vocab must be >= 1";
    if (bad || !out) {
        AKV_LOG_E("sampler: %s", bad ? bad : "out is NULL");
        return AKV_EINVAL;
    }
    akv_sampler *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    s->params = p;
    s->n_vocab = n_vocab;
    s->rng.state = p.seed;
    s->n_hist_cap = p.repeat_last_n < 0 ? 0 : (size_t)p.repeat_last_n; /* 0 with -1: grows */
    s->cand = akv__calloc((size_t)n_vocab, sizeof *s->cand);
    s->penalised = akv__calloc((size_t)n_vocab, sizeof *s->penalised);
    s->stamp = akv__calloc((size_t)n_vocab, sizeof *s->stamp);
    s->count = akv__calloc((size_t)n_vocab, sizeof *s->count);
    if (s->n_hist_cap) s->history = akv__calloc(s->n_hist_cap, sizeof *s->history);
    if (!s->cand || !s->penalised || !s->stamp || !s->count || (s->n_hist_cap && !s->history)) {
        akv_sampler_destroy(s);
        return AKV_ENOMEM;
    }
    *out = s;
    return AKV_OK;
}

void akv_sampler_destroy(akv_sampler *s) {
    if (!s) return;
    akv__free(s->history);
    akv__free(s->cand);
    akv__free(s->penalised);
    akv__free(s->stamp);
    akv__free(s->count);
    akv__free(s->pen_ids);
    akv__free(s->pen_counts);
    akv__free(s);
}

akv_status akv_sampler_accept(akv_sampler *s, int32_t token) {
    if (!s) return AKV_EINVAL;
    if (token < 0 || token >= s->n_vocab) {
        AKV_LOG_E("sampler: accept of token %d: not an id of the %d-token vocabulary", token, s->n_vocab);
        return AKV_EINVAL;
    }
    if (s->params.repeat_last_n == 0) return AKV_OK;
    if (s->params.repeat_last_n < 0) { /* unbounded history: grow */
        akv_status st = akv__array_reserve((void **)&s->history, &s->n_hist_cap, s->n_hist + 1,
                                           sizeof *s->history);
        if (st != AKV_OK) return st;
        s->history[s->n_hist++] = token;
        return AKV_OK;
    }
    s->history[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % s->n_hist_cap;
    if (s->n_hist < s->n_hist_cap) s->n_hist++;
    return AKV_OK;
}

/* The distinct tokens of the penalties' history with their counts (stamped, so O(history)),
 * into ids and counts, in the history's order of first sight; how many, or cap + 1 when there
 * are more than cap (then ids and counts hold the first cap). */
static uint32_t sample_history_counts(akv_sampler *s, int32_t *ids, int32_t *counts, uint32_t cap) {
    if (++s->n_pass == 0) { /* stamp counter wrapped: forget every old stamp */
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->n_pass = 1;
    }
    for (size_t i = 0; i < s->n_hist; i++) {
        int32_t t = s->history[i];
        if (s->stamp[t] != s->n_pass) s->stamp[t] = s->n_pass, s->count[t] = 0;
        s->count[t]++;
    }
    uint32_t n = 0;
    for (size_t i = 0; i < s->n_hist; i++) {
        int32_t t = s->history[i];
        if (s->count[t] == 0) continue; /* listed already */
        if (n < cap) ids[n] = t, counts[n] = (int32_t)s->count[t];
        n++;
        if (n > cap) break;
        s->count[t] = 0;
    }
    return n;
}

static bool sample_penalised(const akv_sample_params *p) {
    return p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

akv_status akv_sampler_draw_row(akv_sampler *s, akv_fwd_sample_row *row, int32_t *ids,
                                int32_t *counts, uint32_t cap) {
    if (!s || !row || (cap && (!ids || !counts))) return AKV_EINVAL;
    const akv_sample_params *p = &s->params;
    if (p->temp == 0.0f) {
        AKV_LOG_E("sampler: a greedy sampler has no draw (its choice is the pass's argmax)");
        return AKV_EINVAL;
    }
    uint32_t n = 0;
    if (sample_penalised(p) && s->n_hist) {
        n = sample_history_counts(s, ids, counts, cap);
        if (n > cap) return AKV_EFULL;
    }
    *row = (akv_fwd_sample_row){.temp = p->temp, .top_p = p->top_p, .min_p = p->min_p,
                                .repeat_penalty = p->repeat_penalty,
                                .presence_penalty = p->presence_penalty,
                                .frequency_penalty = p->frequency_penalty, .top_k = p->top_k,
                                .pen_off = 0, .pen_n = n};
    akv_rng peek = s->rng; /* spent by akv_sampler_draw_done */
    row->u = akv_rng_uniform(&peek);
    return AKV_OK;
}

void akv_sampler_draw_done(akv_sampler *s) {
    if (s) (void)akv_rng_uniform(&s->rng);
}

/* Logit descending, id ascending. */
static int sample_cmp(const void *a, const void *b) {
    const sample_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Keeps the k first candidates in sample_cmp's order in heap[0..*n), a heap whose root is
 * the last of them: v at id joins when fewer than k are kept or when it comes before the root.
 * Ids arrive ascending, so an equal logit never displaces the root (its id is larger). */
static void heap_offer(sample_cand *heap, size_t *n, size_t k, float v, int32_t id) {
    size_t i;
    if (*n < k) { /* sift up from the new leaf */
        i = (*n)++;
        while (i > 0 && sample_cmp(&heap[(i - 1) / 2], &(sample_cand){v, id, 0}) < 0) {
            heap[i] = heap[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        heap[i] = (sample_cand){v, id, 0};
        return;
    }
    if (!(v > heap[0].logit)) return; /* not before the root */
    i = 0; /* sift down from the root */
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && sample_cmp(&heap[c + 1], &heap[c]) > 0) c++; /* the later child */
        if (sample_cmp(&heap[c], &(sample_cand){v, id, 0}) <= 0) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = (sample_cand){v, id, 0};
}

akv_status akv_sampler_sample(akv_sampler *s, const float *logits, int32_t *out_token) {
    if (!s || !logits || !out_token) {
        AKV_LOG_E("sampler: sample with a NULL %s", !s ? "sampler" : !logits ? "logits array" : "output");
        return AKV_EINVAL;
    }
    const akv_sample_params *p = &s->params;
    const float *lg = logits; /* read in place unless a penalty changes it */

    /* 1. penalties: each distinct recent token once, with its count (stamped, so O(history)),
     * on a copy of the logits */
    if (sample_penalised(p) && s->n_hist) {
        float *pl = s->penalised;
        memcpy(pl, logits, (size_t)s->n_vocab * sizeof *pl);
        lg = pl;
        if (s->pen_cap < s->n_hist) {
            size_t c_ids = s->pen_cap, c_counts = s->pen_cap;
            akv_status st = akv__array_reserve((void **)&s->pen_ids, &c_ids, s->n_hist, sizeof *s->pen_ids);
            if (st == AKV_OK)
                st = akv__array_reserve((void **)&s->pen_counts, &c_counts, s->n_hist, sizeof *s->pen_counts);
            s->pen_cap = c_ids < c_counts ? c_ids : c_counts;
            if (st != AKV_OK) return st;
        }
        const uint32_t n = sample_history_counts(s, s->pen_ids, s->pen_counts, (uint32_t)s->n_hist);
        /* the formula the device's draws share (akv/fwd_sample.h): a finite logit stays
         * finite (a penalty below 1 on 3e38 would make +inf, one of 1e38 on -4 would make
         * -inf: another token class, not a penalty) */
        const akv_fwd_sample_row pr = {.repeat_penalty = p->repeat_penalty,
                                       .presence_penalty = p->presence_penalty,
                                       .frequency_penalty = p->frequency_penalty};
        for (uint32_t i = 0; i < n; i++)
            pl[s->pen_ids[i]] = akv_sample_penalise(&pr, pl[s->pen_ids[i]], (uint32_t)s->pen_counts[i]);
    }

    /* 2. greedy: the first of sample_cmp's order (the largest logit, ties to the smaller id),
     * read from the logits in one pass; NaN and -inf are never chosen */
    if (p->temp == 0.0f) {
        /* the pass's own greedy choice (akv_fwd_argmax_ref), so the two agree by construction */
        const int32_t best = akv_fwd_argmax_ref(lg, (uint32_t)s->n_vocab);
        if (best < 0) {
            AKV_LOG_E("sampler: every logit is NaN or -inf");
            return AKV_EINVAL;
        }
        *out_token = best;
        return AKV_OK;
    }

    /* candidates, finite logits only (NaN and -inf can never be chosen); 3. with top-k, only
     * the k first in sample_cmp's order (a total order, so the set is unique), kept in a heap
     * in one pass; then sorted */
    size_t n = 0;
    if (p->top_k > 0) {
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (!isnan(lg[i]) && lg[i] != -INFINITY) heap_offer(s->cand, &n, (size_t)p->top_k, lg[i], i);
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (!isnan(lg[i]) && lg[i] != -INFINITY) s->cand[n++] = (sample_cand){lg[i], i, 0};
    }
    if (n == 0) {
        AKV_LOG_E("sampler: every logit is NaN or -inf");
        return AKV_EINVAL;
    }
    qsort(s->cand, n, sizeof *s->cand, sample_cmp);

    /* 4. temperature and softmax; +inf logits (the limit of softmax) share all the mass */
    double max = s->cand[0].logit, sum = 0;
    if (isinf(max))
        for (size_t i = 0; i < n; i++) sum += s->cand[i].p = s->cand[i].logit == INFINITY;
    else
        for (size_t i = 0; i < n; i++) sum += s->cand[i].p = exp(((double)s->cand[i].logit - max) / p->temp);
    for (size_t i = 0; i < n; i++) s->cand[i].p /= sum;

    /* 5. top-p: smallest prefix with mass >= top_p */
    if (p->top_p < 1.0f) {
        double mass = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            mass += s->cand[i].p;
            if (mass >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }

    /* 6. min-p relative to the most likely */
    if (p->min_p > 0) {
        double floor_p = p->min_p * s->cand[0].p;
        size_t keep = 1;
        while (keep < n && s->cand[keep].p >= floor_p) keep++;
        n = keep;
    }

    /* 7. draw from the renormalised remainder */
    double total = 0;
    for (size_t i = 0; i < n; i++) total += s->cand[i].p;
    double u = akv_rng_uniform(&s->rng) * total, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += s->cand[i].p;
        if (u < acc) {
            *out_token = s->cand[i].id;
            return AKV_OK;
        }
    }
    /* rounding left u at the very top: the last candidate that has mass */
    size_t last = n - 1;
    while (last > 0 && !(s->cand[last].p > 0)) last--;
    *out_token = s->cand[last].id;
    return AKV_OK;
}
