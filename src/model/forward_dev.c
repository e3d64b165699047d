/* forward_dev.c — the forward pass on a device's queues (akv/forward_dev.h): weights as bf16
 * or in their block formats in one device allocation, scratch for max_step_tokens tokens in another,
 * every step an op of akv/forward_ops.h on the compute queue; a replayable decode step
 * recorded and launched as one graph when its record equals the last graph's. */
#include "akv/forward_dev.h"

#include <math.h>
#include <string.h>

#include "akv/forward_ops.h"
#include "core/alloc.h"
#include "core/assert.h"
#include "core/half.h"
#include "core/log.h"
#include "model/forward_batch.h"

enum {
    FDEV_ALIGN = 256,               /* every array of an allocation starts at this alignment */
    FDEV_CUBLAS_WS = 32u << 20,     /* cuBLAS workspace (device backends only) */
    FDEV_UPLOAD_CHUNK = 1u << 22,   /* elements per f32->bf16 conversion of an upload */
};
/* Widened pages of a prompt chunk's compact past at once, at most (fdev_attend_past_prefill;
 * at least one page of each sequence): 32K tokens of Llama-3-8B's history in a layer. */
#define FDEV_WIDEN_BYTES ((uint64_t)256 << 20)

/* A record of launches: the ops and a copy of their argument structs, each of its op's
 * args_bytes at the next 16-byte offset of args (fdev_rec_add). */
typedef struct fdev_rec {
    const akv_dev_op **ops; /* [n] */
    unsigned char *args;    /* len bytes */
    size_t n, cap_ops, len, args_cap;
} fdev_rec;

/* The offset in a record's args of the arguments that follow those ending at `end`. */
static size_t fdev_rec_next(size_t end) {
    return (end + 15) / 16 * 16;
}

/* A device matrix: rows of bf16 (type 0) or of a block format (akv_ops_wtype). */
typedef struct fdev_w {
    akv_dptr w;
    uint32_t type;
} fdev_w;

/* One block's device weights. A fused matrix (Q|K|V, gate|up) is in a block format only when
 * its parts all are, in the same one; else it is bf16. */
typedef struct fdev_layer {
    akv_dptr attn_norm; /* f32 [n_embd] */
    fdev_w wqkv;        /* [q_dim + 2*kv_dim][n_embd]: Wq rows, then Wk, then Wv */
    akv_dptr bqkv;      /* f32 [q_dim + 2*kv_dim], or 0 without bias */
    akv_dptr qk_norm;   /* f32 [2][head_dim]: every Q head's norm weights, then every K head's;
                           0 without (has_qk_norm) */
    fdev_w wo;          /* [n_embd][q_dim] */
    akv_dptr ffn_norm;  /* f32 [n_embd] */
    fdev_w wgu;         /* [2*n_ff][n_embd]: W_gate rows, then W_up */
    fdev_w wdown;       /* [n_embd][n_ff] */
} fdev_layer;

struct akv_forward_dev {
    akv_dev *dev;
    akv_model_config cfg;
    akv_forward_params params;
    uint32_t n_layers;
    bool is_host;         /* host backend: no cuBLAS workspace, no split plan */
    uint32_t n_sm;        /* the device's, for the decode split */
    size_t smem_per_block;
    uint32_t q_dim, kv_dim, qkv_dim;
    /* weights (one allocation) */
    akv_dptr wmem;
    akv_dptr tok_embd;    /* bf16 [n_vocab][n_embd] */
    fdev_w output;        /* [n_vocab][n_embd]; = tok_embd when tied and bf16 */
    akv_dptr output_norm; /* f32 [n_embd] */
    akv_dptr inv_freq;    /* f32 [n_rot/2] */
    fdev_layer *layers;   /* [n_layers] */
    uint64_t weight_bytes;
    /* scratch for T = max_step_tokens tokens (one allocation) */
    akv_dptr smem_d;
    akv_dptr x;           /* f32 [T][n_embd] residual stream */
    akv_dptr h;           /* bf16 [T][n_embd] normed input of a sub-block */
    akv_dptr qkv;         /* f32 [T][qkv_dim] */
    akv_dptr att;         /* bf16 [T][q_dim] attention output */
    akv_dptr gu;          /* f32 [T][2*n_ff] gate | up */
    akv_dptr act;         /* bf16 [T][n_ff] SwiGLU output */
    akv_dptr wscratch;    /* the block products' scratch (akv_fwd_matmul_args.scratch): the
                             largest block matrix widened to bf16, or x quantized; 0 if none */
    size_t wscratch_bytes;
    akv_dptr logits;      /* f32 [L][n_vocab], L = max_logits */
    akv_dptr chosen;      /* int32 [L]: each logit row's token (ARGMAX and SAMPLE rows) */
    akv_dptr draw;        /* each logit row's draw (akv_fwd_sample_row [L]), then the penalties
                             (int32 [2][L x AKV_FORWARD_SAMPLE_PEN_MAX]) */
    akv_dptr io;          /* int32 [FDEV_IO_INTS]: ids [T], positions [T], the prefill group's
                             qo_indptr [T+1], the logit rows [L] (fdev_io_*) */
    akv_dptr blas_ws;     /* FDEV_CUBLAS_WS bytes, or 0 on the host backend */
    /* decode workspaces, one per part (exact, past) and query count (own allocations, grown
     * on demand): a step's decode groups of different counts, and the two parts of a layer,
     * never share counters */
    akv_dptr attn_ws[2][AKV_ATTN_MAX_QUERIES];
    size_t attn_ws_bytes[2][AKV_ATTN_MAX_QUERIES];
    uint32_t attn_ws_layout[2][AKV_ATTN_MAX_QUERIES][3]; /* n_seq, n_parts, n_query last used */
    /* a layer read as two parts (an exact part and a past part of older history): each part's
     * states before their merge into att (one allocation, made at the first such step) */
    akv_dptr part_mem;
    akv_dptr part_o[3];   /* f32 [T][q_dim]; [2]: a widened piece of the past part after the
                             first, merged into [1] */
    akv_dptr part_lse[3]; /* f32 [T][n_heads] */
    /* a prompt chunk's compact past part widened to exact pages (fdev_attend_past): pages,
     * then the table's int32 indptr, last_page_len and indices; own allocation, grown on
     * demand up to about FDEV_WIDEN_BYTES */
    akv_dptr widen_mem;
    size_t widen_bytes;
    const uint32_t *pos0; /* the step's akv_forward_batch.pos0, while its layers run */
    akv__fwd_group *groups; /* [T] this step's attention groups */
    /* pinned host side */
    int32_t *io_h;        /* [FDEV_IO_INTS], the source of the io upload */
    float *logits_h;      /* [L][n_vocab] */
    int32_t *chosen_h;    /* [L] */
    void *draw_h;         /* the draw's upload, laid out as draw */
    akv_event *io_ev;     /* recorded after the io upload: io_h may be rewritten once done */
    bool io_pending;
    /* graph replay of decode steps */
    bool recording;       /* launches go to rec instead of the device */
    fdev_rec rec;         /* this step's launches */
    fdev_rec graph_rec;   /* the launches `graph` was built from */
    akv_graph *graph;
    akv_forward_dev_stats stats;
};

/* The io upload's layout: ids [T] | positions [T] | prefill qo_indptr [T+1] | logit rows [L]. */
static size_t fdev_io_ints(const akv_forward_dev *f) {
    return 3 * (size_t)f->params.max_step_tokens + 1 + f->params.max_logits;
}
static size_t fdev_io_pos(const akv_forward_dev *f) {
    return f->params.max_step_tokens;
}
static size_t fdev_io_qo(const akv_forward_dev *f) {
    return 2 * (size_t)f->params.max_step_tokens;
}
static size_t fdev_io_rows(const akv_forward_dev *f) {
    return 3 * (size_t)f->params.max_step_tokens + 1;
}

static void fdev_rec_free(fdev_rec *r) {
    akv__free(r->ops);
    akv__free(r->args);
    memset(r, 0, sizeof *r);
}

/* Appends a launch to r (its arguments copied, 16-byte aligned, the gaps zeroed). */
static akv_status fdev_rec_add(fdev_rec *r, const akv_dev_op *op, const void *args, size_t bytes) {
    /* what akv_dev_op_launch checks for an eager launch; the record's layout relies on it */
    AKV_ASSERT(bytes == op->args_bytes);
    size_t at = fdev_rec_next(r->len);
    akv_status st = akv__array_reserve((void **)&r->ops, &r->cap_ops, r->n + 1, sizeof *r->ops);
    if (!st) st = akv__array_reserve((void **)&r->args, &r->args_cap, at + bytes, 1);
    if (st) return st;
    memset(r->args + r->len, 0, at - r->len);
    memcpy(r->args + at, args, bytes);
    r->ops[r->n++] = op;
    r->len = at + bytes;
    return AKV_OK;
}

static bool fdev_rec_equal(const fdev_rec *a, const fdev_rec *b) {
    return a->n == b->n && a->len == b->len && !memcmp(a->ops, b->ops, a->n * sizeof *a->ops) &&
           !memcmp(a->args, b->args, a->len);
}

/* Launches an op, or records it while a replayable step is being recorded. */
static akv_status fdev_launch(akv_forward_dev *f, const akv_dev_op *op, const void *args,
                              size_t bytes) {
    if (f->recording) return fdev_rec_add(&f->rec, op, args, bytes);
    return akv_dev_op_launch(f->dev, op, args, bytes);
}

#define FDEV_LAUNCH(f, op, a) fdev_launch((f), &(op), &(a), sizeof(a))

/* Bump allocator over one allocation: the next array of `bytes` at FDEV_ALIGN. With a zero
 * base it only measures. */
static akv_dptr fdev_take(akv_dptr base, size_t *off, size_t bytes) {
    size_t at = (*off + FDEV_ALIGN - 1) / FDEV_ALIGN * FDEV_ALIGN;
    *off = at + bytes;
    return akv_dptr_offset(base, at);
}

/* Bytes of a [rows][k] matrix of type t (0 = bf16). */
static size_t fdev_w_bytes(uint32_t t, size_t rows, size_t k) {
    return rows * akv_ops_wrow_bytes(t ? (akv_ops_wtype)t : AKV_OPS_W_BF16, k);
}

/* Places every weight at `base` (the matrices' types already chosen); returns the bytes
 * needed. */
static size_t fdev_layout_weights(akv_forward_dev *f, akv_dptr base) {
    const akv_model_config *c = &f->cfg;
    size_t off = 0, E = c->n_embd, bf = 2, f4 = 4;
    size_t big = f->output.type ? (size_t)c->n_vocab * E : 0; /* largest block matrix */
    f->tok_embd = fdev_take(base, &off, (size_t)c->n_vocab * E * bf);
    const size_t out_bytes = fdev_w_bytes(f->output.type, c->n_vocab, E);
    f->output.w =
        c->tied_output && !f->output.type ? f->tok_embd : fdev_take(base, &off, out_bytes);
    f->output_norm = fdev_take(base, &off, E * f4);
    f->inv_freq = fdev_take(base, &off, (size_t)(c->n_rot / 2) * f4);
    f->weight_bytes = out_bytes + E * f4;
    for (uint32_t l = 0; l < f->n_layers; l++) {
        fdev_layer *L = &f->layers[l];
        const struct {
            fdev_w *w;
            size_t rows, k;
        } ms[4] = {{&L->wqkv, f->qkv_dim, E},
                   {&L->wo, E, f->q_dim},
                   {&L->wgu, 2 * (size_t)c->n_ff, E},
                   {&L->wdown, E, c->n_ff}};
        L->attn_norm = fdev_take(base, &off, E * f4);
        L->bqkv = c->has_qkv_bias ? fdev_take(base, &off, (size_t)f->qkv_dim * f4) : (akv_dptr){0};
        L->qk_norm = c->has_qk_norm ? fdev_take(base, &off, 2 * (size_t)c->head_dim * f4) : (akv_dptr){0};
        L->ffn_norm = fdev_take(base, &off, E * f4);
        f->weight_bytes += 2 * E * f4 + (c->has_qkv_bias ? f->qkv_dim * f4 : 0) +
                           (c->has_qk_norm ? 2 * (size_t)c->head_dim * f4 : 0);
        for (int i = 0; i < 4; i++) {
            const size_t b = fdev_w_bytes(ms[i].w->type, ms[i].rows, ms[i].k);
            ms[i].w->w = fdev_take(base, &off, b);
            f->weight_bytes += b;
            if (ms[i].w->type && ms[i].rows * ms[i].k > big) big = ms[i].rows * ms[i].k;
        }
    }
    /* the block products of up to AKV_FWD_TILES_MAX_ROWS rows quantize x here; a product of
     * more rows (a prefill chunk) widens its matrix here first (akv_fwd_matmul_algo) */
    size_t k_max = c->n_ff > E ? c->n_ff : E;
    k_max = f->q_dim > k_max ? f->q_dim : k_max;
    const uint32_t T = f->params.max_step_tokens;
    const size_t xq = (size_t)akv_fwd_qgemv_scratch_bytes(
                     T < AKV_FWD_TILES_MAX_ROWS ? T : AKV_FWD_TILES_MAX_ROWS, (uint32_t)k_max),
                 widen = T > AKV_FWD_TILES_MAX_ROWS ? big * bf : 0;
    f->wscratch_bytes = f->is_host || !big ? 0 : widen > xq ? widen : xq;
    return off;
}

/* The draws' region: a row each, then the penalties' ids and counts. */
static size_t fdev_draw_bytes(const akv_forward_dev *f) {
    return (size_t)f->params.max_logits *
           (sizeof(akv_fwd_sample_row) + 2 * AKV_FORWARD_SAMPLE_PEN_MAX * sizeof(int32_t));
}

/* Places the scratch at `base`; returns the bytes needed. */
static size_t fdev_layout_scratch(akv_forward_dev *f, akv_dptr base) {
    const akv_model_config *c = &f->cfg;
    size_t off = 0, T = f->params.max_step_tokens, E = c->n_embd;
    f->x = fdev_take(base, &off, T * E * 4);
    f->h = fdev_take(base, &off, T * E * 2);
    f->qkv = fdev_take(base, &off, T * f->qkv_dim * 4);
    f->att = fdev_take(base, &off, T * f->q_dim * 2);
    f->gu = fdev_take(base, &off, T * 2 * c->n_ff * 4);
    f->act = fdev_take(base, &off, T * c->n_ff * 2);
    f->wscratch = f->wscratch_bytes ? fdev_take(base, &off, f->wscratch_bytes) : (akv_dptr){0};
    f->logits = fdev_take(base, &off, (size_t)f->params.max_logits * c->n_vocab * 4);
    f->chosen = fdev_take(base, &off, (size_t)f->params.max_logits * 4);
    f->draw = fdev_take(base, &off, fdev_draw_bytes(f));
    f->io = fdev_take(base, &off, fdev_io_ints(f) * 4);
    f->blas_ws = f->is_host ? (akv_dptr){0} : fdev_take(base, &off, FDEV_CUBLAS_WS);
    return off;
}

void akv_forward_dev_destroy(akv_forward_dev *f) {
    if (!f) return;
    /* akv_dev_mem_free and akv_dev_pinned_free wait for the device to be idle, so nothing
     * queued still uses what is freed. */
    for (int pt = 0; pt < 2; pt++)
        for (int i = 0; i < AKV_ATTN_MAX_QUERIES; i++) akv_dev_mem_free(f->dev, f->attn_ws[pt][i]);
    akv_dev_mem_free(f->dev, f->part_mem);
    akv_dev_mem_free(f->dev, f->widen_mem);
    akv_dev_mem_free(f->dev, f->smem_d);
    akv_dev_mem_free(f->dev, f->wmem);
    if (f->io_h) akv_dev_pinned_free(f->dev, f->io_h);
    if (f->logits_h) akv_dev_pinned_free(f->dev, f->logits_h);
    if (f->chosen_h) akv_dev_pinned_free(f->dev, f->chosen_h);
    if (f->draw_h) akv_dev_pinned_free(f->dev, f->draw_h);
    akv_dev_event_destroy(f->dev, f->io_ev);
    akv_dev_graph_destroy(f->dev, f->graph);
    fdev_rec_free(&f->rec);
    fdev_rec_free(&f->graph_rec);
    akv__free(f->groups);
    akv__free(f->layers);
    akv__free(f);
}

/* Whether the device pass has products over blocks of t (Q5_0 and Q5_1: host products only,
 * so the device widens them). */
static bool fdev_block_on_device(akv_ops_wtype t) {
    return akv_ops_wtype_is_block(t) && t != AKV_OPS_W_Q5_0 && t != AKV_OPS_W_Q5_1;
}

/* The block format the device keeps the matrices ms[0..n) in, fused: their common block type
 * when they share one, else 0 (bf16). */
static uint32_t fdev_common_type(const akv_model_mat *const *ms, int n) {
    for (int i = 0; i < n; i++)
        if (!fdev_block_on_device(ms[i]->type) || ms[i]->type != ms[0]->type) return 0;
    return ms[0]->type;
}

/* Each matrix's device type: the model's block formats (weights NATIVE), or the synthetic
 * type; bf16 otherwise. */
static akv_status fdev_choose_types(akv_forward_dev *f, const akv_model *m) {
    const akv_forward_params *p = &f->params;
    const akv_model_config *c = &f->cfg;
    if (p->weights != AKV_WEIGHTS_NATIVE && p->weights != AKV_WEIGHTS_BF16) {
        AKV_LOG_E("forward_dev: {=weights} %s: the device pass stores its matrices native or bf16",
                  akv_weights_name(p->weights));
        return AKV_EINVAL;
    }
    if (!m) {
        const uint32_t t = p->synthetic_type;
        if (t && (!fdev_block_on_device((akv_ops_wtype)t) ||
                  !akv_ops_wrow_bytes((akv_ops_wtype)t, c->n_embd) ||
                  !akv_ops_wrow_bytes((akv_ops_wtype)t, f->q_dim) ||
                  !akv_ops_wrow_bytes((akv_ops_wtype)t, c->n_ff))) {
            AKV_LOG_E("forward_dev: {=synthetic_type} %s cannot hold rows of %u, %u and %u weights",
                      akv_ops_wtype_name((akv_ops_wtype)t), c->n_embd, f->q_dim, c->n_ff);
            return AKV_EINVAL;
        }
        f->output.type = t;
        for (uint32_t l = 0; l < f->n_layers; l++)
            f->layers[l].wqkv.type = f->layers[l].wo.type = f->layers[l].wgu.type =
                f->layers[l].wdown.type = t;
        return AKV_OK;
    }
    if (p->weights == AKV_WEIGHTS_BF16) return AKV_OK;
    const akv_model_mat *out = akv_model_output(m);
    f->output.type = fdev_common_type(&out, 1);
    for (uint32_t l = 0; l < f->n_layers; l++) {
        const akv_model_layer *W = akv_model_get_layer(m, l);
        const akv_model_mat *qkv[3] = {&W->wq, &W->wk, &W->wv}, *gu[2] = {&W->w_gate, &W->w_up};
        const akv_model_mat *wo = &W->wo, *wd = &W->w_down;
        f->layers[l].wqkv.type = fdev_common_type(qkv, 3);
        f->layers[l].wo.type = fdev_common_type(&wo, 1);
        f->layers[l].wgu.type = fdev_common_type(gu, 2);
        f->layers[l].wdown.type = fdev_common_type(&wd, 1);
    }
    return AKV_OK;
}

/* Everything but the weights' values: checks, types, layout, allocations. m: the model whose
 * matrices' formats the device keeps (NULL: synthetic). */
static akv_status fdev_create_common(akv_dev *dev, const akv_model_config *c, const akv_model *m,
                                     const akv_forward_params *params, akv_forward_dev **out) {
    akv_forward_params p = params ? *params : akv_forward_default_params();
    if (p.max_step_tokens == 0) p.max_step_tokens = 256;
    if (p.max_logits == 0) p.max_logits = p.max_step_tokens;
    if (p.n_layers > c->n_layers || p.max_step_tokens > (1u << 20) || p.max_logits > p.max_step_tokens) {
        AKV_LOG_E("forward_dev: n_layers %u (the model has %u), {=max_step_tokens} %u or {=max_logits} %u "
                  "out of range",
                  p.n_layers, c->n_layers, p.max_step_tokens, p.max_logits);
        return AKV_EINVAL;
    }
    akv_dev_info info;
    akv_status st = akv_attn_tuning_check(&p.attn); /* logs the field */
    if (st || (st = akv_dev_get_info(dev, &info))) return st;
    if (c->has_post_norms || c->ffn_act != AKV_FFN_SWIGLU || c->n_swa || c->embd_scale != 1.0f ||
        c->attn_scale != 0.0f) {
        AKV_LOG_E("forward_dev: the device pass does not run %s models yet (post-norms, a GeGLU "
                  "gate, sliding-window layers, a scaled embedding); run it on the CPU "
                  "(--device cpu)",
                  c->arch_name);
        return AKV_EUNSUPPORTED;
    }
    if (!info.is_host && c->head_dim != 64 && c->head_dim != 128) {
        AKV_LOG_E("forward_dev: the model's head dimension %u is not supported by the %s "
                  "attention kernels (64 or 128); run it on the CPU",
                  c->head_dim, info.name);
        return AKV_EUNSUPPORTED;
    }
    akv_forward_dev *f = akv__calloc(1, sizeof *f);
    if (!f) return AKV_ENOMEM;
    f->dev = dev, f->cfg = *c, f->params = p;
    f->n_layers = p.n_layers ? p.n_layers : c->n_layers;
    f->is_host = info.is_host != 0;
    f->n_sm = (uint32_t)info.n_sm, f->smem_per_block = info.smem_per_block_bytes;
    f->q_dim = c->n_heads * c->head_dim, f->kv_dim = c->n_kv_heads * c->head_dim;
    f->qkv_dim = f->q_dim + 2 * f->kv_dim;
    f->layers = akv__calloc(f->n_layers, sizeof *f->layers);
    f->groups = akv__calloc(p.max_step_tokens, sizeof *f->groups);
    if (!f->layers || !f->groups) {
        akv_forward_dev_destroy(f);
        return AKV_ENOMEM;
    }
    if ((st = fdev_choose_types(f, m))) {
        akv_forward_dev_destroy(f);
        return st;
    }
    size_t wbytes = fdev_layout_weights(f, (akv_dptr){0});
    size_t sbytes = fdev_layout_scratch(f, (akv_dptr){0});
    if ((st = akv_dev_mem_alloc(dev, wbytes, &f->wmem)) ||
        (st = akv_dev_mem_alloc(dev, sbytes, &f->smem_d))) {
        AKV_LOG_E("forward_dev: %.2f GiB of weights and %.2f GiB of scratch (%u tokens a "
                  "chunk) do not fit the device: %s",
                  (double)wbytes / (1u << 30), (double)sbytes / (1u << 30), p.max_step_tokens,
                  akv_status_str(st));
        akv_forward_dev_destroy(f);
        return st;
    }
    fdev_layout_weights(f, f->wmem);
    fdev_layout_scratch(f, f->smem_d);
    if ((st = akv_dev_pinned_alloc(dev, fdev_io_ints(f) * sizeof(int32_t), (void **)&f->io_h)) ||
        (st = akv_dev_pinned_alloc(dev, (size_t)p.max_logits * c->n_vocab * sizeof(float),
                                   (void **)&f->logits_h)) ||
        (st = akv_dev_pinned_alloc(dev, (size_t)p.max_logits * sizeof(int32_t), (void **)&f->chosen_h)) ||
        (st = akv_dev_pinned_alloc(dev, fdev_draw_bytes(f), &f->draw_h)) ||
        (st = akv_dev_event_create(dev, 0, &f->io_ev))) {
        akv_forward_dev_destroy(f);
        return st;
    }
    *out = f;
    return AKV_OK;
}

/* Copies n f32 values to dst as dtype t (bf16: rounded in chunks through tmp). */
static akv_status fdev_put(akv_forward_dev *f, akv_dptr dst, const float *src, size_t n,
                           akv_dtype t, uint16_t *tmp) {
    if (t == AKV_DTYPE_F32) return akv_dev_copy_h2d_sync(f->dev, dst, src, n * sizeof(float));
    for (size_t i = 0; i < n; i += FDEV_UPLOAD_CHUNK) {
        size_t m = n - i < FDEV_UPLOAD_CHUNK ? n - i : FDEV_UPLOAD_CHUNK;
        for (size_t j = 0; j < m; j++)
            tmp[j] = akv_f32_to_bf16(src[i + j]);
        akv_status st = akv_dev_copy_h2d_sync(f->dev, akv_dptr_offset(dst, i * 2), tmp, m * 2);
        if (st) return st;
    }
    return AKV_OK;
}

/* Copies matrix w to dst as bf16, rows decoded (akv_model_mat_row_f32) and rounded in chunks
 * of whole rows through tmp (FDEV_UPLOAD_CHUNK elements) and row (w->cols floats). */
static akv_status fdev_put_mat(akv_forward_dev *f, akv_dptr dst, const akv_model_mat *w,
                               uint16_t *tmp, float *row) {
    const size_t k = w->cols, per = FDEV_UPLOAD_CHUNK / k ? FDEV_UPLOAD_CHUNK / k : 1;
    if (k > FDEV_UPLOAD_CHUNK) {
        AKV_LOG_E("forward_dev: rows of %zu weights are longer than the upload takes (%u)", k,
                  (unsigned)FDEV_UPLOAD_CHUNK);
        return AKV_EUNSUPPORTED;
    }
    for (size_t r0 = 0; r0 < w->rows; r0 += per) {
        const size_t nr = w->rows - r0 < per ? w->rows - r0 : per;
        for (size_t r = 0; r < nr; r++) {
            akv_status st = akv_model_mat_row_f32(w, (uint32_t)(r0 + r), row);
            if (st) return st;
            for (size_t i = 0; i < k; i++)
                tmp[r * k + i] = akv_f32_to_bf16(row[i]);
        }
        akv_status st =
            akv_dev_copy_h2d_sync(f->dev, akv_dptr_offset(dst, r0 * k * 2), tmp, nr * k * 2);
        if (st) return st;
    }
    return AKV_OK;
}

/* The fused matrix dst from its parts (rows one after another): their blocks as they are, or
 * widened to bf16. */
static akv_status fdev_put_w(akv_forward_dev *f, fdev_w dst, const akv_model_mat *const *parts,
                             int n_parts, uint16_t *tmp, float *row) {
    size_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        const akv_model_mat *w = parts[i];
        akv_status st;
        if (dst.type) {
            const size_t b = (size_t)w->rows * w->row_bytes;
            st = akv_dev_copy_h2d_sync(f->dev, akv_dptr_offset(dst.w, off), w->data, b);
            off += b;
        } else {
            st = fdev_put_mat(f, akv_dptr_offset(dst.w, off), w, tmp, row);
            off += (size_t)w->rows * w->cols * 2;
        }
        if (st) return st;
    }
    return AKV_OK;
}

static akv_status fdev_upload(akv_forward_dev *f, const akv_model *m) {
    const akv_model_config *c = &f->cfg;
    size_t E = c->n_embd, f4 = 4;
    uint16_t *tmp = akv__malloc(FDEV_UPLOAD_CHUNK * sizeof *tmp);
    size_t max_cols = c->n_ff > E ? c->n_ff : E; /* the widest matrix row */
    max_cols = f->q_dim > max_cols ? f->q_dim : max_cols;
    float *row = akv__malloc(max_cols * sizeof *row);
    if (!tmp || !row) {
        akv__free(tmp), akv__free(row);
        return AKV_ENOMEM;
    }
    const akv_dtype F = AKV_DTYPE_F32;
    const akv_model_mat *out = akv_model_output(m);
    akv_status st = fdev_put_mat(f, f->tok_embd, akv_model_tok_embd(m), tmp, row);
    if (!st && (!c->tied_output || f->output.type))
        st = fdev_put_w(f, f->output, &out, 1, tmp, row);
    if (!st) st = fdev_put(f, f->output_norm, akv_model_output_norm(m), E, F, tmp);
    if (!st) st = fdev_put(f, f->inv_freq, akv_model_rope_inv_freq(m), c->n_rot / 2, F, tmp);
    for (uint32_t l = 0; l < f->n_layers && !st; l++) {
        const akv_model_layer *W = akv_model_get_layer(m, l);
        const fdev_layer *L = &f->layers[l];
        if (!st) st = fdev_put(f, L->attn_norm, W->attn_norm, E, F, tmp);
        const akv_model_mat *qkv[3] = {&W->wq, &W->wk, &W->wv}, *gu[2] = {&W->w_gate, &W->w_up};
        const akv_model_mat *wo = &W->wo, *wd = &W->w_down;
        if (!st) st = fdev_put_w(f, L->wqkv, qkv, 3, tmp, row);
        if (!st && c->has_qkv_bias) {
            st = fdev_put(f, L->bqkv, W->bq, f->q_dim, F, tmp);
            if (!st) st = fdev_put(f, akv_dptr_offset(L->bqkv, f->q_dim * f4), W->bk, f->kv_dim, F, tmp);
            if (!st)
                st = fdev_put(f, akv_dptr_offset(L->bqkv, (f->q_dim + f->kv_dim) * f4), W->bv,
                              f->kv_dim, F, tmp);
        }
        if (!st && c->has_qk_norm) {
            st = fdev_put(f, L->qk_norm, W->q_norm, c->head_dim, F, tmp);
            if (!st) st = fdev_put(f, akv_dptr_offset(L->qk_norm, c->head_dim * f4), W->k_norm, c->head_dim, F, tmp);
        }
        if (!st) st = fdev_put_w(f, L->wo, &wo, 1, tmp, row);
        if (!st) st = fdev_put(f, L->ffn_norm, W->ffn_norm, E, F, tmp);
        if (!st) st = fdev_put_w(f, L->wgu, gu, 2, tmp, row);
        if (!st) st = fdev_put_w(f, L->wdown, &wd, 1, tmp, row);
    }
    akv__free(tmp), akv__free(row);
    return st; /* synchronous copies: every byte has landed (dev.h) */
}

akv_status akv_forward_dev_create(akv_dev *dev, const akv_model *model,
                                  const akv_forward_params *params, akv_forward_dev **out) {
    if (!dev || !model || !out) return AKV_EINVAL;
    akv_forward_dev *f = NULL;
    akv_status st = fdev_create_common(dev, akv_model_get_config(model), model, params, &f);
    if (st) return st;
    if ((st = fdev_upload(f, model))) {
        akv_forward_dev_destroy(f);
        return st;
    }
    *out = f;
    return AKV_OK;
}

/* A synthetic matrix [rows][k] of weights about +-amp: fill values, or blocks whose scales
 * bound their values by about amp (the quants are random bytes). */
static akv_status fdev_fill_w(akv_forward_dev *f, fdev_w w, size_t rows, size_t k, uint64_t seed,
                              float amp) {
    if (!w.type) {
        akv_fwd_fill_args a = {
            .y = w.w, .n = rows * k, .seed = seed, .scale = amp, .y_dtype = AKV_DTYPE_BF16};
        return FDEV_LAUNCH(f, akv_fwd_op_fill, a);
    }
    /* the first scale field and the second (Q4_1's minimum, the K formats' dmin) */
    float d = amp / 127, d2 = 0;
    switch (w.type) {
    case AKV_OPS_W_Q4_0:
        d = amp / 8;
        break;
    case AKV_OPS_W_Q4_1:
        d = amp / 8, d2 = -amp;
        break;
    case AKV_OPS_W_Q4_K:
        d = 2 * amp / (63 * 15), d2 = amp / 63;
        break;
    case AKV_OPS_W_Q5_K:
        d = 2 * amp / (63 * 31), d2 = amp / 63;
        break;
    case AKV_OPS_W_Q6_K:
        d = amp / (128 * 32);
        break;
    default:
        break;
    }
    akv_fwd_fill_args a = {.y = w.w,
                           .n = fdev_w_bytes(w.type, rows, k),
                           .seed = seed,
                           .scale = d,
                           .center = d2,
                           .w_type = w.type};
    return FDEV_LAUNCH(f, akv_fwd_op_fill, a);
}

/* One fill of n elements (see akv_fwd_fill_args). */
static akv_status fdev_fill(akv_forward_dev *f, akv_dptr y, size_t n, akv_dtype t, uint64_t seed,
                            float center, float scale) {
    akv_fwd_fill_args a = {
        .y = y, .n = n, .seed = seed, .center = center, .scale = scale, .y_dtype = t};
    return FDEV_LAUNCH(f, akv_fwd_op_fill, a);
}

akv_status akv_forward_dev_create_synthetic(akv_dev *dev, const akv_model_config *c,
                                            uint64_t seed, const akv_forward_params *params,
                                            akv_forward_dev **out) {
    if (!dev || !c || !out) return AKV_EINVAL;
    float *inv = akv__malloc((c->n_rot / 2 + 1) * sizeof(float));
    if (!inv) return AKV_ENOMEM;
    akv_status st = akv_ops_ref_rope_freqs(c->rope_base, c->n_rot, c->rope_freq_scale, NULL, inv);
    akv_forward_dev *f = NULL;
    if (!st) st = fdev_create_common(dev, c, NULL, params, &f);
    if (st) {
        akv__free(inv);
        return st;
    }
    size_t E = c->n_embd;
    const akv_dtype B = AKV_DTYPE_BF16, F = AKV_DTYPE_F32;
    float se = 1.0f / sqrtf((float)E), sq = 1.0f / sqrtf((float)f->q_dim),
          sf = 1.0f / sqrtf((float)c->n_ff);
    uint64_t s = seed * 1000003u;
    st = fdev_fill(f, f->tok_embd, (size_t)c->n_vocab * E, B, s++, 0, 1);
    if (!st && (!c->tied_output || f->output.type))
        st = fdev_fill_w(f, f->output, c->n_vocab, E, s++, se);
    if (!st) st = fdev_fill(f, f->output_norm, E, F, s++, 1, 0.1f);
    if (!st) st = akv_dev_copy_h2d_sync(dev, f->inv_freq, inv, c->n_rot / 2 * sizeof(float));
    for (uint32_t l = 0; l < f->n_layers && !st; l++) {
        const fdev_layer *L = &f->layers[l];
        if (!st) st = fdev_fill(f, L->attn_norm, E, F, s++, 1, 0.1f);
        if (!st) st = fdev_fill_w(f, L->wqkv, f->qkv_dim, E, s++, se);
        if (!st && c->has_qkv_bias) st = fdev_fill(f, L->bqkv, f->qkv_dim, F, s++, 0, 0.1f);
        if (!st && c->has_qk_norm) st = fdev_fill(f, L->qk_norm, 2 * (size_t)c->head_dim, F, s++, 1, 0.1f);
        if (!st) st = fdev_fill_w(f, L->wo, E, f->q_dim, s++, sq);
        if (!st) st = fdev_fill(f, L->ffn_norm, E, F, s++, 1, 0.1f);
        if (!st) st = fdev_fill_w(f, L->wgu, 2 * (size_t)c->n_ff, E, s++, se);
        if (!st) st = fdev_fill_w(f, L->wdown, E, c->n_ff, s++, sf);
    }
    akv__free(inv);
    if (!st) st = akv_dev_sync(dev);
    if (st) {
        akv_forward_dev_destroy(f);
        return st;
    }
    *out = f;
    return AKV_OK;
}

uint64_t akv_forward_dev_weight_bytes(const akv_forward_dev *f) {
    return f->weight_bytes;
}

float *akv_forward_dev_logits_buffer(akv_forward_dev *f) {
    return f->logits_h;
}

akv_forward_dev_stats akv_forward_dev_get_stats(const akv_forward_dev *f) {
    return f->stats;
}

const akv_model_config *akv_forward_dev_config(const akv_forward_dev *f) {
    return &f->cfg;
}

/* The decode workspace of part `pt` (0: exact, 1: past) and query count n_query for this
 * table's split, grown when a longer
 * capacity needs more. Its layout (where the arrival counters lie) follows the batch, the
 * split and the query count: a decode with another layout than the last one's finds its
 * counters where partial states were, so the workspace is zeroed again (a group whose size
 * changed; a capacity that changes the split). Each query count has its own workspace, so the
 * groups of one step (one-token decodes beside a chunk of 3) do not re-zero each other's. */
static akv_status fdev_attn_ws(akv_forward_dev *f, const akv_attn_decode *d, uint32_t pt,
                               akv_dptr *ws, size_t *ws_bytes) {
    *ws = (akv_dptr){0}, *ws_bytes = 0;
    if (f->is_host) return AKV_OK; /* the ref needs none */
    const uint32_t qi = d->n_query - 1;
    akv_attn_split sp;
    size_t need = 0;
    akv_status st = akv_attn_split_plan((uint64_t)d->kv.max_pages * d->kv.page_tokens, d->kv.n_seq,
                                        d->kv.n_kv_heads, d->kv.head_dim, f->n_sm,
                                        f->smem_per_block, &d->tuning, &sp);
    if (st || (st = akv_attn_decode_workspace_bytes(d, &sp, &need))) return st;
    if (need == 0) return AKV_OK; /* one partition: the workspace is not touched */
    const uint32_t layout[3] = {d->kv.n_seq, sp.n_parts, d->n_query};
    const bool same = memcmp(layout, f->attn_ws_layout[pt][qi], sizeof layout) == 0;
    if (need > f->attn_ws_bytes[pt][qi]) {
        /* the free waits for the device to be idle: no decode in flight still uses the old one
         * (a failed allocation leaves 0 bytes: the next call grows again) */
        if ((st = akv_dev_mem_free(f->dev, f->attn_ws[pt][qi]))) return st;
        f->attn_ws[pt][qi] = (akv_dptr){0}, f->attn_ws_bytes[pt][qi] = 0;
        if ((st = akv_dev_mem_alloc(f->dev, need, &f->attn_ws[pt][qi]))) return st;
        f->attn_ws_bytes[pt][qi] = need;
    } else if (same) {
        *ws = f->attn_ws[pt][qi], *ws_bytes = f->attn_ws_bytes[pt][qi];
        return AKV_OK;
    }
    /* the split's arrival counters start at zero (akv/attn.h); every completed decode leaves
     * them at zero. On the compute queue, so it is ordered before the decode. */
    if ((st = akv_dev_memset_async(f->dev, AKV_QUEUE_COMPUTE, f->attn_ws[pt][qi], 0, need))) return st;
    memcpy(f->attn_ws_layout[pt][qi], layout, sizeof layout);
    *ws = f->attn_ws[pt][qi], *ws_bytes = f->attn_ws_bytes[pt][qi];
    return AKV_OK;
}

/* Where a group's attention writes its states: into att (bf16, one part), or part pt's f32
 * states from the group's first row (two parts, merged after). */
typedef struct fdev_out {
    akv_dptr o, lse;
    akv_dtype o_dtype;
} fdev_out;

static fdev_out fdev_out_of(const akv_forward_dev *f, const akv__fwd_group *g, uint32_t n_parts,
                            uint32_t pt) {
    if (n_parts == 1)
        return (fdev_out){akv_dptr_offset(f->att, (size_t)g->row0 * f->q_dim * 2), (akv_dptr){0},
                          AKV_DTYPE_BF16};
    return (fdev_out){akv_dptr_offset(f->part_o[pt], (size_t)g->row0 * f->q_dim * 4),
                      akv_dptr_offset(f->part_lse[pt], (size_t)g->row0 * f->cfg.n_heads * 4),
                      AKV_DTYPE_F32};
}

/* A group's decode over the view of a part: its queries the f32 qkv rows from the group's
 * first row on. History prefetch (akv/attn.h) holds: what may still run as it starts is the end
 * of the layer's qkv product (it never lets its successor start early, so all before it has
 * completed), the bias add, RoPE (the scratch), the appends and an earlier decode of other
 * rows or another part (their rows and outputs); tables and filled or compact pages arrive by
 * copies or behind event waits, and no kernel writes a past part. */
static akv_fwd_attn_decode_args fdev_decode_args(const akv_forward_dev *f, akv_attn_pages view,
                                                 const akv__fwd_group *g, fdev_out out) {
    return (akv_fwd_attn_decode_args){
        .p = {.kv = view,
              .n_heads = f->cfg.n_heads,
              .n_query = g->n_new,
              .q = akv_dptr_offset(f->qkv, (size_t)g->row0 * f->qkv_dim * 4),
              .q_dtype = AKV_DTYPE_F32,
              .q_stride = f->qkv_dim,
              .o = out.o,
              .o_dtype = out.o_dtype,
              .lse = out.lse,
              .prefetch_history = true,
              .tuning = f->params.attn}};
}

/* A prefill group's call over the view of a part: its queries the f32 qkv rows from the group's
 * first row on, its rows' qo_indptr in the io upload; no K/V written (the exact part's call
 * adds it). */
static akv_fwd_attn_prefill_args fdev_prefill_args(const akv_forward_dev *f, akv_attn_pages view,
                                                   const akv__fwd_group *g, fdev_out out) {
    return (akv_fwd_attn_prefill_args){
        .p = {.kv = view,
              .n_heads = f->cfg.n_heads,
              .qo_indptr = akv_dptr_offset(f->io, fdev_io_qo(f) * 4),
              .n_tokens = g->n_rows,
              .max_chunk = g->n_new,
              .q = akv_dptr_offset(f->qkv, (size_t)g->row0 * f->qkv_dim * 4),
              .q_dtype = AKV_DTYPE_F32,
              .q_stride = f->qkv_dim,
              .o = out.o,
              .o_dtype = out.o_dtype,
              .lse = out.lse}};
}

/* One group's attention over its exact part: its K/V into the pages, then attend (Q, K, V are
 * the f32 qkv rows from the group's first row on). The prefill group's qo_indptr is in the io
 * upload. */
static akv_status fdev_attend(akv_forward_dev *f, const akv_attn_pages *pg, const akv__fwd_group *g,
                              fdev_out out) {
    const size_t row = (size_t)g->row0 * f->qkv_dim * 4;
    akv_dptr k = akv_dptr_offset(f->qkv, row + (size_t)f->q_dim * 4),
             v = akv_dptr_offset(f->qkv, row + (size_t)(f->q_dim + f->kv_dim) * 4);
    akv_attn_pages view = akv__forward_view(pg, g);
    akv_status st;
    if (g->decode) {
        akv_fwd_attn_append_args ap = {.p = {.kv = view,
                                             .n_per_seq = g->n_new,
                                             .n_tokens = g->n_rows,
                                             .max_new = g->n_new,
                                             .k = k,
                                             .v = v,
                                             .dtype = AKV_DTYPE_F32,
                                             .stride = f->qkv_dim}};
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_attn_append, ap))) return st;
        akv_fwd_attn_decode_args d = fdev_decode_args(f, view, g, out);
        if ((st = fdev_attn_ws(f, &d.p, 0, &d.workspace, &d.workspace_bytes))) return st;
        return FDEV_LAUNCH(f, akv_fwd_op_attn_decode, d);
    }
    akv_fwd_attn_prefill_args pf = fdev_prefill_args(f, view, g, out);
    pf.p.k_new = k, pf.p.v_new = v, pf.p.kv_new_dtype = AKV_DTYPE_F32, pf.p.kv_stride = f->qkv_dim;
    return FDEV_LAUNCH(f, akv_fwd_op_attn_prefill, pf);
}

/* The widened pages of a prompt chunk's past part: room for n_seq x max_out exact pages of
 * page_bytes and their table, grown when a step needs more (the free waits for the device to
 * be idle: nothing in flight still reads the old one). */
static akv_status fdev_widen_mem(akv_forward_dev *f, uint32_t n_seq, uint32_t max_out,
                                 size_t page_bytes, akv_attn_widen *w) {
    const size_t n_pages = (size_t)n_seq * max_out, pages_bytes = n_pages * page_bytes;
    const size_t need = pages_bytes + (2 * (size_t)n_seq + 1 + n_pages) * sizeof(int32_t);
    akv_status st;
    if (need > f->widen_bytes) {
        if ((st = akv_dev_mem_free(f->dev, f->widen_mem))) return st;
        f->widen_mem = (akv_dptr){0}, f->widen_bytes = 0;
        if ((st = akv_dev_mem_alloc(f->dev, need, &f->widen_mem))) return st;
        f->widen_bytes = need;
    }
    w->out_pool = f->widen_mem;
    w->out_indptr = akv_dptr_offset(f->widen_mem, pages_bytes);
    w->out_last = akv_dptr_offset(w->out_indptr, ((size_t)n_seq + 1) * sizeof(int32_t));
    w->out_indices = akv_dptr_offset(w->out_last, (size_t)n_seq * sizeof(int32_t));
    return AKV_OK;
}

/* A prefill group's attention over its past part: the prefill kernel over the part with no
 * causal mask (every key before every row). A compact part is widened first into exact pages
 * (akv_attn_widen: the prefill is bound by its products, a page is widened in one pass over
 * its bytes), max_out pages of each sequence at a time so the widened pages stay within
 * about FDEV_WIDEN_BYTES; each piece after the first is attended into the third states and
 * merged into the part's. The pieces cover every past page: a sequence whose chunk starts at
 * pos0 has at most ceil(pos0 / P) pages before it. */
static akv_status fdev_attend_past_prefill(akv_forward_dev *f, const akv_attn_pages *pg,
                                           const akv__fwd_group *g, fdev_out out) {
    const akv_model_config *c = &f->cfg;
    const akv_attn_pages view = akv__forward_view(pg, g);
    akv_fwd_attn_prefill_args pf = fdev_prefill_args(f, view, g, out);
    if (view.repr == AKV_REPR_EXACT) return FDEV_LAUNCH(f, akv_fwd_op_attn_prefill, pf);

    const uint32_t P = view.page_tokens, n_seq = view.n_seq;
    uint32_t most = 0; /* the most past pages of any of the group's sequences */
    for (uint32_t s = g->s0; s < g->s1; s++) {
        const uint32_t n = (uint32_t)((f->pos0[s] + (uint64_t)P - 1) / P);
        most = n > most ? n : most;
    }
    if (most > view.max_pages) most = view.max_pages;
    if (most == 0) most = 1; /* still one call: it writes every row's (empty) states */
    akv_repr_layout le;
    akv_status st = akv_repr_layout_of(AKV_REPR_EXACT, view.dtype, view.n_kv_heads, P,
                                       view.head_dim, &le);
    if (st) return st;
    uint64_t fit = FDEV_WIDEN_BYTES / ((uint64_t)n_seq * le.page_bytes);
    const uint32_t max_out = fit < 1 ? 1 : fit < most ? (uint32_t)fit : most;
    akv_fwd_attn_widen_args w = {.p = {.kv = view, .max_out = max_out}};
    if ((st = fdev_widen_mem(f, n_seq, max_out, le.page_bytes, &w.p))) return st;
    pf.p.kv = (akv_attn_pages){.pool = w.p.out_pool,
                               .indptr = w.p.out_indptr,
                               .indices = w.p.out_indices,
                               .last_page_len = w.p.out_last,
                               .n_seq = n_seq,
                               .n_pages = n_seq * max_out,
                               .max_pages = max_out,
                               .n_kv_heads = view.n_kv_heads,
                               .head_dim = view.head_dim,
                               .page_tokens = P,
                               .dtype = view.dtype,
                               .past = 1};
    const size_t o_at = (size_t)g->row0 * f->q_dim * 4, l_at = (size_t)g->row0 * c->n_heads * 4;
    for (uint32_t first = 0; first < most; first += max_out) {
        const bool more = first > 0; /* a piece after the first: into the third states */
        w.p.first = first;
        pf.p.o = more ? akv_dptr_offset(f->part_o[2], o_at) : out.o;
        pf.p.lse = more ? akv_dptr_offset(f->part_lse[2], l_at) : out.lse;
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_attn_widen, w)) ||
            (st = FDEV_LAUNCH(f, akv_fwd_op_attn_prefill, pf)))
            return st;
        if (!more) continue;
        akv_fwd_attn_merge_args m = {.p = {.n_rows = g->n_rows * c->n_heads,
                                           .head_dim = c->head_dim,
                                           .o_a = out.o,
                                           .lse_a = out.lse,
                                           .o_b = pf.p.o,
                                           .lse_b = pf.p.lse,
                                           .o = out.o,
                                           .o_dtype = AKV_DTYPE_F32,
                                           .lse = out.lse}};
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_attn_merge, m))) return st;
    }
    return AKV_OK;
}

/* One group's attention over a past part (older history, compact or exact: every key before
 * every query, nothing written): a decode group in one call (its split and workspace as the
 * exact part's), a prefill group through the prefill kernel (fdev_attend_past_prefill). */
static akv_status fdev_attend_past(akv_forward_dev *f, const akv_attn_pages *pg,
                                   const akv__fwd_group *g, fdev_out out) {
    if (!g->decode) return fdev_attend_past_prefill(f, pg, g, out);
    akv_fwd_attn_decode_args d = fdev_decode_args(f, akv__forward_view(pg, g), g, out);
    akv_status st = fdev_attn_ws(f, &d.p, 1, &d.workspace, &d.workspace_bytes);
    return st ? st : FDEV_LAUNCH(f, akv_fwd_op_attn_decode, d);
}

/* A layer's attention over its parts, group by group: one part straight into att; two parts
 * (the exact one and a past one) each into its f32 states, merged exactly into att. */
static akv_status fdev_attend_parts(akv_forward_dev *f, const akv_kv_parts *parts, uint32_t n,
                                    uint32_t n_groups) {
    akv_status st;
    const bool host = parts->host_o.addr != 0; /* the host part's states, merged last */
    const uint32_t np = parts->n_parts + host; /* states to merge */
    if (host && f->recording) return AKV_ESTATE; /* a host function: not replayable */
    if (np > 1 && !f->part_mem.addr) {
        const size_t o_bytes = (size_t)f->params.max_step_tokens * f->q_dim * 4,
                     l_bytes = (size_t)f->params.max_step_tokens * f->cfg.n_heads * 4;
        if (f->recording) return AKV_ESTATE; /* the hooks that give parts are not replayable */
        if ((st = akv_dev_mem_alloc(f->dev, 3 * (o_bytes + l_bytes), &f->part_mem))) return st;
        for (int pt = 0; pt < 3; pt++) {
            f->part_o[pt] = akv_dptr_offset(f->part_mem, (size_t)pt * o_bytes);
            f->part_lse[pt] = akv_dptr_offset(f->part_mem, 3 * o_bytes + (size_t)pt * l_bytes);
        }
    }
    for (uint32_t gi = 0; gi < n_groups; gi++) {
        const akv__fwd_group *g = &f->groups[gi];
        if ((st = fdev_attend(f, &parts->part[0].kv, g, fdev_out_of(f, g, np, 0)))) return st;
        if (parts->n_parts > 1 &&
            (st = fdev_attend_past(f, &parts->part[1].kv, g, fdev_out_of(f, g, np, 1))))
            return st;
    }
    if (np == 1) return AKV_OK;
    akv_fwd_attn_merge_args m = {.p = {.n_rows = n * f->cfg.n_heads,
                                       .head_dim = f->cfg.head_dim,
                                       .o_a = f->part_o[0],
                                       .lse_a = f->part_lse[0],
                                       .o_b = f->part_o[1],
                                       .lse_b = f->part_lse[1],
                                       .o = f->att,
                                       .o_dtype = AKV_DTYPE_BF16}};
    if (parts->n_parts > 1) {
        if (host) /* the device's parts into the first states, the host's merged after */
            m.p.o = f->part_o[0], m.p.o_dtype = AKV_DTYPE_F32, m.p.lse = f->part_lse[0];
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_attn_merge, m)) || !host) return st;
    }
    /* the host part: its states are there in the compute queue's order (the route's work) */
    m.p.o_b = parts->host_o, m.p.lse_b = parts->host_lse;
    m.p.o = f->att, m.p.o_dtype = AKV_DTYPE_BF16, m.p.lse = (akv_dptr){0};
    return FDEV_LAUNCH(f, akv_fwd_op_attn_merge, m);
}

/* y[m][n] (+)= x W^T */
static akv_status fdev_matmul(akv_forward_dev *f, akv_dptr y, akv_dptr x, fdev_w w, uint32_t m,
                              uint32_t n, uint32_t k, uint32_t beta) {
    akv_fwd_matmul_args a = {.y = y,
                             .x = x,
                             .w = w.w,
                             .w_type = w.type,
                             .scratch = f->wscratch,
                             .scratch_bytes = f->wscratch_bytes,
                             .m = m,
                             .n = n,
                             .k = k,
                             .beta = beta,
                             .workspace = f->blas_ws,
                             .workspace_bytes = f->blas_ws.addr ? FDEV_CUBLAS_WS : 0};
    return FDEV_LAUNCH(f, akv_fwd_op_matmul, a);
}

static akv_status fdev_rmsnorm_rows(akv_forward_dev *f, akv_dptr y, akv_dptr x, akv_dptr w,
                                    uint32_t n_rows, akv_dptr rows) {
    akv_fwd_rmsnorm_args a = {.y = y,
                              .x = x,
                              .w = w,
                              .rows = rows,
                              .n_rows = n_rows,
                              .n = f->cfg.n_embd,
                              .eps = f->cfg.rms_eps,
                              .y_dtype = AKV_DTYPE_BF16};
    return FDEV_LAUNCH(f, akv_fwd_op_rmsnorm, a);
}

static akv_status fdev_rmsnorm(akv_forward_dev *f, akv_dptr y, akv_dptr x, akv_dptr w,
                               uint32_t n_rows) {
    return fdev_rmsnorm_rows(f, y, x, w, n_rows, (akv_dptr){0});
}

/* One block over the step's n rows: attention sub-block (a call per group), then feed-forward,
 * each added into the residual x. While recording, end_layer is left to the caller (it runs
 * after the graph). */
static akv_status fdev_layer_run(akv_forward_dev *f, uint32_t l, uint32_t n, uint32_t n_seq,
                                 uint32_t n_groups, const akv_kv_hooks *kv) {
    const akv_model_config *c = &f->cfg;
    const fdev_layer *L = &f->layers[l];
    akv_status st;
    if ((st = fdev_rmsnorm(f, f->h, f->x, L->attn_norm, n)) ||
        (st = fdev_matmul(f, f->qkv, f->h, L->wqkv, n, f->qkv_dim, c->n_embd, 0)))
        return st;
    if (c->has_qkv_bias) {
        akv_fwd_add_args b = {.y = f->qkv, .a = L->bqkv, .n_rows = n, .n = f->qkv_dim};
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_add, b))) return st;
    }
    if (c->has_qk_norm) { /* qwen3: every Q and K head normalised before its rotation */
        akv_fwd_head_norm_args hn = {.x = f->qkv,
                                     .wa = L->qk_norm,
                                     .wb = akv_dptr_offset(L->qk_norm, (size_t)c->head_dim * 4),
                                     .n_tokens = n,
                                     .n_a = c->n_heads,
                                     .n_b = c->n_kv_heads,
                                     .head_dim = c->head_dim,
                                     .stride = f->qkv_dim,
                                     .eps = c->rms_eps};
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_head_norm, hn))) return st;
    }
    /* RoPE over Q and K in one launch: a row's K heads follow its Q heads (the qkv layout),
     * so they are heads n_heads .. n_heads + n_kv_heads - 1 of the same rows */
    akv_fwd_rope_args rqk = {.x = f->qkv,
                             .pos = akv_dptr_offset(f->io, fdev_io_pos(f) * 4),
                             .inv_freq = f->inv_freq,
                             .n_tokens = n,
                             .n_heads = c->n_heads + c->n_kv_heads,
                             .head_dim = c->head_dim,
                             .n_rot = c->n_rot,
                             .stride = f->qkv_dim,
                             .mode = c->rope_mode};
    if ((st = FDEV_LAUNCH(f, akv_fwd_op_rope, rqk))) return st;

    /* the history: the hook places the pages, the attention writes and reads them */
    akv_kv_parts parts;
    memset(&parts, 0, sizeof parts);
    parts.q = f->qkv, parts.q_stride = f->qkv_dim, parts.n_heads = c->n_heads;
    if ((st = kv->begin_layer(kv->user, l, &parts)) ||
        (st = akv__forward_parts_check(&f->cfg, "forward_dev", l, &parts, n_seq, n, 2)) ||
        (st = fdev_attend_parts(f, &parts, n, n_groups)))
        return st;
    if (!f->recording && kv->end_layer && (st = kv->end_layer(kv->user, l))) return st;
    if ((st = fdev_matmul(f, f->x, f->att, L->wo, n, c->n_embd, f->q_dim, 1))) return st;

    /* feed-forward: one product for gate and up, SwiGLU, down into the residual */
    if ((st = fdev_rmsnorm(f, f->h, f->x, L->ffn_norm, n)) ||
        (st = fdev_matmul(f, f->gu, f->h, L->wgu, n, 2 * c->n_ff, c->n_embd, 0)))
        return st;
    akv_fwd_swiglu_args sw = {.y = f->act,
                              .gate = f->gu,
                              .up = akv_dptr_offset(f->gu, (size_t)c->n_ff * 4),
                              .n_rows = n,
                              .n = c->n_ff,
                              .in_stride = 2 * c->n_ff,
                              .y_dtype = AKV_DTYPE_BF16};
    if ((st = FDEV_LAUNCH(f, akv_fwd_op_swiglu, sw))) return st;
    return fdev_matmul(f, f->x, f->act, L->wdown, n, c->n_embd, c->n_ff, 1);
}

/* A replayable decode step (one token per sequence): record the embedding and every layer,
 * build a graph when the record differs from the current graph's, launch it, then every
 * end_layer. */
static akv_status fdev_replay(akv_forward_dev *f, const akv_fwd_embed_args *e, uint32_t n_seq,
                              uint32_t n_groups, const akv_kv_hooks *kv) {
    akv_status st;
    f->rec.n = f->rec.len = 0;
    f->recording = true;
    st = FDEV_LAUNCH(f, akv_fwd_op_embed, *e);
    for (uint32_t l = 0; l < f->n_layers && !st; l++)
        st = fdev_layer_run(f, l, n_seq, n_seq, n_groups, kv);
    f->recording = false;
    if (st) return st;
    if (!f->graph || !fdev_rec_equal(&f->rec, &f->graph_rec)) {
        akv_dev_launch *ls = akv__malloc(f->rec.n * sizeof *ls);
        if (!ls) return AKV_ENOMEM;
        for (size_t i = 0, at = 0; i < f->rec.n; at += f->rec.ops[i]->args_bytes, i++) {
            at = fdev_rec_next(at);
            ls[i] = (akv_dev_launch){.op = f->rec.ops[i], .args = f->rec.args + at};
        }
        akv_graph *g = NULL;
        st = akv_dev_graph_create(f->dev, ls, f->rec.n, &g);
        akv__free(ls);
        if (st) return st;
        akv_dev_graph_destroy(f->dev, f->graph); /* in flight: freed when done */
        f->graph = g;
        fdev_rec tmp = f->graph_rec; /* the record becomes the graph's; reuse the old buffers */
        f->graph_rec = f->rec, f->rec = tmp;
        f->stats.graph_builds++;
    }
    if ((st = akv_dev_graph_launch(f->dev, f->graph))) return st;
    f->stats.graph_launches++;
    for (uint32_t l = 0; kv->end_layer && l < f->n_layers; l++)
        if ((st = kv->end_layer(kv->user, l))) return st;
    return AKV_OK;
}

/* The draws of a step's logit rows (b's SAMPLE rows theirs, its ARGMAX rows greedy, every
 * other row none), uploaded with their penalties, and the sample op over every row; the tokens
 * land in f->chosen. */
static akv_status fdev_draw(akv_forward_dev *f, const akv_forward_batch *b, uint32_t n_rows) {
    akv_fwd_sample_row *rows = f->draw_h;
    int32_t *pen = (int32_t *)(rows + f->params.max_logits);
    uint32_t n_pen = 0;
    for (uint32_t r = 0; r < n_rows; r++) rows[r] = (akv_fwd_sample_row){.temp = -1.0f};
    for (uint32_t s = 0, r = 0; s < b->n_seq; s++) {
        const uint8_t mode = akv_forward_batch_mode(b, s);
        const uint32_t k = akv_forward_mode_rows(mode, b->n_new[s]);
        if (mode == AKV_FORWARD_LOGITS_ARGMAX) rows[r] = (akv_fwd_sample_row){.temp = 0.0f, .top_p = 1.0f,
                                                                              .repeat_penalty = 1.0f};
        if (mode == AKV_FORWARD_LOGITS_SAMPLE) {
            rows[r] = b->sample[s];
            rows[r].pen_off = n_pen;
            memcpy(pen + n_pen, b->pen + b->sample[s].pen_off, b->sample[s].pen_n * sizeof *pen);
            n_pen += b->sample[s].pen_n;
        }
        r += k;
    }
    /* the counts after the ids (the op's [2][n_pen]): each row's at the same offset */
    for (uint32_t s = 0, at = 0; s < b->n_seq; s++)
        if (akv_forward_batch_mode(b, s) == AKV_FORWARD_LOGITS_SAMPLE) {
            memcpy(pen + n_pen + at, b->pen + b->n_pen + b->sample[s].pen_off,
                   b->sample[s].pen_n * sizeof *pen);
            at += b->sample[s].pen_n;
        }
    const size_t rows_bytes = (size_t)f->params.max_logits * sizeof *rows;
    akv_status st = akv_dev_copy_h2d_async(f->dev, AKV_QUEUE_COMPUTE, f->draw, f->draw_h,
                                           rows_bytes + 2 * (size_t)n_pen * sizeof *pen);
    /* io_ev covers this upload too: the next step waits for it before writing draw_h, should
     * this one fail before its sync */
    if (!st && !(st = akv_dev_event_record(f->dev, f->io_ev, AKV_QUEUE_COMPUTE))) f->io_pending = true;
    if (st) return st;
    akv_fwd_sample_args sa = {.y = f->chosen, .x = f->logits, .rows = f->draw,
                              .pen = akv_dptr_offset(f->draw, rows_bytes),
                              .n_rows = n_rows, .n = f->cfg.n_vocab, .n_pen = n_pen};
    return FDEV_LAUNCH(f, akv_fwd_op_sample, sa);
}

/* Steps 1-3 of a checked step (akv_forward_dev_step): n tokens in all. */
static akv_status fdev_step(akv_forward_dev *f, const akv_forward_batch *b, uint32_t n,
                            const akv_kv_hooks *kv, float *logits) {
    const akv_model_config *c = &f->cfg;
    akv_status st;
    const uint32_t n_groups = akv__forward_groups(b, AKV_ATTN_MAX_QUERIES, f->groups);
    const uint32_t n_rows = logits ? akv_forward_batch_logit_rows(b) : 0;
    /* 1. ids, positions, the prefill group's qo_indptr and the logit rows: one upload from
     * pinned memory, after the previous one has left it */
    if (f->io_pending) {
        /* A record that completed on a faulted queue stays failed after the device recovers:
         * then only a device-wide sync that succeeds proves the old upload is over (a device
         * still faulted fails it, so the failure is reported here if no earlier wait did) */
        if ((st = akv_dev_event_sync(f->dev, f->io_ev)) && (st = akv_dev_sync(f->dev))) return st;
        f->io_pending = false;
    }
    int32_t *pos = f->io_h + fdev_io_pos(f), *qo = f->io_h + fdev_io_qo(f),
            *rows = f->io_h + fdev_io_rows(f);
    memcpy(f->io_h, b->tokens, (size_t)n * sizeof(int32_t));
    const akv__fwd_group *pre = n_groups && !f->groups[n_groups - 1].decode
                                    ? &f->groups[n_groups - 1] : NULL;
    qo[0] = 0;
    bool any_argmax = false, any_sample = false; /* a sequence asks for its token */
    for (uint32_t s = 0, t = 0, r = 0; s < b->n_seq; s++) {
        for (uint32_t i = 0; i < b->n_new[s]; i++)
            pos[t + i] = (int32_t)(b->pos0[s] + i);
        if (pre && s >= pre->s0) qo[s - pre->s0 + 1] = qo[s - pre->s0] + (int32_t)b->n_new[s];
        const uint8_t mode = akv_forward_batch_mode(b, s);
        any_argmax |= mode == AKV_FORWARD_LOGITS_ARGMAX;
        any_sample |= mode == AKV_FORWARD_LOGITS_SAMPLE;
        const uint32_t k = logits ? akv_forward_mode_rows(mode, b->n_new[s]) : 0; /* the last k */
        for (uint32_t i = b->n_new[s] - k; i < b->n_new[s]; i++) rows[r++] = (int32_t)(t + i);
        t += b->n_new[s];
    }
    size_t io_bytes = fdev_io_ints(f) * sizeof(int32_t);
    if ((st = akv_dev_copy_h2d_async(f->dev, AKV_QUEUE_COMPUTE, f->io, f->io_h, io_bytes)) ||
        (st = akv_dev_event_record(f->dev, f->io_ev, AKV_QUEUE_COMPUTE)))
        return st;
    f->io_pending = true;

    /* 2. embedding, then every block */
    akv_fwd_embed_args e = {.y = f->x,
                            .table = f->tok_embd,
                            .ids = f->io,
                            .n = n,
                            .n_embd = c->n_embd,
                            .n_vocab = c->n_vocab,
                            .table_dtype = AKV_DTYPE_BF16};
    f->pos0 = b->pos0;
    if (n == b->n_seq && kv->replayable && !f->params.no_graphs) {
        st = fdev_replay(f, &e, b->n_seq, n_groups, kv);
    } else {
        st = FDEV_LAUNCH(f, akv_fwd_op_embed, e);
        for (uint32_t l = 0; !st && l < f->n_layers; l++)
            st = fdev_layer_run(f, l, n, b->n_seq, n_groups, kv);
    }
    f->pos0 = NULL;
    if (st) return st;
    if (!logits || n_rows == 0) return AKV_OK;

    /* 3. output head over the rows whose logits are wanted (gathered by the norm); the greedy
     * choices of the ARGMAX rows on the device (their ids come back, not their rows); the
     * other rows back, a run of consecutive ones a copy; and the one wait of the step */
    const size_t row_bytes = (size_t)c->n_vocab * sizeof(float);
    if ((st = fdev_rmsnorm_rows(f, f->h, f->x, f->output_norm, n_rows,
                                akv_dptr_offset(f->io, fdev_io_rows(f) * 4))) ||
        (st = fdev_matmul(f, f->logits, f->h, f->output, n_rows, c->n_vocab, c->n_embd, 0)))
        return st;
    if (any_sample) { /* one draw a row: SAMPLE rows theirs, ARGMAX rows greedy, the rest none */
        if ((st = fdev_draw(f, b, n_rows))) return st;
    } else if (any_argmax) {
        akv_fwd_argmax_args am = {.y = f->chosen, .x = f->logits, .n_rows = n_rows, .n = c->n_vocab};
        if ((st = FDEV_LAUNCH(f, akv_fwd_op_argmax, am))) return st;
    }
    if ((any_sample || any_argmax) &&
        (st = akv_dev_copy_d2h_async(f->dev, AKV_QUEUE_COMPUTE, f->chosen_h, f->chosen,
                                     (size_t)n_rows * sizeof(int32_t))))
        return st;
    for (uint32_t s = 0, r = 0; s < b->n_seq && !st;) { /* runs of rows that come back */
        uint32_t r0 = r;
        for (; s < b->n_seq; s++) {
            const uint8_t mode = akv_forward_batch_mode(b, s);
            if (mode == AKV_FORWARD_LOGITS_ARGMAX || mode == AKV_FORWARD_LOGITS_SAMPLE) break;
            r += akv_forward_mode_rows(mode, b->n_new[s]);
        }
        if (r > r0)
            st = akv_dev_copy_d2h_async(f->dev, AKV_QUEUE_COMPUTE, (char *)f->logits_h + r0 * row_bytes,
                                        akv_dptr_offset(f->logits, r0 * row_bytes), (r - r0) * row_bytes);
        if (s < b->n_seq) s++, r++; /* an ARGMAX or SAMPLE row: its id only */
    }
    if (st || (st = akv_dev_queue_sync(f->dev, AKV_QUEUE_COMPUTE))) return st;
    f->io_pending = false; /* the sync covered the upload too */
    for (uint32_t s = 0, r = 0; s < b->n_seq; s++) {
        const uint8_t mode = akv_forward_batch_mode(b, s);
        const uint32_t k = akv_forward_mode_rows(mode, b->n_new[s]);
        if (mode == AKV_FORWARD_LOGITS_ARGMAX || mode == AKV_FORWARD_LOGITS_SAMPLE) b->chosen[s] = f->chosen_h[r];
        else if (logits != f->logits_h && k) /* its rows, where asked */
            memcpy(logits + (size_t)r * c->n_vocab, f->logits_h + (size_t)r * c->n_vocab, k * row_bytes);
        r += k;
    }
    return AKV_OK;
}

akv_status akv_forward_dev_step(akv_forward_dev *f, const akv_forward_batch *b,
                                const akv_kv_hooks *kv, float *logits) {
    if (!f || !kv || !kv->begin_layer) return AKV_EINVAL;
    uint32_t n = 0;
    akv_status st =
        akv_forward_batch_check(b, f->params.max_step_tokens, f->cfg.n_vocab, "forward_dev", &n);
    if (st) return st;
    if (logits && akv_forward_batch_logit_rows(b) > f->params.max_logits) {
        AKV_LOG_E("forward_dev: a step asking for %u rows of logits; the pass holds %u "
                  "({=max_logits})",
                  akv_forward_batch_logit_rows(b), f->params.max_logits);
        return AKV_EINVAL;
    }
    st = fdev_step(f, b, n, kv, logits);
    /* A failed step may leave a decode's arrival counters half counted (a fault may show only
     * at a later wait): the next decode zeroes its workspace again (fdev_attn_ws). */
    if (st) memset(f->attn_ws_layout, 0, sizeof f->attn_ws_layout);
    return st;
}

akv_status akv_forward_dev_run(akv_forward_dev *f, const int32_t *tokens, uint32_t n,
                               uint32_t pos0, const akv_kv_hooks *kv, float *logits,
                               bool all_logits) {
    uint8_t mode = all_logits ? AKV_FORWARD_LOGITS_ALL : AKV_FORWARD_LOGITS_LAST;
    akv_forward_batch b = {.n_seq = 1, .n_new = &n, .pos0 = &pos0, .tokens = tokens,
                           .logits = &mode};
    if (!tokens) return AKV_EINVAL;
    return akv_forward_dev_step(f, &b, kv, logits);
}
