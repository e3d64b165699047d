/* route.c — one sequence's history placed for the forward pass (akv/route.h): host table,
 * device-pool window, per-layer CSR tables, fills of fresh pages, write-back of new rows. */
#include "akv/route.h"

#include <string.h>

#include "akv/host_table.h"
#include "engine/route_check.h"
#include "core/alloc.h"
#include "core/log.h"

struct akv_route {
    akv_dev *dev;
    akv_host_pool *hp;
    akv_dev_pool *dp;
    akv_geom geom;
    akv_route_kind kind;
    uint64_t max_tokens;
    uint32_t max_pages;    /* logical pages per layer at max_tokens */
    akv_host_table *ht;    /* the authoritative copy */
    akv_dev_pool_ctx *ctx; /* the device window */
    uint64_t n_tokens;     /* history length (host table length) */
    uint64_t step_first;   /* first token of the step begun last (its rows are written back) */
    /* the CSR tables of the step begun last (host memory: the host backend's attention reads
     * device addresses as host addresses) */
    int32_t indptr[2];
    int32_t last_page_len;
    int32_t *indices; /* [n_layers][max_pages] device page ids, logical order */
    akv_route_stats stats;
    /* queued mode (route.h): the tables in pinned memory and their device copy, laid out as
     * [indptr 2][last_page_len 1][pad 1][indices n_layers*max_pages] int32 (indices above
     * points into tab_h) */
    bool queued;
    bool tab_dirty;     /* indices changed since the last upload */
    int32_t *tab_h;     /* pinned */
    akv_dptr tab_d;     /* device */
    akv_event **ev;     /* [n_layers]: the layer's attention enqueued (write-back waits on it) */
};

enum { ROUTE_TAB_HEAD = 4 }; /* int32s before the indices in tab_h/tab_d */

/* Queued mode: every copy and kernel enqueued so far is complete (compute first: the
 * write-backs wait on it). */
static akv_status route_wait(akv_route *r) {
    if (!r->queued) return AKV_OK;
    akv_status st = akv_dev_queue_sync(r->dev, AKV_QUEUE_COMPUTE);
    return st ? st : akv_dev_queue_sync(r->dev, AKV_QUEUE_D2H);
}

const char *akv_route_kind_name(akv_route_kind kind) {
    return kind == AKV_ROUTE_RESIDENT ? "resident" : kind == AKV_ROUTE_STAGED ? "staged" : "?";
}

static bool route_same_geom(const akv_geom *a, const akv_geom *b) {
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->page_tokens == b->page_tokens && a->dtype == b->dtype;
}

akv_status akv_route_create(akv_dev *dev, akv_host_pool *host_pool, akv_dev_pool *dev_pool,
                            const akv_route_params *p, akv_route **out) {
    if (!dev || !host_pool || !dev_pool || !p || !out) return AKV_EINVAL;
    if (p->kind == AKV_ROUTE_STAGED) {
        AKV_LOG_E("route: the staged route is not built yet (it needs the staging layer's "
                  "leases); use the resident route");
        return AKV_EUNSUPPORTED;
    }
    if (p->kind != AKV_ROUTE_RESIDENT) return AKV_EINVAL;
    akv_dev_info info;
    akv_status st = akv_dev_get_info(dev, &info);
    if (st) return st;
    if (!info.is_host && !p->queued) {
        AKV_LOG_E("route: device '%s': the direct mode (host tables, host forward pass) needs the "
                  "host backend; use the queued mode",
                  info.name);
        return AKV_EUNSUPPORTED;
    }
    const akv_geom *g = akv_dev_pool_geom(dev_pool);
    if (!route_same_geom(g, akv_host_pool_geom(host_pool))) {
        AKV_LOG_E("route: the host pool and the device pool have different geometries");
        return AKV_EINVAL;
    }
    uint64_t n_lp = akv_geom_pages_for_tokens(g, p->max_tokens);
    if (p->max_tokens == 0 || n_lp > INT32_MAX / g->n_layers) {
        AKV_LOG_E("route: max_tokens %llu is out of range", (unsigned long long)p->max_tokens);
        return AKV_EINVAL;
    }
    /* Resident: the whole history is the window, so the target is every page of it (and at
     * least the floor of two). */
    uint32_t target = n_lp < 2 ? 2 : (uint32_t)n_lp;
    akv_dev_pool_stats ps;
    akv_dev_pool_get_stats(dev_pool, &ps);
    if (target > ps.window_capacity) {
        double need_gib = (double)target * g->n_layers * ps.page_bytes / (1u << 30);
        AKV_LOG_E("route: a resident history of %llu tokens needs %u pages per layer x %u layers "
                  "(%.2f GiB of device pool); the pool holds %u pages per layer: raise "
                  "--device-gib or lower the context",
                  (unsigned long long)p->max_tokens, target, g->n_layers, need_gib,
                  ps.window_capacity);
        return AKV_EINVAL;
    }

    akv_route *r = akv__calloc(1, sizeof *r);
    if (!r) return AKV_ENOMEM;
    r->dev = dev, r->hp = host_pool, r->dp = dev_pool, r->geom = *g, r->kind = p->kind;
    r->max_tokens = p->max_tokens;
    r->max_pages = (uint32_t)n_lp;
    r->queued = p->queued;
    size_t n_idx = (size_t)n_lp * g->n_layers;
    if (r->queued) {
        size_t tab_bytes = (ROUTE_TAB_HEAD + n_idx) * sizeof(int32_t);
        r->ev = akv__calloc(g->n_layers, sizeof *r->ev);
        st = r->ev ? AKV_OK : AKV_ENOMEM;
        if (!st && (st = akv_dev_pinned_alloc(dev, tab_bytes, (void **)&r->tab_h)) == AKV_OK) {
            memset(r->tab_h, 0, tab_bytes);
            r->indices = r->tab_h + ROUTE_TAB_HEAD;
            st = akv_dev_mem_alloc(dev, tab_bytes, &r->tab_d);
        }
        for (uint32_t l = 0; l < g->n_layers && !st; l++)
            st = akv_dev_event_create(dev, 0, &r->ev[l]);
    } else {
        r->indices = akv__calloc(n_idx, sizeof *r->indices);
        st = r->indices ? AKV_OK : AKV_ENOMEM;
    }
    akv_dev_pool_ctx_params cp = {.target = target, .burst = 0, .tag = p->tag};
    if (!st && (st = akv_host_table_create(host_pool, &r->ht)) == AKV_OK)
        st = akv_dev_pool_ctx_open(dev_pool, &cp, &r->ctx);
    if (st) {
        akv_route_destroy(r);
        return st;
    }
    *out = r;
    return AKV_OK;
}

akv_status akv_route_destroy(akv_route *r) {
    if (!r) return AKV_OK;
    /* queued: no copy may still touch a page or a table that is about to be freed */
    akv_status st = route_wait(r);
    if (st) return st;
    if ((st = akv_host_table_destroy(r->ht))) return st;
    if (r->ctx) akv_dev_pool_ctx_close(r->dp, r->ctx);
    if (r->queued) {
        for (uint32_t l = 0; r->ev && l < r->geom.n_layers; l++)
            akv_dev_event_destroy(r->dev, r->ev[l]);
        akv__free(r->ev);
        akv_dev_mem_free(r->dev, r->tab_d);
        if (r->tab_h) akv_dev_pinned_free(r->dev, r->tab_h);
    } else {
        akv__free(r->indices);
    }
    akv__free(r);
    return AKV_OK;
}

/* Copies a fresh device page's earlier tokens from the host copy (the whole page: its unused
 * slots are overwritten before anything reads them). */
static akv_status route_fill(akv_route *r, uint32_t layer, uint32_t logical, uint32_t page_id) {
    akv_host_page hpg = akv_host_table_page(r->ht, layer, logical);
    const void *src = akv_host_pool_page_addr(r->hp, hpg);
    size_t n = akv_geom_page_bytes(&r->geom);
    akv_dptr dst = akv_dev_pool_page_addr(r->dp, page_id);
    /* queued: on the compute queue, so the layer's kernels see it (the host page is pinned and
     * holds earlier tokens only: nothing rewrites it while the copy is pending) */
    akv_status st = r->queued ? akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, dst, src, n)
                              : akv_dev_copy_h2d_sync(r->dev, dst, src, n);
    if (st == AKV_OK) r->stats.h2d_bytes += n;
    return st;
}

akv_status akv_route_begin_step(akv_route *r, uint64_t n_total) {
    if (!r) return AKV_EINVAL;
    uint64_t n_old = r->n_tokens;
    if (n_total <= n_old || n_total > r->max_tokens) {
        AKV_LOG_E("route: a step to %llu tokens from %llu (the limit is %llu)",
                  (unsigned long long)n_total, (unsigned long long)n_old,
                  (unsigned long long)r->max_tokens);
        return AKV_EINVAL;
    }
    /* 0. queued: the previous step's kernels and write-backs are done, so the host copy is
     * complete and the tables may be rewritten */
    akv_status st = route_wait(r);
    if (st) return st;
    /* 1. the host copy grows first: it is where the rows land for good */
    st = akv_host_table_grow(r->ht, n_total);
    if (st == AKV_EFULL) AKV_LOG_E("route: the host pool is full: raise --host-gib");
    if (st) return st;
    /* 2. the device window: every page of the history */
    akv_dev_pool_req req = {.ctx = r->ctx, .n_tokens = n_total};
    akv_dev_pool_result res;
    st = akv_dev_pool_step(r->dp, &req, 1, &res);
    uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(&r->geom, n_total);
    if (st == AKV_OK && res.window != n_lp) st = AKV_EFULL;
    if (st) {
        if (st == AKV_EFULL)
            AKV_LOG_E("route: the device pool holds %u of the %u pages per layer a resident "
                      "history of %llu tokens needs: raise --device-gib",
                      res.window, n_lp, (unsigned long long)n_total);
        akv_host_table_truncate(r->ht, n_old);
        return st;
    }
    /* 3. per layer: fill fresh pages that hold earlier tokens, and the CSR table */
    uint32_t P = r->geom.page_tokens;
    for (uint32_t l = 0; l < r->geom.n_layers; l++) {
        for (uint32_t w = 0; w < n_lp; w++) {
            akv_dev_pool_slot s = akv_dev_pool_ctx_slot(r->dp, r->ctx, l, w);
            AKV_ASSERT(s.logical == w); /* resident: the window is the whole history */
            if (s.fresh && (uint64_t)w * P < n_old && (st = route_fill(r, l, w, s.page_id))) {
                akv_host_table_truncate(r->ht, n_old);
                return st;
            }
            int32_t *slot = &r->indices[(size_t)l * r->max_pages + w];
            if (*slot != (int32_t)s.page_id || s.fresh) r->tab_dirty = true;
            *slot = (int32_t)s.page_id;
        }
    }
    r->indptr[0] = 0, r->indptr[1] = (int32_t)n_lp;
    r->last_page_len = (int32_t)(n_total - (uint64_t)(n_lp - 1) * P);
    if (r->queued) {
        /* 4. the tables to the device, in compute-queue order (the header every step, the
         * indices when a page changed) */
        r->tab_h[0] = r->indptr[0], r->tab_h[1] = r->indptr[1], r->tab_h[2] = r->last_page_len;
        size_t n_int = ROUTE_TAB_HEAD + (r->tab_dirty ? (size_t)r->geom.n_layers * r->max_pages : 0);
        st = akv_dev_copy_h2d_async(r->dev, AKV_QUEUE_COMPUTE, r->tab_d, r->tab_h,
                                    n_int * sizeof(int32_t));
        if (st) {
            akv_host_table_truncate(r->ht, n_old);
            return st;
        }
        r->tab_dirty = false;
    }
    r->step_first = n_old;
    r->n_tokens = n_total;
    r->stats.n_steps++;
    return AKV_OK;
}

static akv_status route_begin_layer(void *user, uint32_t layer, akv_attn_pages *pg) {
    akv_route *r = user;
    /* queued: the device copy of the tables (tab_d, laid out as tab_h); direct: host arrays */
    size_t idx = ((size_t)ROUTE_TAB_HEAD + (size_t)layer * r->max_pages) * sizeof(int32_t);
    akv_dptr indptr = r->queued ? r->tab_d : akv_attn_host_ptr(r->indptr);
    akv_dptr indices = r->queued ? akv_dptr_offset(r->tab_d, idx)
                                 : akv_attn_host_ptr(r->indices + (size_t)layer * r->max_pages);
    akv_dptr last = r->queued ? akv_dptr_offset(r->tab_d, 2 * sizeof(int32_t))
                              : akv_attn_host_ptr(&r->last_page_len);
    *pg = (akv_attn_pages){.pool = akv_dev_pool_base(r->dp),
                           .indptr = indptr,
                           .indices = indices,
                           .last_page_len = last,
                           .n_seq = 1,
                           .n_pages = akv_dev_pool_n_pages(r->dp),
                           .max_pages = r->max_pages,
                           .n_kv_heads = r->geom.n_kv_heads,
                           .head_dim = r->geom.head_dim,
                           .page_tokens = r->geom.page_tokens,
                           .dtype = r->geom.dtype};
    return AKV_OK;
}

/* Writes the step's new rows of `layer` back to the host copy: per page touched and per
 * (K|V, head), one contiguous run of tokens. */
static akv_status route_end_layer(void *user, uint32_t layer) {
    akv_route *r = user;
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype);
    if (r->queued) {
        /* the D2H queue starts after the layer's attention (enqueued on compute) completes */
        akv_status st = akv_dev_event_record(r->dev, r->ev[layer], AKV_QUEUE_COMPUTE);
        if (st || (st = akv_dev_queue_wait_event(r->dev, AKV_QUEUE_D2H, r->ev[layer]))) return st;
    }
    for (uint64_t p = r->step_first / P; p * P < r->n_tokens; p++) {
        uint64_t t0 = (r->step_first > p * P ? r->step_first : p * P) - p * P;
        uint64_t t1 = (r->n_tokens < (p + 1) * P ? r->n_tokens : (p + 1) * P) - p * P;
        uint32_t page_id = (uint32_t)r->indices[(size_t)layer * r->max_pages + p];
        akv_dptr dpage = akv_dev_pool_page_addr(r->dp, page_id);
        uint8_t *hpage =
            akv_host_pool_page_addr(r->hp, akv_host_table_page(r->ht, layer, (uint32_t)p));
        if (r->queued) {
            /* one 2D copy per page: 2*n_kv_heads runs of (t1 - t0) rows at a pitch of P rows */
            size_t off = (size_t)t0 * row, pitch = (size_t)P * row, w = (size_t)(t1 - t0) * row;
            akv_status st = akv_dev_copy_d2h_2d_async(r->dev, AKV_QUEUE_D2H, hpage + off, pitch,
                                                      akv_dptr_offset(dpage, off), pitch, w,
                                                      2 * (size_t)g->n_kv_heads);
            if (st) return st;
            r->stats.d2h_bytes += w * 2 * g->n_kv_heads;
            continue;
        }
        for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
            size_t off = ((size_t)kvh * P + t0) * row, n = (size_t)(t1 - t0) * row;
            akv_status st =
                akv_dev_copy_d2h_sync(r->dev, hpage + off, akv_dptr_offset(dpage, off), n);
            if (st) return st;
            r->stats.d2h_bytes += n;
        }
    }
    return AKV_OK;
}

akv_forward_kv akv_route_forward_kv(akv_route *r) {
    return (akv_forward_kv){
        .user = r, .begin_layer = route_begin_layer, .end_layer = route_end_layer};
}

akv_status akv_route_sync(akv_route *r) {
    return r ? route_wait(r) : AKV_EINVAL;
}

akv_status akv_route_truncate(akv_route *r, uint64_t n_tokens) {
    if (!r || n_tokens > r->n_tokens) return AKV_EINVAL;
    /* queued: a failed step may have write-backs in flight into pages truncation frees */
    akv_status st = route_wait(r);
    if (st) return st;
    st = akv_host_table_truncate(r->ht, n_tokens);
    if (st == AKV_OK) r->n_tokens = n_tokens;
    return st;
}

void akv_route_get_stats(const akv_route *r, akv_route_stats *out) {
    *out = r->stats;
    out->n_tokens = r->n_tokens;
    out->window_pages = akv_dev_pool_ctx_window(r->ctx);
    out->host_pages = akv_host_table_n_pages(r->ht);
}

akv_status akv__route_check(const akv_route *r) {
    const akv_geom *g = &r->geom;
    uint32_t P = g->page_tokens;
    uint32_t n_lp = (uint32_t)akv_geom_pages_for_tokens(g, r->n_tokens);
    size_t row = (size_t)g->head_dim * akv_dtype_size(g->dtype);
    if (akv_host_table_n_pages(r->ht) != n_lp || akv_host_table_n_tokens(r->ht) != r->n_tokens) {
        AKV_LOG_E("route check: the host copy has %u pages for %llu tokens; expected %u",
                  akv_host_table_n_pages(r->ht), (unsigned long long)r->n_tokens, n_lp);
        return AKV_ESTATE;
    }
    for (uint32_t l = 0; l < g->n_layers; l++) {
        for (uint32_t p = 0; p < n_lp; p++) {
            /* a page another context reclaimed is not resident: the host copy holds it */
            int64_t id = akv_dev_pool_ctx_find(r->dp, r->ctx, l, p);
            if (id < 0) continue;
            const uint8_t *h = akv_host_pool_page_addr(r->hp, akv_host_table_page(r->ht, l, p));
            /* host backend: the device address is a host address */
            const uint8_t *d =
                (const uint8_t *)(uintptr_t)akv_dev_pool_page_addr(r->dp, (uint32_t)id).addr;
            uint64_t used = r->n_tokens - (uint64_t)p * P < P ? r->n_tokens - (uint64_t)p * P : P;
            for (uint32_t kvh = 0; kvh < 2 * g->n_kv_heads; kvh++) {
                size_t off = (size_t)kvh * P * row;
                if (memcmp(h + off, d + off, (size_t)used * row)) {
                    AKV_LOG_E("route check: layer %u page %u %s head %u: the device copy differs "
                              "from the host copy",
                              l, p, kvh < g->n_kv_heads ? "K" : "V", kvh % g->n_kv_heads);
                    return AKV_ESTATE;
                }
            }
        }
    }
    return AKV_OK;
}
