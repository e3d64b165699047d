/*
 * tests/route_cells.h — THE BITWISE CELLS (docs/design.md, route 2): the staged route against
 * the resident route, logits bit-identical at every step of a greedy run, for a set of prompt
 * lengths, sequence counts and batch shapes, on any backend and either pass:
 *   host pass     akv/forward.h over direct routes (host backend only);
 *   device pass   akv/forward_dev.h over queued routes (host backend or CUDA).
 *
 * One cell = (prompt length L, sequences S, batched or not). Both sets run in lockstep on the
 * same device and the same pass object, each ONE route of S sequences over its own pools: the
 * resident set in a roomy device pool, the staged set with a window of rc.window pages per
 * layer and a stage of its own (slots sized by akv_route_slot_pages, poisoned whenever they
 * change hands, so an attention that ran before its copies read poison; prefetch on: the route
 * is the stage's only user). Each sequence has its own prompt (random tokens). Not batched: each
 * sequence is prefilled in chunks of the pass's max_step_tokens and stepped alone, round-robin (the
 * others idle). Batched: every step is ONE batch step of all S sequences, the prompts in
 * chunks of max_step_tokens / S each, then every decode step all S at once. Then n_gen greedy steps.
 * Checked:
 *   - the logits of every prefill's last token and every decode step: bit-identical;
 *   - the greedy tokens therefore agree (each route follows its own argmax);
 *   - after akv_route_sync, every used row of every host page of every layer: byte-identical
 *     between the two host copies (the authoritative copies agree);
 *   - the staged set actually staged bytes (its window excluded pages): staged_bytes > 0.
 * Prints one line per cell and returns the number of cells that held.
 *
 * With host_share > 0 the second set is the host-attended route instead (the host's cores
 * attend that share of the pages outside the window in decode steps, merged with the device's
 * parts): its arithmetic differs (the host part's order of summation), so the cell holds its
 * logits within a tolerance of the resident set's, feeds both sets the resident set's greedy
 * token (so a near tie cannot send them down different texts), checks the route's walker
 * after the run in place of byte-equal host copies (a later layer's rows carry the earlier
 * layers' rounding), and asks that the host attended bytes.
 */
#ifndef AKV_TESTS_ROUTE_CELLS_H
#define AKV_TESTS_ROUTE_CELLS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "test.h"
#include "fwd_fixture.h" /* fx_feed_route, fx_argmax */

#include "akv/dev_pool.h"
#include "akv/forward.h"
#include "akv/forward_dev.h"
#include "akv/host_pool.h"
#include "akv/host_table.h"
#include "akv/route.h"
#include "akv/stage.h"
#include "core/clock.h"
#include "route/route_check.h"

#define RC_MAX_SEQ 4

typedef struct rc_params {
    akv_dev *dev;        /* the device both sets run on */
    akv_forward *fh;     /* host pass (direct routes), or */
    akv_forward_dev *fd; /* device pass (queued routes) */
    uint32_t n_layers, n_kv_heads, head_dim, n_vocab;
    akv_dtype dtype;      /* K/V pages */
    uint32_t page_tokens; /* P */
    uint32_t window;      /* staged window pages per layer */
    uint32_t max_step_tokens;   /* prefill chunk (the pass's max_step_tokens) */
    uint32_t n_gen;       /* greedy decode steps per sequence */
    uint32_t device_gib;  /* each set's device pool */
    uint64_t seed;
    float host_share;     /* > 0: the second set is the host-attended route with this share */
} rc_params;

typedef struct rc_set {
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_stage *stage; /* staged set only */
    akv_route *r;
    akv_route_seq *s[RC_MAX_SEQ];
} rc_set;

static inline void rc_set_close(rc_set *s, uint32_t n_seq) {
    if (s->r) CHECK_OK(akv_route_sync(s->r));
    for (uint32_t i = 0; i < n_seq; i++)
        if (s->s[i]) CHECK_OK(akv_route_seq_close(s->r, s->s[i]));
    if (s->r) CHECK_OK(akv_route_destroy(s->r));
    if (s->stage) CHECK_OK(akv_stage_destroy(s->stage));
    if (s->dp) CHECK_OK(akv_dev_pool_destroy(s->dp));
    if (s->hp) CHECK_OK(akv_host_pool_destroy(s->hp));
    memset(s, 0, sizeof *s);
}

static inline int rc_set_open(rc_set *s, const rc_params *p, const akv_geom *g, bool staged,
                              uint32_t n_seq, uint64_t max_history) {
    memset(s, 0, sizeof *s);
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = 4;
    hpp.arena_bytes = 64 * akv_geom_page_bytes(g);
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = p->device_gib;
    uint32_t slot = akv_route_slot_pages(g, max_history, p->window, n_seq);
    if (staged) dpp.staging_pages = 2 * slot;
    if (!CHECK(akv_host_pool_create(p->dev, g, &hpp, &s->hp) == AKV_OK) ||
        !CHECK(akv_dev_pool_create(p->dev, g, &dpp, &s->dp) == AKV_OK))
        return 0;
    if (staged) {
        akv_stage_params sp = akv_stage_default_params();
        sp.slot_pages = slot;
        sp.poison_byte = 0xA5; /* a read one event too early reads poison */
        if (!CHECK(akv_stage_create(p->dev, s->hp, s->dp, &sp, &s->stage) == AKV_OK)) return 0;
    }
    akv_route_params rp = {.kind = !staged ? AKV_ROUTE_RESIDENT
                                   : p->host_share > 0 ? AKV_ROUTE_HOST
                                                       : AKV_ROUTE_STAGED,
                           .host_share = staged ? p->host_share : 0.0f,
                           .host_threads = 2,
                           .max_history = max_history,
                           .max_seqs = n_seq,
                           .queued = p->fd != NULL,
                           .window_pages = p->window,
                           .stage = s->stage,
                           .prefetch = 1}; /* the stage's only user (route.h) */
    if (!CHECK(akv_route_create(p->dev, s->hp, s->dp, &rp, &s->r) == AKV_OK)) return 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        akv_route_seq_params sq = {.tag = i + 1};
        if (!CHECK(akv_route_seq_open(s->r, &sq, &s->s[i]) == AKV_OK)) return 0;
    }
    return 1;
}

/* Runs tokens[n] at the end of sequence i's history alone, in chunks; logits of the last one. */
static inline akv_status rc_feed(const rc_params *p, rc_set *s, uint32_t i, const int32_t *tok,
                                 uint32_t n, float *logits) {
    r1 q = {.r = s->r, .s = s->s[i]};
    return fx_feed_route(&q, p->fh, p->fd, p->max_step_tokens, tok, n, logits);
}

/* One batch step of every sequence: seq i fed n[i] tokens from tok[i] (n[i] = 0: not in the
 * step); logits[i] (NULL: none) of its last one. */
static inline akv_status rc_batch(const rc_params *p, rc_set *s, uint32_t n_seq,
                                  const int32_t *const *tok, const uint32_t *n,
                                  float *const *logits) {
    akv_route_seq *seqs[RC_MAX_SEQ];
    const int32_t *t[RC_MAX_SEQ];
    uint32_t cnt[RC_MAX_SEQ], k = 0;
    float *lg[RC_MAX_SEQ];
    for (uint32_t i = 0; i < n_seq; i++)
        if (n[i]) seqs[k] = s->s[i], t[k] = tok[i], cnt[k] = n[i], lg[k++] = logits[i];
    return fx_batch_step(s->r, seqs, t, cnt, k, p->fh, p->fd, p->n_vocab, lg);
}

/* Used rows of every host page of two host copies of the same length: rows that differ. */
static inline uint64_t rc_host_diff(const akv_geom *g, akv_host_pool *ha, const akv_host_table *ta,
                                    akv_host_pool *hb, const akv_host_table *tb) {
    uint64_t n = akv_host_table_n_tokens(ta), bad = 0;
    if (n != akv_host_table_n_tokens(tb)) return UINT64_MAX;
    uint32_t P = g->page_tokens;
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype);
    for (uint32_t l = 0; l < g->n_layers; l++)
        for (uint64_t t = 0; t < n; t++) {
            const uint8_t *a = akv_host_pool_page_addr(ha, akv_host_table_page(ta, l, t / P));
            const uint8_t *b = akv_host_pool_page_addr(hb, akv_host_table_page(tb, l, t / P));
            for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
                size_t off = ((size_t)kvh * P + t % P) * row;
                if (memcmp(a + off, b + off, row)) {
                    bad++;
                    break;
                }
            }
        }
    return bad;
}

/* The first index where two logit rows differ (NaNs equal). */
static inline uint32_t rc_first_diff(const float *a, const float *b) {
    uint32_t at = 0;
    while (a[at] == b[at] || (isnan(a[at]) && isnan(b[at])))
        at++;
    return at;
}

/* Host-attended cells: the first index where two logit rows are farther apart than the
 * tolerance (n when none is). The tolerance is what the device pass's rounding does, not the
 * host part's: its attention output is rounded to bf16, a last-bit flip goes into the next
 * layer's K/V rows, and those stay in the history (measured: 0.039 at most over every cell;
 * the host pass, which keeps f32, 0.0021), while a host part dropped from the merge moves
 * logits by up to 6.8. */
static inline uint32_t rc_far(const float *a, const float *b, uint32_t n) {
    uint32_t at = 0;
    while (at < n && fabsf(a[at] - b[at]) <= 6e-2f + 2e-2f * fabsf(a[at])) at++;
    return at;
}

/* One cell; 1 when it held (every check above). */
static inline int rc_cell(const rc_params *p, uint32_t prompt, uint32_t n_seq, bool batched) {
    akv_geom g;
    if (!CHECK(akv_geom_init(&g, p->n_layers, p->n_kv_heads, p->head_dim, p->dtype,
                             p->page_tokens) == AKV_OK))
        return 0;
    uint64_t max_history = (uint64_t)prompt + p->n_gen;
    rc_set res, stg;
    float *lr = malloc((size_t)p->n_vocab * RC_MAX_SEQ * sizeof(float));
    float *ls = malloc((size_t)p->n_vocab * RC_MAX_SEQ * sizeof(float));
    int32_t *tok = malloc((size_t)prompt * n_seq * sizeof(int32_t));
    int ok = lr && ls && tok;
    ok = ok && rc_set_open(&res, p, &g, false, n_seq, max_history) &&
         rc_set_open(&stg, p, &g, true, n_seq, max_history);
    uint64_t rng = p->seed ^ ((uint64_t)prompt << 20) ^ n_seq ^ ((uint64_t)batched << 40);
    for (size_t i = 0; ok && i < (size_t)prompt * n_seq; i++)
        tok[i] = (int32_t)test_rand_below(&rng, p->n_vocab);
    uint32_t bad_step = UINT32_MAX, n_steps = 0, n_agree = 0, n_choices = 0;
    const bool host = p->host_share > 0;
    int32_t next[RC_MAX_SEQ][2];
    double t0 = akv_clock_s();
    /* prefill each sequence, then n_gen greedy steps; step 0 is the prefill */
    for (uint32_t step = 0; ok && step < p->n_gen && bad_step == UINT32_MAX; step++) {
        if (batched) {
            /* ONE batch step of every sequence per round: the prompts in chunks of
             * max_step_tokens / n_seq each (the last chunk of each asks for its logits), then the
             * decode tokens all at once */
            uint32_t quota = p->max_step_tokens / n_seq ? p->max_step_tokens / n_seq : 1;
            uint32_t done = 0;
            do {
                const int32_t *tr[RC_MAX_SEQ], *ts[RC_MAX_SEQ];
                uint32_t cnt[RC_MAX_SEQ];
                float *wr[RC_MAX_SEQ], *ws[RC_MAX_SEQ];
                for (uint32_t i = 0; i < n_seq; i++) {
                    uint32_t left = step ? 1 : prompt - done;
                    cnt[i] = left < quota || step ? left : quota;
                    tr[i] = step ? &next[i][0] : tok + (size_t)i * prompt + done;
                    ts[i] = step ? &next[i][1] : tok + (size_t)i * prompt + done;
                    bool last = step || done + cnt[i] == prompt;
                    wr[i] = last ? lr + (size_t)i * p->n_vocab : NULL;
                    ws[i] = last ? ls + (size_t)i * p->n_vocab : NULL;
                }
                ok &= CHECK(rc_batch(p, &res, n_seq, tr, cnt, wr) == AKV_OK);
                ok &= CHECK(rc_batch(p, &stg, n_seq, ts, cnt, ws) == AKV_OK);
                done += cnt[0];
            } while (ok && step == 0 && done < prompt);
            n_steps++;
        } else {
            for (uint32_t i = 0; ok && i < n_seq; i++) {
                const int32_t *in_r = step ? &next[i][0] : tok + (size_t)i * prompt;
                const int32_t *in_s = step ? &next[i][1] : tok + (size_t)i * prompt;
                uint32_t n = step ? 1 : prompt;
                ok &= CHECK(rc_feed(p, &res, i, in_r, n, lr + (size_t)i * p->n_vocab) == AKV_OK);
                ok &= CHECK(rc_feed(p, &stg, i, in_s, n, ls + (size_t)i * p->n_vocab) == AKV_OK);
                n_steps++;
            }
        }
        for (uint32_t i = 0; ok && i < n_seq; i++) {
            const float *a = lr + (size_t)i * p->n_vocab, *b = ls + (size_t)i * p->n_vocab;
            const bool differ = host ? rc_far(a, b, p->n_vocab) < p->n_vocab
                                     : memcmp(a, b, (size_t)p->n_vocab * sizeof(float)) != 0;
            if (differ && bad_step == UINT32_MAX) {
                uint32_t at = host ? rc_far(a, b, p->n_vocab) : rc_first_diff(a, b);
                printf("    cell L=%u S=%u%s: sequence %u step %u: logits differ first at [%u] "
                       "(resident %.9g, staged %.9g)\n",
                       prompt, n_seq, batched ? " batched" : "", i, step, at, (double)a[at],
                       (double)b[at]);
                bad_step = step;
            }
            next[i][0] = fx_argmax(a, p->n_vocab, NULL);
            next[i][1] = host ? next[i][0] : fx_argmax(b, p->n_vocab, NULL);
            n_agree += host && fx_argmax(b, p->n_vocab, NULL) == next[i][0];
            n_choices++;
        }
    }
    uint64_t host_bad = 0, staged = 0, prefetched = 0, host_bytes = 0;
    ok &= CHECK(akv_route_sync(res.r) == AKV_OK && akv_route_sync(stg.r) == AKV_OK);
    for (uint32_t i = 0; ok && !host && i < n_seq; i++)
        host_bad += rc_host_diff(&g, res.hp, akv_route_seq_host_table(res.s[i]), stg.hp,
                                 akv_route_seq_host_table(stg.s[i]));
    akv_dev_info di;
    const bool host_dev = akv_dev_get_info(p->dev, &di) == AKV_OK && di.is_host;
    if (ok && host && host_dev) ok &= CHECK(akv__route_check(stg.r) == AKV_OK); /* reads the device as host memory */
    if (ok) {
        akv_route_stats rs;
        akv_route_get_stats(stg.r, &rs);
        staged = rs.staged_bytes;
        prefetched = rs.n_prefetched;
        host_bytes = rs.host_bytes;
    }
    /* queued, one sequence or a batch: a decode step that stages pages and stays inside its
     * pages is prefetched at the end of the step before it; the run has such steps once its
     * histories outgrow the window by two tokens */
    const bool want_pf = !host && p->fd && (n_seq == 1 || batched) &&
                         (uint64_t)prompt + p->n_gen >= (uint64_t)p->window * p->page_tokens + 3;
    /* host-attended: decode steps with a page outside the window of a page's worth */
    const bool want_host = host && (uint64_t)prompt + p->n_gen > (uint64_t)(p->window + 1) * p->page_tokens;
    const bool moved = host ? !want_host || host_bytes > 0 : staged > 0;
    const bool agree = !host || n_agree * 20 >= n_choices * 19; /* the greedy token: 95 % */
    int held = ok && bad_step == UINT32_MAX && host_bad == 0 && moved && agree &&
               (!want_pf || prefetched > 0);
    printf("  cell L=%u S=%u%s: %s (%u steps compared, %.1f MiB staged, %.1f MiB attended on the "
           "host, %llu steps prefetched, %llu host rows differ, greedy agreed %u of %u, %.1f s)\n",
           prompt, n_seq, batched ? " batched" : "",
           !held ? "FAILED" : host ? "within tolerance" : "bit-identical", n_steps,
           (double)staged / (1 << 20), (double)host_bytes / (1 << 20),
           (unsigned long long)prefetched, (unsigned long long)host_bad, n_agree, n_choices,
           akv_clock_s() - t0);
    TEST_CHECK_(agree, "L=%u S=%u: the greedy token agreed %u times of %u", prompt, n_seq, n_agree,
                n_choices);
    if (want_pf) TEST_CHECK_(prefetched > 0, "L=%u S=%u: no step was prefetched", prompt, n_seq);
    TEST_CHECK_(bad_step == UINT32_MAX, "L=%u S=%u: %s logits differ at step %u", prompt, n_seq,
                host ? "host-attended" : "staged", bad_step);
    TEST_CHECK_(host_bad == 0, "L=%u S=%u: %llu host rows differ", prompt, n_seq,
                (unsigned long long)host_bad);
    TEST_CHECK_(moved, "L=%u S=%u: nothing was %s", prompt, n_seq,
                host ? "attended on the host" : "staged (the window held every page)");
    rc_set_close(&stg, n_seq);
    rc_set_close(&res, n_seq);
    free(lr), free(ls), free(tok);
    return held;
}

/* Every cell: prompts 1, P-1, P, P+1, 3P+5 and `long_prompt`, with 1 sequence, with
 * RC_MAX_SEQ stepped one at a time, and with RC_MAX_SEQ in batch steps. Prints and returns
 * "k of k cells". */
static inline int rc_cells(const rc_params *p, uint32_t long_prompt, const char *what) {
    uint32_t P = p->page_tokens;
    uint32_t prompts[6] = {1, P - 1, P, P + 1, 3 * P + 5, long_prompt};
    const struct { uint32_t n_seq; bool batched; } shapes[3] = {{1, false}, {RC_MAX_SEQ, false},
                                                                {RC_MAX_SEQ, true}};
    int k = 0, n = 0;
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 6; i++, n++)
            k += rc_cell(p, prompts[i], shapes[s].n_seq, shapes[s].batched);
    if (p->host_share > 0)
        printf("%s: %d of %d cells within tolerance (host-attended, share %.2f, vs resident, %u "
               "greedy steps, P = %u, window %u pages)\n",
               what, k, n, (double)p->host_share, p->n_gen, P, p->window);
    else
        printf("%s: %d of %d cells bit-identical (staged vs resident, %u greedy steps, P = %u, "
               "window %u pages)\n",
               what, k, n, p->n_gen, P, p->window);
    return k == n;
}

#endif
