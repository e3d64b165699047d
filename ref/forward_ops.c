/* forward_ops.c — the descriptors of akv/forward_ops.h and their host backend
 * implementations (ref/ ops on the compute worker thread; device addresses are host addresses
 * there). */
#include "akv/forward_ops.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "core/log.h"
#include "dev/dev_op.h"

/* The host address of a device pointer of the host backend (`dev` is the op's device). */
#define FOPS_PTR(d) akv__dev_host_addr(dev, (d))

/* Element i of an f32 or bf16 array. */
static float fops_load(const void *p, akv_dtype t, size_t i) {
    return t == AKV_DTYPE_BF16 ? akv_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void fops_store(void *p, akv_dtype t, size_t i, float v) {
    if (t == AKV_DTYPE_BF16)
        ((uint16_t *)p)[i] = akv_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* Stores n floats at element i0 of p in type t. */
static void fops_store_row(void *p, akv_dtype t, size_t i0, const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        fops_store(p, t, i0 + i, v[i]);
}

static akv_status fops_dtype_check(akv_dtype t, const char *op) {
    if (t == AKV_DTYPE_F32 || t == AKV_DTYPE_BF16) return AKV_OK;
    AKV_LOG_E("%s: dtype %s (f32 or bf16 expected)", op, akv_dtype_name(t));
    return AKV_EINVAL;
}

static akv_status fops_embed(akv_dev *dev, const void *args) {
    const akv_fwd_embed_args *a = args;
    akv_status st = fops_dtype_check(a->table_dtype, "fwd_embed");
    if (st) return st;
    const int32_t *ids = FOPS_PTR(a->ids);
    const void *tab = FOPS_PTR(a->table);
    float *y = FOPS_PTR(a->y);
    for (uint32_t t = 0; t < a->n; t++) {
        bool ok = ids[t] >= 0 && (uint32_t)ids[t] < a->n_vocab;
        for (uint32_t i = 0; i < a->n_embd; i++)
            y[(size_t)t * a->n_embd + i] =
                ok ? fops_load(tab, a->table_dtype, (size_t)ids[t] * a->n_embd + i) : NAN;
    }
    return AKV_OK;
}

static akv_status fops_rmsnorm(akv_dev *dev, const void *args) {
    const akv_fwd_rmsnorm_args *a = args;
    akv_status st = fops_dtype_check(a->y_dtype, "fwd_rmsnorm");
    if (st) return st;
    const float *x = FOPS_PTR(a->x), *w = FOPS_PTR(a->w);
    const int32_t *rows = a->rows.addr ? FOPS_PTR(a->rows) : NULL;
    void *y = FOPS_PTR(a->y);
    if (a->n == 0) return AKV_OK; /* empty rows: nothing to store */
    float *row = akv__malloc(a->n * sizeof *row);
    if (!row) return AKV_ENOMEM;
    for (uint32_t r = 0; r < a->n_rows; r++) {
        /* the reference's arithmetic, one row at a time, then stored in y's type */
        size_t i = rows ? (size_t)rows[r] : r;
        akv_ops_ref_rmsnorm(row, x + i * a->n, w, 1, a->n, a->eps);
        fops_store_row(y, a->y_dtype, (size_t)r * a->n, row, a->n);
    }
    akv__free(row);
    return AKV_OK;
}

static akv_status fops_rope(akv_dev *dev, const void *args) {
    const akv_fwd_rope_args *a = args;
    if (a->n_rot % 2 || a->n_rot > a->head_dim) return AKV_EINVAL;
    const int32_t *pos = FOPS_PTR(a->pos);
    const float *inv = FOPS_PTR(a->inv_freq);
    float *x = FOPS_PTR(a->x);
    size_t stride = a->stride ? a->stride : (size_t)a->n_heads * a->head_dim;
    size_t n_pairs = a->n_rot / 2;
    float *c = akv__malloc(2 * (n_pairs ? n_pairs : 1) * sizeof(float));
    if (!c) return AKV_ENOMEM;
    float *s = c + n_pairs;
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        /* one token at a time through the reference (its table and its rotation) */
        akv_ops_ref_rope_table(pos + t, 1, inv, a->n_rot, c, s);
        akv_ops_ref_rope(x + t * stride, 1, a->n_heads, a->head_dim, a->n_rot, a->mode, c, s);
    }
    akv__free(c);
    return AKV_OK;
}

static akv_status fops_head_norm(akv_dev *dev, const void *args) {
    const akv_fwd_head_norm_args *a = args;
    if (a->head_dim == 0 || a->stride < (uint64_t)(a->n_a + a->n_b) * a->head_dim) return AKV_EINVAL;
    float *x = FOPS_PTR(a->x);
    const float *wa = FOPS_PTR(a->wa), *wb = FOPS_PTR(a->wb);
    for (uint32_t t = 0; t < a->n_tokens; t++) {
        float *row = x + (size_t)t * a->stride;
        akv_ops_ref_rmsnorm(row, row, wa, a->n_a, a->head_dim, a->eps);
        akv_ops_ref_rmsnorm(row + (size_t)a->n_a * a->head_dim, row + (size_t)a->n_a * a->head_dim,
                            wb, a->n_b, a->head_dim, a->eps);
    }
    return AKV_OK;
}

static akv_status fops_swiglu(akv_dev *dev, const void *args) {
    const akv_fwd_swiglu_args *a = args;
    akv_status st = fops_dtype_check(a->y_dtype, "fwd_swiglu");
    if (st) return st;
    const float *g = FOPS_PTR(a->gate), *u = FOPS_PTR(a->up);
    void *y = FOPS_PTR(a->y);
    size_t in = a->in_stride ? a->in_stride : a->n;
    if (a->n == 0) return AKV_OK; /* empty rows: nothing to store */
    float *row = akv__malloc(a->n * sizeof *row);
    if (!row) return AKV_ENOMEM;
    for (uint32_t r = 0; r < a->n_rows; r++) {
        akv_ops_ref_swiglu(row, g + r * in, u + r * in, a->n);
        fops_store_row(y, a->y_dtype, (size_t)r * a->n, row, a->n);
    }
    akv__free(row);
    return AKV_OK;
}

static akv_status fops_add(akv_dev *dev, const void *args) {
    const akv_fwd_add_args *a = args;
    float *y = FOPS_PTR(a->y);
    const float *x = FOPS_PTR(a->a);
    for (uint32_t r = 0; r < a->n_rows; r++)
        akv_ops_ref_add(y + (size_t)r * a->n, x + (size_t)r * a->a_stride, a->n);
    return AKV_OK;
}

static akv_status fops_cast(akv_dev *dev, const void *args) {
    const akv_fwd_cast_args *a = args;
    akv_status st = fops_dtype_check(a->x_dtype, "fwd_cast");
    if (st || (st = fops_dtype_check(a->y_dtype, "fwd_cast"))) return st;
    const void *x = FOPS_PTR(a->x);
    void *y = FOPS_PTR(a->y);
    for (uint64_t i = 0; i < a->n; i++)
        fops_store(y, a->y_dtype, i, fops_load(x, a->x_dtype, i));
    return AKV_OK;
}

/* A block fill: hash bytes, the scale fields set (akv_fwd_fill_args). */
static akv_status fops_fill_blocks(akv_dev *dev, const akv_fwd_fill_args *a) {
    size_t bb = akv_ops_wblock_bytes((akv_ops_wtype)a->w_type);
    if (!akv_ops_wtype_is_block((akv_ops_wtype)a->w_type) || a->n % bb) {
        AKV_LOG_E("fwd_fill: %llu bytes are not whole blocks of type %u", (unsigned long long)a->n,
                  a->w_type);
        return AKV_EINVAL;
    }
    uint8_t *y = FOPS_PTR(a->y);
    const uint16_t h0 = akv_f32_to_f16(a->scale), h1 = akv_f32_to_f16(a->center);
    int fa, fb;
    akv_fwd_block_scales(a->w_type, &fa, &fb);
    for (uint64_t i = 0; i < a->n; i++) {
        const int o = (int)(i % bb);
        y[i] = o == fa                  ? (uint8_t)h0
               : o == fa + 1            ? (uint8_t)(h0 >> 8)
               : fb >= 0 && o == fb     ? (uint8_t)h1
               : fb >= 0 && o == fb + 1 ? (uint8_t)(h1 >> 8)
                                        : akv_fwd_fill_byte(a->seed, i);
    }
    return AKV_OK;
}

static akv_status fops_fill(akv_dev *dev, const void *args) {
    const akv_fwd_fill_args *a = args;
    if (a->w_type) return fops_fill_blocks(dev, a);
    akv_status st = fops_dtype_check(a->y_dtype, "fwd_fill");
    if (st) return st;
    void *y = FOPS_PTR(a->y);
    for (uint64_t i = 0; i < a->n; i++)
        fops_store(y, a->y_dtype, i, akv_fwd_fill_value(a->seed, i, a->center, a->scale));
    return AKV_OK;
}

/* Widens bf16 x and W (bf16, or decoded from its blocks) to f32 and runs the host product (on
 * the values the device sees). */
static akv_status fops_matmul(akv_dev *dev, const void *args) {
    const akv_fwd_matmul_args *a = args;
    size_t m = a->m, n = a->n, k = a->k;
    if (!m || !n || !k || a->beta > 1) return AKV_EINVAL;
    float *xf = akv__malloc((m * k + n * k + m * n) * sizeof(float));
    if (!xf) return AKV_ENOMEM;
    float *wf = xf + m * k, *tmp = wf + n * k;
    const uint16_t *x = FOPS_PTR(a->x), *w = FOPS_PTR(a->w);
    for (size_t i = 0; i < m * k; i++)
        xf[i] = akv_bf16_to_f32(x[i]);
    const akv_ops_wtype wt = (akv_ops_wtype)a->w_type;
    if (wt && wt != AKV_OPS_W_BF16) {
        const size_t rb = akv_ops_wrow_bytes(wt, k);
        if (!akv_ops_wtype_is_block(wt) || !rb) {
            AKV_LOG_E("fwd_matmul: weights of type %u cannot take k = %zu", a->w_type, k);
            akv__free(xf);
            return AKV_EINVAL;
        }
        for (size_t j = 0; j < n; j++)
            akv_ops_wrow_to_f32(wt, (const uint8_t *)(const void *)w + j * rb, k, wf + j * k);
    } else {
        for (size_t i = 0; i < n * k; i++)
            wf[i] = akv_bf16_to_f32(w[i]);
    }
    float *y = FOPS_PTR(a->y);
    /* the host pass's batch-invariant product, so that a row's bits do not depend on the rest
     * of the batch here either */
    akv_ops_matmul_cols(a->beta ? tmp : y, xf, wf, NULL, m, n, k, 0, n, AKV_OPS_ISA_AUTO);
    if (a->beta) akv_ops_ref_add(y, tmp, m * n);
    akv__free(xf);
    return AKV_OK;
}

static akv_status fops_argmax(akv_dev *dev, const void *args) {
    const akv_fwd_argmax_args *a = args;
    const float *x = FOPS_PTR(a->x);
    int32_t *y = FOPS_PTR(a->y);
    for (uint32_t r = 0; r < a->n_rows; r++) y[r] = akv_fwd_argmax_ref(x + (size_t)r * a->n, a->n);
    return AKV_OK;
}

/* ---- sampling (akv/fwd_sample.h) ---- */

typedef struct fops_cand {
    uint32_t key, id;
} fops_cand;

/* The order: key descending, id ascending. */
static int fops_cand_cmp(const void *a, const void *b) {
    const fops_cand *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t akv_fwd_sample_ref(const akv_fwd_sample_row *r, const int32_t *pen_ids,
                           const int32_t *pen_counts, float *x, uint32_t n) {
    for (uint32_t j = 0; j < r->pen_n; j++) {
        const int32_t t = pen_ids[r->pen_off + j];
        x[t] = akv_sample_penalise(r, x[t], (uint32_t)pen_counts[r->pen_off + j]);
    }
    if (r->temp == 0.0f) return akv_fwd_argmax_ref(x, n);
    fops_cand *c = akv__malloc((size_t)(n ? n : 1) * sizeof *c);
    uint64_t *w = akv__malloc((size_t)(n ? n : 1) * sizeof *w);
    uint8_t *kept = akv__calloc(n ? n : 1, 1);
    if (!c || !w || !kept) {
        akv__free(c), akv__free(w), akv__free(kept);
        return -2;
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (akv_sample_key(x[i])) c[m++] = (fops_cand){akv_sample_key(x[i]), i};
    int32_t out = -1;
    if (m == 0) goto done;
    qsort(c, m, sizeof *c, fops_cand_cmp);
    if (r->top_k > 0 && (uint32_t)r->top_k < m) m = (uint32_t)r->top_k; /* top-k */
    const float mx = x[c[0].id];
    uint64_t z = 0;
    for (uint32_t i = 0; i < m; i++) z += w[i] = akv_sample_wfx(akv_sample_weight(x[c[i].id], mx, r->temp));
    if (r->top_p < 1.0f) { /* the shortest prefix reaching top_p of the kept weight */
        const double target = (double)r->top_p * (double)z;
        uint64_t mass = 0;
        for (uint32_t i = 0; i < m; i++)
            if ((double)(mass += w[i]) >= target) {
                m = i + 1;
                break;
            }
    }
    if (r->min_p > 0) { /* the prefix whose weight is at least min_p of the first's (1) */
        uint32_t keep = 1;
        while (keep < m && akv_sample_weight(x[c[keep].id], mx, r->temp) >= r->min_p) keep++;
        m = keep;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < m; i++) kept[c[i].id] = 1, total += w[i];
    /* the draw walks the kept tokens by id: their weights again, in id order */
    const uint64_t t = akv_sample_target(r->u, total ? total : 1);
    uint64_t acc = 0;
    for (uint32_t i = 0; i < n && out < 0; i++)
        if (kept[i] && (acc += akv_sample_wfx(akv_sample_weight(x[i], mx, r->temp))) > t) out = (int32_t)i;
    if (out < 0) out = (int32_t)c[0].id; /* every kept weight 0 cannot happen (the first is 1) */
done:
    akv__free(c), akv__free(w), akv__free(kept);
    return out;
}

static akv_status fops_sample(akv_dev *dev, const void *args) {
    const akv_fwd_sample_args *a = args;
    float *x = FOPS_PTR(a->x);
    int32_t *y = FOPS_PTR(a->y);
    const akv_fwd_sample_row *rows = FOPS_PTR(a->rows);
    const int32_t *pen = a->n_pen ? FOPS_PTR(a->pen) : NULL;
    for (uint32_t r = 0; r < a->n_rows; r++) {
        if (rows[r].temp < 0) continue;
        const int32_t id = akv_fwd_sample_ref(&rows[r], pen, pen ? pen + a->n_pen : NULL,
                                              x + (size_t)r * a->n, a->n);
        if (id == -2) return AKV_ENOMEM;
        y[r] = id;
    }
    return AKV_OK;
}

static akv_status fops_attn_append(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_attn_ref_append(&((const akv_fwd_attn_append_args *)args)->p);
}

static akv_status fops_attn_decode(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_attn_ref_decode(&((const akv_fwd_attn_decode_args *)args)->p);
}

static akv_status fops_attn_prefill(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_attn_ref_prefill(&((const akv_fwd_attn_prefill_args *)args)->p);
}

static akv_status fops_attn_merge(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_attn_ref_merge(&((const akv_fwd_attn_merge_args *)args)->p);
}

static akv_status fops_attn_widen(akv_dev *dev, const void *args) {
    (void)dev;
    return akv_attn_ref_widen(&((const akv_fwd_attn_widen_args *)args)->p);
}

#define FOPS_DEF(var, op_name, type, fn)                                                              \
    const akv_dev_op var = {.name = op_name, .args_bytes = sizeof(type), .host = fn}

FOPS_DEF(akv_fwd_op_embed, AKV_FWD_OP_EMBED, akv_fwd_embed_args, fops_embed);
FOPS_DEF(akv_fwd_op_rmsnorm, AKV_FWD_OP_RMSNORM, akv_fwd_rmsnorm_args, fops_rmsnorm);
FOPS_DEF(akv_fwd_op_rope, AKV_FWD_OP_ROPE, akv_fwd_rope_args, fops_rope);
FOPS_DEF(akv_fwd_op_head_norm, AKV_FWD_OP_HEAD_NORM, akv_fwd_head_norm_args, fops_head_norm);
FOPS_DEF(akv_fwd_op_swiglu, AKV_FWD_OP_SWIGLU, akv_fwd_swiglu_args, fops_swiglu);
FOPS_DEF(akv_fwd_op_add, AKV_FWD_OP_ADD, akv_fwd_add_args, fops_add);
FOPS_DEF(akv_fwd_op_cast, AKV_FWD_OP_CAST, akv_fwd_cast_args, fops_cast);
FOPS_DEF(akv_fwd_op_fill, AKV_FWD_OP_FILL, akv_fwd_fill_args, fops_fill);
FOPS_DEF(akv_fwd_op_argmax, AKV_FWD_OP_ARGMAX, akv_fwd_argmax_args, fops_argmax);
FOPS_DEF(akv_fwd_op_sample, AKV_FWD_OP_SAMPLE, akv_fwd_sample_args, fops_sample);
/* The op profile's key of a product: its shape and W's format. */
static void fops_matmul_describe(const void *args, char *buf, size_t cap) {
    const akv_fwd_matmul_args *a = args;
    snprintf(buf, cap, "%u x %u x %u %s", a->m, a->n, a->k,
             a->w_type ? akv_ops_wtype_name((akv_ops_wtype)a->w_type) : "bf16");
}
const akv_dev_op akv_fwd_op_matmul = {.name = AKV_FWD_OP_MATMUL,
                                      .args_bytes = sizeof(akv_fwd_matmul_args),
                                      .host = fops_matmul,
                                      .describe = fops_matmul_describe};
FOPS_DEF(akv_fwd_op_attn_append, AKV_FWD_OP_ATTN_APPEND, akv_fwd_attn_append_args,
         fops_attn_append);
FOPS_DEF(akv_fwd_op_attn_decode, AKV_FWD_OP_ATTN_DECODE, akv_fwd_attn_decode_args,
         fops_attn_decode);
FOPS_DEF(akv_fwd_op_attn_prefill, AKV_FWD_OP_ATTN_PREFILL, akv_fwd_attn_prefill_args,
         fops_attn_prefill);
FOPS_DEF(akv_fwd_op_attn_merge, AKV_FWD_OP_ATTN_MERGE, akv_fwd_attn_merge_args, fops_attn_merge);
FOPS_DEF(akv_fwd_op_attn_widen, AKV_FWD_OP_ATTN_WIDEN, akv_fwd_attn_widen_args, fops_attn_widen);
