/*
 * tests/attn_fixture.h — random paged K/V histories for the attention tests (CPU and GPU).
 *
 * A fixture is a pool of pages in host memory and a CSR table over it. Page ids are a
 * random permutation (a sequence's pages are scattered), every live slot holds random
 * values in [-1, 1), and every slot no sequence owns (past a sequence's length in its last
 * page, and whole spare pages) holds NaN: a kernel that reads one poisons its output.
 */
#ifndef AKV_TEST_ATTN_FIXTURE_H
#define AKV_TEST_ATTN_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "akv/attn.h"
#include "akv/kvq.h"
#include "core/half.h"
#include "test.h"

typedef struct fx_geom {
    uint32_t n_heads, n_kv_heads, head_dim, page_tokens;
    akv_dtype dtype;
} fx_geom;

typedef struct fx_table {
    fx_geom g;
    uint32_t n_seq, n_pages, max_pages;
    uint32_t *len;         /* [n_seq] tokens */
    int32_t *indptr;       /* [n_seq+1] */
    int32_t *indices;      /* [nnz] */
    int32_t *last;         /* [n_seq] */
    unsigned char *pool;   /* n_pages * page_bytes */
    size_t page_bytes, pool_bytes;
    float *dense;          /* the live values, unpaged: sequence s at dense_off[s], [2][n_kv][len][d] */
    size_t *dense_off;     /* [n_seq] */
    uint32_t repr, past;   /* the pool's akv_repr (fx_table_compact) and the table's past flag */
} fx_table;

static inline size_t fx_elem(akv_dtype t) {
    return akv_dtype_size(t);
}

/* Element i of a typed array, set from a float / a NaN. */
static inline void fx_set(void *base, akv_dtype t, size_t i, float x) {
    if (t == AKV_DTYPE_F32) ((float *)base)[i] = x;
    else if (t == AKV_DTYPE_BF16) ((uint16_t *)base)[i] = akv_f32_to_bf16(x);
    else ((uint16_t *)base)[i] = akv_f32_to_f16(x);
}
static inline float fx_get(const void *base, akv_dtype t, size_t i) {
    if (t == AKV_DTYPE_F32) return ((const float *)base)[i];
    if (t == AKV_DTYPE_BF16) return akv_bf16_to_f32(((const uint16_t *)base)[i]);
    return akv_f16_to_f32(((const uint16_t *)base)[i]);
}

/* n random values in [-amp, amp) of dtype t (malloc'd). */
static inline void *fx_random(akv_dtype t, size_t n, float amp, uint64_t *rng) {
    void *p = malloc(n * fx_elem(t) + 16);
    for (size_t i = 0; i < n; i++) fx_set(p, t, i, amp * test_rand_f32(rng));
    return p;
}

/* A table for n_seq sequences of lengths len[], plus `spare` unused pages, with capacity
 * max(pages) + cap_slack pages. */
static inline void fx_table_make(fx_table *f, fx_geom g, uint32_t n_seq, const uint32_t *len,
                                 uint32_t spare, uint32_t cap_slack, uint64_t *rng) {
    memset(f, 0, sizeof *f);
    f->g = g;
    f->n_seq = n_seq;
    f->len = malloc((n_seq + 1) * sizeof *f->len);
    f->indptr = malloc((n_seq + 1) * sizeof *f->indptr);
    f->last = malloc((n_seq + 1) * sizeof *f->last);
    uint32_t P = g.page_tokens, nnz = 0, maxp = 0;
    f->indptr[0] = 0;
    for (uint32_t s = 0; s < n_seq; s++) {
        uint32_t np = (len[s] + P - 1) / P;
        f->len[s] = len[s];
        f->last[s] = np ? (int32_t)(len[s] - (np - 1) * P) : 0;
        nnz += np;
        f->indptr[s + 1] = (int32_t)nnz;
        if (np > maxp) maxp = np;
    }
    f->max_pages = maxp + cap_slack;
    if (f->max_pages == 0) f->max_pages = 1;
    f->n_pages = nnz + spare;
    if (f->n_pages == 0) f->n_pages = 1;
    /* a random permutation of page ids: sequences own scattered pages */
    uint32_t *perm = malloc(f->n_pages * sizeof *perm);
    for (uint32_t i = 0; i < f->n_pages; i++) perm[i] = i;
    for (uint32_t i = f->n_pages; i > 1; i--) {
        uint32_t j = (uint32_t)test_rand_below(rng, i), t = perm[i - 1];
        perm[i - 1] = perm[j], perm[j] = t;
    }
    size_t n_dense = 0;
    f->dense_off = malloc((n_seq + 1) * sizeof *f->dense_off);
    for (uint32_t s = 0; s < n_seq; s++) f->dense_off[s] = n_dense, n_dense += 2ull * g.n_kv_heads * len[s] * g.head_dim;
    f->dense = malloc((n_dense + 1) * sizeof *f->dense);
    f->indices = malloc((nnz + 1) * sizeof *f->indices);
    for (uint32_t i = 0; i < nnz; i++) f->indices[i] = (int32_t)perm[i];
    free(perm);
    f->page_bytes = 2ull * g.n_kv_heads * P * g.head_dim * fx_elem(g.dtype);
    f->pool_bytes = f->page_bytes * f->n_pages;
    f->pool = malloc(f->pool_bytes);
    /* everything NaN first, then the live slots random */
    size_t n_elem = f->pool_bytes / fx_elem(g.dtype);
    for (size_t i = 0; i < n_elem; i++) fx_set(f->pool, g.dtype, i, NAN);
    for (uint32_t s = 0; s < n_seq; s++)
        for (uint32_t t = 0; t < len[s]; t++) {
            size_t page = (size_t)f->indices[f->indptr[s] + (int32_t)(t / P)];
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < g.n_kv_heads; h++) {
                    size_t base = page * (f->page_bytes / fx_elem(g.dtype)) +
                                  ((size_t)(kv * g.n_kv_heads + h) * P + t % P) * g.head_dim;
                    float *dense = f->dense + f->dense_off[s] + (((size_t)kv * g.n_kv_heads + h) * len[s] + t) * g.head_dim;
                    for (uint32_t i = 0; i < g.head_dim; i++) {
                        fx_set(f->pool, g.dtype, base + i, test_rand_f32(rng));
                        dense[i] = fx_get(f->pool, g.dtype, base + i);
                    }
                }
        }
}

/* The oracle of the oracle: attention of one query row over the first n_keys keys of
 * sequence s, K/V head h, from the unpaged copy; float64, two passes (max, then sums). */
static inline void fx_dense_attend(const fx_table *f, uint32_t s, uint32_t h, int64_t n_keys,
                                   const float *q, double scale, double *o, double *lse) {
    uint32_t d = f->g.head_dim, len = f->len[s];
    const float *K = f->dense + f->dense_off[s] + (size_t)h * len * d;
    const float *V = f->dense + f->dense_off[s] + ((size_t)f->g.n_kv_heads + h) * len * d;
    double m = -INFINITY, l = 0;
    for (int64_t t = 0; t < n_keys; t++) {
        double dot = 0;
        for (uint32_t i = 0; i < d; i++) dot += (double)q[i] * K[t * d + i];
        if (dot * scale > m) m = dot * scale;
    }
    for (uint32_t i = 0; i < d; i++) o[i] = 0;
    for (int64_t t = 0; t < n_keys; t++) {
        double dot = 0;
        for (uint32_t i = 0; i < d; i++) dot += (double)q[i] * K[t * d + i];
        double p = exp(dot * scale - m);
        l += p;
        for (uint32_t i = 0; i < d; i++) o[i] += p * V[t * d + i];
    }
    for (uint32_t i = 0; i < d; i++) o[i] = l > 0 ? o[i] / l : 0;
    *lse = l > 0 ? m + log(l) : -INFINITY;
}

/* Decode with nq queries per sequence from the unpaged copy (q packed, typed). */
static inline void fx_dense_decode(const fx_table *f, uint32_t nq, const void *q, akv_dtype q_dtype,
                                   double *o, double *lse) {
    uint32_t d = f->g.head_dim, H = f->g.n_heads, group = H / f->g.n_kv_heads;
    float qf[AKV_ATTN_MAX_HEAD_DIM];
    for (uint32_t s = 0; s < f->n_seq; s++)
        for (uint32_t qi = 0; qi < nq; qi++)
            for (uint32_t j = 0; j < H; j++) {
                size_t r = ((size_t)s * nq + qi) * H + j;
                for (uint32_t i = 0; i < d; i++) qf[i] = fx_get(q, q_dtype, r * d + i);
                int64_t n_keys = (int64_t)f->len[s] - nq + qi + 1;
                fx_dense_attend(f, s, j / group, n_keys < 0 ? 0 : n_keys, qf, 1.0 / sqrt((double)d), o + r * d, lse + r);
            }
}

static inline void fx_table_free(fx_table *f) {
    free(f->len), free(f->indptr), free(f->indices), free(f->last), free(f->pool);
    free(f->dense), free(f->dense_off);
    memset(f, 0, sizeof *f);
}

/* The table as attention parameters over host memory. */
static inline akv_attn_pages fx_pages(const fx_table *f) {
    akv_attn_pages kv = {
        .pool = akv_attn_host_ptr(f->pool),
        .indptr = akv_attn_host_ptr(f->indptr),
        .indices = akv_attn_host_ptr(f->indices),
        .last_page_len = akv_attn_host_ptr(f->last),
        .n_seq = f->n_seq,
        .n_pages = f->n_pages,
        .max_pages = f->max_pages,
        .n_kv_heads = f->g.n_kv_heads,
        .head_dim = f->g.head_dim,
        .page_tokens = f->g.page_tokens,
        .dtype = f->g.dtype,
        .repr = f->repr,
        .past = f->past,
    };
    return kv;
}

/* f's pages in representation r (same ids): every live row encoded, every other byte 0xFF
 * (a q8 code of -1 under an f16 NaN scale: a reader of a dead row gets NaN). Also the live
 * rows as the reader decodes them, K rotated back, in f's dense layout (malloc'd), the float64
 * oracle's input. */
static inline unsigned char *fx_compact_pool(const fx_table *f, akv_repr r, akv_repr_layout *l, float **dense) {
    const fx_geom g = f->g;
    if (akv_repr_layout_of(r, g.dtype, g.n_kv_heads, g.page_tokens, g.head_dim, l) != AKV_OK) return NULL;
    const akv_kvq_page_shape sh = {g.n_kv_heads, g.page_tokens, g.head_dim, g.dtype};
    unsigned char *pool = malloc(l->page_bytes * f->n_pages);
    memset(pool, 0xFF, l->page_bytes * f->n_pages);
    size_t n_dense = f->n_seq ? f->dense_off[f->n_seq - 1] + 2ull * g.n_kv_heads * f->len[f->n_seq - 1] * g.head_dim : 0;
    *dense = malloc((n_dense + 1) * sizeof **dense);
    akv_repr_layout le;
    (void)akv_repr_layout_of(AKV_REPR_EXACT, g.dtype, g.n_kv_heads, g.page_tokens, g.head_dim, &le);
    for (uint32_t s = 0; s < f->n_seq; s++)
        for (uint32_t p = 0; p * g.page_tokens < f->len[s]; p++) {
            const int32_t id = f->indices[f->indptr[s] + (int32_t)p];
            const uint32_t rows = f->len[s] - p * g.page_tokens < g.page_tokens ? f->len[s] - p * g.page_tokens : g.page_tokens;
            CHECK_OK(akv_kvq_encode_page(l, &sh, f->pool + (size_t)id * f->page_bytes,
                                         pool + (size_t)id * l->page_bytes, rows));
            for (uint32_t t = 0; t < rows; t++)
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t h = 0; h < g.n_kv_heads; h++) {
                        float *x = *dense + f->dense_off[s] +
                                   (((size_t)kv * g.n_kv_heads + h) * f->len[s] + p * g.page_tokens + t) * g.head_dim;
                        akv_kvq_read_row(l, &sh, pool + (size_t)id * l->page_bytes, kv, h, t, x);
                        if (kv == 0 && l->rotate_k) akv_kvq_fwht(x, g.head_dim);
                    }
        }
    return pool;
}

/* f's pool replaced by its pages in representation r (fx_compact_pool), as a reader sees
 * them through fx_pages; f->dense stays the exact values. */
static inline int fx_table_compact(fx_table *f, akv_repr r) {
    akv_repr_layout l;
    float *dense = NULL;
    unsigned char *pool = fx_compact_pool(f, r, &l, &dense);
    if (!pool) return 0;
    free(dense);
    free(f->pool);
    f->pool = pool, f->page_bytes = l.page_bytes, f->pool_bytes = l.page_bytes * f->n_pages;
    f->repr = (uint32_t)r;
    return 1;
}

/* The worst row error and LSE error of the last fx_compare (for reports). */
static double fx_last_worst, fx_last_worst_lse;

/* Compares typed outputs with the float64 reference, row by row (rows of d elements): the
 * relative error of a row is |got - want|_2 / max(|want|_2, 1e-6). Empty reference rows
 * (lse -inf) must be exactly 0 with lse -inf. NaN never passes. Prints the worst row.
 * `lse` may be NULL (not compared). Returns whether everything passed. */
static inline int fx_compare(const char *file, int line, const char *what, const void *o, akv_dtype o_dtype, const float *lse,
                             const double *o_ref, const double *lse_ref, size_t n_rows, uint32_t d,
                             double rel_tol, double lse_tol) {
    double worst = 0, worst_lse = 0;
    size_t worst_row = 0, worst_lse_row = 0, n_bad = 0;
    for (size_t r = 0; r < n_rows; r++) {
        double num = 0, den = 0;
        int nan = 0;
        for (uint32_t i = 0; i < d; i++) {
            double g = fx_get(o, o_dtype, r * d + i), w = o_ref[r * d + i];
            if (isnan(g)) nan = 1;
            num += (g - w) * (g - w);
            den += w * w;
        }
        double rel = nan ? INFINITY : sqrt(num) / fmax(sqrt(den), 1e-6);
        if (lse_ref[r] == -INFINITY) rel = (num == 0 && !nan) ? 0 : INFINITY;
        if (rel > worst) worst = rel, worst_row = r;
        if (rel > rel_tol) n_bad++;
        if (lse) {
            double e = lse_ref[r] == -INFINITY ? (lse[r] == -INFINITY ? 0 : INFINITY)
                                               : isnan(lse[r]) ? INFINITY : fabs(lse[r] - lse_ref[r]);
            if (e > worst_lse) worst_lse = e, worst_lse_row = r;
            if (e > lse_tol) n_bad++;
        }
    }
    test_n_checks++;
    fx_last_worst = worst, fx_last_worst_lse = worst_lse;
    if (n_bad == 0) return 1;
    test_fail(file, line);
    fprintf(stderr,
            "%s: %zu bad of %zu rows; worst row %zu rel err %.3g (tol %.3g); worst lse row %zu "
            "err %.3g (tol %.3g): got %.9g want %.9g\n",
            what, n_bad, n_rows, worst_row, worst, rel_tol, worst_lse_row, worst_lse, lse_tol,
            lse ? (double)lse[worst_lse_row] : 0.0, lse_ref[worst_lse_row]);
    return 0;
}
#define FX_COMPARE(...) fx_compare(__FILE__, __LINE__, __VA_ARGS__)

/* Worst |a - b| / max(|b|, 1) over n doubles (both infinite and equal counts as 0; NaN as
 * infinite). */
static inline double fx_worst_f64(const double *a, const double *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = a[i] == b[i] ? 0 : isnan(a[i]) || isnan(b[i]) ? INFINITY : fabs(a[i] - b[i]) / fmax(fabs(b[i]), 1);
        if (e > worst) worst = e;
    }
    return worst;
}

#endif
