/* host_table.c — per-context, per-layer host page lists, shared prefixes and their CSR export. */
#include "akv/host_table.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "mem/mem_check.h"

struct akv_host_table {
    akv_host_pool *pool;
    uint32_t n_layers, page_tokens;
    uint64_t n_tokens;
    uint32_t n_pages;     /* per layer */
    size_t cap;           /* page slots per layer in `pages` */
    akv_host_page *pages; /* [n_layers][cap]: layer l's page k at pages[l * cap + k] */
};

akv_status akv_host_table_create(akv_host_pool *pool, akv_host_table **out) {
    if (!pool || !out) {
        AKV_LOG_E("host table: create with a NULL %s", pool ? "output" : "pool");
        return AKV_EINVAL;
    }
    akv_host_table *t = akv__calloc(1, sizeof *t);
    if (!t) return AKV_ENOMEM;
    const akv_geom *g = akv_host_pool_geom(pool);
    t->pool = pool;
    t->n_layers = g->n_layers;
    t->page_tokens = g->page_tokens;
    *out = t;
    return AKV_OK;
}

/* Frees pages [from, n_pages) of every layer (all unleased: the caller checked). */
static void ht_free_tail(akv_host_table *t, uint32_t from) {
    for (uint32_t l = 0; l < t->n_layers; l++)
        for (uint32_t k = from; k < t->n_pages; k++) {
            akv_status st = akv_host_pool_page_free(t->pool, t->pages[l * t->cap + k]);
            AKV_ASSERT(st == AKV_OK); /* a table's pages are live and, here, unleased */
        }
    t->n_pages = from;
}

/* Whether any page [from, n_pages) of any layer that this table alone holds is leased (its free
 * would be refused; a shared page's free only drops this table's ownership). */
static int ht_any_leased(const akv_host_table *t, uint32_t from) {
    /* The cheap global test first: no lease anywhere means none here. */
    akv_host_pool_stats st;
    akv_host_pool_get_stats(t->pool, &st);
    if (st.n_leases == 0) return 0;
    for (uint32_t l = 0; l < t->n_layers; l++)
        for (uint32_t k = from; k < t->n_pages; k++)
            if (akv_host_pool_page_n_leases(t->pool, t->pages[l * t->cap + k]) &&
                akv_host_pool_page_n_owners(t->pool, t->pages[l * t->cap + k]) == 1)
                return 1;
    return 0;
}

akv_status akv_host_table_destroy(akv_host_table *t) {
    if (!t) return AKV_OK;
    if (ht_any_leased(t, 0)) {
        AKV_LOG_E("host table: destroy refused: a page is still leased by a copy");
        return AKV_EBUSY;
    }
    ht_free_tail(t, 0);
    akv__free(t->pages);
    akv__free(t);
    return AKV_OK;
}

void akv_host_table_destroy_deferred(akv_host_table *t) {
    if (!t) return;
    for (uint32_t l = 0; l < t->n_layers; l++)
        for (uint32_t k = 0; k < t->n_pages; k++) {
            akv_status st = akv_host_pool_page_free_deferred(t->pool, t->pages[l * t->cap + k]);
            AKV_ASSERT(st == AKV_OK);
        }
    akv__free(t->pages);
    akv__free(t);
}

/* Grows the per-layer capacity to at least `need` pages (moves rows to the new stride). */
static akv_status ht_reserve(akv_host_table *t, uint32_t need) {
    if (need <= t->cap) return AKV_OK;
    size_t cap = t->cap ? t->cap : 4, n;
    while (cap < need) cap *= 2; /* need <= INT32_MAX, so no overflow */
    if (!akv__size_mul(cap, t->n_layers, &n)) return AKV_EOVERFLOW;
    akv_host_page *p = akv__calloc(n, sizeof *p);
    if (!p) return AKV_ENOMEM;
    for (uint32_t l = 0; l < t->n_layers; l++)
        for (uint32_t k = 0; k < t->n_pages; k++) p[l * cap + k] = t->pages[l * t->cap + k];
    akv__free(t->pages);
    t->pages = p;
    t->cap = cap;
    return AKV_OK;
}

akv_status akv_host_table_grow(akv_host_table *t, uint64_t n_tokens) {
    if (!t) return AKV_EINVAL;
    if (n_tokens < t->n_tokens) {
        AKV_LOG_E("host table: grow to %llu tokens is below the current %llu",
                  (unsigned long long)n_tokens, (unsigned long long)t->n_tokens);
        return AKV_EINVAL;
    }
    uint64_t n_pages = n_tokens / t->page_tokens + (n_tokens % t->page_tokens != 0);
    if (n_pages > INT32_MAX) {
        AKV_LOG_E("host table: %llu tokens need %llu pages per layer, more than int32 indexes",
                  (unsigned long long)n_tokens, (unsigned long long)n_pages);
        return AKV_EINVAL;
    }
    akv_status st = ht_reserve(t, (uint32_t)n_pages);
    if (st != AKV_OK) return st;
    uint32_t old = t->n_pages;
    /* Allocate layer by layer; on failure free exactly what this call took. */
    for (uint32_t l = 0; l < t->n_layers; l++) {
        for (uint32_t k = old; k < n_pages; k++) {
            st = akv_host_pool_page_alloc(t->pool, &t->pages[l * t->cap + k]);
            if (st == AKV_OK) continue;
            for (uint32_t l2 = 0; l2 <= l; l2++) {
                uint32_t end = l2 < l ? (uint32_t)n_pages : k;
                for (uint32_t k2 = old; k2 < end; k2++) {
                    akv_status fst = akv_host_pool_page_free(t->pool, t->pages[l2 * t->cap + k2]);
                    AKV_ASSERT(fst == AKV_OK); /* just allocated, never leased */
                }
            }
            return st;
        }
    }
    t->n_pages = (uint32_t)n_pages;
    t->n_tokens = n_tokens;
    return AKV_OK;
}

akv_status akv_host_table_share(akv_host_table *dst, const akv_host_table *src, uint32_t n_pages) {
    if (!dst || !src) return AKV_EINVAL;
    if (dst->pool != src->pool || dst->n_tokens) {
        AKV_LOG_E("host table: share into a table %s", dst->n_tokens ? "that is not empty" : "of another pool");
        return AKV_EINVAL;
    }
    if (n_pages > src->n_tokens / src->page_tokens) {
        AKV_LOG_E("host table: share of %u pages: the source holds %llu full pages", n_pages,
                  (unsigned long long)(src->n_tokens / src->page_tokens));
        return AKV_EINVAL;
    }
    akv_status st = ht_reserve(dst, n_pages);
    for (uint32_t l = 0; !st && l < dst->n_layers; l++)
        for (uint32_t k = 0; k < n_pages; k++) {
            const akv_host_page h = src->pages[l * src->cap + k];
            if ((st = akv_host_pool_page_share(dst->pool, h))) { /* give back what was taken */
                for (uint32_t l2 = 0; l2 <= l; l2++)
                    for (uint32_t k2 = 0; k2 < (l2 < l ? n_pages : k); k2++)
                        (void)akv_host_pool_page_free(dst->pool, dst->pages[l2 * dst->cap + k2]);
                break;
            }
            dst->pages[l * dst->cap + k] = h;
        }
    if (st) return st;
    dst->n_pages = n_pages;
    dst->n_tokens = (uint64_t)n_pages * dst->page_tokens;
    return AKV_OK;
}

akv_status akv_host_table_truncate(akv_host_table *t, uint64_t n_tokens) {
    if (!t) return AKV_EINVAL;
    if (n_tokens > t->n_tokens) {
        AKV_LOG_E("host table: truncate to %llu tokens is above the current %llu",
                  (unsigned long long)n_tokens, (unsigned long long)t->n_tokens);
        return AKV_EINVAL;
    }
    uint32_t keep = (uint32_t)(n_tokens / t->page_tokens + (n_tokens % t->page_tokens != 0));
    if (ht_any_leased(t, keep)) {
        AKV_LOG_E("host table: truncate to %llu tokens refused: a page it frees is still leased by a copy",
                  (unsigned long long)n_tokens);
        return AKV_EBUSY;
    }
    /* A shared page would become this table's partial last page, written from its end on: the
     * table takes a private copy of it instead (all layers' copies allocated first, so a full
     * pool changes nothing). Shared pages stay full and unwritten. */
    akv_host_page *own = NULL;
    if (n_tokens % t->page_tokens) { /* a partial last page: keep >= 1 */
        for (uint32_t l = 0; l < t->n_layers; l++) {
            const akv_host_page h = t->pages[l * t->cap + keep - 1];
            if (akv_host_pool_page_n_owners(t->pool, h) < 2) continue;
            if (!own && !(own = akv__calloc(t->n_layers, sizeof *own))) return AKV_ENOMEM;
            akv_status st = akv_host_pool_page_alloc(t->pool, &own[l]);
            if (st) {
                for (uint32_t l2 = 0; l2 < l; l2++)
                    if (own[l2].gen) (void)akv_host_pool_page_free(t->pool, own[l2]);
                akv__free(own);
                return st;
            }
        }
    }
    for (uint32_t l = 0; own && l < t->n_layers; l++) {
        if (!own[l].gen) continue;
        akv_host_page *h = &t->pages[l * t->cap + keep - 1];
        memcpy(akv_host_pool_page_addr(t->pool, own[l]), akv_host_pool_page_addr(t->pool, *h),
               akv_host_pool_page_bytes(t->pool));
        akv_status st = akv_host_pool_page_free(t->pool, *h); /* one owner fewer: never refused */
        AKV_ASSERT(st == AKV_OK);
        *h = own[l];
    }
    akv__free(own);
    ht_free_tail(t, keep);
    t->n_tokens = n_tokens;
    return AKV_OK;
}

uint64_t akv_host_table_n_tokens(const akv_host_table *t) {
    return t->n_tokens;
}

uint32_t akv_host_table_n_pages(const akv_host_table *t) {
    return t->n_pages;
}

akv_host_page akv_host_table_page(const akv_host_table *t, uint32_t layer, uint32_t page_idx) {
    AKV_ASSERT(layer < t->n_layers && page_idx < t->n_pages);
    return t->pages[layer * t->cap + page_idx];
}

akv_status akv_host_table_export_csr(const akv_host_table *const *tables, uint32_t n_seq,
                                     uint32_t layer, int32_t *indptr, int32_t *indices,
                                     size_t indices_cap, int32_t *last_page_len) {
    if ((!tables && n_seq) || !indptr || (n_seq && !last_page_len)) {
        AKV_LOG_E("host table: CSR export with a NULL %s", !indptr ? "indptr" : !tables ? "table array" : "last_page_len");
        return AKV_EINVAL;
    }
    size_t nnz = 0;
    for (uint32_t s = 0; s < n_seq; s++) {
        if (!tables[s]) {
            AKV_LOG_E("host table: CSR export: table %u is NULL", s);
            return AKV_EINVAL;
        }
        if (layer >= tables[s]->n_layers) {
            AKV_LOG_E("host table: CSR export: layer %u of %u", layer, tables[s]->n_layers);
            return AKV_EINVAL;
        }
        nnz += tables[s]->n_pages;
    }
    if (nnz > INT32_MAX || nnz > indices_cap || (nnz && !indices)) {
        AKV_LOG_E("host table: CSR export needs %zu indices, the array holds %zu", nnz,
                  indices_cap);
        return AKV_EINVAL;
    }
    size_t at = 0;
    indptr[0] = 0;
    for (uint32_t s = 0; s < n_seq; s++) {
        const akv_host_table *t = tables[s];
        for (uint32_t k = 0; k < t->n_pages; k++)
            indices[at++] = (int32_t)t->pages[layer * t->cap + k].id;
        indptr[s + 1] = (int32_t)at;
        uint32_t rem = (uint32_t)(t->n_tokens % t->page_tokens);
        last_page_len[s] = t->n_pages == 0 ? 0 : (int32_t)(rem ? rem : t->page_tokens);
    }
    return AKV_OK;
}

akv_status akv_host_tables_sole_pages(const akv_host_table *const *tables, uint32_t n,
                                      uint64_t *out) {
    if (!out || (n && !tables)) {
        AKV_LOG_E("host table: sole pages with a NULL %s", !out ? "output" : "table array");
        return AKV_EINVAL;
    }
    *out = 0;
    /* A page with one owner is the table's alone; a shared one is theirs alone when they are
     * all its owners: each sighting here takes one owner off its count, and it is theirs when
     * the count reaches 0. Only shared pages need the count (an open-addressed map of ids). */
    uint64_t sole = 0, n_shared = 0;
    for (uint32_t s = 0; s < n; s++) {
        const akv_host_table *t = tables[s];
        if (!t || t->pool != tables[0]->pool) {
            AKV_LOG_E("host table: sole pages: table %u is %s", s, t ? "of another pool" : "NULL");
            return AKV_EINVAL;
        }
        for (uint32_t l = 0; l < t->n_layers; l++)
            for (uint32_t k = 0; k < t->n_pages; k++) {
                if (akv_host_pool_page_n_owners(t->pool, t->pages[l * t->cap + k]) > 1) n_shared++;
                else sole++;
            }
    }
    if (n_shared) {
        size_t cap = 16;
        while (cap < 2 * n_shared) cap *= 2;
        uint32_t *ids = akv__malloc(cap * sizeof *ids), *left = akv__malloc(cap * sizeof *left);
        if (!ids || !left) {
            akv__free(ids), akv__free(left);
            return AKV_ENOMEM;
        }
        memset(ids, 0xff, cap * sizeof *ids); /* UINT32_MAX: an empty slot (no such page id) */
        for (uint32_t s = 0; s < n; s++) {
            const akv_host_table *t = tables[s];
            for (uint32_t l = 0; l < t->n_layers; l++)
                for (uint32_t k = 0; k < t->n_pages; k++) {
                    const akv_host_page h = t->pages[l * t->cap + k];
                    const uint32_t owners = akv_host_pool_page_n_owners(t->pool, h);
                    if (owners <= 1) continue;
                    size_t i = (size_t)(h.id * 0x9e3779b1u) & (cap - 1);
                    while (ids[i] != UINT32_MAX && ids[i] != h.id) i = (i + 1) & (cap - 1);
                    if (ids[i] == UINT32_MAX) ids[i] = h.id, left[i] = owners;
                    if (--left[i] == 0) sole++;
                }
        }
        akv__free(ids), akv__free(left);
    }
    *out = sole;
    return AKV_OK;
}

akv_status akv__host_table_check(const akv_host_table *t) {
    uint64_t want = t->n_tokens / t->page_tokens + (t->n_tokens % t->page_tokens != 0);
    if (want != t->n_pages || t->n_pages > t->cap) {
        AKV_LOG_E("host table check: %llu tokens but %u pages (capacity %zu)",
                  (unsigned long long)t->n_tokens, t->n_pages, t->cap);
        return AKV_ESTATE;
    }
    const uint64_t n_full = t->n_tokens / t->page_tokens;
    for (uint32_t l = 0; l < t->n_layers; l++)
        for (uint32_t k = 0; k < t->n_pages; k++) {
            akv_host_page h = t->pages[l * t->cap + k];
            if (!akv_host_pool_page_is_live(t->pool, h)) {
                AKV_LOG_E("host table check: layer %u page %u (id %u gen %u) is not live", l, k,
                          h.id, h.gen);
                return AKV_ESTATE;
            }
            if (k >= n_full && akv_host_pool_page_n_owners(t->pool, h) > 1) {
                AKV_LOG_E("host table check: layer %u page %u (id %u) is shared and is not full: "
                          "its next token would write a page another table reads", l, k, h.id);
                return AKV_ESTATE;
            }
            /* duplicates: pages of one table are distinct ids (quadratic only in tests) */
            for (uint32_t l2 = l; l2 < t->n_layers; l2++)
                for (uint32_t k2 = l2 == l ? k + 1 : 0; k2 < t->n_pages; k2++)
                    if (t->pages[l2 * t->cap + k2].id == h.id) {
                        AKV_LOG_E("host table check: page id %u held twice", h.id);
                        return AKV_ESTATE;
                    }
        }
    return AKV_OK;
}
