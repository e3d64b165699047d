/* test_attn_cuda.c (gpu) — the CUDA attention kernels against the float64 reference on fresh
 * random inputs of awkward sizes (outputs poisoned with NaN before every run, unused page
 * slots NaN too), determinism, and the bitwise cell: the same history at other physical
 * pages and in another batch gives the same bits, for every decode variant. Also the K/V
 * append (bit-exact), the public merge, and the refusals. */
#include "test.h"

#include <stdbool.h>

#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/forward_ops.h"
#include "akv/log.h"
#include "attn_fixture.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

#ifdef AKV_HAVE_CUDA
static akv_dev *dev;
static uint64_t rng;

/* Bound on the row-relative error of bf16 kernels against float64, and on |lse - lse64|. */
#define REL_TOL 1e-2
#define LSE_TOL 1e-2

static akv_dptr up(const void *h, size_t n) {
    akv_dptr d = {0};
    if (n == 0) n = 16;
    if (akv_dev_mem_alloc(dev, n, &d) != AKV_OK) abort();
    if (h && akv_dev_copy_h2d_sync(dev, d, h, n) != AKV_OK) abort();
    return d;
}
static akv_dptr poisoned(size_t n) {
    akv_dptr d = up(NULL, n);
    CHECK_OK(akv_dev_memset_sync(dev, d, 0xff, n ? n : 16)); /* NaN in f32 and bf16 */
    return d;
}
static void down(void *h, akv_dptr d, size_t n) {
    CHECK_OK(akv_dev_copy_d2h_sync(dev, h, d, n));
}
static void dfree(akv_dptr d) {
    if (d.addr) CHECK_OK(akv_dev_mem_free(dev, d));
}

/* A fixture's table on the device. */
typedef struct dtable {
    akv_dptr pool, indptr, indices, last;
} dtable;

static dtable dt_up(const fx_table *f) {
    dtable d = {
        up(f->pool, f->pool_bytes), up(f->indptr, (f->n_seq + 1) * 4),
        up(f->indices, (size_t)f->indptr[f->n_seq] * 4), up(f->last, f->n_seq * 4),
    };
    return d;
}
static void dt_free(dtable *d) {
    dfree(d->pool), dfree(d->indptr), dfree(d->indices), dfree(d->last);
}
static akv_attn_pages dt_pages(const fx_table *f, const dtable *d) {
    akv_attn_pages kv = fx_pages(f);
    kv.pool = d->pool, kv.indptr = d->indptr, kv.indices = d->indices, kv.last_page_len = d->last;
    return kv;
}

/* How a decode was launched: its split and cluster size (1: none). */
typedef struct run_info {
    akv_attn_split sp;
    uint32_t cluster;
} run_info;

static int dev_cc_major; /* the device's compute capability */
static akv_attn_tuning tuning; /* every decode's here: the variant and cluster merge under test */

/* The cluster size a decode of n_parts partitions that can merge in a cluster (one sequence,
 * 2..8 partitions, 16 rows) launches with under the current setting on this device. */
static uint64_t expect_cluster(uint32_t n_parts) {
    return !tuning.no_cluster && dev_cc_major >= 9 ? n_parts : 1;
}

/* One decode on the device: o (typed) and lse come back in host buffers; *info (when given)
 * says how it was launched. */
static akv_status run_decode_as(const fx_table *f, const dtable *d, uint32_t nq, akv_dptr q, akv_dtype q_dtype,
                                akv_dtype o_dtype, void *o_h, float *lse_h, run_info *info, bool prefetch) {
    size_t n_rows = (size_t)f->n_seq * nq * f->g.n_heads, d_ = f->g.head_dim;
    akv_attn_decode p = {
        .kv = dt_pages(f, d), .n_heads = f->g.n_heads, .n_query = nq, .q = q, .q_dtype = q_dtype,
        .o_dtype = o_dtype, .prefetch_history = prefetch, .tuning = tuning,
    };
    p.o = poisoned(n_rows * d_ * akv_dtype_size(o_dtype));
    p.lse = poisoned(n_rows * 4);
    run_info ri;
    size_t ws_bytes = 0;
    akv_dptr ws = {0};
    akv_status st = akv_attn_cuda_decode_split(&p, &ri.sp);
    if (st == AKV_OK) st = akv_attn_decode_workspace_bytes(&p, &ri.sp, &ws_bytes);
    if (st == AKV_OK) st = akv_attn_cuda_decode_cluster_size(&p, &ri.cluster);
    if (st == AKV_OK && info) *info = ri;
    if (st == AKV_OK && ws_bytes) { /* zeroed once, as the API asks (its arrival counters) */
        ws = up(NULL, ws_bytes);
        CHECK_OK(akv_dev_memset_sync(dev, ws, 0, ws_bytes));
    }
    if (st == AKV_OK) st = akv_attn_cuda_decode(&p, ws, ws_bytes, NULL);
    if (st == AKV_OK) {
        down(o_h, p.o, n_rows * d_ * akv_dtype_size(o_dtype));
        down(lse_h, p.lse, n_rows * 4);
    }
    dfree(ws), dfree(p.o), dfree(p.lse);
    return st;
}
static akv_status run_decode(const fx_table *f, const dtable *d, uint32_t nq, akv_dptr q, akv_dtype q_dtype,
                             akv_dtype o_dtype, void *o_h, float *lse_h, run_info *info) {
    return run_decode_as(f, d, nq, q, q_dtype, o_dtype, o_h, lse_h, info, false);
}

/* The largest difference between two decodes' outputs (o relative to its row's largest
 * magnitude, lse absolute); a NaN or infinite difference counts as infinite. */
static void merge_diff(const void *oa, const void *ob, akv_dtype t, const float *la, const float *lb, size_t n_rows,
                       size_t D, double *o_err, double *l_err) {
    *o_err = *l_err = 0;
    for (size_t r = 0; r < n_rows; r++) {
        double mx = 1e-30;
        for (size_t c = 0; c < D; c++) mx = fmax(mx, fabs(fx_get(ob, t, r * D + c)));
        for (size_t c = 0; c < D; c++) {
            double e = fabs((double)fx_get(oa, t, r * D + c) - fx_get(ob, t, r * D + c)) / mx;
            *o_err = isfinite(e) ? fmax(*o_err, e) : INFINITY;
        }
        double e = fabs((double)la[r] - lb[r]);
        *l_err = isfinite(e) ? fmax(*l_err, e) : INFINITY;
    }
}

/* A lone sequence of 2..8 partitions (decode_case_at's one_seq): its decode (o1, l1, launched
 * as `ri` says) merged in a cluster of its partitions on a compute capability 9 device with
 * the setting on, and the same inputs under the other setting agree with it to rounding. */
static void check_merges_agree(const fx_table *f, const dtable *d, uint32_t nq, akv_dptr q, akv_dtype q_dtype,
                               akv_dtype o_dtype, const void *o1, const float *l1, const run_info *ri) {
    const size_t n_rows = (size_t)nq * f->g.n_heads, D = f->g.head_dim;
    CHECK(ri->sp.n_parts >= 2 && ri->sp.n_parts <= 8);
    CHECK_EQ_U64(ri->cluster, expect_cluster(ri->sp.n_parts));
    const akv_attn_tuning setting = tuning;
    tuning.no_cluster = !setting.no_cluster;
    void *o3 = malloc(n_rows * D * akv_dtype_size(o_dtype));
    float *l3 = malloc(n_rows * 4);
    run_info r3;
    CHECK_OK(run_decode(f, d, nq, q, q_dtype, o_dtype, o3, l3, &r3));
    CHECK_EQ_U64(r3.cluster, expect_cluster(ri->sp.n_parts));
    tuning = setting;
    double oe, le;
    merge_diff(o1, o3, o_dtype, l1, l3, n_rows, D, &oe, &le);
    printf("  %-44s cluster vs workspace merge: o %.1e, lse %.1e\n", "", oe, le);
    CHECK(oe <= (o_dtype == AKV_DTYPE_F32 ? 1e-5 : 8e-3));
    CHECK(le <= 1e-5);
    free(o3), free(l3);
}

/* Decode on the device against the float64 reference, twice (bitwise equal: the second run
 * prefetches its history, which changes when loads are issued, never what they read); with
 * one_seq, check_merges_agree too. Returns whether it launched as a cluster. */
static int decode_case_form(const char *name, fx_geom g, uint32_t n_seq, const uint32_t *len, uint32_t nq,
                            uint32_t cap_slack, akv_dtype q_dtype, akv_dtype o_dtype, bool one_seq, akv_repr repr,
                            uint32_t past) {
    fx_table f;
    fx_table_make(&f, g, n_seq, len, 2, cap_slack, &rng);
    if (repr != AKV_REPR_EXACT) CHECK(fx_table_compact(&f, repr));
    f.past = past;
    dtable d = dt_up(&f);
    size_t n_rows = (size_t)n_seq * nq * g.n_heads, D = g.head_dim, o_bytes = n_rows * D * akv_dtype_size(o_dtype);
    void *q = fx_random(q_dtype, n_rows * D, 2.0f, &rng);
    akv_dptr q_d = up(q, n_rows * D * akv_dtype_size(q_dtype));
    void *o1 = malloc(o_bytes), *o2 = malloc(o_bytes);
    float *l1 = malloc(n_rows * 4), *l2 = malloc(n_rows * 4);
    double *o64 = malloc(n_rows * D * 8), *l64 = malloc(n_rows * 8);
    akv_attn_decode hp = {
        .kv = fx_pages(&f), .n_heads = g.n_heads, .n_query = nq, .q = akv_attn_host_ptr(q), .q_dtype = q_dtype,
    };
    CHECK_OK(akv_attn_ref_decode_f64(&hp, o64, l64));
    run_info ri = {{0, 0}, 1};
    akv_status st = run_decode(&f, &d, nq, q_d, q_dtype, o_dtype, o1, l1, &ri);
    CHECK_OK(st);
    if (st == AKV_OK) {
        FX_COMPARE(name, o1, o_dtype, l1, o64, l64, n_rows, g.head_dim, REL_TOL, LSE_TOL);
        if (one_seq) check_merges_agree(&f, &d, nq, q_d, q_dtype, o_dtype, o1, l1, &ri);
        printf("  %-44s worst row rel err %.2e, lse err %.2e (%u parts of %u keys%s)\n", name, fx_last_worst,
               fx_last_worst_lse, ri.sp.n_parts, ri.sp.part_tokens, ri.cluster > 1 ? ", cluster launch" : "");
        CHECK_OK(run_decode_as(&f, &d, nq, q_d, q_dtype, o_dtype, o2, l2, NULL, true));
        CHECK_BYTES(o1, o2, o_bytes);
        CHECK_BYTES(l1, l2, n_rows * 4);
    }
    free(q), free(o1), free(o2), free(l1), free(l2), free(o64), free(l64);
    dfree(q_d);
    dt_free(&d);
    fx_table_free(&f);
    return ri.cluster > 1;
}

static int decode_case_at(const char *name, fx_geom g, uint32_t n_seq, const uint32_t *len, uint32_t nq,
                          uint32_t cap_slack, akv_dtype q_dtype, akv_dtype o_dtype, bool one_seq) {
    return decode_case_form(name, g, n_seq, len, nq, cap_slack, q_dtype, o_dtype, one_seq, AKV_REPR_EXACT, 0);
}

static int decode_case(const char *name, fx_geom g, uint32_t n_seq, const uint32_t *len, uint32_t nq,
                       uint32_t cap_slack, akv_dtype q_dtype, akv_dtype o_dtype) {
    return decode_case_at(name, g, n_seq, len, nq, cap_slack, q_dtype, o_dtype, false);
}

/* Returns how many cases launched as a cluster. */
static int test_decode(void) {
    const fx_geom llama = {32, 8, 128, 64, AKV_DTYPE_BF16}, smol = {9, 3, 64, 256, AKV_DTYPE_BF16};
    const fx_geom mha16 = {8, 8, 128, 16, AKV_DTYPE_BF16}, g8 = {16, 2, 64, 32, AKV_DTYPE_BF16};
    const fx_geom g16 = {16, 1, 128, 64, AKV_DTYPE_BF16};
    const uint32_t edges64[7] = {0, 1, 63, 64, 65, 1000, 3001};
    const uint32_t edges256[6] = {255, 256, 257, 1, 0, 2000};
    char name[96];
    int n = 0;
    for (uint32_t nq = 1; nq <= 4; nq++) {
        snprintf(name, sizeof name, "decode 32/8 d128 P64 nq%u", nq);
        n += decode_case(name, llama, 7, edges64, nq, nq * 3, nq % 2 ? AKV_DTYPE_BF16 : AKV_DTYPE_F32,
                    nq < 3 ? AKV_DTYPE_BF16 : AKV_DTYPE_F32);
        snprintf(name, sizeof name, "decode 9/3 d64 P256 nq%u", nq);
        n += decode_case(name, smol, 6, edges256, nq, 1, AKV_DTYPE_F32, nq % 2 ? AKV_DTYPE_F32 : AKV_DTYPE_BF16);
    }
    uint32_t lens[97];
    for (int i = 0; i < 5; i++) lens[i] = 1 + (uint32_t)test_rand_below(&rng, 700);
    n += decode_case("decode 8/8 d128 P16 nq2 (4 pages a tile)", mha16, 5, lens, 2, 0, AKV_DTYPE_BF16, AKV_DTYPE_BF16);
    n += decode_case("decode 16/2 d64 P32 nq4 (32 rows)", g8, 5, lens, 4, 2, AKV_DTYPE_BF16, AKV_DTYPE_F32);
    n += decode_case("decode 16/1 d128 nq3 (48 rows, 2 row tiles)", g16, 5, lens, 3, 5, AKV_DTYPE_F32, AKV_DTYPE_F32);
    const uint32_t edges16[8] = {0, 1, 15, 16, 17, 35, 97, 47};
    for (int i = 0; i < 97; i++) lens[i] = edges16[i % 8];
    n += decode_case("decode 9/3 d64 P16, 97 sequences", (fx_geom){9, 3, 64, 16, AKV_DTYPE_BF16}, 97, lens, 1, 0,
                AKV_DTYPE_BF16, AKV_DTYPE_BF16);
    /* one sequence over a short capacity: 2..8 partitions, which launch as a cluster on a
     * device that has them. Capacity 1024 keys (8 partitions) with every partition used, 3
     * used (5 blocks of the cluster leave at once) and 1 (the cluster's first block writes
     * the output, nothing merges); 384 keys (3 partitions) and 512 (4) at SmolLM2's pages */
    const uint32_t one_len[4] = {1000, 300, 100, 350}, one_slack_llama[4] = {0, 11, 14, 0};
    const uint32_t one_slack_smol[4] = {0, 2, 3, 0};
    for (uint32_t i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "decode 32/8 d128 P64, 1 x %u keys nq%u", one_len[i], 4 - i % 4);
        n += decode_case_at(name, llama, 1, &one_len[i], 4 - i % 4, one_slack_llama[i], AKV_DTYPE_BF16, AKV_DTYPE_F32,
                            true);
        snprintf(name, sizeof name, "decode 9/3 d64 P256, 1 x %u keys nq%u", one_len[i], 1 + i % 4);
        n += decode_case_at(name, smol, 1, &one_len[i], 1 + i % 4, one_slack_smol[i], AKV_DTYPE_F32, AKV_DTYPE_BF16,
                            true);
    }
    /* a long history over many tiles per partition; a huge capacity (most partitions empty);
     * skipped under AKV_TEST_QUICK (the sanitizer runs) */
    if (getenv("AKV_TEST_QUICK")) return n;
    uint32_t long_len[1] = {40000}, short_len[2] = {5000, 3};
    n += decode_case("decode 32/8 d128, 40000 keys", llama, 1, long_len, 1, 0, AKV_DTYPE_BF16, AKV_DTYPE_F32);
    n += decode_case("decode 32/8 d128, capacity 1M keys", llama, 2, short_len, 2, 16384, AKV_DTYPE_BF16, AKV_DTYPE_F32);
    return n;
}

/* Compact (q8, q4) and past parts: the decode reads them in place, against the float64
 * reference over the same pages (which decodes each row as akv_kvq_read_row does and rotates
 * the query for q4; test_attn holds that reference to an independent oracle). Every byte of
 * the pool no sequence owns is 0xFF (a NaN scale): a kernel that lets a dead row's scale into
 * a product poisons its output. Lengths cross tiles, pages and partitions; pages of 8 (the
 * least the kernel takes: a scale load in one page), 16 (several pages a tile), 64 and 256;
 * one sequence with the cluster merge where it applies; a past part of exact pages too. */
static void test_decode_parts(void) {
    const fx_geom llama = {32, 8, 128, 64, AKV_DTYPE_BF16}, smol = {9, 3, 64, 256, AKV_DTYPE_BF16};
    const fx_geom p8 = {8, 2, 128, 8, AKV_DTYPE_BF16}, p16 = {16, 2, 64, 16, AKV_DTYPE_BF16};
    const uint32_t edges[7] = {1, 63, 64, 65, 1000, 3001, 130}, one[1] = {1000}, longest[1] = {20000};
    char name[96];
    for (int r = AKV_REPR_EXACT; r <= AKV_REPR_Q4; r++)
        for (uint32_t past = 0; past < 2; past++) {
            const char *rn = akv_repr_name((akv_repr)r), *pn = past ? " past" : "";
            if (r == AKV_REPR_EXACT && !past) continue; /* test_decode's */
            snprintf(name, sizeof name, "%s%s 32/8 d128 P64 nq1", rn, pn);
            decode_case_form(name, llama, 7, edges, 1, 2, AKV_DTYPE_F32, AKV_DTYPE_F32, false, (akv_repr)r, past);
            snprintf(name, sizeof name, "%s%s 9/3 d64 P256 nq3", rn, pn);
            decode_case_form(name, smol, 7, edges, 3, 1, AKV_DTYPE_BF16, AKV_DTYPE_BF16, false, (akv_repr)r, past);
            snprintf(name, sizeof name, "%s%s 8/2 d128 P8 nq2", rn, pn);
            decode_case_form(name, p8, 5, edges, 2, 3, AKV_DTYPE_F32, AKV_DTYPE_BF16, false, (akv_repr)r, past);
            snprintf(name, sizeof name, "%s%s 16/2 d64 P16 nq4 (32 rows)", rn, pn);
            decode_case_form(name, p16, 6, edges, 4, 0, AKV_DTYPE_F32, AKV_DTYPE_F32, false, (akv_repr)r, past);
            snprintf(name, sizeof name, "%s%s 32/8 d128 P64, 1 x 1000 keys nq1", rn, pn);
            decode_case_form(name, llama, 1, one, 1, 0, AKV_DTYPE_BF16, AKV_DTYPE_F32, true, (akv_repr)r, past);
            if (past) { /* a prompt chunk's rows as the queries of its older history */
                snprintf(name, sizeof name, "%s%s 32/8 d128 P64 nq37 (a prompt chunk)", rn, pn);
                decode_case_form(name, llama, 3, edges + 3, 37, 1, AKV_DTYPE_F32, AKV_DTYPE_F32, false,
                                 (akv_repr)r, past);
            }
            if (getenv("AKV_TEST_QUICK")) continue;
            snprintf(name, sizeof name, "%s%s 32/8 d128 P64, 20000 keys nq2", rn, pn);
            decode_case_form(name, llama, 1, longest, 2, 0, AKV_DTYPE_F32, AKV_DTYPE_F32, false, (akv_repr)r, past);
        }
}

/* Compact pages made on the device (the op AKV_KVQ_OP_ENCODE's kernel) are the codec's, byte for
 * byte: random pages (values over 12 orders of magnitude, an outlier channel in some rows, a
 * zero row), every form and head dim, page pairs scattered. */
static void test_encode_on_device(void) {
    const akv_dev_op op = {.name = AKV_KVQ_OP_ENCODE, .args_bytes = sizeof(akv_kvq_encode_args)};
    const uint32_t n_kv = 3, P = 16, n = 7; /* pages */
    for (int r = AKV_REPR_Q8; r <= AKV_REPR_Q4; r++)
        for (uint32_t d = 64; d <= 128; d *= 2) {
            akv_repr_layout le, lc;
            CHECK_OK(akv_repr_layout_of(AKV_REPR_EXACT, AKV_DTYPE_BF16, n_kv, P, d, &le));
            CHECK_OK(akv_repr_layout_of((akv_repr)r, AKV_DTYPE_BF16, n_kv, P, d, &lc));
            const size_t rows = le.page_bytes / 2 / d;
            uint16_t *ex = malloc(le.page_bytes * n);
            for (size_t i = 0; i < le.page_bytes / 2 * n; i++) {
                const size_t row = i / d;
                float x = test_rand_f32(&rng) * powf(10.0f, (float)(int)(row % 13) - 6.0f);
                if (row % 5 == 1 && i % d == 3) x *= 40.0f; /* an outlier channel */
                if (row % 17 == 4) x = 0.0f;                /* a zero row: scale 0 */
                ex[i] = akv_f32_to_bf16(x);
            }
            int32_t pairs[2 * 7];
            for (uint32_t i = 0; i < n; i++) pairs[2 * i] = (int32_t)((i * 3) % n), pairs[2 * i + 1] = (int32_t)(n - 1 - i);
            uint8_t *want = malloc(lc.page_bytes * n), *got = malloc(lc.page_bytes * n);
            memset(want, 0, lc.page_bytes * n);
            akv_kvq_encode_args a = {.src_pool = (uint64_t)(uintptr_t)ex, .dst_pool = (uint64_t)(uintptr_t)want,
                                     .pairs = (uint64_t)(uintptr_t)pairs, .n_pages = n, .repr = (uint32_t)r,
                                     .n_kv_heads = n_kv, .page_tokens = P, .head_dim = d, .dtype = AKV_DTYPE_BF16};
            CHECK_OK(akv_kvq_encode_pairs(&a));
            akv_dptr src = up(ex, le.page_bytes * n), dst = up(NULL, lc.page_bytes * n), pr = up(pairs, sizeof pairs);
            CHECK_OK(akv_dev_memset_sync(dev, dst, 0, lc.page_bytes * n));
            a.src_pool = src.addr, a.dst_pool = dst.addr, a.pairs = pr.addr;
            CHECK_OK(akv_dev_op_launch(dev, &op, &a, sizeof a));
            CHECK_OK(akv_dev_sync(dev));
            down(got, dst, lc.page_bytes * n);
            size_t first = SIZE_MAX;
            for (size_t i = 0; i < lc.page_bytes * n && first == SIZE_MAX; i++)
                if (got[i] != want[i]) first = i;
            printf("  %s d%u: %u pages of %zu rows made on the device: %s\n", akv_repr_name((akv_repr)r), d, n,
                   rows, first == SIZE_MAX ? "the codec's bytes" : "DIFFER");
            if (first != SIZE_MAX)
                printf("    first difference at byte %zu of %zu: %02x, codec %02x\n", first, lc.page_bytes * n,
                       got[first], want[first]);
            CHECK(first == SIZE_MAX);
            dfree(src), dfree(dst), dfree(pr);
            free(ex), free(want), free(got);
        }
}

/* A compact past part widened on the device (akv_attn_cuda_widen) is the reference's, byte for
 * byte, table and pages: every form and head dim, a view whose first sequence is not the
 * table's, a sequence with no page, a range from page 2 of at most 3 pages. Whole pages (as the
 * compact tier's are): a dead row's NaN codes widen to a NaN whose payload the two round
 * differently, and no reader looks at it. */
static void test_widen_on_device(void) {
    for (int r = AKV_REPR_Q8; r <= AKV_REPR_Q4; r++)
        for (uint32_t d = 64; d <= 128; d *= 2) {
            const fx_geom g = {8, 2, d, 16, AKV_DTYPE_BF16};
            const uint32_t len[5] = {48, 16 * 7, 0, 16 * 3, 16 * 5};
            fx_table f;
            fx_table_make(&f, g, 5, len, 2, 1, &rng);
            if (!CHECK(fx_table_compact(&f, (akv_repr)r))) break;
            f.past = 1;
            akv_repr_layout le;
            CHECK_OK(akv_repr_layout_of(AKV_REPR_EXACT, g.dtype, g.n_kv_heads, g.page_tokens, d, &le));
            dtable dt = dt_up(&f);
            for (int c = 0; c < 2; c++) {
                const uint32_t first = c ? 2 : 0, max_out = c ? 3 : 7, n_out = 4 * max_out;
                const size_t out_bytes = n_out * le.page_bytes, tab_ints = 4 + 1 + 4 + n_out;
                unsigned char *want = malloc(out_bytes), *got = malloc(out_bytes);
                int32_t *want_tab = malloc(tab_ints * 4), *got_tab = malloc(tab_ints * 4);
                memset(want, 0xff, out_bytes), memset(got, 0xff, out_bytes);
                memset(want_tab, 0xff, tab_ints * 4);
                akv_attn_widen w = {.kv = fx_pages(&f), .first = first, .max_out = max_out};
                w.kv.indptr = akv_attn_host_ptr(f.indptr + 1), w.kv.last_page_len = akv_attn_host_ptr(f.last + 1);
                w.kv.n_seq = 4;
                w.out_pool = akv_attn_host_ptr(want), w.out_indptr = akv_attn_host_ptr(want_tab);
                w.out_last = akv_attn_host_ptr(want_tab + 5), w.out_indices = akv_attn_host_ptr(want_tab + 9);
                CHECK_OK(akv_attn_ref_widen(&w));
                akv_dptr out_d = poisoned(out_bytes), tab_d = poisoned(tab_ints * 4);
                akv_attn_widen wd = w;
                wd.kv = dt_pages(&f, &dt);
                wd.kv.indptr = akv_dptr_offset(dt.indptr, 4), wd.kv.last_page_len = akv_dptr_offset(dt.last, 4);
                wd.kv.n_seq = 4;
                wd.out_pool = out_d, wd.out_indptr = tab_d, wd.out_last = akv_dptr_offset(tab_d, 5 * 4);
                wd.out_indices = akv_dptr_offset(tab_d, 9 * 4);
                CHECK_OK(akv_attn_cuda_widen(&wd, NULL));
                CHECK_OK(akv_dev_sync(dev));
                down(got, out_d, out_bytes);
                down(got_tab, tab_d, tab_ints * 4);
                const uint32_t n_given = (uint32_t)want_tab[4];
                CHECK_BYTES(got_tab, want_tab, 9 * 4); /* indptr, last */
                CHECK_BYTES(got_tab + 9, want_tab + 9, n_given * 4);
                CHECK_BYTES(got, want, n_given * le.page_bytes);
                printf("  %s d%u from page %u, at most %u a sequence: %u pages widened on the device%s\n",
                       akv_repr_name((akv_repr)r), d, first, max_out, n_given,
                       memcmp(got, want, n_given * le.page_bytes) ? " DIFFER" : ", the reference's bytes");
                dfree(out_d), dfree(tab_d);
                free(want), free(got), free(want_tab), free(got_tab);
            }
            dt_free(&dt);
            fx_table_free(&f);
        }
}

/* Prefill with the chunk's K/V: attention against float64, and the pool bit-exact against the
 * reference's append (including the NaN of every slot nobody owns). Over a past part (`past`):
 * the table holds only each sequence's hist keys, all before the chunk, and takes no K/V. */
static void prefill_case_past(const char *name, fx_geom g, uint32_t n_seq, const uint32_t *hist,
                              const uint32_t *chunk, akv_dtype q_dtype, akv_dtype kv_dtype, akv_dtype o_dtype,
                              akv_attn_prefill_kernel kernel, bool past) {
    uint32_t len[8], max_chunk = 1;
    int32_t qo[9] = {0};
    for (uint32_t s = 0; s < n_seq; s++) {
        len[s] = hist[s] + (past ? 0 : chunk[s]);
        qo[s + 1] = qo[s] + (int32_t)chunk[s];
        if (chunk[s] > max_chunk) max_chunk = chunk[s];
    }
    uint32_t n_tok = (uint32_t)qo[n_seq], D = g.head_dim;
    fx_table f;
    fx_table_make(&f, g, n_seq, len, 3, 1, &rng);
    f.past = past;
    dtable d = dt_up(&f);
    size_t n_rows = (size_t)n_tok * g.n_heads, kv_elems = (size_t)n_tok * g.n_kv_heads * D;
    void *q = fx_random(q_dtype, n_rows * D, 2.0f, &rng);
    void *k = fx_random(kv_dtype, kv_elems, 1.0f, &rng), *v = fx_random(kv_dtype, kv_elems, 1.0f, &rng);
    akv_dptr q_d = up(q, n_rows * D * akv_dtype_size(q_dtype)), qo_d = up(qo, (n_seq + 1) * 4);
    akv_dptr k_d = up(k, kv_elems * akv_dtype_size(kv_dtype)), v_d = up(v, kv_elems * akv_dtype_size(kv_dtype));
    akv_dptr o_d = poisoned(n_rows * D * akv_dtype_size(o_dtype)), l_d = poisoned(n_rows * 4);
    akv_attn_prefill p = {
        .kv = dt_pages(&f, &d), .n_heads = g.n_heads, .qo_indptr = qo_d, .n_tokens = n_tok, .max_chunk = max_chunk,
        .q = q_d, .q_dtype = q_dtype, .k_new = k_d, .v_new = v_d, .kv_new_dtype = kv_dtype,
        .o = o_d, .o_dtype = o_dtype, .lse = l_d, .kernel = kernel,
    };
    akv_attn_prefill hp = p;
    hp.kv = fx_pages(&f), hp.qo_indptr = akv_attn_host_ptr(qo), hp.q = akv_attn_host_ptr(q);
    hp.k_new = akv_attn_host_ptr(k), hp.v_new = akv_attn_host_ptr(v), hp.lse.addr = 0;
    if (past) p.k_new = p.v_new = hp.k_new = hp.v_new = (akv_dptr){0};
    double *o64 = malloc(n_rows * D * 8), *l64 = malloc(n_rows * 8);
    CHECK_OK(akv_attn_ref_prefill_f64(&hp, o64, l64)); /* writes the chunk into the host pool too */
    akv_status st = akv_attn_cuda_prefill(&p, NULL);
    CHECK_OK(st);
    if (st == AKV_OK) {
        void *o = malloc(n_rows * D * akv_dtype_size(o_dtype));
        float *lse = malloc(n_rows * 4);
        unsigned char *pool = malloc(f.pool_bytes);
        down(o, o_d, n_rows * D * akv_dtype_size(o_dtype));
        down(lse, l_d, n_rows * 4);
        down(pool, d.pool, f.pool_bytes);
        FX_COMPARE(name, o, o_dtype, lse, o64, l64, n_rows, D, REL_TOL, LSE_TOL);
        printf("  %-44s worst row rel err %.2e, lse err %.2e\n", name, fx_last_worst, fx_last_worst_lse);
        CHECK_BYTES(pool, f.pool, f.pool_bytes);
        /* determinism */
        void *o2 = malloc(n_rows * D * akv_dtype_size(o_dtype));
        CHECK_OK(akv_dev_memset_sync(dev, o_d, 0xff, n_rows * D * akv_dtype_size(o_dtype)));
        CHECK_OK(akv_attn_cuda_prefill(&p, NULL));
        down(o2, o_d, n_rows * D * akv_dtype_size(o_dtype));
        CHECK_BYTES(o, o2, n_rows * D * akv_dtype_size(o_dtype));
        free(o), free(o2), free(lse), free(pool);
    }
    free(q), free(k), free(v), free(o64), free(l64);
    dfree(q_d), dfree(qo_d), dfree(k_d), dfree(v_d), dfree(o_d), dfree(l_d);
    dt_free(&d);
    fx_table_free(&f);
}
static void prefill_case(const char *name, fx_geom g, uint32_t n_seq, const uint32_t *hist, const uint32_t *chunk,
                         akv_dtype q_dtype, akv_dtype kv_dtype, akv_dtype o_dtype, akv_attn_prefill_kernel kernel) {
    prefill_case_past(name, g, n_seq, hist, chunk, q_dtype, kv_dtype, o_dtype, kernel, false);
}

/* Whether the wgmma prefill kernel runs here: it must on a compute capability 9 device when
 * the build has sm_90a (AKV_CUDA_WGMMA), and a forced call must refuse everywhere else. */
static bool wgmma_here(void) {
    akv_dev_info info;
    CHECK_OK(akv_dev_get_info(dev, &info));
    const int32_t qo[2] = {0, 1};
    uint32_t len = 1;
    fx_table f;
    fx_table_make(&f, (fx_geom){2, 1, 128, 16, AKV_DTYPE_BF16}, 1, &len, 1, 1, &rng);
    dtable d = dt_up(&f);
    void *qh = fx_random(AKV_DTYPE_BF16, 256, 1.0f, &rng);
    akv_dptr q = up(qh, 512), qo_d = up(qo, 8), o = poisoned(512);
    akv_attn_prefill p = {.kv = dt_pages(&f, &d), .n_heads = 2, .qo_indptr = qo_d, .n_tokens = 1, .max_chunk = 1,
                          .q = q, .q_dtype = AKV_DTYPE_BF16, .o = o, .o_dtype = AKV_DTYPE_BF16,
                          .kernel = AKV_ATTN_PREFILL_WGMMA};
    const akv_status st = akv_attn_cuda_prefill(&p, NULL);
#ifdef AKV_CUDA_WGMMA
    const akv_status want = info.cc_major == 9 ? AKV_OK : AKV_EUNSUPPORTED;
#else
    const akv_status want = AKV_EUNSUPPORTED;
#endif
    TEST_CHECK_(st == want, "forced wgmma prefill on compute capability %d: %s, want %s", info.cc_major,
                akv_status_name(st), akv_status_name(want));
    printf("  wgmma prefill kernel: %s (compute capability %d.%d)\n", st == AKV_OK ? "runs" : "refused",
           info.cc_major, info.cc_minor);
    free(qh);
    dfree(q), dfree(qo_d), dfree(o);
    dt_free(&d);
    fx_table_free(&f);
    return st == AKV_OK;
}

static void test_prefill(void) {
    const bool wg = wgmma_here();
    const akv_attn_prefill_kernel kernels[2] = {AKV_ATTN_PREFILL_MMA, AKV_ATTN_PREFILL_WGMMA};
    const char *kname[2] = {"mma", "wgmma"};
    char name[96];
    for (int k = 0; k < 2; k++) {
        if (kernels[k] == AKV_ATTN_PREFILL_WGMMA && !wg) continue;
        const uint32_t h1[5] = {0, 0, 63, 65, 600}, c1[5] = {1, 130, 64, 300, 129};
        snprintf(name, sizeof name, "prefill 32/8 d128 P64 %s", kname[k]);
        prefill_case(name, (fx_geom){32, 8, 128, 64, AKV_DTYPE_BF16}, 5, h1, c1, AKV_DTYPE_BF16, AKV_DTYPE_BF16,
                     AKV_DTYPE_BF16, kernels[k]);
        /* many key tiles of both sizes, a last tile cut short, a chunk past two row tiles */
        const uint32_t h4[2] = {3001, 127}, c4[2] = {700, 257};
        snprintf(name, sizeof name, "prefill 32/8 d128 P64 long %s", kname[k]);
        prefill_case(name, (fx_geom){32, 8, 128, 64, AKV_DTYPE_BF16}, 2, h4, c4, AKV_DTYPE_BF16, AKV_DTYPE_BF16,
                     AKV_DTYPE_F32, kernels[k]);
        const uint32_t h3[3] = {17, 0, 3}, c3[3] = {200, 16, 5};
        snprintf(name, sizeof name, "prefill 4/2 d128 P16 %s", kname[k]);
        prefill_case(name, (fx_geom){4, 2, 128, 16, AKV_DTYPE_BF16}, 3, h3, c3, AKV_DTYPE_F32, AKV_DTYPE_BF16,
                     AKV_DTYPE_F32, kernels[k]);
        /* over past parts: every row sees every key (an empty history: empty states; a last
         * tile cut short; a chunk past two row tiles) */
        const uint32_t h5[4] = {0, 1, 3001, 200}, c5[4] = {5, 130, 257, 64};
        snprintf(name, sizeof name, "prefill over a past part 32/8 d128 P64 %s", kname[k]);
        prefill_case_past(name, (fx_geom){32, 8, 128, 64, AKV_DTYPE_BF16}, 4, h5, c5, AKV_DTYPE_F32,
                          AKV_DTYPE_BF16, AKV_DTYPE_F32, kernels[k], true);
    }
    const uint32_t h6[2] = {77, 513}, c6[2] = {300, 3};
    prefill_case_past("prefill over a past part 9/3 d64 P16", (fx_geom){9, 3, 64, 16, AKV_DTYPE_BF16}, 2, h6, c6,
                      AKV_DTYPE_F32, AKV_DTYPE_BF16, AKV_DTYPE_F32, AKV_ATTN_PREFILL_AUTO, true);
    const uint32_t h2[2] = {0, 255}, c2[2] = {777, 129};
    prefill_case("prefill 9/3 d64 P256", (fx_geom){9, 3, 64, 256, AKV_DTYPE_BF16}, 2, h2, c2, AKV_DTYPE_F32,
                 AKV_DTYPE_F32, AKV_DTYPE_F32, AKV_ATTN_PREFILL_AUTO);
}

/* Copies the pages of sequence src_seq of table src into the pages of sequence dst_seq of
 * table dst (the same number of pages); returns how many of them sit at another page id. */
static int copy_history(fx_table *dst, uint32_t dst_seq, const fx_table *src, uint32_t src_seq) {
    int moved = 0;
    for (int32_t i = 0; i < src->indptr[src_seq + 1] - src->indptr[src_seq]; i++) {
        int32_t to = dst->indices[dst->indptr[dst_seq] + i], from = src->indices[src->indptr[src_seq] + i];
        memcpy(dst->pool + (size_t)to * dst->page_bytes, src->pool + (size_t)from * src->page_bytes, src->page_bytes);
        moved += to != from;
    }
    return moved;
}

/* The bitwise cell: sequence 0 of a batch vs the same contents at other physical pages, as
 * sequence 1 of another batch with the same capacity: identical bits, decode and prefill. */
static void test_bitwise_cell(void) {
    const fx_geom g = {32, 8, 128, 64, AKV_DTYPE_BF16};
    const uint32_t nq = 2, D = 128, len_a[2] = {3000, 100};
    fx_table a;
    fx_table_make(&a, g, 2, len_a, 4, 10, &rng);
    /* table b: [another sequence, the same history]; its pages are moved to other ids */
    uint32_t len_b[2] = {777, len_a[0]};
    fx_table b;
    fx_table_make(&b, g, 2, len_b, 9, 10, &rng);
    b.max_pages = a.max_pages;
    copy_history(&b, 1, &a, 0);
    CHECK(a.indices[0] != b.indices[b.indptr[1]]);
    dtable da = dt_up(&a), db = dt_up(&b);
    size_t rows = (size_t)nq * g.n_heads;
    void *q = fx_random(AKV_DTYPE_BF16, 2 * rows * D, 2.0f, &rng);
    akv_dptr qa = up(q, 2 * rows * D * 2);
    /* batch b's queries: the same rows for its sequence 1 */
    void *qb_h = malloc(2 * rows * D * 2);
    memcpy((char *)qb_h + rows * D * 2, q, rows * D * 2);
    memcpy(qb_h, (char *)q + rows * D * 2, rows * D * 2);
    akv_dptr qb = up(qb_h, 2 * rows * D * 2);
    float *oa = malloc(2 * rows * D * 4), *ob = malloc(2 * rows * D * 4), la[2 * 64], lb[2 * 64];
    CHECK_OK(run_decode(&a, &da, nq, qa, AKV_DTYPE_BF16, AKV_DTYPE_F32, oa, la, NULL));
    CHECK_OK(run_decode(&b, &db, nq, qb, AKV_DTYPE_BF16, AKV_DTYPE_F32, ob, lb, NULL));
    CHECK_BYTES(oa, ob + rows * D, rows * D * 4);
    CHECK_BYTES(la, lb + rows, rows * 4);
    /* prefill of the last 300 tokens as a chunk (already in the pages), same test */
    int32_t qo_a[3] = {0, 300, 400}, qo_b[3] = {0, 100, 400};
    akv_dptr qo_ad = up(qo_a, 12), qo_bd = up(qo_b, 12);
    void *pq = fx_random(AKV_DTYPE_BF16, 400 * (size_t)g.n_heads * D, 2.0f, &rng);
    void *pqb = malloc(400 * (size_t)g.n_heads * D * 2);
    size_t row_bytes = (size_t)g.n_heads * D * 2;
    memcpy((char *)pqb + 100 * row_bytes, pq, 300 * row_bytes);
    memcpy(pqb, (char *)pq + 300 * row_bytes, 100 * row_bytes);
    akv_dptr pqa_d = up(pq, 400 * row_bytes), pqb_d = up(pqb, 400 * row_bytes);
    akv_dptr poa = poisoned(400 * (size_t)g.n_heads * D * 4), pob = poisoned(400 * (size_t)g.n_heads * D * 4);
    akv_attn_prefill pa = {
        .kv = dt_pages(&a, &da), .n_heads = g.n_heads, .qo_indptr = qo_ad, .n_tokens = 400, .max_chunk = 300,
        .q = pqa_d, .q_dtype = AKV_DTYPE_BF16, .o = poa, .o_dtype = AKV_DTYPE_F32,
    };
    akv_attn_prefill pb = pa;
    pb.kv = dt_pages(&b, &db), pb.qo_indptr = qo_bd, pb.q = pqb_d, pb.o = pob;
    CHECK_OK(akv_attn_cuda_prefill(&pa, NULL));
    CHECK_OK(akv_attn_cuda_prefill(&pb, NULL));
    float *h_a = malloc(300 * row_bytes * 2), *h_b = malloc(300 * row_bytes * 2);
    down(h_a, poa, 300 * row_bytes * 2);
    down(h_b, akv_dptr_offset(pob, 100 * row_bytes * 2), 300 * row_bytes * 2);
    CHECK_BYTES(h_a, h_b, 300 * row_bytes * 2);
    free(q), free(qb_h), free(oa), free(ob), free(pq), free(pqb), free(h_a), free(h_b);
    dfree(qa), dfree(qb), dfree(qo_ad), dfree(qo_bd), dfree(pqa_d), dfree(pqb_d), dfree(poa), dfree(pob);
    dt_free(&da), dt_free(&db);
    fx_table_free(&a), fx_table_free(&b);
}

/* The bitwise cell of a lone sequence over a short capacity (900 keys of 1024: 8
 * partitions, a cluster merge where the device has clusters): the same history at other page
 * ids gives the same bits. */
static void test_bitwise_cell_one(void) {
    const fx_geom g = {32, 8, 128, 64, AKV_DTYPE_BF16};
    const uint32_t nq = 3, D = 128, len[1] = {900};
    fx_table a, b;
    fx_table_make(&a, g, 1, len, 3, 1, &rng);
    fx_table_make(&b, g, 1, len, 7, 1, &rng);
    const int moved = copy_history(&b, 0, &a, 0);
    CHECK(moved > 0);
    dtable da = dt_up(&a), db = dt_up(&b);
    size_t rows = (size_t)nq * g.n_heads;
    void *q = fx_random(AKV_DTYPE_BF16, rows * D, 2.0f, &rng);
    akv_dptr qd = up(q, rows * D * 2);
    float *oa = malloc(rows * D * 4), *ob = malloc(rows * D * 4), *la = malloc(rows * 4), *lb = malloc(rows * 4);
    run_info ri = {{0, 0}, 1};
    CHECK_OK(run_decode(&a, &da, nq, qd, AKV_DTYPE_BF16, AKV_DTYPE_F32, oa, la, NULL));
    CHECK_OK(run_decode(&b, &db, nq, qd, AKV_DTYPE_BF16, AKV_DTYPE_F32, ob, lb, &ri));
    printf("  bitwise cell, one sequence of 900 keys, %d pages moved: %s merge\n", moved,
           ri.cluster > 1 ? "cluster" : "workspace");
    CHECK_EQ_U64(ri.cluster, expect_cluster(8));
    CHECK_BYTES(oa, ob, rows * D * 4);
    CHECK_BYTES(la, lb, rows * 4);
    free(q), free(oa), free(ob), free(la), free(lb);
    dfree(qd);
    dt_free(&da), dt_free(&db);
    fx_table_free(&a), fx_table_free(&b);
}

/* Decode's tail write: two new tokens per sequence from f32 rows with a stride. */
static void test_append(void) {
    const fx_geom g = {8, 2, 64, 16, AKV_DTYPE_BF16};
    const uint32_t len[4] = {2, 16, 17, 100}, stride = 3 * 2 * 64;
    fx_table f;
    fx_table_make(&f, g, 4, len, 2, 0, &rng);
    dtable d = dt_up(&f);
    float *kv = fx_random(AKV_DTYPE_F32, (size_t)8 * stride, 1.0f, &rng);
    akv_dptr kv_d = up(kv, (size_t)8 * stride * 4);
    akv_attn_append p = {
        .kv = dt_pages(&f, &d), .n_per_seq = 2, .n_tokens = 8, .max_new = 2, .k = kv_d,
        .v = akv_dptr_offset(kv_d, 128 * 4), .dtype = AKV_DTYPE_F32, .stride = stride,
    };
    CHECK_OK(akv_attn_cuda_append(&p, NULL));
    akv_attn_append hp = p;
    hp.kv = fx_pages(&f), hp.k = akv_attn_host_ptr(kv), hp.v = akv_attn_host_ptr(kv + 128);
    CHECK_OK(akv_attn_ref_append(&hp));
    unsigned char *pool = malloc(f.pool_bytes);
    down(pool, d.pool, f.pool_bytes);
    CHECK_BYTES(pool, f.pool, f.pool_bytes);
    free(pool), free(kv);
    dfree(kv_d);
    dt_free(&d);
    fx_table_free(&f);
}

/* The prefetch promise kept by the forward pass's order (akv_attn_decode.prefetch_history):
 * on the compute queue, a long busy kernel that lets dependents start at once, the append of
 * the queries' rows (which waits for it before writing), then the decode that prefetches its
 * history. The pool starts with the queries' rows NaN: a decode that read any of them before
 * the append's writes landed would give NaN rows. While the busy kernel runs, the decode's
 * blocks are resident and have issued their early loads (test_attn_cuda on an sm_90 device;
 * on older ones no launch is early and the case holds trivially). Each round must match, bit
 * for bit, a decode that ran after the append had finished. */
static void prefetch_case(fx_geom g, uint32_t NS, const uint32_t *len, uint32_t NQ) {
    enum { ROUNDS = 4 };
    fx_table f;
    fx_table_make(&f, g, NS, len, 1, 0, &rng);
    const size_t row = (size_t)g.n_kv_heads * g.head_dim, n_new = (size_t)NS * NQ;
    float *kv = fx_random(AKV_DTYPE_F32, 2 * n_new * row, 1.0f, &rng), *nan_kv = malloc(2 * n_new * row * 4);
    memset(nan_kv, 0xff, 2 * n_new * row * 4);
    akv_attn_append hp = {.kv = fx_pages(&f), .n_per_seq = NQ, .n_tokens = (uint32_t)n_new, .max_new = NQ,
                          .k = akv_attn_host_ptr(nan_kv), .v = akv_attn_host_ptr(nan_kv + n_new * row),
                          .dtype = AKV_DTYPE_F32};
    CHECK_OK(akv_attn_ref_append(&hp)); /* the queries' rows NaN: the pool each round starts from */
    unsigned char *poison = malloc(f.pool_bytes);
    memcpy(poison, f.pool, f.pool_bytes);
    dtable d = dt_up(&f);
    akv_dptr kv_d = up(kv, 2 * n_new * row * 4), sink = poisoned(64);
    const size_t n_rows = n_new * g.n_heads, o_bytes = n_rows * g.head_dim * 2;
    float *q = fx_random(AKV_DTYPE_F32, n_rows * g.head_dim, 2.0f, &rng);
    akv_dptr q_d = up(q, n_rows * g.head_dim * 4);
    akv_fwd_attn_append_args ap = {.p = {.kv = dt_pages(&f, &d), .n_per_seq = NQ, .n_tokens = (uint32_t)n_new,
                                         .max_new = NQ, .k = kv_d, .v = akv_dptr_offset(kv_d, n_new * row * 4),
                                         .dtype = AKV_DTYPE_F32}};
    akv_fwd_attn_decode_args dp = {.p = {.kv = dt_pages(&f, &d), .n_heads = g.n_heads, .n_query = NQ, .q = q_d,
                                         .q_dtype = AKV_DTYPE_F32, .o = poisoned(o_bytes), .o_dtype = AKV_DTYPE_BF16,
                                         .lse = poisoned(n_rows * 4), .prefetch_history = true,
                                         .tuning = tuning}};
    akv_attn_split sp;
    size_t ws_bytes = 0;
    uint32_t cluster = 1;
    CHECK_OK(akv_attn_cuda_decode_split(&dp.p, &sp));
    CHECK_OK(akv_attn_cuda_decode_cluster_size(&dp.p, &cluster));
    CHECK_OK(akv_attn_decode_workspace_bytes(&dp.p, &sp, &ws_bytes));
    dp.workspace = up(NULL, ws_bytes), dp.workspace_bytes = ws_bytes;
    CHECK_OK(akv_dev_memset_sync(dev, dp.workspace, 0, ws_bytes ? ws_bytes : 16));
    /* the expected bits: the append, synchronised, then the decode */
    void *o0 = malloc(o_bytes), *o1 = malloc(o_bytes);
    float *l0 = malloc(n_rows * 4), *l1 = malloc(n_rows * 4);
    CHECK_OK(akv_dev_op_launch(dev, &akv_fwd_op_attn_append, &ap, sizeof ap));
    CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
    CHECK_OK(akv_dev_op_launch(dev, &akv_fwd_op_attn_decode, &dp, sizeof dp));
    CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
    down(o0, dp.p.o, o_bytes);
    down(l0, dp.p.lse, n_rows * 4);
    /* ... which is right: the float64 reference over the pool with the real rows */
    hp.k = akv_attn_host_ptr(kv), hp.v = akv_attn_host_ptr(kv + n_new * row);
    CHECK_OK(akv_attn_ref_append(&hp));
    double *o64 = malloc(n_rows * g.head_dim * 8), *l64 = malloc(n_rows * 8);
    akv_attn_decode rp = {.kv = fx_pages(&f), .n_heads = g.n_heads, .n_query = NQ, .q = akv_attn_host_ptr(q),
                          .q_dtype = AKV_DTYPE_F32};
    CHECK_OK(akv_attn_ref_decode_f64(&rp, o64, l64));
    FX_COMPARE("decode after append", o0, AKV_DTYPE_BF16, l0, o64, l64, n_rows, g.head_dim, REL_TOL, LSE_TOL);
    free(o64), free(l64);
    akv_dev_busy_args busy = {.n_blocks = 1, .n_threads = 32, .n_iters = 400000, .sink = sink};
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        CHECK_OK(akv_dev_copy_h2d_sync(dev, d.pool, poison, f.pool_bytes));
        CHECK_OK(akv_dev_memset_sync(dev, dp.p.o, 0xff, o_bytes));
        CHECK_OK(akv_dev_memset_sync(dev, dp.p.lse, 0xff, n_rows * 4));
        CHECK_OK(akv_dev_op_launch(dev, &akv_dev_op_busy, &busy, sizeof busy));
        CHECK_OK(akv_dev_op_launch(dev, &akv_fwd_op_attn_append, &ap, sizeof ap));
        CHECK_OK(akv_dev_op_launch(dev, &akv_fwd_op_attn_decode, &dp, sizeof dp));
        CHECK_OK(akv_dev_queue_sync(dev, AKV_QUEUE_COMPUTE));
        down(o1, dp.p.o, o_bytes);
        down(l1, dp.p.lse, n_rows * 4);
        bad += memcmp(o0, o1, o_bytes) != 0 || memcmp(l0, l1, n_rows * 4) != 0;
    }
    printf("  %u/%u d%u P%u, %u x nq%u after a held append (%u partitions of %u keys%s): %d of %d rounds differ\n",
           g.n_heads, g.n_kv_heads, g.head_dim, g.page_tokens, NS, NQ, sp.n_parts, sp.part_tokens,
           cluster > 1 ? ", cluster" : "", bad, ROUNDS);
    CHECK_EQ_INT(bad, 0);
    free(kv), free(nan_kv), free(poison), free(q), free(o0), free(o1), free(l0), free(l1);
    dfree(kv_d), dfree(sink), dfree(q_d), dfree(dp.p.o), dfree(dp.p.lse), dfree(dp.workspace);
    dt_free(&d);
    fx_table_free(&f);
}

static void test_prefetch_after_append(void) {
    if (dev_cc_major < 9)
        printf("  (no launch is early on this device: these cases hold trivially)\n");
    /* Llama-3-8B's shape over a batch; GQA 8 at d=64 with pages smaller than a tile and 32
     * rows (4 queries); one sequence of 1000 keys (8 partitions: a cluster where it applies) */
    const uint32_t batch[6] = {2, 37, 64, 65, 129, 1000}, small[5] = {4, 17, 40, 100, 300}, one[1] = {1000};
    prefetch_case((fx_geom){32, 8, 128, 64, AKV_DTYPE_BF16}, 6, batch, 2);
    prefetch_case((fx_geom){16, 2, 64, 16, AKV_DTYPE_BF16}, 5, small, 4);
    prefetch_case((fx_geom){32, 8, 128, 64, AKV_DTYPE_BF16}, 1, one, 1);
}

static void test_merge(void) {
    enum { N = 37, D = 128 };
    float *oa = fx_random(AKV_DTYPE_F32, N * D, 1.0f, &rng), *ob = fx_random(AKV_DTYPE_F32, N * D, 1.0f, &rng);
    float la[N], lb[N];
    for (int r = 0; r < N; r++) {
        la[r] = 10.0f * test_rand_f32(&rng), lb[r] = 10.0f * test_rand_f32(&rng);
        if (r % 5 == 1) la[r] = -INFINITY;
        if (r % 7 == 2) lb[r] = -INFINITY;
    }
    akv_dptr oa_d = up(oa, N * D * 4), ob_d = up(ob, N * D * 4), la_d = up(la, N * 4), lb_d = up(lb, N * 4);
    akv_attn_merge p = {
        .n_rows = N, .head_dim = D, .o_a = oa_d, .lse_a = la_d, .o_b = ob_d, .lse_b = lb_d,
        .o = oa_d, .o_dtype = AKV_DTYPE_F32, .lse = la_d, /* in place */
    };
    CHECK_OK(akv_attn_cuda_merge(&p, NULL));
    akv_attn_merge hp = {
        .n_rows = N, .head_dim = D, .o_a = akv_attn_host_ptr(oa), .lse_a = akv_attn_host_ptr(la),
        .o_b = akv_attn_host_ptr(ob), .lse_b = akv_attn_host_ptr(lb), .o = akv_attn_host_ptr(oa),
        .o_dtype = AKV_DTYPE_F32, .lse = akv_attn_host_ptr(la),
    };
    CHECK_OK(akv_attn_ref_merge(&hp));
    float *o = malloc(N * D * 4), l[N];
    down(o, oa_d, N * D * 4);
    down(l, la_d, N * 4);
    CHECK_CLOSE_F32(o, oa, N * D, 1e-6, 1e-5);
    CHECK_CLOSE_F32(l, la, N, 1e-5, 1e-6);
    free(o), free(oa), free(ob);
    dfree(oa_d), dfree(ob_d), dfree(la_d), dfree(lb_d);
}

static void test_refusals(void) {
    const fx_geom g = {4, 2, 64, 16, AKV_DTYPE_BF16};
    const uint32_t len[1] = {40};
    fx_table f;
    fx_table_make(&f, g, 1, len, 0, 0, &rng);
    dtable d = dt_up(&f);
    akv_dptr buf = poisoned(1 << 16);
    akv_attn_decode p = {.kv = dt_pages(&f, &d), .n_heads = 4, .n_query = 1, .q = buf, .q_dtype = AKV_DTYPE_BF16,
                         .o = buf, .o_dtype = AKV_DTYPE_F32};
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    akv_attn_decode x = p;
    x.kv.head_dim = 96;
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EUNSUPPORTED);
    x = p, x.kv.dtype = AKV_DTYPE_F32;
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EUNSUPPORTED);
    x = p, x.n_query = 5;
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EINVAL);
    x = p, x.q = akv_dptr_offset(buf, 2);
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EINVAL);
    x = p, x.kv.max_pages = 1000; /* several partitions: a workspace is needed */
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EINVAL);
    x = p, x.q_dtype = AKV_DTYPE_F16;
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EUNSUPPORTED);
    x = p, x.kv.repr = AKV_REPR_Q8, x.kv.page_tokens = 4; /* a scale load would cross pages */
    CHECK_STATUS(akv_attn_cuda_decode(&x, (akv_dptr){0}, 0, NULL), AKV_EUNSUPPORTED);
    /* the prefill kernels read exact pages (a past part's too: it takes no new K/V); compact
     * ones are widened first, and the widen takes a compact past part of the kernels' shapes */
    int32_t qo_h[2] = {0, 1};
    akv_dptr qo = up(qo_h, sizeof qo_h);
    akv_attn_prefill pf = {.kv = dt_pages(&f, &d), .n_heads = 4, .qo_indptr = qo, .n_tokens = 1, .max_chunk = 1,
                           .q = buf, .q_dtype = AKV_DTYPE_BF16, .o = buf, .o_dtype = AKV_DTYPE_F32};
    pf.kv.repr = AKV_REPR_Q4;
    CHECK_STATUS(akv_attn_cuda_prefill(&pf, NULL), AKV_EUNSUPPORTED);
    pf.kv.repr = AKV_REPR_EXACT, pf.kv.past = 1, pf.k_new = pf.v_new = buf;
    CHECK_STATUS(akv_attn_cuda_prefill(&pf, NULL), AKV_EINVAL);
    akv_attn_widen w = {.kv = dt_pages(&f, &d), .max_out = 1, .out_pool = buf, .out_indptr = buf,
                        .out_indices = buf, .out_last = buf};
    CHECK_STATUS(akv_attn_cuda_widen(&w, NULL), AKV_EINVAL); /* exact, not past */
    w.kv.repr = AKV_REPR_Q8, w.kv.past = 1, w.kv.head_dim = 96;
    CHECK_STATUS(akv_attn_cuda_widen(&w, NULL), AKV_EUNSUPPORTED);
    dfree(qo);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    dfree(buf);
    dt_free(&d);
    fx_table_free(&f);
}
#endif

int main(int argc, char **argv) {
    test_args(argc, argv);
#ifndef AKV_HAVE_CUDA
    test_skip("built without the CUDA backend");
#else
    if (akv_dev_create(akv_dev_cuda_backend(), NULL, &dev) != AKV_OK) test_skip("no CUDA device answers on this machine");
    rng = test_seed(0xa77e0c0d);
    akv_dev_info info;
    CHECK_OK(akv_dev_get_info(dev, &info));
    dev_cc_major = info.cc_major;
    /* every decode variant (akv/attn.h), selected through the API, each with the cluster
     * merge and with the workspace merge only, then the defaults back */
    for (uint32_t v = 0; v < AKV_ATTN_DECODE_VARIANTS; v++)
        for (int cl = 1; cl >= 0; cl--) {
            tuning = (akv_attn_tuning){.variant = AKV_ATTN_VARIANT(v), .no_cluster = !cl};
            printf("decode variant %u, cluster merge %s\n", v, cl ? "where it applies" : "off");
            TEST_CASE(decode_vs_float64) {
                const int n_cluster_cases = test_decode();
                /* a compute capability 9 device runs the cluster merge for the cases of 2..8
                 * partitions (most of them); with the setting off, none does */
                printf("  %d decode cases merged in clusters\n", n_cluster_cases);
                if (!cl || dev_cc_major < 9) CHECK_EQ_INT(n_cluster_cases, 0);
                else CHECK(n_cluster_cases > 0);
            }
            TEST_CASE(bitwise_cell) {
                test_bitwise_cell();
                test_bitwise_cell_one();
            }
            TEST_CASE(prefetch_after_append) test_prefetch_after_append();
            TEST_CASE(decode_reads_compact_and_past_parts) test_decode_parts();
        }
    tuning = (akv_attn_tuning){0};
    TEST_CASE(prefill_vs_float64_and_pages) test_prefill();
    TEST_CASE(append_bit_exact) test_append();
    TEST_CASE(merge) test_merge();
    TEST_CASE(compact_pages_made_on_the_device_are_the_codecs) test_encode_on_device();
    TEST_CASE(compact_past_widened_on_the_device_is_the_references) test_widen_on_device();
    TEST_CASE(refusals) test_refusals();
    akv_dev_usage u = akv_dev_get_usage(dev);
    CHECK_EQ_U64(u.n_device, 0); /* every test buffer freed */
    CHECK_OK(akv_dev_destroy(dev));
    return test_finish();
#endif
}
