/*
 * attn.c — the reference attention ops on host memory (akv/attn.h documents the API):
 * paged decode and causal prefill with GQA, the K/V append, and the exact merge.
 *
 * One path serves decode and prefill: a query row is (sequence s, new row i of n, head j);
 * it sits at position len - n + i and attends keys 0..len-n+i of K/V head j / group,
 * walking the CSR page table token by token (attn_rows.inc). Decode is the case of a
 * uniform n = n_query per sequence. Inputs are widened to float first, so FP32 and float64
 * see the same operands and differ only in accumulation.
 */
#include "attn/attn_impl.h"

#include <math.h>
#include <stdbool.h>

#include "akv/kvq.h"
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "core/log.h"

/* The page table and pool of one call, as host pointers. */
typedef struct kv_view {
    const unsigned char *pool;
    size_t page_bytes;
    const int32_t *indptr, *indices, *last;
    uint32_t page_tokens, n_kv_heads, head_dim;
    akv_dtype dtype;
    akv_repr_layout layout;   /* the pages' representation */
    akv_kvq_page_shape shape; /* for a compact page's rows */
    bool past;                /* every key before every query (kv.past) */
} kv_view;

/* The new rows of each sequence: from qo_indptr, or n_per_seq each. */
typedef struct rows_spec {
    const int32_t *qo_indptr; /* NULL = uniform */
    uint32_t n_per_seq;
} rows_spec;

static void *host(akv_dptr p) {
    return (void *)(uintptr_t)p.addr;
}

static void view_init(kv_view *v, const akv_attn_pages *kv) {
    v->pool = host(kv->pool);
    akv__attn_page_bytes(kv, &v->page_bytes); /* validated: cannot overflow */
    v->indptr = host(kv->indptr);
    v->indices = host(kv->indices);
    v->last = host(kv->last_page_len);
    v->page_tokens = kv->page_tokens;
    v->n_kv_heads = kv->n_kv_heads;
    v->head_dim = kv->head_dim;
    v->dtype = kv->dtype;
    (void)akv__attn_layout(kv, &v->layout); /* validated */
    v->shape = (akv_kvq_page_shape){kv->n_kv_heads, kv->page_tokens, kv->head_dim, kv->dtype};
    v->past = kv->past != 0;
}

/* Keys that row i of n new rows sees in a sequence of len tokens: the causal rule (row i sits
 * at len - n + i and sees keys up to it), or every key of a past part. */
static int64_t keys_seen(const kv_view *v, uint32_t len, uint32_t n, uint32_t i) {
    if (v->past) return len;
    int64_t n_keys = (int64_t)len - n + i + 1;
    return n_keys < 0 ? 0 : n_keys;
}

static uint32_t seq_len(const kv_view *v, uint32_t s) {
    uint32_t n = (uint32_t)(v->indptr[s + 1] - v->indptr[s]);
    return n ? (n - 1) * v->page_tokens + (uint32_t)v->last[s] : 0;
}

/* The page holding position t of sequence s. */
static const unsigned char *kv_page(const kv_view *v, uint32_t s, uint32_t t) {
    int32_t page = v->indices[v->indptr[s] + (int32_t)(t / v->page_tokens)];
    return v->pool + (size_t)page * v->page_bytes;
}

/* Address of row (kv, h, t) of sequence s in exact pages: kv 0 = K, 1 = V; t a position < len. */
static const void *kv_row(const kv_view *v, uint32_t s, uint32_t kv, uint32_t h, uint32_t t) {
    size_t row = ((size_t)(kv * v->n_kv_heads + h) * v->page_tokens + t % v->page_tokens) * v->head_dim;
    return kv_page(v, s, t) + row * akv_dtype_size(v->dtype);
}

/* bf16 to f32, 64 at a time (a constant trip count the compiler vectorizes at -O2; cloned for
 * AVX2 where the CPU has it). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void widen_bf16(float *restrict dst, const uint16_t *restrict src, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (size_t e = 0; e < 64; e++)
            dst[i + e] = akv_bf16_to_f32(src[i + e]);
    for (; i < n; i++)
        dst[i] = akv_bf16_to_f32(src[i]);
}

static void row_to_f32(const void *src, akv_dtype t, uint32_t n, float *dst) {
    const uint16_t *h = src;
    switch (t) {
    case AKV_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); break;
    case AKV_DTYPE_BF16: widen_bf16(dst, h, n); break;
    case AKV_DTYPE_F16: for (uint32_t i = 0; i < n; i++) dst[i] = akv_f16_to_f32(h[i]); break;
    default: AKV_ASSERT(!"validated dtype");
    }
}

/* Row (kv, h, t) of sequence s as f32, in any representation (a compact K row stays rotated:
 * the reader rotates the query). */
static void read_row(const kv_view *v, uint32_t s, uint32_t kv, uint32_t h, uint32_t t, float *out) {
    if (v->layout.repr == AKV_REPR_EXACT) row_to_f32(kv_row(v, s, kv, h, t), v->dtype, v->head_dim, out);
    else akv_kvq_read_row(&v->layout, &v->shape, kv_page(v, s, t), kv, h, t % v->page_tokens, out);
}

static void row_from_f32(void *dst, akv_dtype t, uint32_t n, const float *src) {
    uint16_t *h = dst;
    switch (t) {
    case AKV_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); break;
    case AKV_DTYPE_BF16: for (uint32_t i = 0; i < n; i++) h[i] = akv_f32_to_bf16(src[i]); break;
    case AKV_DTYPE_F16: for (uint32_t i = 0; i < n; i++) h[i] = akv_f32_to_f16(src[i]); break;
    default: AKV_ASSERT(!"validated dtype");
    }
}

#define ROW_FN attend_row_f32
#define REAL float
#define EXP expf
#define LOG logf
#include "attn_rows.inc"
#undef ROW_FN
#undef REAL
#undef EXP
#undef LOG

#define ROW_FN attend_row_f64
#define REAL double
#define EXP exp
#define LOG log
#include "attn_rows.inc"
#undef ROW_FN
#undef REAL
#undef EXP
#undef LOG

static void qo_range(const rows_spec *r, uint32_t s, uint32_t *start, uint32_t *n) {
    if (r->qo_indptr) {
        *start = (uint32_t)r->qo_indptr[s];
        *n = (uint32_t)(r->qo_indptr[s + 1] - r->qo_indptr[s]);
    } else {
        *start = s * r->n_per_seq;
        *n = r->n_per_seq;
    }
}

/* Output of an attention pass: typed (FP32 path) or double (float64 path). */
typedef struct attn_out {
    void *o;
    akv_dtype o_dtype;
    float *lse;      /* may be NULL */
    double *o64;     /* non-NULL selects the float64 path */
    double *lse64;   /* may be NULL */
} attn_out;

/* Every new row of the n_seq sequences, every query head. */
static void attend_all(const kv_view *v, const rows_spec *r, uint32_t n_seq, uint32_t n_heads,
                       const void *q, akv_dtype q_dtype, uint32_t q_stride, float scale,
                       const attn_out *out) {
    uint32_t d = v->head_dim, group = n_heads / v->n_kv_heads;
    size_t q_elem = akv_dtype_size(q_dtype), o_elem = akv_dtype_size(out->o_dtype);
    if (q_stride == 0) q_stride = n_heads * d;
    float qf[AKV_ATTN_MAX_HEAD_DIM], of[AKV_ATTN_MAX_HEAD_DIM], lsef;
    double lse64;
    for (uint32_t s = 0; s < n_seq; s++) {
        uint32_t len = seq_len(v, s), start, n;
        qo_range(r, s, &start, &n);
        for (uint32_t i = 0; i < n; i++) {
            const int64_t n_keys = keys_seen(v, len, n, i);
            size_t tok = (size_t)start + i;
            for (uint32_t j = 0; j < n_heads; j++) {
                const unsigned char *qrow = (const unsigned char *)q + (tok * q_stride + (size_t)j * d) * q_elem;
                size_t orow = (tok * n_heads + j) * d;
                row_to_f32(qrow, q_dtype, d, qf);
                if (v->layout.rotate_k) akv_kvq_fwht(qf, d); /* as the K rows were */
                if (out->o64) {
                    attend_row_f64(v, s, j / group, n_keys, qf, scale, out->o64 + orow, &lse64);
                    if (out->lse64) out->lse64[tok * n_heads + j] = lse64;
                } else {
                    attend_row_f32(v, s, j / group, n_keys, qf, scale, of, &lsef);
                    row_from_f32((unsigned char *)out->o + orow * o_elem, out->o_dtype, d, of);
                    if (out->lse) out->lse[tok * n_heads + j] = lsef;
                }
            }
        }
    }
}

/* Checks that qo_indptr describes n_tokens rows in chunks of at most max_rows, and that
 * every chunk fits in its sequence when `must_fit` (its K/V is about to be written). */
static akv_status rows_check(const kv_view *v, const rows_spec *r, uint32_t n_seq,
                             uint32_t n_tokens, uint32_t max_rows, bool must_fit, const char *op) {
    if (r->qo_indptr && r->qo_indptr[0] != 0) {
        AKV_LOG_E("attn %s: qo_indptr[0] is %d, not 0", op, r->qo_indptr[0]);
        return AKV_EINVAL;
    }
    if (r->qo_indptr && (uint32_t)r->qo_indptr[n_seq] != n_tokens) {
        AKV_LOG_E("attn %s: qo_indptr[n_seq] is %d, not n_tokens %u", op, r->qo_indptr[n_seq], n_tokens);
        return AKV_EINVAL;
    }
    for (uint32_t s = 0; s < n_seq; s++) {
        if (r->qo_indptr && r->qo_indptr[s + 1] < r->qo_indptr[s]) {
            AKV_LOG_E("attn %s: qo_indptr decreases at sequence %u", op, s);
            return AKV_EINVAL;
        }
        uint32_t start, n, len = seq_len(v, s);
        qo_range(r, s, &start, &n);
        if (n > max_rows) {
            AKV_LOG_E("attn %s: sequence %u has %u new rows, more than the stated maximum %u", op, s, n, max_rows);
            return AKV_EINVAL;
        }
        if (must_fit && n > len) {
            AKV_LOG_E("attn %s: sequence %u has %u new tokens but only %u positions in its pages", op, s, n, len);
            return AKV_EINVAL;
        }
    }
    return AKV_OK;
}

/* Writes rows [start, start+n) of k/v into the last n positions of each sequence. */
static void append_rows(const kv_view *v, const rows_spec *r, uint32_t n_seq, const void *k,
                        const void *val, akv_dtype dtype, uint32_t stride) {
    uint32_t d = v->head_dim, n_kv = v->n_kv_heads;
    size_t src_elem = akv_dtype_size(dtype), dst_elem = akv_dtype_size(v->dtype);
    if (stride == 0) stride = n_kv * d;
    float buf[AKV_ATTN_MAX_HEAD_DIM];
    for (uint32_t s = 0; s < n_seq; s++) {
        uint32_t len = seq_len(v, s), start, n;
        qo_range(r, s, &start, &n);
        for (uint32_t i = 0; i < n; i++) {
            size_t tok = (size_t)start + i;
            for (uint32_t kv = 0; kv < 2; kv++) {
                const unsigned char *src = kv ? val : k;
                for (uint32_t h = 0; h < n_kv; h++) {
                    const unsigned char *row = src + (tok * stride + (size_t)h * d) * src_elem;
                    void *dst = (void *)kv_row(v, s, kv, h, len - n + i);
                    if (dtype == v->dtype) {
                        memcpy(dst, row, d * dst_elem);
                    } else { /* f32 source into a narrower page */
                        row_to_f32(row, dtype, d, buf);
                        row_from_f32(dst, v->dtype, d, buf);
                    }
                }
            }
        }
    }
}

akv_status akv_attn_ref_append(const akv_attn_append *p) {
    akv_status st = akv__attn_append_check(p, "ref append");
    if (st != AKV_OK || p->kv.n_seq == 0 || p->n_tokens == 0) return st;
    if ((st = akv_attn_table_check(&p->kv)) != AKV_OK) return st;
    kv_view v;
    view_init(&v, &p->kv);
    rows_spec r = {host(p->qo_indptr), p->n_per_seq};
    if ((st = rows_check(&v, &r, p->kv.n_seq, p->n_tokens, p->max_new, true, "ref append")) != AKV_OK)
        return st;
    append_rows(&v, &r, p->kv.n_seq, host(p->k), host(p->v), p->dtype, p->stride);
    return AKV_OK;
}

/* ---- the host backend's attention: the same contract, blocked, row-invariant ---------------- */

/* One attention call, decode or prefill, after its own parameter check. */
typedef struct attn_job {
    const akv_attn_pages *kv;
    rows_spec rows;
    uint32_t n_tokens, max_rows, n_heads;
    const void *q;
    akv_dtype q_dtype;
    uint32_t q_stride;
    const void *k_new, *v_new; /* NULL = already in the pages */
    akv_dtype kv_new_dtype;
    uint32_t kv_stride;
    float scale;
    attn_out out;
} attn_job;

static akv_status run_job(const attn_job *j, const char *op) {
    akv_status st = akv_attn_table_check(j->kv);
    if (st != AKV_OK) return st;
    kv_view v;
    view_init(&v, j->kv);
    if ((st = rows_check(&v, &j->rows, j->kv->n_seq, j->n_tokens, j->max_rows, j->k_new != NULL, op)) != AKV_OK)
        return st;
    if (j->n_tokens == 0) return AKV_OK;
    if (j->k_new) append_rows(&v, &j->rows, j->kv->n_seq, j->k_new, j->v_new, j->kv_new_dtype, j->kv_stride);
    const float scale = akv__attn_scale(j->scale, j->kv->head_dim);
    attend_all(&v, &j->rows, j->kv->n_seq, j->n_heads, j->q, j->q_dtype, j->q_stride, scale,
               &j->out);
    return AKV_OK;
}

static akv_status decode(const akv_attn_decode *p, double *o64, double *lse64) {
    const char *op = o64 ? "ref decode f64" : "ref decode";
    akv_status st = akv__attn_decode_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    attn_job j = {
        .kv = &p->kv,
        .rows = {NULL, p->n_query},
        .n_tokens = p->kv.n_seq * p->n_query,
        .max_rows = p->n_query,
        .n_heads = p->n_heads,
        .q = host(p->q),
        .q_dtype = p->q_dtype,
        .q_stride = p->q_stride,
        .scale = p->scale,
        .out = {host(p->o), p->o_dtype, host(p->lse), o64, lse64},
    };
    return run_job(&j, op);
}

static akv_status prefill(const akv_attn_prefill *p, double *o64, double *lse64) {
    const char *op = o64 ? "ref prefill f64" : "ref prefill";
    akv_status st = akv__attn_prefill_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    attn_job j = {
        .kv = &p->kv,
        .rows = {host(p->qo_indptr), 0},
        .n_tokens = p->n_tokens,
        .max_rows = p->max_chunk,
        .n_heads = p->n_heads,
        .q = host(p->q),
        .q_dtype = p->q_dtype,
        .q_stride = p->q_stride,
        .k_new = host(p->k_new),
        .v_new = host(p->v_new),
        .kv_new_dtype = p->kv_new_dtype,
        .kv_stride = p->kv_stride,
        .scale = p->scale,
        .out = {host(p->o), p->o_dtype, host(p->lse), o64, lse64},
    };
    return run_job(&j, op);
}

/* The float64 variants stand their double outputs in for the typed ones (which they do
 * not use) so the common check passes on them. */
static bool f64_args(const void *p, const double *o, const char *op) {
    if (p && o) return true;
    AKV_LOG_E("attn %s: %s is NULL", op, p ? "o" : "the parameters");
    return false;
}

akv_status akv_attn_ref_decode(const akv_attn_decode *p) {
    return decode(p, NULL, NULL);
}

akv_status akv_attn_ref_decode_f64(const akv_attn_decode *p, double *o, double *lse) {
    if (!f64_args(p, o, "ref decode f64")) return AKV_EINVAL;
    akv_attn_decode q = *p;
    q.o = akv_attn_host_ptr(o), q.o_dtype = AKV_DTYPE_F32;
    return decode(&q, o, lse);
}

akv_status akv_attn_ref_prefill(const akv_attn_prefill *p) {
    return prefill(p, NULL, NULL);
}

akv_status akv_attn_ref_prefill_f64(const akv_attn_prefill *p, double *o, double *lse) {
    if (!f64_args(p, o, "ref prefill f64")) return AKV_EINVAL;
    akv_attn_prefill q = *p;
    q.o = akv_attn_host_ptr(o), q.o_dtype = AKV_DTYPE_F32;
    return prefill(&q, o, lse);
}

akv_status akv_attn_ref_merge(const akv_attn_merge *p) {
    akv_status st = akv__attn_merge_check(p, "ref merge");
    if (st != AKV_OK || p->n_rows == 0) return st;
    uint32_t d = p->head_dim;
    const float *oa = host(p->o_a), *la = host(p->lse_a), *ob = host(p->o_b), *lb = host(p->lse_b);
    float *lse = host(p->lse);
    float row[AKV_ATTN_MAX_HEAD_DIM];
    size_t o_elem = akv_dtype_size(p->o_dtype);
    for (uint32_t r = 0; r < p->n_rows; r++) {
        /* read both inputs before writing: o and lse may alias either */
        float l = la[r];
        memcpy(row, oa + (size_t)r * d, d * sizeof(float));
        akv_attn_merge_state(d, row, &l, ob + (size_t)r * d, lb[r]);
        row_from_f32((unsigned char *)host(p->o) + (size_t)r * d * o_elem, p->o_dtype, d, row);
        if (lse) lse[r] = l;
    }
    return AKV_OK;
}

akv_status akv_attn_ref_widen(const akv_attn_widen *p) {
    akv_status st = akv__attn_widen_check(p, "ref widen");
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = akv_attn_table_check(&p->kv)) != AKV_OK) return st;
    kv_view v;
    view_init(&v, &p->kv);
    akv_repr_layout le;
    st = akv_repr_layout_of(AKV_REPR_EXACT, v.dtype, v.n_kv_heads, v.page_tokens, v.head_dim, &le);
    if (st != AKV_OK) return st; /* the table's exact form: validated with it */
    int32_t *indptr = host(p->out_indptr), *indices = host(p->out_indices), *last = host(p->out_last);
    unsigned char *out = host(p->out_pool);
    const size_t elem = akv_dtype_size(v.dtype);
    float row[AKV_ATTN_MAX_HEAD_DIM];
    int32_t o = 0;
    indptr[0] = 0;
    for (uint32_t s = 0; s < p->kv.n_seq; s++) {
        const uint32_t n = (uint32_t)(v.indptr[s + 1] - v.indptr[s]);
        const uint32_t give = n > p->first ? (n - p->first < p->max_out ? n - p->first : p->max_out) : 0;
        for (uint32_t j = 0; j < give; j++, o++) {
            const unsigned char *src = v.pool + (size_t)v.indices[v.indptr[s] + p->first + j] * v.page_bytes;
            unsigned char *dst = out + (size_t)o * le.page_bytes;
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < v.n_kv_heads; h++)
                    for (uint32_t t = 0; t < v.page_tokens; t++) {
                        akv_kvq_read_row(&v.layout, &v.shape, src, kv, h, t, row);
                        if (kv == 0 && v.layout.rotate_k) akv_kvq_fwht(row, v.head_dim);
                        const size_t at = ((size_t)(kv * v.n_kv_heads + h) * v.page_tokens + t) * v.head_dim;
                        row_from_f32(dst + at * elem, v.dtype, v.head_dim, row);
                    }
            indices[o] = o;
        }
        last[s] = give == 0 ? 0 : p->first + give == n ? v.last[s] : (int32_t)v.page_tokens;
        indptr[s + 1] = o;
    }
    return AKV_OK;
}
