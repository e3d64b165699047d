/*
 * tests/stage_cases.h — the staging lifecycle tests, for any backend: included by
 * test_stage.c (host backend: delays, execution faults, negative controls) and
 * gpu/test_stage_cuda.c (the same lifecycle on the device).
 *
 * The model the randomized run keeps. A context has a seed, a host table (the authoritative
 * copy, every layer), and per layer two device window pages held by the test: the sink
 * (logical page 0) and the tail (the newest page). Pages in between are staged each step.
 * Each step, every live context gains 1..(room in its tail page) tokens; each layer is one
 * lease: begin (owners = the tail host pages), copy the middle pages, attend with the probe
 * op (it writes the new rows into the tail page, then checksums exactly tokens [0, n) of
 * every sequence through its page list), write back the new rows, seal. Leases are retired
 * at random later times, so sealed-but-unretired predecessors, prior readers and pending
 * write-backs (RAW) are the common case. Contexts finish (their host copy is checked row by
 * row), are cancelled (one owner, or a whole lease), and new ones take their pages.
 * Device window pages are reused only after the leases that touched them retired.
 */
#ifndef AKV_TESTS_STAGE_CASES_H
#define AKV_TESTS_STAGE_CASES_H

#include "test.h"

#include "akv/host_table.h"
#include "akv/testing/dev_faults.h"
#include "core/assert.h"
#include "core/clock.h"
#include "akv/log.h"
#include "akv/stage.h"
#include "akv/testing/stage_probe.h"
#include "mem/mem_check.h"
#include "stage/stage_check.h"

#define SC_MAX_LAYERS  4
#define SC_MAX_CTX     8 /* context records */
#define SC_MAX_BATCH   4 /* contexts per step */
#define SC_MAX_PENDING 16
#define SC_N_WIN       (SC_MAX_CTX * SC_MAX_LAYERS * 3) /* window page ids the fixture tracks */

typedef struct sc_params {
    const akv_dev_backend *backend;
    uint32_t n_layers, n_kv_heads, head_dim, page_tokens;
    uint32_t n_slots, slot_pages;
    int poison;            /* poison byte or -1 */
    uint32_t max_tokens;   /* per context */
    size_t arena_bytes;    /* host pool arena */
    uint32_t delay_us;     /* host backend: random queue delays up to this; 0 = none */
    uint32_t delay_one_in; /* ... for one command in this many */
    uint64_t delay_seed;
    int split_attend;      /* attend through ready, the caller's launch, attended (sc_attend) */
} sc_params;

typedef struct sc_fx {
    sc_params p;
    akv_dev *dev;
    akv_geom g;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_stage *st;
    akv_dptr result; /* the probe's uint64_t[4] */
    uint32_t win_all[SC_N_WIN];
    uint32_t win_free[SC_N_WIN];
    uint32_t n_win, n_win_free;
} sc_fx;


/* Creates the device, pools, stage and the test's window pages (from the staging reserve). */
static inline int sc_open(sc_fx *f, const sc_params *p) {
    memset(f, 0, sizeof *f);
    f->p = *p;
    if (akv_dev_create(p->backend, NULL, &f->dev) != AKV_OK) return 0;
    if (p->delay_us &&
        !REQUIRE_OK(akv_dev_inject_delays(f->dev, p->delay_seed, p->delay_us, p->delay_one_in)))
        return 0;
    if (!REQUIRE_OK(akv_geom_init(&f->g, p->n_layers, p->n_kv_heads, p->head_dim, AKV_DTYPE_BF16,
                                  p->page_tokens)))
        return 0;
    akv_host_pool_params hpp = akv_host_pool_default_params();
    hpp.limit_gib = 1;
    hpp.arena_bytes = p->arena_bytes;
    if (!REQUIRE_OK(akv_host_pool_create(f->dev, &f->g, &hpp, &f->hp))) return 0;
    akv_dev_pool_params dpp = akv_dev_pool_default_params();
    dpp.device_gib = 1;
    f->n_win = SC_N_WIN;
    dpp.staging_pages = p->n_slots * p->slot_pages + f->n_win;
    if (!REQUIRE_OK(akv_dev_pool_create(f->dev, &f->g, &dpp, &f->dp))) return 0;
    if (!REQUIRE_OK(akv_dev_pool_staging_acquire(f->dp, f->n_win, f->win_all))) return 0;
    memcpy(f->win_free, f->win_all, sizeof f->win_all);
    f->n_win_free = f->n_win;
    akv_stage_params sp = akv_stage_default_params();
    sp.n_slots = p->n_slots;
    sp.slot_pages = p->slot_pages;
    sp.poison_byte = p->poison;
    if (!REQUIRE_OK(akv_stage_create(f->dev, f->hp, f->dp, &sp, &f->st))) return 0;
    if (!REQUIRE_OK(akv_dev_mem_alloc(f->dev, 4 * sizeof(uint64_t), &f->result))) return 0;
    return REQUIRE_OK(akv_dev_memset_sync(f->dev, f->result, 0, 4 * sizeof(uint64_t)));
}

/* Tears everything down; every destroy must succeed (no lease or page may be left). */
static inline void sc_close(sc_fx *f) {
    if (f->st) CHECK_OK(akv_stage_destroy(f->st));
    if (f->dp && f->n_win) CHECK_OK(akv_dev_pool_staging_release(f->dp, f->n_win, f->win_all));
    if (f->dp) CHECK_OK(akv_dev_pool_destroy(f->dp));
    if (f->hp) CHECK_OK(akv_host_pool_destroy(f->hp));
    if (f->result.addr) CHECK_OK(akv_dev_mem_free(f->dev, f->result));
    if (f->dev) CHECK_OK(akv_dev_destroy(f->dev));
    memset(f, 0, sizeof *f);
}

/* Reads the probe counters (after a device sync). */
static inline void sc_result(sc_fx *f, uint64_t r[4]) {
    CHECK_OK(akv_dev_sync(f->dev));
    CHECK_OK(akv_dev_copy_d2h_sync(f->dev, r, f->result, 4 * sizeof(uint64_t)));
}

/* ---- contexts ------------------------------------------------------------------------------ */

enum { SC_FREE = 0, SC_LIVE, SC_FINISHING, SC_DEAD };

typedef struct sc_ctx {
    int state;
    uint64_t seed;
    akv_host_table *table;
    uint32_t n_tokens; /* committed: rows in the host copy after the last step */
    uint32_t max_tokens;
    uint32_t sink[SC_MAX_LAYERS], tail[SC_MAX_LAYERS]; /* device window pages */
    akv_stage_lease last[SC_MAX_LAYERS];               /* last lease that used the tail */
    uint32_t n_leases;                                 /* live leases that include it */
} sc_ctx;

typedef struct sc_lease {
    akv_stage_lease h;
    int n_ctx;
    int ctx[SC_MAX_BATCH];
    uint32_t to_free[SC_MAX_BATCH]; /* window pages to free when it retires */
    int n_to_free;
} sc_lease;

typedef struct sc_run {
    sc_fx *f;
    uint64_t rng;
    uint64_t n_ops;
    uint64_t n_probe_seqs; /* sequences the probe was launched for */
    uint64_t n_host_bad;   /* host-copy rows found wrong (by context checks) */
    uint64_t n_finished, n_cancelled, n_steps;
    int quiet;            /* negative controls: count wrong rows, do not fail checks */
    int walk;             /* run the validity walkers after every operation */
    int tolerate;         /* fault runs: an unexpected status stops the run, recorded */
    akv_status first_err; /* ... the first one */
    const char *first_what;
    sc_ctx ctx[SC_MAX_CTX];
    sc_lease pend[SC_MAX_PENDING];
    int n_pend;
} sc_run;

/* attend, or (f->p.split_attend) its split form as a forward pass uses it: ready, the
 * caller's own launch on the compute queue, attended. */
static inline akv_status sc_attend(const sc_fx *f, akv_stage *st, akv_stage_lease h,
                                   const akv_dev_op *op, const void *args, size_t n,
                                   akv_event **ev) {
    if (!f->p.split_attend) return akv_stage_attend(st, h, op, args, n, ev);
    akv_status s = akv_stage_ready(st, h);
    if (s == AKV_OK) s = akv_dev_op_launch(f->dev, op, args, n);
    return s != AKV_OK ? s : akv_stage_attended(st, h, ev);
}

/* The probe seed of one layer of a context of seed `seed`. */
static inline uint64_t sc_layer_seed(uint64_t seed, uint32_t layer) {
    return seed ^ ((uint64_t)(layer + 1) * 0xD1B54A32D192ED03ull);
}

static inline uint32_t sc_win_take(sc_fx *f) {
    AKV_ASSERT(f->n_win_free > 0);
    return f->win_free[--f->n_win_free];
}

/* Returns a window page, poisoned: called only once nothing in flight may touch it (every
 * lease that read or wrote it retired), so a reader that is not ordered after those fences
 * reads poison. */
static inline void sc_win_put(sc_fx *f, uint32_t id) {
    AKV_ASSERT(f->n_win_free < f->n_win);
    if (f->p.poison >= 0)
        CHECK_OK(akv_dev_memset_sync(f->dev, akv_dev_pool_page_addr(f->dp, id), f->p.poison,
                                     akv_geom_page_bytes(&f->g)));
    f->win_free[f->n_win_free++] = id;
}

/* Counts one operation and runs the walkers. */
static inline int sc_op(sc_run *r, akv_status s, akv_status want, const char *what) {
    r->n_ops++;
    if (r->walk && akv__stage_check(r->f->st) != AKV_OK) {
        (void)TEST_CHECK_(0, "stage walker failed after %s", what);
        return 0;
    }
    if (s == want) return 1;
    if (r->tolerate) {
        if (r->first_err == AKV_OK) {
            r->first_err = s;
            r->first_what = what;
        }
        return 0;
    }
    (void)TEST_CHECK_(0, "%s returned %s, want %s", what, akv_status_name(s),
                      akv_status_name(want));
    return 0;
}

/* Compares rows [0, n_tokens) of layers [0, n_layers) of a host table (a context of seed
 * `seed`) with the formula; returns how many (layer, token) rows differ. */
static inline uint64_t sc_host_bad_rows(sc_fx *f, akv_host_table *table, uint64_t seed,
                                        uint32_t n_layers, uint32_t n_tokens) {
    const uint32_t H = f->g.n_kv_heads, D = f->g.head_dim, P = f->g.page_tokens, n_e = 2 * H * D;
    uint64_t bad = 0;
    for (uint32_t l = 0; l < n_layers; l++)
        for (uint32_t t = 0; t < n_tokens; t++) {
            const uint16_t *pg =
                akv_host_pool_page_addr(f->hp, akv_host_table_page(table, l, t / P));
            for (uint32_t e = 0; e < n_e; e++)
                if (pg[akv_stage_probe_at(D, P, t, e)] !=
                    akv_stage_probe_value(sc_layer_seed(seed, l), t, e)) {
                    bad++;
                    break;
                }
        }
    return bad;
}

/* Frees a context's window pages and record (its leases have all retired). */
static inline void sc_ctx_release(sc_run *r, sc_ctx *c) {
    for (uint32_t l = 0; l < r->f->g.n_layers; l++) {
        sc_win_put(r->f, c->sink[l]);
        if (c->tail[l] != c->sink[l]) sc_win_put(r->f, c->tail[l]);
    }
    c->state = SC_FREE;
}

/* A context whose last lease retired: a finished one has its host copy checked, then goes. */
static inline void sc_ctx_settle(sc_run *r, sc_ctx *c) {
    if (c->n_leases || (c->state != SC_FINISHING && c->state != SC_DEAD)) return;
    if (c->state == SC_FINISHING) {
        uint64_t bad = sc_host_bad_rows(r->f, c->table, c->seed, r->f->g.n_layers, c->n_tokens);
        r->n_host_bad += bad;
        if (!r->quiet)
            TEST_CHECK_(bad == 0, "finished context: %llu host rows wrong",
                        (unsigned long long)bad);
        CHECK_OK(akv_host_table_destroy(c->table)); /* nothing leased any more */
        r->n_finished++;
    }
    sc_ctx_release(r, c);
}

/* A context goes away: revoked at once, its host pages freed at their last release. */
static inline void sc_ctx_kill(sc_run *r, sc_ctx *c) {
    if (c->state != SC_LIVE) return;
    c->state = SC_DEAD;
    akv_host_pool_stats hs;
    akv_host_table_destroy_deferred(c->table);
    c->table = NULL;
    akv_host_pool_get_stats(r->f->hp, &hs);
    /* I7: a context in a live lease has an owner page still leased: it must be doomed, not
     * free, until that lease retires. */
    if (c->n_leases) TEST_CHECK_(hs.n_doomed > 0, "cancelled context's leased pages freed at once");
    r->n_cancelled++;
    sc_ctx_settle(r, c);
}

/* Retires pending lease i. On a failed stage retire answers AKV_EFAILED: the lease is then
 * released (receipt.failed) if quarantine established completion, else kept (returns 0). */
static inline int sc_retire_at(sc_run *r, int i) {
    sc_lease *L = &r->pend[i];
    akv_stage_receipt rc;
    akv_stage_stats before, after;
    akv_stage_get_stats(r->f->st, &before);
    akv_status s = akv_stage_retire(r->f->st, L->h, &rc);
    akv_stage_get_stats(r->f->st, &after);
    int failed = akv_stage_status(r->f->st) != AKV_OK;
    if (failed && s == AKV_EFAILED) {
        r->n_ops++;
        if (after.n_live == before.n_live) return 0; /* retained */
        CHECK(rc.failed == 1);
    } else if (!sc_op(r, s, AKV_OK, "retire")) {
        return 0;
    }
    for (int k = 0; k < L->n_to_free; k++)
        sc_win_put(r->f, L->to_free[k]);
    for (int k = 0; k < L->n_ctx; k++) {
        sc_ctx *c = &r->ctx[L->ctx[k]];
        c->n_leases--;
        sc_ctx_settle(r, c);
    }
    r->pend[i] = r->pend[--r->n_pend];
    return 1;
}

static inline sc_lease *sc_pending_find(sc_run *r, akv_stage_lease h) {
    for (int i = 0; i < r->n_pend; i++)
        if (r->pend[i].h.idx == h.idx && r->pend[i].h.gen == h.gen) return &r->pend[i];
    return NULL;
}

static inline void sc_ctx_start(sc_run *r) {
    sc_fx *f = r->f;
    int slot = -1;
    for (int i = 0; i < SC_MAX_CTX && slot < 0; i++)
        if (r->ctx[i].state == SC_FREE) slot = i;
    if (slot < 0 || f->n_win_free < 2 * f->g.n_layers) return;
    sc_ctx *c = &r->ctx[slot];
    memset(c, 0, sizeof *c);
    if (!REQUIRE_OK(akv_host_table_create(f->hp, &c->table))) return;
    c->state = SC_LIVE;
    c->seed = test_rand(&r->rng);
    c->max_tokens = 1 + (uint32_t)test_rand_below(&r->rng, f->p.max_tokens);
    for (uint32_t l = 0; l < f->g.n_layers; l++)
        c->sink[l] = c->tail[l] = sc_win_take(f);
}

/* One lease of one layer for the batch (context indices; the new rows of each go to
 * [n_old, n_old + n_new)). Returns 0 when a check failed. */
static inline int sc_layer(sc_run *r, uint32_t layer, uint64_t step, const int *batch,
                           const uint32_t *n_new, int n_batch) {
    sc_fx *f = r->f;
    const uint32_t P = f->g.page_tokens;
    akv_host_page owners[SC_MAX_BATCH];
    int live[SC_MAX_BATCH], n = 0;
    uint32_t nn[SC_MAX_BATCH];
    for (int i = 0; i < n_batch; i++) {
        sc_ctx *c = &r->ctx[batch[i]];
        if (c->state != SC_LIVE) continue;
        uint32_t last = c->n_tokens + n_new[i] - 1;
        owners[n] = akv_host_table_page(c->table, layer, last / P);
        nn[n] = n_new[i];
        live[n++] = batch[i];
    }
    if (!n) return 1;
    /* Retire some earlier leases now and then; always when too many are pending. */
    while (r->n_pend && (r->n_pend >= SC_MAX_PENDING - 1 || test_rand_below(&r->rng, 3) == 0))
        if (!sc_retire_at(r, (int)test_rand_below(&r->rng, (uint64_t)r->n_pend))) return 0;
    if (r->n_pend && test_rand_below(&r->rng, 4) == 0) {
        int ready = 0;
        if (!sc_op(r,
                   akv_stage_poll(f->st, r->pend[test_rand_below(&r->rng, (uint64_t)r->n_pend)].h,
                                  &ready),
                   AKV_OK, "poll"))
            return 0;
    }
    sc_lease *L = &r->pend[r->n_pend];
    memset(L, 0, sizeof *L);
    akv_status bs = akv_stage_begin(f->st, layer, step, owners, (uint32_t)n, &L->h);
    if (L->h.gen) { /* a lease exists (even when a submission inside begin failed) */
        r->n_pend++;
        for (int i = 0; i < n; i++) {
            L->ctx[L->n_ctx++] = live[i];
            r->ctx[live[i]].n_leases++;
        }
    }
    if (!sc_op(r, bs, AKV_OK, "begin")) return 0;
    /* Where this lease may be cancelled: 0 = not, 1 after begin, 2 after copies, 3 after
     * attend, 4 after the first write-back, 5 after seal. */
    int cancel_at = test_rand_below(&r->rng, 400) == 0 ? 1 + (int)test_rand_below(&r->rng, 5) : 0;
    int revoke_pre =
        test_rand_below(&r->rng, 150) == 0 ? (int)test_rand_below(&r->rng, (uint64_t)n) : -1;
    int revoke_post =
        test_rand_below(&r->rng, 150) == 0 ? (int)test_rand_below(&r->rng, (uint64_t)n) : -1;
    if (revoke_pre >= 0) {
        if (!sc_op(r, akv_stage_cancel_owner(f->st, L->h, (uint32_t)revoke_pre), AKV_OK,
                   "cancel owner"))
            return 0;
        sc_ctx_kill(r, &r->ctx[live[revoke_pre]]);
    }
    if (cancel_at == 1) goto cancel;

    /* Copies and the probe's page lists. */
    akv_stage_probe_args a;
    memset(&a, 0, sizeof a);
    a.base = akv_dev_pool_base(f->dp);
    a.result = f->result;
    a.n_kv_heads = f->g.n_kv_heads;
    a.head_dim = f->g.head_dim;
    a.page_tokens = P;
    for (int i = 0; i < n; i++) {
        sc_ctx *c = &r->ctx[live[i]];
        if (c->state != SC_LIVE) continue;
        uint32_t total = c->n_tokens + nn[i], k = (total - 1) / P; /* tail = logical k */
        akv_stage_probe_seq *q = &a.seq[a.n_seq++];
        q->seed = sc_layer_seed(c->seed, layer);
        q->n_tokens = total;
        q->n_pages = k + 1;
        q->new_token0 = c->n_tokens;
        q->n_new = nn[i];
        q->expected = akv_stage_probe_expected(q->seed, total, f->g.n_kv_heads, f->g.head_dim);
        q->page_ids[0] = c->sink[layer];
        q->page_ids[k] = c->tail[layer];
        akv_host_page hp[AKV_STAGE_PROBE_MAX_PAGES];
        for (uint32_t j = 1; j < k; j++)
            hp[j - 1] = akv_host_table_page(c->table, layer, j);
        uint32_t n_mid = k > 1 ? k - 1 : 0,
                 cut = n_mid ? (uint32_t)test_rand_below(&r->rng, n_mid + 1) : 0;
        if (cut && !sc_op(r, akv_stage_copy(f->st, L->h, hp, cut, q->page_ids + 1), AKV_OK, "copy"))
            return 0;
        if (n_mid > cut &&
            !sc_op(r, akv_stage_copy(f->st, L->h, hp + cut, n_mid - cut, q->page_ids + 1 + cut),
                   AKV_OK, "copy"))
            return 0;
    }
    if (cancel_at == 2) goto cancel;
    akv_event *attn = NULL;
    if (!sc_op(r, sc_attend(f, f->st, L->h, &akv_stage_probe_op, &a, sizeof a, &attn), AKV_OK,
               "attend"))
        return 0;
    r->n_probe_seqs += a.n_seq;
    if (revoke_post >= 0 && r->ctx[live[revoke_post]].state == SC_LIVE) {
        if (!sc_op(r, akv_stage_cancel_owner(f->st, L->h, (uint32_t)revoke_post), AKV_OK,
                   "cancel owner"))
            return 0;
        sc_ctx_kill(r, &r->ctx[live[revoke_post]]);
    }
    if (cancel_at == 3) goto cancel;
    akv_stage_tail tail = {0, 0};
    for (int i = 0; i < n; i++) {
        sc_ctx *c = &r->ctx[live[i]];
        if (c->state != SC_LIVE) continue;
        if (!sc_op(r,
                   akv_stage_writeback(f->st, L->h, (uint32_t)i, owners[i], c->tail[layer],
                                       c->n_tokens % P, nn[i], &tail),
                   AKV_OK, "write-back"))
            return 0;
        if (cancel_at == 4) goto cancel;
    }
    if (!sc_op(r, akv_stage_seal(f->st, L->h, tail, attn), AKV_OK, "seal")) return 0;
    if (cancel_at == 5) goto cancel;
    for (int i = 0; i < n; i++)
        r->ctx[live[i]].last[layer] = L->h;
    return 1;
cancel:
    if (!sc_op(r, akv_stage_cancel(f->st, L->h), AKV_OK, "cancel")) return 0;
    for (int i = 0; i < n; i++) {
        r->ctx[live[i]].last[layer] = L->h;
        sc_ctx_kill(r, &r->ctx[live[i]]);
    }
    return 1;
}

/* One step: grow every live context, move tails into new pages, one lease per layer. */
static inline int sc_step(sc_run *r) {
    sc_fx *f = r->f;
    const uint32_t P = f->g.page_tokens;
    r->n_steps++;
    int want = 1 + (int)test_rand_below(&r->rng, SC_MAX_BATCH), n_live = 0;
    for (int i = 0; i < SC_MAX_CTX; i++)
        n_live += r->ctx[i].state == SC_LIVE;
    while (n_live < want) {
        int before = n_live;
        sc_ctx_start(r);
        n_live = 0;
        for (int i = 0; i < SC_MAX_CTX; i++)
            n_live += r->ctx[i].state == SC_LIVE;
        if (n_live == before) break;
    }
    int batch[SC_MAX_BATCH], n = 0;
    uint32_t n_new[SC_MAX_BATCH];
    for (int i = 0; i < SC_MAX_CTX && n < SC_MAX_BATCH; i++) {
        sc_ctx *c = &r->ctx[i];
        if (c->state != SC_LIVE) continue;
        uint32_t room = P - c->n_tokens % P;
        uint32_t add =
            test_rand_below(&r->rng, 8) == 0 ? 1 + (uint32_t)test_rand_below(&r->rng, room) : 1;
        if (!REQUIRE_OK(akv_host_table_grow(c->table, c->n_tokens + add))) return 0;
        if (c->n_tokens && c->n_tokens % P == 0) { /* a new tail page (logical k >= 1) */
            for (uint32_t l = 0; l < f->g.n_layers; l++) {
                if (c->tail[l] != c->sink[l]) {
                    /* the old tail leaves the window: free its device page once the last lease
                     * that read or wrote it back retired */
                    sc_lease *last = sc_pending_find(r, c->last[l]);
                    if (last)
                        last->to_free[last->n_to_free++] = c->tail[l];
                    else
                        sc_win_put(f, c->tail[l]);
                }
                c->tail[l] = sc_win_take(f);
            }
        }
        batch[n] = i;
        n_new[n++] = add;
    }
    if (n == 0) {
        /* Every context is finishing or cancelled and waits for its leases to retire, which
         * also hold the window pages a new context needs: retire one, or the run would spin
         * without an operation. */
        if (!r->n_pend) return TEST_CHECK_(0, "no context can start and no lease is pending");
        return sc_retire_at(r, (int)test_rand_below(&r->rng, (uint64_t)r->n_pend));
    }
    for (uint32_t l = 0; l < f->g.n_layers; l++)
        if (!sc_layer(r, l, r->n_steps, batch, n_new, n)) return 0;
    for (int i = 0; i < n; i++) {
        sc_ctx *c = &r->ctx[batch[i]];
        c->n_tokens += n_new[i];
        if (c->state == SC_LIVE && c->n_tokens >= c->max_tokens) {
            c->state = SC_FINISHING;
            sc_ctx_settle(r, c);
        }
    }
    if (r->walk && test_rand_below(&r->rng, 64) == 0) {
        CHECK_OK(akv__host_pool_check(f->hp));
        CHECK_OK(akv__dev_pool_check(f->dp));
    }
    return 1;
}

/* Retires everything, finishes every context (host copies checked). */
static inline void sc_drain(sc_run *r) {
    while (r->n_pend)
        if (!sc_retire_at(r, 0)) return;
    for (int i = 0; i < SC_MAX_CTX; i++) {
        sc_ctx *c = &r->ctx[i];
        if (c->state == SC_LIVE) c->state = SC_FINISHING;
        sc_ctx_settle(r, c);
    }
}

/* The randomized run: n_ops lease operations. Returns the probe's mismatch count; with
 * quiet = 1 (negative controls) nothing is reported as a failure and wrong host rows are
 * added to *host_bad. */
static inline uint64_t sc_stress(const sc_params *p, uint64_t n_ops, uint64_t seed, unsigned broken,
                                 int quiet, uint64_t *host_bad) {
    sc_fx f;
    static sc_run r; /* large: off the stack */
    memset(&r, 0, sizeof r);
    uint64_t res[4] = {0, 0, 0, 0};
    if (!sc_open(&f, p)) {
        sc_close(&f);
        return 0;
    }
    if (broken) akv__stage_break(f.st, broken);
    r.f = &f;
    r.rng = seed;
    r.quiet = quiet;
    r.walk = !quiet;
    double t0 = akv_clock_s();
    while (r.n_ops < n_ops)
        if (!sc_step(&r)) break;
    sc_drain(&r);
    sc_result(&f, res);
    double dt = akv_clock_s() - t0;
    if (!quiet) {
        CHECK_EQ_U64(res[0], 0); /* probe mismatches */
        CHECK_EQ_U64(res[1], r.n_probe_seqs);
        if (res[0])
            printf("  first mismatch seen: got %016llx want %016llx\n", (unsigned long long)res[2],
                   (unsigned long long)res[3]);
        akv_stage_stats ss;
        akv_stage_get_stats(f.st, &ss);
        printf(
            "  %u slots: %llu ops in %.1f s (%.0f ops/s), %llu steps, %llu leases (%llu "
            "cancelled), %llu probe sequences, %llu copies, "
            "%llu write-backs, %llu prior-reader waits, %llu RAW waits; contexts: %llu finished, "
            "%llu cancelled\n",
            p->n_slots, (unsigned long long)r.n_ops, dt, (double)r.n_ops / (dt > 0 ? dt : 1),
            (unsigned long long)r.n_steps, (unsigned long long)ss.n_begun,
            (unsigned long long)ss.n_cancelled, (unsigned long long)r.n_probe_seqs,
            (unsigned long long)ss.n_copies, (unsigned long long)ss.n_writebacks,
            (unsigned long long)ss.n_prior_waits, (unsigned long long)ss.n_raw_waits,
            (unsigned long long)r.n_finished, (unsigned long long)r.n_cancelled);
        CHECK(ss.n_prior_waits > 0);
        CHECK(ss.n_raw_waits > 0);
        CHECK(r.n_finished > 0 && r.n_cancelled > 0);
        CHECK_EQ_U64(ss.n_live, 0);
    }
    if (host_bad) *host_bad = r.n_host_bad;
    sc_close(&f);
    return res[0];
}

/* ---- log capture ------------------------------------------------------------------------------
 */

typedef struct sc_log {
    int n_transport_failed; /* "transport failed at" lines */
    int n_errors;
    char first[256];
} sc_log;
static sc_log sc_log_seen;

static inline void sc_log_hook(akv_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= AKV_LOG_ERROR) {
        if (!sc_log_seen.n_errors++)
            snprintf(sc_log_seen.first, sizeof sc_log_seen.first, "%s", msg);
        if (strstr(msg, "transport failed at")) sc_log_seen.n_transport_failed++;
    }
}

static inline void sc_log_capture(void) {
    memset(&sc_log_seen, 0, sizeof sc_log_seen);
    akv_log_set(sc_log_hook, NULL, AKV_LOG_DEBUG);
}

/* ---- a single context for lifecycle and misuse cases -------------------------------------------
 */

/* One context on layer 0 with tokens 0..8 in the host copy (pages 0, 1, 2 at P = 4), the sink
 * and tail pages on the device; the next token (9) goes to page 2. */
typedef struct mu {
    sc_fx f;
    akv_host_table *t;
    akv_host_table *scratch; /* one page: a second, throwaway owner */
    uint64_t seed;
    uint32_t sink, tail;
    akv_stage_lease live[4];
    int n_live;
    int64_t lease_delta; /* host leases gained by the last misuse call */
} mu;

#define MU_SETUP_FAILED ((akv_status)1) /* never a wanted status */

static inline void mu_fill_host(mu *m, uint32_t layer, uint32_t n_tokens) {
    const akv_geom *g = &m->f.g;
    const uint32_t P = g->page_tokens, D = g->head_dim, n_e = 2 * g->n_kv_heads * D;
    for (uint32_t t = 0; t < n_tokens; t++) {
        uint16_t *pg = akv_host_pool_page_addr(m->f.hp, akv_host_table_page(m->t, layer, t / P));
        for (uint32_t e = 0; e < n_e; e++)
            pg[akv_stage_probe_at(D, P, t, e)] =
                akv_stage_probe_value(sc_layer_seed(m->seed, layer), t, e);
    }
}

static inline int mu_open(mu *m, const sc_params *p) {
    memset(m, 0, sizeof *m);
    if (!sc_open(&m->f, p)) return 0;
    m->seed = 0x5EED;
    if (!REQUIRE_OK(akv_host_table_create(m->f.hp, &m->t))) return 0;
    if (!REQUIRE_OK(akv_host_table_grow(m->t, 10))) return 0;
    if (!REQUIRE_OK(akv_host_table_create(m->f.hp, &m->scratch))) return 0;
    if (!REQUIRE_OK(akv_host_table_grow(m->scratch, 1))) return 0;
    mu_fill_host(m, 0, 9);
    m->sink = sc_win_take(&m->f);
    m->tail = sc_win_take(&m->f);
    size_t pb = akv_host_pool_page_bytes(m->f.hp);
    /* the window: logical 0 in the sink page, logical 2 in the tail page */
    return REQUIRE_OK(akv_dev_copy_h2d_sync(
               m->f.dev, akv_dev_pool_page_addr(m->f.dp, m->sink),
               akv_host_pool_page_addr(m->f.hp, akv_host_table_page(m->t, 0, 0)), pb)) &&
           REQUIRE_OK(akv_dev_copy_h2d_sync(
               m->f.dev, akv_dev_pool_page_addr(m->f.dp, m->tail),
               akv_host_pool_page_addr(m->f.hp, akv_host_table_page(m->t, 0, 2)), pb));
}

static inline void mu_forget(mu *m, akv_stage_lease h) {
    for (int i = 0; i < m->n_live; i++)
        if (m->live[i].idx == h.idx && m->live[i].gen == h.gen) m->live[i] = m->live[--m->n_live];
}

/* Cancels and retires whatever a case left live; the stage must end healthy and empty. */
static inline void mu_reset(mu *m) {
    while (m->n_live) {
        akv_stage_lease h = m->live[0];
        akv_stage_receipt rc;
        akv_stage_cancel(m->f.st, h); /* refused for a sealed one only if cancelled already */
        CHECK_OK(akv_stage_retire(m->f.st, h, &rc));
        mu_forget(m, h);
    }
    akv_stage_stats ss;
    akv_host_pool_stats hs;
    akv_stage_get_stats(m->f.st, &ss);
    akv_host_pool_get_stats(m->f.hp, &hs);
    CHECK_EQ_U64(ss.n_live, 0);
    CHECK_EQ_U64(hs.n_leases, 0);
    CHECK_OK(akv_stage_status(m->f.st));
    CHECK_OK(akv__stage_check(m->f.st));
}

static inline void mu_close(mu *m) {
    mu_reset(m);
    if (m->t) CHECK_OK(akv_host_table_destroy(m->t));
    if (m->scratch) CHECK_OK(akv_host_table_destroy(m->scratch));
    sc_win_put(&m->f, m->sink);
    sc_win_put(&m->f, m->tail);
    sc_close(&m->f);
}

/* The probe arguments for layer 0: tokens 0..9 (9 new) over sink, staged page 1, tail. */
static inline akv_stage_probe_args mu_probe(mu *m, uint32_t staged_id) {
    akv_stage_probe_args a;
    memset(&a, 0, sizeof a);
    a.base = akv_dev_pool_base(m->f.dp);
    a.result = m->f.result;
    a.n_kv_heads = m->f.g.n_kv_heads;
    a.head_dim = m->f.g.head_dim;
    a.page_tokens = m->f.g.page_tokens;
    a.n_seq = 1;
    akv_stage_probe_seq *q = &a.seq[0];
    q->seed = sc_layer_seed(m->seed, 0);
    q->n_tokens = 10;
    q->n_pages = 3;
    q->new_token0 = 9;
    q->n_new = 1;
    q->expected = akv_stage_probe_expected(q->seed, 10, a.n_kv_heads, a.head_dim);
    q->page_ids[0] = m->sink;
    q->page_ids[1] = staged_id;
    q->page_ids[2] = m->tail;
    return a;
}

/* Runs a layer-0 lease up to `upto`: 1 begun, 2 copied, 3 attended, 4 written back, 5 sealed. */
static inline akv_status mu_lease(mu *m, int upto, akv_stage_lease *h, akv_event **attn,
                                  akv_stage_tail *tail) {
    akv_stage *st = m->f.st;
    akv_host_page own = akv_host_table_page(m->t, 0, 2), mid = akv_host_table_page(m->t, 0, 1);
    uint32_t id = 0;
    akv_event *ev = NULL;
    akv_stage_tail tl = {0, 0};
    if (akv_stage_begin(st, 0, 1, &own, 1, h) != AKV_OK) return MU_SETUP_FAILED;
    m->live[m->n_live++] = *h;
    if (upto >= 2 && akv_stage_copy(st, *h, &mid, 1, &id) != AKV_OK) return MU_SETUP_FAILED;
    akv_stage_probe_args a = mu_probe(m, id);
    if (upto >= 3 &&
        sc_attend(&m->f, st, *h, &akv_stage_probe_op, &a, sizeof a, &ev) != AKV_OK)
        return MU_SETUP_FAILED;
    if (upto >= 4 && akv_stage_writeback(st, *h, 0, own, m->tail, 1, 1, &tl) != AKV_OK)
        return MU_SETUP_FAILED;
    if (upto >= 5 && akv_stage_seal(st, *h, tl, ev) != AKV_OK) return MU_SETUP_FAILED;
    if (attn) *attn = ev;
    if (tail) *tail = tl;
    return AKV_OK;
}

/* Evaluates the misuse call, recording how many host leases it gained (must be 0). */
#define MU_LAST(m, expr)                                                                           \
    do {                                                                                           \
        akv_host_pool_stats a_, b_;                                                                \
        akv_host_pool_get_stats((m)->f.hp, &a_);                                                   \
        akv_status s_ = (expr);                                                                    \
        akv_host_pool_get_stats((m)->f.hp, &b_);                                                   \
        (m)->lease_delta = (int64_t)b_.n_leases - (int64_t)a_.n_leases;                            \
        return s_;                                                                                 \
    } while (0)

#define MU_SETUP(expr)                                                                             \
    do {                                                                                           \
        if ((expr) != AKV_OK) return MU_SETUP_FAILED;                                              \
    } while (0)

static const struct {
    const char *what;
    akv_status want;
} mu_rows[] = {
    {"begin while the previous lease is only begun", AKV_ESTATE},
    {"begin while the previous lease is only attended", AKV_ESTATE},
    {"begin with a stale owner generation", AKV_ESTATE},
    {"begin with an owner repeated", AKV_EINVAL},
    {"begin on a layer out of range", AKV_EINVAL},
    {"begin with NULL owners", AKV_EINVAL},
    {"copy more pages than the slot holds", AKV_EFULL},
    {"copy a stale host page", AKV_ESTATE},
    {"copy after attend", AKV_ESTATE},
    {"attend twice", AKV_ESTATE},
    {"attend with the wrong argument size", AKV_EINVAL},
    {"attend an op without implementation", AKV_EUNSUPPORTED},
    {"write-back before attend", AKV_ESTATE},
    {"write-back to another host page than the owner", AKV_EINVAL},
    {"write-back to the owner's id with another generation", AKV_EINVAL},
    {"write-back to an owner index out of range", AKV_EINVAL},
    {"write-back the same owner twice", AKV_ESTATE},
    {"write-back rows past the end of the page", AKV_EINVAL},
    {"write-back zero rows", AKV_EINVAL},
    {"write-back from a page outside the device pool", AKV_EINVAL},
    {"seal before the owner is written back", AKV_ESTATE},
    {"seal with an older tail", AKV_EINVAL},
    {"seal with the empty tail after a write-back", AKV_EINVAL},
    {"seal with another lease's attention event", AKV_EINVAL},
    {"seal with the attention event re-recorded", AKV_EINVAL},
    {"seal twice", AKV_ESTATE},
    {"retire a lease that is only attended", AKV_ESTATE},
    {"retire a retired (stale) handle", AKV_ESTATE},
    {"use a handle that no lease ever had", AKV_EINVAL},
    {"destroy the stage with a live lease", AKV_EBUSY},
    {"copy after cancel", AKV_ECANCELED},
    {"attend after cancel", AKV_ECANCELED},
    {"write-back of a cancelled owner", AKV_ECANCELED},
    {"seal a cancelled lease", AKV_ECANCELED},
    {"cancel an owner out of range", AKV_EINVAL},
    {"quarantine a healthy stage", AKV_ESTATE},
    {"poll into NULL", AKV_EINVAL},
    /* the split attend (ready ... attended) */
    {"begin while the previous lease is only ready", AKV_ESTATE},
    {"copy after ready", AKV_ESTATE},
    {"ready twice", AKV_ESTATE},
    {"attend after ready", AKV_ESTATE},
    {"attended before ready", AKV_ESTATE},
    {"attended twice", AKV_ESTATE},
    {"write-back after ready, before attended", AKV_ESTATE},
    {"seal after ready, before attended", AKV_ESTATE},
    {"retire a lease that is only ready", AKV_ESTATE},
    {"ready after cancel", AKV_ECANCELED},
    {"attended after cancel", AKV_ECANCELED},
    {"attended into NULL", AKV_EINVAL},
};

static inline akv_status mu_do(mu *m, int row) {
    akv_stage *st = m->f.st;
    akv_stage_lease h, h2;
    akv_event *ev = NULL, *ev2 = NULL;
    akv_stage_tail tl = {0, 0}, tl2 = {0, 0};
    akv_stage_receipt rc;
    akv_host_page own = akv_host_table_page(m->t, 0, 2), mid = akv_host_table_page(m->t, 0, 1);
    akv_host_page stale = own, pages[64];
    stale.gen++;
    uint32_t ids[64];
    akv_stage_probe_args a = mu_probe(m, 0);
    switch (row) {
    case 0:
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        MU_LAST(m, akv_stage_begin(st, 0, 2, &own, 1, &h2));
    case 1:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_begin(st, 0, 2, &own, 1, &h2));
    case 2:
        MU_LAST(m, akv_stage_begin(st, 0, 1, &stale, 1, &h));
    case 3: {
        akv_host_page two[2] = {own, own};
        MU_LAST(m, akv_stage_begin(st, 0, 1, two, 2, &h));
    }
    case 4:
        MU_LAST(m, akv_stage_begin(st, m->f.g.n_layers, 1, &own, 1, &h));
    case 5:
        MU_LAST(m, akv_stage_begin(st, 0, 1, NULL, 1, &h));
    case 6:
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        for (uint32_t i = 0; i <= m->f.p.slot_pages && i < 64; i++)
            pages[i] = mid;
        MU_LAST(m, akv_stage_copy(st, h, pages, m->f.p.slot_pages + 1, ids));
    case 7: {
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        akv_host_page two[2] = {mid, {mid.id, mid.gen + 1}};
        MU_LAST(m, akv_stage_copy(st, h, two, 2, ids));
    }
    case 8:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_copy(st, h, &mid, 1, ids));
    case 9:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a, &ev));
    case 10:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_LAST(m, akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a - 8, &ev));
    case 11: {
        static const akv_dev_op none = {.name = "test_no_impl", .args_bytes = 0, .host = NULL};
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_LAST(m, akv_stage_attend(st, h, &none, NULL, 0, &ev));
    }
    case 12:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, 1, 1, &tl));
    case 13:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, mid, m->tail, 1, 1, &tl));
    case 14:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, stale, m->tail, 1, 1, &tl));
    case 15:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 1, own, m->tail, 1, 1, &tl));
    case 16:
        MU_SETUP(mu_lease(m, 4, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, 1, 1, &tl));
    case 17:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, m->f.g.page_tokens - 1, 2, &tl));
    case 18:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, 1, 0, &tl));
    case 19:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, akv_dev_pool_n_pages(m->f.dp), 1, 1, &tl));
    case 20:
        MU_SETUP(mu_lease(m, 3, &h, &ev, NULL));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 21: {
        /* two owners: the tail after the first write-back is old after the second */
        akv_host_page extra = akv_host_table_page(m->scratch, 0, 0);
        akv_host_page two[2] = {own, extra};
        MU_SETUP(akv_stage_begin(st, 0, 1, two, 2, &h));
        m->live[m->n_live++] = h;
        MU_SETUP(sc_attend(&m->f, st, h, &akv_stage_probe_op, &a, sizeof a, &ev));
        MU_SETUP(akv_stage_writeback(st, h, 0, own, m->tail, 1, 1, &tl));
        MU_SETUP(akv_stage_writeback(st, h, 1, extra, m->tail, 2, 1, &tl2));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    }
    case 22:
        MU_SETUP(mu_lease(m, 4, &h, &ev, NULL));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 23:
        MU_SETUP(mu_lease(m, 5, &h, &ev, NULL));
        MU_SETUP(mu_lease(m, 4, &h2, &ev2, &tl2));
        MU_LAST(m, akv_stage_seal(st, h2, tl2, ev));
    case 24:
        MU_SETUP(mu_lease(m, 4, &h, &ev, &tl));
        MU_SETUP(akv_dev_event_record(m->f.dev, ev, AKV_QUEUE_COMPUTE));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 25:
        MU_SETUP(mu_lease(m, 4, &h, &ev, &tl));
        MU_SETUP(akv_stage_seal(st, h, tl, ev));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 26:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_LAST(m, akv_stage_retire(st, h, &rc));
    case 27:
        MU_SETUP(mu_lease(m, 5, &h, NULL, NULL));
        MU_SETUP(akv_stage_retire(st, h, &rc));
        mu_forget(m, h);
        MU_LAST(m, akv_stage_retire(st, h, &rc));
    case 28:
        MU_LAST(m, akv_stage_retire(st, (akv_stage_lease){999, 1}, &rc));
    case 29:
        MU_SETUP(mu_lease(m, 5, &h, NULL, NULL));
        MU_LAST(m, akv_stage_destroy(st));
    case 30:
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        MU_SETUP(akv_stage_cancel(st, h));
        MU_LAST(m, akv_stage_copy(st, h, &mid, 1, ids));
    case 31:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_cancel(st, h));
        MU_LAST(m, akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a, &ev));
    case 32:
        MU_SETUP(mu_lease(m, 3, &h, NULL, NULL));
        MU_SETUP(akv_stage_cancel_owner(st, h, 0));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, 1, 1, &tl));
    case 33:
        MU_SETUP(mu_lease(m, 4, &h, &ev, &tl));
        MU_SETUP(akv_stage_cancel(st, h));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 34:
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        MU_LAST(m, akv_stage_cancel_owner(st, h, 1));
    case 35:
        MU_LAST(m, akv_stage_quarantine(st));
    case 36:
        MU_SETUP(mu_lease(m, 1, &h, NULL, NULL));
        MU_LAST(m, akv_stage_poll(st, h, NULL));
    case 37:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_begin(st, 0, 2, &own, 1, &h2));
    case 38:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_copy(st, h, &mid, 1, ids));
    case 39:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_ready(st, h));
    case 40:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a, &ev));
    case 41:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_LAST(m, akv_stage_attended(st, h, &ev));
    case 42:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_SETUP(akv_stage_attended(st, h, &ev));
        MU_LAST(m, akv_stage_attended(st, h, &ev2));
    case 43:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_writeback(st, h, 0, own, m->tail, 1, 1, &tl));
    case 44:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_seal(st, h, tl, ev));
    case 45:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_retire(st, h, &rc));
    case 46:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_cancel(st, h));
        MU_LAST(m, akv_stage_ready(st, h));
    case 47:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_SETUP(akv_stage_cancel(st, h));
        MU_LAST(m, akv_stage_attended(st, h, &ev));
    case 48:
        MU_SETUP(mu_lease(m, 2, &h, NULL, NULL));
        MU_SETUP(akv_stage_ready(st, h));
        MU_LAST(m, akv_stage_attended(st, h, NULL));
    }
    return MU_SETUP_FAILED;
}

/* Every misuse is its own error, changes no host lease, leaves the stage healthy. */
static inline void sc_misuse_table(const sc_params *p) {
    mu m;
    TEST_CASE(stage_misuse_table) {
        if (!mu_open(&m, p)) break;
        for (int i = 0; i < (int)(sizeof mu_rows / sizeof mu_rows[0]); i++) {
            akv_status got = mu_do(&m, i);
            TEST_CHECK_(got == mu_rows[i].want, "row %d, %s: got %s, want %s", i, mu_rows[i].what,
                        akv_status_name(got), akv_status_name(mu_rows[i].want));
            TEST_CHECK_(m.lease_delta == 0, "row %d, %s: host leases changed by %lld", i,
                        mu_rows[i].what, (long long)m.lease_delta);
            CHECK_OK(akv__stage_check(m.f.st));
            mu_reset(&m);
        }
        mu_close(&m);
    }
}

/* One lease end to end, then the ordering cases: a sealed, unretired predecessor on the same
 * slot becomes a prior reader; a copy of a page it writes back waits for that write-back. */
static inline void sc_lifecycle(const sc_params *p) {
    mu m;
    TEST_CASE(stage_lifecycle_receipts_prior_readers_raw) {
        if (!mu_open(&m, p)) break;
        akv_stage *st = m.f.st;
        const akv_geom *g = &m.f.g;
        akv_stage_lease a, b;
        akv_event *ev;
        akv_stage_tail tl;
        akv_stage_receipt ra, rb;
        if (!REQUIRE_OK(mu_lease(&m, 5, &a, &ev, &tl))) break;
        CHECK_EQ_U64(tl.n_writebacks, 1);
        /* lease b on the same slot (one slot) while a is sealed, not retired: it stages page 2,
         * which a writes back (token 9) */
        akv_host_page p2 = akv_host_table_page(m.t, 0, 2), p1 = akv_host_table_page(m.t, 0, 1);
        akv_host_page two[2] = {p1, p2};
        uint32_t ids[2];
        if (!REQUIRE_OK(akv_stage_begin(st, 0, 2, NULL, 0, &b))) break;
        m.live[m.n_live++] = b;
        CHECK_OK(akv_stage_copy(st, b, two, 2, ids));
        akv_stage_probe_args pa = mu_probe(&m, ids[0]);
        pa.seq[0].n_new = 0; /* read only: tokens 0..9, page 2 from the staged copy */
        pa.seq[0].page_ids[2] = ids[1];
        akv_event *evb;
        CHECK_OK(sc_attend(&m.f, st, b, &akv_stage_probe_op, &pa, sizeof pa, &evb));
        CHECK_OK(akv_stage_seal(st, b, (akv_stage_tail){0, 0}, evb));
        CHECK_OK(akv__stage_check(st));
        CHECK_OK(akv_stage_retire(st, b, &rb));
        mu_forget(&m, b);
        CHECK_OK(akv_stage_retire(st, a, &ra));
        mu_forget(&m, a);
        size_t pb = akv_geom_page_bytes(g), row = 2 * (size_t)g->n_kv_heads * g->head_dim * 2;
        CHECK_EQ_U64(ra.n_copies, 1);
        CHECK_EQ_U64(ra.h2d_bytes, pb);
        CHECK_EQ_U64(ra.n_writebacks, 1);
        CHECK_EQ_U64(ra.d2h_bytes, row);
        CHECK(ra.attn_ns > 0 && ra.h2d_ns > 0 && ra.d2h_ns > 0);
        CHECK(ra.t_retire_ns >= ra.t_begin_ns);
        CHECK_EQ_INT(ra.cancelled + ra.failed, 0);
        CHECK_EQ_U64(rb.n_copies, 2);
        CHECK_EQ_U64(rb.n_prior_waits, p->n_slots == 1 ? 3 : 1); /* slot readers (attn, wb) + RAW */
        akv_stage_stats ss;
        akv_stage_get_stats(st, &ss);
        CHECK_EQ_U64(ss.n_raw_waits, 1);
        uint64_t res[4];
        sc_result(&m.f, res);
        CHECK_EQ_U64(res[0], 0);
        CHECK_EQ_U64(res[1], 2);
        /* the new row reached the authoritative host copy, and nothing else changed */
        CHECK_EQ_U64(sc_host_bad_rows(&m.f, m.t, m.seed, 1, 10), 0);
        /* a cancelled lease releases only at retire: its pages stay leased until then */
        akv_stage_lease x;
        akv_host_pool_stats hs;
        if (!REQUIRE_OK(mu_lease(&m, 2, &x, NULL, NULL))) break;
        CHECK_OK(akv_stage_cancel(st, x));
        akv_host_pool_get_stats(m.f.hp, &hs);
        CHECK_EQ_U64(hs.n_leases, 2); /* owner + ticket */
        CHECK_STATUS(akv_host_table_destroy(m.t), AKV_EBUSY);
        akv_stage_receipt rx;
        CHECK_OK(akv_stage_retire(st, x, &rx));
        mu_forget(&m, x);
        CHECK_EQ_INT(rx.cancelled, 1);
        mu_close(&m);
    }
}

/* ---- cancellation -------------------------------------------------------------------------- */

/* Holds the H2D queue back: it waits on an event recorded after a long op on the compute
 * queue. On the host backend the op is a gate that opens only at sc_hold_release (exact); on a
 * device it is a busy kernel of roughly 0.1 s. */
static volatile int sc_gate_open; /* written by the test thread, read by the compute worker */

static inline akv_status sc_gate_host(akv_dev *dev, const void *args) {
    (void)dev;
    (void)args;
    while (!__atomic_load_n(&sc_gate_open, __ATOMIC_ACQUIRE))
        akv_clock_sleep_ns(100000);
    return AKV_OK;
}
static const akv_dev_op sc_gate_op = {.name = "test_gate", .args_bytes = 0, .host = sc_gate_host};

static inline int sc_hold(sc_fx *f, akv_event *ev, akv_dptr sink) {
    akv_dev_info info;
    if (!REQUIRE_OK(akv_dev_get_info(f->dev, &info))) return 0;
    __atomic_store_n(&sc_gate_open, 0, __ATOMIC_RELEASE);
    akv_dev_busy_args b = {.n_iters = 50u * 1000 * 1000, .sink = sink};
    akv_status s = info.is_host ? akv_dev_op_launch(f->dev, &sc_gate_op, NULL, 0)
                                : akv_dev_op_launch(f->dev, &akv_dev_op_busy, &b, sizeof b);
    return REQUIRE_OK(s) && REQUIRE_OK(akv_dev_event_record(f->dev, ev, AKV_QUEUE_COMPUTE)) &&
           REQUIRE_OK(akv_dev_queue_wait_event(f->dev, AKV_QUEUE_H2D, ev));
}

static inline void sc_hold_release(void) {
    __atomic_store_n(&sc_gate_open, 1, __ATOMIC_RELEASE);
}

/* I7: a cancelled lease is revoked at once (nothing more submitted for it, its context's host
 * pages doomed, not freed), while its copies still wait behind the hold; the pages are freed
 * only at retire, after every fence completed. */
static inline void sc_cancel(const sc_params *p) {
    mu m;
    TEST_CASE(stage_cancel_revokes_at_once_reuses_after_fences) {
        if (!mu_open(&m, p)) break;
        akv_stage *st = m.f.st;
        akv_event *hold = NULL;
        akv_dptr sink = {0};
        if (!REQUIRE_OK(akv_dev_event_create(m.f.dev, 0, &hold)) ||
            !REQUIRE_OK(akv_dev_mem_alloc(m.f.dev, 8, &sink)) || !sc_hold(&m.f, hold, sink)) {
            sc_hold_release();
            break;
        }
        akv_host_page own = akv_host_table_page(m.t, 0, 2), mid = akv_host_table_page(m.t, 0, 1);
        akv_stage_lease h;
        uint32_t id;
        int ready = 1;
        CHECK_OK(akv_stage_begin(st, 0, 1, &own, 1, &h));
        m.live[m.n_live++] = h;
        CHECK_OK(akv_stage_copy(st, h, &mid, 1, &id));
        CHECK_OK(akv_stage_cancel(st, h));
        /* revoked at once: nothing more of it is accepted */
        akv_stage_probe_args a = mu_probe(&m, id);
        akv_event *ev = NULL;
        akv_stage_tail tl;
        CHECK_STATUS(akv_stage_copy(st, h, &mid, 1, &id), AKV_ECANCELED);
        CHECK_STATUS(akv_stage_attend(st, h, &akv_stage_probe_op, &a, sizeof a, &ev),
                     AKV_ECANCELED);
        CHECK_STATUS(akv_stage_writeback(st, h, 0, own, m.tail, 1, 1, &tl), AKV_ECANCELED);
        /* ... but its copy has not run: the fences are pending */
        CHECK_OK(akv_stage_poll(st, h, &ready));
        CHECK_EQ_INT(ready, 0);
        /* the context goes away: the pages the lease holds are doomed, not freed */
        akv_host_pool_stats hs;
        akv_host_table_destroy_deferred(m.t);
        m.t = NULL;
        akv_host_pool_get_stats(m.f.hp, &hs);
        CHECK_EQ_U64(hs.n_doomed, 2); /* the owner and the copied page */
        CHECK(akv_host_pool_page_is_live(m.f.hp, own) && akv_host_pool_page_is_live(m.f.hp, mid));
        /* a new context cannot be given them */
        akv_host_table *t2 = NULL;
        if (REQUIRE_OK(akv_host_table_create(m.f.hp, &t2)) &&
            REQUIRE_OK(akv_host_table_grow(t2, 40)))
            for (uint32_t k = 0; k < akv_host_table_n_pages(t2); k++) {
                akv_host_page q = akv_host_table_page(t2, 0, k);
                CHECK(q.id != own.id && q.id != mid.id);
            }
        /* physical release only at retire, after every fence */
        sc_hold_release();
        akv_stage_receipt rc;
        CHECK_OK(akv_stage_retire(st, h, &rc));
        mu_forget(&m, h);
        CHECK_EQ_INT(rc.cancelled, 1);
        int done = 0;
        CHECK_OK(akv_dev_event_query(m.f.dev, hold, &done));
        CHECK_EQ_INT(done, 1);
        akv_host_pool_get_stats(m.f.hp, &hs);
        CHECK_EQ_U64(hs.n_doomed, 0);
        CHECK(!akv_host_pool_page_is_live(m.f.hp, own) && !akv_host_pool_page_is_live(m.f.hp, mid));
        if (t2) CHECK_OK(akv_host_table_destroy(t2));
        CHECK_OK(akv_dev_mem_free(m.f.dev, sink));
        CHECK_OK(akv_dev_event_destroy(m.f.dev, hold));
        mu_close(&m);
    }
}

/* ---- failure at every submission and wait point ------------------------------------------------
 */

/* The scenario: 3 clean steps (retired), then one step plus its retirement with a fault
 * armed at pass k of point f (f < 0: none; then *passes gets each point's count). */
static inline void sc_fault_one(const sc_params *p, int fault, uint64_t k, int sticky,
                                uint64_t passes[AKV_N_FAULTS], int *n_bad) {
    sc_fx f;
    static sc_run r;
    memset(&r, 0, sizeof r);
    int failed_before = test_n_failed_checks;
    if (!sc_open(&f, p)) {
        sc_close(&f);
        return;
    }
    r.f = &f;
    r.rng = 42;
    r.walk = 1;
    for (int i = 0; i < 3; i++)
        sc_step(&r);
    while (r.n_pend)
        sc_retire_at(&r, 0);
    uint32_t committed[SC_MAX_CTX];
    for (int i = 0; i < SC_MAX_CTX; i++)
        committed[i] = r.ctx[i].n_tokens;
    uint64_t before[AKV_N_FAULTS];
    for (int c = 0; c < AKV_N_FAULTS; c++)
        before[c] = akv_dev_fault_passes(f.dev, (akv_dev_fault)c);
    sc_log_capture();
    if (fault >= 0) CHECK_OK(akv_dev_inject_fault(f.dev, (akv_dev_fault)fault, k, sticky));
    r.tolerate = 1;
    if (sc_step(&r))
        while (r.n_pend && sc_retire_at(&r, 0)) {
        }
    if (passes)
        for (int c = 0; c < AKV_N_FAULTS; c++)
            passes[c] = akv_dev_fault_passes(f.dev, (akv_dev_fault)c) - before[c];
    akv_stage_stats ss;
    akv_host_pool_stats hs;
    akv_dev_pool_stats ds;
    if (fault < 0) {
        CHECK_EQ_INT(r.first_err, AKV_OK);
    } else {
        /* a clear error, once, where it happened */
        CHECK_EQ_INT(r.first_err, AKV_EDEVICE);
        CHECK_EQ_INT(sc_log_seen.n_transport_failed, 1);
        CHECK_STATUS(akv_stage_status(f.st), AKV_EFAILED);
        akv_stage_lease h;
        CHECK_STATUS(akv_stage_begin(f.st, 0, 99, NULL, 0, &h), AKV_EFAILED);
        akv_stage_get_stats(f.st, &ss);
        akv_host_pool_get_stats(f.hp, &hs);
        /* what the step did not complete is not committed: check only the rows before it */
        for (int i = 0; i < SC_MAX_CTX; i++)
            if (r.ctx[i].state == SC_LIVE || r.ctx[i].state == SC_FINISHING)
                r.ctx[i].n_tokens = committed[i];
        int expect_retained = sticky || fault == AKV_FAULT_COPY_EXEC || fault == AKV_FAULT_OP_EXEC;
        CHECK_EQ_INT(ss.retained, expect_retained);
        if (expect_retained) {
            /* completion not established: nothing is released or recycled */
            CHECK(ss.n_live >= 1 && hs.n_leases >= 1);
            CHECK_STATUS(akv_stage_destroy(f.st), AKV_EBUSY);
            akv_stage_receipt rc;
            CHECK_STATUS(akv_stage_retire(f.st, r.pend[0].h, &rc), AKV_EFAILED);
            akv_stage_stats again;
            akv_stage_get_stats(f.st, &again);
            CHECK_EQ_U64(again.n_live, ss.n_live);
            CHECK_OK(akv_dev_clear_faults(f.dev));
            CHECK_OK(akv_stage_quarantine(f.st));
        }
        while (r.n_pend)
            CHECK(sc_retire_at(&r, 0));
        akv_stage_get_stats(f.st, &ss);
        akv_host_pool_get_stats(f.hp, &hs);
        akv_dev_pool_get_stats(f.dp, &ds);
        CHECK_EQ_U64(ss.n_live, 0);
        CHECK_EQ_U64(hs.n_leases, 0);
        CHECK_EQ_U64(ds.staging_used, p->n_slots * p->slot_pages + f.n_win); /* slots still held */
    }
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    r.tolerate = 0;
    sc_drain(&r); /* nothing lost: checks every committed row of every context's host copy */
    uint64_t res[4];
    sc_result(&f, res);
    CHECK_EQ_U64(res[0], 0); /* no probe ever saw a wrong row, failure or not */
    sc_close(&f);
    if (test_n_failed_checks != failed_before) {
        (*n_bad)++;
        printf("  ^ fault %s at pass %llu%s (first error at %s: %s)\n",
               fault >= 0 ? akv_dev_fault_name((akv_dev_fault)fault) : "none",
               (unsigned long long)k, sticky ? " (sticky)" : "", r.first_what ? r.first_what : "-",
               sc_log_seen.first);
    }
}

/* The pass after k of a point passed n times: every one, or (quick) only the first and last. */
static inline uint64_t sc_next_pass(uint64_t k, uint64_t n, int quick) {
    return quick && k < n ? n : k + 1;
}

/* Failure injected at each submission and wait point in turn (with_exec: the host backend's
 * execution faults too; quick: only the first and the last pass of each point). */
static inline void sc_fault_sweep(const sc_params *p, int with_exec, int quick) {
    TEST_CASE(stage_failure_at_every_point) {
        uint64_t passes[AKV_N_FAULTS];
        int n_bad = 0, n_cases = 0;
        akv_log_set(NULL, NULL, AKV_LOG_OFF);
        sc_fault_one(p, -1, 0, 0, passes, &n_bad);
        static const akv_dev_fault points[] = {
            AKV_FAULT_COPY, AKV_FAULT_RECORD,    AKV_FAULT_WAIT,   AKV_FAULT_OP,
            AKV_FAULT_SYNC, AKV_FAULT_COPY_EXEC, AKV_FAULT_OP_EXEC};
        for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
            akv_dev_fault pt = points[i];
            if (!with_exec && (pt == AKV_FAULT_COPY_EXEC || pt == AKV_FAULT_OP_EXEC)) continue;
            printf("  %s: %llu points\n", akv_dev_fault_name(pt), (unsigned long long)passes[pt]);
            CHECK(passes[pt] > 0);
            for (uint64_t k = 1; k <= passes[pt]; k = sc_next_pass(k, passes[pt], quick), n_cases++)
                sc_fault_one(p, (int)pt, k, 0, NULL, &n_bad);
        }
        uint64_t n_sync = passes[AKV_FAULT_SYNC];
        for (uint64_t k = 1; k <= n_sync; k = sc_next_pass(k, n_sync, quick), n_cases++)
            sc_fault_one(p, AKV_FAULT_SYNC, k, 1, NULL, &n_bad);
        printf("  %d fault cases, %d with failed checks\n", n_cases, n_bad);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }
}

#endif
