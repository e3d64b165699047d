/*
 * tests/stage_cases/misuse.h — one context on layer 0: the lifecycle with its receipts and prior
 * readers, and every misuse of a lease as a table of named rows.
 */
#ifndef AKV_TESTS_STAGE_MISUSE_H
#define AKV_TESTS_STAGE_MISUSE_H

#include "stage_cases/fixture.h"

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

#endif
