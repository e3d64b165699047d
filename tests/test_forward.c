/* test_forward.c — the host forward pass on tiny synthetic models against the float64 oracle:
 * prefill in chunks, decode steps, pages scattered through a pool, f32 and bf16 K/V, both
 * RoPE layouts, QKV bias, tied output, Llama 3 factors; bad input refused. */
#include "model_build.h"
#include "model_ref64.h"

#include "akv/forward.h"
#include "core/alloc.h"

/* A test K/V placement: every layer's pages at scattered ids of one pool. */
typedef struct test_kv {
    const akv_model_config *cfg;
    uint32_t P, max_pages;
    akv_dtype dtype;
    size_t page_bytes;
    uint8_t *pool;
    uint32_t n_pages;
    int32_t *ids;      /* [n_layers][max_pages] page ids, a permutation of the pool */
    uint32_t n_tokens; /* the table's length for the next run (pos0 + n) */
    int32_t indptr[2], last;
    int fail_layer; /* begin_layer of this layer fails (-1 = none) */
    int n_end;      /* end_layer calls */
    int bad_length; /* report one token more than the run has */
} test_kv;

static akv_status tkv_begin(void *user, uint32_t layer, akv_kv_parts *parts) {
    test_kv *kv = user;
    parts->n_parts = 1;
    akv_attn_pages *pg = &parts->part[0].kv;
    if ((int)layer == kv->fail_layer) return AKV_EBUSY;
    uint32_t len = kv->n_tokens + (uint32_t)kv->bad_length;
    uint32_t np = (len + kv->P - 1) / kv->P;
    kv->indptr[0] = 0, kv->indptr[1] = (int32_t)np;
    kv->last = (int32_t)(len - (np - 1) * kv->P);
    *pg = (akv_attn_pages){.pool = akv_attn_host_ptr(kv->pool),
                           .indptr = akv_attn_host_ptr(kv->indptr),
                           .indices = akv_attn_host_ptr(kv->ids + (size_t)layer * kv->max_pages),
                           .last_page_len = akv_attn_host_ptr(&kv->last),
                           .n_seq = 1,
                           .n_pages = kv->n_pages,
                           .max_pages = kv->max_pages,
                           .n_kv_heads = kv->cfg->n_kv_heads,
                           .head_dim = kv->cfg->head_dim,
                           .page_tokens = kv->P,
                           .dtype = kv->dtype};
    return AKV_OK;
}

static akv_status tkv_end(void *user, uint32_t layer) {
    (void)layer;
    ((test_kv *)user)->n_end++;
    return AKV_OK;
}

static void tkv_init(test_kv *kv, const akv_model_config *c, uint32_t P, uint32_t max_tokens,
                     akv_dtype dtype, uint64_t *rng) {
    memset(kv, 0, sizeof *kv);
    kv->cfg = c, kv->P = P, kv->dtype = dtype, kv->fail_layer = -1;
    kv->max_pages = (max_tokens + P - 1) / P;
    kv->n_pages = kv->max_pages * c->n_layers + 3; /* a few pages nobody uses */
    kv->page_bytes = 2 * (size_t)c->n_kv_heads * P * c->head_dim * akv_dtype_size(dtype);
    kv->pool = akv__malloc(kv->page_bytes * kv->n_pages);
    memset(kv->pool, 0xff, kv->page_bytes * kv->n_pages); /* NaN in f32 and bf16 */
    int32_t *perm = akv__malloc(kv->n_pages * sizeof *perm);
    for (uint32_t i = 0; i < kv->n_pages; i++)
        perm[i] = (int32_t)i;
    for (uint32_t i = kv->n_pages - 1; i > 0; i--) {
        uint32_t j = (uint32_t)test_rand_below(rng, i + 1);
        int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    kv->ids = perm;
}

static void tkv_free(test_kv *kv) {
    akv__free(kv->pool);
    akv__free(kv->ids);
}

/* Compares f32 logits with the oracle's: |got - want| <= tol * (1 + max |want|). */
static int close_to_ref(const float *got, const double *want, size_t n, double tol) {
    double scale = 1, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double e = isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]);
        if (e > worst) worst = e, at = i;
    }
    int ok = worst <= tol * scale;
    TEST_CHECK_(ok, "logits off by %.3g at [%zu] (got %.6f want %.6f; tolerance %.3g)", worst, at,
                (double)got[at], want[at], tol * scale);
    return ok;
}

/* Prefill `n_prompt` tokens in chunks of max_step_tokens, then n_decode greedy-free steps (the
 * next token is drawn at random), checking every step's logits against the oracle. */
static void run_and_check(const akv_model *model, uint32_t P, akv_dtype dtype, uint32_t max_step_tokens,
                          uint32_t n_prompt, uint32_t n_decode, double tol, uint64_t *rng) {
    const akv_model_config *c = akv_model_get_config(model);
    uint32_t n_total = n_prompt + n_decode;
    test_kv kv;
    tkv_init(&kv, c, P, n_total, dtype, rng);
    akv_forward_params fp = {.max_step_tokens = max_step_tokens};
    akv_forward *f = NULL;
    CHECK_OK(akv_forward_create(model, &fp, &f));
    int32_t *tokens = akv__malloc(n_total * sizeof *tokens);
    for (uint32_t i = 0; i < n_total; i++)
        tokens[i] = (int32_t)test_rand_below(rng, c->n_vocab);
    float *logits = akv__malloc(c->n_vocab * sizeof *logits);
    double *want = akv__malloc(c->n_vocab * sizeof *want);
    akv_kv_hooks hooks = {.user = &kv, .begin_layer = tkv_begin, .end_layer = tkv_end};
    uint32_t pos = 0;
    while (f && pos < n_total) {
        uint32_t n = pos < n_prompt ? n_prompt - pos : 1;
        if (n > max_step_tokens) n = max_step_tokens;
        kv.n_tokens = pos + n;
        bool last_of_prefill = pos + n >= n_prompt;
        akv_status st = akv_forward_run(f, tokens + pos, n, pos, &hooks,
                                        last_of_prefill ? logits : NULL, false);
        CHECK_OK(st);
        if (st) break;
        pos += n;
        if (!last_of_prefill) continue;
        ref64_forward(model, tokens, pos, c->n_layers, NULL, want);
        if (!close_to_ref(logits, want, c->n_vocab, tol)) {
            printf("  after %u tokens (P %u, %s pages, chunks of %u)\n", pos, P,
                   akv_dtype_name(dtype), max_step_tokens);
            break;
        }
    }
    CHECK_EQ_INT(kv.n_end,
                 (int)(c->n_layers * ((n_prompt + max_step_tokens - 1) / max_step_tokens + n_decode)));
    akv_forward_destroy(f);
    akv__free(tokens), akv__free(logits), akv__free(want);
    tkv_free(&kv);
}

/* The logits of every position of tokens[0..n) fed in chunks of `chunk` tokens (each chunk's
 * rows all wanted), over pages placed at random (a new table each call). */
static void logits_in_chunks(const akv_model *model, uint32_t P, uint32_t chunk,
                             const int32_t *tokens, uint32_t n, float *out, uint64_t *rng) {
    const akv_model_config *c = akv_model_get_config(model);
    test_kv kv;
    tkv_init(&kv, c, P, n, AKV_DTYPE_BF16, rng);
    akv_forward_params fp = {.max_step_tokens = n};
    akv_forward *f = NULL;
    CHECK_OK(akv_forward_create(model, &fp, &f));
    akv_kv_hooks hooks = {.user = &kv, .begin_layer = tkv_begin, .end_layer = tkv_end};
    for (uint32_t pos = 0; f && pos < n;) {
        const uint32_t k = n - pos < chunk ? n - pos : chunk;
        kv.n_tokens = pos + k;
        if (!CHECK(akv_forward_run(f, tokens + pos, k, pos, &hooks, out + (size_t)pos * c->n_vocab,
                                   true) == AKV_OK))
            break;
        pos += k;
    }
    akv_forward_destroy(f);
    tkv_free(&kv);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(11);
    const tm_shape llama = {.arch = "llama",
                            .n_layers = 2,
                            .n_embd = 32,
                            .n_ff = 48,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .n_vocab = 19};
    akv_model *m_llama = tm_load(&llama, rng);
    tm_shape qs = llama;
    qs.arch = "qwen2", qs.tied = true, qs.rope_factors = true, qs.n_heads = 8, qs.n_kv_heads = 2;
    qs.n_embd = 64;
    akv_model *m_qwen = tm_load(&qs, rng + 1);
    tm_shape q3 = llama;
    q3.arch = "qwen3", q3.head_dim = 16, q3.n_heads = 4, q3.n_kv_heads = 1;
    akv_model *m_qwen3 = tm_load(&q3, rng + 2);
    /* gemma3: head norms, post-norms, GeGLU, a scaled embedding; a window of 5 tokens on the
     * even layers (pattern 2) with their own RoPE base */
    tm_shape g3 = llama;
    g3.arch = "gemma3", g3.n_layers = 3, g3.head_dim = 16, g3.n_heads = 4, g3.n_kv_heads = 1;
    tm_model gm;
    tm_init(&gm, &g3, rng + 3);
    tm_u32(&gm, "attention.sliding_window", 5);
    tm_u32(&gm, "attention.sliding_window_pattern", 2);
    tm_f32(&gm, "rope.freq_base_swa", 100.0f);
    akv_model *m_gemma3 = tm_write_load(&gm);
    if (!CHECK(m_llama && m_qwen && m_qwen3 && m_gemma3)) return test_finish();

    TEST_CASE(llama_f32_pages_chunks_and_decode) {
        /* prompt lengths around the page: 1, P-1, P, P+1, 3P+5 */
        const uint32_t P = 8, lens[] = {1, 7, 8, 9, 29};
        for (size_t i = 0; i < AKV_ARRAY_LEN(lens); i++)
            run_and_check(m_llama, P, AKV_DTYPE_F32, 8, lens[i], 4, 2e-5, &rng);
        run_and_check(m_llama, 4, AKV_DTYPE_F32, 3, 13, 6, 2e-5, &rng);
    }

    TEST_CASE(a_row_is_the_same_bits_in_any_chunk) {
        /* The host pass's promise (docs/engine.md, "Determinism"): a position's logits do not
         * depend on the chunk it was computed in. 45 tokens over pages of 8 (bf16), fed at
         * once, one at a time (decode rows) and in chunks of 7, each over its own random page
         * placement: every position's logits bit for bit. */
        const akv_model_config *c = akv_model_get_config(m_llama);
        enum { N = 45 };
        int32_t tok[N];
        for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)test_rand_below(&rng, c->n_vocab);
        float *l[3];
        const uint32_t chunks[3] = {N, 1, 7};
        for (int i = 0; i < 3; i++) {
            l[i] = akv__malloc((size_t)N * c->n_vocab * sizeof *l[i]);
            if (l[i]) logits_in_chunks(m_llama, 8, chunks[i], tok, N, l[i], &rng);
        }
        if (CHECK(l[0] && l[1] && l[2])) {
            for (int i = 1; i < 3; i++) {
                uint32_t pos = 0;
                while (pos < N && !memcmp(l[0] + (size_t)pos * c->n_vocab, l[i] + (size_t)pos * c->n_vocab,
                                          c->n_vocab * sizeof *l[i]))
                    pos++;
                TEST_CHECK_(pos == N, "position %u: chunks of %u differ from one chunk", pos, chunks[i]);
            }
        }
        for (int i = 0; i < 3; i++) akv__free(l[i]);
    }

    TEST_CASE(qwen2_bias_neox_tied_factors) {
        run_and_check(m_qwen, 8, AKV_DTYPE_F32, 5, 19, 5, 2e-5, &rng);
        run_and_check(m_qwen, 16, AKV_DTYPE_F32, 64, 40, 2, 2e-5, &rng);
    }

    TEST_CASE(qwen3_head_norms_against_the_reference) {
        /* Q and K heads RMS-normalised before RoPE, a head dimension apart from n_embd /
         * n_heads (16 x 4 = 64 against 32), one K/V head */
        run_and_check(m_qwen3, 8, AKV_DTYPE_F32, 5, 19, 5, 2e-5, &rng);
        run_and_check(m_qwen3, 16, AKV_DTYPE_F32, 64, 40, 2, 2e-5, &rng);
    }

    TEST_CASE(gemma3_windowed_layers_against_the_reference) {
        const akv_model_config *c = akv_model_get_config(m_gemma3);
        CHECK(c->n_swa == 5 && akv_model_layer_is_swa(c, 0) && !akv_model_layer_is_swa(c, 1) &&
              akv_model_layer_is_swa(c, 2) && c->embd_scale > 5.6f && c->ffn_act == AKV_FFN_GEGLU);
        /* histories past the window, in chunks that straddle it and one token at a time */
        run_and_check(m_gemma3, 4, AKV_DTYPE_F32, 3, 19, 5, 2e-5, &rng);
        run_and_check(m_gemma3, 8, AKV_DTYPE_F32, 64, 23, 2, 2e-5, &rng);
        /* a row's bits do not depend on its chunk, windows included */
        enum { N = 29 };
        int32_t tok[N];
        for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)test_rand_below(&rng, c->n_vocab);
        float *a = akv__malloc((size_t)N * c->n_vocab * sizeof *a), *b = akv__malloc((size_t)N * c->n_vocab * sizeof *b);
        if (CHECK(a && b)) {
            logits_in_chunks(m_gemma3, 4, N, tok, N, a, &rng);
            logits_in_chunks(m_gemma3, 4, 3, tok, N, b, &rng);
            CHECK(!memcmp(a, b, (size_t)N * c->n_vocab * sizeof *a));
        }
        akv__free(a), akv__free(b);
    }

    TEST_CASE(bf16_pages_within_bf16_error) {
        /* K/V rounded to bf16 (8 significant bits): the logits move by a few 1e-3. */
        run_and_check(m_llama, 8, AKV_DTYPE_BF16, 8, 21, 4, 3e-2, &rng);
        run_and_check(m_qwen, 8, AKV_DTYPE_BF16, 8, 21, 4, 3e-2, &rng);
    }

    TEST_CASE(all_logits_and_hidden_of_first_layer) {
        const akv_model_config *c = akv_model_get_config(m_llama);
        const uint32_t n = 6;
        test_kv kv;
        tkv_init(&kv, c, 4, n, AKV_DTYPE_F32, &rng);
        int32_t tokens[6] = {3, 18, 0, 7, 7, 11};
        float logits[6 * 19];
        double want[19];
        akv_forward *f = NULL;
        akv_kv_hooks hooks = {.user = &kv, .begin_layer = tkv_begin};
        CHECK_OK(akv_forward_create(m_llama, NULL, &f));
        kv.n_tokens = n;
        CHECK_OK(akv_forward_run(f, tokens, n, 0, &hooks, logits, true));
        for (uint32_t t = 0; t < n; t++) {
            ref64_forward(m_llama, tokens, t + 1, c->n_layers, NULL, want);
            close_to_ref(logits + t * 19, want, 19, 2e-5);
        }
        akv_forward_destroy(f);

        /* one layer only: the residual stream after it */
        akv_forward_params fp = {.max_step_tokens = 8, .n_layers = 1};
        CHECK_OK(akv_forward_create(m_llama, &fp, &f));
        CHECK_OK(akv_forward_run(f, tokens, n, 0, &hooks, NULL, false));
        double hid[6 * 32];
        ref64_forward(m_llama, tokens, n, 1, hid, NULL);
        float hid_f[6 * 32];
        for (size_t i = 0; i < 6 * 32; i++)
            hid_f[i] = (float)hid[i];
        CHECK_CLOSE_F32(akv_forward_hidden(f), hid_f, 6 * 32, 1e-5, 1e-5);
        akv_forward_destroy(f);
        tkv_free(&kv);
    }

    TEST_CASE(bad_input_refused) {
        const akv_model_config *c = akv_model_get_config(m_llama);
        test_kv kv;
        tkv_init(&kv, c, 4, 16, AKV_DTYPE_F32, &rng);
        akv_forward_params fp = {.max_step_tokens = 4};
        akv_forward *f = NULL;
        CHECK_OK(akv_forward_create(m_llama, &fp, &f));
        akv_kv_hooks hooks = {.user = &kv, .begin_layer = tkv_begin, .end_layer = tkv_end};
        int32_t tokens[5] = {1, 2, 3, 4, 5}, bad[2] = {1, 19};
        float logits[19];
        kv.n_tokens = 2;
        CHECK_STATUS(akv_forward_run(f, bad, 2, 0, &hooks, logits, false), AKV_EINVAL);
        CHECK_STATUS(akv_forward_run(f, tokens, 0, 0, &hooks, logits, false), AKV_EINVAL);
        kv.n_tokens = 5;
        CHECK_STATUS(akv_forward_run(f, tokens, 5, 0, &hooks, logits, false), AKV_EINVAL);
        kv.n_tokens = 2, kv.bad_length = 1; /* the table does not match pos0 + n */
        CHECK_STATUS(akv_forward_run(f, tokens, 2, 0, &hooks, logits, false), AKV_EINVAL);
        kv.bad_length = 0, kv.fail_layer = 1, kv.n_end = 0; /* a hook's error stops the pass */
        CHECK_STATUS(akv_forward_run(f, tokens, 2, 0, &hooks, logits, false), AKV_EBUSY);
        CHECK_EQ_INT(kv.n_end, 1);
        akv_forward_params too_deep = {.n_layers = 3};
        akv_forward *g = NULL;
        CHECK_STATUS(akv_forward_create(m_llama, &too_deep, &g), AKV_EINVAL);
        akv_forward_destroy(f);
        tkv_free(&kv);
    }

    akv_model_destroy(m_llama);
    akv_model_destroy(m_qwen);
    akv_model_destroy(m_qwen3);
    akv_model_destroy(m_gemma3);
    CHECK_EQ_INT(akv__alloc_live(), 0);
    return test_finish();
}
