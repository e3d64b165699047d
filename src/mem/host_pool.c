/*
 * host_pool.c — pinned arenas cut into pages; page generations and leases.
 *
 * Data: a fixed array of arena slots (as many as the limit allows). A present slot has its
 * pinned block, a page record per page and a stack of its free page indices. An absent slot
 * keeps only gen_floor, the highest generation it ever issued, so that an arena allocated
 * again in the slot continues its generations instead of restarting them (a handle from the
 * arena's previous life must stay stale).
 */
#include "akv/host_pool.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "mem/mem_check.h"

enum { HP_FREE = 0, HP_USED = 1, HP_DOOMED = 2 };

#define HP_MAX_SLOTS (1u << 20) /* arena records; more means arenas absurdly small */

typedef struct hp_page {
    uint32_t gen;      /* current generation; 0 only before the first allocation */
    uint32_t n_leases; /* live leases */
    uint32_t n_owners; /* tables holding it (1 at its allocation; more once shared); 0 free */
    uint8_t state;     /* HP_FREE, HP_USED, HP_DOOMED */
    uint8_t mark;      /* scratch of the validity walker; 0 outside it */
} hp_page;

typedef struct hp_arena {
    unsigned char *base; /* pinned block of n_pages * page_bytes; NULL = slot absent */
    hp_page *pages;      /* [n_pages], with free_stack in the same block */
    uint32_t *free_stack; /* [n_pages]: indices of free pages, top at n_free - 1 */
    uint32_t n_free;
    uint32_t n_pages;   /* pages of this slot when present (the last slot may be shorter) */
    uint32_t gen_floor; /* highest generation issued in this slot, kept while absent */
} hp_arena;

/* What a geometry and params imply, computed once (create) or alone (capacity). */
typedef struct hp_layout {
    size_t page_bytes, limit_bytes;
    uint32_t pages_per_arena, n_slots;
    uint32_t n_kept;   /* slots [0, n_kept) are allocated at create and never returned */
    uint64_t capacity; /* page ids */
} hp_layout;

struct akv_host_pool {
    akv_dev *dev;
    akv_geom geom;
    akv_repr repr;
    hp_layout lay;
    hp_arena *slots; /* [lay.n_slots] */
    uint32_t hint;   /* every slot below it is present and full (a search start) */
    akv_host_pool_stats st;
};

akv_host_pool_params akv_host_pool_default_params(void) {
    return (akv_host_pool_params){.limit_gib = 0, .arena_bytes = AKV_HOST_POOL_DEFAULT_ARENA_BYTES};
}

static akv_status hp_layout_of(const akv_geom *g, const akv_host_pool_params *p, hp_layout *out) {
    if (!g || !p || !out) return AKV_EINVAL;
    akv_status gst = akv_geom_check(g);
    if (gst != AKV_OK) return gst;
    if (p->limit_gib == 0 || p->limit_gib > AKV_HOST_POOL_MAX_GIB) {
        AKV_LOG_E("host pool: {=limit_gib} = %u must be a whole number of GiB in "
                  "[1, %u]; there is no automatic size",
                  p->limit_gib, AKV_HOST_POOL_MAX_GIB);
        return AKV_EINVAL;
    }
    hp_layout l = {.page_bytes = akv_geom_repr_page_bytes(g, p->repr)};
    if (l.page_bytes == 0) {
        AKV_LOG_E("host pool: pages of representation %s cannot hold head dim %u",
                  akv_repr_name(p->repr), g->head_dim);
        return (unsigned)p->repr < AKV_REPR_COUNT ? AKV_EUNSUPPORTED : AKV_EINVAL;
    }
    size_t arena = p->arena_bytes ? p->arena_bytes : AKV_HOST_POOL_DEFAULT_ARENA_BYTES;
    if (!akv__size_mul(p->limit_gib, (size_t)1 << 30, &l.limit_bytes)) return AKV_EOVERFLOW;
    if (arena < l.page_bytes) {
        AKV_LOG_E("host pool: {=arena_bytes} = %zu holds no page of %zu bytes",
                  arena, l.page_bytes);
        return AKV_EINVAL;
    }
    if (arena > l.limit_bytes) {
        AKV_LOG_E("host pool: {=arena_bytes} = %zu exceeds {=limit_gib} = %u",
                  arena, p->limit_gib);
        return AKV_EINVAL;
    }
    l.capacity = l.limit_bytes / l.page_bytes;
    if (l.capacity > INT32_MAX) {
        AKV_LOG_E("host pool: %u GiB of %zu-byte pages is %llu page ids, more than int32 page "
                  "tables index; use larger pages",
                  p->limit_gib, l.page_bytes, (unsigned long long)l.capacity);
        return AKV_EINVAL;
    }
    uint64_t ppa = arena / l.page_bytes; /* <= capacity <= INT32_MAX */
    uint64_t n_slots = (l.capacity + ppa - 1) / ppa;
    if (n_slots > HP_MAX_SLOTS) {
        AKV_LOG_E("host pool: {=arena_bytes} = %zu makes %llu arenas of the "
                  "limit, more than %u; use larger arenas",
                  arena, (unsigned long long)n_slots, HP_MAX_SLOTS);
        return AKV_EINVAL;
    }
    l.pages_per_arena = (uint32_t)ppa;
    l.n_slots = (uint32_t)n_slots;
    if (p->keep_gib > p->limit_gib) {
        AKV_LOG_E("host pool: {=keep_gib} = %u exceeds {=limit_gib} = %u", p->keep_gib, p->limit_gib);
        return AKV_EINVAL;
    }
    /* whole arenas covering keep_gib: (keep + arena - 1) / arena, at most every slot */
    const uint64_t arena_pinned = ppa * l.page_bytes, keep = (uint64_t)p->keep_gib << 30;
    const uint64_t n_kept = (keep + arena_pinned - 1) / arena_pinned;
    l.n_kept = (uint32_t)(n_kept < n_slots ? n_kept : n_slots);
    *out = l;
    return AKV_OK;
}

/* The layout fields of the stats, from a layout. */
static akv_host_pool_stats hp_layout_stats(const hp_layout *l) {
    return (akv_host_pool_stats){.page_bytes = l->page_bytes,
                                 .limit_bytes = l->limit_bytes,
                                 .pages_per_arena = l->pages_per_arena,
                                 .n_slots = l->n_slots,
                                 .capacity_pages = l->capacity};
}

akv_status akv_host_pool_layout(const akv_geom *g, const akv_host_pool_params *p,
                                akv_host_pool_stats *out) {
    hp_layout l;
    akv_status st = hp_layout_of(g, p, &l);
    if (st != AKV_OK) return st;
    *out = hp_layout_stats(&l);
    return AKV_OK;
}

/* Pages slot s holds when present: a full arena, or what is left of the limit. */
static uint32_t hp_slot_pages(const hp_layout *l, uint32_t s) {
    uint64_t first = (uint64_t)s * l->pages_per_arena;
    uint64_t left = l->capacity - first;
    return left < l->pages_per_arena ? (uint32_t)left : l->pages_per_arena;
}

static akv_status hp_arena_grow(akv_host_pool *pool, uint32_t s);

akv_status akv_host_pool_create(akv_dev *dev, const akv_geom *g, const akv_host_pool_params *p,
                                akv_host_pool **out) {
    if (!dev || !g || !out) {
        AKV_LOG_E("host pool: create with a NULL %s", !dev ? "device" : !g ? "geometry" : "output");
        return AKV_EINVAL;
    }
    akv_host_pool_params prm = p ? *p : akv_host_pool_default_params();
    hp_layout l;
    akv_status st = hp_layout_of(g, &prm, &l);
    if (st != AKV_OK) return st;
    akv_host_pool *pool = akv__calloc(1, sizeof *pool);
    if (!pool) return AKV_ENOMEM;
    pool->slots = akv__calloc(l.n_slots, sizeof *pool->slots);
    if (!pool->slots) {
        akv__free(pool);
        return AKV_ENOMEM;
    }
    for (uint32_t s = 0; s < l.n_slots; s++) pool->slots[s].n_pages = hp_slot_pages(&l, s);
    pool->dev = dev;
    pool->geom = *g;
    pool->repr = p->repr;
    pool->lay = l;
    pool->st = hp_layout_stats(&l);
    for (uint32_t k = 0; k < l.n_kept; k++) {
        if ((st = hp_arena_grow(pool, k)) == AKV_OK) continue;
        AKV_LOG_E("host pool: %u GiB to keep pinned could not be allocated (arena %u of %u)",
                  prm.keep_gib, k + 1, l.n_kept);
        akv_host_pool_destroy(pool);
        return st;
    }
    *out = pool;
    return AKV_OK;
}

/* Returns a present slot's arena to the device and keeps its generation floor. */
static void hp_arena_return(akv_host_pool *pool, uint32_t s) {
    hp_arena *a = &pool->slots[s];
    akv_status st = akv_dev_pinned_free(pool->dev, a->base);
    if (st != AKV_OK) {
        /* The device refused its own block back: keep the arena (empty, reusable) rather
         * than lose track of pinned bytes. Accounting stays exact. */
        AKV_LOG_E("host pool: returning arena %u failed (%s); it stays in the pool", s,
                  akv_status_str(st));
        return;
    }
    uint32_t floor = a->gen_floor;
    for (uint32_t i = 0; i < a->n_pages; i++)
        if (a->pages[i].gen > floor) floor = a->pages[i].gen;
    akv__free(a->pages);
    a->base = NULL;
    a->pages = NULL;
    a->free_stack = NULL;
    a->n_free = 0;
    a->gen_floor = floor;
    pool->st.n_arenas--;
    pool->st.pinned_bytes -= (size_t)a->n_pages * pool->lay.page_bytes;
    pool->st.n_free -= a->n_pages;
    pool->st.n_arena_returns++;
}

akv_status akv_host_pool_destroy(akv_host_pool *pool) {
    if (!pool) return AKV_OK;
    if (pool->st.n_used || pool->st.n_leases) {
        AKV_LOG_E("host pool: destroy refused: %llu page(s) in use, %llu lease(s) live",
                  (unsigned long long)pool->st.n_used, (unsigned long long)pool->st.n_leases);
        return AKV_EBUSY;
    }
    for (uint32_t s = 0; s < pool->lay.n_slots; s++)
        if (pool->slots[s].base) hp_arena_return(pool, s);
    /* An arena the device refused to take back stays leaked; it was logged. */
    akv__free(pool->slots);
    akv__free(pool);
    return AKV_OK;
}

/* Makes slot s present: pinned block + page records. Nothing changes on failure. */
static akv_status hp_arena_grow(akv_host_pool *pool, uint32_t s) {
    hp_arena *a = &pool->slots[s];
    size_t n = a->n_pages, meta_bytes;
    if (!akv__size_mul(n, sizeof(hp_page) + sizeof(uint32_t), &meta_bytes)) return AKV_EOVERFLOW;
    hp_page *pages = akv__malloc(meta_bytes);
    if (!pages) return AKV_ENOMEM;
    void *base = NULL;
    akv_status st = akv_dev_pinned_alloc(pool->dev, n * pool->lay.page_bytes, &base);
    if (st != AKV_OK) {
        AKV_LOG_E("host pool: pinned arena of %zu bytes could not be allocated (%s)",
                  n * pool->lay.page_bytes, akv_status_str(st));
        akv__free(pages);
        return st;
    }
    a->base = base;
    a->pages = pages;
    a->free_stack = (uint32_t *)(pages + n);
    /* Stack top = index 0, so an arena fills from its low addresses. */
    for (uint32_t i = 0; i < n; i++) {
        pages[i] = (hp_page){.gen = a->gen_floor, .state = HP_FREE};
        a->free_stack[i] = (uint32_t)(n - 1 - i);
    }
    a->n_free = (uint32_t)n;
    pool->st.n_arenas++;
    pool->st.pinned_bytes += n * pool->lay.page_bytes;
    pool->st.n_free += n;
    pool->st.n_arena_grows++;
    return AKV_OK;
}

akv_status akv_host_pool_page_alloc(akv_host_pool *pool, akv_host_page *out) {
    if (!pool || !out) return AKV_EINVAL;
    /* The lowest present arena with a free page; else grow the lowest absent slot. */
    uint32_t s = pool->hint, empty = UINT32_MAX;
    for (; s < pool->lay.n_slots; s++) {
        const hp_arena *a = &pool->slots[s];
        if (a->base && a->n_free) break;
        if (!a->base && empty == UINT32_MAX) empty = s;
    }
    if (s == pool->lay.n_slots) {
        /* Slots below the hint are all present and full, so `empty` is the lowest absent. */
        if (empty == UINT32_MAX) {
            pool->st.n_refused_full++;
            return AKV_EFULL;
        }
        akv_status st = hp_arena_grow(pool, empty);
        if (st != AKV_OK) return st;
        s = empty;
    }
    pool->hint = s < empty ? s : empty; /* never skip an absent slot */
    hp_arena *a = &pool->slots[s];
    uint32_t i = a->free_stack[--a->n_free];
    hp_page *pg = &a->pages[i];
    AKV_ASSERT(pg->state == HP_FREE && pg->n_leases == 0);
    pg->gen = pg->gen == UINT32_MAX ? 1 : pg->gen + 1; /* 0 is never issued */
    pg->state = HP_USED;
    pg->n_owners = 1;
    pool->st.n_used++;
    pool->st.n_free--;
    pool->st.n_allocs++;
    out->id = (uint32_t)((uint64_t)s * pool->lay.pages_per_arena + i);
    out->gen = pg->gen;
    return AKV_OK;
}

/* The record of a live handle (used or doomed, matching generation), or NULL. */
static hp_page *hp_find(const akv_host_pool *pool, akv_host_page h, hp_arena **arena_out,
                        uint32_t *idx_out) {
    uint32_t s = h.id / pool->lay.pages_per_arena, i = h.id % pool->lay.pages_per_arena;
    if (h.gen == 0 || s >= pool->lay.n_slots) return NULL;
    hp_arena *a = &pool->slots[s];
    if (!a->base || i >= a->n_pages) return NULL;
    hp_page *pg = &a->pages[i];
    if (pg->state == HP_FREE || pg->gen != h.gen) return NULL;
    if (arena_out) *arena_out = a;
    if (idx_out) *idx_out = i;
    return pg;
}

/* Frees a live, unleased page and returns its arena if it was the last used page. */
static void hp_free_now(akv_host_pool *pool, hp_arena *a, uint32_t i) {
    hp_page *pg = &a->pages[i];
    AKV_ASSERT(pg->n_leases == 0 && pg->state != HP_FREE);
    if (pg->state == HP_DOOMED) pool->st.n_doomed--;
    pg->state = HP_FREE;
    pg->n_owners = 0;
    a->free_stack[a->n_free++] = i;
    pool->st.n_used--;
    pool->st.n_free++;
    uint32_t s = (uint32_t)(a - pool->slots);
    if (s < pool->hint) pool->hint = s;
    if (a->n_free == a->n_pages && s >= pool->lay.n_kept) hp_arena_return(pool, s);
}

/* The record of a live page that is not doomed, for an operation named `op`; else logs why
 * and returns NULL (the caller answers AKV_ESTATE). */
static hp_page *hp_find_undoomed(akv_host_pool *pool, akv_host_page page, const char *op,
                                 hp_arena **arena_out, uint32_t *idx_out) {
    hp_page *pg = hp_find(pool, page, arena_out, idx_out);
    if (pg && pg->state != HP_DOOMED) return pg;
    AKV_LOG_E("host pool: %s of %s page %u gen %u", op, pg ? "a doomed (freed, deferred)" : "a stale",
              page.id, page.gen);
    return NULL;
}

/* Drops one owner of a shared page; the last owner frees it now, or (deferred) dooms a leased
 * page so that its last release frees it. */
static akv_status hp_free(akv_host_pool *pool, akv_host_page page, int deferred) {
    if (!pool) return AKV_EINVAL;
    hp_arena *a;
    uint32_t i;
    hp_page *pg = hp_find_undoomed(pool, page, deferred ? "deferred free" : "free", &a, &i);
    if (!pg) return AKV_ESTATE;
    if (pg->n_owners > 1) { /* another table still holds it: its leases are that table's too */
        pg->n_owners--;
        pool->st.n_shares--;
        pool->st.n_share_changes++;
    } else if (pg->n_leases == 0) {
        hp_free_now(pool, a, i);
    } else if (deferred) {
        pg->state = HP_DOOMED;
        pool->st.n_doomed++;
    } else {
        AKV_LOG_E("host pool: free refused: the page is leased by %u copies (free it deferred, or "
                  "after they release)", pg->n_leases);
        return AKV_EBUSY;
    }
    return AKV_OK;
}

akv_status akv_host_pool_page_free(akv_host_pool *pool, akv_host_page page) {
    return hp_free(pool, page, 0);
}

akv_status akv_host_pool_page_free_deferred(akv_host_pool *pool, akv_host_page page) {
    return hp_free(pool, page, 1);
}

/* One more owner (share) or lease of a live, undoomed page: each a count up to 2^32-1. */
static akv_status hp_count_up(akv_host_pool *pool, akv_host_page page, int owner) {
    if (!pool) return AKV_EINVAL;
    const char *op = owner ? "share" : "lease";
    hp_page *pg = hp_find_undoomed(pool, page, op, NULL, NULL);
    if (!pg) return AKV_ESTATE;
    uint32_t *n = owner ? &pg->n_owners : &pg->n_leases;
    if (*n == UINT32_MAX) {
        AKV_LOG_E("host pool: %s refused: the page already has 2^32-1 %s", op, owner ? "owners" : "leases");
        return AKV_EOVERFLOW;
    }
    ++*n;
    ++*(owner ? &pool->st.n_shares : &pool->st.n_leases);
    if (owner) pool->st.n_share_changes++;
    return AKV_OK;
}

akv_status akv_host_pool_page_share(akv_host_pool *pool, akv_host_page page) {
    return hp_count_up(pool, page, 1);
}

uint32_t akv_host_pool_page_n_owners(const akv_host_pool *pool, akv_host_page page) {
    const hp_page *pg = pool ? hp_find(pool, page, NULL, NULL) : NULL;
    return pg ? pg->n_owners : 0;
}

akv_status akv_host_pool_page_lease(akv_host_pool *pool, akv_host_page page) {
    return hp_count_up(pool, page, 0);
}

akv_status akv_host_pool_page_release(akv_host_pool *pool, akv_host_page page) {
    if (!pool) return AKV_EINVAL;
    hp_arena *a;
    uint32_t i;
    hp_page *pg = hp_find(pool, page, &a, &i);
    if (!pg || pg->n_leases == 0) {
        AKV_LOG_E("host pool: release of %s page %u gen %u", pg ? "an unleased" : "a stale",
                  page.id, page.gen);
        return AKV_ESTATE;
    }
    pg->n_leases--;
    pool->st.n_leases--;
    if (pg->n_leases == 0 && pg->state == HP_DOOMED) hp_free_now(pool, a, i);
    return AKV_OK;
}

void *akv_host_pool_page_addr(const akv_host_pool *pool, akv_host_page page) {
    if (!pool) return NULL;
    hp_arena *a;
    uint32_t i;
    if (!hp_find(pool, page, &a, &i)) return NULL;
    return a->base + (size_t)i * pool->lay.page_bytes;
}

int akv_host_pool_page_is_live(const akv_host_pool *pool, akv_host_page page) {
    return pool && hp_find(pool, page, NULL, NULL) != NULL;
}

uint32_t akv_host_pool_page_n_leases(const akv_host_pool *pool, akv_host_page page) {
    const hp_page *pg = pool ? hp_find(pool, page, NULL, NULL) : NULL;
    return pg ? pg->n_leases : 0;
}

size_t akv_host_pool_page_bytes(const akv_host_pool *pool) {
    return pool->lay.page_bytes;
}

akv_repr akv_host_pool_repr(const akv_host_pool *pool) {
    return pool->repr;
}

const akv_geom *akv_host_pool_geom(const akv_host_pool *pool) {
    return &pool->geom;
}

akv_dev *akv_host_pool_dev(const akv_host_pool *pool) {
    return pool->dev;
}

void akv_host_pool_get_stats(const akv_host_pool *pool, akv_host_pool_stats *out) {
    *out = pool->st;
}

akv_status akv__host_pool_check(akv_host_pool *pool) {
#define HP_BAD(...)                                                                                \
    do {                                                                                           \
        AKV_LOG_E("host pool check: " __VA_ARGS__);                                                \
        return AKV_ESTATE;                                                                         \
    } while (0)
    const hp_layout *l = &pool->lay;
    uint64_t n_used = 0, n_free = 0, n_leases = 0, n_doomed = 0, n_shares = 0, cap = 0;
    size_t pinned = 0;
    uint32_t n_arenas = 0;
    for (uint32_t s = 0; s < l->n_slots; s++) {
        const hp_arena *a = &pool->slots[s];
        if (a->n_pages != hp_slot_pages(l, s)) HP_BAD("slot %u has %u pages", s, a->n_pages);
        cap += a->n_pages;
        if (s < pool->hint && (!a->base || a->n_free))
            HP_BAD("slot %u below the search hint %u is absent or has a free page", s, pool->hint);
        if (!a->base) {
            if (s < l->n_kept) HP_BAD("kept slot %u is absent", s);
            if (a->pages || a->n_free) HP_BAD("absent slot %u keeps records", s);
            continue;
        }
        n_arenas++;
        pinned += (size_t)a->n_pages * l->page_bytes;
        if (a->n_free > a->n_pages) HP_BAD("slot %u: %u free of %u", s, a->n_free, a->n_pages);
        if (a->n_free == a->n_pages && s >= l->n_kept)
            HP_BAD("slot %u is present with no used page", s);
        /* every free page on the stack exactly once, and nothing else there: mark the stack
         * entries, check every record against its mark, clear the marks */
        int dup = 0;
        for (uint32_t k = 0; k < a->n_free; k++) {
            uint32_t i = a->free_stack[k];
            if (i >= a->n_pages) HP_BAD("slot %u: free stack entry %u is %u", s, k, i);
            dup |= a->pages[i].mark;
            a->pages[i].mark = 1;
        }
        uint32_t bad_i = UINT32_MAX;
        for (uint32_t i = 0; i < a->n_pages; i++) {
            hp_page *pg = &a->pages[i];
            int bad = (pg->state == HP_FREE) != (pg->mark == 1) || pg->state > HP_DOOMED ||
                      (pg->state == HP_FREE && pg->n_leases) ||
                      (pg->state == HP_DOOMED && pg->n_leases == 0) ||
                      (pg->state == HP_FREE) != (pg->n_owners == 0) ||
                      (pg->state == HP_DOOMED && pg->n_owners != 1) ||
                      (pg->state != HP_FREE && pg->gen == 0) || pg->gen < a->gen_floor;
            if (bad && bad_i == UINT32_MAX) bad_i = i;
            pg->mark = 0;
            n_used += pg->state != HP_FREE;
            n_free += pg->state == HP_FREE;
            n_leases += pg->n_leases;
            n_doomed += pg->state == HP_DOOMED;
            n_shares += pg->n_owners > 1 ? pg->n_owners - 1 : 0;
        }
        if (dup) HP_BAD("slot %u: a page is on the free stack twice", s);
        if (bad_i != UINT32_MAX) {
            const hp_page *pg = &a->pages[bad_i];
            HP_BAD("slot %u page %u: state %u, %u leases, %u owners, gen %u (floor %u), or its "
                   "place on the free stack disagrees with its state",
                   s, bad_i, pg->state, pg->n_leases, pg->n_owners, pg->gen, a->gen_floor);
        }
    }
    const akv_host_pool_stats *st = &pool->st;
    if (cap != l->capacity) HP_BAD("slots hold %llu pages, capacity %llu", (unsigned long long)cap,
                                   (unsigned long long)l->capacity);
    if (pinned > l->limit_bytes) HP_BAD("%zu pinned bytes over the limit %zu", pinned, l->limit_bytes);
    if (n_arenas != st->n_arenas || pinned != st->pinned_bytes || n_used != st->n_used ||
        n_free != st->n_free || n_leases != st->n_leases || n_doomed != st->n_doomed ||
        n_shares != st->n_shares)
        HP_BAD("counts disagree: arenas %u/%u pinned %zu/%zu used %llu/%llu free %llu/%llu "
               "leases %llu/%llu doomed %llu/%llu shares %llu/%llu",
               n_arenas, st->n_arenas, pinned, st->pinned_bytes, (unsigned long long)n_used,
               (unsigned long long)st->n_used, (unsigned long long)n_free,
               (unsigned long long)st->n_free, (unsigned long long)n_leases,
               (unsigned long long)st->n_leases, (unsigned long long)n_doomed,
               (unsigned long long)st->n_doomed, (unsigned long long)n_shares,
               (unsigned long long)st->n_shares);
    return AKV_OK;
#undef HP_BAD
}
