/*
 * akv/route.h — how a batch of sequences' attention history reaches the forward pass: each
 * sequence's host pages (the authoritative copy) and device pages, and the page table over
 * the batch that the attention reads, one batch step at a time.
 *
 * Glossary
 *   route      the policy that places the history for a step (docs/routes.md), one kind per
 *              route object:
 *              RESIDENT  every page of a sequence's history is in the device pool (the
 *                        baseline);
 *              STAGED    a sequence's window (sink + newest pages, its target and what it
 *                        may borrow) stays in the device pool between steps; every other page
 *                        is staged each step, per layer, under ONE lease of the staging layer
 *                        (akv/stage.h) for the whole batch.
 *              Either with a compact tier (params.tier; docs/compact.md): the older history
 *              read as compact pages, the sink and the recent tokens exact; resident, every
 *              compact page in the compact pool; staged, compact copies on the host, the
 *              newest in the compact pool, the rest staged per layer (the staged hybrid).
 *              A kind is named only here (and chosen by name, akv_route_kind_from_name): its
 *              policy is the route's functions, which the engine calls without asking which
 *              kind it holds —
 *                plan    its part of the engine's memory plan: the staging reserve, each
 *                        context's window (akv_route_plan_begin / _finish, akv_route_plan);
 *                need    what a request reserves in the device pool (akv_route_need);
 *                place   per step and sequence, which logical pages it wants in the device
 *                        window, most wanted first (the device pool holds as many as the
 *                        budget allows: akv/dev_pool.h), and where the others lie for the step:
 *                        the step's runs (akv_route_seq_runs: residence and representation).
 *   run, part  akv/kv_parts.h.
 *   sequence   one conversation's history in the route (akv_route_seq): its host table, its
 *              device-pool context, its length. Open sequences that are not in a step are
 *              idle: the device pool may reclaim their window, their host copy stays whole.
 *   step       ONE batch step: akv_route_begin_step over a list of sequences (the batch, in
 *              the order the forward pass runs them) and their new lengths; then the forward
 *              pass with akv_route_hooks(r) as its hooks: begin_layer hands it the
 *              layer's table over the batch, end_layer writes every sequence's new rows of
 *              the layer back to its host copy.
 *   host copy  a sequence's akv_host_table: after each layer of each step the new tokens'
 *              rows are written back to it, so it always holds the whole history (invariant 1
 *              of docs/design.md).
 *   fresh page a device page the device pool placed this step; if its logical page already
 *              holds tokens from earlier steps, it is filled from the host copy before the
 *              attention reads it (a page the window dropped and took back, or a reclaimed
 *              one): nothing is ever read from a device page the host copy did not fill.
 *   capacity   every table of a route has the same max_pages (from params.max_history), so the
 *              attention's split-KV partitioning (akv/attn.h: capacity, n_seq, device) depends
 *              on the batch size only, never on the lengths or the placement.
 *
 * A step: akv_route_begin_step(r, reqs, n) grows each sequence's host copy (all or nothing),
 * runs ONE device-pool step over the batch (akv/dev_pool.h: floors, targets, bursts,
 * reclamation of idle contexts), fills the fresh pages, and writes the CSR table of the batch
 * (packed in batch order, one row of page ids per layer). A failed step is undone with
 * akv_route_abort_step(r).
 *
 * The staged kind, per layer of a step (docs/routes.md):
 *   begin_layer  stage begin (owners = the host pages of every sequence that receive the
 *                step's new rows), ONE stage copy of every sequence's non-window host pages
 *                into a slot, the layer's table row (window page ids and the slot ids the copy
 *                returned), stage ready: the compute queue waits for the copies before the
 *                attention the forward pass launches next.
 *   end_layer    stage attended (the attention event), write-back of only the new rows of each
 *                sequence from the device page(s) holding them (window tail or slot page) to
 *                its owner host page(s), seal.
 *   Prefetch (queued mode, params.prefetch): a step's copies gate its layers one after
 *   another, so without more the bus idles from the last layer's copy to the next step's first
 *   one (the last layer, the output head, sampling, begin_step). When the last layer is sealed
 *   and the next step can be foreseen — the same batch, one token each, every new token inside
 *   its sequence's current last page — end_layer of the last layer begins the next step's
 *   layer-0 lease and enqueues its copies at once. begin_layer 0 of that step then only makes
 *   the compute queue wait for them, if the step is that one and its staged pages are those
 *   (the device pool may have moved a window); any other next call cancels the prefetched
 *   lease, which then retires like any other (its fences waited on). The bits are unchanged:
 *   the same pages, the same slots round-robin, the same tables.
 *   The leases of a step are retired (fences waited on, receipts checked) at the route's next
 *   begin_step, akv_route_sync, truncate or abort; destroy and close wait for that.
 *
 * Two modes, by the forward pass the route feeds:
 *   direct  (akv/forward.h, the host forward pass) the tables are host arrays, fills and
 *           write-backs are synchronous copies; host backend only (the ref attention reads
 *           device addresses as host addresses).
 *   queued  (akv/forward_dev.h, the pass on the device's queues; params.queued) the tables
 *           live in device memory, uploaded with the fills on AKV_QUEUE_COMPUTE from pinned
 *           memory at begin_step; end_layer records an event on the compute queue and
 *           enqueues the write-backs of the layer's new rows on AKV_QUEUE_D2H behind it (one
 *           2D copy per page touched: 2*n_kv_heads rows). begin_step, truncate and
 *           akv_route_sync first wait for both queues, so the host copies are complete and no
 *           copy still reads a table or a page the step changes. Required off the host
 *           backend; works on both.
 * Fresh pages: the device pool may hand a step a page another context's write-back is still
 * reading (a reclaimed page); the step's fills and kernels wait for every write-back enqueued
 * so far before they touch a fresh page (queued: on the device; direct: the host waits).
 * Failures while work runs (resident, queued): once the queues are idle again, a write-back
 * that failed is enqueued again from the device pages, which still hold the rows; a sequence
 * whose page another context has taken since, or a step whose kernels failed, is undone (its
 * history goes back to where the step began) and the call that finds it returns AKV_EDEVICE
 * once, logged.
 * Closing: akv_route_seq_close revokes a sequence at once (no later step may name it); its
 * pages are freed once no copy or kernel may still touch them (at once between settled steps,
 * else at the next call that waits: begin_step, sync, truncate, abort).
 *
 * Thread-safety: none; the thread that owns the pools owns the route.
 */
#ifndef AKV_ROUTE_H
#define AKV_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "akv/admit.h"
#include "akv/dev.h"
#include "akv/dev_pool.h"
#include "akv/kv_parts.h"
#include "akv/host_pool.h"
#include "akv/kv_repr.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_route_kind {
    AKV_ROUTE_RESIDENT = 0, /* every page in the device pool */
    AKV_ROUTE_STAGED = 1,   /* the window in the device pool, the rest staged */
    AKV_ROUTE_HOST = 2,     /* host-attended: staged, but a share of each decoding sequence's
                               pages outside its window is attended by the host's cores where
                               it lies, the states merged exactly with the device's */
} akv_route_kind;

typedef struct akv_route akv_route;
typedef struct akv_route_seq akv_route_seq;
typedef struct akv_stage akv_stage; /* akv/stage.h */
struct akv_host_table;

/* The staged window when a sequence's target is 0: the sink and three newest pages. */
#define AKV_ROUTE_WINDOW_PAGES 4u
/* Tokens before the newest that the compact tier keeps exact by default. */
#define AKV_ROUTE_EXACT_RECENT 256u
/* The most sequences one step takes (params.max_seqs). */
#define AKV_ROUTE_MAX_SEQS 4096u

typedef struct akv_route_params {
    akv_route_kind kind;
    uint64_t max_history;   /* the longest history any sequence may reach (>= 1): the tables'
                              capacity (file comment) */
    uint32_t max_seqs;     /* sequences one step may take; 0 = 1 */
    bool queued;           /* tables in device memory, copies on the queues (file comment);
                              false = direct (host backend only) */
    /* staged only */
    uint32_t window_pages; /* a sequence's window pages by right when its own target is 0
                              (>= 2: the sink and the newest); 0 = AKV_ROUTE_WINDOW_PAGES */
    akv_stage *stage;      /* the transport, borrowed (several routes may share one; its slots
                              must hold akv_route_slot_pages pages; a lease a failed pass left
                              open blocks every other route's begin on it, AKV_ESTATE (stage
                              I3), until that route aborts, truncates or syncs); NULL = the
                              route creates its own with 2 slots from the device pool's staging
                              reserve (akv_route_plan_begin's staging_pages) */
    /* the compact tier (docs/compact.md): with tier q8 or q4, each history's pages older
     * than its exact recent window are read as a second part, compact pages of compact_pool.
     * Resident kind: every compact page is in compact_pool, made when it leaves the window.
     * Staged kind (the staged compact route): the exact part (the sink and the recent pages)
     * is resident as with the resident kind, each compact page is made once into
     * compact_host_pool (a compact copy beside the exact host copy, which stays
     * authoritative), compact_pool holds a window of each history's newest compact pages
     * and stages the rest each step from the compact copies, per layer under one lease of a
     * stage of compact pages (no owners: the compact copies are never written by a step).
     * exact (0) = none. */
    akv_repr tier;
    akv_dev_pool *compact_pool;  /* its pages (params.repr = tier, the same geometry), borrowed;
                                    staged: with a staging reserve of at least
                                    akv_route_compact_staging_pages */
    akv_host_pool *compact_host_pool; /* staged only: the compact copies (params.repr = tier,
                                    the same geometry), borrowed; as many page ids as the
                                    host pool's (every exact host page may have its copy) */
    uint32_t compact_target;     /* staged only: compact pages per layer each history holds in
                                    compact_pool by right (>= 2); 0 = its window capacity /
                                    max_seqs */
    uint32_t compact_burst;      /* staged only: compact pages it may borrow above that while
                                    the pool has free pages; 0 = none */
    uint64_t exact_recent;       /* tokens before the newest that stay exact; 0 =
                                    AKV_ROUTE_EXACT_RECENT */
    uint32_t max_step;           /* the most new tokens one sequence's step adds (they stay
                                    exact: a chunk attends itself exactly); 0 = max_history */
    uint32_t encode_threads;     /* threads that encode a step's compact pages, the caller's
                                    included; 0 = one per core (a page's bytes do not depend
                                    on them) */
    /* host-attended only: of each sequence's pages outside its window in a step where every
     * sequence decodes one token, the oldest round(host_share x their count) are attended by
     * the host (akv/attn_host.h) over host_threads threads; the rest are staged. A step with a
     * prompt chunk stages them all. */
    float host_share;      /* 0..1 (0 = the staged route's placement) */
    uint32_t host_threads; /* the host part's threads, the caller's thread included; 0 = one
                              per core */
    int prefetch;          /* queued mode: stage layer 0 of the NEXT decode step as soon as this
                              step's last layer is sealed, so its copies cross the bus while the
                              output head, sampling and begin_step run (file comment). 0 = on
                              when the route owns its stage; 1 = on (the caller promises that no
                              other route begins a lease on a shared stage between this route's
                              steps); -1 = off */
} akv_route_params;

/* One sequence of a route. */
typedef struct akv_route_seq_params {
    uint64_t max_history; /* its longest history (<= the route's); 0 = the route's */
    uint32_t target;     /* staged: window pages held by right (>= the route's window_pages);
                            0 = window_pages. Resident: ignored (the whole history, sized by
                            max_history, is its target) */
    uint32_t burst;      /* staged: window pages it may borrow above the target while the
                            device pool has free pages (akv/dev_pool.h); resident: ignored */
    uint64_t tag;        /* the caller's id, for the device pool's explanations */
    uint32_t exact;      /* 1 = its whole history stays exact (a route with a compact tier:
                            no compact part, its window holds every page, as resident); 0 = the
                            route's tier. Fixed at open: set_params keeps the sequence's */
} akv_route_seq_params;

/* One request of a step: a sequence and its length after the step. */
typedef struct akv_route_req {
    akv_route_seq *seq;
    uint64_t n_tokens; /* > its length now, <= its max_history */
} akv_route_req;

typedef struct akv_route_stats {
    uint64_t n_steps;      /* begin_step calls that succeeded */
    uint64_t h2d_bytes;    /* host -> device: fills of fresh pages and staged copies */
    uint64_t staged_bytes; /* of them, the staged copies (non-window pages) */
    uint64_t n_leases;     /* staged: leases retired (receipts checked) */
    uint64_t staged_copy_ns; /* staged: device time of those leases' copies (each receipt's
                                h2d_ns: its first copy to its copies' fence, on the H2D queue) */
    uint64_t n_prefetched; /* staged: steps whose layer 0 was staged during the previous step */
    uint64_t n_prefetch_dropped; /* staged: prefetches cancelled (the next step was not the
                                    one they were made for, or a sync came first) */
    uint64_t d2h_bytes;    /* device -> host: write-back of new rows */
    uint64_t host_bytes;   /* host-attended: K/V bytes the host's cores attended where they lie */
    uint64_t host_ns;      /* host-attended: time the host part's computations took on the host
                              (each from its start to its end), summed */
    uint64_t compact_pages; /* hybrid: compact pages made (a page of every layer counts once a
                               layer): on the device from its exact page where that page is in
                               the window (queued), else on the host from the host copy;
                               staged hybrid: the compact copies made on the host */
    uint64_t compact_device; /* hybrid: of them, made on the device */
    uint64_t compact_bytes; /* hybrid: the bytes of those made on the host, copied into the
                               compact pool; staged hybrid: of the compact copies copied into
                               its compact window (its staged ones: staged_bytes) */
    uint64_t n_quarantines; /* staged: its stage's quarantines (akv_stage_stats); the route
                               asks for at most one per call that retires leases */
    uint32_t n_open;       /* sequences open now */
    uint32_t n_closing;    /* closed sequences whose pages wait for their fences */
} akv_route_stats;

typedef struct akv_route_seq_stats {
    uint64_t tag;
    uint64_t n_tokens;     /* history length now */
    uint64_t n_steps;      /* steps it was in */
    uint64_t h2d_bytes;    /* its fills and staged copies */
    uint64_t staged_bytes; /* of them, the staged copies */
    uint64_t d2h_bytes;    /* its write-backs */
    uint64_t host_bytes;   /* host-attended: its K/V bytes the host's cores attended */
    uint32_t window_pages; /* device window pages per layer now */
    uint32_t host_pages;   /* host pages per layer now */
} akv_route_seq_stats;

/* Whether a kind attends some of the history on the host's cores (the host-attended kind):
 * its plan weighs the host's rate against the bus's (akv_route_plan_host). */
bool akv_route_kind_has_host_part(akv_route_kind kind);

/* The kind named `name` ("resident", "staged", "host"): AKV_OK, else AKV_EINVAL (not
 * logged). */
akv_status akv_route_kind_from_name(const char *name, akv_route_kind *out);

/* The host part's attention rate on this machine, bytes of K/V a second: the host-attended
 * route's kernel (akv/attn_host.h) over pages of geometry g (bf16, exact), queries of n_heads
 * heads, on `threads` threads (0 = one per core), over about 64 MiB of pages scattered in
 * host memory, the best of a few passes (about 0.1 s in all). The rate alone: with the bus
 * copying at the same time it is lower. AKV_ENOMEM, AKV_EINVAL for a geometry the kernel
 * cannot read. */
akv_status akv_route_host_rate(const akv_geom *g, uint32_t n_heads, uint32_t threads, double *bps);

/* ---- the plan: a kind's part of the engine's memory plan -------------------------------- */

/* What a route kind adds to the memory plan of max_seqs histories of max_history tokens. */
typedef struct akv_route_plan {
    akv_route_kind kind;
    uint32_t window_pages;  /* the least window (staged; 0 = AKV_ROUTE_WINDOW_PAGES) */
    uint32_t staging_pages; /* device pages its stage takes from the device pool's reserve */
    uint32_t target, burst; /* window pages each context holds by right / may borrow (0, 0 for
                               a kind whose window is the whole history: resident) */
    /* the compact tier (akv_route_plan_tier; exact = none) */
    akv_repr tier;
    uint64_t exact_recent;  /* tokens kept exact before the newest */
    uint32_t max_step;      /* the most new tokens one sequence's step adds */
    uint32_t compact_gib;   /* the compact device pool, whole GiB: resident, every history's
                               older pages; staged, what the exact part leaves of device_gib */
    uint32_t compact_staging_pages; /* staged: the compact pool's staging reserve */
    uint32_t compact_host_gib; /* staged: the compact copies' host pool, whole GiB (out of
                                  host_gib: page ids for every exact host page) */
    uint32_t compact_target, compact_burst; /* staged: each context's compact window */
    /* host-attended (akv_route_plan_host): the share of a decoding history's pages outside
     * its window that the host's cores attend, and the rates it was planned from (0: given) */
    float host_share;
    double host_bps, bus_bps;
} akv_route_plan;

struct akv_gate_rates;

/* The host-attended kind's split (a no-op for another kind): share in (0, 1] as given, or 0
 * = planned so that the host's cores and the bus finish together (akv_gate_host_share): the
 * host part's rate measured now on `threads` threads (akv_route_host_rate: about 0.1 s) for
 * queries of n_heads heads, the bus's from rates at the page's size. AKV_EINVAL (logged,
 * naming the setting) for a share outside 0..1; the measurement's failure. */
akv_status akv_route_plan_host(akv_route_plan *pl, const akv_geom *g, float share, uint32_t n_heads,
                               uint32_t threads, const struct akv_gate_rates *rates);

/* The plan before the pools are sized: kind and window_pages (0 = the default) resolved, and
 * the staging reserve of max_seqs histories of max_history tokens. AKV_EINVAL (logged) for
 * an unknown kind. */
akv_status akv_route_plan_begin(akv_route_kind kind, uint32_t window_pages, const akv_geom *g,
                                uint64_t max_history, uint32_t max_seqs, akv_route_plan *pl);

/* The compact tier of a plan begun for max_seqs histories of max_history tokens: tier (exact:
 * none), the exact recent window (0 = AKV_ROUTE_EXACT_RECENT) and the largest step of one
 * sequence (0 = max_history), and the GiB of the compact pool that holds every history's
 * older pages (compact_gib: the engine takes it from device_gib before the fit sizes the exact
 * pool). AKV_EUNSUPPORTED (logged, naming the setting) for a kind other than resident or a
 * head dim the form cannot hold. */
akv_status akv_route_plan_tier(akv_route_plan *pl, akv_repr tier, uint64_t exact_recent,
                               uint32_t max_step, const akv_geom *g, uint64_t max_history,
                               uint32_t max_seqs);

/* The staged kind's compact tier (after akv_route_plan_tier): the device GiB split between the
 * exact part (max_seqs exact windows) and the compact pool (compact_gib, its staging reserve
 * and each context's compact window), and the host GiB between the exact copies and the
 * compact ones (compact_host_gib). A no-op for another kind or no tier. AKV_EFULL, logged
 * naming the field to raise unless quiet (a caller weighing placements), when device_gib or
 * host_gib cannot hold both parts. */
akv_status akv_route_plan_split(akv_route_plan *pl, const akv_geom *g, uint64_t max_history,
                                uint32_t max_seqs, uint32_t device_gib, uint32_t host_gib,
                                bool quiet);

/* Compact pages of one layer a staged compact route of max_seqs histories of max_history
 * tokens stages at most in a step: a staging slot's pages. */
uint32_t akv_route_compact_slot_pages(const akv_geom *g, uint64_t max_history, uint32_t max_seqs);

/* The compact pool's staging reserve that route needs: its stage's slots (three: a layer's
 * copies wait for the attention three layers back) of akv_route_compact_slot_pages each. */
uint32_t akv_route_compact_staging_pages(const akv_geom *g, uint64_t max_history, uint32_t max_seqs);

/* The plan once the admission sized the pools (fit: akv/admit.h, for fit->concurrency
 * histories): each context's window. AKV_EFULL, logged naming the params field to change,
 * when those histories cannot be served (a resident history over the window capacity, staged
 * windows that together pass it). */
akv_status akv_route_plan_finish(const akv_geom *g, uint64_t max_history, const akv_fit *fit,
                                 akv_route_plan *pl);

/* The plan's line for the fit report ("route: ..."), snprintf's contract. */
size_t akv_route_plan_format(const akv_route_plan *pl, uint32_t max_seqs,
                             uint32_t window_capacity, char *buf, size_t cap);

/* Window pages per layer a history of n_tokens reserves in the device pool under `kind`
 * (resident: every page, at least the floor of 2; staged: 0, its window is lent, not
 * reserved). */
uint32_t akv_route_need(akv_route_kind kind, const akv_geom *g, uint64_t n_tokens);

/* The same under a plan (its kind and tier: the compact tier reserves its exact window; a
 * history kept exact on a plan with a tier, akv_route_seq_params.exact, reserves every page of
 * it, as the resident kind does: its window is the whole history, staged kind or not). */
uint32_t akv_route_plan_need(const akv_route_plan *pl, const akv_geom *g, uint64_t n_tokens,
                             bool exact);

/* Device pages one staging slot of a staged route needs: the logical pages of max_seqs
 * histories of max_history outside their windows of window_pages (0 = the default), at least
 * 1 (max_seqs 0 = 1). */
uint32_t akv_route_slot_pages(const akv_geom *g, uint64_t max_history, uint32_t window_pages,
                              uint32_t max_seqs);

/* (Saturates at UINT32_MAX, more pages than any device pool holds, which it refuses.) */

/* A route over the pools (which must outlive it and share one geometry), with no sequence.
 * AKV_EUNSUPPORTED (logged) for the direct mode off the host backend; AKV_EINVAL for a zero
 * max_history, more than AKV_ROUTE_MAX_SEQS sequences, pools of different geometries, a
 * resident history longer than the device pool's window capacity (logged with the GiB it
 * would need), a staged window above that capacity or below 2, or a stage whose slots are too
 * small (logged, naming the params field); AKV_EFULL when the staging reserve cannot lend the
 * route's own stage its slots (logged); AKV_ENOMEM. */
akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out);

/* Frees the route (and its own stage), and closed sequences whose pages waited for their
 * fences. NULL is a no-op. AKV_EBUSY (nothing changed) while a sequence is open or a staged
 * lease is unretired (akv_route_sync first: destroy never retires). Queued mode: waits for
 * the queues first (a copy may still touch the pages); if that fails, AKV_EDEVICE and nothing
 * is freed (retained, never reused on an uncertain fence). */
akv_status akv_route_destroy(akv_route *r);

/* Opens a sequence with no history (NULL params = defaults). AKV_EINVAL (logged, naming the
 * field) for a max_history above the route's, a staged target below the route's window_pages
 * or a target + burst above the device pool's window capacity, a resident history the window
 * capacity cannot hold; AKV_ENOMEM. */
akv_status akv_route_seq_open(akv_route *r, const akv_route_seq_params *p, akv_route_seq **out);

/* Opens a sequence (params p, as at open) whose history is src's first n_tokens tokens: src's
 * host copy is completed first (what akv_route_sync does); the full pages among them are
 * shared with src (akv_host_table_share: no copy, neither writes them again), with the compact
 * host copies src has made of them (staged tier); the partial last page, which both write on
 * from, is copied into a page of its own. The device window is filled from the host copy at
 * its first step, the device's compact pages (a tier) made again. A request that shares
 * another's prefix starts from here instead of computing it (n choices of one prompt, a
 * common system prompt). AKV_EINVAL (logged) for more tokens than src holds or the new params
 * allow, AKV_EFULL (logged) when the host pool cannot hold the partial page; nothing is
 * opened then. */
akv_status akv_route_seq_fork(akv_route *r, akv_route_seq *src, uint64_t n_tokens,
                              const akv_route_seq_params *p, akv_route_seq **out);

/* A page of a history's host copy, one layer: page_bytes of the layout of akv/geom.h (rows past
 * the history's end are not part of it). */
typedef akv_status (*akv_route_fill_fn)(void *user, uint32_t layer, uint32_t page, void *bytes,
                                        size_t page_bytes);
typedef akv_status (*akv_route_read_fn)(void *user, uint32_t layer, uint32_t page,
                                        const void *bytes, size_t page_bytes);

/* Opens a sequence (params p) whose history of n_tokens is written by fill into its new host
 * pages, layer by layer, each layer's pages in order (a session restored from a file); as a
 * fork, the device window is filled from them at the first step. A fill that fails fails the
 * call: nothing is opened. AKV_EINVAL, AKV_EFULL (logged) as a fork. */
akv_status akv_route_seq_open_filled(akv_route *r, const akv_route_seq_params *p,
                                     uint64_t n_tokens, akv_route_fill_fn fill, void *user,
                                     akv_route_seq **out);

/* Opens a sequence (params p) for a history of n_tokens (> 0) whose host copy the caller
 * writes itself, on any thread: pages[l * n + p] (n = akv_geom_pages_for_tokens(n_tokens)
 * pages a layer) receives the host address of its page p of layer l (page_bytes of the layout
 * of akv/geom.h; rows past the history's end are not part of it). Nothing else touches those
 * pages until akv_route_seq_mark_filled: the sequence takes part in no step, fork, read,
 * truncate or change of params (AKV_ESTATE, logged); closing it is allowed once the caller has
 * stopped writing (a restore that failed). As a fork, the device window is filled from the
 * host copy at its first step. A session restored off the engine's thread. AKV_EINVAL,
 * AKV_EFULL (logged) as open_filled. */
akv_status akv_route_seq_open_unfilled(akv_route *r, const akv_route_seq_params *p,
                                       uint64_t n_tokens, void **pages, akv_route_seq **out);

/* s's host copy, opened unfilled, now holds its history: it takes part in steps from here on.
 * AKV_ESTATE (logged) for a sequence not opened unfilled or marked already. */
akv_status akv_route_seq_mark_filled(akv_route *r, akv_route_seq *s);

/* Hands s's host copy to read, layer by layer, each layer's pages in order, once what
 * akv_route_sync does has completed it (a session saved to a file). read's failure is
 * returned; AKV_EDEVICE when the sync undid a step. */
akv_status akv_route_seq_read_pages(akv_route *r, akv_route_seq *s, akv_route_read_fn read,
                                    void *user);

/* Changes an open sequence's params (as at open) from its next step on: a reused
 * conversation's new length limit and window. AKV_EINVAL (nothing changed) as at open, or
 * for a max_history below its length. */
akv_status akv_route_seq_set_params(akv_route *r, akv_route_seq *s, const akv_route_seq_params *p);

/* Closes a sequence: revoked at once (the handle is invalid afterwards; a step begun with it
 * may still run its pass, whose pages stay until the sync), its host pages and device window
 * freed now or, while a copy or kernel of a step may still touch them, at the next call that
 * waits (file comment). NULL is a no-op; AKV_EINVAL for a sequence not open in r. */
akv_status akv_route_seq_close(akv_route *r, akv_route_seq *s);

/* Begins one batch step: reqs[n] (1 <= n <= max_seqs, distinct open sequences, in the order
 * the forward pass runs them) each grow to their n_tokens, and the step is placed for the next
 * forward run (see the file comment). AKV_EFULL when the host pool is at its limit, the device
 * pool refuses a window, or a staged layer would stage more pages than a slot holds (logged,
 * naming the setting); AKV_EINVAL for a bad batch (logged); AKV_EDEVICE when a queue failed,
 * or (logged) when the previous step's kernels turn out to have failed and that step was
 * undone: read the lengths again. All-or-nothing for the host copies. */
akv_status akv_route_begin_step(akv_route *r, const akv_route_req *reqs, uint32_t n);

/* The forward pass's hooks for the step begun last (valid until the route is destroyed). A
 * resident route in queued mode is replayable (akv_kv_hooks.replayable): its tables live at
 * fixed device addresses uploaded by begin_step, so the device pass may replay decode steps
 * as graphs; a staged route is not (its begin_layer stages copies under a lease). */
akv_kv_hooks akv_route_hooks(akv_route *r);

/* Queued mode: waits until every write-back enqueued so far has landed in the host copies
 * (and the compute queue is idle); resident: a write-back that failed while it ran is
 * written again (file comment). Direct mode: nothing to wait for. Staged: retires the
 * leases of the last step (both modes). Then frees the pages of closed sequences. AKV_EDEVICE
 * when a queue failed, or once (logged) when a step was undone because its kernels failed;
 * AKV_EFAILED (the stage failed) or AKV_ESTATE (a receipt did not match what was submitted)
 * from a lease. A lease a failed stage retained (completion unknown) is quarantined again
 * here: once the device has recovered it is released, and destroy can proceed. */
akv_status akv_route_sync(akv_route *r);

/* Undoes the step begun last (after a failed pass): what akv_route_sync does, then every
 * sequence of the step goes back to its length before the step. A step the sync already
 * undid is not an error here. Staged: cancels the lease a failed pass left open first. */
akv_status akv_route_abort_step(akv_route *r);

/* Shortens one sequence's history to n_tokens, after what akv_route_sync does (a step it
 * undoes is not an error here: the length is checked after it). */
akv_status akv_route_seq_truncate(akv_route *r, akv_route_seq *s, uint64_t n_tokens);

void akv_route_get_stats(const akv_route *r, akv_route_stats *out);
void akv_route_seq_get_stats(const akv_route_seq *s, akv_route_seq_stats *out);

/* A sequence's history length. */
uint64_t akv_route_seq_n_tokens(const akv_route_seq *s);

/* The placement of s in the step begun last: its runs over its logical pages in order, at
 * most cap of them into runs; returns how many there are (0 when s was not in the step). The
 * same in every layer. */
uint32_t akv_route_seq_runs(const akv_route_seq *s, akv_kv_run *runs, uint32_t cap);

/* A sequence's authoritative host copy (borrowed, valid until it is closed; complete between
 * steps once akv_route_sync returned). */
const struct akv_host_table *akv_route_seq_host_table(const akv_route_seq *s);

/* The host copies of the closed sequences whose pages wait for their fences (freed at the next
 * sync that finds nothing in flight): at most cap of them into out (borrowed until then);
 * returns how many there are. What admission counts as about to be free. */
uint32_t akv_route_closing_host_tables(const akv_route *r, const struct akv_host_table **out, uint32_t cap);

/* When each staged layer of the last step whose leases were retired copied and attended, in
 * device time from one origin (the stage's; 0 where not recorded): for the instrumentation and
 * the benchmarks that ask where a staged step's time goes. */
typedef struct akv_route_layer_times {
    uint64_t copy_start_ns, copy_done_ns, attn_start_ns, attn_done_ns;
    /* the host's side: its clock (core/clock.h) when the layer's copies were submitted, and
     * whether the bus had already finished the layer before's copies then (it waited for
     * the host) */
    uint64_t host_copied_ns;
    int bus_idle_at_copy;
    uint64_t step; /* the route's step it belongs to */
} akv_route_layer_times;
/* Writes min(cap, layers) of them; returns how many layers the last retired step staged (0:
 * none yet, or nothing staged). */
uint32_t akv_route_step_times(const akv_route *r, akv_route_layer_times *out, uint32_t cap);

/* The route's kind and params as resolved (max_seqs, window_pages). */
akv_route_params akv_route_get_params(const akv_route *r);

/* "resident", "staged". */
const char *akv_route_kind_name(akv_route_kind kind);

#ifdef __cplusplus
}
#endif
#endif /* AKV_ROUTE_H */
