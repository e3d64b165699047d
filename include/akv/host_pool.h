/*
 * akv/host_pool.h — the host pool: pinned host memory that holds the authoritative copy of
 * every K/V page, and the host page lease that keeps a page alive while a copy touches it.
 *
 * Glossary
 *   arena       one pinned allocation (akv_dev_pinned_alloc) cut into whole pages; 256 MiB
 *               by default. Arena slot s holds page ids [s * pages_per_arena, (s+1) * ...).
 *   page id     a pool-wide number: slot * pages_per_arena + index in the arena. A page never
 *               moves: its address is fixed from its allocation to its free.
 *   generation  a counter per page id that changes every time the id is handed out again;
 *               a handle {id, gen} whose gen is not the page's current one is *stale*.
 *   lease       a pin on one page and its generation (a copy in flight reads or writes it):
 *               while leased the page cannot be freed, so its id cannot be recycled.
 *   owner       a page table holding the page. A page has one owner when allocated; sharing
 *               it (a prefix several contexts hold, akv_host_table_share) adds owners, and a
 *               free drops one: only the last owner's free frees it. A shared page is
 *               immutable: the tables keep it full and never write it (akv/host_table.h).
 *
 * Growth and return. The pool starts with its kept arenas (keep_gib: allocated at create,
 * never returned; none by default). An allocation takes a free page of the lowest-numbered
 * arena that has one (so high arenas drain and can be returned); when every present arena is
 * full it allocates one more arena (never moving or copying a page). When the last used page
 * of an arena that is not kept is freed, the arena is returned to the device at once.
 * Pinning is slow (about 0.1 s per 256 MiB arena on the H200 machine, with the device idle if
 * the pass waits for it): a pool that grows while a long prompt prefills stalls the prefill,
 * which is why the engine keeps its whole limit pinned from the start.
 *
 * The limit. limit_gib is a hard ceiling on the pool's pinned bytes. The pool has
 * floor(limit / page_bytes) page ids: floor(limit / arena_bytes) full arenas and, if a whole
 * page of the limit remains, one shorter last arena. AKV_EFULL when all of them are in use.
 *
 * Freeing a leased page. A free that drops one of several owners always succeeds (the page
 * stays). For the last owner, akv_host_pool_page_free refuses (AKV_EBUSY, nothing changed);
 * akv_host_pool_page_free_deferred accepts, marks the page doomed (no new lease, no second
 * free; its address and the existing leases stay valid) and the last release frees it. A
 * cancelled context uses the deferred form: its pages are reused only after every copy that
 * leased them has been released.
 *
 * Invariants (checked by the validity walker, akv__host_pool_check in src/mem/mem_check.h)
 *   - every page id of a present arena is either free (on its arena's free stack exactly
 *     once) or used; used + free = pages of present arenas;
 *   - an arena with no used page is not present (it was returned), unless it is kept; a
 *     kept arena is always present;
 *   - pinned bytes held = sum of present arena sizes <= limit, and equals what the pool
 *     reports in akv_host_pool_stats;
 *   - a leased page is used (or doomed), never free; a doomed page is leased;
 *   - a free page has no owner, a used page one or more, a doomed page exactly one (the
 *     deferred free was its last owner's); the shares counted = sum of owners - 1;
 *   - generations never decrease for a page id, across arena returns too; gen 0 is never
 *     issued, so a zeroed handle is always stale.
 *
 * Thread-safety: none. One thread (the engine's) owns a pool and everything built on it.
 */
#ifndef AKV_HOST_POOL_H
#define AKV_HOST_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/geom.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_host_pool akv_host_pool;

/* A handle to one host page: which id, and which generation of it. A plain value. */
typedef struct akv_host_page {
    uint32_t id;  /* page id in the pool */
    uint32_t gen; /* generation the handle was issued with; never 0 for a live page */
} akv_host_page;

#define AKV_HOST_POOL_DEFAULT_ARENA_BYTES ((size_t)256 << 20)
#define AKV_HOST_POOL_MAX_GIB 65536u /* 64 TiB: anything above is a configuration error */

typedef struct akv_host_pool_params {
    uint32_t limit_gib;  /* hard ceiling on pinned bytes, whole GiB; 0 is an error: the
                            operator must choose it (there is no automatic size) */
    size_t arena_bytes;  /* bytes per arena before cutting into whole pages; 0 = 256 MiB.
                            Must hold at least one page and not exceed the limit. */
    uint32_t keep_gib;   /* pinned at create and kept until destroy: the whole arenas that
                            cover this many GiB (<= limit_gib). 0 = none: every arena is
                            allocated when first needed and returned when it empties */
    akv_repr repr;       /* the representation its pages hold (akv/kv_repr.h): exact (0), or a
                            compact form (compact copies made from an exact pool's pages) */
} akv_host_pool_params;

typedef struct akv_host_pool_stats {
    size_t page_bytes;        /* bytes of one page */
    size_t limit_bytes;       /* limit_gib in bytes */
    uint32_t pages_per_arena; /* pages of a full arena */
    uint32_t n_slots;         /* arenas the limit allows */
    uint64_t capacity_pages;  /* page ids the limit allows (all arenas present and full) */
    uint32_t n_arenas;        /* arenas present now */
    size_t pinned_bytes;      /* bytes of the present arenas = pinned bytes the pool holds */
    uint64_t n_used;          /* pages handed out and not freed (doomed pages included) */
    uint64_t n_free;          /* free pages inside present arenas */
    uint64_t n_leases;        /* live leases over all pages */
    uint64_t n_doomed;        /* pages whose deferred free waits for the last release */
    uint64_t n_shares;        /* owners beyond the first, over all pages (0: nothing shared) */
    uint64_t n_share_changes; /* owners added to a page or dropped from a shared one, ever: it
                                 moves whenever who holds a shared page changes */
    uint64_t n_allocs;        /* successful page allocations, ever */
    uint64_t n_refused_full;  /* allocations refused with AKV_EFULL at the limit */
    uint64_t n_arena_grows;   /* arenas allocated, ever */
    uint64_t n_arena_returns; /* arenas returned to the device, ever */
} akv_host_pool_stats;

/* limit_gib = 0 (must be set), arena_bytes = 256 MiB. */
akv_host_pool_params akv_host_pool_default_params(void);

/* Creates a pool with no page in use (no arena but the kept ones) for pages of geometry *g on
 * `dev`, which must outlive the pool. AKV_EINVAL, logged naming the setting, for a missing or absurd limit, an arena that
 * holds no page or exceeds the limit, more page ids than int32 can index, or keep_gib above the
 * limit; the device's status when the kept arenas cannot be pinned (nothing is left). */
akv_status akv_host_pool_create(akv_dev *dev, const akv_geom *g, const akv_host_pool_params *p,
                                akv_host_pool **out);

/* Destroys the pool and returns every arena. NULL is a no-op. AKV_EBUSY, nothing changed,
 * while any page is in use (free your page tables first) or leased. */
akv_status akv_host_pool_destroy(akv_host_pool *pool);

/* Allocates one page (contents undefined). AKV_EFULL when every page id the limit allows is
 * in use (counted; not logged: it is a normal refusal); AKV_ENOMEM when growing needed host
 * or pinned memory that could not be had (nothing changed). */
akv_status akv_host_pool_page_alloc(akv_host_pool *pool, akv_host_page *out);

/* Frees a page: drops one owner of a shared page (always, leased or not); the last owner's
 * free frees it, AKV_EBUSY while it is leased (nothing changed). AKV_ESTATE for a stale handle
 * or a doomed page (already freed deferred). Returns the page's arena if it was its last. */
akv_status akv_host_pool_page_free(akv_host_pool *pool, akv_host_page page);

/* As page_free, except that the last owner's free of a leased page is accepted: the page is
 * freed when its last lease is released (doomed meanwhile: no new lease, no second free, no
 * share). AKV_ESTATE for a stale handle or a page already doomed. */
akv_status akv_host_pool_page_free_deferred(akv_host_pool *pool, akv_host_page page);

/* One more owner of a live page (a table that shares it): it is freed only when every owner
 * has freed it. AKV_ESTATE for a stale handle or a doomed page; AKV_EOVERFLOW past 2^32-1
 * owners. */
akv_status akv_host_pool_page_share(akv_host_pool *pool, akv_host_page page);

/* Owners of the page (1: held by one table); 0 for a stale handle. */
uint32_t akv_host_pool_page_n_owners(const akv_host_pool *pool, akv_host_page page);

/* Pins page + generation: until the matching release the page cannot be freed or recycled.
 * Leases nest (a count). AKV_ESTATE for a stale handle or a doomed page; AKV_EOVERFLOW past
 * 2^32-1 leases on one page. */
akv_status akv_host_pool_page_lease(akv_host_pool *pool, akv_host_page page);

/* Releases one lease (one release per lease). AKV_ESTATE for a stale handle or a page with no
 * lease. Completes a deferred free at the last release. */
akv_status akv_host_pool_page_release(akv_host_pool *pool, akv_host_page page);

/* The page's bytes (page_bytes of them), borrowed: valid until the page is freed. NULL for a
 * stale handle. A doomed page still has its address (its leases still copy). */
void *akv_host_pool_page_addr(const akv_host_pool *pool, akv_host_page page);

/* Whether the handle names a live (used or doomed) page of its generation. */
int akv_host_pool_page_is_live(const akv_host_pool *pool, akv_host_page page);

/* Live leases on the page; 0 for a stale handle. */
uint32_t akv_host_pool_page_n_leases(const akv_host_pool *pool, akv_host_page page);

size_t akv_host_pool_page_bytes(const akv_host_pool *pool);
akv_repr akv_host_pool_repr(const akv_host_pool *pool);
const akv_geom *akv_host_pool_geom(const akv_host_pool *pool); /* borrowed, pool's lifetime */
akv_dev *akv_host_pool_dev(const akv_host_pool *pool); /* the device it was created on (borrowed) */

void akv_host_pool_get_stats(const akv_host_pool *pool, akv_host_pool_stats *out);

/* The layout a pool with these params would have, computed without allocating anything:
 * fills page_bytes, limit_bytes, pages_per_arena, n_slots and capacity_pages of *out (the
 * rest zero). Same checks and errors as akv_host_pool_create; *out untouched on error. */
akv_status akv_host_pool_layout(const akv_geom *g, const akv_host_pool_params *p,
                                akv_host_pool_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* AKV_HOST_POOL_H */
