/*
 * tests/route_cells.h — THE BITWISE CELLS (DESIGN.md, route 2): the staged route against the
 * resident route, logits bit-identical at every step of a greedy run, for a set of prompt
 * lengths and sequence counts, on any backend and either pass:
 *   host pass     akv/forward.h over direct routes (host backend only);
 *   device pass   akv/forward_dev.h over queued routes (host backend or CUDA).
 *
 * One cell = (prompt length L, sequences S). Both route sets run in lockstep on the same
 * device and the same pass object, each over its own pools: the resident set in a roomy
 * device pool, the staged set with a window of rc.window pages per layer and ONE stage shared
 * by its S routes (slots sized by akv_route_slot_pages, poisoned whenever they change hands,
 * so an attention that ran before its copies read poison). Each sequence has its own prompt
 * (random tokens), prefilled in chunks of the pass's max_chunk; then n_gen greedy steps,
 * round-robin over the sequences, each step resident first, then staged. Checked:
 *   - the logits of every prefill's last token and every decode step: bit-identical;
 *   - the greedy tokens therefore agree (each route follows its own argmax);
 *   - after akv_route_sync, every used row of every host page of every layer: byte-identical
 *     between the two host copies (the authoritative copies agree);
 *   - the staged set actually staged bytes (its window excluded pages): staged_bytes > 0.
 * Prints one line per cell and returns the number of cells that held.
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

#define RC_MAX_SEQ 4

typedef struct rc_params {
    akv_dev *dev;        /* the device both sets run on */
    akv_forward *fh;     /* host pass (direct routes), or */
    akv_forward_dev *fd; /* device pass (queued routes) */
    uint32_t n_layers, n_kv_heads, head_dim, n_vocab;
    akv_dtype dtype;      /* K/V pages */
    uint32_t page_tokens; /* P */
    uint32_t window;      /* staged window pages per layer */
    uint32_t max_chunk;   /* prefill chunk (the pass's max_chunk) */
    uint32_t n_gen;       /* greedy decode steps per sequence */
    uint32_t device_gib;  /* each set's device pool */
    uint64_t seed;
} rc_params;

typedef struct rc_set {
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_stage *stage; /* staged set only */
    akv_route *r[RC_MAX_SEQ];
} rc_set;

static inline void rc_set_close(rc_set *s, uint32_t n_seq) {
    for (uint32_t i = 0; i < n_seq; i++)
        if (s->r[i]) {
            CHECK_OK(akv_route_sync(s->r[i]));
            CHECK_OK(akv_route_destroy(s->r[i]));
        }
    if (s->stage) CHECK_OK(akv_stage_destroy(s->stage));
    if (s->dp) CHECK_OK(akv_dev_pool_destroy(s->dp));
    if (s->hp) CHECK_OK(akv_host_pool_destroy(s->hp));
    memset(s, 0, sizeof *s);
}

static inline int rc_set_open(rc_set *s, const rc_params *p, const akv_geom *g, bool staged,
                              uint32_t n_seq, uint64_t max_tokens) {
    memset(s, 0, sizeof *s);
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = 4;
    hpp.arena_bytes = 64 * akv_geom_page_bytes(g);
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = p->device_gib;
    uint32_t slot = akv_route_slot_pages(g, max_tokens, p->window);
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
    akv_route_params rp = {.kind = staged ? AKV_ROUTE_STAGED : AKV_ROUTE_RESIDENT,
                           .max_tokens = max_tokens,
                           .queued = p->fd != NULL,
                           .window_pages = p->window,
                           .stage = s->stage,
                           /* one sequence: it alone uses the stage, so it may prefetch the
                            * next step's layer 0 (route.h); several share it: off */
                           .prefetch = n_seq == 1 ? 1 : -1};
    for (uint32_t i = 0; i < n_seq; i++) {
        rp.tag = i + 1;
        if (!CHECK(akv_route_create(p->dev, s->hp, s->dp, &rp, &s->r[i]) == AKV_OK)) return 0;
    }
    return 1;
}

/* Runs tokens[n] at the end of sequence i's history, in chunks; logits of the last one. */
static inline akv_status rc_feed(const rc_params *p, rc_set *s, uint32_t i, const int32_t *tok,
                                 uint32_t n, float *logits) {
    return fx_feed_route(s->r[i], p->fh, p->fd, p->max_chunk, tok, n, logits);
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

/* One cell; 1 when it held (every check above). */
static inline int rc_cell(const rc_params *p, uint32_t prompt, uint32_t n_seq) {
    akv_geom g;
    if (!CHECK(akv_geom_init(&g, p->n_layers, p->n_kv_heads, p->head_dim, p->dtype,
                             p->page_tokens) == AKV_OK))
        return 0;
    uint64_t max_tokens = (uint64_t)prompt + p->n_gen;
    rc_set res, stg;
    float *lr = malloc((size_t)p->n_vocab * sizeof(float));
    float *ls = malloc((size_t)p->n_vocab * sizeof(float));
    int32_t *tok = malloc((size_t)prompt * n_seq * sizeof(int32_t));
    int ok = lr && ls && tok;
    ok = ok && rc_set_open(&res, p, &g, false, n_seq, max_tokens) &&
         rc_set_open(&stg, p, &g, true, n_seq, max_tokens);
    uint64_t rng = p->seed ^ ((uint64_t)prompt << 20) ^ n_seq;
    for (size_t i = 0; ok && i < (size_t)prompt * n_seq; i++)
        tok[i] = (int32_t)test_rand_below(&rng, p->n_vocab);
    uint32_t bad_step = UINT32_MAX, n_steps = 0;
    int32_t next[RC_MAX_SEQ][2];
    double t0 = akv_clock_s();
    /* prefill each sequence, then n_gen greedy steps round-robin; step 0 is the prefill */
    for (uint32_t step = 0; ok && step < p->n_gen && bad_step == UINT32_MAX; step++) {
        for (uint32_t i = 0; ok && i < n_seq; i++) {
            const int32_t *in_r = step ? &next[i][0] : tok + (size_t)i * prompt;
            const int32_t *in_s = step ? &next[i][1] : tok + (size_t)i * prompt;
            uint32_t n = step ? 1 : prompt;
            ok &= CHECK(rc_feed(p, &res, i, in_r, n, lr) == AKV_OK);
            ok &= CHECK(rc_feed(p, &stg, i, in_s, n, ls) == AKV_OK);
            if (!ok) break;
            n_steps++;
            if (memcmp(lr, ls, (size_t)p->n_vocab * sizeof(float)) != 0 && bad_step == UINT32_MAX) {
                uint32_t at = 0;
                while (lr[at] == ls[at] || (isnan(lr[at]) && isnan(ls[at])))
                    at++;
                printf("    cell L=%u S=%u: sequence %u step %u: logits differ first at [%u] "
                       "(resident %.9g, staged %.9g)\n",
                       prompt, n_seq, i, step, at, (double)lr[at], (double)ls[at]);
                bad_step = step;
            }
            next[i][0] = fx_argmax(lr, p->n_vocab, NULL);
            next[i][1] = fx_argmax(ls, p->n_vocab, NULL);
        }
    }
    uint64_t host_bad = 0, staged = 0, prefetched = 0;
    for (uint32_t i = 0; ok && i < n_seq; i++) {
        ok &= CHECK(akv_route_sync(res.r[i]) == AKV_OK && akv_route_sync(stg.r[i]) == AKV_OK);
        host_bad += rc_host_diff(&g, res.hp, akv_route_host_table(res.r[i]), stg.hp,
                                 akv_route_host_table(stg.r[i]));
        akv_route_stats rs;
        akv_route_get_stats(stg.r[i], &rs);
        staged += rs.staged_bytes;
        prefetched += rs.n_prefetched;
    }
    /* queued, one sequence: a decode step that stages pages and stays inside its page is
     * prefetched at the end of the step before it; the run has such steps once its history
     * outgrows the window by two tokens */
    const bool want_pf =
        p->fd && n_seq == 1 && (uint64_t)prompt + p->n_gen >= (uint64_t)p->window * p->page_tokens + 3;
    int held = ok && bad_step == UINT32_MAX && host_bad == 0 && staged > 0 && (!want_pf || prefetched > 0);
    printf("  cell L=%u S=%u: %s (%u runs compared, %.1f MiB staged, %llu steps prefetched, "
           "%llu host rows differ, %.1f s)\n",
           prompt, n_seq, held ? "bit-identical" : "FAILED", n_steps, (double)staged / (1 << 20),
           (unsigned long long)prefetched, (unsigned long long)host_bad, akv_clock_s() - t0);
    if (want_pf) TEST_CHECK_(prefetched > 0, "L=%u S=1: no step was prefetched", prompt);
    TEST_CHECK_(bad_step == UINT32_MAX, "L=%u S=%u: staged logits differ at step %u", prompt, n_seq,
                bad_step);
    TEST_CHECK_(host_bad == 0, "L=%u S=%u: %llu host rows differ", prompt, n_seq,
                (unsigned long long)host_bad);
    TEST_CHECK_(staged > 0, "L=%u S=%u: nothing was staged (the window held every page)", prompt,
                n_seq);
    rc_set_close(&stg, n_seq);
    rc_set_close(&res, n_seq);
    free(lr), free(ls), free(tok);
    return held;
}

/* Every cell of the issue: prompts 1, P-1, P, P+1, 3P+5 and `long_prompt`, with 1 and with
 * RC_MAX_SEQ sequences. Prints and returns "k of k cells". */
static inline int rc_cells(const rc_params *p, uint32_t long_prompt, const char *what) {
    uint32_t P = p->page_tokens;
    uint32_t prompts[6] = {1, P - 1, P, P + 1, 3 * P + 5, long_prompt};
    uint32_t seqs[2] = {1, RC_MAX_SEQ};
    int k = 0, n = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 6; i++, n++)
            k += rc_cell(p, prompts[i], seqs[s]);
    printf("%s: %d of %d cells bit-identical (staged vs resident, %u greedy steps, P = %u, "
           "window %u pages)\n",
           what, k, n, p->n_gen, P, p->window);
    return k == n;
}

#endif
