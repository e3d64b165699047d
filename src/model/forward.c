/* forward.c — the host forward pass of akv/forward.h: ref/ ops, OpenBLAS products, and the
 * reference paged attention. */
#include "akv/forward.h"

#include <string.h>

#include "akv/ops.h"
#include "core/alloc.h"
#include "core/log.h"

struct akv_forward {
    const akv_model *model;
    akv_forward_params params;
    uint32_t n_layers; /* layers a run goes through */
    uint32_t n_last;   /* tokens of the last run (rows of x) */
    /* scratch, each sized for max_chunk tokens */
    float *x;             /* [T][n_embd] residual stream */
    float *h;             /* [T][n_embd] normed input of a sub-block */
    float *tmp;           /* [T][n_embd] output of a sub-block before the residual add */
    float *q;             /* [T][n_heads*head_dim] */
    float *k, *v;         /* [T][n_kv_heads*head_dim] */
    float *att;           /* [T][n_heads*head_dim] attention output */
    float *gate, *up;     /* [T][n_ff] */
    float *cos_t, *sin_t; /* [T][n_rot/2] */
    int32_t *pos;         /* [T] */
};

akv_forward_params akv_forward_default_params(void) {
    return (akv_forward_params){.max_chunk = 256, .n_layers = 0};
}

akv_status akv_forward_create(const akv_model *model, const akv_forward_params *params,
                              akv_forward **out) {
    if (!model || !out) return AKV_EINVAL;
    akv_forward_params p = params ? *params : akv_forward_default_params();
    const akv_model_config *c = akv_model_get_config(model);
    if (p.max_chunk == 0) p.max_chunk = 256;
    if (p.n_layers > c->n_layers) {
        AKV_LOG_E("forward: n_layers %u exceeds the model's %u", p.n_layers, c->n_layers);
        return AKV_EINVAL;
    }
    akv_forward *f = akv__calloc(1, sizeof *f);
    if (!f) return AKV_ENOMEM;
    f->model = model;
    f->params = p;
    f->n_layers = p.n_layers ? p.n_layers : c->n_layers;
    size_t T = p.max_chunk, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    f->x = akv__calloc(T * c->n_embd, sizeof(float));
    f->h = akv__calloc(T * c->n_embd, sizeof(float));
    f->tmp = akv__calloc(T * c->n_embd, sizeof(float));
    f->q = akv__calloc(T * q_dim, sizeof(float));
    f->k = akv__calloc(T * kv_dim, sizeof(float));
    f->v = akv__calloc(T * kv_dim, sizeof(float));
    f->att = akv__calloc(T * q_dim, sizeof(float));
    f->gate = akv__calloc(T * c->n_ff, sizeof(float));
    f->up = akv__calloc(T * c->n_ff, sizeof(float));
    f->cos_t = akv__calloc(T * (c->n_rot / 2), sizeof(float));
    f->sin_t = akv__calloc(T * (c->n_rot / 2), sizeof(float));
    f->pos = akv__calloc(T, sizeof(int32_t));
    if (!f->x || !f->h || !f->tmp || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up ||
        !f->cos_t || !f->sin_t || !f->pos) {
        akv_forward_destroy(f);
        return AKV_ENOMEM;
    }
    *out = f;
    return AKV_OK;
}

void akv_forward_destroy(akv_forward *f) {
    if (!f) return;
    akv__free(f->x), akv__free(f->h), akv__free(f->tmp), akv__free(f->q), akv__free(f->k);
    akv__free(f->v), akv__free(f->att), akv__free(f->gate), akv__free(f->up);
    akv__free(f->cos_t), akv__free(f->sin_t), akv__free(f->pos);
    akv__free(f);
}

/* The hook's table must be one sequence of exactly n_tokens tokens with the model's K/V
 * shape (the attention validates the rest: ids, lengths, page counts). */
static akv_status forward_check_pages(const akv_model_config *c, uint32_t layer,
                                      const akv_attn_pages *pg, uint64_t n_tokens) {
    const int32_t *indptr = (const int32_t *)(uintptr_t)pg->indptr.addr;
    const int32_t *last = (const int32_t *)(uintptr_t)pg->last_page_len.addr;
    uint64_t len = 0;
    if (pg->n_seq == 1 && indptr && last && indptr[1] > indptr[0])
        len = (uint64_t)(indptr[1] - indptr[0] - 1) * pg->page_tokens + (uint64_t)last[0];
    if (pg->n_seq != 1 || pg->n_kv_heads != c->n_kv_heads || pg->head_dim != c->head_dim ||
        len != n_tokens) {
        AKV_LOG_E("forward: layer %u: the page table holds %u sequence(s) of %llu tokens, %u K/V "
                  "heads of %u; expected 1 sequence of %llu tokens, %u heads of %u",
                  layer, pg->n_seq, (unsigned long long)len, pg->n_kv_heads, pg->head_dim,
                  (unsigned long long)n_tokens, c->n_kv_heads, c->head_dim);
        return AKV_EINVAL;
    }
    return AKV_OK;
}

/* The attention of one layer for the chunk: K/V into the pages, then attend. */
static akv_status forward_attend(akv_forward *f, const akv_attn_pages *pg, uint32_t n) {
    const akv_model_config *c = akv_model_get_config(f->model);
    akv_status st;
    if (n == 1) {
        akv_attn_append ap = {.kv = *pg,
                              .n_per_seq = 1,
                              .n_tokens = 1,
                              .max_new = 1,
                              .k = akv_attn_host_ptr(f->k),
                              .v = akv_attn_host_ptr(f->v),
                              .dtype = AKV_DTYPE_F32};
        if ((st = akv_attn_ref_append(&ap))) return st;
        akv_attn_decode d = {.kv = *pg,
                             .n_heads = c->n_heads,
                             .n_query = 1,
                             .q = akv_attn_host_ptr(f->q),
                             .q_dtype = AKV_DTYPE_F32,
                             .o = akv_attn_host_ptr(f->att),
                             .o_dtype = AKV_DTYPE_F32};
        return akv_attn_host_decode(&d);
    }
    int32_t qo_indptr[2] = {0, (int32_t)n};
    akv_attn_prefill pf = {.kv = *pg,
                           .n_heads = c->n_heads,
                           .qo_indptr = akv_attn_host_ptr(qo_indptr),
                           .n_tokens = n,
                           .max_chunk = n,
                           .q = akv_attn_host_ptr(f->q),
                           .q_dtype = AKV_DTYPE_F32,
                           .k_new = akv_attn_host_ptr(f->k),
                           .v_new = akv_attn_host_ptr(f->v),
                           .kv_new_dtype = AKV_DTYPE_F32,
                           .o = akv_attn_host_ptr(f->att),
                           .o_dtype = AKV_DTYPE_F32};
    return akv_attn_host_prefill(&pf);
}

akv_status akv_forward_run(akv_forward *f, const int32_t *tokens, uint32_t n, uint32_t pos0,
                           const akv_forward_kv *kv, float *logits, bool all_logits) {
    if (!f || !tokens || !kv || !kv->begin_layer) return AKV_EINVAL;
    if (n == 0 || n > f->params.max_chunk || (uint64_t)pos0 + n > INT32_MAX) {
        AKV_LOG_E("forward: a chunk of %u tokens at position %u (1..%u tokens, positions below "
                  "2^31)",
                  n, pos0, f->params.max_chunk);
        return AKV_EINVAL;
    }
    const akv_model *m = f->model;
    const akv_model_config *c = akv_model_get_config(m);
    size_t E = c->n_embd, q_dim = (size_t)c->n_heads * c->head_dim,
           kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    akv_status st = akv_ops_ref_embed(f->x, akv_model_tok_embd(m), c->n_vocab, E, tokens, n);
    if (st) return st;
    f->n_last = n;

    /* One cos/sin table for the chunk's positions serves every layer and head. */
    for (uint32_t t = 0; t < n; t++)
        f->pos[t] = (int32_t)(pos0 + t);
    akv_ops_ref_rope_table(f->pos, n, akv_model_rope_inv_freq(m), c->n_rot, f->cos_t, f->sin_t);

    for (uint32_t l = 0; l < f->n_layers; l++) {
        const akv_model_layer *L = akv_model_get_layer(m, l);
        /* attention block: norm, projections, rotation */
        akv_ops_ref_rmsnorm(f->h, f->x, L->attn_norm, n, E, c->rms_eps);
        akv_ops_ref_matmul(f->q, f->h, L->wq, L->bq, n, q_dim, E);
        akv_ops_ref_matmul(f->k, f->h, L->wk, L->bk, n, kv_dim, E);
        akv_ops_ref_matmul(f->v, f->h, L->wv, L->bv, n, kv_dim, E);
        akv_ops_ref_rope(f->q, n, c->n_heads, c->head_dim, c->n_rot, c->rope_mode, f->cos_t,
                         f->sin_t);
        akv_ops_ref_rope(f->k, n, c->n_kv_heads, c->head_dim, c->n_rot, c->rope_mode, f->cos_t,
                         f->sin_t);

        /* the history: the route places the pages, the attention writes and reads them */
        akv_attn_pages pg;
        memset(&pg, 0, sizeof pg);
        if ((st = kv->begin_layer(kv->user, l, &pg))) return st;
        if ((st = forward_check_pages(c, l, &pg, (uint64_t)pos0 + n))) return st;
        if ((st = forward_attend(f, &pg, n))) return st;
        if (kv->end_layer && (st = kv->end_layer(kv->user, l))) return st;

        akv_ops_ref_matmul(f->tmp, f->att, L->wo, NULL, n, E, q_dim);
        akv_ops_ref_add(f->x, f->tmp, n * E);

        /* feed-forward block: SwiGLU */
        akv_ops_ref_rmsnorm(f->h, f->x, L->ffn_norm, n, E, c->rms_eps);
        akv_ops_ref_matmul(f->gate, f->h, L->w_gate, NULL, n, c->n_ff, E);
        akv_ops_ref_matmul(f->up, f->h, L->w_up, NULL, n, c->n_ff, E);
        akv_ops_ref_swiglu(f->gate, f->gate, f->up, (size_t)n * c->n_ff);
        akv_ops_ref_matmul(f->tmp, f->gate, L->w_down, NULL, n, E, c->n_ff);
        akv_ops_ref_add(f->x, f->tmp, n * E);
    }

    if (!logits) return AKV_OK;
    /* output head: only the rows whose logits are wanted */
    uint32_t first = all_logits ? 0 : n - 1, rows = n - first;
    akv_ops_ref_rmsnorm(f->h, f->x + (size_t)first * E, akv_model_output_norm(m), rows, E,
                        c->rms_eps);
    akv_ops_ref_matmul(logits, f->h, akv_model_output(m), NULL, rows, c->n_vocab, E);
    return AKV_OK;
}

const float *akv_forward_hidden(const akv_forward *f) {
    return f->x;
}
