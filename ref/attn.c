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
#include "akv/ops.h"
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "core/log.h"
#include "attn/exp8.h"

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
 * AVX2 where the CPU has it): the host attention widens a page's rows with it every step. */
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

/* Every new row of sequences s0..s1-1, query heads [j0, j1). */
static void attend_all(const kv_view *v, const rows_spec *r, uint32_t s0, uint32_t s1, uint32_t j0,
                       uint32_t j1, uint32_t n_heads, const void *q, akv_dtype q_dtype,
                       uint32_t q_stride, float scale, const attn_out *out) {
    uint32_t d = v->head_dim, group = n_heads / v->n_kv_heads;
    size_t q_elem = akv_dtype_size(q_dtype), o_elem = akv_dtype_size(out->o_dtype);
    if (q_stride == 0) q_stride = n_heads * d;
    float qf[AKV_ATTN_MAX_HEAD_DIM], of[AKV_ATTN_MAX_HEAD_DIM], lsef;
    double lse64;
    for (uint32_t s = s0; s < s1; s++) {
        uint32_t len = seq_len(v, s), start, n;
        qo_range(r, s, &start, &n);
        for (uint32_t i = 0; i < n; i++) {
            const int64_t n_keys = keys_seen(v, len, n, i);
            size_t tok = (size_t)start + i;
            for (uint32_t j = j0; j < j1; j++) {
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

/* Rows of scores computed at once: at most this many floats of S per block. */
#define FAST_S_FLOATS (1u << 22)

/* For each of R rows r: o_r[e] += p_r[t] * v[t][e] over t < n ascending, a multiply then an
 * add each (no fused multiply-add: every instruction set gives the same bits). Row r's p is
 * p + r * p_stride and its o is o + r * D. The rows of a GQA group share their keys, so one
 * pass over V serves them all: the columns go 32 at a time, the R rows' sums of those columns
 * held in a local block (registers when D and R are constants) and stored once. Each row's
 * sums are the same operations in the same order whatever R is. Cloned for AVX2 where the CPU
 * has it. */
#define FAST_PV_COLS 32u
#define FAST_PV_MAX_ROWS 4u
static inline __attribute__((always_inline)) void fast_pv_d(float *restrict o,
                                                            const float *restrict p, size_t p_stride,
                                                            const float *restrict v, size_t n,
                                                            const uint32_t D, const uint32_t R) {
    for (uint32_t e0 = 0; e0 < D; e0 += FAST_PV_COLS) {
        const uint32_t w = D - e0 < FAST_PV_COLS ? D - e0 : FAST_PV_COLS;
        float acc[FAST_PV_MAX_ROWS][FAST_PV_COLS];
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t e = 0; e < w; e++)
                acc[r][e] = o[(size_t)r * D + e0 + e];
        for (size_t t = 0; t < n; t++) {
            const float *vr = v + t * D + e0;
            for (uint32_t r = 0; r < R; r++) {
                const float pt = p[(size_t)r * p_stride + t];
                for (uint32_t e = 0; e < w; e++)
                    acc[r][e] += pt * vr[e];
            }
        }
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t e = 0; e < w; e++)
                o[(size_t)r * D + e0 + e] = acc[r][e];
    }
}

#define FAST_PV_ROWS(D)                                                                            \
    do {                                                                                           \
        if (rows == 1) fast_pv_d(o, p, p_stride, v, n, D, 1);                                      \
        else if (rows == 2) fast_pv_d(o, p, p_stride, v, n, D, 2);                                 \
        else if (rows == 3) fast_pv_d(o, p, p_stride, v, n, D, 3);                                 \
        else fast_pv_d(o, p, p_stride, v, n, D, 4);                                                \
    } while (0)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
fast_pv(float *o, const float *p, size_t p_stride, const float *v, size_t n, uint32_t d,
        uint32_t rows) {
    AKV_ASSERT(rows >= 1 && rows <= FAST_PV_MAX_ROWS);
    if (d == 64)
        FAST_PV_ROWS(64);
    else if (d == 128)
        FAST_PV_ROWS(128);
    else
        fast_pv_d(o, p, p_stride, v, n, d, rows);
}

/* The softmax of a row of scores, in place, unnormalised: row[t] = e^(row[t] - max) for t <
 * n, returning the sum and the maximum at *m_out. Eight lanes: lane e takes the keys t with
 * t % 8 == e of the row's whole groups of 8, the lanes' maxima and sums combined in a fixed
 * tree, then the last n % 8 keys in order (their e^x by the same lanes, attn/exp8.h). */

/* max by the rule m = x > m ? x : m (a NaN never taken), lanes then tail */
static inline float sm_max_pair(float a, float b) {
    return b > a ? b : a;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static float
softmax_row(float *row, int64_t n, float *m_out) {
    const int64_t n8 = n / 8 * 8;
    float m = -INFINITY;
    if (n8) {
        fv8 mv = (fv8){0} - INFINITY;
        for (int64_t t = 0; t < n8; t += 8) {
            fv8 x;
            memcpy(&x, row + t, sizeof x);
            const iv8 gt = x > mv;
            mv = (fv8)((gt & (iv8)x) | (~gt & (iv8)mv));
        }
        const float a = sm_max_pair(sm_max_pair(mv[0], mv[1]), sm_max_pair(mv[2], mv[3]));
        const float b = sm_max_pair(sm_max_pair(mv[4], mv[5]), sm_max_pair(mv[6], mv[7]));
        m = sm_max_pair(a, b);
    }
    for (int64_t t = n8; t < n; t++)
        m = sm_max_pair(m, row[t]);
    float l = 0.0f;
    if (n8) {
        fv8 lv = (fv8){0};
        for (int64_t t = 0; t < n8; t += 8) {
            fv8 x;
            memcpy(&x, row + t, sizeof x);
            x -= m;
            exp_neg8(&x);
            memcpy(row + t, &x, sizeof x);
            lv += x;
        }
        l = ((lv[0] + lv[1]) + (lv[2] + lv[3])) + ((lv[4] + lv[5]) + (lv[6] + lv[7]));
    }
    if (n > n8) { /* the last keys through the same lanes, added in order */
        fv8 x = (fv8){0};
        for (int64_t t = n8; t < n; t++)
            x[t - n8] = row[t] - m;
        exp_neg8(&x);
        for (int64_t t = n8; t < n; t++)
            l += row[t] = x[t - n8];
    }
    *m_out = m;
    return l;
}

/* The rows from x on that belong to x's token (row x = i * group + g), at most `left`: they see
 * the same keys. */
static uint32_t group_run(uint32_t x, uint32_t group, uint32_t left) {
    return group - x % group < left ? group - x % group : left;
}

/* Head h's K (kv 0) or V (kv 1) rows of sequence s's tokens [t, t + nt), all in one page (t a
 * multiple of its size), as f32 rows in out: widened, or decoded from a compact page. */
static void fast_page_rows(const kv_view *v, uint32_t s, uint32_t kv, uint32_t h, uint32_t t,
                           uint32_t nt, float *out) {
    if (v->layout.repr == AKV_REPR_EXACT)
        row_to_f32(kv_row(v, s, kv, h, t), v->dtype, nt * v->head_dim, out);
    else
        akv_kvq_read_rows(&v->layout, &v->shape, kv_page(v, s, t), kv, h, 0, nt, out);
}

/* One sequence s, query heads [j0, j1): for each K/V head they use, its K and V rows widened
 * to f32 a page at a time as they are read (a page in cache rather than the whole history;
 * once for each block of rows that sees the page), the query rows of its heads in the range (every chunk row x each such head)
 * scaled and gathered as a matrix, S =
 * Q K^T by the row-invariant product (akv_ops_matmul_cols) in blocks of rows, a causal mask
 * and a softmax per row (two passes over the keys a row sees: max, then exp and sum), O = P V
 * accumulated key by key in ascending order over the keys the row sees, each row divided by
 * its sum. The FP32 path of attend_all, with a different order of summation (the tests hold
 * both to the float64 oracle). Every output row is one fixed recipe over its own query and
 * the keys it sees: the same bits whether its chunk has one row (a decode) or many (a
 * prefill), and whatever the other sequences of the call. */
static akv_status attend_fast(const kv_view *v, const rows_spec *r, uint32_t s, uint32_t j0,
                              uint32_t j1, uint32_t n_heads, const void *q, akv_dtype q_dtype,
                              uint32_t q_stride, float scale, const attn_out *out) {
    uint32_t d = v->head_dim, group = n_heads / v->n_kv_heads;
    size_t q_elem = akv_dtype_size(q_dtype), o_elem = akv_dtype_size(out->o_dtype);
    if (q_stride == 0) q_stride = n_heads * d;
    uint32_t len = seq_len(v, s), start, n;
    qo_range(r, s, &start, &n);
    const uint32_t max_rows = n * group; /* a K/V head's rows when all its heads are in range */
    if (len == 0 || max_rows == 0) return AKV_OK; /* run_job: never without keys */
    uint32_t blk = FAST_S_FLOATS / len;
    if (blk < 1) blk = 1;
    if (blk > max_rows) blk = max_rows;
    const uint32_t P = v->page_tokens, pt = len < P ? len : P; /* a page's keys at most */
    size_t s_n;
    if (!akv__size_mul(blk, len, &s_n)) return AKV_EOVERFLOW;
    float *kf = akv__malloc((size_t)pt * d * sizeof *kf), *vf = akv__malloc((size_t)pt * d * sizeof *vf);
    float *qm = akv__malloc((size_t)max_rows * d * sizeof *qm), *sm = akv__malloc(s_n * sizeof *sm);
    float *om = akv__malloc((size_t)blk * d * sizeof *om), *sum = akv__malloc(blk * sizeof *sum);
    akv_status st = kf && vf && qm && sm && om && sum ? AKV_OK : AKV_ENOMEM;
    for (uint32_t h = j0 / group; h <= (j1 - 1) / group && st == AKV_OK; h++) {
        /* the group's heads g0..g1-1 are in range; row x = i * G + (g - g0): chunk row i, head
         * h * group + g */
        const uint32_t g0 = h == j0 / group ? j0 % group : 0;
        const uint32_t g1 = h == (j1 - 1) / group ? (j1 - 1) % group + 1 : group;
        const uint32_t G = g1 - g0, rows = n * G;
        for (uint32_t x = 0; x < rows; x++) {
            size_t tok = (size_t)start + x / G, j = (size_t)h * group + g0 + x % G;
            float *qx = qm + (size_t)x * d;
            row_to_f32((const unsigned char *)q + (tok * q_stride + j * d) * q_elem, q_dtype, d,
                       qx);
            if (v->layout.rotate_k) akv_kvq_fwht(qx, d); /* as the K rows were */
            for (uint32_t e = 0; e < d; e++)
                qx[e] *= scale;
        }
        for (uint32_t x0 = 0; x0 < rows; x0 += blk) {
            uint32_t nb = rows - x0 < blk ? rows - x0 : blk;
            /* the scores a row sees, a page of keys at a time (head h's rows of a page lie
             * together: widened, or decoded, into kf while they are read), a token's group of
             * rows at a time (they see the same keys); the rest of S is never read */
            /* the block's last row sees the most keys (rows go by token): no page past them */
            const int64_t blk_seen = keys_seen(v, len, n, (x0 + nb - 1) / G);
            for (uint32_t t = 0; (int64_t)t < blk_seen; t += P) {
                const uint32_t nt = len - t < P ? len - t : P;
                fast_page_rows(v, s, 0, h, t, nt, kf);
                for (uint32_t b = 0; b < nb;) {
                    const uint32_t x = x0 + b, i = x / G, run = group_run(x, G, nb - b);
                    const int64_t seen = keys_seen(v, len, n, i) - (int64_t)t;
                    if (seen > 0)
                        akv_ops_matmul_cols(sm + (size_t)b * len + t, qm + (size_t)x * d, kf, NULL,
                                            run, len, d, 0, seen < nt ? (size_t)seen : nt,
                                            AKV_OPS_ISA_AUTO);
                    b += run;
                }
            }
            memset(om, 0, (size_t)nb * d * sizeof *om);
            for (uint32_t b = 0; b < nb; b++) {
                uint32_t x = x0 + b, i = x / G;
                const int64_t n_keys = keys_seen(v, len, n, i);
                float m = -INFINITY,
                      l = n_keys ? softmax_row(sm + (size_t)b * len, n_keys, &m) : 0.0f;
                size_t tok = (size_t)start + i, j = (size_t)h * group + g0 + x % G;
                if (out->lse) out->lse[tok * n_heads + j] = l > 0 ? m + logf(l) : -INFINITY;
                sum[b] = l;
            }
            /* O = P V, a page of values at a time, the rows of a token's group (they see the
             * same keys) in one pass; each row's sums go on key by key in ascending order
             * across the pages (om holds them between) */
            for (uint32_t t = 0; (int64_t)t < blk_seen; t += P) {
                const uint32_t nt = len - t < P ? len - t : P;
                fast_page_rows(v, s, 1, h, t, nt, vf);
                for (uint32_t b = 0; b < nb;) {
                    const uint32_t x = x0 + b, i = x / G;
                    uint32_t run = group_run(x, G, nb - b);
                    if (run > FAST_PV_MAX_ROWS) run = FAST_PV_MAX_ROWS;
                    const int64_t seen = keys_seen(v, len, n, i) - (int64_t)t;
                    if (seen > 0)
                        fast_pv(om + (size_t)b * d, sm + (size_t)b * len + t, len, vf,
                                seen < nt ? (size_t)seen : nt, d, run);
                    b += run;
                }
            }
            for (uint32_t b = 0; b < nb; b++) {
                uint32_t x = x0 + b;
                float l = sum[b];
                size_t tok = (size_t)start + x / G, j = (size_t)h * group + g0 + x % G;
                float *orow = om + (size_t)b * d;
                for (uint32_t e = 0; e < d; e++) orow[e] = l > 0 ? orow[e] / l : 0.0f;
                row_from_f32((unsigned char *)out->o + (tok * n_heads + j) * d * o_elem,
                             out->o_dtype, d, orow);
            }
        }
    }
    akv__free(kf), akv__free(vf), akv__free(qm), akv__free(sm), akv__free(om), akv__free(sum);
    return st;
}

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
    bool fast;       /* the blocked FP32 path (akv_attn_host_*) */
    uint32_t j0, j1; /* the query heads computed; j1 0 = every head */
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
    float scale = akv__attn_scale(j->scale, j->kv->head_dim);
    const uint32_t j0 = j->j0, j1 = j->j1 ? j->j1 : j->n_heads;
    if (!j->fast || j->out.o64) {
        attend_all(&v, &j->rows, 0, j->kv->n_seq, j0, j1, j->n_heads, j->q, j->q_dtype, j->q_stride,
                   scale, &j->out);
        return AKV_OK;
    }
    /* sequence by sequence, so that each one's bits depend on itself alone (batch invariance
     * of the host pass, docs/engine.md) */
    for (uint32_t s = 0; s < j->kv->n_seq; s++) {
        if (seq_len(&v, s) == 0) { /* no key: the plain loops write the empty states */
            attend_all(&v, &j->rows, s, s + 1, j0, j1, j->n_heads, j->q, j->q_dtype, j->q_stride,
                       scale, &j->out);
            continue;
        }
        st = attend_fast(&v, &j->rows, s, j0, j1, j->n_heads, j->q, j->q_dtype, j->q_stride, scale,
                         &j->out);
        if (st != AKV_OK) return st;
    }
    return AKV_OK;
}

static akv_status decode(const akv_attn_decode *p, double *o64, double *lse64, bool fast,
                         uint32_t j0, uint32_t j1) {
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
        .fast = fast,
        .j0 = j0,
        .j1 = j1,
    };
    return run_job(&j, op);
}

static akv_status prefill(const akv_attn_prefill *p, double *o64, double *lse64, bool fast,
                          uint32_t j0, uint32_t j1) {
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
        .fast = fast,
        .j0 = j0,
        .j1 = j1,
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
    return decode(p, NULL, NULL, false, 0, 0);
}

akv_status akv_attn_host_decode(const akv_attn_decode *p) {
    return decode(p, NULL, NULL, true, 0, 0);
}

/* A query head range: within the call's heads, non-empty. */
static bool heads_ok(uint32_t n_heads, uint32_t j0, uint32_t j1, const char *op) {
    if (j0 < j1 && j1 <= n_heads) return true;
    AKV_LOG_E("%s: query heads [%u, %u) are not a range of the call's %u", op, j0, j1, n_heads);
    return false;
}

akv_status akv_attn_host_decode_heads(const akv_attn_decode *p, uint32_t head0, uint32_t head1) {
    if (p && !heads_ok(p->n_heads, head0, head1, "host decode")) return AKV_EINVAL;
    return decode(p, NULL, NULL, true, head0, head1);
}

akv_status akv_attn_host_prefill_heads(const akv_attn_prefill *p, uint32_t head0, uint32_t head1) {
    if (p && !heads_ok(p->n_heads, head0, head1, "host prefill")) return AKV_EINVAL;
    if (p && (p->k_new.addr || p->v_new.addr)) {
        AKV_LOG_E("host prefill: a range of heads takes no k_new/v_new (append them first)");
        return AKV_EINVAL;
    }
    return prefill(p, NULL, NULL, true, head0, head1);
}

akv_status akv_attn_ref_decode_f64(const akv_attn_decode *p, double *o, double *lse) {
    if (!f64_args(p, o, "ref decode f64")) return AKV_EINVAL;
    akv_attn_decode q = *p;
    q.o = akv_attn_host_ptr(o), q.o_dtype = AKV_DTYPE_F32;
    return decode(&q, o, lse, false, 0, 0);
}

akv_status akv_attn_ref_prefill(const akv_attn_prefill *p) {
    return prefill(p, NULL, NULL, false, 0, 0);
}

akv_status akv_attn_host_prefill(const akv_attn_prefill *p) {
    return prefill(p, NULL, NULL, true, 0, 0);
}

akv_status akv_attn_ref_prefill_f64(const akv_attn_prefill *p, double *o, double *lse) {
    if (!f64_args(p, o, "ref prefill f64")) return AKV_EINVAL;
    akv_attn_prefill q = *p;
    q.o = akv_attn_host_ptr(o), q.o_dtype = AKV_DTYPE_F32;
    return prefill(&q, o, lse, false, 0, 0);
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
