/*
 * akv/route.h — how one sequence's attention history reaches the forward pass: its host
 * pages (the authoritative copy), its device pages, and the page tables the attention reads.
 *
 * Glossary
 *   route      the policy that places the history for a step (DESIGN.md, "Routes"):
 *              RESIDENT  every page of the history is in the device pool (the baseline);
 *              STAGED    the window on the device, the rest staged each step (not built yet:
 *                        it needs the staging layer's leases; akv_route_create refuses it).
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
    AKV_ROUTE_STAGED = 1,   /* the window in the device pool, the rest staged (not built) */
} akv_route_kind;

typedef struct akv_route akv_route;

typedef struct akv_route_params {
    akv_route_kind kind;
    uint64_t max_tokens; /* the longest history the sequence may reach (>= 1) */
    uint64_t tag;        /* the caller's id, for the device pool's explanations */
    bool queued;         /* tables in device memory, copies on the queues (file comment);
                            false = direct (host backend only) */
} akv_route_params;

typedef struct akv_route_stats {
    uint64_t n_steps;      /* begin_step calls that succeeded */
    uint64_t n_tokens;     /* history length now */
    uint64_t h2d_bytes;    /* host -> device: fills of fresh pages (and staged copies) */
    uint64_t d2h_bytes;    /* device -> host: write-back of new rows */
    uint32_t window_pages; /* device window pages per layer now */
    uint32_t host_pages;   /* host pages per layer now */
} akv_route_stats;

/* A route for one sequence over the pools (which must outlive it and share one geometry).
 * AKV_EUNSUPPORTED (logged) for the staged route or the direct mode off the host backend;
 * AKV_EINVAL for a zero max_tokens, pools of different geometries, or a resident history
 * longer than the device pool's window capacity (logged with the GiB it would need);
 * AKV_ENOMEM. */
akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out);

/* Frees the host pages and the device window. NULL is a no-op. AKV_EBUSY (nothing changed)
 * while a host page is leased. Queued mode: waits for the queues first (a copy may still
 * touch the pages); if that fails, AKV_EDEVICE and nothing is freed (retained, never reused
 * on an uncertain fence). */
akv_status akv_route_destroy(akv_route *r);

/* Grows the history to n_total tokens (> the current length, <= max_tokens) and places it
 * for the next forward run (see the file comment). AKV_EFULL when the host pool is at its
 * limit or the device pool refuses the window (logged, naming --host-gib / --device-gib);
 * AKV_EINVAL for a bad length. All-or-nothing for the host copy. */
akv_status akv_route_begin_step(akv_route *r, uint64_t n_total);

/* The forward pass's hooks for the step begun last (valid until the route is destroyed). */
akv_forward_kv akv_route_forward_kv(akv_route *r);

/* Queued mode: waits until every write-back enqueued so far has landed in the host copy
 * (and the compute queue is idle). Direct mode: nothing to wait for. AKV_EDEVICE when a
 * queue failed. */
akv_status akv_route_sync(akv_route *r);

/* Shortens the history to n_tokens (after a failed step). */
akv_status akv_route_truncate(akv_route *r, uint64_t n_tokens);

void akv_route_get_stats(const akv_route *r, akv_route_stats *out);

/* "resident", "staged". */
const char *akv_route_kind_name(akv_route_kind kind);

#ifdef __cplusplus
}
#endif
#endif /* AKV_ROUTE_H */
