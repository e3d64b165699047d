/* route_host.c — the host-attended kind of akv/route.h: the staged kind, except that in a step
 * where every sequence decodes one token, the oldest host_share of each sequence's pages
 * outside its window are attended by the host's cores where they lie in the host pool
 * (akv/attn_host.h) instead of crossing the bus; the rest are staged as the staged kind stages
 * them. The two rates add up: the bus copies one share while the cores read the other.
 *
 * A layer's host part, queued (the engine's thread never waits for it), all on the compute
 * queue, after the pass's begin_layer (called once the layer's query rows are computed, after
 * RoPE) and before the layer's attention:
 *   the step's query rows to hq[layer] (pinned), by the SMs (AKV_COPY_METHOD_KERNEL) where the
 *   backend can;
 *   a host function (akv_dev_host_fn_async) runs every sequence's host pages' chunks over the
 *   route's threads into hst[layer] (pinned); the queue waits for it;
 *   the pass attends its parts and merges the host's states exactly, read in place across the
 *   bus (hst_d: hst's mapped address).
 * No copy engine takes part: a copy engine's copy, and a host function on another queue,
 * waited behind the bus's refills of the next layers (measured, docs/benchmarks.md).
 * Per layer buffers: a layer's function reads and writes only its own, and the next step's
 * same layer begins after this step's queues are synchronised (begin_step). Direct (host
 * backend, host pass): the same computation at begin_layer, on the caller's thread. */
#include <stdatomic.h>
#include <string.h>

#include "akv/host_table.h"
#include "attn/attn_host_run.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/clock.h"
#include "core/log.h"
#include "route/route_impl.h"

/* A layer's host part as its host function reads it. */
typedef struct akv__route_host_layer {
    akv_route *r;
    akv_attn_host_part *parts; /* [max_seqs] */
    const void **pages;        /* [max_seqs * max_pages] their page addresses */
    uint32_t n;                /* sequences of the step */
} akv__route_host_layer;

/* ---- the policy ------------------------------------------------------------------------------ */

/* The oldest round(host_share x n_cold) of the pages outside the window, in a decode step. */
static uint32_t host_host_pages(const akv_route *r, const akv_route_seq *s, uint32_t n_cold,
                                bool decode) {
    (void)s;
    if (!decode || !(r->host_share > 0.0f)) return 0;
    const double x = (double)r->host_share * n_cold + 0.5;
    return x >= n_cold ? n_cold : (uint32_t)x;
}

/* ---- the transport --------------------------------------------------------------------------- */

static akv_status host_open(akv_route *r, const akv_route_params *p) {
    if (!(p->host_share >= 0.0f && p->host_share <= 1.0f)) {
        AKV_LOG_E("route: {=host_share} %g is not in 0..1", (double)p->host_share);
        return AKV_EINVAL;
    }
    akv_status st = akv__route_staged_open(r, p);
    if (st) return st;
    r->host_share = p->host_share;
    const uint32_t L = r->geom.n_layers;
    r->hl = akv__calloc(L, sizeof *r->hl);
    r->htok = akv__calloc(r->max_seqs, sizeof *r->htok);
    r->hx = akv__calloc(r->max_seqs, sizeof *r->hx);
    if (!r->hl || !r->htok || !r->hx) return AKV_ENOMEM;
    for (uint32_t l = 0; l < L; l++) {
        r->hl[l].r = r;
        r->hl[l].parts = akv__calloc(r->max_seqs, sizeof *r->hl[l].parts);
        r->hl[l].pages = akv__calloc(r->cap, sizeof *r->hl[l].pages);
        if (!r->hl[l].parts || !r->hl[l].pages) return AKV_ENOMEM;
    }
    return akv__par_create(p->host_threads, &r->hpar);
}

/* The query and state buffers for h query heads, made at the first host part (the pass says
 * how many query heads a row has). */
static akv_status host_buffers(akv_route *r, uint32_t h) {
    if (r->h_heads == h) return AKV_OK;
    if (r->h_heads) {
        AKV_LOG_E("route: the host part's rows had %u query heads; now %u", r->h_heads, h);
        return AKV_EINVAL;
    }
    const size_t D = r->geom.head_dim, rows = (size_t)r->geom.n_layers * r->max_seqs;
    const size_t q_bytes = rows * h * D * sizeof(float), s_bytes = rows * h * (D + 1) * sizeof(float);
    akv_status st = AKV_OK;
    float *q = NULL, *hs = NULL;
    akv_dptr d = {0};
    if (r->queued) { /* all or nothing: a failure frees what it made (tried again next step) */
        if ((st = akv_dev_pinned_alloc(r->dev, q_bytes, (void **)&q)) ||
            (st = akv_dev_pinned_alloc(r->dev, s_bytes, (void **)&hs)) ||
            (st = akv_dev_pinned_dptr(r->dev, hs, s_bytes, &d))) {
            if (q) akv_dev_pinned_free(r->dev, q);
            if (hs) akv_dev_pinned_free(r->dev, hs);
            AKV_LOG_E("route: the host part's buffers (%zu MiB pinned: every layer's query rows "
                      "and states of {=max_seqs} %u sequences) could not be had",
                      (q_bytes + s_bytes) >> 20, r->max_seqs);
            return st;
        }
    } else {
        q = akv__malloc(q_bytes), hs = akv__malloc(s_bytes);
        if (!q || !hs) return akv__free(q), akv__free(hs), AKV_ENOMEM;
    }
    r->hq = q, r->hst = hs, r->hst_d = d;
    r->h_heads = h;
    return AKV_OK;
}

/* Layer l's states (o rows then lse rows, n sequences) in hst; queued, on the device in hst_d. */
static float *host_states(const akv_route *r, uint32_t l) {
    return r->hst + (size_t)l * r->max_seqs * r->h_heads * (r->geom.head_dim + 1);
}

/* The layer's host part: its parts (every sequence's pages 1 .. x0-1, in the host pool) and
 * their states. Runs on the engine's thread (direct) or in the compute queue's order (queued); touches
 * only the layer's own buffers and the scratch (one layer at a time: queue order). */
static void host_run(void *arg) {
    akv__route_host_layer *hl = arg;
    akv_route *r = hl->r;
    const uint64_t t0 = akv_clock_ns();
    AKV_ASSERT(akv__attn_host_scratch_floats(hl->parts, hl->n) <= r->hscratch_n); /* host_part */
    const uint32_t l = (uint32_t)(hl - r->hl), H = r->h_heads, D = r->geom.head_dim;
    float *st = host_states(r, l);
    akv_status s = akv__attn_host_run(hl->parts, hl->n, AKV_ATTN_HOST_AUTO, r->hpar, r->hscratch,
                                      st, st + (size_t)hl->n * H * D);
    AKV_ASSERT(s == AKV_OK); /* the parts were checked when they were made */
    atomic_fetch_add(&r->host_ns, akv_clock_ns() - t0);
}

static akv_status host_part(akv_route *r, uint32_t layer, akv_kv_parts *parts) {
    uint32_t n_host = 0;
    for (uint32_t i = 0; i < r->n_step; i++) n_host += r->step[i]->x0 - 1;
    if (n_host == 0) return AKV_OK; /* no host page this step: the staged kind's step */
    const uint32_t H = parts->n_heads, D = r->geom.head_dim, n = r->n_step;
    akv_status st;
    if (!parts->q.addr || H == 0 || H % r->geom.n_kv_heads || parts->q_stride < H * D) {
        AKV_LOG_E("route: the host part needs the step's query rows (q, q_stride %u, n_heads %u "
                  "a multiple of the %u K/V heads)",
                  parts->q_stride, H, r->geom.n_kv_heads);
        return AKV_EINVAL;
    }
    if ((st = host_buffers(r, H))) return st;
    akv__route_host_layer *hl = &r->hl[layer];
    float *q = r->hq + (size_t)layer * r->max_seqs * H * D;
    const size_t page_bytes = akv_geom_page_bytes(&r->geom);
    hl->n = n;
    for (uint32_t i = 0, at = 0; i < n; i++) {
        akv_route_seq *s = r->step[i];
        const uint32_t np = s->x0 - 1; /* its pages 1 .. x0-1: full pages (the window holds
                                          the newest) */
        for (uint32_t k = 0; k < np; k++)
            hl->pages[at + k] = akv_host_pool_page_addr(r->hp, akv_host_table_page(s->ht, layer, k + 1));
        hl->parts[i] = (akv_attn_host_part){.pages = hl->pages + at,
                                            .n_pages = np,
                                            .last_len = np ? r->geom.page_tokens : 0,
                                            .n_kv_heads = r->geom.n_kv_heads,
                                            .head_dim = D,
                                            .page_tokens = r->geom.page_tokens,
                                            .dtype = r->geom.dtype,
                                            .n_heads = H,
                                            .q = q + (size_t)i * H * D};
        if ((st = akv_attn_host_part_check(&hl->parts[i]))) return st;
        r->htok[i] = (uint64_t)np * r->geom.page_tokens;
        at += np;
        s->stats.host_bytes += (uint64_t)np * page_bytes;
        r->stats.host_bytes += (uint64_t)np * page_bytes;
    }
    /* the chunks' scratch, the same size in every layer (x0 is): grown at the step's first
     * layer, when no host function of an earlier step can still be using it (begin_step
     * synchronised the queues) and none of this step's has been enqueued */
    const size_t need = akv__attn_host_scratch_floats(hl->parts, n);
    if (need > r->hscratch_n) {
        if (layer != 0) {
            AKV_LOG_E("route: the host part of layer %u needs more scratch than layer 0's", layer);
            return AKV_ESTATE;
        }
        float *grown = akv__malloc(need * sizeof *grown);
        if (!grown) return AKV_ENOMEM;
        akv__free(r->hscratch);
        r->hscratch = grown, r->hscratch_n = need;
    }
    float *states = host_states(r, layer);
    const size_t o_bytes = (size_t)n * H * D * sizeof(float), l_off = (size_t)n * H * D;
    if (!r->queued) { /* direct: the query rows are host memory, the work done now */
        const float *src = (const float *)(uintptr_t)parts->q.addr;
        for (uint32_t i = 0; i < n; i++)
            memcpy(q + (size_t)i * H * D, src + (size_t)i * parts->q_stride, (size_t)H * D * sizeof *q);
        host_run(hl);
        parts->host_tokens = r->htok;
        parts->host_o = akv_attn_host_ptr(states);
        parts->host_lse = akv_attn_host_ptr(states + l_off);
        return AKV_OK;
    }
    /* queued: all in the compute queue's order, after the layer's query rows are computed
     * and before its attention. The query rows go to the host by the SMs where the backend can
     * (else a copy on the compute queue); the host function runs when they are there (the
     * compute queue waits for it: the layer's attention needs its states, the next layer this
     * layer's output); the merge reads the states where it wrote them. No other queue takes
     * part, so nothing of the host part waits behind the bus's copies of the next layers. */
    const size_t s_off = (size_t)layer * r->max_seqs * H * (D + 1) * sizeof(float);
    const akv_dptr dst = akv_dptr_offset(r->hst_d, s_off);
    for (uint32_t i = 0; i < n; i++)
        r->hx[i] = (akv_dev_xfer){akv_dptr_offset(parts->q, (size_t)i * parts->q_stride * sizeof(float)),
                                  q + (size_t)i * H * D, (size_t)H * D * sizeof(float)};
    st = akv_dev_copy_d2h_batch_by_async(r->dev, AKV_QUEUE_COMPUTE, AKV_COPY_METHOD_KERNEL, r->hx, n);
    if (st == AKV_EUNSUPPORTED) /* the same spans by the device's configured method */
        st = akv_dev_copy_d2h_batch_async(r->dev, AKV_QUEUE_COMPUTE, r->hx, n);
    if (st || (st = akv_dev_host_fn_async(r->dev, AKV_QUEUE_COMPUTE, host_run, hl))) return st;
    parts->host_tokens = r->htok;
    parts->host_o = dst;
    parts->host_lse = akv_dptr_offset(dst, o_bytes);
    return AKV_OK;
}

static void host_free(akv_route *r) {
    for (uint32_t l = 0; r->hl && l < r->geom.n_layers; l++) {
        akv__free(r->hl[l].parts);
        akv__free(r->hl[l].pages);
    }
    akv__free(r->hl);
    akv__free(r->htok);
    akv__free(r->hx);
    akv__par_destroy(r->hpar);
    akv__free(r->hscratch);
    if (r->queued) {
        if (r->hq) akv_dev_pinned_free(r->dev, r->hq);
        if (r->hst) akv_dev_pinned_free(r->dev, r->hst);
    } else {
        akv__free(r->hq), akv__free(r->hst);
    }
}

akv_status akv_route_host_rate(const akv_geom *g, uint32_t n_heads, uint32_t threads, double *bps) {
    if (!g || !bps || !n_heads || n_heads % g->n_kv_heads) return AKV_EINVAL;
    const size_t pb = akv_geom_page_bytes(g), want = (size_t)64 << 20;
    const uint32_t n_pages = (uint32_t)(want / pb > 8 ? want / pb : 8), n_seq = 4;
    unsigned char *pool = akv__malloc((size_t)n_pages * pb);
    const void **pages = akv__calloc(n_pages, sizeof *pages);
    float *q = akv__calloc((size_t)n_seq * n_heads * g->head_dim, sizeof *q);
    float *o = akv__calloc((size_t)n_seq * n_heads * g->head_dim, sizeof *o);
    float *lse = akv__calloc((size_t)n_seq * n_heads, sizeof *lse);
    akv_attn_host_part parts[4];
    akv_par *par = NULL;
    float *scratch = NULL;
    akv_status st = pool && pages && q && o && lse ? akv__par_create(threads, &par) : AKV_ENOMEM;
    if (st == AKV_OK) {
        memset(pool, 0x3c, (size_t)n_pages * pb); /* bf16 ~1.0: finite scores */
        for (uint32_t i = 0; i < n_pages; i++) /* scattered: every 7th page, cyclically */
            pages[i] = pool + (size_t)((uint64_t)i * 7 % n_pages) * pb;
        const uint32_t per = n_pages / n_seq;
        for (uint32_t i = 0; i < n_seq; i++)
            parts[i] = (akv_attn_host_part){pages + (size_t)i * per, per, g->page_tokens,
                                            g->n_kv_heads, g->head_dim, g->page_tokens, g->dtype,
                                            n_heads, q + (size_t)i * n_heads * g->head_dim, 0.0f,
                                            AKV_REPR_EXACT, 0};
        scratch = akv__malloc(akv__attn_host_scratch_floats(parts, n_seq) * sizeof *scratch + 1);
        if (!scratch) st = AKV_ENOMEM;
        double best = 0;
        for (int rep = 0; rep < 4 && st == AKV_OK; rep++) {
            const uint64_t t0 = akv_clock_ns();
            st = akv__attn_host_run(parts, n_seq, AKV_ATTN_HOST_AUTO, par, scratch, o, lse);
            const double s = (double)(akv_clock_ns() - t0) * 1e-9;
            const double rate = (double)per * n_seq * pb / (s > 0 ? s : 1e-9);
            if (rep && rate > best) best = rate; /* the first pass warms up */
        }
        if (st == AKV_OK) *bps = best;
    }
    akv__par_destroy(par);
    akv__free(pool), akv__free(pages), akv__free(q), akv__free(o), akv__free(lse), akv__free(scratch);
    return st;
}

const akv__route_kind akv__route_host = {.kind = AKV_ROUTE_HOST,
                                         .name = "host",
                                         .plan_staging = akv__route_staged_plan_staging,
                                         .plan_windows = akv__route_staged_plan_windows,
                                         .need = akv__route_staged_need,
                                         .window = akv__route_staged_window,
                                         .order = akv__route_order_sink_newest,
                                         .outside = AKV_KV_STAGED,
                                         .host_pages = host_host_pages,
                                         .replayable = false,
                                         .open = host_open,
                                         .free = host_free,
                                         .retire = akv__route_staged_retire,
                                         .placed = akv__route_staged_placed,
                                         .begin_layer = akv__route_staged_begin_layer,
                                         .host_part = host_part,
                                         .end_layer = akv__route_staged_end_layer,
                                         .live = akv__route_staged_live};
