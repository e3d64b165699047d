/*
 * dev_pool.c — one device allocation cut into pages; per-context windows placed each step in
 * the order of akv/dev_pool.h; a staging reserve; counted reasons for every move and wait.
 *
 * Data
 *   free_bits   one bit per device page, 1 = free; pages are taken lowest id first, so
 *               windows and staging buffers stay as contiguous as the history allows.
 *   owner       per page: DP_FREE, DP_STAGING, or the index of the owning context in ctxs.
 *   a context   its window as parallel arrays sorted by logical page: logical[w], fresh[w],
 *               pages[w * n_layers + layer] (a window page is one page in every layer).
 */
#include "akv/dev_pool.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "mem/mem_text.h"
#include "mem/mem_check.h"

#define DP_FREE UINT32_MAX
#define DP_STAGING (UINT32_MAX - 1)
#define DP_MARK (UINT32_MAX - 2)         /* staging release's scratch owner */
#define DP_MAX_CONTEXTS (UINT32_MAX - 3) /* context indices stay below the special owners */
#define DP_UNWANTED UINT32_MAX          /* the rank of a logical page outside the order */

enum dp_pass { DP_PASS_FLOOR, DP_PASS_TARGET, DP_PASS_BURST };

/* An order: order[k] is the logical page of rank k, rank[lp] the rank of logical page lp
 * (DP_UNWANTED: not in the order); the first n_floor ranks are the floor. */
typedef struct dp_order {
    uint32_t *order, *rank;
    uint32_t n_order, n_floor, n_rank;
    size_t cap_order, cap_rank; /* entries */
} dp_order;

struct akv_dev_pool_ctx {
    uint32_t idx;                     /* position in pool->ctxs (changes when others close) */
    uint32_t target, burst;           /* in force */
    uint32_t next_target, next_burst; /* from the next step on */
    uint64_t n_tokens;                /* at the last served step */
    uint32_t n_lp;                    /* logical pages per layer at the last served step */
    uint64_t last_active;             /* last step it was in a batch; 0 = never */
    uint32_t n_win, n_borrowed, cap;  /* window pages held, of them borrowed; array capacity */
    uint32_t *logical;                /* [cap], ascending */
    uint32_t *pages;                  /* [cap][n_layers] device page ids */
    uint8_t *fresh;                   /* [cap] placed by the last served step */
    /* what the caller wants resident: `served`, the order of its last served step (what its
     * window is a prefix of, and what it loses first while idle); `next`, the order of the
     * step under way, which becomes `served` if the step serves it. `cur` is the one in
     * force: next from the start of a step that names it, served otherwise. */
    dp_order served, next;
    dp_order *cur;
    /* scratch of one step */
    int in_batch, refused;
    uint32_t step_lp; /* logical pages per layer this step asks for */
    akv_dev_pool_ctx_stats st;
};

struct akv_dev_pool {
    akv_dev *dev;
    akv_geom geom;
    size_t page_bytes;
    akv_dptr base;
    uint32_t n_pages, n_layers;
    uint32_t window_cap, staging_reserve; /* window pages; device pages */
    uint32_t window_used, staging_used;
    uint32_t n_words, free_hint; /* words of free_bits; no free bit below word free_hint */
    uint32_t n_free;
    uint64_t *free_bits;        /* [n_words] */
    uint64_t *marks;            /* [n_words] the walker's scratch */
    uint32_t *owner;            /* [n_pages] */
    akv_dev_pool_ctx **ctxs;    /* open contexts */
    size_t n_ctx, cap_ctx;
    uint64_t step;
    akv_dev_pool_counts counts;
    akv_dev_pool_wait last_wait;
};

akv_dev_pool_params akv_dev_pool_default_params(void) {
    return (akv_dev_pool_params){.device_gib = 0, .staging_pages = 0};
}

/* ---- pages: the free bitmap ------------------------------------------------------------- */

static uint32_t dp_take_page(akv_dev_pool *pool, uint32_t owner) {
    AKV_ASSERT(pool->n_free > 0);
    uint32_t w = pool->free_hint;
    while (pool->free_bits[w] == 0) w++;
    pool->free_hint = w;
    uint32_t id = w * 64 + (uint32_t)__builtin_ctzll(pool->free_bits[w]);
    pool->free_bits[w] &= pool->free_bits[w] - 1;
    pool->owner[id] = owner;
    pool->n_free--;
    return id;
}

static void dp_put_page(akv_dev_pool *pool, uint32_t id) {
    AKV_ASSERT(id < pool->n_pages && pool->owner[id] != DP_FREE);
    pool->free_bits[id / 64] |= 1ull << (id % 64);
    pool->owner[id] = DP_FREE;
    pool->n_free++;
    if (id / 64 < pool->free_hint) pool->free_hint = id / 64;
}

/* ---- create / destroy ----------------------------------------------------------------- */

akv_status akv_dev_pool_layout(const akv_geom *g, const akv_dev_pool_params *p,
                               akv_dev_pool_stats *out) {
    if (!g || !p || !out) return AKV_EINVAL;
    akv_status gst = akv_geom_check(g);
    if (gst != AKV_OK) return gst;
    if (p->device_gib == 0 || p->device_gib > AKV_DEV_POOL_MAX_GIB) {
        AKV_LOG_E("device pool: {=device_gib} = %u must be a whole number of GiB in "
                  "[1, %u]; it is never automatic",
                  p->device_gib, AKV_DEV_POOL_MAX_GIB);
        return AKV_EINVAL;
    }
    size_t page_bytes = akv_geom_repr_page_bytes(g, p->repr);
    if (page_bytes == 0) {
        AKV_LOG_E("device pool: pages of representation %s cannot hold head dim %u",
                  akv_repr_name(p->repr), g->head_dim);
        return (unsigned)p->repr < AKV_REPR_COUNT ? AKV_EUNSUPPORTED : AKV_EINVAL;
    }
    uint64_t n_pages = ((uint64_t)p->device_gib << 30) / page_bytes;
    if (n_pages > INT32_MAX) {
        AKV_LOG_E("device pool: %u GiB of %zu-byte pages is %llu pages, more than int32 page "
                  "ids index; use larger pages",
                  p->device_gib, page_bytes, (unsigned long long)n_pages);
        return AKV_EINVAL;
    }
    if (p->staging_pages > n_pages) {
        AKV_LOG_E("device pool: {=staging_pages} = %u exceeds the %llu pages of "
                  "{=device_gib} = %u",
                  p->staging_pages, (unsigned long long)n_pages, p->device_gib);
        return AKV_EINVAL;
    }
    uint32_t window_cap = (uint32_t)((n_pages - p->staging_pages) / g->n_layers);
    /* the pages no whole window page can use (n_pages - staging is rarely a multiple of
     * n_layers) go to the staging reserve rather than to nobody */
    *out = (akv_dev_pool_stats){.page_bytes = page_bytes,
                                .n_pages = (uint32_t)n_pages,
                                .window_capacity = window_cap,
                                .staging_reserve = (uint32_t)n_pages - window_cap * g->n_layers};
    return AKV_OK;
}

akv_status akv_dev_pool_create(akv_dev *dev, const akv_geom *g, const akv_dev_pool_params *p,
                               akv_dev_pool **out) {
    if (!dev || !g || !p || !out) return AKV_EINVAL;
    akv_dev_pool_stats lay;
    akv_status st = akv_dev_pool_layout(g, p, &lay);
    if (st != AKV_OK) return st;
    if (lay.window_capacity < 2) {
        AKV_LOG_E("device pool: {=device_gib} = %u less %u staging pages holds %u window "
                  "page(s) of %u layers x %zu bytes; one floor (sink + tail) needs 2: raise "
                  "{=device_gib} to at least %llu",
                  p->device_gib, p->staging_pages, lay.window_capacity, g->n_layers,
                  lay.page_bytes,
                  (unsigned long long)((((uint64_t)2 * g->n_layers + p->staging_pages) *
                                            lay.page_bytes + ((1ull << 30) - 1)) >> 30));
        return AKV_EINVAL;
    }
    size_t bytes = (size_t)p->device_gib << 30;
    uint64_t n_pages = lay.n_pages;
    akv_dev_pool *pool = akv__calloc(1, sizeof *pool);
    if (!pool) return AKV_ENOMEM;
    pool->n_words = (uint32_t)((n_pages + 63) / 64);
    pool->free_bits = akv__calloc(pool->n_words, sizeof *pool->free_bits);
    pool->marks = akv__calloc(pool->n_words, sizeof *pool->marks);
    pool->owner = akv__calloc(n_pages, sizeof *pool->owner);
    st = AKV_ENOMEM;
    if (!pool->free_bits || !pool->marks || !pool->owner) goto fail;
    st = akv_dev_mem_alloc(dev, bytes, &pool->base);
    if (st != AKV_OK) {
        AKV_LOG_E("device pool: the device could not provide %u GiB (%s); lower {=device_gib}",
                  p->device_gib, akv_status_str(st));
        goto fail;
    }
    pool->dev = dev;
    pool->geom = *g;
    pool->page_bytes = lay.page_bytes;
    pool->n_pages = lay.n_pages;
    pool->n_layers = g->n_layers;
    pool->window_cap = lay.window_capacity;
    pool->staging_reserve = lay.staging_reserve;
    pool->n_free = pool->n_pages;
    for (uint32_t i = 0; i < pool->n_pages; i++) {
        pool->free_bits[i / 64] |= 1ull << (i % 64);
        pool->owner[i] = DP_FREE;
    }
    *out = pool;
    return AKV_OK;
fail:
    akv__free(pool->free_bits);
    akv__free(pool->marks);
    akv__free(pool->owner);
    akv__free(pool);
    return st;
}

akv_status akv_dev_pool_destroy(akv_dev_pool *pool) {
    if (!pool) return AKV_OK;
    if (pool->n_ctx || pool->staging_used) {
        AKV_LOG_E("device pool: destroy refused: %zu context(s) open, %u staging page(s) lent",
                  pool->n_ctx, pool->staging_used);
        return AKV_EBUSY;
    }
    akv_status st = akv_dev_mem_free(pool->dev, pool->base);
    if (st != AKV_OK) return st;
    akv__free(pool->ctxs);
    akv__free(pool->free_bits);
    akv__free(pool->marks);
    akv__free(pool->owner);
    akv__free(pool);
    return AKV_OK;
}

akv_dptr akv_dev_pool_base(const akv_dev_pool *pool) {
    return pool->base;
}

akv_dptr akv_dev_pool_page_addr(const akv_dev_pool *pool, uint32_t page_id) {
    AKV_ASSERT(page_id < pool->n_pages);
    return akv_dptr_offset(pool->base, (size_t)page_id * pool->page_bytes);
}

size_t akv_dev_pool_page_bytes(const akv_dev_pool *pool) {
    return pool->page_bytes;
}

uint32_t akv_dev_pool_n_pages(const akv_dev_pool *pool) {
    return pool->n_pages;
}

const akv_geom *akv_dev_pool_geom(const akv_dev_pool *pool) {
    return &pool->geom;
}

akv_dev *akv_dev_pool_dev(const akv_dev_pool *pool) {
    return pool->dev;
}

/* ---- counting --------------------------------------------------------------------------- */

static void dp_count(akv_dev_pool_counts *c, akv_dev_pool_reason r, uint64_t n_pages) {
    c->n_events[r]++;
    c->n_pages[r] += n_pages;
}

/* ---- contexts ----------------------------------------------------------------------------- */

static akv_status dp_check_target(const akv_dev_pool *pool, uint32_t target, uint32_t burst) {
    if (target < 2 || target > pool->window_cap || burst > pool->window_cap - target) {
        AKV_LOG_E("device pool: target %u + burst %u window pages: the target must be at least "
                  "2 (the floor) and target + burst at most the %u window pages of the pool",
                  target, burst, pool->window_cap);
        return AKV_EINVAL;
    }
    return AKV_OK;
}

/* Grows the window arrays to hold `cap` window pages (nothing changes on failure). */
static akv_status dp_ctx_reserve(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t cap) {
    if (cap <= c->cap) return AKV_OK;
    size_t per = sizeof(uint32_t) * (1 + (size_t)pool->n_layers) + 1, n_bytes;
    if (!akv__size_mul(cap, per, &n_bytes)) return AKV_EOVERFLOW;
    uint32_t *logical = akv__malloc(n_bytes);
    if (!logical) return AKV_ENOMEM;
    uint32_t *pages = logical + cap;
    uint8_t *fresh = (uint8_t *)(pages + (size_t)cap * pool->n_layers);
    if (c->n_win) {
        memcpy(logical, c->logical, c->n_win * sizeof *logical);
        memcpy(pages, c->pages, (size_t)c->n_win * pool->n_layers * sizeof *pages);
        memcpy(fresh, c->fresh, c->n_win);
    }
    akv__free(c->logical);
    c->logical = logical;
    c->pages = pages;
    c->fresh = fresh;
    c->cap = cap;
    return AKV_OK;
}

akv_status akv_dev_pool_ctx_open(akv_dev_pool *pool, const akv_dev_pool_ctx_params *p,
                                 akv_dev_pool_ctx **out) {
    if (!pool || !p || !out) return AKV_EINVAL;
    akv_status st = dp_check_target(pool, p->target, p->burst);
    if (st != AKV_OK) return st;
    if (pool->n_ctx >= DP_MAX_CONTEXTS) return AKV_EFULL;
    st = akv__array_reserve((void **)&pool->ctxs, &pool->cap_ctx, pool->n_ctx + 1,
                            sizeof *pool->ctxs);
    if (st != AKV_OK) return st;
    akv_dev_pool_ctx *c = akv__calloc(1, sizeof *c);
    if (!c) return AKV_ENOMEM;
    st = dp_ctx_reserve(pool, c, p->target + p->burst);
    if (st != AKV_OK) {
        akv__free(c);
        return st;
    }
    c->target = c->next_target = p->target;
    c->burst = c->next_burst = p->burst;
    c->st.tag = p->tag;
    c->cur = &c->served;
    c->idx = (uint32_t)pool->n_ctx;
    pool->ctxs[pool->n_ctx++] = c;
    *out = c;
    return AKV_OK;
}

/* Gives window page w of c back to the free pages. */
static void dp_slot_free(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t w) {
    uint32_t L = pool->n_layers;
    for (uint32_t l = 0; l < L; l++) dp_put_page(pool, c->pages[(size_t)w * L + l]);
    uint32_t tail = c->n_win - w - 1;
    memmove(&c->logical[w], &c->logical[w + 1], tail * sizeof *c->logical);
    memmove(&c->fresh[w], &c->fresh[w + 1], tail);
    memmove(&c->pages[(size_t)w * L], &c->pages[(size_t)(w + 1) * L], (size_t)tail * L * sizeof *c->pages);
    c->n_win--;
    pool->window_used--;
    if (c->n_borrowed) c->n_borrowed--; /* borrowed pages are the first to go */
}

/* Whether c is an open context of this pool. By address only: a closed context's memory is
 * never read (a second close, or a step naming a closed context, is caught, not a
 * use after free). */
static bool dp_ctx_open(const akv_dev_pool *pool, const akv_dev_pool_ctx *c) {
    for (uint32_t i = 0; i < pool->n_ctx; i++)
        if (pool->ctxs[i] == c) return true;
    return false;
}

void akv_dev_pool_ctx_close(akv_dev_pool *pool, akv_dev_pool_ctx *c) {
    if (!c) return;
    AKV_ASSERT(pool && dp_ctx_open(pool, c));
    while (c->n_win) dp_slot_free(pool, c, c->n_win - 1);
    akv_dev_pool_ctx *moved = pool->ctxs[--pool->n_ctx];
    if (moved != c) {
        moved->idx = c->idx;
        pool->ctxs[c->idx] = moved;
        for (size_t i = 0; i < (size_t)moved->n_win * pool->n_layers; i++)
            pool->owner[moved->pages[i]] = moved->idx;
    }
    akv__free(c->logical);
    akv__free(c->served.order), akv__free(c->served.rank);
    akv__free(c->next.order), akv__free(c->next.rank);
    akv__free(c);
}

akv_status akv_dev_pool_ctx_set_target(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t target,
                                       uint32_t burst) {
    if (!pool || !c) return AKV_EINVAL;
    if (!dp_ctx_open(pool, c)) {
        AKV_LOG_E("device pool: set_target names no open context of this pool");
        return AKV_EINVAL;
    }
    akv_status st = dp_check_target(pool, target, burst);
    if (st != AKV_OK) return st;
    st = dp_ctx_reserve(pool, c, target + burst);
    if (st != AKV_OK) return st;
    c->next_target = target;
    c->next_burst = burst;
    return AKV_OK;
}

uint32_t akv_dev_pool_ctx_window(const akv_dev_pool_ctx *c) {
    return c->n_win;
}

akv_dev_pool_slot akv_dev_pool_ctx_slot(const akv_dev_pool *pool, const akv_dev_pool_ctx *c,
                                        uint32_t layer, uint32_t w) {
    AKV_ASSERT(layer < pool->n_layers && w < c->n_win);
    return (akv_dev_pool_slot){.logical = c->logical[w],
                               .page_id = c->pages[(size_t)w * pool->n_layers + layer],
                               .fresh = c->fresh[w]};
}

/* Position of logical page lp in c's window, or -1. */
static int64_t dp_find_slot(const akv_dev_pool_ctx *c, uint32_t lp) {
    uint32_t lo = 0, hi = c->n_win;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->logical[mid] < lp) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->n_win && c->logical[lo] == lp ? (int64_t)lo : -1;
}

int64_t akv_dev_pool_ctx_find(const akv_dev_pool *pool, const akv_dev_pool_ctx *c, uint32_t layer,
                              uint32_t logical) {
    AKV_ASSERT(layer < pool->n_layers);
    int64_t w = dp_find_slot(c, logical);
    return w < 0 ? -1 : (int64_t)c->pages[(size_t)w * pool->n_layers + layer];
}

/* ---- the window arithmetic: ranks in the caller's order ---------------------------------- */

/* The rank of logical page lp in c's order; DP_UNWANTED when the order leaves it out. */
static uint32_t dp_rank(const akv_dev_pool_ctx *c, uint32_t lp) {
    return lp < c->cur->n_rank ? c->cur->rank[lp] : DP_UNWANTED;
}

/* Whether logical page lp is in a window of at most `size` pages: among the first `size` of
 * the order. */
static int dp_in_window(const akv_dev_pool_ctx *c, uint32_t lp, uint32_t size) {
    return dp_rank(c, lp) < size;
}

/* The most wanted logical page of the window of `size` that c does not hold; -1 when it holds
 * them all. */
static int64_t dp_next_missing(const akv_dev_pool_ctx *c, uint32_t size) {
    const dp_order *o = c->cur;
    uint32_t s = size < o->n_order ? size : o->n_order;
    for (uint32_t k = 0; k < s; k++)
        if (dp_find_slot(c, o->order[k]) < 0) return o->order[k];
    return -1;
}

/* Re-keys window page w of c to logical page lp, keeping the order (its pages stay). */
static void dp_slot_rekey(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t w, uint32_t lp) {
    uint32_t L = pool->n_layers;
    uint32_t *pg = &c->pages[(size_t)w * L];
    /* bubble the slot to its new place; windows are short, so a linear walk is fine */
    while (w + 1 < c->n_win && c->logical[w + 1] < lp) {
        c->logical[w] = c->logical[w + 1];
        c->fresh[w] = c->fresh[w + 1];
        for (uint32_t l = 0; l < L; l++) {
            uint32_t t = pg[l];
            pg[l] = pg[L + l];
            pg[L + l] = t;
        }
        w++, pg += L;
    }
    while (w > 0 && c->logical[w - 1] > lp) {
        c->logical[w] = c->logical[w - 1];
        c->fresh[w] = c->fresh[w - 1];
        uint32_t *prev = pg - L;
        for (uint32_t l = 0; l < L; l++) {
            uint32_t t = pg[l];
            pg[l] = prev[l];
            prev[l] = t;
        }
        w--, pg = prev;
    }
    c->logical[w] = lp;
    c->fresh[w] = 1;
}

/* Takes n_layers free pages into a new window page of c for logical page lp. */
static void dp_slot_take(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t lp) {
    AKV_ASSERT(pool->window_used < pool->window_cap && c->n_win < c->cap);
    uint32_t L = pool->n_layers, w = c->n_win;
    while (w > 0 && c->logical[w - 1] > lp) w--;
    uint32_t tail = c->n_win - w;
    memmove(&c->logical[w + 1], &c->logical[w], tail * sizeof *c->logical);
    memmove(&c->fresh[w + 1], &c->fresh[w], tail);
    memmove(&c->pages[(size_t)(w + 1) * L], &c->pages[(size_t)w * L], (size_t)tail * L * sizeof *c->pages);
    for (uint32_t l = 0; l < L; l++) c->pages[(size_t)w * L + l] = dp_take_page(pool, c->idx);
    c->logical[w] = lp;
    c->fresh[w] = 1;
    c->n_win++;
    pool->window_used++;
}

static uint32_t dp_above_target(const akv_dev_pool_ctx *c) {
    uint32_t by_right = c->n_win - c->n_borrowed;
    return by_right > c->target ? by_right - c->target : 0;
}

/* Window pages of o that a step may reclaim: an active context gives only borrowed pages and
 * pages above target; an idle one gives its whole window. */
static uint32_t dp_reclaimable(const akv_dev_pool_ctx *o) {
    return o->in_batch ? o->n_borrowed + dp_above_target(o) : o->n_win;
}

/* The next victim for c: least recently active first within each class, classes in order.
 * Returns the class reason, or AKV_DEV_POOL_REASON_COUNT when there is none. */
static akv_dev_pool_reason dp_find_victim(const akv_dev_pool *pool, const akv_dev_pool_ctx *c,
                                          akv_dev_pool_ctx **victim) {
    static const akv_dev_pool_reason classes[] = {AKV_DEV_POOL_RECLAIM_BORROWED,
                                                  AKV_DEV_POOL_RECLAIM_ABOVE_TARGET,
                                                  AKV_DEV_POOL_RECLAIM_IDLE};
    for (size_t k = 0; k < AKV_ARRAY_LEN(classes); k++) {
        akv_dev_pool_ctx *best = NULL;
        for (size_t i = 0; i < pool->n_ctx; i++) {
            akv_dev_pool_ctx *o = pool->ctxs[i];
            int eligible = k == 0   ? o->n_borrowed > 0
                           : k == 1 ? dp_above_target(o) > 0
                                    : !o->in_batch && o->n_win > 0;
            if (o == c || !eligible) continue;
            if (!best || o->last_active < best->last_active) best = o; /* ties: lower index */
        }
        if (best) {
            *victim = best;
            return classes[k];
        }
    }
    return AKV_DEV_POOL_REASON_COUNT;
}

/* The window page of c it wants least (the highest rank) outside its floor: with `above` set,
 * only one it wants less than rank `above`. -1 when there is none. */
static int64_t dp_least_wanted(const akv_dev_pool_ctx *c, int64_t above) {
    int64_t best = -1;
    uint32_t best_rank = 0;
    for (uint32_t w = 0; w < c->n_win; w++) {
        uint32_t r = dp_rank(c, c->logical[w]);
        if (r < c->cur->n_floor || (above >= 0 && r <= (uint64_t)above)) continue;
        if (best < 0 || r > best_rank) best = w, best_rank = r;
    }
    return best;
}

/* Places logical page lp in c's window from the sources of `pass`, in order. */
static int dp_place(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t lp, enum dp_pass pass) {
    uint32_t full = c->target + c->burst;
    /* a. its own page outside its window (slid past, or beyond a truncated history) */
    for (uint32_t w = 0; w < c->n_win; w++) {
        if (dp_in_window(c, c->logical[w], full)) continue;
        dp_slot_rekey(pool, c, w, lp);
        dp_count(&pool->counts, AKV_DEV_POOL_REUSE_OWN, 1);
        dp_count(&c->st.as_requester, AKV_DEV_POOL_REUSE_OWN, 1);
        return 1;
    }
    /* b. a free page (borrowed when the context already holds its target) */
    int borrowing = c->n_win >= c->target;
    if (pool->window_used < pool->window_cap) {
        dp_slot_take(pool, c, lp);
        if (borrowing) c->n_borrowed++;
        dp_count(&pool->counts, AKV_DEV_POOL_FROM_FREE, 1);
        dp_count(&c->st.as_requester, AKV_DEV_POOL_FROM_FREE, 1);
        return 1;
    }
    if (pass == DP_PASS_BURST) return 0;
    /* c. reclamation, only below the target (a context at its target has no right to more;
     * for its floor it moves its own pages, d.) */
    akv_dev_pool_ctx *v = NULL;
    akv_dev_pool_reason r =
        c->n_win < c->target ? dp_find_victim(pool, c, &v) : AKV_DEV_POOL_REASON_COUNT;
    /* classes in order: borrowed, above target, whole idle contexts; least recently active */
    if (r != AKV_DEV_POOL_REASON_COUNT) {
        uint32_t n_lost = 1;
        if (r == AKV_DEV_POOL_RECLAIM_IDLE) {
            n_lost = v->n_win;
            while (v->n_win) dp_slot_free(pool, v, v->n_win - 1);
        } else {
            int64_t w = dp_least_wanted(v, -1);
            AKV_ASSERT(w >= 0); /* it holds more than its target >= its floor */
            dp_slot_free(pool, v, (uint32_t)w);
        }
        dp_slot_take(pool, c, lp); /* by right: c is below its target or its floor */
        dp_count(&pool->counts, r, n_lost);
        dp_count(&v->st.as_victim, r, n_lost);
        dp_count(&c->st.as_requester, r, 1);
        return 1;
    }
    /* d. the page it wants least gives way: for the floor any page outside the floor (a floor
     * page may be missing after an idle reclaim); above the floor, only a page it wants less
     * than lp (the window keeps what it wants most). */
    int64_t w = dp_least_wanted(c, pass == DP_PASS_FLOOR ? -1 : (int64_t)dp_rank(c, lp));
    if (w < 0) return 0;
    dp_slot_rekey(pool, c, (uint32_t)w, lp);
    dp_count(&pool->counts, AKV_DEV_POOL_SHRINK_OLDEST, 1);
    dp_count(&c->st.as_requester, AKV_DEV_POOL_SHRINK_OLDEST, 1);
    return 1;
}

/* The floor pass for c: all-or-nothing. Returns 0 (and records the wait) when refused. */
static int dp_floor(akv_dev_pool *pool, akv_dev_pool_ctx *c, uint32_t n_active) {
    uint32_t held = 0;
    const dp_order *o = c->cur;
    for (uint32_t k = 0; k < o->n_floor; k++) held += dp_find_slot(c, o->order[k]) >= 0;
    uint32_t needed = o->n_floor - held;
    if (needed == 0) return 1;
    uint64_t reclaimable = 0; /* reclaiming is a right only below the target (dp_place c.) */
    for (size_t i = 0; i < pool->n_ctx && c->n_win < c->target; i++)
        if (pool->ctxs[i] != c) reclaimable += dp_reclaimable(pool->ctxs[i]);
    uint32_t own_spare = c->n_win - held, free = pool->window_cap - pool->window_used;
    if ((uint64_t)own_spare + free + reclaimable < needed) {
        akv_dev_pool_wait wt = {.step = pool->step,
                                .reason = AKV_DEV_POOL_WAIT_FLOOR,
                                .needed = needed,
                                .own_spare = own_spare,
                                .free = free,
                                .reclaimable = (uint32_t)reclaimable,
                                .n_active = n_active};
        pool->last_wait = c->st.last_wait = wt;
        dp_count(&pool->counts, AKV_DEV_POOL_WAIT_FLOOR, needed);
        dp_count(&c->st.as_requester, AKV_DEV_POOL_WAIT_FLOOR, needed);
        return 0;
    }
    int64_t lp;
    while ((lp = dp_next_missing(c, o->n_floor)) >= 0) {
        int ok = dp_place(pool, c, (uint32_t)lp, DP_PASS_FLOOR);
        AKV_ASSERT(ok); /* the count above guarantees a source */
    }
    return 1;
}

/* ---- the step ---------------------------------------------------------------------------- */

/* Whether a request's order is one: 1 <= n_floor <= n_order <= n_lp, distinct logical pages
 * below n_lp (seen: the caller's scratch of n_lp bits, left clear). */
static bool dp_order_ok(const akv_dev_pool_req *q, uint32_t n_lp, uint64_t *seen) {
    bool ok = q->order && q->n_floor >= 1 && q->n_floor <= q->n_order && q->n_order <= n_lp;
    uint32_t k = 0;
    for (; ok && k < q->n_order; k++) {
        uint32_t lp = q->order[k];
        ok = lp < n_lp && !(seen[lp / 64] >> (lp % 64) & 1);
        if (ok) seen[lp / 64] |= 1ull << (lp % 64);
    }
    for (uint32_t j = 0; j < k; j++) seen[q->order[j] / 64] &= ~(1ull << (q->order[j] % 64));
    return ok;
}

/* The requests against the pool, and room for each order (all or nothing: nothing of the pool
 * changes when a request is refused here). */
static akv_status dp_validate(akv_dev_pool *pool, const akv_dev_pool_req *reqs, uint32_t n_req) {
    uint32_t i = 0, max_lp = 0;
    akv_status st = AKV_EINVAL;
    for (uint32_t k = 0; k < n_req; k++) {
        uint64_t n_lp = akv_geom_pages_for_tokens(&pool->geom, reqs[k].n_tokens);
        if (n_lp > max_lp && n_lp <= INT32_MAX) max_lp = (uint32_t)n_lp;
    }
    uint64_t *seen = akv__calloc(max_lp / 64 + 1, sizeof *seen);
    if (!seen) return AKV_ENOMEM;
    for (; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        uint64_t n_lp = akv_geom_pages_for_tokens(&pool->geom, reqs[i].n_tokens);
        if (!c || !dp_ctx_open(pool, c)) {
            AKV_LOG_E("device pool: step request %u names no open context", i);
            break;
        }
        if (c->in_batch) {
            AKV_LOG_E("device pool: step request %u repeats context %llu", i,
                      (unsigned long long)c->st.tag);
            break;
        }
        if (reqs[i].n_tokens == 0 || n_lp > INT32_MAX) {
            AKV_LOG_E("device pool: step request %u: %llu tokens (1 to %llu pages allowed)", i,
                      (unsigned long long)reqs[i].n_tokens, (unsigned long long)INT32_MAX);
            break;
        }
        if (!dp_order_ok(&reqs[i], (uint32_t)n_lp, seen)) {
            AKV_LOG_E("device pool: step request %u (context %llu): its order of %u logical "
                      "pages (floor %u) is not distinct pages of its %llu, with a floor of 1 "
                      "to all of them",
                      i, (unsigned long long)c->st.tag, reqs[i].n_order, reqs[i].n_floor,
                      (unsigned long long)n_lp);
            break;
        }
        dp_order *nx = &c->next;
        if ((st = akv__array_reserve((void **)&nx->order, &nx->cap_order, reqs[i].n_order,
                                     sizeof *nx->order)) ||
            (st = akv__array_reserve((void **)&nx->rank, &nx->cap_rank, n_lp, sizeof *nx->rank))) {
            break;
        }
        st = AKV_EINVAL;
        c->in_batch = 1; /* also what catches a repeat */
        c->step_lp = (uint32_t)n_lp;
    }
    akv__free(seen);
    if (i == n_req) return AKV_OK;
    for (uint32_t k = 0; k < i; k++) reqs[k].ctx->in_batch = 0;
    return st;
}

/* The request's order becomes c's next one, in force for the step (its ranks: what it wants,
 * and what it gives up first). */
static void dp_take_order(akv_dev_pool_ctx *c, const akv_dev_pool_req *q) {
    dp_order *o = &c->next;
    memcpy(o->order, q->order, (size_t)q->n_order * sizeof *o->order);
    o->n_order = q->n_order;
    o->n_floor = q->n_floor;
    o->n_rank = c->step_lp;
    for (uint32_t lp = 0; lp < o->n_rank; lp++) o->rank[lp] = DP_UNWANTED;
    for (uint32_t k = 0; k < o->n_order; k++) o->rank[o->order[k]] = k;
    c->cur = o;
}

/* The end of c's step: served, its next order is its order now; refused, it keeps the order
 * its window is a prefix of. */
static void dp_settle_order(akv_dev_pool_ctx *c) {
    if (!c->refused) {
        dp_order t = c->served;
        c->served = c->next;
        c->next = t;
    }
    c->cur = &c->served;
}

akv_status akv_dev_pool_step(akv_dev_pool *pool, const akv_dev_pool_req *reqs, uint32_t n_req,
                             akv_dev_pool_result *results) {
    if (!pool || (n_req && (!reqs || !results))) {
        AKV_LOG_E("device pool: step with a NULL %s", !pool ? "pool" : !reqs ? "request array" : "result array");
        return AKV_EINVAL;
    }
    akv_status st = dp_validate(pool, reqs, n_req);
    if (st != AKV_OK) return st;
    pool->step++;
    /* targets changed since the last step take effect now, at the boundary */
    for (size_t i = 0; i < pool->n_ctx; i++) {
        akv_dev_pool_ctx *c = pool->ctxs[i];
        c->target = c->next_target;
        c->burst = c->next_burst;
        uint32_t above = c->n_win > c->target ? c->n_win - c->target : 0;
        if (c->n_borrowed > above) c->n_borrowed = above;
    }
    for (uint32_t i = 0; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        c->last_active = pool->step;
        c->refused = 0;
        memset(c->fresh, 0, c->n_win);
        dp_take_order(c, &reqs[i]);
    }
    /* pass 1: every floor (refusals decided here), 2: targets, 3: bursts */
    int any_refused = 0;
    for (uint32_t i = 0; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        if (!dp_floor(pool, c, n_req)) {
            c->refused = any_refused = 1;
            c->cur = &c->served; /* its window stays what its last served order made it */
        }
    }
    for (uint32_t i = 0; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        if (c->refused) continue;
        int64_t lp;
        while ((lp = dp_next_missing(c, c->target)) >= 0)
            if (!dp_place(pool, c, (uint32_t)lp, DP_PASS_TARGET)) break;
        uint32_t want = c->target < c->cur->n_order ? c->target : c->cur->n_order;
        if (c->n_win < want) {
            dp_count(&pool->counts, AKV_DEV_POOL_SHORT_OF_TARGET, want - c->n_win);
            dp_count(&c->st.as_requester, AKV_DEV_POOL_SHORT_OF_TARGET, want - c->n_win);
        }
    }
    for (uint32_t i = 0; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        if (c->refused) continue;
        uint32_t full = c->target + c->burst;
        int64_t lp;
        /* borrowing starts where the target is reached (a context short of it found no free
         * page in the target pass) */
        const uint32_t n_order = c->cur->n_order;
        int at_target = c->n_win >= (c->target < n_order ? c->target : n_order);
        while (at_target && (lp = dp_next_missing(c, full)) >= 0) {
            if (dp_place(pool, c, (uint32_t)lp, DP_PASS_BURST)) continue;
            uint32_t want = full < n_order ? full : n_order;
            dp_count(&pool->counts, AKV_DEV_POOL_BURST_DENIED, want - c->n_win);
            dp_count(&c->st.as_requester, AKV_DEV_POOL_BURST_DENIED, want - c->n_win);
            break;
        }
        /* what is left outside the window goes back (a lowered target, a shorter history) */
        uint32_t n_released = 0;
        for (uint32_t w = c->n_win; w-- > 0;)
            if (!dp_in_window(c, c->logical[w], full)) dp_slot_free(pool, c, w), n_released++;
        if (n_released) {
            dp_count(&pool->counts, AKV_DEV_POOL_RELEASE_OUTSIDE, n_released);
            dp_count(&c->st.as_requester, AKV_DEV_POOL_RELEASE_OUTSIDE, n_released);
        }
        c->n_tokens = reqs[i].n_tokens;
        c->n_lp = c->step_lp;
    }
    for (uint32_t i = 0; i < n_req; i++) {
        akv_dev_pool_ctx *c = reqs[i].ctx;
        uint32_t n_fresh = 0;
        for (uint32_t w = 0; w < c->n_win; w++) n_fresh += c->fresh[w];
        results[i] = (akv_dev_pool_result){
            .status = c->refused ? AKV_EFULL : AKV_OK, .window = c->n_win, .n_fresh = n_fresh};
        c->in_batch = 0;
        dp_settle_order(c);
    }
    return any_refused ? AKV_EFULL : AKV_OK;
}

/* ---- staging ---------------------------------------------------------------------------- */

akv_status akv_dev_pool_staging_acquire(akv_dev_pool *pool, uint32_t n, uint32_t *page_ids) {
    if (!pool || (n && !page_ids)) return AKV_EINVAL;
    if (n > pool->staging_reserve - pool->staging_used) {
        akv_dev_pool_wait wt = {.step = pool->step,
                                .reason = AKV_DEV_POOL_WAIT_STAGING,
                                .needed = n,
                                .free = pool->staging_reserve - pool->staging_used};
        pool->last_wait = wt;
        dp_count(&pool->counts, AKV_DEV_POOL_WAIT_STAGING, n);
        return AKV_EFULL;
    }
    for (uint32_t i = 0; i < n; i++) page_ids[i] = dp_take_page(pool, DP_STAGING);
    pool->staging_used += n;
    return AKV_OK;
}

akv_status akv_dev_pool_staging_release(akv_dev_pool *pool, uint32_t n, const uint32_t *page_ids) {
    if (!pool || (n && !page_ids)) return AKV_EINVAL;
    /* validate first (a repeated id is caught by marking it), then free */
    uint32_t bad = n;
    for (uint32_t i = 0; i < n && bad == n; i++) {
        uint32_t id = page_ids[i];
        if (id >= pool->n_pages || pool->owner[id] != DP_STAGING) bad = i;
        else pool->owner[id] = DP_MARK;
    }
    for (uint32_t i = 0; i < (bad == n ? n : bad); i++) pool->owner[page_ids[i]] = DP_STAGING;
    if (bad != n) {
        AKV_LOG_E("device pool: staging release: page %u (entry %u) is not lent to staging or "
                  "is repeated",
                  page_ids[bad], bad);
        return AKV_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) dp_put_page(pool, page_ids[i]);
    pool->staging_used -= n;
    return AKV_OK;
}

/* ---- stats and explanations ------------------------------------------------------------- */

void akv_dev_pool_get_stats(const akv_dev_pool *pool, akv_dev_pool_stats *out) {
    *out = (akv_dev_pool_stats){.page_bytes = pool->page_bytes,
                                .n_pages = pool->n_pages,
                                .window_capacity = pool->window_cap,
                                .staging_reserve = pool->staging_reserve,
                                .window_used = pool->window_used,
                                .staging_used = pool->staging_used,
                                .n_free_pages = pool->n_free,
                                .n_contexts = (uint32_t)pool->n_ctx,
                                .n_steps = pool->step,
                                .counts = pool->counts,
                                .last_wait = pool->last_wait};
}

void akv_dev_pool_ctx_get_stats(const akv_dev_pool_ctx *c, akv_dev_pool_ctx_stats *out) {
    *out = c->st;
    out->target = c->target;
    out->burst = c->burst;
    out->window = c->n_win;
    out->borrowed = c->n_borrowed;
    out->n_tokens = c->n_tokens;
    out->last_active = c->last_active;
}

const char *akv_dev_pool_reason_str(akv_dev_pool_reason r) {
    switch (r) {
    case AKV_DEV_POOL_FROM_FREE: return "placed from a free page";
    case AKV_DEV_POOL_REUSE_OWN: return "placed on its own page outside its window";
    case AKV_DEV_POOL_RECLAIM_BORROWED: return "reclaimed borrowed page";
    case AKV_DEV_POOL_RECLAIM_ABOVE_TARGET: return "reclaimed page above target";
    case AKV_DEV_POOL_RECLAIM_IDLE: return "reclaimed whole idle context";
    case AKV_DEV_POOL_SHRINK_OLDEST: return "shrank from its oldest page";
    case AKV_DEV_POOL_RELEASE_OUTSIDE: return "released outside its window";
    case AKV_DEV_POOL_WAIT_FLOOR: return "refused: floor not available";
    case AKV_DEV_POOL_SHORT_OF_TARGET: return "short of target";
    case AKV_DEV_POOL_BURST_DENIED: return "burst denied: no free page";
    case AKV_DEV_POOL_WAIT_STAGING: return "refused: staging reserve used up";
    default: return "?";
    }
}

static void dp_explain_counts(char *buf, size_t cap, size_t *len, const char *title,
                              const akv_dev_pool_counts *c) {
    int any = 0;
    for (int r = 0; r < AKV_DEV_POOL_REASON_COUNT; r++) {
        if (!c->n_events[r]) continue;
        akv__mem_appendf(buf, cap, len, "%s  %s: %llu time(s), %llu page(s)\n", any ? "" : title,
                   akv_dev_pool_reason_str((akv_dev_pool_reason)r),
                   (unsigned long long)c->n_events[r], (unsigned long long)c->n_pages[r]);
        any = 1;
    }
}

static void dp_explain_wait(char *buf, size_t cap, size_t *len, const akv_dev_pool_wait *w) {
    if (!w->step && !w->needed) return;
    akv__mem_appendf(buf, cap, len,
               "last wait: step %llu, %s: needed %u page(s); own spare %u, free %u, "
               "reclaimable from others %u, %u context(s) active\n",
               (unsigned long long)w->step, akv_dev_pool_reason_str(w->reason), w->needed,
               w->own_spare, w->free, w->reclaimable, w->n_active);
}

size_t akv_dev_pool_explain(const akv_dev_pool *pool, const akv_dev_pool_ctx *c, char *buf,
                            size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    if (c) {
        akv__mem_appendf(buf, cap, &len,
                   "context %llu: window %u page(s)/layer (%u borrowed), target %u, burst %u, "
                   "%llu tokens, last active step %llu of %llu\n",
                   (unsigned long long)c->st.tag, c->n_win, c->n_borrowed, c->target, c->burst,
                   (unsigned long long)c->n_tokens, (unsigned long long)c->last_active,
                   (unsigned long long)pool->step);
        dp_explain_counts(buf, cap, &len, "as requester:\n", &c->st.as_requester);
        dp_explain_counts(buf, cap, &len, "as victim:\n", &c->st.as_victim);
        dp_explain_wait(buf, cap, &len, &c->st.last_wait);
    } else {
        akv__mem_appendf(buf, cap, &len,
                   "device pool: %u pages of %zu bytes; windows %u/%u page(s)/layer x %u layers, "
                   "staging %u/%u pages, %u free pages, %zu context(s), %llu step(s)\n",
                   pool->n_pages, pool->page_bytes, pool->window_used, pool->window_cap,
                   pool->n_layers, pool->staging_used, pool->staging_reserve, pool->n_free,
                   pool->n_ctx, (unsigned long long)pool->step);
        dp_explain_counts(buf, cap, &len, "counts:\n", &pool->counts);
        dp_explain_wait(buf, cap, &len, &pool->last_wait);
    }
    return len;
}

/* ---- the validity walker ------------------------------------------------------------------ */

akv_status akv__dev_pool_check(akv_dev_pool *pool) {
#define DP_BAD(...)                                                                                \
    do {                                                                                           \
        AKV_LOG_E("device pool check: " __VA_ARGS__);                                              \
        return AKV_ESTATE;                                                                         \
    } while (0)
    uint32_t L = pool->n_layers, n_free = 0, n_staging = 0;
    uint64_t n_window = 0;
    memset(pool->marks, 0, pool->n_words * sizeof *pool->marks);
    for (uint32_t id = 0; id < pool->n_pages; id++) {
        int is_free = (pool->free_bits[id / 64] >> (id % 64)) & 1;
        if (is_free != (pool->owner[id] == DP_FREE)) DP_BAD("page %u: free bit %d, owner %u", id, is_free, pool->owner[id]);
        if (is_free && id / 64 < pool->free_hint) DP_BAD("free page %u below the hint", id);
        n_free += is_free;
        n_staging += pool->owner[id] == DP_STAGING;
        if (!is_free && pool->owner[id] != DP_STAGING && pool->owner[id] >= pool->n_ctx)
            DP_BAD("page %u owned by context #%u of %zu", id, pool->owner[id], pool->n_ctx);
    }
    for (uint32_t id = pool->n_pages; id < pool->n_words * 64u; id++)
        if ((pool->free_bits[id / 64] >> (id % 64)) & 1) DP_BAD("bit %u past the last page", id);
    for (size_t i = 0; i < pool->n_ctx; i++) {
        const akv_dev_pool_ctx *c = pool->ctxs[i];
        if (c->idx != i) DP_BAD("context #%zu records index %u", i, c->idx);
        if (c->n_win > c->cap) DP_BAD("context %llu: window %u over capacity %u", (unsigned long long)c->st.tag, c->n_win, c->cap);
        uint32_t above = c->n_win > c->target ? c->n_win - c->target : 0;
        if (c->n_borrowed > above)
            DP_BAD("context %llu: %u borrowed of a window of %u, target %u",
                   (unsigned long long)c->st.tag, c->n_borrowed, c->n_win, c->target);
        if (c->in_batch) DP_BAD("context %llu still marked in a batch", (unsigned long long)c->st.tag);
        for (uint32_t w = 0; w < c->n_win; w++) {
            if (w && c->logical[w] <= c->logical[w - 1])
                DP_BAD("context %llu: window not strictly ascending at %u", (unsigned long long)c->st.tag, w);
            if (c->logical[w] >= c->n_lp)
                DP_BAD("context %llu: logical page %u beyond its %u pages", (unsigned long long)c->st.tag,
                       c->logical[w], c->n_lp);
            if (dp_rank(c, c->logical[w]) == DP_UNWANTED)
                DP_BAD("context %llu: logical page %u is held but not in its order",
                       (unsigned long long)c->st.tag, c->logical[w]);
            for (uint32_t l = 0; l < L; l++) {
                uint32_t id = c->pages[(size_t)w * L + l];
                if (id >= pool->n_pages || pool->owner[id] != i)
                    DP_BAD("context %llu: page %u of window page %u layer %u is not its own",
                           (unsigned long long)c->st.tag, id, w, l);
                if ((pool->marks[id / 64] >> (id % 64)) & 1) DP_BAD("page %u held twice", id);
                pool->marks[id / 64] |= 1ull << (id % 64);
            }
        }
        const dp_order *o = &c->served;
        if (c->cur != o) DP_BAD("context %llu: a step's order still in force", (unsigned long long)c->st.tag);
        for (uint32_t k = 0; c->n_win && k < o->n_floor; k++)
            if (dp_find_slot(c, o->order[k]) < 0)
                DP_BAD("context %llu: floor page %u (rank %u) not held in a window of %u",
                       (unsigned long long)c->st.tag, o->order[k], k, c->n_win);
        for (uint32_t k = 0; k < o->n_order; k++)
            if (o->order[k] >= o->n_rank || o->rank[o->order[k]] != k)
                DP_BAD("context %llu: order and ranks disagree at rank %u",
                       (unsigned long long)c->st.tag, k);
        n_window += c->n_win;
    }
    /* every owned page was reached from its context: owned = listed */
    if (n_free != pool->n_free || n_staging != pool->staging_used || n_window != pool->window_used ||
        (uint64_t)n_free + n_staging + n_window * L != pool->n_pages)
        DP_BAD("counts: free %u/%u, staging %u/%u, window %llu/%u x %u layers, pages %u",
               n_free, pool->n_free, n_staging, pool->staging_used, (unsigned long long)n_window,
               pool->window_used, L, pool->n_pages);
    if (pool->window_used > pool->window_cap || pool->staging_used > pool->staging_reserve ||
        (uint64_t)pool->window_cap * L + pool->staging_reserve != pool->n_pages)
        DP_BAD("window %u/%u, staging %u/%u", pool->window_used, pool->window_cap,
               pool->staging_used, pool->staging_reserve);
    return AKV_OK;
#undef DP_BAD
}
