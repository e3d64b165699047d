/*
 * akv/stage.h — staging: the transport that brings non-resident K/V pages to the device for
 * one layer's attention and writes the new rows back to the authoritative host copy.
 *
 * Every staged layer of every step is a transaction, a *lease*:
 *
 *     begin(layer, step, owners)  take a staging slot; declare the host pages (owners) that
 *                                 will receive this step's new rows; lease them
 *     copy(host pages)            H2D queue: host pages -> the slot's device pages (tickets)
 *     attend(op, args)            compute queue waits (on the device) for the copies, runs the
 *                                 attention op, records the attention event
 *       = ready() ... attended()  the same, split for a caller that launches its own attention
 *                                 (a forward pass): ready makes the compute queue wait for the
 *                                 copies; the caller launches its kernels on the compute
 *                                 queue; attended records the attention event after them
 *     writeback(owner, rows)      D2H queue waits (on the device) for the attention event,
 *                                 copies ONLY the new rows of the device tail page to the
 *                                 owner host page: one 2D copy per page
 *     seal(tail, attention event) the lease's device work is all submitted
 *     retire()                    the host waits for every fence, gets a receipt, and only
 *                                 then are tickets, owner leases and the record released
 *
 * The host never blocks between begin and seal: all ordering is by device events. Only
 * retire (and poll, which does not block) asks the device, typically at the step boundary.
 *
 * Glossary
 *   stage      the transport of one device: its staging slots, lease records and fences.
 *   slot       a set of slot_pages device pages (lent by the device pool's staging reserve)
 *              that one lease fills. Leases take slots round-robin (lease k uses slot
 *              k mod n_slots): with two slots, layer l+1's copies overlap layer l's attention.
 *   ticket     one host page a copy reads (refill) with the host page lease that keeps its
 *              id and generation from being freed or recycled while DMA may still touch it.
 *   owner      a host page that receives new rows (the tail page of a sequence), leased from
 *              begin to retirement.
 *   tail       what the write-backs have reached: {lease serial, number of write-backs}.
 *              Each write-back returns the new tail; seal must be given the current one.
 *   fence      an event recorded after a lease's work on one queue: h2d_done (after
 *              everything it put on the H2D queue: prior-reader waits, poison, copies),
 *              attn (after the op), wb_done (after the write-backs). Retire waits on all
 *              three, so a failure of any work the lease submitted reaches it.
 *   readers    of a sealed lease: its attention event and its write-back event; a new lease on
 *              the same slot takes them as prior readers: its H2D queue waits for them before
 *              the slot is poisoned or overwritten.
 *   receipt    what retirement returns: counts, bytes, host and device times.
 *   failed     a transport state: any device error (submission or wait) marks the stage failed
 *              for good and quarantines it (below). Every later call returns AKV_EFAILED.
 *
 * Invariants (each enforced here and proved by tests/test_stage.c; docs/staging.md maps them)
 *   I3  A lease begins only after the previously begun lease is sealed, cancelled or retired.
 *       If the previous occupant of its slot is sealed but not retired, that lease's readers
 *       (attention and write-back events) become the new lease's prior readers: the H2D queue
 *       waits for them before anything touches the slot. (With n_slots = 1 the slot's previous
 *       occupant IS the previous lease: invariant 3 of docs/design.md word for word.)
 *   I4  A write-back goes only to the owner the lease began with (same page id and generation);
 *       any other host page is AKV_EINVAL. Seal requires the current tail and the very event
 *       attend (or attended) returned, not re-recorded since (a substituted event is
 *       AKV_EINVAL), and every owner written back or revoked.
 *   I5  Retire waits on every fence (returning the error of any that failed), fills the
 *       receipt, and only then releases tickets, owner leases and the record. A ticket is
 *       covered by the fence of its queue, recorded after it.
 *   I6  Any device error marks the transport failed and quarantines: sync the H2D queue, the
 *       D2H queue, the compute queue, then the device. If that establishes completion, each
 *       lease is released at its retire (receipt.failed = 1); if not, every ticket, owner lease,
 *       slot and record stays retained (never reused) until akv_stage_quarantine succeeds.
 *       A failed stage begins no lease again: its slots are never recycled.
 *   I7  Cancellation revokes at once (no further submission, no write-back, receipt.cancelled)
 *       but physical release still waits for retire, i.e. for every fence: a cancelled
 *       context's host pages stay leased (the pool's deferred free completes at release).
 *   RAW A copy of a host page that a sealed, unretired lease writes back waits (on the device)
 *       for that write-back's fence: a refill never reads a host row still in flight.
 *   Destroy never waits, submits or drains; with any live lease it is AKV_EBUSY.
 *
 * Poisoning (tests): with params.poison_byte >= 0, a slot's pages are set to that byte on the
 * H2D queue right after the prior readers' waits, i.e. the moment the slot changes hands on the
 * device; a reader that runs one event too early reads poison.
 *
 * Thread-safety: none; the engine thread owns the stage, the host pool and the device pool.
 */
#ifndef AKV_STAGE_H
#define AKV_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/host_pool.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_stage akv_stage;

/* A lease handle: a plain value; a retired lease's handle is stale (AKV_ESTATE). */
typedef struct akv_stage_lease {
    uint32_t idx; /* lease record */
    uint32_t gen; /* generation of the record; 0 is never issued */
} akv_stage_lease;

/* How far the write-backs of a lease have gone; {0, 0} for a lease with no write-back. */
typedef struct akv_stage_tail {
    uint64_t lease_serial; /* the lease's begin serial (1-based) */
    uint32_t n_writebacks; /* write-backs submitted so far */
} akv_stage_tail;

typedef struct akv_stage_params {
    uint32_t n_slots;    /* staging slots used round-robin; 0 = 2 */
    uint32_t slot_pages; /* device pages per slot: the most one lease can stage; must be > 0 */
    int poison_byte;     /* -1 = off; 0..255: poison every slot when it changes hands (tests) */
} akv_stage_params;

typedef struct akv_stage_receipt {
    uint32_t layer;
    uint64_t step;
    uint64_t serial;        /* begin order, 1-based */
    uint32_t n_copies;      /* host pages refilled */
    size_t h2d_bytes;       /* bytes copied host -> device */
    uint32_t n_writebacks;  /* 2D write-backs */
    size_t d2h_bytes;       /* bytes written back (rows only) */
    uint32_t n_prior_waits; /* device waits on earlier leases' fences (slot readers, RAW) */
    uint64_t t_begin_ns;    /* host clock at begin (core/clock.h origin) */
    uint64_t t_retire_ns;   /* host clock when the fences were found complete */
    uint64_t t_copied_ns;   /* host clock when its first copies were submitted; 0 if none */
    /* at that submission the lease begun before it had its copies' fence recorded and the
     * device had passed it: the bus (H2D queue) waited for this host, not the other way */
    int bus_idle_at_copy;
    uint64_t h2d_ns;        /* device time from the first copy to h2d_done; 0 if no copy */
    uint64_t attn_ns;       /* device time of the op; 0 if never attended */
    uint64_t d2h_ns;        /* device time from the first write-back to wb_done; 0 if none */
    /* when, in device time from its step's origin (an event the stage records at the step's
     * first begin, on the H2D queue: one origin for the step's leases): its first copy, its
     * copies' fence, its attention's start and end; 0 where not recorded (or before it) */
    uint64_t at_h2d_start_ns, at_h2d_done_ns, at_attn_start_ns, at_attn_done_ns;
    int cancelled;          /* revoked: nothing of this lease may be published */
    int failed;             /* released after a transport failure (completion was proven) */
} akv_stage_receipt;

typedef struct akv_stage_stats {
    uint64_t n_begun, n_sealed, n_retired, n_cancelled;
    uint64_t n_copies, n_writebacks, n_prior_waits, n_raw_waits;
    size_t h2d_bytes, d2h_bytes;
    uint64_t n_quarantines; /* drains after a failure: on the failure, and each asked for */
    uint32_t n_live; /* leases begun and not yet released */
    int failed;      /* the transport has failed */
    int retained;    /* ... and completion could not be established: resources retained */
} akv_stage_stats;

/* n_slots = 2, slot_pages = 0 (must be set), poison off. */
akv_stage_params akv_stage_default_params(void);

/* Creates the stage of `dev`, over the host pool (owners and tickets) and the device pool
 * (n_slots * slot_pages pages of its staging reserve, held until destroy). All three must
 * outlive it and share the device and the geometry, and the two pools one page size: exact
 * pages, or compact pages of one form (akv/kv_repr.h; a stage of compact pages stages copies
 * made elsewhere and takes no owners: new rows go to exact pages only).
 * AKV_EINVAL, logged naming the setting, for bad params or mismatched pools; AKV_EFULL when the
 * staging reserve is too small (--staging pages); AKV_ENOMEM; AKV_EDEVICE creating events. */
akv_status akv_stage_create(akv_dev *dev, akv_host_pool *hpool, akv_dev_pool *dpool,
                            const akv_stage_params *p, akv_stage **out);

/* Returns the slots to the device pool and frees the stage. NULL is a no-op. AKV_EBUSY,
 * nothing changed, while any lease is live (retire, or cancel and retire, first; a failed
 * stage with retained leases stays busy until akv_stage_quarantine succeeds). Never waits,
 * submits or drains. */
akv_status akv_stage_destroy(akv_stage *st);

/* Begins a lease for (layer, step) with n_owners host pages that will receive new rows
 * (owners[i] is sequence i's tail page; n_owners may be 0, and must be on a compact stage). Leases every owner (all or
 * nothing). Submits the prior-reader waits and the poison on the H2D queue.
 * AKV_ESTATE: the previously begun lease is neither sealed nor cancelled nor retired, or an
 * owner handle is stale or doomed; AKV_EINVAL: bad arguments, layer out of range, an owner
 * repeated; AKV_EFAILED: the stage has failed; AKV_EDEVICE: a submission failed (the stage is
 * now failed and quarantined). */
akv_status akv_stage_begin(akv_stage *st, uint32_t layer, uint64_t step,
                           const akv_host_page *owners, uint32_t n_owners, akv_stage_lease *out);

/* Copies n host pages into the lease's slot (H2D queue) and writes the device page id each
 * landed in to dev_page_ids[n]. Each page is leased (a ticket) before anything is submitted;
 * a page that a sealed, unretired lease writes back is copied only after that write-back's
 * fence (device wait). May be called several times before attend. AKV_EFULL, nothing changed:
 * the slot has fewer than n free pages; AKV_ESTATE: after attend, or a stale/doomed host page
 * (nothing changed); AKV_ECANCELED; AKV_EFAILED; AKV_EDEVICE (the stage is failed). */
akv_status akv_stage_copy(akv_stage *st, akv_stage_lease l, const akv_host_page *pages, uint32_t n,
                          uint32_t *dev_page_ids);

/* Copies n_bytes of host memory to dst on the H2D queue with the lease's pages, before their
 * fence: the compute queue's wait at ready (or cancel) covers it. For the small table the
 * attention reads beside the pages (a layer's row of slot ids): a copy on the compute queue
 * would wait behind the next layers' refills on the same copy engine. src must stay unchanged
 * until the lease is attended (the compute queue's drain covers it). n_bytes = 0 submits
 * nothing. AKV_EINVAL: no src; AKV_ESTATE: after ready; AKV_ECANCELED; AKV_EFAILED;
 * AKV_EDEVICE (the stage is failed). */
akv_status akv_stage_copy_table(akv_stage *st, akv_stage_lease l, akv_dptr dst, const void *src,
                                size_t n_bytes);

/* Launches the attention op on the compute queue after the lease's copies (device wait) and
 * records the attention event; *attn_event (borrowed, valid until retire) is the event seal
 * must be given. Once per lease. AKV_ESTATE: not begun-and-unattended; AKV_EINVAL/EUNSUPPORTED
 * from the op launch (nothing submitted, the stage stays healthy); AKV_ECANCELED; AKV_EFAILED;
 * AKV_EDEVICE. */
akv_status akv_stage_attend(akv_stage *st, akv_stage_lease l, const akv_dev_op *op,
                            const void *args, size_t args_bytes, akv_event **attn_event);

/* The first half of attend, for a caller that launches the attention itself: the compute
 * queue waits (on the device) for the lease's copies, so any kernel launched on
 * AKV_QUEUE_COMPUTE after it reads the staged pages complete. No copy after it. Once per
 * lease, instead of attend. AKV_ESTATE: not begun-and-unattended (or already ready);
 * AKV_ECANCELED; AKV_EFAILED; AKV_EDEVICE (the stage is failed). A ready lease that is
 * cancelled records its attention event at the cancel (covering what the caller launched). */
akv_status akv_stage_ready(akv_stage *st, akv_stage_lease l);

/* The second half: records the attention event on the compute queue now, i.e. after every
 * kernel the caller launched there since ready; *attn_event as for attend. AKV_ESTATE: not
 * ready; AKV_ECANCELED; AKV_EFAILED; AKV_EDEVICE. */
akv_status akv_stage_attended(akv_stage *st, akv_stage_lease l, akv_event **attn_event);

/* Writes back the new rows [token0, token0 + n_tokens) of device page src_page_id (a device
 * pool page, normally the sequence's tail in its window) to the owner host page `host`, which
 * must be owners[owner_idx] of begin: one 2D copy of 2 * n_kv_heads rows on the D2H queue,
 * after the attention event. Returns the new tail. AKV_EINVAL: a different host owner (id or
 * generation), rows outside the page, a page id outside the pool, owner_idx out of range;
 * AKV_ESTATE: before attend(ed), after seal, or the owner was already written back;
 * AKV_ECANCELED: the lease or that owner was cancelled; AKV_EFAILED; AKV_EDEVICE. */
akv_status akv_stage_writeback(akv_stage *st, akv_stage_lease l, uint32_t owner_idx,
                               akv_host_page host, uint32_t src_page_id, uint32_t token0,
                               uint32_t n_tokens, akv_stage_tail *tail);

/* Seals the lease: `tail` must be its current tail and attn_event the event attend returned,
 * not re-recorded since; every owner must be written back or revoked. Records the write-back
 * fence. AKV_EINVAL: an old or foreign tail, a substituted event; AKV_ESTATE: not attended, or
 * an owner still lacks its write-back; AKV_ECANCELED; AKV_EFAILED; AKV_EDEVICE. */
akv_status akv_stage_seal(akv_stage *st, akv_stage_lease l, akv_stage_tail tail,
                          const akv_event *attn_event);

/* Retires a sealed or cancelled lease: waits on every fence, fills *receipt, then releases the
 * tickets, the owner leases and the record (the handle becomes stale). AKV_ESTATE: not sealed
 * or cancelled (nothing changed); AKV_EDEVICE: a fence failed (the stage is now failed and
 * quarantined; see AKV_EFAILED); AKV_EFAILED: the stage has failed: if quarantine established
 * completion the lease is released anyway and *receipt (failed = 1) is written, otherwise it
 * stays retained and *receipt is untouched. */
akv_status akv_stage_retire(akv_stage *st, akv_stage_lease l, akv_stage_receipt *receipt);

/* Non-blocking: *ready = 1 when the lease is sealed or cancelled and every fence has completed
 * (retire would not block). AKV_EDEVICE as for retire; AKV_ESTATE for a stale handle. */
akv_status akv_stage_poll(akv_stage *st, akv_stage_lease l, int *ready);

/* Cancels (revokes) the whole lease at once: no further copy, attend, write-back or seal
 * (AKV_ECANCELED); fences are recorded for the work already submitted, so the next lease
 * orders after it and retire waits for it. Publication is revoked; physical release waits for
 * retire. Allowed in any live state; a cancelled lease counts as sealed for I3. */
akv_status akv_stage_cancel(akv_stage *st, akv_stage_lease l);

/* Revokes one owner (its sequence's context went away): its write-back is refused
 * (AKV_ECANCELED) and no longer required by seal. Its owner lease is held until retire. */
akv_status akv_stage_cancel_owner(akv_stage *st, akv_stage_lease l, uint32_t owner_idx);

/* The stage's transport status: AKV_OK or AKV_EFAILED. */
akv_status akv_stage_status(const akv_stage *st);

/* Quarantine again (after a failure that left resources retained, e.g. once the device has
 * recovered): syncs the H2D, D2H and compute queues, then the device. AKV_OK when completion
 * is established (retained leases are then released at their retire); the error otherwise.
 * AKV_ESTATE on a healthy stage. The stage stays failed either way. */
akv_status akv_stage_quarantine(akv_stage *st);

void akv_stage_get_stats(const akv_stage *st, akv_stage_stats *out);

/* The params the stage runs with (n_slots resolved). */
akv_stage_params akv_stage_get_params(const akv_stage *st);

/* Whether the stage was created over these pools (AKV_OK), else AKV_EINVAL, logged naming
 * the pool that differs: a borrower's copies must land in the pool its tables point into. */
akv_status akv_stage_check_pools(const akv_stage *st, const akv_host_pool *hpool, const akv_dev_pool *dpool);

#ifdef __cplusplus
}
#endif
#endif /* AKV_STAGE_H */
