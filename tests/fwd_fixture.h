/*
 * tests/fwd_fixture.h — forward passes over the memory layer, on either pass: the host pass
 * (akv/forward.h, direct route) or the pass on a device's queues (akv/forward_dev.h, queued
 * route), with the same pools and chunking, so tests can compare their logits step by step.
 * Most cases run one sequence: r1 is a route with its one sequence, fx_feed_route feeds it;
 * fx_feed_batch runs batch steps over several sequences of one route.
 */
#ifndef AKV_TEST_FWD_FIXTURE_H
#define AKV_TEST_FWD_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "akv/dev_pool.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
#include "akv/host_pool.h"
#include "akv/route.h"
#include "core/half.h"
#include "route/route_check.h"
#include "model_build.h"
#include "test.h"

/* A route and its one sequence. */
typedef struct r1 {
    akv_route *r;
    akv_route_seq *s;
} r1;

/* A route of one sequence over the pools (params as akv_route_create; the sequence with the
 * route's defaults). */
static inline akv_status r1_open(akv_dev *dev, akv_host_pool *hp, akv_dev_pool *dp,
                                 const akv_route_params *rp, r1 *out) {
    out->r = NULL, out->s = NULL;
    akv_status st = akv_route_create(dev, hp, dp, rp, &out->r);
    if (st) return st;
    akv_route_seq_params sp = {.tag = 1};
    if ((st = akv_route_seq_open(out->r, &sp, &out->s))) {
        (void)akv_route_destroy(out->r);
        out->r = NULL;
    }
    return st;
}

/* Closes the sequence (once) and destroys the route: AKV_EBUSY while leases are live (the
 * sequence is then closed already; call again after a sync). */
static inline akv_status r1_close(r1 *x) {
    if (!x->r) return AKV_OK;
    if (x->s) {
        akv_status st = akv_route_seq_close(x->r, x->s);
        if (st) return st;
        x->s = NULL;
    }
    akv_status st = akv_route_destroy(x->r);
    if (st == AKV_OK) x->r = NULL;
    return st;
}

static inline akv_status r1_step(r1 *x, uint64_t n_total) {
    akv_route_req q = {.seq = x->s, .n_tokens = n_total};
    return akv_route_begin_step(x->r, &q, 1);
}

static inline akv_status r1_truncate(r1 *x, uint64_t n) {
    return akv_route_seq_truncate(x->r, x->s, n);
}

static inline uint64_t r1_len(const r1 *x) {
    return akv_route_seq_n_tokens(x->s);
}

/* The route's and the sequence's stats. */
typedef struct r1_stats {
    akv_route_stats r;
    akv_route_seq_stats s;
} r1_stats;

static inline r1_stats r1_get_stats(const r1 *x) {
    r1_stats st;
    akv_route_get_stats(x->r, &st.r);
    akv_route_seq_get_stats(x->s, &st.s);
    return st;
}

typedef struct fx {
    akv_dev *dev;
    akv_geom g;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    r1 q;
    akv_forward *fh;     /* host pass (on_device false) */
    akv_forward_dev *fd; /* device pass (on_device true) */
    uint32_t n_vocab, max_step_tokens;
} fx;

static inline float fx_round_bf16(float x) {
    return akv_bf16_to_f32(akv_f32_to_bf16(x));
}

/* tm_load with every weight rounded to a bf16 value first: the device pass's bf16 copy of
 * the weights is then exact, and the passes differ only in activation rounding. */
static inline akv_model *fx_load_bf16_exact(const tm_shape *s, uint64_t seed) {
    return tm_load_rounded(s, seed, fx_round_bf16);
}

/* A device on backend be and pools of 1 GiB each for c's geometry (bf16 pages of P tokens,
 * host arenas of 64 pages); window_cap > 0 limits the device pool's window part to that many
 * pages per layer (the rest is staging reserve), to create pressure. 1 on success. */
static inline int fx_pools_open(const akv_dev_backend *be, const akv_model_config *c, uint32_t P,
                                uint32_t window_cap, akv_dev **dev, akv_geom *g,
                                akv_host_pool **hp, akv_dev_pool **dp) {
    if (!CHECK(akv_dev_create(be, NULL, dev) == AKV_OK)) return 0;
    CHECK_OK(akv_geom_init(g, c->n_layers, c->n_kv_heads, c->head_dim, AKV_DTYPE_BF16, P));
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = 1;
    hpp.arena_bytes = 64 * akv_geom_page_bytes(g);
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = 1;
    uint32_t n_pages = (uint32_t)(((size_t)1 << 30) / akv_geom_page_bytes(g));
    if (window_cap) dpp.staging_pages = n_pages - window_cap * c->n_layers;
    return CHECK(akv_host_pool_create(*dev, g, &hpp, hp) == AKV_OK) &&
           CHECK(akv_dev_pool_create(*dev, g, &dpp, dp) == AKV_OK);
}

/* Pools of 1 GiB each, a resident route for max_history, the chosen pass (the device pass
 * launching every op of a decode step by itself with no_graphs). 1 on success. */
static inline int fx_open_pass(fx *x, const akv_dev_backend *be, const akv_model *m, uint32_t P,
                               uint64_t max_history, uint32_t max_step_tokens, bool on_device,
                               bool no_graphs) {
    memset(x, 0, sizeof *x);
    const akv_model_config *c = akv_model_get_config(m);
    x->n_vocab = c->n_vocab, x->max_step_tokens = max_step_tokens;
    akv_route_params rp = {.max_history = max_history, .queued = on_device};
    akv_forward_params fp = {.max_step_tokens = max_step_tokens, .no_graphs = no_graphs};
    if (!fx_pools_open(be, c, P, 0, &x->dev, &x->g, &x->hp, &x->dp) ||
        !CHECK(r1_open(x->dev, x->hp, x->dp, &rp, &x->q) == AKV_OK))
        return 0;
    if (on_device) return CHECK(akv_forward_dev_create(x->dev, m, &fp, &x->fd) == AKV_OK);
    return CHECK(akv_forward_create(m, &fp, &x->fh) == AKV_OK);
}

static inline int fx_open(fx *x, const akv_dev_backend *be, const akv_model *m, uint32_t P,
                          uint64_t max_history, uint32_t max_step_tokens, bool on_device) {
    return fx_open_pass(x, be, m, P, max_history, max_step_tokens, on_device, false);
}

static inline void fx_close(fx *x) {
    akv_forward_destroy(x->fh);
    akv_forward_dev_destroy(x->fd);
    if (x->q.r) CHECK_OK(r1_close(&x->q));
    if (x->dp) CHECK_OK(akv_dev_pool_destroy(x->dp));
    if (x->hp) CHECK_OK(akv_host_pool_destroy(x->hp));
    if (x->dev) CHECK_OK(akv_dev_destroy(x->dev));
    memset(x, 0, sizeof *x);
}

/* Feeds n tokens at the end of the sequence's history in chunks of max_step_tokens, through the
 * device pass fd or else the host pass fh; logits of the last token (NULL = none). A failed
 * chunk is undone (akv_route_abort_step). */
static inline akv_status fx_feed_route(r1 *q, akv_forward *fh, akv_forward_dev *fd,
                                       uint32_t max_step_tokens, const int32_t *tokens, uint32_t n,
                                       float *logits) {
    akv_kv_hooks kv = akv_route_hooks(q->r);
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done < max_step_tokens ? n - done : max_step_tokens;
        float *want = done + k == n ? logits : NULL;
        uint32_t pos0 = (uint32_t)r1_len(q);
        akv_status st = r1_step(q, pos0 + k);
        if (st) return st;
        st = fd ? akv_forward_dev_run(fd, tokens + done, k, pos0, &kv, want, false)
                : akv_forward_run(fh, tokens + done, k, pos0, &kv, want, false);
        if (st) {
            akv_route_abort_step(q->r);
            return st;
        }
        done += k;
    }
    return AKV_OK;
}

/* fx_feed_route on the fixture's route and pass. */
static inline akv_status fx_feed(fx *x, const int32_t *tokens, uint32_t n, float *logits) {
    return fx_feed_route(&x->q, x->fh, x->fd, x->max_step_tokens, tokens, n, logits);
}

enum { FX_MAX_BATCH = 16 };

/* One batch step of route r: sequences seqs[n] (n <= FX_MAX_BATCH) each fed counts[i] >= 1
 * tokens (tokens[i]), ordered for the pass by count (a stable sort: the pass takes the batch
 * in non-decreasing counts); logits[i] (NULL = none wanted) gets sequence i's last token's
 * logits. A failed step is undone. */
static inline akv_status fx_batch_step(akv_route *r, akv_route_seq *const *seqs,
                                       const int32_t *const *tokens, const uint32_t *counts,
                                       uint32_t n, akv_forward *fh, akv_forward_dev *fd,
                                       uint32_t n_vocab, float *const *logits) {
    uint32_t order[FX_MAX_BATCH], n_new[FX_MAX_BATCH], pos0[FX_MAX_BATCH], total = 0, rows = 0;
    uint8_t mode[FX_MAX_BATCH];
    akv_route_req reqs[FX_MAX_BATCH];
    if (n == 0 || n > FX_MAX_BATCH) return AKV_EINVAL;
    for (uint32_t i = 0; i < n; i++) order[i] = i;
    for (uint32_t i = 1; i < n; i++) /* insertion sort: stable */
        for (uint32_t j = i; j > 0 && counts[order[j - 1]] > counts[order[j]]; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (uint32_t k = 0; k < n; k++) total += counts[order[k]];
    int32_t *tok = malloc(total * sizeof *tok);
    float *lg = malloc((size_t)n * n_vocab * sizeof *lg);
    if (!tok || !lg) {
        free(tok), free(lg);
        return AKV_ENOMEM;
    }
    for (uint32_t k = 0, t = 0; k < n; k++) {
        uint32_t i = order[k];
        n_new[k] = counts[i];
        pos0[k] = (uint32_t)akv_route_seq_n_tokens(seqs[i]);
        mode[k] = logits[i] ? AKV_FORWARD_LOGITS_LAST : AKV_FORWARD_LOGITS_NONE;
        rows += logits[i] != NULL;
        reqs[k] = (akv_route_req){.seq = seqs[i], .n_tokens = pos0[k] + counts[i]};
        memcpy(tok + t, tokens[i], counts[i] * sizeof *tok);
        t += counts[i];
    }
    akv_forward_batch b = {.n_seq = n, .n_new = n_new, .pos0 = pos0, .tokens = tok, .logits = mode};
    akv_kv_hooks kv = akv_route_hooks(r);
    akv_status st = akv_route_begin_step(r, reqs, n);
    if (st == AKV_OK) {
        float *out = rows ? lg : NULL;
        st = fd ? akv_forward_dev_step(fd, &b, &kv, out) : akv_forward_step(fh, &b, &kv, out);
        if (st) akv_route_abort_step(r);
    }
    for (uint32_t k = 0, row = 0; st == AKV_OK && k < n; k++) {
        if (!mode[k]) continue;
        memcpy(logits[order[k]], lg + (size_t)row * n_vocab, n_vocab * sizeof *lg);
        row++;
    }
    free(tok), free(lg);
    return st;
}

/* max |got - want| / max(1, max |want|); NaN or Inf in got counts as infinite. */
static inline double fx_rel_err(const float *got, const float *want, size_t n, size_t *at) {
    double scale = 1, worst = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (!(e <= worst)) worst = e, *at = i;
    }
    return worst / scale;
}

/* Loud comparison: prints the worst element on failure. */
static inline int fx_close_to(const float *got, const float *want, size_t n, double tol,
                              const char *what) {
    size_t at;
    double e = fx_rel_err(got, want, n, &at);
    int ok = e <= tol;
    TEST_CHECK_(ok, "%s: relative error %.3g at [%zu] (got %.6f want %.6f; tolerance %.3g)", what,
                e, at, (double)got[at], (double)want[at], tol);
    return ok;
}

/* Index of the largest logit, and the gap to the second largest. */
static inline int32_t fx_argmax(const float *l, size_t n, double *margin) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    double second = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (i != best && l[i] > second) second = l[i];
    if (margin) *margin = (double)l[best] - second;
    return (int32_t)best;
}

/* Decode steps replayed as graphs against the same steps launched op by op (params.no_graphs):
 * two device passes of `m` on backend `be`, each over its own resident route (page size P),
 * a prompt of n_prompt random tokens, then n_decode greedy steps that both follow the eager
 * pass's tokens. Checked: the logits bit-identical at every step; on the host backend, the
 * graph pass's host copy equals its device pages after every step; the graph pass built ONE
 * graph (its record never changed, page boundaries included) and launched it at every decode
 * step, the eager pass none. Prints one line; returns 1 when everything held. */
static inline int fx_graph_vs_eager(const akv_dev_backend *be, const akv_model *m, uint32_t P,
                                    uint32_t n_prompt, uint32_t n_decode, uint64_t *rng) {
    const akv_model_config *c = akv_model_get_config(m);
    fx gr = {0}, ea = {0};
    uint32_t n_total = n_prompt + n_decode, chunk = 64;
    int ok = fx_open(&gr, be, m, P, n_total, chunk, true) &&
             fx_open_pass(&ea, be, m, P, n_total, chunk, true, true); /* eager: graphs off */
    int32_t *tok = malloc(n_total * sizeof *tok);
    float *lg = malloc(c->n_vocab * sizeof *lg), *le = malloc(c->n_vocab * sizeof *le);
    ok = ok && CHECK(tok && lg && le);
    for (uint32_t i = 0; ok && i < n_prompt; i++)
        tok[i] = (int32_t)test_rand_below(rng, c->n_vocab);
    uint32_t pos = 0, n = n_prompt, bad_step = UINT32_MAX;
    while (ok && pos < n_total) {
        ok = CHECK(fx_feed(&gr, tok + pos, n, lg) == AKV_OK) &&
             CHECK(fx_feed(&ea, tok + pos, n, le) == AKV_OK);
        if (ok && memcmp(lg, le, c->n_vocab * sizeof *lg) && bad_step == UINT32_MAX)
            bad_step = pos;
        if (ok && be == akv_dev_host_backend()) /* the write-backs after the graph landed */
            ok = CHECK(akv_route_sync(gr.q.r) == AKV_OK) && CHECK(akv__route_check(gr.q.r) == AKV_OK);
        pos += n;
        if (pos < n_total) tok[pos] = fx_argmax(le, c->n_vocab, NULL);
        n = 1;
    }
    akv_forward_dev_stats sg = {0}, se = {0};
    if (gr.fd) sg = akv_forward_dev_get_stats(gr.fd);
    if (ea.fd) se = akv_forward_dev_get_stats(ea.fd);
    TEST_CHECK_(bad_step == UINT32_MAX, "graph vs eager: logits differ after %u tokens", bad_step);
    TEST_CHECK_(sg.graph_builds == 1 && sg.graph_launches == n_decode,
                "graph pass: %llu build(s), %llu launch(es) for %u decode steps",
                (unsigned long long)sg.graph_builds, (unsigned long long)sg.graph_launches,
                n_decode);
    CHECK_EQ_U64(se.graph_launches, 0);
    int held = ok && bad_step == UINT32_MAX && sg.graph_builds == 1 &&
               sg.graph_launches == n_decode && se.graph_launches == 0;
    printf("  %s, P = %u: prompt %u + %u decode steps, graph replay vs op by op: %s (%llu "
           "graph build(s), %llu launches)\n",
           c->arch_name, P, n_prompt, n_decode, held ? "bit-identical" : "FAILED",
           (unsigned long long)sg.graph_builds, (unsigned long long)sg.graph_launches);
    free(tok), free(lg), free(le);
    fx_close(&gr), fx_close(&ea);
    return held;
}

#endif
