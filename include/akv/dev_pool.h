/*
 * akv/dev_pool.h — the device pool: ONE device allocation of a whole number of GiB, cut into
 * pages, serving every layer and every context: their windows and the staging buffers.
 *
 * Glossary
 *   page id       k in [0, n_pages): device page k is at base + k * page_bytes. Kernels get
 *                 the base and a CSR table of page ids (akv/geom.h's layout in each page).
 *   order         what a context's caller (its route) wants on the device: logical pages, most
 *                 wanted first, given with each step request. The pool decides how many of
 *                 them a context holds (its floor, target, burst and the budget), never which:
 *                 a window of size s is the first s pages of the order. (Today's routes ask
 *                 for the newest page and the sink, then the rest newest first.)
 *   window        the pages of a context kept on the device between steps: a prefix of its
 *                 order. A context's window is uniform over layers: a *window page* is one
 *                 logical page in every layer, n_layers device pages. Targets, bursts, floors
 *                 and the counts below are in window pages (per layer) unless they say device
 *                 pages.
 *   target        window pages a context may hold by right: below it, the context may reclaim
 *                 pages from others (borrowed pages, pages above target, idle contexts).
 *   burst         window pages it may borrow above its target while pages are free; borrowed
 *                 pages are the first to be reclaimed.
 *   floor         what a served context always holds: the first n_floor pages of its order
 *                 (the sink and the newest page, one page while its history fits in one). A
 *                 step request whose floor cannot be held is
 *                 refused (AKV_EFULL: it waits): it gets no page in that step and keeps its
 *                 last length (like any context, it may still lose borrowed pages or pages
 *                 above target to others).
 *   staging       pages lent to the staging layer for its buffers, out of a reserve fixed at
 *                 creation; windows never use the reserve and staging never uses the rest, so
 *                 neither can starve the other. The whole pool (windows + staging) is the
 *                 device budget of the memory layer.
 *   step          the boundary at which windows change: akv_dev_pool_step takes the batch of
 *                 contexts active in a step. Contexts outside the batch are idle for it;
 *                 "least recently active" orders contexts by the last step they were in.
 *
 * A step, for each context of the batch (in three passes over the batch, so that every
 * floor is served before any target, and every target before any burst):
 *   1. floors, 2. up to the target, 3. up to target + burst, each filling the missing pages
 *   in the order's order, from these sources in order:
 *     a. its own window page that is outside its window (the window slid past it);
 *     b. a free page;
 *     c. (floor and target passes only) reclamation, least recently active victim first:
 *        borrowed pages, then pages above target, then whole idle contexts (every window page
 *        of a context outside the batch, its floor included); a victim loses the page its
 *        order wants least outside its floor (today: its oldest non-sink page, so it keeps
 *        its tail);
 *     d. (floor and target passes only) its own page the order wants least (outside the
 *        floor; above the floor, only one it wants less than the page being placed), given
 *        to the page placed: the window keeps what it wants most.
 *   Pages it holds outside its window afterwards (a lowered target, a truncated history) go
 *   back to the free pages. Every page placed by the step is marked fresh: its contents must
 *   be filled from the host copy (or written) before attention reads it.
 *
 * Fences. The pool is bookkeeping: a page that leaves a window in step s may be filled for
 * another context in step s+1. The caller orders step s+1's fills after step s's readers of
 * those pages (a device event), as the staging layer does for its buffers. The host copy is
 * authoritative, so dropping a device copy loses nothing. (The route does it for every route
 * on the device at once: akv/route.h, "Fresh pages".)
 *
 * Counting. Every page placed, reclaimed, shrunk or released, and every refused request and
 * shortfall, is counted by reason (akv_dev_pool_reason), pool-wide and per context (as the one
 * asking and as the victim), with the pool's state at the last refusal, so that
 * akv_dev_pool_ctx_get_stats / akv_dev_pool_explain can say afterwards why a context waited.
 *
 * Invariants (akv__dev_pool_check)
 *   - every page is owned exactly once: free, staging, or one window slot of one context;
 *     free + staging + window pages = n_pages;
 *   - window pages <= the window capacity, staging pages <= the reserve;
 *   - a context's window is sorted by logical page, has no duplicate, lies within its
 *     history and its order, and holds its floor unless it holds nothing;
 *   - borrowed <= max(0, window - target) for every context.
 *
 * Thread-safety: none; the engine thread owns the pool (staging calls come from it too).
 */
#ifndef AKV_DEV_POOL_H
#define AKV_DEV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/geom.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_dev_pool akv_dev_pool;
typedef struct akv_dev_pool_ctx akv_dev_pool_ctx;

#define AKV_DEV_POOL_MAX_GIB 4096u

typedef struct akv_dev_pool_params {
    uint32_t device_gib;    /* size of the one device allocation, whole GiB; 0 is an error:
                               the operator chooses it (--device-gib), never automatic */
    uint32_t staging_pages; /* device pages reserved for staging buffers; 0 = none */
    akv_repr repr;          /* the representation its pages hold (akv/kv_repr.h): exact (0),
                               or a compact form, whose smaller pages the pool is cut into */
} akv_dev_pool_params;

typedef struct akv_dev_pool_ctx_params {
    uint32_t target; /* window pages held by right; >= 2 (the floor) */
    uint32_t burst;  /* window pages it may borrow above the target while pages are free */
    uint64_t tag;    /* caller's id for logs and explanations (e.g. the request id) */
} akv_dev_pool_ctx_params;

/* Why a page moved, or why a request waited. */
typedef enum akv_dev_pool_reason {
    AKV_DEV_POOL_FROM_FREE = 0,         /* placed: a free page */
    AKV_DEV_POOL_REUSE_OWN,             /* placed: the context's own page outside its window */
    AKV_DEV_POOL_RECLAIM_BORROWED,      /* placed: reclaimed a borrowed page (class 1) */
    AKV_DEV_POOL_RECLAIM_ABOVE_TARGET,  /* placed: reclaimed a page above target (class 2) */
    AKV_DEV_POOL_RECLAIM_IDLE,          /* placed: reclaimed from a whole idle context (class 3) */
    AKV_DEV_POOL_SHRINK_OLDEST,         /* placed: the context's own oldest non-sink page */
    AKV_DEV_POOL_RELEASE_OUTSIDE,       /* freed: outside the window after the step */
    AKV_DEV_POOL_WAIT_FLOOR,            /* refused (AKV_EFULL): the floor could not be held */
    AKV_DEV_POOL_SHORT_OF_TARGET,       /* served below its target: nothing left to reclaim */
    AKV_DEV_POOL_BURST_DENIED,          /* could not borrow: no free page */
    AKV_DEV_POOL_WAIT_STAGING,          /* staging acquisition refused: the reserve is used up */
    AKV_DEV_POOL_REASON_COUNT
} akv_dev_pool_reason;

/* Events (one per decision) and window pages moved, by reason. For reclamation, an event is
 * one victim context losing pages; n_pages counts window pages (staging: device pages). */
typedef struct akv_dev_pool_counts {
    uint64_t n_events[AKV_DEV_POOL_REASON_COUNT];
    uint64_t n_pages[AKV_DEV_POOL_REASON_COUNT];
} akv_dev_pool_counts;

/* The pool as a refused request found it: enough to explain the refusal afterwards. */
typedef struct akv_dev_pool_wait {
    uint64_t step;            /* step number of the refusal; 0 = never refused */
    akv_dev_pool_reason reason;
    uint32_t needed;          /* window pages (device pages for staging) it needed */
    uint32_t own_spare;       /* its own pages it could have moved */
    uint32_t free;            /* free window pages (staging: free reserve pages) */
    uint32_t reclaimable;     /* borrowed + above target + idle pages of others */
    uint32_t n_active;        /* contexts in that step's batch */
} akv_dev_pool_wait;

typedef struct akv_dev_pool_stats {
    size_t page_bytes;
    uint32_t n_pages;          /* device pages in the allocation */
    uint32_t window_capacity;  /* window pages (per layer) the non-staging part holds */
    uint32_t staging_reserve;  /* device pages reserved for staging */
    uint32_t window_used;      /* window pages held by contexts */
    uint32_t staging_used;     /* device pages lent to staging */
    uint32_t n_free_pages;     /* device pages free (both parts) */
    uint32_t n_contexts;
    uint64_t n_steps;
    akv_dev_pool_counts counts;
    akv_dev_pool_wait last_wait;
} akv_dev_pool_stats;

typedef struct akv_dev_pool_ctx_stats {
    uint64_t tag;
    uint32_t target, burst, window, borrowed; /* window pages now */
    uint64_t n_tokens;                         /* history length at its last served step */
    uint64_t last_active;                      /* step it was last in a batch; 0 = never */
    akv_dev_pool_counts as_requester; /* pages it obtained and how; its waits and shortfalls */
    akv_dev_pool_counts as_victim;    /* pages reclaimed from it, by class */
    akv_dev_pool_wait last_wait;
} akv_dev_pool_ctx_stats;

/* One step request: a context of the batch, its history length after this step, and the
 * logical pages it wants on the device, most wanted first (copied: the pool keeps the last
 * order of each context, which also says what it loses first while idle). */
typedef struct akv_dev_pool_req {
    akv_dev_pool_ctx *ctx;
    uint64_t n_tokens;     /* >= 1; tokens in every layer after the step */
    const uint32_t *order; /* [n_order] distinct logical pages below ceil(n_tokens / P) */
    uint32_t n_order;      /* >= n_floor; pages the order leaves out are never held */
    uint32_t n_floor;      /* >= 1: the first n_floor pages are its floor */
} akv_dev_pool_req;

typedef struct akv_dev_pool_result {
    akv_status status; /* AKV_OK, or AKV_EFULL: refused this step (it got no page) */
    uint32_t window;   /* window pages after the step */
    uint32_t n_fresh;  /* of them, placed by this step (fill before reading) */
} akv_dev_pool_result;

/* One window page of a context in one layer. */
typedef struct akv_dev_pool_slot {
    uint32_t logical; /* logical page: tokens [logical * P, (logical+1) * P) */
    uint32_t page_id; /* device page id */
    uint32_t fresh;   /* 1: placed by the last step that served the context */
} akv_dev_pool_slot;

/* device_gib = 0 (must be set), staging_pages = 0, exact pages. */
akv_dev_pool_params akv_dev_pool_default_params(void);

/* Allocates the pool's one device allocation (device_gib GiB, exactly) on `dev`, which must
 * outlive the pool. AKV_EINVAL, logged naming the setting, for a missing or absurd size, a
 * staging reserve larger than the pool, or a window part smaller than one floor (two window
 * pages); AKV_EDEVMEM when the device cannot provide it; AKV_ENOMEM for host bookkeeping. */
akv_status akv_dev_pool_create(akv_dev *dev, const akv_geom *g, const akv_dev_pool_params *p,
                               akv_dev_pool **out);

/* The layout a pool with these params would have, computed without allocating: fills
 * page_bytes, n_pages, window_capacity and staging_reserve of *out (the rest zero). The same
 * checks as akv_dev_pool_create except the floor: window_capacity may be below 2 here (the
 * admission arithmetic reports that as a refusal). *out untouched on error. */
akv_status akv_dev_pool_layout(const akv_geom *g, const akv_dev_pool_params *p,
                               akv_dev_pool_stats *out);

/* Frees the allocation. NULL is a no-op. AKV_EBUSY, nothing changed, while a context is open
 * or a staging page is held. */
akv_status akv_dev_pool_destroy(akv_dev_pool *pool);

akv_dptr akv_dev_pool_base(const akv_dev_pool *pool);
akv_dptr akv_dev_pool_page_addr(const akv_dev_pool *pool, uint32_t page_id); /* asserts id */
size_t akv_dev_pool_page_bytes(const akv_dev_pool *pool);
uint32_t akv_dev_pool_n_pages(const akv_dev_pool *pool);
const akv_geom *akv_dev_pool_geom(const akv_dev_pool *pool);
akv_dev *akv_dev_pool_dev(const akv_dev_pool *pool); /* the device it was created on (borrowed) */

/* Opens a context with no window yet (it gets its floor at its first step). AKV_EINVAL for a
 * target below 2 or above the window capacity, or a target + burst above the capacity. */
akv_status akv_dev_pool_ctx_open(akv_dev_pool *pool, const akv_dev_pool_ctx_params *p,
                                 akv_dev_pool_ctx **out);

/* Closes a context and frees its window pages (a step boundary: see "Fences"). NULL is a
 * no-op. The handle is invalid afterwards: the pool recognises open contexts by address
 * without reading them, so a second close asserts and a step or set_target naming a closed
 * context is AKV_EINVAL, never a use after free (unless a new context reuses the address). */
void akv_dev_pool_ctx_close(akv_dev_pool *pool, akv_dev_pool_ctx *ctx);

/* Changes a context's target and burst from the next step on (checked as at open). Borrowed
 * pages inside a raised target become held by right; a lowered target leaves pages above
 * target, the second class of reclamation. AKV_ENOMEM if its window record cannot grow. */
akv_status akv_dev_pool_ctx_set_target(akv_dev_pool *pool, akv_dev_pool_ctx *ctx, uint32_t target,
                                       uint32_t burst);

/* One step for a batch of n_req distinct open contexts (see the top of the file). results
 * holds n_req entries. AKV_EINVAL, nothing changed, for a bad batch (NULL or repeated context,
 * n_tokens 0, more than INT32_MAX pages, an order that is not distinct pages of the history
 * with a floor of at least one page, logged); AKV_ENOMEM, nothing changed, when an order
 * cannot be kept; otherwise every request is decided: AKV_OK if all were served, AKV_EFULL
 * if at least one was refused (see its result). */
akv_status akv_dev_pool_step(akv_dev_pool *pool, const akv_dev_pool_req *reqs, uint32_t n_req,
                             akv_dev_pool_result *results);

/* Window pages the context holds now (per layer). */
uint32_t akv_dev_pool_ctx_window(const akv_dev_pool_ctx *ctx);

/* Window page w (0 <= w < window, in logical order: the sink first) of `layer`. Asserts. */
akv_dev_pool_slot akv_dev_pool_ctx_slot(const akv_dev_pool *pool, const akv_dev_pool_ctx *ctx,
                                        uint32_t layer, uint32_t w);

/* The device page holding logical page `logical` of `layer`, or -1 if it is not resident. */
int64_t akv_dev_pool_ctx_find(const akv_dev_pool *pool, const akv_dev_pool_ctx *ctx,
                              uint32_t layer, uint32_t logical);

/* Lends n device pages from the staging reserve (ids written to page_ids[n]); all or
 * nothing. AKV_EFULL (counted as AKV_DEV_POOL_WAIT_STAGING) when the reserve lacks n. Allowed
 * at any time: the reserve is disjoint from windows. */
akv_status akv_dev_pool_staging_acquire(akv_dev_pool *pool, uint32_t n, uint32_t *page_ids);

/* Returns n staging pages. AKV_EINVAL, nothing changed, if any id is not lent to staging or
 * is repeated. The caller returns a page only when no copy or kernel can still touch it. */
akv_status akv_dev_pool_staging_release(akv_dev_pool *pool, uint32_t n, const uint32_t *page_ids);

void akv_dev_pool_get_stats(const akv_dev_pool *pool, akv_dev_pool_stats *out);
void akv_dev_pool_ctx_get_stats(const akv_dev_pool_ctx *ctx, akv_dev_pool_ctx_stats *out);

/* "reclaimed borrowed page", ...; "?" for an invalid value. */
const char *akv_dev_pool_reason_str(akv_dev_pool_reason reason);

/* Writes a human-readable account of the context's counts and its last wait (or, for
 * ctx = NULL, the pool's) into buf (NUL-terminated, truncated to cap). Returns the length
 * the full text needs, like snprintf. The library never prints; tools and logs use this. */
size_t akv_dev_pool_explain(const akv_dev_pool *pool, const akv_dev_pool_ctx *ctx, char *buf,
                            size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* AKV_DEV_POOL_H */
