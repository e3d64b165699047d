/* test_attn.c (unit) — the attention reference (ref/): FP32 against the float64 oracle on
 * scattered pages, the causal rule of new queries, prefill = decode for short chunks, the
 * K/V append, the exact merge (associative, empty states, split = whole), the page-table
 * walker, parameter validation, and the split-KV partitioning rule. */
#include "test.h"

#include "akv/attn.h"
#include "akv/log.h"
#include "akv/kvq.h"
#include "attn_fixture.h"
#include "core/assert.h"

static uint64_t rng;

static void quiet(int on) {
    akv_log_set(NULL, NULL, on ? AKV_LOG_OFF : AKV_LOG_WARN);
}

static double tol_for(akv_dtype t) {
    return t == AKV_DTYPE_F32 ? 3e-5 : t == AKV_DTYPE_F16 ? 2e-3 : 8e-3;
}

static akv_attn_decode mk_decode(const fx_table *f, uint32_t nq, const void *q, akv_dtype q_dtype,
                                 void *o, akv_dtype o_dtype, float *lse) {
    akv_attn_decode p = {
        .kv = fx_pages(f),
        .n_heads = f->g.n_heads,
        .n_query = nq,
        .q = akv_attn_host_ptr(q),
        .q_dtype = q_dtype,
        .o = akv_attn_host_ptr(o),
        .o_dtype = o_dtype,
        .lse = akv_attn_host_ptr(lse),
    };
    return p;
}

/* FP32 reference against float64 on one batch; returns the fixture's row count. */
static void decode_case(fx_geom g, uint32_t n_seq, const uint32_t *len, uint32_t nq,
                        akv_dtype q_dtype, akv_dtype o_dtype) {
    fx_table f;
    fx_table_make(&f, g, n_seq, len, 3, 2, &rng);
    size_t n_rows = (size_t)n_seq * nq * g.n_heads, d = g.head_dim;
    void *q = fx_random(q_dtype, n_rows * d, 2.0f, &rng);
    void *o = malloc(n_rows * d * akv_dtype_size(o_dtype));
    float *lse = malloc(n_rows * sizeof *lse);
    double *o64 = malloc(n_rows * d * sizeof *o64), *lse64 = malloc(n_rows * sizeof *lse64);
    akv_attn_decode p = mk_decode(&f, nq, q, q_dtype, o, o_dtype, lse);
    CHECK_OK(akv_attn_ref_decode(&p));
    CHECK_OK(akv_attn_ref_decode_f64(&p, o64, lse64));
    /* the float64 reference against a plain dense computation: checks the page walk (the
     * reference rounds the default scale to float: ~1e-8) */
    double *od = malloc(n_rows * d * sizeof *od), *ld = malloc(n_rows * sizeof *ld);
    fx_dense_decode(&f, nq, q, q_dtype, od, ld);
    double e_o = fx_worst_f64(o64, od, n_rows * d), e_l = fx_worst_f64(lse64, ld, n_rows);
    TEST_CHECK_(e_o < 1e-7 && e_l < 1e-7,  "f64 reference vs dense: worst error o %.3g lse %.3g", e_o, e_l);
    free(od), free(ld);
    char what[160];
    snprintf(what, sizeof what, "decode %u/%u d%u P%u %s, %u seqs, nq %u, q %s, o %s", g.n_heads,
             g.n_kv_heads, g.head_dim, g.page_tokens, akv_dtype_name(g.dtype), n_seq, nq,
             akv_dtype_name(q_dtype), akv_dtype_name(o_dtype));
    FX_COMPARE(what, o, o_dtype, lse, o64, lse64, n_rows, g.head_dim, tol_for(o_dtype), 2e-5);
    free(q), free(o), free(lse), free(o64), free(lse64);
    fx_table_free(&f);
}

/* Lengths that hit every edge of a page: empty, one token, a page minus/plus one, ... */
static uint32_t hostile_len(uint32_t P, uint32_t i) {
    const uint32_t k[] = {0, 1, P - 1, P, P + 1, 2 * P + 3, 97, 3 * P - 1};
    uint32_t v = k[i % 8];
    return v == 0 && i % 8 != 0 ? 1 : v;
}

static void test_decode_vs_f64(void) {
    const fx_geom geoms[] = {
        {32, 8, 128, 64, AKV_DTYPE_BF16}, /* Llama-3-8B-like */
        {9, 3, 64, 256, AKV_DTYPE_BF16},  /* SmolLM2-135M */
        {4, 4, 32, 16, AKV_DTYPE_F32},    /* MHA, f32 pages */
        {6, 2, 64, 16, AKV_DTYPE_F16},    /* f16 pages, odd group */
        {16, 1, 128, 32, AKV_DTYPE_BF16}, /* one K/V head, group 16 */
    };
    const akv_dtype dts[] = {AKV_DTYPE_F32, AKV_DTYPE_BF16, AKV_DTYPE_F16};
    for (size_t gi = 0; gi < AKV_ARRAY_LEN(geoms); gi++) {
        fx_geom g = geoms[gi];
        for (uint32_t nq = 1; nq <= AKV_ATTN_MAX_QUERIES; nq++) {
            uint32_t n_seq = 5, len[8];
            for (uint32_t s = 0; s < n_seq; s++) len[s] = hostile_len(g.page_tokens > 64 ? 64 : g.page_tokens, s + nq);
            if (g.page_tokens == 256) len[0] = 255, len[1] = 257;
            decode_case(g, n_seq, len, nq, dts[(gi + nq) % 3], dts[(gi + 2 * nq) % 3]);
        }
    }
}

static void test_hostile_batch(void) {
    /* 97 sequences whose lengths cycle through every edge of a page */
    fx_geom g = {9, 3, 64, 16, AKV_DTYPE_BF16};
    uint32_t len[97];
    for (uint32_t s = 0; s < 97; s++) len[s] = hostile_len(16, s);
    decode_case(g, 97, len, 2, AKV_DTYPE_BF16, AKV_DTYPE_F32);
}

/* Empty sequences and queries before the first key give exactly o = 0, lse = -inf. */
static void test_empty_rows(void) {
    fx_geom g = {2, 1, 16, 16, AKV_DTYPE_BF16};
    uint32_t len[3] = {0, 1, 2};
    fx_table f;
    fx_table_make(&f, g, 3, len, 0, 0, &rng);
    uint32_t nq = 4;
    size_t n_rows = 3 * nq * g.n_heads;
    float *q = fx_random(AKV_DTYPE_F32, n_rows * 16, 1.0f, &rng), o[3 * 4 * 2 * 16], lse[3 * 4 * 2];
    akv_attn_decode p = mk_decode(&f, nq, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    CHECK_OK(akv_attn_ref_decode(&p));
    for (uint32_t s = 0; s < 3; s++)
        for (uint32_t qi = 0; qi < nq; qi++)
            for (uint32_t j = 0; j < g.n_heads; j++) {
                size_t r = ((size_t)s * nq + qi) * g.n_heads + j;
                int visible = (int)len[s] - (int)nq + (int)qi + 1 > 0;
                if (!visible) {
                    CHECK(lse[r] == -INFINITY);
                    for (int i = 0; i < 16; i++) CHECK(o[r * 16 + i] == 0.0f);
                } else {
                    CHECK(isfinite(lse[r]));
                }
            }
    free(q);
    fx_table_free(&f);
}

/* Query qi of n sees exactly the keys of a history of len - n + qi + 1 tokens: the same
 * bits as a one-query decode over the table truncated there. */
static void test_causal_rule(void) {
    fx_geom g = {8, 2, 64, 16, AKV_DTYPE_BF16};
    uint32_t len[4] = {40, 17, 16, 100}, nq = 3, d = 64;
    fx_table f;
    fx_table_make(&f, g, 4, len, 2, 1, &rng);
    size_t n_rows = 4 * nq * g.n_heads;
    float *q = fx_random(AKV_DTYPE_F32, n_rows * d, 1.5f, &rng);
    float *o = malloc(n_rows * d * 4), *lse = malloc(n_rows * 4);
    akv_attn_decode p = mk_decode(&f, nq, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    CHECK_OK(akv_attn_ref_decode(&p));
    for (uint32_t s = 0; s < 4; s++)
        for (uint32_t qi = 0; qi < nq; qi++) {
            uint32_t n = len[s] - nq + qi + 1, np = (n + 15) / 16;
            int32_t indptr[2] = {0, (int32_t)np}, last = (int32_t)(n - (np - 1) * 16);
            akv_attn_decode one = p;
            one.kv.n_seq = 1;
            one.kv.indptr = akv_attn_host_ptr(indptr);
            one.kv.indices = akv_attn_host_ptr(f.indices + f.indptr[s]);
            one.kv.last_page_len = akv_attn_host_ptr(&last);
            one.n_query = 1;
            one.q = akv_attn_host_ptr(q + ((size_t)s * nq + qi) * g.n_heads * d);
            float o1[8 * 64], lse1[8];
            one.o = akv_attn_host_ptr(o1);
            one.lse = akv_attn_host_ptr(lse1);
            CHECK_OK(akv_attn_ref_decode(&one));
            size_t r = ((size_t)s * nq + qi) * g.n_heads;
            CHECK_BYTES(o1, o + r * d, sizeof o1);
            CHECK_BYTES(lse1, lse + r, sizeof lse1);
        }
    free(q), free(o), free(lse);
    fx_table_free(&f);
}

static akv_attn_prefill mk_prefill(const fx_table *f, const int32_t *qo, uint32_t n_tokens,
                                   uint32_t max_chunk, const void *q, void *o, float *lse) {
    akv_attn_prefill p = {
        .kv = fx_pages(f),
        .n_heads = f->g.n_heads,
        .qo_indptr = akv_attn_host_ptr(qo),
        .n_tokens = n_tokens,
        .max_chunk = max_chunk,
        .q = akv_attn_host_ptr(q),
        .q_dtype = AKV_DTYPE_F32,
        .o = akv_attn_host_ptr(o),
        .o_dtype = AKV_DTYPE_F32,
        .lse = akv_attn_host_ptr(lse),
    };
    return p;
}

/* A prefill of uniform chunks of n <= 4 tokens is decode with n queries, bit for bit. */
static void test_prefill_is_decode(void) {
    fx_geom g = {12, 4, 32, 16, AKV_DTYPE_BF16};
    uint32_t len[5] = {4, 5, 16, 33, 70}, nq = 4, d = 32;
    fx_table f;
    fx_table_make(&f, g, 5, len, 0, 0, &rng);
    size_t n_rows = 5 * nq * g.n_heads;
    float *q = fx_random(AKV_DTYPE_F32, n_rows * d, 1.0f, &rng);
    float *o1 = malloc(n_rows * d * 4), *o2 = malloc(n_rows * d * 4), *l1 = malloc(n_rows * 4), *l2 = malloc(n_rows * 4);
    int32_t qo[6];
    for (int s = 0; s <= 5; s++) qo[s] = s * (int32_t)nq;
    akv_attn_decode dp = mk_decode(&f, nq, q, AKV_DTYPE_F32, o1, AKV_DTYPE_F32, l1);
    akv_attn_prefill pp = mk_prefill(&f, qo, 5 * nq, nq, q, o2, l2);
    CHECK_OK(akv_attn_ref_decode(&dp));
    CHECK_OK(akv_attn_ref_prefill(&pp));
    CHECK_BYTES(o1, o2, n_rows * d * 4);
    CHECK_BYTES(l1, l2, n_rows * 4);
    free(q), free(o1), free(o2), free(l1), free(l2);
    fx_table_free(&f);
}

/* Prefill with the chunk's K/V given: it lands in the right slots (and nowhere else), then
 * FP32 agrees with float64 over history + chunk. Chunks of 0, 1, 17 and 40 tokens over
 * histories of 0, P-1, P+1 and 3 tokens. */
static void test_prefill(void) {
    fx_geom g = {6, 2, 64, 16, AKV_DTYPE_BF16};
    uint32_t hist[4] = {0, 15, 17, 3}, chunk[4] = {0, 1, 17, 40}, len[4], d = 64;
    int32_t qo[5] = {0};
    for (int s = 0; s < 4; s++) len[s] = hist[s] + chunk[s], qo[s + 1] = qo[s] + (int32_t)chunk[s];
    uint32_t n_tok = (uint32_t)qo[4];
    fx_table f;
    fx_table_make(&f, g, 4, len, 1, 0, &rng);
    float *q = fx_random(AKV_DTYPE_F32, (size_t)n_tok * g.n_heads * d, 2.0f, &rng);
    float *k = fx_random(AKV_DTYPE_F32, (size_t)n_tok * g.n_kv_heads * d, 1.0f, &rng);
    float *v = fx_random(AKV_DTYPE_F32, (size_t)n_tok * g.n_kv_heads * d, 1.0f, &rng);
    size_t n_rows = (size_t)n_tok * g.n_heads;
    float *o = malloc(n_rows * d * 4), *lse = malloc(n_rows * 4);
    double *o64 = malloc(n_rows * d * 8), *lse64 = malloc(n_rows * 8);
    unsigned char *before = malloc(f.pool_bytes);
    memcpy(before, f.pool, f.pool_bytes);
    akv_attn_prefill p = mk_prefill(&f, qo, n_tok, 40, q, o, lse);
    p.k_new = akv_attn_host_ptr(k), p.v_new = akv_attn_host_ptr(v), p.kv_new_dtype = AKV_DTYPE_F32;
    CHECK_OK(akv_attn_ref_prefill(&p));
    /* every chunk row is in its slot, rounded to bf16; count the changed bytes */
    size_t n_changed = 0, n_expected = 0;
    for (size_t i = 0; i < f.pool_bytes; i++) n_changed += f.pool[i] != before[i];
    for (uint32_t s = 0; s < 4; s++)
        for (uint32_t i = 0; i < chunk[s]; i++) {
            uint32_t t = hist[s] + i;
            size_t page = (size_t)f.indices[f.indptr[s] + (int32_t)(t / 16)];
            for (uint32_t kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < g.n_kv_heads; h++) {
                    const uint16_t *slot = (const uint16_t *)(f.pool + page * f.page_bytes) +
                                           ((size_t)(kv * g.n_kv_heads + h) * 16 + t % 16) * d;
                    const float *src = (kv ? v : k) + (((size_t)qo[s] + i) * g.n_kv_heads + h) * d;
                    for (uint32_t e = 0; e < d; e++) {
                        if (slot[e] != akv_f32_to_bf16(src[e])) {
                            CHECK_EQ_INT(slot[e], akv_f32_to_bf16(src[e]));
                            goto done;
                        }
                        n_expected += 2;
                    }
                }
        }
done:
    CHECK(n_changed <= n_expected);
    /* the float64 pass re-writes the same bits, then attends */
    CHECK_OK(akv_attn_ref_prefill_f64(&p, o64, lse64));
    FX_COMPARE("prefill f32 vs f64", o, AKV_DTYPE_F32, lse, o64, lse64, n_rows, d, 3e-5, 2e-5);
    free(q), free(k), free(v), free(o), free(lse), free(o64), free(lse64), free(before);
    fx_table_free(&f);
}

static void test_append(void) {
    fx_geom g = {4, 2, 32, 16, AKV_DTYPE_BF16};
    uint32_t len[3] = {1, 16, 18}, d = 32;
    fx_table f;
    fx_table_make(&f, g, 3, len, 0, 0, &rng);
    /* one new token per sequence, f32 rows in a fused [q|k|v]-like layout (stride 3x) */
    uint32_t stride = 3 * g.n_kv_heads * d;
    float *kv = fx_random(AKV_DTYPE_F32, (size_t)3 * stride, 1.0f, &rng);
    akv_attn_append a = {
        .kv = fx_pages(&f), .n_per_seq = 1, .n_tokens = 3, .max_new = 1,
        .k = akv_attn_host_ptr(kv), .v = akv_attn_host_ptr(kv + g.n_kv_heads * d),
        .dtype = AKV_DTYPE_F32, .stride = stride,
    };
    CHECK_OK(akv_attn_ref_append(&a));
    for (uint32_t s = 0; s < 3; s++) {
        uint32_t t = len[s] - 1;
        size_t page = (size_t)f.indices[f.indptr[s] + (int32_t)(t / 16)];
        for (uint32_t x = 0; x < 2; x++)
            for (uint32_t h = 0; h < 2; h++) {
                const uint16_t *slot = (const uint16_t *)(f.pool + page * f.page_bytes) + ((size_t)(x * 2 + h) * 16 + t % 16) * d;
                const float *src = kv + (size_t)s * stride + (size_t)x * g.n_kv_heads * d + (size_t)h * d;
                for (uint32_t e = 0; e < d; e++)
                    if (slot[e] != akv_f32_to_bf16(src[e])) CHECK_EQ_INT(slot[e], akv_f32_to_bf16(src[e]));
            }
    }
    /* more new tokens than a sequence holds: refused, nothing written */
    unsigned char *before = malloc(f.pool_bytes);
    memcpy(before, f.pool, f.pool_bytes);
    a.n_per_seq = 2, a.n_tokens = 6, a.max_new = 2;
    float *kv2 = fx_random(AKV_DTYPE_F32, (size_t)6 * stride, 1.0f, &rng);
    a.k = akv_attn_host_ptr(kv2), a.v = akv_attn_host_ptr(kv2 + g.n_kv_heads * d);
    quiet(1);
    CHECK_STATUS(akv_attn_ref_append(&a), AKV_EINVAL);
    quiet(0);
    CHECK_BYTES(before, f.pool, f.pool_bytes);
    free(before), free(kv), free(kv2);
    fx_table_free(&f);
}

static float frand(void) {
    return test_rand_f32(&rng);
}

static void random_state(uint32_t d, float *o, float *lse) {
    for (uint32_t i = 0; i < d; i++) o[i] = frand();
    *lse = 20.0f * frand();
}

static void test_merge(void) {
    enum { D = 48 };
    for (int trial = 0; trial < 200; trial++) {
        float a[D], b[D], c[D], la, lb, lc;
        random_state(D, a, &la), random_state(D, b, &lb), random_state(D, c, &lc);
        if (trial % 7 == 0) lb = -INFINITY, memset(b, 0, sizeof b); /* empty middle */
        /* (a + b) + c */
        float x[D], lx = la;
        memcpy(x, a, sizeof x);
        akv_attn_merge_state(D, x, &lx, b, lb);
        akv_attn_merge_state(D, x, &lx, c, lc);
        /* a + (b + c) */
        float y[D], ly = lb, z[D], lz = la;
        memcpy(y, b, sizeof y);
        akv_attn_merge_state(D, y, &ly, c, lc);
        memcpy(z, a, sizeof z);
        akv_attn_merge_state(D, z, &lz, y, ly);
        CHECK_NEAR(lx, lz, 1e-5 * (1 + fabs(lz)));
        CHECK_CLOSE_F32(x, z, D, 1e-6, 1e-5);
        /* commutative */
        float w[D], lw = lb;
        memcpy(w, b, sizeof w);
        if (lb != -INFINITY) {
            akv_attn_merge_state(D, w, &lw, a, la);
            memcpy(y, a, sizeof y), ly = la;
            akv_attn_merge_state(D, y, &ly, b, lb);
            CHECK_CLOSE_F32(w, y, D, 1e-6, 1e-6);
        }
        /* the empty state is an exact identity on both sides */
        float e[D] = {0}, le = -INFINITY;
        memcpy(y, a, sizeof y), ly = la;
        akv_attn_merge_state(D, y, &ly, e, le);
        CHECK_BYTES(y, a, sizeof y);
        CHECK(ly == la);
        akv_attn_merge_state(D, e, &le, a, la);
        CHECK_BYTES(e, a, sizeof e);
        CHECK(le == la);
    }
    /* two empties stay empty without NaN */
    float e[4] = {0}, f[4] = {0}, le = -INFINITY;
    akv_attn_merge_state(4, e, &le, f, -INFINITY);
    CHECK(le == -INFINITY && e[0] == 0.0f);
}

/* Attention over a whole history equals the merge of attention over its first pages and
 * attention over the rest (one query sees every key): the split-KV identity. Also the
 * array merge, in place. */
static void test_split_equals_whole(void) {
    fx_geom g = {8, 2, 64, 16, AKV_DTYPE_BF16};
    uint32_t len[1] = {16 * 7 + 5}, d = 64, cut_pages = 3;
    fx_table f;
    fx_table_make(&f, g, 1, len, 0, 0, &rng);
    float *q = fx_random(AKV_DTYPE_F32, (size_t)g.n_heads * d, 2.0f, &rng);
    float o[8 * 64], lse[8], oa[8 * 64], la[8], ob[8 * 64], lb[8];
    double o64[8 * 64], l64[8];
    akv_attn_decode p = mk_decode(&f, 1, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    CHECK_OK(akv_attn_ref_decode_f64(&p, o64, l64));
    int32_t ip_a[2] = {0, (int32_t)cut_pages}, last_a = 16, ip_b[2] = {0, 8 - (int32_t)cut_pages};
    akv_attn_decode pa = p, pb = p;
    pa.kv.indptr = akv_attn_host_ptr(ip_a), pa.kv.last_page_len = akv_attn_host_ptr(&last_a);
    pa.o = akv_attn_host_ptr(oa), pa.lse = akv_attn_host_ptr(la);
    pb.kv.indptr = akv_attn_host_ptr(ip_b), pb.kv.indices = akv_attn_host_ptr(f.indices + cut_pages);
    pb.o = akv_attn_host_ptr(ob), pb.lse = akv_attn_host_ptr(lb);
    CHECK_OK(akv_attn_ref_decode(&pa));
    CHECK_OK(akv_attn_ref_decode(&pb));
    akv_attn_merge m = {
        .n_rows = 8, .head_dim = d,
        .o_a = akv_attn_host_ptr(oa), .lse_a = akv_attn_host_ptr(la),
        .o_b = akv_attn_host_ptr(ob), .lse_b = akv_attn_host_ptr(lb),
        .o = akv_attn_host_ptr(oa), .o_dtype = AKV_DTYPE_F32, .lse = akv_attn_host_ptr(la),
    };
    CHECK_OK(akv_attn_ref_merge(&m));
    FX_COMPARE("merge(first 3 pages, rest) vs whole", oa, AKV_DTYPE_F32, la, o64, l64, 8, d, 3e-5, 2e-5);
    /* aliasing a bf16 output onto an f32 input is refused */
    m.o_dtype = AKV_DTYPE_BF16;
    quiet(1);
    CHECK_STATUS(akv_attn_ref_merge(&m), AKV_EINVAL);
    quiet(0);
    free(q);
    fx_table_free(&f);
}

/* ---- compact pages and parts ---------------------------------------------------------- */

/* Decode and prefill read compact pages in place: against the float64 attention over the
 * decoded rows (K rotated back, the query not rotated: an independent account of the
 * rotation), and, loosely, against the exact pages they were made from. */
static void test_compact_pages(void) {
    const uint32_t dims[] = {64, 128};
    for (int r = AKV_REPR_Q8; r <= AKV_REPR_Q4; r++)
        for (int di = 0; di < 2; di++) {
            const uint32_t d = dims[di];
            fx_geom g = {8, 2, d, 16, AKV_DTYPE_BF16};
            uint32_t len[5] = {1, 15, 16, 17, 100}, nq = 3, n_seq = 5;
            fx_table f;
            fx_table_make(&f, g, n_seq, len, 2, 1, &rng);
            akv_repr_layout l;
            float *dense = NULL;
            unsigned char *pool = fx_compact_pool(&f, (akv_repr)r, &l, &dense);
            if (!CHECK(pool != NULL)) break;
            size_t n_rows = (size_t)n_seq * nq * g.n_heads;
            float *q = fx_random(AKV_DTYPE_F32, n_rows * d, 2.0f, &rng);
            float *o = malloc(n_rows * d * 4), *lse = malloc(n_rows * 4);
            double *o64 = malloc(n_rows * d * 8), *lse64 = malloc(n_rows * 8);
            double *ox = malloc(n_rows * d * 8), *lx = malloc(n_rows * 8);
            fx_dense_decode(&f, nq, q, AKV_DTYPE_F32, ox, lx); /* the exact pages' attention */
            float *exact_dense = f.dense;
            f.dense = dense;
            fx_dense_decode(&f, nq, q, AKV_DTYPE_F32, o64, lse64); /* the decoded rows' */
            f.dense = exact_dense;
            akv_attn_decode p = mk_decode(&f, nq, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
            p.kv.pool = akv_attn_host_ptr(pool), p.kv.repr = (uint32_t)r;
            char what[64];
            snprintf(what, sizeof what, "%s d%u ref decode", akv_repr_name((akv_repr)r), d);
            CHECK_OK(akv_attn_ref_decode(&p));
            FX_COMPARE(what, o, AKV_DTYPE_F32, lse, o64, lse64, n_rows, d, 1e-4, 2e-5);
            double *of = malloc(n_rows * d * 8), *lf = malloc(n_rows * 8);
            CHECK_OK(akv_attn_ref_decode_f64(&p, of, lf));
            float *off = malloc(n_rows * d * 4);
            for (size_t i = 0; i < n_rows * d; i++) off[i] = (float)of[i];
            float *lff = malloc(n_rows * 4);
            for (size_t i = 0; i < n_rows; i++) lff[i] = (float)lf[i];
            snprintf(what, sizeof what, "%s d%u ref decode f64", akv_repr_name((akv_repr)r), d);
            FX_COMPARE(what, off, AKV_DTYPE_F32, lff, o64, lse64, n_rows, d, 1e-5, 1e-5);
            /* what the form costs against the exact pages: a report, and a loose bound */
            double worst = 0;
            for (size_t row = 0; row < n_rows; row++) {
                double num = 0, den = 0;
                for (uint32_t e = 0; e < d; e++) {
                    num += (o64[row * d + e] - ox[row * d + e]) * (o64[row * d + e] - ox[row * d + e]);
                    den += ox[row * d + e] * ox[row * d + e];
                }
                worst = fmax(worst, sqrt(num) / fmax(sqrt(den), 1e-6));
            }
            printf("  %s d%u: worst row against the exact pages %.3g\n", akv_repr_name((akv_repr)r), d, worst);
            CHECK(worst < (r == AKV_REPR_Q8 ? 0.02 : 0.3));
            free(q), free(o), free(lse), free(o64), free(lse64), free(ox), free(lx), free(of), free(lf);
            free(off), free(lff), free(pool), free(dense);
            fx_table_free(&f);
        }
}

/* A history read as two parts, older pages (past, exact or compact) and the rest (the
 * queries' own: decode rows or a prefill chunk at its end), merged by LSE: the attention
 * over the whole history, each key as its part holds it. */
static void test_parts_merge_to_the_whole(void) {
    fx_geom g = {6, 2, 64, 16, AKV_DTYPE_BF16};
    const uint32_t d = 64, L = 16 * 9 + 7, cut = 4; /* 4 older pages, 6 recent (the last partial) */
    for (int r = AKV_REPR_EXACT; r <= AKV_REPR_Q4; r++)
        for (int prefill = 0; prefill < 2; prefill++) {
            uint32_t len[1] = {L};
            fx_table f;
            fx_table_make(&f, g, 1, len, 1, 0, &rng);
            akv_repr_layout l;
            float *dense = NULL;
            unsigned char *pool = r == AKV_REPR_EXACT ? f.pool : fx_compact_pool(&f, (akv_repr)r, &l, &dense);
            const uint32_t n = prefill ? 21 : 3; /* new rows at the end of the history */
            const size_t n_rows = (size_t)n * g.n_heads;
            float *q = fx_random(AKV_DTYPE_F32, n_rows * d, 2.0f, &rng);
            float oa[21 * 6 * 64], la[21 * 6], ob[21 * 6 * 64], lb[21 * 6];
            double o64[21 * 6 * 64], l64[21 * 6];
            /* the oracle: the dense history, its first cut pages as the older part holds them */
            if (dense) {
                for (uint32_t kv = 0; kv < 2; kv++)
                    for (uint32_t h = 0; h < g.n_kv_heads; h++)
                        memcpy(f.dense + ((size_t)kv * g.n_kv_heads + h) * L * d,
                               dense + ((size_t)kv * g.n_kv_heads + h) * L * d, (size_t)cut * 16 * d * sizeof *dense);
            }
            fx_dense_decode(&f, n, q, AKV_DTYPE_F32, o64, l64);
            int32_t ip_a[2] = {0, (int32_t)cut}, last_a = 16, ip_b[2] = {0, 10 - (int32_t)cut};
            int32_t qo[2] = {0, (int32_t)n};
            akv_attn_pages older = fx_pages(&f), recent = fx_pages(&f);
            older.indptr = akv_attn_host_ptr(ip_a), older.last_page_len = akv_attn_host_ptr(&last_a);
            older.pool = akv_attn_host_ptr(pool), older.repr = (uint32_t)r, older.past = 1;
            recent.indptr = akv_attn_host_ptr(ip_b), recent.indices = akv_attn_host_ptr(f.indices + cut);
            for (int part = 0; part < 2; part++) {
                const akv_attn_pages kv = part ? recent : older;
                float *o = part ? ob : oa, *lse = part ? lb : la;
                if (prefill) {
                    akv_attn_prefill pp = mk_prefill(&f, qo, n, n, q, o, lse);
                    pp.kv = kv;
                    CHECK_OK(akv_attn_ref_prefill(&pp));
                    if (!part) { /* the chunk's rows as the queries of a decode (as the device
                                    pass reads a past part for a prompt chunk): the same states */
                        float od[21 * 6 * 64], ld[21 * 6];
                        akv_attn_decode pd = mk_decode(&f, n, q, AKV_DTYPE_F32, od, AKV_DTYPE_F32, ld);
                        pd.kv = kv;
                        CHECK_OK(akv_attn_ref_decode(&pd));
                        CHECK_CLOSE_F32(od, o, n_rows * d, 1e-6, 1e-5);
                        CHECK_CLOSE_F32(ld, lse, n_rows, 1e-6, 1e-5);
                    }
                } else {
                    akv_attn_decode pd = mk_decode(&f, n, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
                    pd.kv = kv;
                    CHECK_OK(akv_attn_ref_decode(&pd));
                }
            }
            for (size_t row = 0; row < n_rows; row++)
                akv_attn_merge_state(d, oa + row * d, la + row, ob + row * d, lb[row]);
            char what[64];
            snprintf(what, sizeof what, "%s older part + recent, %s", akv_repr_name((akv_repr)r),
                     prefill ? "prefill of 21" : "decode of 3");
            FX_COMPARE(what, oa, AKV_DTYPE_F32, la, o64, l64, n_rows, d, 1e-4, 2e-5);
            if (dense) free(pool), free(dense);
            free(q);
            fx_table_free(&f);
        }
}

/* A compact past part widened to exact pages (akv_attn_widen: what the device pass's prefill
 * reads of a chunk's compacted history): over a view of a batch (its first sequence not the
 * table's first; one with no page), from page `first`, max_out at a time, the out table packs
 * each sequence's pages in order and every row is the decoded row, K rotated back, in bf16;
 * the pieces' prefill states merged equal the prefill over the compact part itself. */
static void test_widen(void) {
    for (int r = AKV_REPR_Q8; r <= AKV_REPR_Q4; r++) {
        const fx_geom g = {4, 2, 32, 8, AKV_DTYPE_BF16};
        const uint32_t d = 32, P = 8, len[5] = {3 * P, 7 * P, 0, 2 * P + 5, 5 * P};
        fx_table f;
        fx_table_make(&f, g, 5, len, 2, 1, &rng);
        akv_repr_layout l, le;
        float *dense = NULL;
        unsigned char *cpool = fx_compact_pool(&f, (akv_repr)r, &l, &dense);
        CHECK_OK(akv_repr_layout_of(AKV_REPR_EXACT, g.dtype, g.n_kv_heads, P, d, &le));
        akv_attn_pages view = fx_pages(&f); /* sequences 1..4, past, compact */
        view.pool = akv_attn_host_ptr(cpool), view.repr = (uint32_t)r, view.past = 1;
        view.indptr = akv_attn_host_ptr(f.indptr + 1), view.last_page_len = akv_attn_host_ptr(f.last + 1);
        view.n_seq = 4;
        /* the chunk: 3 rows of each sequence after its history */
        const uint32_t nq = 3, n_rows = 4 * nq * g.n_heads;
        int32_t qo[5] = {0, 3, 6, 9, 12};
        float *q = fx_random(AKV_DTYPE_F32, (size_t)n_rows * d, 2.0f, &rng);
        float *ow = malloc((size_t)n_rows * d * 4), *lw = malloc(n_rows * 4);
        float *op = malloc((size_t)n_rows * d * 4), *lp = malloc(n_rows * 4);
        float *oc = malloc((size_t)n_rows * d * 4), *lc = malloc(n_rows * 4);
        akv_attn_prefill whole = mk_prefill(&f, qo, 4 * nq, nq, q, oc, lc);
        whole.kv = view;
        CHECK_OK(akv_attn_ref_prefill(&whole));
        const uint32_t firsts[3] = {0, 0, 2}, outs[3] = {100, 3, 2};
        for (int c = 0; c < 3; c++) {
            const uint32_t first = firsts[c], max_out = outs[c];
            unsigned char *out = malloc(4 * max_out * le.page_bytes);
            int32_t ip[5], ix[400], last[4];
            bool first_piece = true;
            for (uint32_t at = first; at < 7; at += max_out) {
                akv_attn_widen w = {.kv = view,
                                    .first = at,
                                    .max_out = max_out,
                                    .out_pool = akv_attn_host_ptr(out),
                                    .out_indptr = akv_attn_host_ptr(ip),
                                    .out_indices = akv_attn_host_ptr(ix),
                                    .out_last = akv_attn_host_ptr(last)};
                CHECK_OK(akv_attn_ref_widen(&w));
                int32_t o = 0;
                for (uint32_t s = 0; s < 4; s++) {
                    const uint32_t n = (len[s + 1] + P - 1) / P;
                    const uint32_t give = n > at ? (n - at < max_out ? n - at : max_out) : 0;
                    CHECK_EQ_INT(ip[s], o);
                    const int32_t want_last = give == 0 ? 0 : at + give == n ? f.last[s + 1] : (int32_t)P;
                    CHECK_EQ_INT(last[s], want_last);
                    for (uint32_t j = 0; j < give; j++, o++) {
                        CHECK_EQ_INT(ix[o], o);
                        /* every live row: the decoded row, K rotated back, rounded to bf16 */
                        const uint32_t rows = (at + j) * P + P <= len[s + 1] ? P : len[s + 1] - (at + j) * P;
                        bool same = true;
                        for (uint32_t kv = 0; kv < 2; kv++)
                            for (uint32_t h = 0; h < g.n_kv_heads; h++)
                                for (uint32_t t = 0; t < rows; t++)
                                    for (uint32_t i = 0; i < d; i++) {
                                        const float x = dense[f.dense_off[s + 1] +
                                                              (((size_t)kv * g.n_kv_heads + h) * len[s + 1] +
                                                               (at + j) * P + t) * d + i];
                                        const uint16_t got = ((const uint16_t *)(out + (size_t)o * le.page_bytes))
                                            [((size_t)(kv * g.n_kv_heads + h) * P + t) * d + i];
                                        same = same && got == akv_f32_to_bf16(x);
                                    }
                        CHECK(same);
                    }
                }
                CHECK_EQ_INT(ip[4], o);
                /* the piece's prefill (past, exact) merged into the others' */
                akv_attn_prefill pp = mk_prefill(&f, qo, 4 * nq, nq, q, first_piece ? ow : op, first_piece ? lw : lp);
                pp.kv = (akv_attn_pages){.pool = w.out_pool, .indptr = w.out_indptr, .indices = w.out_indices,
                                         .last_page_len = w.out_last, .n_seq = 4, .n_pages = 4 * max_out,
                                         .max_pages = max_out, .n_kv_heads = g.n_kv_heads, .head_dim = d,
                                         .page_tokens = P, .dtype = g.dtype, .past = 1};
                CHECK_OK(akv_attn_ref_prefill(&pp));
                if (!first_piece)
                    for (uint32_t row = 0; row < n_rows; row++)
                        akv_attn_merge_state(d, ow + (size_t)row * d, lw + row, op + (size_t)row * d, lp[row]);
                first_piece = false;
            }
            if (first == 0) { /* every page widened: the compact part's states, to bf16's rounding */
                CHECK_CLOSE_F32(ow, oc, (size_t)n_rows * d, 2e-2, 2e-2);
                CHECK_CLOSE_F32(lw, lc, n_rows, 2e-2, 1e-3);
            }
            free(out);
        }
        /* refused: an exact or non-past table, no out table */
        akv_attn_widen bad = {.kv = view, .max_out = 1};
        quiet(1);
        CHECK_STATUS(akv_attn_ref_widen(&bad), AKV_EINVAL);
        bad.out_pool = bad.out_indptr = bad.out_indices = bad.out_last = akv_attn_host_ptr(q);
        bad.kv.past = 0;
        CHECK_STATUS(akv_attn_ref_widen(&bad), AKV_EINVAL);
        bad.kv.past = 1, bad.kv.repr = AKV_REPR_EXACT;
        CHECK_STATUS(akv_attn_ref_widen(&bad), AKV_EINVAL);
        quiet(0);
        free(q), free(ow), free(lw), free(op), free(lp), free(oc), free(lc);
        free(cpool), free(dense);
        fx_table_free(&f);
    }
}

/* What a compact or past part refuses: being written, and shapes its form cannot hold. */
static void test_compact_validation(void) {
    fx_geom g = {4, 2, 64, 16, AKV_DTYPE_BF16};
    uint32_t len[1] = {20};
    fx_table f;
    fx_table_make(&f, g, 1, len, 0, 0, &rng);
    float q[4 * 64] = {0}, o[4 * 64], lse[4], k[2 * 64] = {0};
    int32_t qo[2] = {0, 1};
    quiet(1);
    akv_attn_append ap = {.kv = fx_pages(&f), .n_per_seq = 1, .n_tokens = 1, .max_new = 1,
                          .k = akv_attn_host_ptr(k), .v = akv_attn_host_ptr(k), .dtype = AKV_DTYPE_F32};
    ap.kv.repr = AKV_REPR_Q8;
    CHECK_STATUS(akv_attn_ref_append(&ap), AKV_EINVAL); /* compact pages are made, not appended */
    ap.kv.repr = AKV_REPR_EXACT, ap.kv.past = 1;
    CHECK_STATUS(akv_attn_ref_append(&ap), AKV_EINVAL);
    akv_attn_prefill pp = mk_prefill(&f, qo, 1, 1, q, o, lse);
    pp.k_new = akv_attn_host_ptr(k), pp.v_new = akv_attn_host_ptr(k), pp.kv_new_dtype = AKV_DTYPE_F32;
    pp.kv.past = 1;
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL);
    pp.kv.past = 0, pp.kv.repr = AKV_REPR_Q4;
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL);
    akv_attn_decode pd = mk_decode(&f, 1, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    pd.kv.repr = AKV_REPR_COUNT;
    CHECK_STATUS(akv_attn_ref_decode(&pd), AKV_EINVAL);
    pd.kv.repr = AKV_REPR_EXACT, pd.kv.past = 2;
    CHECK_STATUS(akv_attn_ref_decode(&pd), AKV_EINVAL);
    pd.kv.past = 0, pd.kv.repr = AKV_REPR_Q4, pd.kv.head_dim = 48, pd.n_heads = 4;
    CHECK_STATUS(akv_attn_ref_decode(&pd), AKV_EINVAL); /* q4 rotates: a power of two */
    quiet(0);
    fx_table_free(&f);
}

static void test_table_check(void) {
    fx_geom g = {2, 1, 8, 16, AKV_DTYPE_BF16};
    uint32_t len[3] = {20, 0, 16};
    fx_table f;
    fx_table_make(&f, g, 3, len, 1, 0, &rng);
    akv_attn_pages kv = fx_pages(&f);
    CHECK_OK(akv_attn_table_check(&kv));
    quiet(1);
    for (int c = 0; c < 7; c++) {
        fx_table t = f; /* shallow: mutate a copy of one array at a time */
        int32_t indptr[4], indices[4], last[3];
        memcpy(indptr, f.indptr, sizeof indptr), memcpy(indices, f.indices, 3 * 4), memcpy(last, f.last, sizeof last);
        t.indptr = indptr, t.indices = indices, t.last = last;
        akv_attn_pages k2 = fx_pages(&t);
        switch (c) {
        case 0: indptr[0] = -1; break;                       /* starts below 0 */
        case 1: indptr[2] = 1; break;                        /* decreases */
        case 2: indices[1] = (int32_t)f.n_pages; break;      /* id out of the pool */
        case 3: indices[0] = -1; break;                      /* negative id */
        case 4: last[0] = 0; break;                          /* pages but length 0 */
        case 5: last[2] = 17; break;                         /* longer than a page */
        case 6: last[1] = 1; break;                          /* length without a page */
        }
        CHECK_STATUS(akv_attn_table_check(&k2), AKV_EINVAL);
    }
    kv.max_pages = 1; /* sequence 0 owns 2 pages */
    CHECK_STATUS(akv_attn_table_check(&kv), AKV_EINVAL);
    quiet(0);
    fx_table_free(&f);
}

/* A view (sequences k.. of a table: indptr + k, last + k) is a table, and the reference's
 * result for a sequence is the same bits alone or in any batch: decode and prefill, every
 * sequence of a mixed batch run as its own view and compared with memcmp. */
/* The view of sequence s of a fixture's table alone. */
static akv_attn_pages view_one(const fx_table *f, akv_attn_pages all, uint32_t s) {
    all.indptr = akv_attn_host_ptr(f->indptr + s);
    all.last_page_len = akv_attn_host_ptr(f->last + s);
    all.n_seq = 1;
    return all;
}

static void test_views_batch_invariant(void) {
    fx_geom g = {9, 3, 64, 16, AKV_DTYPE_BF16};
    uint32_t len[6] = {3, 300, 17, 40, 513, 1};
    const uint32_t n_seq = 6, d = g.head_dim, H = g.n_heads;
    fx_table f;
    fx_table_make(&f, g, n_seq, len, 2, 1, &rng);
    akv_attn_pages all = fx_pages(&f);
    /* decode, 2 queries per sequence */
    size_t rows = (size_t)n_seq * 2 * H;
    float *q = fx_random(AKV_DTYPE_F32, rows * d, 2.0f, &rng);
    float *o = malloc(rows * d * sizeof *o), *o1 = malloc(rows * d * sizeof *o1);
    float *lse = malloc(rows * sizeof *lse), *lse1 = malloc(rows * sizeof *lse1);
    akv_attn_decode p = mk_decode(&f, 2, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    CHECK_OK(akv_attn_ref_decode(&p));
    for (uint32_t sq = 0; sq < n_seq; sq++) {
        akv_attn_decode v = p;
        v.kv = view_one(&f, all, sq);
        size_t r0 = (size_t)sq * 2 * H;
        v.q = akv_attn_host_ptr(q + r0 * d);
        v.o = akv_attn_host_ptr(o1 + r0 * d);
        v.lse = akv_attn_host_ptr(lse1 + r0);
        CHECK_OK(akv_attn_table_check(&v.kv));
        CHECK_OK(akv_attn_ref_decode(&v));
        TEST_CHECK_(!memcmp(o + r0 * d, o1 + r0 * d, 2 * H * d * sizeof *o) &&
                        !memcmp(lse + r0, lse1 + r0, 2 * H * sizeof *lse),
                    "decode: sequence %u (%u keys) alone differs from the batch", sq, len[sq]);
    }
    /* prefill: chunks of 1..len tokens, the view's qo_indptr rebased to 0 */
    int32_t qo[7] = {0}, qo1[2];
    const uint32_t chunk[6] = {3, 200, 1, 40, 100, 1};
    for (uint32_t sq = 0; sq < n_seq; sq++) qo[sq + 1] = qo[sq] + (int32_t)chunk[sq];
    size_t n_tok = (size_t)qo[n_seq];
    float *qp = fx_random(AKV_DTYPE_F32, n_tok * H * d, 2.0f, &rng);
    float *op = malloc(n_tok * H * d * sizeof *op), *op1 = malloc(n_tok * H * d * sizeof *op1);
    akv_attn_prefill pf = {.kv = all, .n_heads = H, .qo_indptr = akv_attn_host_ptr(qo),
                           .n_tokens = (uint32_t)n_tok, .max_chunk = 200,
                           .q = akv_attn_host_ptr(qp), .q_dtype = AKV_DTYPE_F32,
                           .o = akv_attn_host_ptr(op), .o_dtype = AKV_DTYPE_F32};
    CHECK_OK(akv_attn_ref_prefill(&pf));
    for (uint32_t sq = 0; sq < n_seq; sq++) {
        akv_attn_prefill v = pf;
        v.kv = view_one(&f, all, sq);
        qo1[0] = 0, qo1[1] = (int32_t)chunk[sq];
        v.qo_indptr = akv_attn_host_ptr(qo1);
        v.n_tokens = chunk[sq];
        v.q = akv_attn_host_ptr(qp + (size_t)qo[sq] * H * d);
        v.o = akv_attn_host_ptr(op1 + (size_t)qo[sq] * H * d);
        CHECK_OK(akv_attn_ref_prefill(&v));
        TEST_CHECK_(!memcmp(op + (size_t)qo[sq] * H * d, op1 + (size_t)qo[sq] * H * d,
                            chunk[sq] * H * d * sizeof *op),
                    "prefill: sequence %u (chunk %u of %u keys) alone differs from the batch", sq,
                    chunk[sq], len[sq]);
    }
    free(q), free(o), free(o1), free(lse), free(lse1), free(qp), free(op), free(op1);
    fx_table_free(&f);
}

static void test_validation(void) {
    fx_geom g = {4, 2, 16, 16, AKV_DTYPE_BF16};
    uint32_t len[2] = {3, 20};
    fx_table f;
    fx_table_make(&f, g, 2, len, 0, 0, &rng);
    float q[4 * 4 * 16], o[4 * 4 * 16], lse[16];
    memset(q, 0, sizeof q);
    akv_attn_decode good = mk_decode(&f, 1, q, AKV_DTYPE_F32, o, AKV_DTYPE_F32, lse);
    CHECK_OK(akv_attn_ref_decode(&good));
    quiet(1);
    for (int c = 0; c < 16; c++) {
        akv_attn_decode p = good;
        switch (c) {
        case 0: p.n_heads = 3; break;
        case 1: p.n_heads = 0; break;
        case 2: p.n_query = 0; break;
        case 3: p.n_query = 5; break;
        case 4: p.q.addr = 0; break;
        case 5: p.o.addr = 0; break;
        case 6: p.kv.pool.addr = 0; break;
        case 7: p.kv.head_dim = 0; break;
        case 8: p.kv.head_dim = 257; break;
        case 9: p.kv.page_tokens = 24; break;
        case 10: p.kv.dtype = AKV_DTYPE_COUNT; break;
        case 11: p.kv.max_pages = 0; break;
        case 12: p.scale = -1.0f; break;
        case 13: p.scale = NAN; break;
        case 14: p.q_stride = 10; break;
        case 15: p.kv.n_kv_heads = 0; break;
        }
        CHECK_STATUS(akv_attn_ref_decode(&p), AKV_EINVAL);
    }
    CHECK_STATUS(akv_attn_ref_decode(NULL), AKV_EINVAL);
    CHECK_STATUS(akv_attn_ref_decode_f64(&good, NULL, NULL), AKV_EINVAL);
    akv_attn_prefill pp = {.kv = fx_pages(&f), .n_heads = 4};
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL); /* no qo_indptr */
    int32_t qo[3] = {0, 1, 3};
    pp.qo_indptr = akv_attn_host_ptr(qo), pp.n_tokens = 3, pp.max_chunk = 1;
    pp.q = akv_attn_host_ptr(q), pp.o = akv_attn_host_ptr(o), pp.q_dtype = pp.o_dtype = AKV_DTYPE_F32;
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL); /* a chunk of 2 > max_chunk 1 */
    pp.max_chunk = 2, pp.n_tokens = 4;
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL); /* qo_indptr[n_seq] != n_tokens */
    pp.n_tokens = 3, pp.k_new = akv_attn_host_ptr(q);
    CHECK_STATUS(akv_attn_ref_prefill(&pp), AKV_EINVAL); /* k_new without v_new */
    pp.k_new.addr = 0;
    quiet(0);
    CHECK_OK(akv_attn_ref_prefill(&pp));
    /* zero sequences: nothing to do, nothing read */
    akv_attn_decode none = {.kv = {.n_seq = 0}};
    CHECK_OK(akv_attn_ref_decode(&none));
    fx_table_free(&f);
}

static void test_split_plan(void) {
    const size_t h200_smem = 227 * 1024;
    akv_attn_split sp;
    CHECK_OK(akv_attn_split_plan(1024, 1, 8, 128, 132, h200_smem, NULL, &sp));
    CHECK_EQ_INT(sp.n_parts, 8); /* 128 keys (two tiles) at least */
    CHECK_EQ_INT(sp.part_tokens, 128);
    CHECK_OK(akv_attn_split_plan(4096, 1, 3, 64, 132, h200_smem, NULL, &sp));
    CHECK_EQ_INT(sp.n_parts, 32); /* the same 128 keys at d=64 */
    CHECK_EQ_INT(sp.part_tokens, 128);
    CHECK_OK(akv_attn_split_plan(32768, 1, 3, 64, 132, h200_smem, NULL, &sp));
    /* one 8-warp block per SM, one wave: floor(132 / 3) = 44 -> 745 keys, rounded to whole
     * steps of 128 -> 768 keys, 43 parts */
    CHECK_EQ_INT(sp.n_parts, 43);
    CHECK_EQ_INT(sp.part_tokens, 768);
    CHECK_OK(akv_attn_split_plan(131072, 1, 8, 128, 132, h200_smem, NULL, &sp));
    CHECK_EQ_INT(sp.n_parts, 16); /* floor(132 / 8) */
    CHECK_EQ_INT(sp.part_tokens, 8192);
    /* variant 0 over a batch shares one wave: 8 sequences x 8 heads, ceil(132 / 64) = 3
     * parts of 1366 keys, rounded to 1408 */
    CHECK_OK(akv_attn_split_plan_variant(4096, 8, 8, 128, 132, h200_smem, NULL, 0, &sp));
    CHECK_EQ_INT(sp.n_parts, 3);
    CHECK_EQ_INT(sp.part_tokens, 1408);
    CHECK_OK(akv_attn_split_plan_variant(32768, 32, 8, 128, 132, h200_smem, NULL, 0, &sp));
    CHECK_EQ_INT(sp.n_parts, 1); /* ceil(132 / 256) */
    CHECK_OK(akv_attn_split_plan_variant(131072, 2, 8, 128, 132, h200_smem, NULL, 0, &sp));
    CHECK_EQ_INT(sp.n_parts, 9); /* ceil(132 / 16) */
    CHECK_OK(akv_attn_split_plan_variant(32768, 200, 8, 128, 132, h200_smem, NULL, 0, &sp));
    CHECK_EQ_INT(sp.n_parts, 1); /* more sequences than a wave: one partition each */
    /* AUTO (the default): variant 0 for one sequence, 2 for a batch (6 x 704 at 8 x 4K: three
     * blocks per SM, 396 / 64 = 6, one round of 384 blocks, as the H200 run measured it) */
    { /* the default tuning: AUTO */
        CHECK_EQ_INT(akv_attn_decode_variant_for(NULL, 1), 0);
        CHECK_EQ_INT(akv_attn_decode_variant_for(NULL, 8), 2);
        CHECK_OK(akv_attn_split_plan(4096, 8, 8, 128, 132, h200_smem, NULL, &sp));
        CHECK_EQ_INT(sp.n_parts, 6);
        CHECK_EQ_INT(sp.part_tokens, 704);
        akv_attn_split sv;
        CHECK_OK(akv_attn_split_plan_variant(131072, 1, 8, 128, 132, h200_smem, NULL, 0, &sv));
        CHECK_OK(akv_attn_split_plan(131072, 1, 8, 128, 132, h200_smem, NULL, &sp));
        CHECK_EQ_INT(sp.n_parts, sv.n_parts);
        /* a device whose blocks take less shared memory (an A100's 163 KiB): variant 0's
         * 200 KiB block does not fit, AUTO plans variant 2 instead */
        CHECK_EQ_INT(akv_attn_decode_variant_fit(NULL, 1, 128, h200_smem), 0);
        CHECK_EQ_INT(akv_attn_decode_variant_fit(NULL, 1, 128, 163 * 1024), 2);
        CHECK_EQ_INT(akv_attn_decode_variant_fit(NULL, 1, 64, 163 * 1024), 0); /* 132 KiB fits */
        CHECK_OK(akv_attn_split_plan(32768, 1, 8, 128, 132, 163 * 1024, NULL, &sp));
        CHECK_OK(akv_attn_split_plan_variant(32768, 1, 8, 128, 132, 163 * 1024, NULL, 2, &sv));
        CHECK_EQ_INT(sp.n_parts, sv.n_parts);
        CHECK_EQ_INT(sp.part_tokens, sv.part_tokens);
    }
    { /* tuning: a forced variant, waves and a cap on partitions; out of range refused */
        akv_attn_tuning t = {.variant = AKV_ATTN_VARIANT(1)};
        CHECK_EQ_INT(akv_attn_decode_variant_for(&t, 8), 1);
        CHECK_EQ_INT(akv_attn_decode_variant_fit(&t, 1, 128, 163 * 1024), 1); /* forced: kept */
        t = (akv_attn_tuning){.max_parts = 4};
        CHECK_OK(akv_attn_split_plan(131072, 1, 8, 128, 132, h200_smem, &t, &sp));
        CHECK_EQ_INT(sp.n_parts, 4);
        akv_attn_split s1, s3;
        t = (akv_attn_tuning){.waves = 1};
        CHECK_OK(akv_attn_split_plan_variant(32768, 8, 8, 128, 132, h200_smem, &t, 1, &s1));
        t.waves = 3;
        CHECK_OK(akv_attn_split_plan_variant(32768, 8, 8, 128, 132, h200_smem, &t, 1, &s3));
        CHECK(s3.n_parts > s1.n_parts); /* more waves, more partitions over a batch */
        t = (akv_attn_tuning){.variant = AKV_ATTN_DECODE_VARIANTS + 1};
        CHECK_STATUS(akv_attn_tuning_check(&t), AKV_EINVAL);
        CHECK_STATUS(akv_attn_split_plan(1024, 1, 8, 128, 132, h200_smem, &t, &sp), AKV_EINVAL);
        t = (akv_attn_tuning){.waves = 17};
        CHECK_STATUS(akv_attn_tuning_check(&t), AKV_EINVAL);
        t = (akv_attn_tuning){.max_parts = AKV_ATTN_MAX_PARTS + 1};
        CHECK_STATUS(akv_attn_tuning_check(&t), AKV_EINVAL);
        CHECK_OK(akv_attn_tuning_check(NULL));
    }
    CHECK_STATUS(akv_attn_split_plan(1024, 0, 8, 128, 132, h200_smem, NULL, &sp), AKV_EINVAL);
    CHECK_OK(akv_attn_split_plan(64, 1, 8, 128, 132, h200_smem, NULL, &sp));
    CHECK_EQ_INT(sp.n_parts, 1);
    /* a partition holds positions in an int: rounding one partition up to whole steps past
     * 2^31 - 1 takes a second one instead (2^31 - 64 keys, one partition for 256 K/V heads) */
    CHECK_OK(akv_attn_split_plan_variant(2147483584ull, 1, 256, 128, 132, h200_smem, NULL, 0, &sp));
    CHECK(sp.part_tokens <= INT32_MAX && sp.part_tokens % 128 == 0);
    CHECK_EQ_INT(sp.n_parts, 2);
    /* no key limit: 2^31 keys still plan */
    CHECK_OK(akv_attn_split_plan((uint64_t)1 << 31, 1, 3, 64, 132, h200_smem, NULL, &sp));
    CHECK((uint64_t)sp.n_parts * sp.part_tokens >= (uint64_t)1 << 31);
    /* capacities past 1024 partitions of 2^31 - 1 keys, up to 2^64 - 1, are refused (the
     * rounding once overflowed into a division by zero) */
    CHECK_STATUS(akv_attn_split_plan(UINT64_MAX, 1, 1, 128, 132, h200_smem, NULL, &sp), AKV_EINVAL);
    CHECK_STATUS(akv_attn_split_plan(UINT64_MAX - 100, 1, 8, 64, 132, h200_smem, NULL, &sp), AKV_EINVAL);
    CHECK_STATUS(akv_attn_split_plan((uint64_t)INT32_MAX * AKV_ATTN_MAX_PARTS + 1, 1, 8, 128, 132, h200_smem, NULL, &sp),
                 AKV_EINVAL);
    for (int i = 0; i < 2000; i++) {
        uint64_t cap = 1 + test_rand_below(&rng, 1u << 22);
        uint32_t n_kv = 1 + (uint32_t)test_rand_below(&rng, 16), d = i % 2 ? 64 : 128;
        uint32_t n_sm = 1 + (uint32_t)test_rand_below(&rng, 200);
        akv_status st = akv_attn_split_plan(cap, 1, n_kv, d, n_sm, h200_smem, NULL, &sp);
        if (st != AKV_OK) {
            CHECK_OK(st);
            break;
        }
        CHECK(sp.part_tokens % AKV_ATTN_TILE_TOKENS == 0);
        CHECK(sp.n_parts == 1 || sp.part_tokens >= 2 * AKV_ATTN_TILE_TOKENS);
        CHECK((uint64_t)sp.n_parts * sp.part_tokens >= cap);
        CHECK((uint64_t)(sp.n_parts - 1) * sp.part_tokens < cap);
        CHECK(sp.n_parts >= 1 && sp.n_parts <= AKV_ATTN_MAX_PARTS);
        CHECK((uint64_t)sp.n_parts * n_kv <= 4ull * n_sm + n_kv); /* at most one wave at batch 1 */
    }
    /* variants (akv/attn.h): the ring's shared memory sets blocks_per_sm; variant 2 keeps
     * whole rounds of blocks */
    CHECK_EQ_U64(akv_attn_decode_smem_bytes_variant(128, 0), 3 * 2 * 32768 + 8192); /* 3 steps of 2 tiles */
    CHECK_EQ_U64(akv_attn_decode_smem_bytes_variant(64, 0), 4 * 2 * 16384 + 4096);
    CHECK_EQ_U64(akv_attn_decode_smem_bytes_variant(128, 1), 2 * 32768 + 8192);
    CHECK_EQ_U64(akv_attn_decode_smem_bytes_variant(64, 2), 3 * 16384 + 4096);
    CHECK_EQ_U64(akv_attn_decode_smem_bytes_variant(128, AKV_ATTN_DECODE_VARIANTS), 0);
    CHECK_OK(akv_attn_split_plan_variant(32768, 1, 8, 128, 132, h200_smem, NULL, 1, &sp));
    CHECK_EQ_INT(sp.n_parts, 47); /* three blocks per SM: floor(396 / 8) = 49 -> 704 keys each */
    CHECK_EQ_INT(sp.part_tokens, 704);
    CHECK_OK(akv_attn_split_plan_variant(32768, 8, 8, 128, 132, h200_smem, NULL, 1, &sp));
    CHECK_EQ_INT(sp.n_parts, 7); /* ceil(396 / 64) */
    CHECK_OK(akv_attn_split_plan_variant(32768, 8, 8, 128, 132, h200_smem, NULL, 2, &sp));
    CHECK_EQ_INT(sp.n_parts, 6); /* floor(396 / 64): 384 blocks, 0.97 of a round */
    CHECK_OK(akv_attn_split_plan_variant(4096, 8, 3, 64, 132, h200_smem, NULL, 2, &sp));
    CHECK_EQ_INT(sp.n_parts, 22); /* 32 parts = 768 blocks = 1.45 rounds of 528: one round */
    CHECK_EQ_INT(sp.part_tokens, 192);
    CHECK_OK(akv_attn_split_plan_variant(32768, 1, 3, 64, 132, h200_smem, NULL, 2, &sp));
    CHECK_EQ_INT(sp.n_parts, 171); /* floor(528 / 3) = 176 -> 192 keys each */
    for (uint32_t v = 0; v < AKV_ATTN_DECODE_VARIANTS; v++)
        for (int i = 0; i < 500; i++) {
            uint64_t cap = 1 + test_rand_below(&rng, 1u << 22);
            uint32_t n_seq = 1 + (uint32_t)test_rand_below(&rng, 64), n_kv = 1 + (uint32_t)test_rand_below(&rng, 16);
            CHECK_OK(akv_attn_split_plan_variant(cap, n_seq, n_kv, i % 2 ? 64 : 128, 132, h200_smem, NULL, v, &sp));
            CHECK(sp.part_tokens % (v == 0 ? 2 * AKV_ATTN_TILE_TOKENS : AKV_ATTN_TILE_TOKENS) == 0); /* whole steps */
            CHECK((uint64_t)sp.n_parts * sp.part_tokens >= cap);
            CHECK((uint64_t)(sp.n_parts - 1) * sp.part_tokens < cap);
            CHECK(sp.n_parts >= 1 && sp.n_parts <= AKV_ATTN_MAX_PARTS);
        }
    quiet(1);
    CHECK_STATUS(akv_attn_split_plan_variant(1024, 1, 8, 128, 132, h200_smem, NULL, AKV_ATTN_DECODE_VARIANTS, &sp),
                 AKV_EINVAL);
    CHECK_STATUS(akv_attn_split_plan(1024, 1, 8, 96, 132, h200_smem, NULL, &sp), AKV_EINVAL);
    CHECK_STATUS(akv_attn_split_plan(0, 1, 8, 128, 132, h200_smem, NULL, &sp), AKV_EINVAL);
    CHECK_STATUS(akv_attn_split_plan(1024, 1, 8, 128, 132, 48 * 1024, NULL, &sp), AKV_EUNSUPPORTED);
    quiet(0);
    /* workspace: none for one partition; partial outputs, LSEs and one counter per (sequence,
     * head, 16 rows), each part at a 256-byte boundary; overflow is caught */
    akv_attn_decode p = {.kv = {.n_seq = 3, .n_kv_heads = 8, .head_dim = 128}, .n_heads = 32, .n_query = 2};
    akv_attn_split one = {128, 1}, many = {128, 10};
    size_t bytes = 1;
    CHECK_OK(akv_attn_decode_workspace_bytes(&p, &one, &bytes));
    CHECK_EQ_U64(bytes, 0);
    CHECK_OK(akv_attn_decode_workspace_bytes(&p, &many, &bytes));
    CHECK_EQ_U64(bytes, ((3u * 8 * 10 * 8 * 128 * 4 + 255) & ~255u) + ((3u * 8 * 10 * 8 * 4 + 255) & ~255u) +
                            3u * 8 * 4);
    p.kv.n_seq = UINT32_MAX, p.n_heads = 8u << 20, many.n_parts = 1024;
    quiet(1);
    CHECK_STATUS(akv_attn_decode_workspace_bytes(&p, &many, &bytes), AKV_EOVERFLOW);
    /* a shape no decode takes: no size for it */
    akv_attn_decode bad = {.kv = {.n_seq = 1, .n_kv_heads = 2, .head_dim = 128}, .n_heads = 3, .n_query = 1};
    CHECK_STATUS(akv_attn_decode_workspace_bytes(&bad, &many, &bytes), AKV_EINVAL);
    bad.kv.n_kv_heads = 0;
    CHECK_STATUS(akv_attn_decode_workspace_bytes(&bad, &many, &bytes), AKV_EINVAL);
    bad.kv.n_kv_heads = 1, bad.n_query = 5;
    CHECK_STATUS(akv_attn_decode_workspace_bytes(&bad, &many, &bytes), AKV_EINVAL);
    quiet(0);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    rng = test_seed(0x5eed0a77);
    TEST_CASE(decode_fp32_vs_float64) test_decode_vs_f64();
    TEST_CASE(hostile_batch_97) test_hostile_batch();
    TEST_CASE(empty_rows) test_empty_rows();
    TEST_CASE(causal_rule_of_new_queries) test_causal_rule();
    TEST_CASE(prefill_is_decode_for_short_chunks) test_prefill_is_decode();
    TEST_CASE(prefill_appends_and_attends) test_prefill();
    TEST_CASE(append) test_append();
    TEST_CASE(merge_associative_and_empty) test_merge();
    TEST_CASE(split_equals_whole) test_split_equals_whole();
    TEST_CASE(table_check) test_table_check();
    TEST_CASE(compact_pages_read_in_place) test_compact_pages();
    TEST_CASE(parts_merge_to_the_whole) test_parts_merge_to_the_whole();
    TEST_CASE(compact_and_past_parts_refuse_what_they_cannot_be) test_compact_validation();
    TEST_CASE(compact_past_widened_to_exact_pages) test_widen();
    TEST_CASE(views_and_batch_invariance) test_views_batch_invariant();
    TEST_CASE(validation) test_validation();
    TEST_CASE(split_plan) test_split_plan();
    return test_finish();
}
