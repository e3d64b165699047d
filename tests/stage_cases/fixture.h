/*
 * tests/stage_cases/fixture.h — the staging tests' fixture and randomized run, for any backend
 * (test_stage.c: the host backend; gpu/test_stage_cuda.c: the device), and the log capture
 * the cases share. The cases, by subject: stage_cases/misuse.h (one context: the lifecycle and
 * every misuse, a table), stage_cases/cancel.h, stage_cases/faults.h (a failure at every point).
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
#ifndef AKV_TESTS_STAGE_FIXTURE_H
#define AKV_TESTS_STAGE_FIXTURE_H


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

#endif
