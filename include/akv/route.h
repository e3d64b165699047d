/*
 * akv/route.h — how one sequence's attention history reaches the forward pass: its host
 * pages (the authoritative copy), its device pages, and the page tables the attention reads.
 *
 * Glossary
 *   route      the policy that places the history for a step (DESIGN.md, "Routes"):
 *              RESIDENT  every page of the history is in the device pool (the baseline);
 *              STAGED    the window (sink + newest pages, window_pages of them) stays in the
 *                        device pool between steps; every other page is staged each step,
 *                        per layer, under a lease of the staging layer (akv/stage.h).
 *   host copy  the sequence's akv_host_table: every layer's pages in the host pool. After each
 *              layer of each step the new tokens' rows are written back to it, so it always
 *              holds the whole history (invariant 1 of DESIGN.md).
 *   fresh page a device page the device pool placed this step; if its logical page already
 *              holds tokens from earlier steps, it is filled from the host copy before the
 *              attention reads it (a page the window dropped and took back, or a reclaimed
 *              one): nothing is ever read from a device page the host copy did not fill.
 *
 * A step: akv_route_begin_step(r, n_total) grows the history to n_total tokens (host pages
 * for the new tokens, the device window placed and filled, one CSR table per layer), then the
 * forward pass runs with akv_route_forward_kv(r) as its hooks: begin_layer hands it the
 * layer's table, end_layer writes the new rows of the layer back to the host copy. A failed
 * step is undone with akv_route_truncate(r, n_before).
 *
 * The staged route, per layer of a step (docs/routes.md):
 *   begin_layer  stage begin (owners = the host pages that receive the step's new rows),
 *                stage copy of the non-window host pages into a slot, the layer's CSR table in
 *                logical order (window page ids and the slot page ids the copy returned),
 *                stage ready: the compute queue waits for the copies before the attention the
 *                forward pass launches next.
 *   end_layer    stage attended (the attention event, after the attention the pass launched),
 *                write-back of only the new rows from the device page(s) holding them (window
 *                tail or slot page) to the owner host page(s), seal.
 *   Prefetch (queued mode, params.prefetch): a step's copies gate its layers one after another,
 *   so without more the bus idles from the last layer's copy to the next step's first one
 *   (the last layer, the output head, the logits, sampling, begin_step). When the last layer
 *   is sealed and the next one-token step stays inside the current last page (the window
 *   does not move, so the next step stages exactly the same pages), end_layer of the last
 *   layer begins the next step's layer-0 lease and enqueues its copies at once; begin_layer 0
 *   of that step then only makes the compute queue wait for them. Any other next call (a
 *   chunk, a truncate, a sync, destroy) cancels the prefetched lease, which then retires like
 *   any other (its fences waited on). The bits are unchanged: the same pages, the same slots
 *   round-robin, the same tables.
 *   The leases of a step are retired (fences waited on, receipts checked) at the route's next
 *   begin_step, akv_route_sync or akv_route_truncate; destroy refuses (AKV_EBUSY) while any
 *   is live. The table has the same max_pages as the resident route's, so the attention's
 *   partitioning (akv/attn.h: capacity, n_seq, device) and hence its bits are the same: only
 *   the physical page ids differ.
 *
 * Two modes, by the forward pass the route feeds:
 *   direct  (akv/forward.h, the host forward pass) the page tables are host arrays, fills and
 *           write-backs are synchronous copies; host backend only (the ref attention reads
 *           device addresses as host addresses).
 *   queued  (akv/forward_dev.h, the pass on the device's queues; params.queued) the tables
 *           live in device memory, uploaded with the fills on AKV_QUEUE_COMPUTE from pinned
 *           memory at begin_step; end_layer records an event on the compute queue and
 *           enqueues the write-back of the layer's new rows on AKV_QUEUE_D2H behind it (one
 *           2D copy per page touched: 2*n_kv_heads rows). begin_step, truncate and
 *           akv_route_sync first wait for both queues, so the host copy is complete and no
 *           copy still reads a table or a page the step changes. Required off the host
 *           backend; works on both.
 * Fresh pages: the device pool may hand a step a page another route's write-back is still
 * reading (a reclaimed page); the step's fills and kernels wait for every write-back enqueued
 * so far before they touch a fresh page (queued: on the device; direct: the host waits).
 * Failures while work runs (resident, queued): once the queues are idle again, a write-back
 * that failed is enqueued again from the device pages, which still hold the rows; a step
 * whose kernels failed is undone (the history goes back to where it began) and the call
 * that finds it returns AKV_EDEVICE once, logged.
 *
 * Thread-safety: none; the thread that owns the pools owns the route.
 */
#ifndef AKV_ROUTE_H
#define AKV_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/forward.h"
#include "akv/host_pool.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_route_kind {
    AKV_ROUTE_RESIDENT = 0, /* every page in the device pool */
    AKV_ROUTE_STAGED = 1,   /* the window in the device pool, the rest staged */
} akv_route_kind;

typedef struct akv_route akv_route;
typedef struct akv_stage akv_stage; /* akv/stage.h */

/* The staged route's window when params.window_pages is 0: the sink and three newest pages. */
#define AKV_ROUTE_WINDOW_PAGES 4u

typedef struct akv_route_params {
    akv_route_kind kind;
    uint64_t max_tokens; /* the longest history the sequence may reach (>= 1) */
    uint64_t tag;        /* the caller's id, for the device pool's explanations */
    bool queued;         /* tables in device memory, copies on the queues (file comment);
                            false = direct (host backend only) */
    /* staged only */
    uint32_t window_pages; /* window pages per layer kept on the device (>= 2: the sink and
                              the newest); 0 = AKV_ROUTE_WINDOW_PAGES */
    akv_stage *stage;      /* the transport, borrowed (several routes may share one; its slots
                              must hold akv_route_slot_pages pages; a lease a failed pass left
                              open blocks every other route's begin on it, AKV_ESTATE (stage
                              I3), until that route truncates or syncs); NULL = the route
                              creates its own with 2 slots from the device pool's staging
                              reserve (akv_route_staging_pages of them) */
    int prefetch;          /* queued mode: stage layer 0 of the NEXT decode step as soon as this
                              step's last layer is sealed, so its copies cross the bus while the
                              output head, sampling and begin_step run (file comment). 0 = on
                              when the route owns its stage; 1 = on (the caller promises that no
                              other route begins a lease on a shared stage between this route's
                              steps); -1 = off */
} akv_route_params;

typedef struct akv_route_stats {
    uint64_t n_steps;      /* begin_step calls that succeeded */
    uint64_t n_tokens;     /* history length now */
    uint64_t h2d_bytes;    /* host -> device: fills of fresh pages and staged copies */
    uint64_t staged_bytes; /* of them, the staged copies (non-window pages) */
    uint64_t n_leases;     /* staged: leases retired (receipts checked) */
    uint64_t n_prefetched; /* staged: steps whose layer 0 was staged during the previous step */
    uint64_t n_prefetch_dropped; /* staged: prefetches cancelled (the next step was not the
                                    one-token step they were made for, or a sync came first) */
    uint64_t d2h_bytes;    /* device -> host: write-back of new rows */
    uint64_t n_quarantines; /* staged: its stage's quarantines (akv_stage_stats); the route
                               asks for at most one per call that retires leases */
    uint32_t window_pages; /* device window pages per layer now */
    uint32_t host_pages;   /* host pages per layer now */
} akv_route_stats;

/* Device pages one staging slot of the staged route needs: the logical pages of a
 * max_tokens history outside a window of window_pages (0 = the default), at least 1. */
uint32_t akv_route_slot_pages(const akv_geom *g, uint64_t max_tokens, uint32_t window_pages);

/* Staging reserve (device pages) a staged route that creates its own stage takes from the
 * device pool: 2 slots of akv_route_slot_pages. */
uint32_t akv_route_staging_pages(const akv_geom *g, uint64_t max_tokens, uint32_t window_pages);
/* (Both saturate at UINT32_MAX, more pages than any device pool holds, which it refuses.) */

/* A route for one sequence over the pools (which must outlive it and share one geometry).
 * AKV_EUNSUPPORTED (logged) for the direct mode off the host backend;
 * AKV_EINVAL for a zero max_tokens, pools of different geometries, a resident history
 * longer than the device pool's window capacity (logged with the GiB it would need), a staged
 * window above that capacity or below 2, or a stage whose slots are too small (logged, naming
 * --device-gib / --max-context); AKV_EFULL when the staging reserve cannot lend the route's
 * own stage its slots (logged); AKV_ENOMEM. */
akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out);

/* Frees the host pages and the device window (and the route's own stage). NULL is a no-op.
 * AKV_EBUSY (nothing changed) while a host page is leased or a staged lease is unretired
 * (akv_route_sync first: destroy never retires). Queued mode: waits for the queues first (a copy may still
 * touch the pages); if that fails, AKV_EDEVICE and nothing is freed (retained, never reused
 * on an uncertain fence). */
akv_status akv_route_destroy(akv_route *r);

/* Grows the history to n_total tokens (> the current length, <= max_tokens) and places it
 * for the next forward run (see the file comment). AKV_EFULL when the host pool is at its
 * limit or the device pool refuses the window (logged, naming --host-gib / --device-gib);
 * AKV_EINVAL for a bad length; AKV_EDEVICE when a queue failed, or (logged) when the previous
 * step's kernels turn out to have failed and that step was undone: read the length again.
 * All-or-nothing for the host copy. */
akv_status akv_route_begin_step(akv_route *r, uint64_t n_total);

/* The forward pass's hooks for the step begun last (valid until the route is destroyed). A
 * resident route in queued mode is replayable (akv_forward_kv.replayable): its tables live at
 * fixed device addresses uploaded by begin_step, so the device pass may replay decode steps
 * as graphs; a staged route is not (its begin_layer stages copies under a lease). */
akv_forward_kv akv_route_forward_kv(akv_route *r);

/* Queued mode: waits until every write-back enqueued so far has landed in the host copy
 * (and the compute queue is idle); resident: a write-back that failed while it ran is
 * written again (file comment). Direct mode: nothing to wait for. Staged: retires the
 * leases of the last step (both modes). AKV_EDEVICE when a queue failed, or once (logged)
 * when the last step was undone because its kernels failed; AKV_EFAILED (the
 * stage failed) or AKV_ESTATE (a receipt did not match what was submitted) from a lease.
 * A lease a failed stage retained (completion unknown) is quarantined again here: once the
 * device has recovered it is released, and destroy can proceed. */
akv_status akv_route_sync(akv_route *r);

/* Shortens the history to n_tokens (after a failed step), after what akv_route_sync does (a
 * step it undoes is not an error here: the length is checked after it). Staged: cancels the
 * lease a failed pass left open and retires every lease first. */
akv_status akv_route_truncate(akv_route *r, uint64_t n_tokens);

void akv_route_get_stats(const akv_route *r, akv_route_stats *out);

/* The authoritative host copy (borrowed, valid until destroy; complete between steps once
 * akv_route_sync returned). */
const struct akv_host_table *akv_route_host_table(const akv_route *r);

/* "resident", "staged". */
const char *akv_route_kind_name(akv_route_kind kind);

#ifdef __cplusplus
}
#endif
#endif /* AKV_ROUTE_H */
