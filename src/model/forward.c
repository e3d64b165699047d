/* forward.c — the host forward pass of akv/forward.h: ref/ ops, the batch-invariant products
 * of akv_ops_matmul_cols on the pass's threads, and the attention by the host part's kernel
 * (akv/attn_host.h), every row a part of its own read in place. */
#include "akv/forward.h"
#include "akv/forward_ops.h"

#include <string.h>

#include "akv/attn_host.h"
#include "akv/kv_repr.h"
#include "akv/ops.h"
#include "attn/attn_host_run.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/log.h"
#include "core/par.h"
#include "model/forward_batch.h"

enum {
    FWD_HOST_DECODE = 1,     /* runs of one-token sequences are decode groups (one append call
                                each); every row is attended alike (forward_attend_rows) */
    FWD_COL_ALIGN = 24,      /* product tasks cover multiples of the 8/4/3-column tiles */
};

struct akv_forward {
    const akv_model *model;
    akv_forward_params params;
    uint32_t n_layers; /* layers a step goes through */
    uint32_t n_last;   /* tokens of the last step (rows of x) */
    akv_ops_isa isa;   /* the products' instruction set (resolved once) */
    akv_par *par;      /* the products' threads */
    /* scratch, each sized for max_step_tokens tokens */
    float *x;             /* [T][n_embd] residual stream */
    float *h;             /* [T][n_embd] normed input of a sub-block */
    float *tmp;           /* [T][n_embd] output of a sub-block before the residual add */
    float *q;             /* [T][n_heads*head_dim] */
    float *k, *v;         /* [T][n_kv_heads*head_dim] */
    float *att;           /* [T][n_heads*head_dim] attention output */
    float *lse;           /* [T][n_heads] its log-sum-exps (the kernel writes them always) */
    /* a history in several parts (made at the first such step): a past part's states, merged
     * into att and lse row by row */
    float *att_past, *lse_past; /* [T][n_heads*head_dim], [T][n_heads] */
    float *gate, *up;     /* [T][n_ff] */
    float *cos_t, *sin_t; /* [T][n_rot/2] */
    float *cos_s, *sin_s; /* [T][n_rot/2] local layers' (their own RoPE base), or NULL */
    int32_t *pos;         /* [T] */
    int32_t *qo;          /* [T+1] a prefill group's rows, rebased to 0 */
    akv__fwd_group *groups; /* [T] */
    void *xq_mem;           /* an input's 8-bit blocks for the block products: T rows of the
                               widest input (akv_ops_q8_bytes) */
    /* the attention's rows as host parts (forward_attend_rows), grown as calls need */
    akv_attn_host_part *hp;  /* [T] a row's part */
    const void **hp_pages;   /* a call's sequences' page addresses */
    size_t cap_hp_pages;
    float *hp_scratch;       /* akv__attn_host_scratch_floats */
    size_t cap_hp_scratch;
};

akv_forward_params akv_forward_default_params(void) {
    return (akv_forward_params){.max_step_tokens = 256, .n_layers = 0};
}

akv_status akv_forward_create(const akv_model *model, const akv_forward_params *params,
                              akv_forward **out) {
    if (!model || !out) return AKV_EINVAL;
    akv_forward_params p = params ? *params : akv_forward_default_params();
    const akv_model_config *c = akv_model_get_config(model);
    if (p.max_step_tokens == 0) p.max_step_tokens = 256;
    if (p.n_layers > c->n_layers) {
        AKV_LOG_E("forward: n_layers %u exceeds the model's %u", p.n_layers, c->n_layers);
        return AKV_EINVAL;
    }
    akv_forward *f = akv__calloc(1, sizeof *f);
    if (!f) return AKV_ENOMEM;
    f->model = model;
    f->params = p;
    f->n_layers = p.n_layers ? p.n_layers : c->n_layers;
    f->isa = akv_ops_isa_resolve(AKV_OPS_ISA_AUTO);
    akv_status st = akv__par_create(p.threads, &f->par);
    if (st) {
        akv__free(f);
        return st;
    }
    size_t T = p.max_step_tokens, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    f->x = akv__calloc(T * c->n_embd, sizeof(float));
    f->h = akv__calloc(T * c->n_embd, sizeof(float));
    f->tmp = akv__calloc(T * c->n_embd, sizeof(float));
    f->q = akv__calloc(T * q_dim, sizeof(float));
    f->k = akv__calloc(T * kv_dim, sizeof(float));
    f->v = akv__calloc(T * kv_dim, sizeof(float));
    f->att = akv__calloc(T * q_dim, sizeof(float));
    f->lse = akv__calloc(T * c->n_heads, sizeof(float));
    f->gate = akv__calloc(T * c->n_ff, sizeof(float));
    f->up = akv__calloc(T * c->n_ff, sizeof(float));
    f->cos_t = akv__calloc(T * (c->n_rot / 2), sizeof(float));
    f->sin_t = akv__calloc(T * (c->n_rot / 2), sizeof(float));
    if (c->n_swa) {
        f->cos_s = akv__calloc(T * (c->n_rot / 2), sizeof(float));
        f->sin_s = akv__calloc(T * (c->n_rot / 2), sizeof(float));
    }
    f->pos = akv__calloc(T, sizeof(int32_t));
    f->qo = akv__calloc(T + 1, sizeof(int32_t));
    f->groups = akv__calloc(T, sizeof *f->groups);
    f->hp = akv__calloc(T, sizeof *f->hp);
    size_t k_max = c->n_embd > q_dim ? c->n_embd : q_dim;
    k_max = c->n_ff > k_max ? c->n_ff : k_max;
    f->xq_mem = akv__malloc(
        akv_ops_q8_bytes(T, (k_max + AKV_OPS_QBLOCK - 1) / AKV_OPS_QBLOCK * AKV_OPS_QBLOCK));
    if (!f->xq_mem || !f->x || !f->h || !f->tmp || !f->q || !f->k || !f->v || !f->att || !f->lse || !f->gate ||
        !f->up || !f->cos_t || !f->sin_t || (c->n_swa && (!f->cos_s || !f->sin_s)) || !f->pos || !f->qo || !f->groups || !f->hp) {
        akv_forward_destroy(f);
        return AKV_ENOMEM;
    }
    *out = f;
    return AKV_OK;
}

void akv_forward_destroy(akv_forward *f) {
    if (!f) return;
    akv__par_destroy(f->par);
    akv__free(f->x), akv__free(f->h), akv__free(f->tmp), akv__free(f->q), akv__free(f->k);
    akv__free(f->v), akv__free(f->att), akv__free(f->gate), akv__free(f->up);
    akv__free(f->lse), akv__free(f->att_past), akv__free(f->lse_past);
    akv__free(f->cos_t), akv__free(f->sin_t), akv__free(f->pos), akv__free(f->qo);
    akv__free(f->cos_s), akv__free(f->sin_s);
    akv__free(f->groups), akv__free(f->xq_mem);
    akv__free(f->hp), akv__free(f->hp_pages), akv__free(f->hp_scratch);
    akv__free(f);
}

/* ---- products over the pass's threads ------------------------------------------------------ */

/* The input of one or more products: x itself for f32 weights, its 8-bit blocks for block
 * weights, quantized by the first block product that reads it and kept for the others. */
typedef struct fwd_in {
    const float *x;
    size_t m, k;
    bool quantized;
    akv_ops_q8 q; /* when quantized */
} fwd_in;

static fwd_in fwd_in_make(const float *x, size_t m, size_t k) {
    return (fwd_in){.x = x, .m = m, .k = k};
}

typedef struct fwd_mm {
    float *y;
    const fwd_in *in;
    const akv_model_mat *w;
    const float *bias;
    size_t per; /* columns of one task */
    akv_ops_isa isa;
} fwd_mm;

static void fwd_mm_task(void *ctx, uint32_t t) {
    const fwd_mm *a = ctx;
    const size_t n = a->w->rows, j0 = (size_t)t * a->per, j1 = j0 + a->per < n ? j0 + a->per : n;
    if (a->w->type == AKV_OPS_W_F32)
        akv_ops_matmul_cols(a->y, a->in->x, a->w->data, a->bias, a->in->m, n, a->in->k, j0, j1,
                            a->isa);
    else
        akv_ops_qmatmul_cols(a->y, &a->in->q, a->in->m, a->w->data, a->w->type, a->bias, n,
                             a->in->k, j0, j1, a->isa);
}

/* y[m][n] = x[m][k] W^T (+ bias), the columns cut into tasks (about four per thread, so that a
 * slower thread does not hold the loop up). */
static void fwd_matmul(akv_forward *f, float *y, fwd_in *in, const akv_model_mat *w,
                       const float *bias) {
    AKV_ASSERT(w->cols == in->k && (w->type == AKV_OPS_W_F32 || in->k % AKV_OPS_QBLOCK == 0));
    if (w->type != AKV_OPS_W_F32 && !in->quantized) {
        akv_ops_q8_bind(f->xq_mem, in->m, in->k, &in->q);
        akv_ops_quantize_rows_q8(in->x, in->m, in->k, &in->q, f->isa);
        in->quantized = true;
    }
    const size_t n = w->rows, want = (size_t)akv__par_n_threads(f->par) * 4;
    size_t per = (n + want - 1) / want;
    per = (per + FWD_COL_ALIGN - 1) / FWD_COL_ALIGN * FWD_COL_ALIGN;
    fwd_mm a = {.y = y, .in = in, .w = w, .bias = bias, .per = per, .isa = f->isa};
    akv__par_for(f->par, (uint32_t)((n + per - 1) / per), fwd_mm_task, &a);
}

/* ---- attention ----------------------------------------------------------------------------- */

/* The layer's parts, checked (akv__forward_parts_check: an exact part of the queries' own
 * history, and past parts of older history), and each sequence holding exactly pos0[s] +
 * n_new[s] tokens over them (the attention validates the rest: ids, page counts). */
static akv_status forward_check_parts(const akv_model_config *c, uint32_t layer,
                                      const akv_kv_parts *parts, const akv_forward_batch *b,
                                      uint32_t n_rows) {
    akv_status st = akv__forward_parts_check(c, "forward", layer, parts, b->n_seq, n_rows,
                                             AKV_KV_MAX_PARTS);
    if (st) return st;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        uint64_t len = 0, want = (uint64_t)b->pos0[s] + b->n_new[s];
        for (uint32_t i = 0; i < parts->n_parts; i++) {
            const akv_attn_pages *pg = &parts->part[i].kv;
            const int32_t *indptr = (const int32_t *)(uintptr_t)pg->indptr.addr;
            const int32_t *last = (const int32_t *)(uintptr_t)pg->last_page_len.addr;
            if (indptr[s + 1] > indptr[s])
                len += (uint64_t)(indptr[s + 1] - indptr[s] - 1) * pg->page_tokens + (uint64_t)last[s];
        }
        if (parts->host_o.addr) len += parts->host_tokens[s]; /* older history, on the host */
        if (len != want) {
            AKV_LOG_E("forward: layer %u: sequence %u of the step holds %llu tokens in its page "
                      "table(s); expected %llu",
                      layer, s, (unsigned long long)len, (unsigned long long)want);
            return AKV_EINVAL;
        }
    }
    return AKV_OK;
}

/* A group's rows attended over one part's table by the host part's kernel (akv/attn_host.h):
 * each row a part of its own over the keys it sees (the causal rule, or every key of a past
 * part), read in place. So a row's bits are one recipe of its query and its keys alone: the
 * same whether its chunk is one row (a decode) or many (a prefill), and whatever else the call
 * holds. The parts' chunks go over the pass's threads. o [n_rows][n_heads][head_dim] and lse
 * [n_rows][n_heads] at the group's first row. */
static akv_status forward_attend_rows(akv_forward *f, const akv_attn_pages *v,
                                      const akv__fwd_group *g, uint32_t window, float *o, float *lse) {
    const akv_model_config *c = akv_model_get_config(f->model);
    const size_t q_dim = (size_t)c->n_heads * c->head_dim;
    const int32_t *indptr = (const int32_t *)(uintptr_t)v->indptr.addr;
    const int32_t *indices = (const int32_t *)(uintptr_t)v->indices.addr;
    const int32_t *last = (const int32_t *)(uintptr_t)v->last_page_len.addr;
    akv_repr_layout lay;
    akv_status st = akv_repr_layout_of((akv_repr)v->repr, v->dtype, v->n_kv_heads, v->page_tokens,
                                       v->head_dim, &lay);
    if (st) return st;
    const unsigned char *pool = (const unsigned char *)(uintptr_t)v->pool.addr;
    const size_t n_pg = (size_t)(indptr[v->n_seq] - indptr[0]);
    if (n_pg > f->cap_hp_pages &&
        (st = akv__array_reserve((void **)&f->hp_pages, &f->cap_hp_pages, n_pg, sizeof *f->hp_pages)))
        return st;
    for (size_t k = 0; k < n_pg; k++)
        f->hp_pages[k] = pool + (size_t)indices[indptr[0] + (int32_t)k] * lay.page_bytes;
    const uint32_t P = v->page_tokens;
    for (uint32_t si = 0, r = 0; si < v->n_seq; si++) {
        const uint32_t n = g->decode ? g->n_new : (uint32_t)(f->qo[si + 1] - f->qo[si]);
        const uint32_t pages = (uint32_t)(indptr[si + 1] - indptr[si]);
        const uint64_t len = pages ? (uint64_t)(pages - 1) * P + (uint32_t)last[si] : 0;
        for (uint32_t i = 0; i < n; i++, r++) {
            const uint64_t keys = v->past ? len : len - n + i + 1; /* the causal rule */
            const uint32_t kp = (uint32_t)((keys + P - 1) / P);
            /* a local layer's row sees its `window` newest keys, itself included */
            const uint64_t first = window && keys > window ? keys - window : 0;
            const uint32_t p0 = (uint32_t)(first / P);
            f->hp[r] = (akv_attn_host_part){.pages = f->hp_pages + (indptr[si] - indptr[0]) + p0,
                                            .n_pages = kp - p0,
                                            .first_skip = (uint32_t)(first % P),
                                            .scale = c->attn_scale,
                                            .last_len = kp ? (uint32_t)(keys - (uint64_t)(kp - 1) * P) : 1,
                                            .n_kv_heads = v->n_kv_heads,
                                            .head_dim = v->head_dim,
                                            .page_tokens = P,
                                            .dtype = v->dtype,
                                            .n_heads = c->n_heads,
                                            .q = f->q + ((size_t)g->row0 + r) * q_dim,
                                            .repr = v->repr};
        }
    }
    const size_t need = akv__attn_host_scratch_floats(f->hp, g->n_rows);
    if (need > f->cap_hp_scratch &&
        (st = akv__array_reserve((void **)&f->hp_scratch, &f->cap_hp_scratch, need, sizeof *f->hp_scratch)))
        return st;
    return akv__attn_host_run(f->hp, g->n_rows, AKV_ATTN_HOST_AUTO, f->par, f->hp_scratch, o, lse);
}

/* One group's attention: its new K/V into the pages of the exact part, then attend it, and each
 * past part of older history, whose states merge into the exact part's exactly (akv/attn.h),
 * the rows' chunks spread over the pass's threads. */
static akv_status forward_attend_group(akv_forward *f, const akv_kv_parts *parts,
                                       const akv_forward_batch *b, const akv__fwd_group *g,
                                       uint32_t window) {
    const akv_model_config *c = akv_model_get_config(f->model);
    const size_t q_dim = (size_t)c->n_heads * c->head_dim,
                 kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    akv_attn_pages v = akv__forward_view(&parts->part[0].kv, g);
    akv_dptr k = akv_attn_host_ptr(f->k + g->row0 * kv_dim);
    akv_dptr vv = akv_attn_host_ptr(f->v + g->row0 * kv_dim);
    if (!g->decode) { /* a prefill group's rows per sequence, rebased to 0 */
        f->qo[0] = 0;
        for (uint32_t s = g->s0; s < g->s1; s++)
            f->qo[s - g->s0 + 1] = f->qo[s - g->s0] + (int32_t)b->n_new[s];
    }
    /* a decode group's sequences all have n_new new tokens; a prefill group's, qo */
    akv_attn_append ap = {.kv = v,
                          .qo_indptr = g->decode ? (akv_dptr){0} : akv_attn_host_ptr(f->qo),
                          .n_per_seq = g->decode ? g->n_new : 0,
                          .n_tokens = g->n_rows,
                          .max_new = g->n_new,
                          .k = k,
                          .v = vv,
                          .dtype = AKV_DTYPE_F32};
    akv_status st = akv_attn_ref_append(&ap);
    if (st) return st;
    float *att = f->att + g->row0 * q_dim, *lse = f->lse + g->row0 * c->n_heads;
    if ((st = forward_attend_rows(f, &v, g, window, att, lse))) return st;
    for (uint32_t i = 1; i < parts->n_parts; i++) {
        const akv_attn_pages past = akv__forward_view(&parts->part[i].kv, g);
        float *op = f->att_past + g->row0 * q_dim, *lp = f->lse_past + g->row0 * c->n_heads;
        if ((st = forward_attend_rows(f, &past, g, 0, op, lp))) return st;
        for (size_t r = 0; r < (size_t)g->n_rows * c->n_heads; r++)
            akv_attn_merge_state(c->head_dim, att + r * c->head_dim, lse + r,
                                 op + r * c->head_dim, lp[r]);
    }
    return AKV_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* The scratch of a history in several parts, at the first step that has them. */
static akv_status forward_alloc_parts(akv_forward *f) {
    const akv_model_config *c = akv_model_get_config(f->model);
    const size_t T = f->params.max_step_tokens, q_dim = (size_t)c->n_heads * c->head_dim;
    f->att_past = akv__calloc(T * q_dim, sizeof(float));
    f->lse_past = akv__calloc(T * c->n_heads, sizeof(float));
    if (f->att_past && f->lse_past) return AKV_OK;
    akv__free(f->att_past), akv__free(f->lse_past);
    f->att_past = f->lse_past = NULL;
    return AKV_ENOMEM;
}

akv_status akv_forward_step(akv_forward *f, const akv_forward_batch *b, const akv_kv_hooks *kv,
                            float *logits) {
    if (!f || !kv || !kv->begin_layer) return AKV_EINVAL;
    uint32_t n = 0;
    const akv_model *m = f->model;
    const akv_model_config *c = akv_model_get_config(m);
    akv_status st = akv_forward_batch_check(b, f->params.max_step_tokens, c->n_vocab, "forward", &n);
    if (st) return st;
    size_t E = c->n_embd, q_dim = (size_t)c->n_heads * c->head_dim;
    for (uint32_t t = 0; t < n; t++) {
        float *row = f->x + (size_t)t * E;
        if ((st = akv_model_mat_row_f32(akv_model_tok_embd(m), (uint32_t)b->tokens[t], row)))
            return st;
        if (c->embd_scale != 1.0f)
            for (size_t e = 0; e < E; e++) row[e] *= c->embd_scale;
    }
    f->n_last = n;
    const uint32_t n_groups = akv__forward_groups(b, FWD_HOST_DECODE, f->groups);

    /* One cos/sin table for the step's positions serves every layer and head. */
    for (uint32_t s = 0, t = 0; s < b->n_seq; s++)
        for (uint32_t i = 0; i < b->n_new[s]; i++)
            f->pos[t++] = (int32_t)(b->pos0[s] + i);
    akv_ops_ref_rope_table(f->pos, n, akv_model_rope_inv_freq(m), c->n_rot, f->cos_t, f->sin_t);
    if (f->cos_s) /* the local layers' own base */
        akv_ops_ref_rope_table(f->pos, n, akv_model_rope_inv_freq_local(m), c->n_rot, f->cos_s,
                               f->sin_s);

    for (uint32_t l = 0; l < f->n_layers; l++) {
        const akv_model_layer *L = akv_model_get_layer(m, l);
        /* attention block: norm, projections, rotation */
        akv_ops_ref_rmsnorm(f->h, f->x, L->attn_norm, n, E, c->rms_eps);
        fwd_in in = fwd_in_make(f->h, n, E);
        fwd_matmul(f, f->q, &in, &L->wq, L->bq);
        fwd_matmul(f, f->k, &in, &L->wk, L->bk);
        fwd_matmul(f, f->v, &in, &L->wv, L->bv);
        if (L->q_norm) { /* qwen3: every head of Q and K normalised before its rotation */
            akv_ops_ref_rmsnorm(f->q, f->q, L->q_norm, (size_t)n * c->n_heads, c->head_dim, c->rms_eps);
            akv_ops_ref_rmsnorm(f->k, f->k, L->k_norm, (size_t)n * c->n_kv_heads, c->head_dim, c->rms_eps);
        }
        const bool local = akv_model_layer_is_swa(c, l);
        const float *cs = local ? f->cos_s : f->cos_t, *sn = local ? f->sin_s : f->sin_t;
        akv_ops_ref_rope(f->q, n, c->n_heads, c->head_dim, c->n_rot, c->rope_mode, cs, sn);
        akv_ops_ref_rope(f->k, n, c->n_kv_heads, c->head_dim, c->n_rot, c->rope_mode, cs, sn);

        /* the history: the route places the pages, the attention writes and reads them */
        akv_kv_parts parts;
        memset(&parts, 0, sizeof parts);
        parts.q = akv_attn_host_ptr(f->q), parts.q_stride = (uint32_t)q_dim, parts.n_heads = c->n_heads;
        if ((st = kv->begin_layer(kv->user, l, &parts))) return st;
        if ((st = forward_check_parts(c, l, &parts, b, n))) return st;
        if (local && (parts.n_parts > 1 || parts.host_o.addr)) {
            AKV_LOG_E("forward: layer %u attends a sliding window: it takes its history as one "
                      "exact part (a compact tier's or the host-attended route's parts carry no "
                      "window yet)",
                      l);
            return AKV_EUNSUPPORTED;
        }
        if (parts.n_parts > 1 && !f->att_past && (st = forward_alloc_parts(f)))
            return st;
        for (uint32_t gi = 0; gi < n_groups; gi++)
            if ((st = forward_attend_group(f, &parts, b, &f->groups[gi], local ? c->n_swa : 0)))
                return st;
        if (parts.host_o.addr) { /* the host part's states (a row a sequence), merged exactly */
            const float *ho = (const float *)(uintptr_t)parts.host_o.addr,
                        *hl = (const float *)(uintptr_t)parts.host_lse.addr;
            for (size_t r = 0; r < (size_t)n * c->n_heads; r++)
                akv_attn_merge_state(c->head_dim, f->att + r * c->head_dim, f->lse + r,
                                     ho + r * c->head_dim, hl[r]);
        }
        if (kv->end_layer && (st = kv->end_layer(kv->user, l))) return st;

        in = fwd_in_make(f->att, n, q_dim);
        fwd_matmul(f, f->tmp, &in, &L->wo, NULL);
        if (L->attn_post_norm) akv_ops_ref_rmsnorm(f->tmp, f->tmp, L->attn_post_norm, n, E, c->rms_eps);
        akv_ops_ref_add(f->x, f->tmp, n * E);

        /* feed-forward block: SwiGLU or GeGLU */
        akv_ops_ref_rmsnorm(f->h, f->x, L->ffn_norm, n, E, c->rms_eps);
        in = fwd_in_make(f->h, n, E);
        fwd_matmul(f, f->gate, &in, &L->w_gate, NULL);
        fwd_matmul(f, f->up, &in, &L->w_up, NULL);
        if (c->ffn_act == AKV_FFN_GEGLU) akv_ops_ref_geglu(f->gate, f->gate, f->up, (size_t)n * c->n_ff);
        else akv_ops_ref_swiglu(f->gate, f->gate, f->up, (size_t)n * c->n_ff);
        in = fwd_in_make(f->gate, n, c->n_ff);
        fwd_matmul(f, f->tmp, &in, &L->w_down, NULL);
        if (L->ffn_post_norm) akv_ops_ref_rmsnorm(f->tmp, f->tmp, L->ffn_post_norm, n, E, c->rms_eps);
        akv_ops_ref_add(f->x, f->tmp, n * E);
    }

    if (!logits) return AKV_OK;
    /* output head: only the rows whose logits are wanted, gathered in sequence order */
    uint32_t rows = 0;
    for (uint32_t s = 0, t = 0; s < b->n_seq; t += b->n_new[s], s++) {
        const uint8_t mode = akv_forward_batch_mode(b, s);
        uint32_t first = mode == AKV_FORWARD_LOGITS_ALL ? t : t + b->n_new[s] - 1;
        uint32_t k = akv_forward_mode_rows(mode, b->n_new[s]);
        akv_ops_ref_rmsnorm(f->h + (size_t)rows * E, f->x + (size_t)first * E,
                            akv_model_output_norm(m), k, E, c->rms_eps);
        rows += k;
    }
    if (rows) {
        fwd_in in = fwd_in_make(f->h, rows, E);
        fwd_matmul(f, logits, &in, akv_model_output(m), NULL);
    }
    for (uint32_t s = 0, row = 0; s < b->n_seq; s++) { /* the tokens asked for */
        const uint8_t mode = akv_forward_batch_mode(b, s);
        float *lr = logits + (size_t)row * c->n_vocab;
        if (mode == AKV_FORWARD_LOGITS_ARGMAX) b->chosen[s] = akv_fwd_argmax_ref(lr, c->n_vocab);
        if (mode == AKV_FORWARD_LOGITS_SAMPLE) {
            const int32_t id = akv_fwd_sample_ref(&b->sample[s], b->pen, b->pen ? b->pen + b->n_pen : NULL,
                                                  lr, c->n_vocab);
            if (id == -2) return AKV_ENOMEM;
            b->chosen[s] = id;
        }
        row += akv_forward_mode_rows(mode, b->n_new[s]);
    }
    return AKV_OK;
}

akv_status akv_forward_run(akv_forward *f, const int32_t *tokens, uint32_t n, uint32_t pos0,
                           const akv_kv_hooks *kv, float *logits, bool all_logits) {
    uint8_t mode = all_logits ? AKV_FORWARD_LOGITS_ALL : AKV_FORWARD_LOGITS_LAST;
    akv_forward_batch b = {.n_seq = 1, .n_new = &n, .pos0 = &pos0, .tokens = tokens,
                           .logits = &mode};
    if (!tokens) return AKV_EINVAL;
    return akv_forward_step(f, &b, kv, logits);
}

const float *akv_forward_hidden(const akv_forward *f) {
    return f->x;
}
