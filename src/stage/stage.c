/*
 * stage.c — staging leases: the lifecycle state machine of akv/stage.h.
 *
 *            begin            attend              seal               retire
 *   (free) -------> BEGUN ----------> ATTENDED ---------> SEALED ----------> (free)
 *                   | copy*  \          ^ | writeback*      |
 *                   |   ready \        / attended           |
 *                   |          > READY                      |
 *                   +---- cancel -----+------ cancel -------+--> CANCELLED --retire--> (free)
 *
 * attend = ready + the op launch + attended: the split lets a caller that launches its own
 * attention (a forward pass) put it between the two.
 *
 * Every arrow that submits device work checks the stage first (a failed stage refuses with
 * AKV_EFAILED) and turns any device error into a transport failure (stage_fail), which
 * quarantines at once. Resources (tickets, owner leases, slot pages, the record) are released
 * in exactly one place, lease_release, reached only from retire after every fence completed,
 * or after a quarantine that established completion.
 *
 * Fences per lease: EV_H2D_DONE (recorded at attend or cancel after everything the lease put
 * on the H2D queue: prior-reader waits, poison, RAW waits, copies), EV_ATTN (after the op),
 * EV_WB_DONE (at seal or cancel, after the write-backs); the *_START events only time the
 * receipt. Every ticket precedes its queue's fence, so waiting on the fences waits on every
 * ticket, and a failure of anything the lease submitted reaches retire.
 */
#include "stage/stage_check.h"

#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "dev/dev_op.h"

enum { EV_H2D_START, EV_H2D_DONE, EV_ATTN_START, EV_ATTN, EV_WB_START, EV_WB_DONE, N_EV };

/* The fences: what retire waits on. */
static const int fence_events[] = {EV_H2D_DONE, EV_ATTN, EV_WB_DONE};
/* The readers of a slot (I3): what the slot's next occupant's H2D queue waits for. The
 * occupant's own copies and poison are on that same queue, hence already ordered. */
static const int reader_events[] = {EV_ATTN, EV_WB_DONE};

typedef enum lease_state {
    LS_FREE = 0,
    LS_BEGUN,
    LS_READY, /* the compute queue waits for the copies; the caller's attention may launch */
    LS_ATTENDED,
    LS_SEALED,
    LS_CANCELLED,
} lease_state;

static const char *const state_names[] = {"free", "begun", "ready", "attended", "sealed", "cancelled"};

typedef struct stage_owner {
    akv_host_page page; /* leased from begin to release */
    uint8_t written;    /* its write-back was submitted */
    uint8_t revoked;    /* cancel_owner */
} stage_owner;

/* A reference to a lease record that survives the record's reuse: the generation tells. */
typedef struct lease_ref {
    uint32_t idx_plus1; /* 0 = none */
    uint32_t gen;
} lease_ref;

typedef struct stage_rec {
    uint32_t idx; /* position in akv_stage.recs */
    uint32_t gen; /* bumped at release; handles carry it */
    lease_state state;
    uint32_t layer;
    uint64_t step, serial;
    uint32_t slot;
    akv_event *ev[N_EV];
    uint8_t recorded[N_EV]; /* recorded for this lease */
    uint8_t h2d_used;       /* it submitted work to the H2D queue (needs EV_H2D_DONE) */
    uint8_t h2d_table;      /* it copied a table the compute queue reads (copy_table) */
    uint64_t attn_serial;   /* ev[EV_ATTN]'s record serial right after attend */
    stage_owner *owners;    /* [n_owners] */
    uint32_t n_owners;
    size_t cap_owners;
    akv_host_page *tickets; /* [n_tickets] refill tickets: page i landed in slot page i */
    uint32_t n_tickets;
    size_t cap_tickets;
    uint32_t n_written; /* write-backs submitted: the tail */
    lease_ref prev;     /* the lease begun just before this one (the receipt's bus_idle_at_copy) */
    lease_ref *waited;  /* leases whose write-back fence the H2D queue already waits on */
    uint32_t n_waited;
    size_t cap_waited;
    akv_stage_receipt rc; /* accumulated; completed at retire */
    uint32_t next_free;   /* free list link (index + 1; 0 = end) */
} stage_rec;

/* The last write-back to a host page that no retire has released yet. */
typedef struct wb_mark {
    lease_ref lease;
    uint32_t page_gen;
} wb_mark;

struct akv_stage {
    akv_dev *dev;
    akv_host_pool *hpool;
    akv_dev_pool *dpool;
    akv_geom geom;
    size_t page_bytes;
    akv_repr repr;        /* the pages' representation: a compact stage has no owners */
    akv_stage_params p;
    uint32_t *slot_pages; /* [n_slots * slot_pages] device page ids, slot-major */
    akv_dev_xfer *xfer;   /* [slot_pages] the spans of one copy (no allocation per copy) */
    lease_ref *slot_last; /* [n_slots] the last lease that used each slot */
    stage_rec **recs;     /* [n_recs] records, stable addresses */
    uint32_t n_recs;
    size_t cap_recs;
    uint32_t free_head; /* free record list (index + 1; 0 = empty) */
    lease_ref last;     /* the most recently begun lease */
    wb_mark *wb_last;   /* [cap_wb] by host page id */
    size_t cap_wb;
    unsigned broken;   /* AKV__STAGE_BREAK_* (tests' negative controls); 0 in real use */
    akv_event *epoch[2];  /* the origin of the receipts' times, per step parity: recorded on
                             the H2D queue at a step's first begin (NULL: none) */
    uint64_t epoch_step[2]; /* the step + 1 each was last recorded for (0: none) */
    akv_status failed; /* AKV_OK, or the first failure */
    int retained;      /* failed and completion not established */
    akv_stage_stats stats;
};

/* ---- records and handles --------------------------------------------------------------- */

static stage_rec *ref_get(const akv_stage *st, lease_ref r) {
    if (!r.idx_plus1 || r.idx_plus1 > st->n_recs) return NULL;
    stage_rec *rec = st->recs[r.idx_plus1 - 1];
    return rec->gen == r.gen && rec->state != LS_FREE ? rec : NULL;
}

static lease_ref rec_ref(const stage_rec *rec) {
    return (lease_ref){rec->idx + 1, rec->gen};
}

/* The live record behind a handle; NULL, logged, with *err set, for a bad or stale one. */
static stage_rec *lease_get(akv_stage *st, akv_stage_lease l, const char *what, akv_status *err) {
    if (l.idx == 0 || l.idx > st->n_recs) {
        AKV_LOG_E("stage: %s: lease handle %u is not a lease of this stage", what, l.idx);
        *err = AKV_EINVAL;
        return NULL;
    }
    stage_rec *rec = ref_get(st, (lease_ref){l.idx, l.gen});
    if (!rec) {
        AKV_LOG_E("stage: %s: lease %u generation %u is stale (retired)", what, l.idx, l.gen);
        *err = AKV_ESTATE;
    }
    return rec;
}

static void rec_free_events(akv_stage *st, stage_rec *rec) {
    for (int e = 0; e < N_EV; e++)
        akv_dev_event_destroy(st->dev, rec->ev[e]);
}

/* A free record (reused or new, with its events); NULL when memory or events are short. */
static stage_rec *rec_take(akv_stage *st, akv_status *err) {
    if (st->free_head) {
        stage_rec *rec = st->recs[st->free_head - 1];
        st->free_head = rec->next_free;
        return rec;
    }
    *err = akv__array_reserve((void **)&st->recs, &st->cap_recs, (size_t)st->n_recs + 1,
                              sizeof *st->recs);
    if (*err != AKV_OK) return NULL;
    stage_rec *rec = akv__calloc(1, sizeof *rec);
    if (!rec) {
        *err = AKV_ENOMEM;
        return NULL;
    }
    for (int e = 0; e < N_EV; e++) {
        *err = akv_dev_event_create(st->dev, AKV_EVENT_TIMING, &rec->ev[e]);
        if (*err != AKV_OK) {
            rec_free_events(st, rec);
            akv__free(rec);
            return NULL;
        }
    }
    rec->gen = 1;
    rec->idx = st->n_recs;
    st->recs[st->n_recs++] = rec;
    return rec;
}

/* Returns a record to the free list (its events stay, for the next lease). */
static void rec_put(akv_stage *st, stage_rec *rec) {
    rec->gen++;
    if (rec->gen == 0) rec->gen = 1; /* 0 is never issued */
    rec->state = LS_FREE;
    rec->n_owners = rec->n_tickets = rec->n_waited = rec->n_written = 0;
    rec->next_free = st->free_head;
    st->free_head = rec->idx + 1;
}

/* ---- failure and quarantine ------------------------------------------------------------- */

/* Syncs the copy queues, the compute queue, then the device; records whether that
 * established completion. Returns the first error. */
static akv_status stage_drain(akv_stage *st) {
    static const akv_queue order[] = {AKV_QUEUE_H2D, AKV_QUEUE_D2H, AKV_QUEUE_COMPUTE};
    akv_status first = AKV_OK;
    for (size_t i = 0; i < AKV_ARRAY_LEN(order); i++) {
        akv_status s = akv_dev_queue_sync(st->dev, order[i]);
        if (s != AKV_OK && first == AKV_OK) first = s;
    }
    akv_status s = akv_dev_sync(st->dev);
    if (s != AKV_OK && first == AKV_OK) first = s;
    st->stats.n_quarantines++;
    st->retained = first != AKV_OK;
    if (st->retained)
        AKV_LOG_E("stage: quarantine could not establish completion (%s): %u lease(s), their "
                  "tickets, owners and slots stay retained",
                  akv_status_name(first), st->stats.n_live);
    else
        AKV_LOG_W("stage: quarantine established completion; %u lease(s) release at retire",
                  st->stats.n_live);
    return first;
}

/* Marks the transport failed (first cause kept) and quarantines. Returns `why`. */
static akv_status stage_fail(akv_stage *st, const stage_rec *rec, const char *what,
                             akv_status why) {
    if (st->failed == AKV_OK) {
        st->failed = why;
        if (rec)
            AKV_LOG_E("stage: transport failed at %s (lease %llu, layer %u, step %llu): %s; "
                      "quarantined",
                      what, (unsigned long long)rec->serial, rec->layer,
                      (unsigned long long)rec->step, akv_status_str(why));
        else
            AKV_LOG_E("stage: transport failed at %s: %s; quarantined", what, akv_status_str(why));
    }
    stage_drain(st);
    return why;
}

/* A device call inside a lease step: on error the transport fails. */
#define STAGE_DEV(st, rec, what, expr)                                                             \
    do {                                                                                           \
        akv_status s_ = (expr);                                                                    \
        if (s_ != AKV_OK) return stage_fail((st), (rec), (what), s_);                              \
    } while (0)

static int stage_healthy(const akv_stage *st, const char *what) {
    if (st->failed == AKV_OK) return 1;
    AKV_LOG_E("stage: %s refused: the transport failed earlier (%s)", what,
              akv_status_name(st->failed));
    return 0;
}

/* Common entry checks: a healthy stage, a live lease in one of the allowed states. */
static stage_rec *lease_enter(akv_stage *st, akv_stage_lease l, const char *what,
                              unsigned allowed_states, akv_status *err) {
    stage_rec *rec = lease_get(st, l, what, err);
    if (!rec) return NULL;
    if (!stage_healthy(st, what)) {
        *err = AKV_EFAILED;
        return NULL;
    }
    if (rec->state == LS_CANCELLED && !(allowed_states & (1u << LS_CANCELLED))) {
        AKV_LOG_E("stage: %s on lease %llu refused: it was cancelled", what,
                  (unsigned long long)rec->serial);
        *err = AKV_ECANCELED;
        return NULL;
    }
    if (!(allowed_states & (1u << rec->state))) {
        AKV_LOG_E("stage: %s on lease %llu (layer %u, step %llu) refused: it is %s", what,
                  (unsigned long long)rec->serial, rec->layer, (unsigned long long)rec->step,
                  state_names[rec->state]);
        *err = AKV_ESTATE;
        return NULL;
    }
    return rec;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

akv_stage_params akv_stage_default_params(void) {
    return (akv_stage_params){.n_slots = 2, .slot_pages = 0, .poison_byte = -1};
}

akv_status akv_stage_create(akv_dev *dev, akv_host_pool *hpool, akv_dev_pool *dpool,
                            const akv_stage_params *params, akv_stage **out) {
    if (!dev || !hpool || !dpool || !params || !out) {
        AKV_LOG_E("stage: create with a NULL %s", !dev ? "device" : !hpool ? "host pool" : !dpool ? "device pool" : !params ? "params" : "output");
        return AKV_EINVAL;
    }
    akv_stage_params p = *params;
    if (p.n_slots == 0) p.n_slots = 2;
    if (p.slot_pages == 0 || p.poison_byte < -1 || p.poison_byte > 255 || p.n_slots > 64) {
        AKV_LOG_E("stage: {=slot_pages} = %u (must be > 0), {=n_slots} = %u (1..64), poison_byte = %d "
                  "(-1 or 0..255)",
                  p.slot_pages, p.n_slots, p.poison_byte);
        return AKV_EINVAL;
    }
    const akv_geom *gh = akv_host_pool_geom(hpool), *gd = akv_dev_pool_geom(dpool);
    if (memcmp(gh, gd, sizeof *gh) != 0) {
        AKV_LOG_E("stage: the host pool and the device pool have different geometries");
        return AKV_EINVAL;
    }
    if (akv_host_pool_page_bytes(hpool) != akv_dev_pool_page_bytes(dpool)) {
        AKV_LOG_E("stage: the host pool's pages (%s, %zu bytes) are not the device pool's (%zu "
                  "bytes)",
                  akv_repr_name(akv_host_pool_repr(hpool)), akv_host_pool_page_bytes(hpool),
                  akv_dev_pool_page_bytes(dpool));
        return AKV_EINVAL;
    }
    if (akv_host_pool_dev(hpool) != dev || akv_dev_pool_dev(dpool) != dev) {
        AKV_LOG_E("stage: the %s pool was created on another device than the stage's",
                  akv_host_pool_dev(hpool) != dev ? "host" : "device");
        return AKV_EINVAL;
    }
    size_t n_pages;
    if (!akv__size_mul(p.n_slots, p.slot_pages, &n_pages) || n_pages > UINT32_MAX) {
        AKV_LOG_E("stage: %u slots of %u pages: more pages than a device pool can hold", p.n_slots,
                  p.slot_pages);
        return AKV_EINVAL;
    }
    akv_stage *st = akv__calloc(1, sizeof *st);
    if (!st) return AKV_ENOMEM;
    st->dev = dev;
    st->hpool = hpool;
    st->dpool = dpool;
    st->geom = *gh;
    st->page_bytes = akv_host_pool_page_bytes(hpool);
    st->repr = akv_host_pool_repr(hpool);
    st->p = p;
    st->slot_pages = akv__calloc(n_pages, sizeof *st->slot_pages);
    st->slot_last = akv__calloc(p.n_slots, sizeof *st->slot_last);
    akv_status s = AKV_ENOMEM;
    if (!st->slot_pages || !st->slot_last) goto fail;
    s = akv_dev_pool_staging_acquire(dpool, (uint32_t)n_pages, st->slot_pages);
    if (s != AKV_OK) {
        AKV_LOG_E("stage: the device pool's staging reserve cannot lend %zu pages (%u slots x %u "
                  "pages): raise the pool's {=staging_pages}",
                  n_pages, p.n_slots, p.slot_pages);
        goto fail;
    }
    /* sized once the reserve has taken the slots (an impossible slot size is EFULL there,
     * before this larger allocation could fail first) */
    if (!(st->xfer = akv__calloc(p.slot_pages, sizeof *st->xfer))) {
        s = akv_dev_pool_staging_release(dpool, (uint32_t)n_pages, st->slot_pages);
        AKV_ASSERT(s == AKV_OK); /* just lent */
        s = AKV_ENOMEM;
        goto fail;
    }
    /* the receipts' time origins (a step's, so float timing keeps its precision however long
     * the stage lives): without them the receipts carry durations only */
    for (int k = 0; k < 2; k++)
        if (akv_dev_event_create(dev, AKV_EVENT_TIMING, &st->epoch[k]) != AKV_OK) st->epoch[k] = NULL;
    *out = st;
    return AKV_OK;
fail:
    akv__free(st->slot_pages);
    akv__free(st->slot_last);
    akv__free(st->xfer);
    akv__free(st);
    return s;
}

akv_status akv_stage_destroy(akv_stage *st) {
    if (!st) return AKV_OK;
    if (st->stats.n_live) {
        AKV_LOG_E("stage: destroy refused: %u lease(s) live%s", st->stats.n_live,
                  st->retained ? " (retained by quarantine)" : "");
        return AKV_EBUSY;
    }
    akv_status s =
        akv_dev_pool_staging_release(st->dpool, st->p.n_slots * st->p.slot_pages, st->slot_pages);
    AKV_ASSERT(s == AKV_OK); /* the pages were lent to us at create */
    for (uint32_t i = 0; i < st->n_recs; i++) {
        rec_free_events(st, st->recs[i]);
        akv__free(st->recs[i]->owners);
        akv__free(st->recs[i]->tickets);
        akv__free(st->recs[i]->waited);
        akv__free(st->recs[i]);
    }
    for (int k = 0; k < 2; k++)
        if (st->epoch[k]) akv_dev_event_destroy(st->dev, st->epoch[k]);
    akv__free(st->recs);
    akv__free(st->wb_last);
    akv__free(st->slot_pages);
    akv__free(st->slot_last);
    akv__free(st->xfer);
    akv__free(st);
    return AKV_OK;
}

/* ---- begin ----------------------------------------------------------------------------------- */

/* Records event e of the lease on queue q. */
static akv_status rec_record(akv_stage *st, stage_rec *rec, int e, akv_queue q) {
    akv_status s = akv_dev_event_record(st->dev, rec->ev[e], q);
    if (s == AKV_OK) rec->recorded[e] = 1;
    return s;
}

/* Makes the H2D queue wait for every reader fence `prior` has recorded (before anything
 * touches the slot). Counts the waits. */
static akv_status wait_readers(akv_stage *st, stage_rec *rec, const stage_rec *prior) {
    for (size_t i = 0; i < AKV_ARRAY_LEN(reader_events); i++) {
        int e = reader_events[i];
        if (!prior->recorded[e]) continue;
        rec->h2d_used = 1;
        akv_status s = akv_dev_queue_wait_event(st->dev, AKV_QUEUE_H2D, prior->ev[e]);
        if (s != AKV_OK) return s;
        rec->rc.n_prior_waits++;
        st->stats.n_prior_waits++;
    }
    return AKV_OK;
}

/* Poisons the slot's pages on the H2D queue, contiguous runs at a time. */
static akv_status poison_slot(akv_stage *st, uint32_t slot) {
    const uint32_t *ids = st->slot_pages + (size_t)slot * st->p.slot_pages;
    for (uint32_t i = 0, j; i < st->p.slot_pages; i = j) {
        for (j = i + 1; j < st->p.slot_pages && ids[j] == ids[j - 1] + 1; j++) {
        }
        akv_status s =
            akv_dev_memset_async(st->dev, AKV_QUEUE_H2D, akv_dev_pool_page_addr(st->dpool, ids[i]),
                                 st->p.poison_byte, (size_t)(j - i) * st->page_bytes);
        if (s != AKV_OK) return s;
    }
    return AKV_OK;
}

/* Releases the host page leases of the first n pages (a refused begin or copy, a released
 * lease's tickets). */
static void release_pages(akv_stage *st, const akv_host_page *owners, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        akv_status s = akv_host_pool_page_release(st->hpool, owners[i]);
        AKV_ASSERT(s == AKV_OK);
    }
}

/* Leases n host pages, all or nothing: on a refusal the ones taken are released and the
 * error is EOVERFLOW (a page's lease count) or ESTATE (stale, not allocated). */
static akv_status lease_host_pages(akv_stage *st, const akv_host_page *pages, uint32_t n,
                                   const char *what) {
    for (uint32_t i = 0; i < n; i++) {
        akv_status s = akv_host_pool_page_lease(st->hpool, pages[i]);
        if (s != AKV_OK) {
            AKV_LOG_E("stage: %s %u (host page %u gen %u) cannot be leased: %s", what, i,
                      pages[i].id, pages[i].gen, akv_status_str(s));
            release_pages(st, pages, i);
            return s == AKV_EOVERFLOW ? s : AKV_ESTATE;
        }
    }
    return AKV_OK;
}

akv_status akv_stage_begin(akv_stage *st, uint32_t layer, uint64_t step,
                           const akv_host_page *owners, uint32_t n_owners, akv_stage_lease *out) {
    if (!st || !out || (n_owners && !owners)) return AKV_EINVAL;
    if (!stage_healthy(st, "begin")) return AKV_EFAILED;
    if (layer >= st->geom.n_layers) {
        AKV_LOG_E("stage: begin: layer %u out of range (%u layers)", layer, st->geom.n_layers);
        return AKV_EINVAL;
    }
    if (n_owners && st->repr != AKV_REPR_EXACT) {
        AKV_LOG_E("stage: begin: a stage of %s pages takes no owners (new rows are written to "
                  "exact pages only)",
                  akv_repr_name(st->repr));
        return AKV_EINVAL;
    }
    /* I3: the previously begun lease must be sealed, cancelled or retired. */
    stage_rec *prev = ref_get(st, st->last);
    if (prev && prev->state != LS_SEALED && prev->state != LS_CANCELLED) {
        AKV_LOG_E("stage: begin (layer %u, step %llu) refused: the previous lease %llu (layer "
                  "%u, step %llu) is %s, not sealed",
                  layer, (unsigned long long)step, (unsigned long long)prev->serial, prev->layer,
                  (unsigned long long)prev->step, state_names[prev->state]);
        return AKV_ESTATE;
    }
    for (uint32_t i = 0; i < n_owners; i++)
        for (uint32_t j = 0; j < i; j++)
            if (owners[i].id == owners[j].id) {
                AKV_LOG_E("stage: begin: owner %u repeats host page %u (owner %u)", i, owners[i].id,
                          j);
                return AKV_EINVAL;
            }
    /* Lease the owners (all or nothing). */
    akv_status s = lease_host_pages(st, owners, n_owners, "begin: owner");
    if (s != AKV_OK) return s;
    stage_rec *rec = rec_take(st, &s);
    if (rec && n_owners)
        s = akv__array_reserve((void **)&rec->owners, &rec->cap_owners, n_owners,
                               sizeof *rec->owners);
    if (!rec || s != AKV_OK) {
        if (rec) rec_put(st, rec);
        release_pages(st, owners, n_owners);
        return s;
    }
    /* The record is now a live lease: from here on, failures keep it (retained or released
     * by retire after quarantine). */
    uint64_t serial = ++st->stats.n_begun;
    uint32_t slot = (uint32_t)((serial - 1) % st->p.n_slots);
    rec->state = LS_BEGUN;
    rec->layer = layer;
    rec->step = step;
    rec->serial = serial;
    rec->slot = slot;
    memset(rec->recorded, 0, sizeof rec->recorded);
    rec->h2d_used = rec->h2d_table = 0;
    rec->attn_serial = 0;
    for (uint32_t i = 0; i < n_owners; i++)
        rec->owners[i] = (stage_owner){owners[i], 0, 0};
    rec->n_owners = n_owners;
    memset(&rec->rc, 0, sizeof rec->rc);
    rec->rc.t_begin_ns = akv_clock_ns();
    st->stats.n_live++;
    lease_ref me = rec_ref(rec);
    rec->prev = st->last;
    st->last = me;
    /* I3: the slot's previous occupant, if not retired, is a prior reader: the H2D queue
     * waits for its fences before the slot is poisoned or overwritten. */
    stage_rec *occ = ref_get(st, st->slot_last[slot]);
    st->slot_last[slot] = me;
    *out = (akv_stage_lease){me.idx_plus1, me.gen};
    /* the step's time origin, at its first begin: a record like any (its failure is the
     * transport's) */
    akv_event *origin = st->epoch[step & 1];
    if (origin && st->epoch_step[step & 1] != step + 1) {
        st->epoch_step[step & 1] = 0;
        STAGE_DEV(st, rec, "begin (time origin)", akv_dev_event_record(st->dev, origin, AKV_QUEUE_H2D));
        st->epoch_step[step & 1] = step + 1;
    }
    if (occ && !(st->broken & AKV__STAGE_BREAK_PRIOR))
        STAGE_DEV(st, rec, "begin (prior readers)", wait_readers(st, rec, occ));
    if (st->p.poison_byte >= 0) {
        rec->h2d_used = 1;
        STAGE_DEV(st, rec, "begin (poison)", poison_slot(st, slot));
    }
    return AKV_OK;
}

/* ---- copy
 * ---------------------------------------------------------------------------------------- */

/* The sealed, unretired lease whose write-back last targeted `page`, or NULL. */
static stage_rec *pending_writer(akv_stage *st, akv_host_page page) {
    if (page.id >= st->cap_wb) return NULL;
    wb_mark m = st->wb_last[page.id];
    if (m.page_gen != page.gen) return NULL;
    return ref_get(st, m.lease);
}

static int already_waited(const stage_rec *rec, lease_ref r) {
    for (uint32_t i = 0; i < rec->n_waited; i++)
        if (rec->waited[i].idx_plus1 == r.idx_plus1 && rec->waited[i].gen == r.gen) return 1;
    return 0;
}

akv_status akv_stage_copy(akv_stage *st, akv_stage_lease l, const akv_host_page *pages, uint32_t n,
                          uint32_t *dev_page_ids) {
    if (!st || (n && (!pages || !dev_page_ids))) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "copy", 1u << LS_BEGUN, &s);
    if (!rec) return s;
    if (n == 0) return AKV_OK;
    if (n > st->p.slot_pages - rec->n_tickets) {
        AKV_LOG_E("stage: copy of %u pages refused: lease %llu's slot has %u of %u pages free", n,
                  (unsigned long long)rec->serial, st->p.slot_pages - rec->n_tickets,
                  st->p.slot_pages);
        return AKV_EFULL;
    }
    /* Host memory first (nothing submitted yet): tickets and RAW wait records. */
    size_t need_t = rec->n_tickets + n, need_w = rec->n_waited + n;
    s = akv__array_reserve((void **)&rec->tickets, &rec->cap_tickets, need_t, sizeof *rec->tickets);
    if (s == AKV_OK)
        s = akv__array_reserve((void **)&rec->waited, &rec->cap_waited, need_w,
                               sizeof *rec->waited);
    if (s != AKV_OK) return s;
    akv_dev_xfer *x = st->xfer; /* n <= slot_pages (checked above) */
    /* Tickets: lease every host page (all or nothing). */
    if ((s = lease_host_pages(st, pages, n, "copy: page")) != AKV_OK) return s;
    const uint32_t *slot = st->slot_pages + (size_t)rec->slot * st->p.slot_pages;
    uint32_t first = rec->n_tickets;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = slot[first + i];
        rec->tickets[first + i] = pages[i];
        x[i] = (akv_dev_xfer){akv_dev_pool_page_addr(st->dpool, id),
                              akv_host_pool_page_addr(st->hpool, pages[i]), st->page_bytes};
        dev_page_ids[i] = id;
    }
    rec->n_tickets += n;
    st->stats.n_copies += n;
    st->stats.h2d_bytes += (size_t)n * st->page_bytes;
    /* RAW: a page an unretired lease writes back is read only after that write-back. */
    rec->h2d_used = 1;
    akv_status ds = AKV_OK;
    for (uint32_t i = 0; i < n && ds == AKV_OK; i++) {
        stage_rec *w = pending_writer(st, pages[i]);
        if (!w || w == rec || (st->broken & AKV__STAGE_BREAK_RAW)) continue;
        lease_ref wr = rec_ref(w);
        if (already_waited(rec, wr)) continue;
        AKV_ASSERT(w->recorded[EV_WB_DONE]); /* only sealed or cancelled leases are writers */
        ds = akv_dev_queue_wait_event(st->dev, AKV_QUEUE_H2D, w->ev[EV_WB_DONE]);
        if (ds == AKV_OK) {
            rec->waited[rec->n_waited++] = wr;
            rec->rc.n_prior_waits++;
            st->stats.n_raw_waits++;
        }
    }
    const bool first_copy = !rec->recorded[EV_H2D_START];
    if (ds == AKV_OK && first_copy) ds = rec_record(st, rec, EV_H2D_START, AKV_QUEUE_H2D);
    if (ds == AKV_OK) ds = akv_dev_copy_h2d_batch_async(st->dev, AKV_QUEUE_H2D, x, n);
    if (ds != AKV_OK) return stage_fail(st, rec, "copy", ds);
    if (first_copy) {
        rec->rc.t_copied_ns = akv_clock_ns();
        /* Did the bus wait for this submission? The lease before it, if its copies are fenced
         * and past on the device: the H2D queue had nothing left to do. */
        const stage_rec *prev = ref_get(st, rec->prev);
        int done = 0;
        if (prev && prev->recorded[EV_H2D_DONE] &&
            akv_dev_event_query(st->dev, prev->ev[EV_H2D_DONE], &done) == AKV_OK)
            rec->rc.bus_idle_at_copy = done;
    }
    return AKV_OK;
}

akv_status akv_stage_copy_table(akv_stage *st, akv_stage_lease l, akv_dptr dst, const void *src,
                                size_t n_bytes) {
    if (!st || (n_bytes && !src)) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "copy_table", 1u << LS_BEGUN, &s);
    if (!rec || n_bytes == 0) return s;
    rec->h2d_used = rec->h2d_table = 1;
    akv_status ds = akv_dev_copy_h2d_async(st->dev, AKV_QUEUE_H2D, dst, src, n_bytes);
    return ds == AKV_OK ? AKV_OK : stage_fail(st, rec, "copy_table", ds);
}

/* ---- attend
 * ---------------------------------------------------------------------------------------- */

/* BEGUN -> READY: the copies' fence, the compute queue's wait for it, the attention start. */
static akv_status lease_ready(akv_stage *st, stage_rec *rec) {
    if (rec->h2d_used)
        STAGE_DEV(st, rec, "ready (copies fence)", rec_record(st, rec, EV_H2D_DONE, AKV_QUEUE_H2D));
    if (rec->n_tickets || rec->h2d_table) {
        if (!(st->broken & AKV__STAGE_BREAK_COPY_WAIT))
            STAGE_DEV(st, rec, "ready (wait for copies)",
                      akv_dev_queue_wait_event(st->dev, AKV_QUEUE_COMPUTE, rec->ev[EV_H2D_DONE]));
    }
    STAGE_DEV(st, rec, "ready", rec_record(st, rec, EV_ATTN_START, AKV_QUEUE_COMPUTE));
    rec->state = LS_READY;
    return AKV_OK;
}

/* READY -> ATTENDED: the attention event, after everything on the compute queue so far. */
static akv_status lease_attended(akv_stage *st, stage_rec *rec, akv_event **attn_event) {
    STAGE_DEV(st, rec, "attended (attention event)",
              rec_record(st, rec, EV_ATTN, AKV_QUEUE_COMPUTE));
    rec->attn_serial = akv_dev_event_serial(rec->ev[EV_ATTN]);
    rec->state = LS_ATTENDED;
    *attn_event = rec->ev[EV_ATTN];
    return AKV_OK;
}

akv_status akv_stage_attend(akv_stage *st, akv_stage_lease l, const akv_dev_op *op,
                            const void *args, size_t args_bytes, akv_event **attn_event) {
    if (!st || !op || !attn_event) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "attend", 1u << LS_BEGUN, &s);
    if (!rec) return s;
    /* Refuse what the launch would refuse before anything is submitted: the stage stays
     * healthy for a caller's mistake. */
    if ((s = akv__dev_op_check(st->dev, op, args, args_bytes))) return s;
    if ((s = lease_ready(st, rec))) return s;
    STAGE_DEV(st, rec, "attend (op launch)", akv_dev_op_launch(st->dev, op, args, args_bytes));
    return lease_attended(st, rec, attn_event);
}

akv_status akv_stage_ready(akv_stage *st, akv_stage_lease l) {
    if (!st) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "ready", 1u << LS_BEGUN, &s);
    return rec ? lease_ready(st, rec) : s;
}

akv_status akv_stage_attended(akv_stage *st, akv_stage_lease l, akv_event **attn_event) {
    if (!st || !attn_event) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "attended", 1u << LS_READY, &s);
    return rec ? lease_attended(st, rec, attn_event) : s;
}

/* ---- write-back
 * -------------------------------------------------------------------------------------- */

akv_status akv_stage_writeback(akv_stage *st, akv_stage_lease l, uint32_t owner_idx,
                               akv_host_page host, uint32_t src_page_id, uint32_t token0,
                               uint32_t n_tokens, akv_stage_tail *tail) {
    if (!st || !tail) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "write-back", 1u << LS_ATTENDED, &s);
    if (!rec) return s;
    if (owner_idx >= rec->n_owners) {
        AKV_LOG_E("stage: write-back: owner %u out of range (lease %llu has %u)", owner_idx,
                  (unsigned long long)rec->serial, rec->n_owners);
        return AKV_EINVAL;
    }
    stage_owner *o = &rec->owners[owner_idx];
    /* I4: only the owner the lease began with. */
    if (host.id != o->page.id || host.gen != o->page.gen) {
        AKV_LOG_E("stage: write-back refused: host page %u gen %u is not owner %u of lease %llu "
                  "(host page %u gen %u)",
                  host.id, host.gen, owner_idx, (unsigned long long)rec->serial, o->page.id,
                  o->page.gen);
        return AKV_EINVAL;
    }
    if (o->revoked) {
        AKV_LOG_E("stage: write-back refused: owner %u of lease %llu was cancelled", owner_idx,
                  (unsigned long long)rec->serial);
        return AKV_ECANCELED;
    }
    if (o->written) {
        AKV_LOG_E("stage: write-back refused: owner %u of lease %llu is already written back",
                  owner_idx, (unsigned long long)rec->serial);
        return AKV_ESTATE;
    }
    const akv_geom *g = &st->geom;
    if (n_tokens == 0 || token0 >= g->page_tokens || n_tokens > g->page_tokens - token0 ||
        src_page_id >= akv_dev_pool_n_pages(st->dpool)) {
        AKV_LOG_E("stage: write-back: rows [%u, +%u) of device page %u are outside a page of %u "
                  "tokens in a pool of %u pages",
                  token0, n_tokens, src_page_id, g->page_tokens, akv_dev_pool_n_pages(st->dpool));
        return AKV_EINVAL;
    }
    s = akv__array_reserve((void **)&st->wb_last, &st->cap_wb, (size_t)host.id + 1,
                           sizeof *st->wb_last);
    if (s != AKV_OK) return s;
    /* The rows of tokens [token0, +n) in a page [2][H][P][D]: 2H rows of n*D elements, pitch
     * P*D elements, starting at element token0*D. */
    size_t elem = akv_dtype_size(g->dtype), row_pitch = akv_geom_row_pitch(g) * elem;
    size_t off = (size_t)token0 * g->head_dim * elem, width = (size_t)n_tokens * g->head_dim * elem;
    size_t n_rows = 2 * (size_t)g->n_kv_heads;
    unsigned char *dst = akv_host_pool_page_addr(st->hpool, host);
    AKV_ASSERT(dst); /* leased since begin: cannot be stale */
    /* its own page: a shared page is full and never written again (akv/host_table.h) */
    AKV_ASSERT(akv_host_pool_page_n_owners(st->hpool, host) == 1);
    if (rec->n_written == 0) {
        if (!(st->broken & AKV__STAGE_BREAK_ATTN_WAIT))
            STAGE_DEV(st, rec, "write-back (wait for attention)",
                      akv_dev_queue_wait_event(st->dev, AKV_QUEUE_D2H, rec->ev[EV_ATTN]));
        STAGE_DEV(st, rec, "write-back", rec_record(st, rec, EV_WB_START, AKV_QUEUE_D2H));
    }
    /* From here the write-back may be in flight: count it before submitting. */
    o->written = 1;
    rec->n_written++;
    st->wb_last[host.id] = (wb_mark){rec_ref(rec), host.gen};
    rec->rc.d2h_bytes += width * n_rows;
    st->stats.n_writebacks++;
    st->stats.d2h_bytes += width * n_rows;
    STAGE_DEV(st, rec, "write-back (2D copy)",
              akv_dev_copy_d2h_2d_async(
                  st->dev, AKV_QUEUE_D2H, dst + off, row_pitch,
                  akv_dptr_offset(akv_dev_pool_page_addr(st->dpool, src_page_id), off), row_pitch,
                  width, n_rows));
    *tail = (akv_stage_tail){rec->serial, rec->n_written};
    return AKV_OK;
}

/* ---- seal
 * --------------------------------------------------------------------------------------------- */

akv_status akv_stage_seal(akv_stage *st, akv_stage_lease l, akv_stage_tail tail,
                          const akv_event *attn_event) {
    if (!st) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "seal", 1u << LS_ATTENDED, &s);
    if (!rec) return s;
    /* I4: the current tail. {0, 0} stands for "no write-back". */
    int tail_ok = rec->n_written
                      ? tail.lease_serial == rec->serial && tail.n_writebacks == rec->n_written
                      : tail.lease_serial == 0 && tail.n_writebacks == 0;
    if (!tail_ok) {
        AKV_LOG_E("stage: seal refused: tail {lease %llu, %u write-backs} is not lease %llu's "
                  "current tail (%u write-backs)",
                  (unsigned long long)tail.lease_serial, tail.n_writebacks,
                  (unsigned long long)rec->serial, rec->n_written);
        return AKV_EINVAL;
    }
    /* I4: the same attention event, not re-recorded since attend. */
    if (attn_event != rec->ev[EV_ATTN] || akv_dev_event_serial(attn_event) != rec->attn_serial) {
        AKV_LOG_E("stage: seal refused: lease %llu was not given its own attention event as "
                  "recorded at attend (%s)",
                  (unsigned long long)rec->serial,
                  attn_event != rec->ev[EV_ATTN] ? "another event" : "it was re-recorded since");
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; i < rec->n_owners; i++)
        if (!rec->owners[i].written && !rec->owners[i].revoked) {
            AKV_LOG_E("stage: seal refused: owner %u (host page %u) of lease %llu has no "
                      "write-back: its new rows would be lost from the host copy",
                      i, rec->owners[i].page.id, (unsigned long long)rec->serial);
            return AKV_ESTATE;
        }
    if (rec->n_written)
        STAGE_DEV(st, rec, "seal (write-back fence)",
                  rec_record(st, rec, EV_WB_DONE, AKV_QUEUE_D2H));
    rec->state = LS_SEALED;
    st->stats.n_sealed++;
    return AKV_OK;
}

/* ---- cancel
 * ----------------------------------------------------------------------------------------- */

akv_status akv_stage_cancel(akv_stage *st, akv_stage_lease l) {
    if (!st) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec =
        lease_enter(st, l, "cancel",
                    1u << LS_BEGUN | 1u << LS_READY | 1u << LS_ATTENDED | 1u << LS_SEALED, &s);
    if (!rec) return s;
    lease_state was = rec->state;
    /* Revoked at once: nothing more is submitted for it and nothing of it is published. */
    rec->state = LS_CANCELLED;
    rec->rc.cancelled = 1;
    st->stats.n_cancelled++;
    for (uint32_t i = 0; i < rec->n_owners; i++)
        rec->owners[i].revoked = 1;
    /* Fences for what was submitted, so retire and the next occupant order after it. Copies
     * without attention: the compute queue also waits, keeping every later attention (and so
     * every later write-back) after them. (READY recorded and waited for them already.) */
    if (was == LS_BEGUN && rec->h2d_used)
        STAGE_DEV(st, rec, "cancel (copies fence)",
                  rec_record(st, rec, EV_H2D_DONE, AKV_QUEUE_H2D));
    if (was == LS_BEGUN && (rec->n_tickets || rec->h2d_table))
        STAGE_DEV(st, rec, "cancel (compute after copies)",
                  akv_dev_queue_wait_event(st->dev, AKV_QUEUE_COMPUTE, rec->ev[EV_H2D_DONE]));
    /* Ready: the caller may have launched attention over the slot since; the attention event
     * covers it, so the slot's next occupant and retire order after it. */
    if (was == LS_READY)
        STAGE_DEV(st, rec, "cancel (attention fence)",
                  rec_record(st, rec, EV_ATTN, AKV_QUEUE_COMPUTE));
    if (was == LS_ATTENDED && rec->n_written)
        STAGE_DEV(st, rec, "cancel (write-back fence)",
                  rec_record(st, rec, EV_WB_DONE, AKV_QUEUE_D2H));
    return AKV_OK;
}

akv_status akv_stage_cancel_owner(akv_stage *st, akv_stage_lease l, uint32_t owner_idx) {
    if (!st) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_enter(st, l, "cancel owner",
                                 1u << LS_BEGUN | 1u << LS_READY | 1u << LS_ATTENDED, &s);
    if (!rec) return s;
    if (owner_idx >= rec->n_owners) {
        AKV_LOG_E("stage: cancel owner %u out of range (lease %llu has %u)", owner_idx,
                  (unsigned long long)rec->serial, rec->n_owners);
        return AKV_EINVAL;
    }
    rec->owners[owner_idx].revoked = 1;
    return AKV_OK;
}

/* ---- retire
 * ----------------------------------------------------------------------------------------- */

/* Releases everything of a lease whose fences completed (or whose stage's quarantine
 * established completion). The only place tickets, owners and records are released. */
static void lease_release(akv_stage *st, stage_rec *rec) {
    release_pages(st, rec->tickets, rec->n_tickets);
    for (uint32_t i = 0; i < rec->n_owners; i++) {
        akv_host_page p = rec->owners[i].page;
        akv_status s = akv_host_pool_page_release(st->hpool, p);
        AKV_ASSERT(s == AKV_OK);
    }
    st->stats.n_live--;
    st->stats.n_retired++;
    rec_put(st, rec); /* bumps the generation: wb marks and slot refs to it go stale */
}

/* Completes the receipt at retire: what the record already counts, and the time. */
static void receipt_finish(akv_stage *st, stage_rec *rec) {
    rec->rc.layer = rec->layer;
    rec->rc.step = rec->step;
    rec->rc.serial = rec->serial;
    rec->rc.n_copies = rec->n_tickets;
    rec->rc.h2d_bytes = (size_t)rec->n_tickets * st->page_bytes;
    rec->rc.n_writebacks = rec->n_written;
    rec->rc.t_retire_ns = akv_clock_ns();
}

/* Fills the receipt's device times from the timing events. */
static void receipt_times(akv_stage *st, stage_rec *rec) {
    static const int pairs[][2] = {
        {EV_H2D_START, EV_H2D_DONE}, {EV_ATTN_START, EV_ATTN}, {EV_WB_START, EV_WB_DONE}};
    uint64_t *out[] = {&rec->rc.h2d_ns, &rec->rc.attn_ns, &rec->rc.d2h_ns};
    for (size_t i = 0; i < AKV_ARRAY_LEN(pairs); i++) {
        uint64_t ns = 0;
        if (rec->recorded[pairs[i][0]] && rec->recorded[pairs[i][1]] &&
            akv_dev_event_elapsed_ns(st->dev, rec->ev[pairs[i][0]], rec->ev[pairs[i][1]], &ns) ==
                AKV_OK)
            *out[i] = ns;
    }
    static const int at[] = {EV_H2D_START, EV_H2D_DONE, EV_ATTN_START, EV_ATTN};
    uint64_t *at_out[] = {&rec->rc.at_h2d_start_ns, &rec->rc.at_h2d_done_ns,
                          &rec->rc.at_attn_start_ns, &rec->rc.at_attn_done_ns};
    akv_event *origin = st->epoch_step[rec->step & 1] == rec->step + 1 ? st->epoch[rec->step & 1] : NULL;
    for (size_t i = 0; origin && i < AKV_ARRAY_LEN(at); i++) {
        uint64_t ns = 0;
        if (rec->recorded[at[i]] && akv_dev_event_elapsed_ns(st->dev, origin, rec->ev[at[i]], &ns) == AKV_OK)
            *at_out[i] = ns;
    }
}

akv_status akv_stage_retire(akv_stage *st, akv_stage_lease l, akv_stage_receipt *receipt) {
    if (!st || !receipt) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec = lease_get(st, l, "retire", &s);
    if (!rec) return s;
    if (st->failed != AKV_OK) {
        /* I6: released only when the quarantine established completion. */
        if (st->retained) {
            AKV_LOG_E("stage: retire of lease %llu refused: the transport failed and completion "
                      "is not established; the lease stays retained (akv_stage_quarantine)",
                      (unsigned long long)rec->serial);
            return AKV_EFAILED;
        }
        rec->rc.failed = 1;
        receipt_finish(st, rec);
        *receipt = rec->rc;
        lease_release(st, rec);
        return AKV_EFAILED;
    }
    if (rec->state != LS_SEALED && rec->state != LS_CANCELLED) {
        AKV_LOG_E("stage: retire of lease %llu refused: it is %s (seal or cancel it first)",
                  (unsigned long long)rec->serial, state_names[rec->state]);
        return AKV_ESTATE;
    }
    /* I5: wait on every fence, errors returned, before anything is released. */
    for (size_t i = 0; i < AKV_ARRAY_LEN(fence_events); i++) {
        int e = fence_events[i];
        if (rec->recorded[e])
            STAGE_DEV(st, rec, "retire (fence wait)", akv_dev_event_sync(st->dev, rec->ev[e]));
    }
    receipt_finish(st, rec);
    receipt_times(st, rec);
    *receipt = rec->rc;
    lease_release(st, rec);
    return AKV_OK;
}

akv_status akv_stage_poll(akv_stage *st, akv_stage_lease l, int *ready) {
    if (!st || !ready) return AKV_EINVAL;
    akv_status s = AKV_OK;
    stage_rec *rec =
        lease_enter(st, l, "poll",
                    1u << LS_BEGUN | 1u << LS_READY | 1u << LS_ATTENDED | 1u << LS_SEALED |
                        1u << LS_CANCELLED,
                    &s);
    if (!rec) return s;
    int all = rec->state == LS_SEALED || rec->state == LS_CANCELLED;
    for (size_t i = 0; i < AKV_ARRAY_LEN(fence_events) && all; i++) {
        int e = fence_events[i], done = 0;
        if (!rec->recorded[e]) continue;
        STAGE_DEV(st, rec, "poll (fence query)", akv_dev_event_query(st->dev, rec->ev[e], &done));
        all = done;
    }
    *ready = all;
    return AKV_OK;
}

/* ---- status
 * --------------------------------------------------------------------------------------- */

akv_status akv_stage_status(const akv_stage *st) {
    return st && st->failed == AKV_OK ? AKV_OK : AKV_EFAILED;
}

akv_status akv_stage_quarantine(akv_stage *st) {
    if (!st) return AKV_EINVAL;
    if (st->failed == AKV_OK) {
        AKV_LOG_E("stage: quarantine of a healthy transport refused");
        return AKV_ESTATE;
    }
    return stage_drain(st);
}

void akv_stage_get_stats(const akv_stage *st, akv_stage_stats *out) {
    *out = st->stats;
    out->failed = st->failed != AKV_OK;
    out->retained = st->retained;
}

akv_stage_params akv_stage_get_params(const akv_stage *st) {
    return st->p;
}

akv_status akv_stage_check_pools(const akv_stage *st, const akv_host_pool *hpool, const akv_dev_pool *dpool) {
    if (!st) return AKV_EINVAL;
    if (st->hpool == hpool && st->dpool == dpool) return AKV_OK;
    AKV_LOG_E("stage: it was created over another %s pool", st->hpool != hpool ? "host" : "device");
    return AKV_EINVAL;
}

void akv__stage_break(akv_stage *st, unsigned flags) {
    st->broken = flags;
}

/* ---- validity walker ----------------------------------------------------------------------------
 */

#define CHECK_INV(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            AKV_LOG_E("stage check: " __VA_ARGS__);                                                \
            return AKV_ESTATE;                                                                     \
        }                                                                                          \
    } while (0)

akv_status akv__stage_check(const akv_stage *st) {
    uint32_t n_live = 0, n_open = 0, n_free = 0;
    for (uint32_t f = st->free_head; f; f = st->recs[f - 1]->next_free) {
        CHECK_INV(f <= st->n_recs && st->recs[f - 1]->state == LS_FREE,
                  "free list holds a live record");
        CHECK_INV(++n_free <= st->n_recs, "free list has a cycle");
    }
    for (uint32_t i = 0; i < st->n_recs; i++) {
        const stage_rec *r = st->recs[i];
        CHECK_INV(r->gen != 0, "record %u has generation 0", i);
        if (r->state == LS_FREE) continue;
        n_live++;
        n_open += r->state == LS_BEGUN || r->state == LS_READY || r->state == LS_ATTENDED;
        CHECK_INV(r->slot < st->p.n_slots, "lease %llu in slot %u of %u",
                  (unsigned long long)r->serial, r->slot, st->p.n_slots);
        CHECK_INV(r->n_tickets <= st->p.slot_pages, "lease %llu has %u tickets for %u slot pages",
                  (unsigned long long)r->serial, r->n_tickets, st->p.slot_pages);
        for (uint32_t t = 0; t < r->n_tickets; t++)
            CHECK_INV(akv_host_pool_page_is_live(st->hpool, r->tickets[t]),
                      "lease %llu ticket %u: host page %u gen %u is not live while leased",
                      (unsigned long long)r->serial, t, r->tickets[t].id, r->tickets[t].gen);
        for (uint32_t o = 0; o < r->n_owners; o++)
            CHECK_INV(akv_host_pool_page_is_live(st->hpool, r->owners[o].page),
                      "lease %llu owner %u is not live while leased", (unsigned long long)r->serial,
                      o);
        if (r->state == LS_ATTENDED || r->state == LS_SEALED)
            CHECK_INV(r->recorded[EV_ATTN], "lease %llu attended without an attention event",
                      (unsigned long long)r->serial);
        if (r->state == LS_SEALED || r->state == LS_CANCELLED) {
            /* every ticket, poison and wait is covered by a fence recorded after it */
            CHECK_INV(!r->h2d_used || r->recorded[EV_H2D_DONE] || st->failed,
                      "lease %llu: H2D work without a fence", (unsigned long long)r->serial);
            CHECK_INV(!r->n_written || r->recorded[EV_WB_DONE] || st->failed,
                      "lease %llu: write-backs without a fence", (unsigned long long)r->serial);
        }
        if (r->state == LS_SEALED)
            for (uint32_t o = 0; o < r->n_owners; o++)
                CHECK_INV(r->owners[o].written || r->owners[o].revoked,
                          "sealed lease %llu: owner %u has no write-back",
                          (unsigned long long)r->serial, o);
    }
    CHECK_INV(n_live == st->stats.n_live, "%u live records, stats say %u", n_live,
              st->stats.n_live);
    CHECK_INV(n_live + n_free == st->n_recs, "%u live + %u free records of %u", n_live, n_free,
              st->n_recs);
    CHECK_INV(n_open <= 1, "%u leases open (begun, ready or attended) at once", n_open);
    if (n_open) {
        const stage_rec *last = ref_get(st, st->last);
        CHECK_INV(last && (last->state == LS_BEGUN || last->state == LS_READY ||
                           last->state == LS_ATTENDED),
                  "the open lease is not the last one begun");
    }
    CHECK_INV(!st->retained || st->failed, "retained without a failure");
    return AKV_OK;
}
