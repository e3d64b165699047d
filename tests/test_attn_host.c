/* test_attn_host.c (unit) — decode attention over host pages read in place (akv/attn_host.h):
 * every instruction set this CPU runs, chunk by chunk and merged in order, against the float64
 * oracle of the attention reference, on random pages of awkward shapes (head dims 20, 40, 64,
 * 72, 128, 256; GQA groups 1 to 12; pages of 1 to 256 tokens; histories of 0, 1, a page +- 1 and
 * several chunks; bf16, f16 and f32 pages), every unused slot NaN so a read past the history
 * poisons the result; compact pages (q8, q4) likewise; the empty state; the chunk cut; and the
 * refusals. */
#include "test.h"

#include "akv/attn.h"
#include "akv/attn_host.h"
#include "akv/log.h"
#include "attn/attn_host_run.h"
#include "attn_fixture.h"
#include "core/par.h"

static uint64_t rng;

static double tol_for(akv_dtype t) {
    return t == AKV_DTYPE_F32 ? 3e-5 : t == AKV_DTYPE_F16 ? 2e-4 : 2e-4;
}

/* The part of sequence 0 of f: its pages' addresses in order. */
static akv_attn_host_part part_of(const fx_table *f, const void **pages, const float *q) {
    const uint32_t n = (uint32_t)(f->indptr[1] - f->indptr[0]);
    for (uint32_t i = 0; i < n; i++) pages[i] = f->pool + (size_t)f->indices[i] * f->page_bytes;
    akv_attn_host_part p = {
        .pages = pages,
        .n_pages = n,
        .last_len = n ? (uint32_t)f->last[0] : 0,
        .n_kv_heads = f->g.n_kv_heads,
        .head_dim = f->g.head_dim,
        .page_tokens = f->g.page_tokens,
        .dtype = f->g.dtype,
        .n_heads = f->g.n_heads,
        .q = q,
        .repr = f->repr,
    };
    return p;
}

/* Every chunk of every K/V head, merged in chunk order: o [n_heads][head_dim], lse [n_heads]. */
static void run_part(const akv_attn_host_part *p, akv_attn_host_isa isa, float *o, float *lse) {
    const uint32_t G = p->n_heads / p->n_kv_heads, D = p->head_dim, nc = akv_attn_host_chunks(p);
    float *co = malloc((size_t)G * D * sizeof *co), *cl = malloc(G * sizeof *cl);
    for (uint32_t h = 0; h < p->n_kv_heads; h++) {
        float *oh = o + (size_t)h * G * D, *lh = lse + (size_t)h * G;
        for (uint32_t r = 0; r < G; r++) lh[r] = -INFINITY;
        memset(oh, 0, (size_t)G * D * sizeof *oh);
        for (uint32_t c = 0; c < nc; c++) {
            uint32_t a, b;
            akv_attn_host_chunk_pages(p, c, &a, &b);
            akv_attn_host_chunk(p, isa, h, a, b, co, cl);
            for (uint32_t r = 0; r < G; r++) akv_attn_merge_state(D, oh + (size_t)r * D, lh + r, co + (size_t)r * D, cl[r]);
        }
    }
    free(co), free(cl);
}

/* Returns 0 (nothing run) for a compact representation the shape cannot take. */
static int part_case(fx_geom g, uint32_t len, akv_attn_host_isa isa, akv_repr repr) {
    fx_table f;
    fx_table_make(&f, g, 1, &len, 3, 1, &rng);
    f.past = 1;
    if (repr != AKV_REPR_EXACT && !fx_table_compact(&f, repr)) {
        fx_table_free(&f);
        return 0;
    }
    const size_t n_rows = g.n_heads, d = g.head_dim;
    float *q = fx_random(AKV_DTYPE_F32, n_rows * d, 2.0f, &rng);
    float *o = malloc(n_rows * d * sizeof *o), *lse = malloc(n_rows * sizeof *lse);
    double *o64 = malloc(n_rows * d * sizeof *o64), *lse64 = malloc(n_rows * sizeof *lse64);
    const void **pages = malloc((f.n_pages + 1) * sizeof *pages);
    akv_attn_decode ref = {
        .kv = fx_pages(&f),
        .n_heads = g.n_heads,
        .n_query = 1,
        .q = akv_attn_host_ptr(q),
        .q_dtype = AKV_DTYPE_F32,
        .o = akv_attn_host_ptr(o),
        .o_dtype = AKV_DTYPE_F32,
    };
    CHECK_OK(akv_attn_ref_decode_f64(&ref, o64, lse64));
    akv_attn_host_part p = part_of(&f, pages, q);
    CHECK_OK(akv_attn_host_part_check(&p));
    memset(o, 0xff, n_rows * d * sizeof *o); /* NaN: every output must be written */
    run_part(&p, isa, o, lse);
    char what[160];
    snprintf(what, sizeof what, "host part %u/%u d%u P%u %s %s, %u tokens (%u chunks), %s", g.n_heads,
             g.n_kv_heads, g.head_dim, g.page_tokens, akv_dtype_name(g.dtype), akv_repr_name(repr),
             len, akv_attn_host_chunks(&p), akv_attn_host_isa_name(isa));
    if (len) {
        /* a compact part: the oracle reads the same decoded rows (f32 values) */
        const double tol = repr != AKV_REPR_EXACT ? tol_for(AKV_DTYPE_F32) : tol_for(g.dtype);
        FX_COMPARE(what, o, AKV_DTYPE_F32, lse, o64, lse64, n_rows, g.head_dim, tol, 2e-5);
    } else { /* an empty history: the empty state */
        for (size_t i = 0; i < n_rows * d; i++) TEST_CHECK_(o[i] == 0.0f, "%s: o[%zu] = %g", what, i, o[i]);
        for (size_t i = 0; i < n_rows; i++) TEST_CHECK_(lse[i] == -INFINITY, "%s: lse[%zu] = %g", what, i, lse[i]);
    }
    free(q), free(o), free(lse), free(o64), free(lse64), free(pages);
    fx_table_free(&f);
    return 1;
}

static void test_against_f64(void) {
    static const fx_geom geoms[] = {
        {32, 8, 128, 64, AKV_DTYPE_BF16}, /* Llama-3-8B */
        {9, 3, 64, 256, AKV_DTYPE_BF16},  /* SmolLM2-135M */
        {16, 8, 128, 16, AKV_DTYPE_BF16}, /* Qwen3-0.6B, small pages */
        {8, 1, 64, 16, AKV_DTYPE_F16},    /* a GQA group of 8: one pass of rows */
        {12, 1, 40, 32, AKV_DTYPE_BF16},  /* 12: two passes; 40: a tail in every lane width */
        {4, 4, 72, 8, AKV_DTYPE_F32},     /* no grouping; 72: AVX2 whole, AVX-512 tail */
        {2, 1, 256, 1, AKV_DTYPE_BF16},   /* the widest head, a token a page */
        {6, 2, 20, 4, AKV_DTYPE_F16},     /* 20: a tail in every lane width */
    };
    int ran[AKV_ATTN_HOST_ISAS] = {0};
    for (int i = AKV_ATTN_HOST_PORTABLE; i < AKV_ATTN_HOST_ISAS; i++) {
        const akv_attn_host_isa isa = (akv_attn_host_isa)i;
        if (akv_attn_host_isa_resolve(isa) != isa) continue; /* this CPU lacks it */
        ran[i] = 1;
        for (size_t k = 0; k < sizeof geoms / sizeof *geoms; k++) {
            const fx_geom g = geoms[k];
            const uint32_t P = g.page_tokens;
            const uint32_t lens[] = {0, 1, P > 1 ? P - 1 : 2, P, P + 1, 2 * AKV_ATTN_HOST_CHUNK_TOKENS + 3 * P / 2 + 5};
            for (size_t j = 0; j < sizeof lens / sizeof *lens; j++) part_case(g, lens[j], isa, AKV_REPR_EXACT);
        }
    }
    printf("instruction sets run: portable %d, avx2 %d, avx512 %d\n", ran[1], ran[2], ran[3]);
    CHECK(ran[AKV_ATTN_HOST_PORTABLE]);
}

/* Compact pages (q8, q4) read in place: against the oracle over the same decoded rows, on the
 * shapes each form takes (q4: head dims 32, 64, 128, 256), poisoned past every history. */
static void test_compact_against_f64(void) {
    static const fx_geom geoms[] = {
        {32, 8, 128, 64, AKV_DTYPE_BF16}, /* Llama-3-8B */
        {9, 3, 64, 256, AKV_DTYPE_BF16},  /* SmolLM2-135M */
        {12, 1, 32, 16, AKV_DTYPE_F16},   /* two passes of rows, the narrowest q4 head */
        {2, 1, 256, 8, AKV_DTYPE_F32},    /* the widest head */
        {6, 2, 40, 4, AKV_DTYPE_BF16},    /* q8 only: 40 is not a q4 head */
    };
    int runs = 0;
    for (int i = AKV_ATTN_HOST_PORTABLE; i < AKV_ATTN_HOST_ISAS; i++) {
        const akv_attn_host_isa isa = (akv_attn_host_isa)i;
        if (akv_attn_host_isa_resolve(isa) != isa) continue;
        for (int r = AKV_REPR_Q8; r < AKV_REPR_COUNT; r++)
            for (size_t k = 0; k < sizeof geoms / sizeof *geoms; k++) {
                const uint32_t P = geoms[k].page_tokens;
                const uint32_t lens[] = {1, P + 1, AKV_ATTN_HOST_CHUNK_TOKENS + 3 * P / 2 + 5};
                for (size_t j = 0; j < sizeof lens / sizeof *lens; j++)
                    runs += part_case(geoms[k], lens[j], isa, (akv_repr)r);
            }
    }
    TEST_CHECK_(runs >= 27, "compact cases run: %d", runs); /* 9 shape/form pairs a set */
}

/* A chunk of a range with no page is the empty state; an empty part has no chunk. */
static void test_empty(void) {
    uint16_t page[2 * 2 * 4 * 8] = {0};
    const void *pages[1] = {page};
    float q[4 * 8] = {0}, o[2 * 8], lse[2];
    akv_attn_host_part p = {pages, 1, 4, 2, 8, 4, AKV_DTYPE_BF16, 4, q, 0.0f, 0, 0};
    CHECK_OK(akv_attn_host_part_check(&p));
    memset(o, 0xff, sizeof o);
    akv_attn_host_chunk(&p, AKV_ATTN_HOST_AUTO, 1, 1, 1, o, lse);
    for (int i = 0; i < 16; i++) CHECK(o[i] == 0.0f);
    CHECK(lse[0] == -INFINITY && lse[1] == -INFINITY);
    /* all-zero keys: every weight equal, the output the mean of the values (0), lse log(4) */
    akv_attn_host_chunk(&p, AKV_ATTN_HOST_AUTO, 0, 0, 1, o, lse);
    CHECK_NEAR(lse[0], logf(4.0f), 1e-6);
    p.n_pages = 0;
    CHECK_OK(akv_attn_host_part_check(&p));
    CHECK_EQ_INT(akv_attn_host_chunks(&p), 0);
}

/* Chunks cut the pages into runs of CHUNK_TOKENS / page_tokens (at least 1) that cover them once. */
static void test_chunks(void) {
    static const uint32_t Ps[] = {1, 16, 64, 1000, 1024, 4096};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++)
        for (uint32_t n = 0; n < 70; n += 7) {
            akv_attn_host_part p = {.n_pages = n, .page_tokens = Ps[i]};
            uint32_t run = AKV_ATTN_HOST_CHUNK_TOKENS / Ps[i], next = 0, nc = akv_attn_host_chunks(&p);
            if (!run) run = 1;
            for (uint32_t c = 0; c < nc; c++) {
                uint32_t a, b;
                akv_attn_host_chunk_pages(&p, c, &a, &b);
                TEST_CHECK_(a == next && b > a && b - a <= run, "P %u n %u chunk %u: [%u, %u)", Ps[i], n, c, a, b);
                next = b;
            }
            TEST_CHECK_(next == n, "P %u: chunks cover %u of %u pages", Ps[i], next, n);
        }
}

static void test_check(void) {
    uint16_t page[2 * 2 * 4 * 8] = {0};
    const void *pages[2] = {page, NULL};
    float q[4 * 8] = {0};
    const akv_attn_host_part good = {pages, 1, 4, 2, 8, 4, AKV_DTYPE_BF16, 4, q, 0.0f, 0, 0};
    CHECK_OK(akv_attn_host_part_check(&good));
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    CHECK_STATUS(akv_attn_host_part_check(NULL), AKV_EINVAL);
    akv_attn_host_part b = good;
    b.n_pages = 2; /* the second address NULL */
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.last_len = 0;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.last_len = 5;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.head_dim = 0;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.head_dim = AKV_ATTN_HOST_MAX_HEAD_DIM + 1;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.n_heads = 3;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.n_kv_heads = 0;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.page_tokens = 0;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.dtype = AKV_DTYPE_COUNT;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.q = NULL;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.pages = NULL;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.scale = -1.0f;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.scale = NAN;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.repr = AKV_REPR_COUNT;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.repr = AKV_REPR_Q4; /* head_dim 8: no q4 layout */
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b = good, b.repr = AKV_REPR_Q8;
    CHECK_OK(akv_attn_host_part_check(&b));
    b.last_len = 0; /* a compact part's last_len is checked as an exact one's */
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    b.last_len = 5;
    CHECK_STATUS(akv_attn_host_part_check(&b), AKV_EINVAL);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    CHECK_STR(akv_attn_host_isa_name(AKV_ATTN_HOST_AVX512), "avx512");
    CHECK(akv_attn_host_isa_resolve(AKV_ATTN_HOST_AUTO) != AKV_ATTN_HOST_AUTO);
    CHECK_EQ_INT(akv_attn_host_isa_resolve(AKV_ATTN_HOST_PORTABLE), AKV_ATTN_HOST_PORTABLE);
}

/* A batch of parts over a pool of threads: sequences of several lengths (one empty) in one
 * table, each part its sequence's pages; the states against the float64 oracle, the same bits
 * on the caller alone and on 3 threads, and the same bits as the chunks merged by hand. */
static void test_batch(void) {
    const fx_geom g = {12, 4, 64, 16, AKV_DTYPE_BF16};
    const uint32_t lens[] = {1500, 0, 17, 2 * AKV_ATTN_HOST_CHUNK_TOKENS + 1, 64};
    const uint32_t n = sizeof lens / sizeof *lens, H = g.n_heads, D = g.head_dim;
    fx_table f;
    fx_table_make(&f, g, n, lens, 2, 1, &rng);
    f.past = 1;
    float *q = fx_random(AKV_DTYPE_F32, (size_t)n * H * D, 2.0f, &rng);
    float *o = malloc((size_t)n * H * D * sizeof *o), *lse = malloc((size_t)n * H * sizeof *lse);
    float *o2 = malloc((size_t)n * H * D * sizeof *o2), *lse2 = malloc((size_t)n * H * sizeof *lse2);
    double *o64 = malloc((size_t)n * H * D * sizeof *o64), *lse64 = malloc((size_t)n * H * sizeof *lse64);
    const void **pages = malloc((f.n_pages + 1) * sizeof *pages);
    akv_attn_host_part parts[5];
    for (uint32_t i = 0; i < n; i++) {
        const int32_t a = f.indptr[i], b = f.indptr[i + 1];
        for (int32_t k = a; k < b; k++) pages[k] = f.pool + (size_t)f.indices[k] * f.page_bytes;
        parts[i] = (akv_attn_host_part){pages + a, (uint32_t)(b - a), b > a ? (uint32_t)f.last[i] : 0,
                                        g.n_kv_heads, D, g.page_tokens, g.dtype, H,
                                        q + (size_t)i * H * D, 0.0f, 0, 0};
    }
    akv_attn_decode ref = {.kv = fx_pages(&f), .n_heads = H, .n_query = 1, .q = akv_attn_host_ptr(q),
                           .q_dtype = AKV_DTYPE_F32, .o = akv_attn_host_ptr(o), .o_dtype = AKV_DTYPE_F32};
    CHECK_OK(akv_attn_ref_decode_f64(&ref, o64, lse64));
    float *scratch = malloc(akv__attn_host_scratch_floats(parts, n) * sizeof *scratch + 1);
    CHECK_OK(akv__attn_host_run(parts, n, AKV_ATTN_HOST_AUTO, NULL, scratch, o, lse));
    for (uint32_t i = 0; i < n; i++) { /* the empty sequence's rows: the oracle's are NaN-free */
        if (lens[i]) continue;
        for (uint32_t j = 0; j < H; j++) CHECK(lse[i * H + j] == -INFINITY);
        for (uint32_t j = 0; j < H * D; j++) o64[(size_t)i * H * D + j] = 0.0, lse64[i * H + j % H] = -INFINITY;
    }
    FX_COMPARE("host batch", o, AKV_DTYPE_F32, lse, o64, lse64, (size_t)n * H, D, tol_for(g.dtype), 2e-5);
    akv_par *par = NULL;
    CHECK_OK(akv__par_create(3, &par));
    memset(o2, 0xff, (size_t)n * H * D * sizeof *o2);
    CHECK_OK(akv__attn_host_run(parts, n, AKV_ATTN_HOST_AUTO, par, scratch, o2, lse2));
    CHECK(memcmp(o, o2, (size_t)n * H * D * sizeof *o) == 0 && memcmp(lse, lse2, (size_t)n * H * sizeof *lse) == 0);
    for (uint32_t i = 0; i < n; i++) { /* the chunks merged by hand, part by part */
        run_part(&parts[i], AKV_ATTN_HOST_AUTO, o2, lse2);
        CHECK(memcmp(o + (size_t)i * H * D, o2, (size_t)H * D * sizeof *o) == 0);
        CHECK(memcmp(lse + (size_t)i * H, lse2, H * sizeof *lse) == 0);
    }
    akv_log_set(NULL, NULL, AKV_LOG_OFF);
    parts[2].head_dim = 32; /* a part of another shape */
    CHECK_STATUS(akv__attn_host_run(parts, n, AKV_ATTN_HOST_AUTO, par, scratch, o, lse), AKV_EINVAL);
    parts[2].head_dim = D, parts[2].last_len = 0;
    CHECK_STATUS(akv__attn_host_run(parts, n, AKV_ATTN_HOST_AUTO, par, scratch, o, lse), AKV_EINVAL);
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
    akv__par_destroy(par);
    free(q), free(o), free(lse), free(o2), free(lse2), free(o64), free(lse64), free(pages), free(scratch);
    fx_table_free(&f);
}

/* A sliding window: the part's pages from the window's first page, first_skip of it left out,
 * against a float64 oracle over the visible tokens alone (the fixture's unpaged values). */
static void test_window(void) {
    static const fx_geom geoms[] = {
        {4, 1, 256, 16, AKV_DTYPE_BF16}, /* Gemma 3 270M: one K/V head of 256 */
        {6, 2, 20, 4, AKV_DTYPE_F16},
        {8, 8, 64, 1, AKV_DTYPE_F32},    /* a token a page: the skip is never inside one */
    };
    for (int i = AKV_ATTN_HOST_PORTABLE; i < AKV_ATTN_HOST_ISAS; i++) {
        const akv_attn_host_isa isa = (akv_attn_host_isa)i;
        if (akv_attn_host_isa_resolve(isa) != isa) continue;
        for (size_t k = 0; k < sizeof geoms / sizeof *geoms; k++) {
            const fx_geom g = geoms[k];
            const uint32_t P = g.page_tokens, len = 3 * P + 5 + (uint32_t)test_rand_below(&rng, 2 * P);
            fx_table f;
            fx_table_make(&f, g, 1, &len, 3, 1, &rng);
            const uint32_t G = g.n_heads / g.n_kv_heads, D = g.head_dim;
            float *q = fx_random(AKV_DTYPE_F32, (size_t)g.n_heads * D, 2.0f, &rng);
            float *o = malloc((size_t)g.n_heads * D * sizeof *o), *lse = malloc(g.n_heads * sizeof *lse);
            double *o64 = malloc((size_t)g.n_heads * D * sizeof *o64), *lse64 = malloc(g.n_heads * sizeof *lse64);
            const void **pages = malloc((f.n_pages + 1) * sizeof *pages);
            const uint32_t windows[] = {1, 2, P, P + 1, 2 * P + 3, len - 1, len};
            for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
                const uint32_t first = len - windows[w];
                akv_attn_host_part p = part_of(&f, pages, q);
                p.pages += first / P, p.n_pages -= first / P, p.first_skip = first % P;
                CHECK_OK(akv_attn_host_part_check(&p));
                run_part(&p, isa, o, lse);
                const float *kd = f.dense + f.dense_off[0];
                for (uint32_t h = 0; h < g.n_heads; h++) {
                    const uint32_t kvh = h / G;
                    const float *K = kd + (size_t)kvh * len * D, *V = kd + ((size_t)g.n_kv_heads + kvh) * len * D;
                    double m = -INFINITY, l = 0, acc[256] = {0};
                    for (uint32_t t = first; t < len; t++) {
                        double dot = 0;
                        for (uint32_t e = 0; e < D; e++) dot += (double)q[(size_t)h * D + e] * K[(size_t)t * D + e];
                        dot /= sqrt((double)D);
                        const double mn = dot > m ? dot : m, a = exp(m - mn), b = exp(dot - mn);
                        for (uint32_t e = 0; e < D; e++) acc[e] = acc[e] * a + b * V[(size_t)t * D + e];
                        l = l * a + b, m = mn;
                    }
                    for (uint32_t e = 0; e < D; e++) o64[(size_t)h * D + e] = acc[e] / l;
                    lse64[h] = m + log(l);
                }
                char what[128];
                snprintf(what, sizeof what, "window of %u of %u tokens, d%u P%u, %s", windows[w], len, D, P,
                         akv_attn_host_isa_name(isa));
                FX_COMPARE(what, o, AKV_DTYPE_F32, lse, o64, lse64, g.n_heads, D, tol_for(g.dtype), 2e-5);
            }
            /* a skip that leaves the first page nothing is refused */
            akv_attn_host_part p = part_of(&f, pages, q);
            akv_log_set(NULL, NULL, AKV_LOG_OFF);
            p.first_skip = P;
            CHECK_STATUS(akv_attn_host_part_check(&p), AKV_EINVAL);
            akv_log_set(NULL, NULL, AKV_LOG_WARN);
            free(q), free(o), free(lse), free(o64), free(lse64), free(pages);
            fx_table_free(&f);
        }
    }
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    rng = test_seed(0x5eedbeef);
    TEST_CASE(chunks_merged_against_the_float64_oracle) test_against_f64();
    TEST_CASE(compact_pages_against_the_float64_oracle) test_compact_against_f64();
    TEST_CASE(a_batch_over_threads) test_batch();
    TEST_CASE(empty_ranges_and_parts) test_empty();
    TEST_CASE(chunks_cover_the_pages_once) test_chunks();
    TEST_CASE(refusals) test_check();
    TEST_CASE(a_sliding_window_against_the_float64_oracle) test_window();
    return test_finish();
}
