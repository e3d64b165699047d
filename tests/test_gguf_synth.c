/* test_gguf_synth.c — synthetic models: every writable type reads back with the llama keys,
 * the tensor list of akv/gguf_synth.h and exactly the bytes the weight stream encodes to;
 * tied embeddings; the tokenizer copied from another file; bad shapes refused; presets. */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <unistd.h>

#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/gguf_synth.h"
#include "akv/model.h"
#include "akv/gguf_writer.h"
#include "akv/log.h"
#include "gguf/gguf_impl.h"
#include "gguf_build.h"

static void silence(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static akv_gguf_synth_shape tiny(void) {
    /* token_embd is 64 x 20000 = 1.28M elements: written in more than one piece. */
    return (akv_gguf_synth_shape){.name = "tiny", .n_layers = 2, .n_embd = 64, .n_heads = 4,
                                  .n_kv_heads = 2, .head_dim = 16, .n_ff = 96, .n_vocab = 20000,
                                  .n_ctx = 128, .rope_theta = 10000.0f, .rms_eps = 1e-6f};
}

static uint32_t get_u32(const akv_gguf *g, const char *key) {
    uint32_t v = 0;
    CHECK_OK(akv_gguf_get_u32(g, key, &v));
    return v;
}

/* Every tensor's bytes equal the weight stream encoded as its type. */
static void check_tensors(const akv_gguf *g, const akv_gguf_synth_shape *s, akv_gguf_type type,
                          uint64_t seed) {
    const size_t per = s->qk_norm ? 11 : 9, n_want = 2 + per * (size_t)s->n_layers + (s->tied ? 0 : 1);
    CHECK_EQ_U64(akv_gguf_n_tensors(g), n_want);
    static const char *const layer_names[11] = {"attn_norm", "attn_q", "attn_k", "attn_v",
                                                "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                                                "ffn_down", "attn_q_norm", "attn_k_norm"};
    for (size_t k = 0; k < akv_gguf_n_tensors(g) && k < n_want; k++) {
        const akv_gguf_tensor *t = akv_gguf_tensor_at(g, k);
        char want[80];
        if (k == 0) snprintf(want, sizeof want, "token_embd.weight");
        else if (k == n_want - (s->tied ? 1 : 2)) snprintf(want, sizeof want, "output_norm.weight");
        else if (k == n_want - 1 && !s->tied) snprintf(want, sizeof want, "output.weight");
        else snprintf(want, sizeof want, "blk.%zu.%s.weight", (k - 1) / per, layer_names[(k - 1) % per]);
        CHECK_STR(t->name, want);
        bool norm = strstr(t->name, "norm") != NULL;
        CHECK_EQ_INT(t->type, norm ? AKV_GGUF_TYPE_F32 : type);
        CHECK_EQ_INT(t->n_dims, norm ? 1 : 2);
        float *vals = malloc(t->n_elems * sizeof *vals);
        uint8_t *bytes = malloc(t->n_bytes ? t->n_bytes : 1);
        akv__gguf_synth_values(seed, k, norm, 0, vals, t->n_elems);
        CHECK_OK(akv_gguf_quantize(t->type, vals, t->n_elems, bytes));
        TEST_CHECK_(test_check_bytes(__FILE__, __LINE__, t->name, t->data, bytes, t->n_bytes),
                    "tensor %s differs from the weight stream", t->name);
        free(vals);
        free(bytes);
    }
    /* Extents of the three kinds of projection (ggml order: input first). */
    const struct {
        const char *name;
        uint64_t ne0, ne1;
    } shapes[] = {
        {"blk.1.attn_k.weight", s->n_embd, (uint64_t)s->n_kv_heads * s->head_dim},
        {"blk.0.attn_output.weight", (uint64_t)s->n_heads * s->head_dim, s->n_embd},
        {"blk.1.ffn_down.weight", s->n_ff, s->n_embd},
        {"token_embd.weight", s->n_embd, s->n_vocab},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const akv_gguf_tensor *t = NULL;
        CHECK_OK(akv_gguf_find_tensor(g, shapes[i].name, &t));
        if (!t) continue;
        CHECK_EQ_U64(t->ne[0], shapes[i].ne0);
        CHECK_EQ_U64(t->ne[1], shapes[i].ne1);
    }
}

static void check_keys(const akv_gguf *g, const akv_gguf_synth_shape *s) {
    const char *a = s->qk_norm ? "qwen3" : "llama";
    akv_gguf_str arch = {0};
    CHECK_OK(akv_gguf_get_str(g, "general.architecture", &arch));
    CHECK(arch.len == 5 && !memcmp(arch.ptr, a, 5));
    char key[80];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    CHECK_EQ_INT(get_u32(g, K("block_count")), s->n_layers);
    CHECK_EQ_INT(get_u32(g, K("embedding_length")), s->n_embd);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count")), s->n_heads);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count_kv")), s->n_kv_heads);
    CHECK_EQ_INT(get_u32(g, K("attention.key_length")), s->head_dim);
    CHECK_EQ_INT(get_u32(g, K("rope.dimension_count")), s->head_dim);
    CHECK_EQ_INT(get_u32(g, K("feed_forward_length")), s->n_ff);
    CHECK_EQ_INT(get_u32(g, K("vocab_size")), s->n_vocab);
    CHECK_EQ_INT(get_u32(g, K("context_length")), s->n_ctx);
    float f = 0;
    CHECK_OK(akv_gguf_get_f32(g, K("rope.freq_base"), &f));
    CHECK_NEAR(f, s->rope_theta, 0);
    CHECK_OK(akv_gguf_get_f32(g, K("attention.layer_norm_rms_epsilon"), &f));
    CHECK_NEAR(f, s->rms_eps, 0);
#undef K
}

static akv_status synth(const akv_gguf_synth_shape *s, akv_gguf_type type, uint64_t seed,
                        const akv_gguf *vocab, const char *path) {
    akv_gguf_synth_params p = {.shape = *s, .type = type, .seed = seed, .vocab_from = vocab};
    return akv_gguf_synth_write(&p, path);
}

/* A small GGUF holding only a tokenizer: 3 tokens, 1 merge, a model name. */
static void build_vocab_image(gb *b) {
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0);
    gb_u64(b, 4);
    gb_str(b, "general.architecture"), gb_u32(b, 8), gb_str(b, "llama");
    gb_str(b, "tokenizer.ggml.model"), gb_u32(b, 8), gb_str(b, "gpt2");
    gb_str(b, "tokenizer.ggml.tokens"), gb_u32(b, 9), gb_u32(b, 8), gb_u64(b, 3);
    gb_str(b, "a"), gb_str(b, "b"), gb_str(b, "ab");
    gb_str(b, "tokenizer.ggml.merges"), gb_u32(b, 9), gb_u32(b, 8), gb_u64(b, 1);
    gb_str(b, "a b");
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    char dir[] = "/tmp/akv_test_gguf_synth_XXXXXX";
    if (!mkdtemp(dir)) test_skip("cannot create a temporary directory");
    char path[128], path2[128];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(path2, sizeof path2, "%s/m2.gguf", dir);

    TEST_CASE(every_type_reads_back_exactly) {
        const akv_gguf_type types[] = {AKV_GGUF_TYPE_BF16, AKV_GGUF_TYPE_F16, AKV_GGUF_TYPE_F32,
                                       AKV_GGUF_TYPE_Q8_0, AKV_GGUF_TYPE_Q4_0, AKV_GGUF_TYPE_Q4_1};
        akv_gguf_synth_shape s = tiny();
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            s.tied = i % 2 == 1;
            CHECK_OK(synth(&s, types[i], 42 + i, NULL, path));
            akv_gguf *g = NULL;
            CHECK_OK(akv_gguf_open(path, &g));
            if (!g) continue;
            CHECK(akv__gguf_check(g));
            check_keys(g, &s);
            check_tensors(g, &s, types[i], 42 + i);
            akv_gguf_str model = {0};
            CHECK_OK(akv_gguf_get_str(g, "tokenizer.ggml.model", &model));
            CHECK(model.len == 4 && !memcmp(model.ptr, "none", 4));
            uint32_t ft = get_u32(g, "general.file_type");
            size_t idx;
            bool quantised = akv_gguf_type_block_elems(types[i]) > 1;
            CHECK_EQ_INT(akv_gguf_find_kv(g, "general.quantization_version", &idx) == AKV_OK,
                         quantised);
            CHECK_EQ_INT(ft, types[i] == AKV_GGUF_TYPE_BF16 ? 32u
                             : types[i] == AKV_GGUF_TYPE_Q8_0 ? 7u
                                                              : (uint32_t)types[i]);
            akv_gguf_close(g);
        }
    }

    TEST_CASE(qwen3_files_with_head_norms_load_as_models) {
        /* the qwen3 variant: its keys, its two head norms a layer after the nine (the llama
         * tensors keep their stream positions within a layer), and the model loader takes it
         * as qwen3 with its norms; a head dimension apart from hidden / heads */
        akv_gguf_synth_shape s = tiny();
        s.qk_norm = true, s.head_dim = 32;
        CHECK_OK(synth(&s, AKV_GGUF_TYPE_BF16, 7, NULL, path));
        akv_gguf *g = NULL;
        CHECK_OK(akv_gguf_open(path, &g));
        if (g) {
            check_keys(g, &s);
            check_tensors(g, &s, AKV_GGUF_TYPE_BF16, 7);
            const akv_gguf_tensor *t = NULL;
            CHECK_OK(akv_gguf_find_tensor(g, "blk.1.attn_k_norm.weight", &t));
            if (t) CHECK_EQ_U64(t->ne[0], 32);
            akv_gguf_close(g);
        }
        akv_model *m = NULL;
        CHECK_OK(akv_model_load(path, NULL, &m));
        if (m) {
            const akv_model_config *c = akv_model_get_config(m);
            CHECK(c->arch == AKV_MODEL_ARCH_QWEN3 && c->has_qk_norm && c->head_dim == 32);
            CHECK(akv_model_get_layer(m, 1)->k_norm != NULL);
            akv_model_destroy(m);
        }
    }

    TEST_CASE(k_types_read_back_exactly) {
        /* rows of 256 and 512 (the K types' super-blocks are 256 elements) */
        akv_gguf_synth_shape s = {.name = "k",
                                  .n_layers = 2,
                                  .n_embd = 256,
                                  .n_heads = 4,
                                  .n_kv_heads = 2,
                                  .head_dim = 64,
                                  .n_ff = 512,
                                  .n_vocab = 300,
                                  .n_ctx = 128,
                                  .rope_theta = 10000.0f,
                                  .rms_eps = 1e-6f};
        const struct {
            akv_gguf_type t;
            uint32_t file_type;
        } types[] = {{AKV_GGUF_TYPE_Q4_K, 14}, {AKV_GGUF_TYPE_Q5_K, 16}, {AKV_GGUF_TYPE_Q6_K, 18}};
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            CHECK_OK(synth(&s, types[i].t, 7 + i, NULL, path));
            akv_gguf *g = NULL;
            CHECK_OK(akv_gguf_open(path, &g));
            if (!g) continue;
            CHECK(akv__gguf_check(g));
            check_keys(g, &s);
            check_tensors(g, &s, types[i].t, 7 + i);
            CHECK_EQ_INT(get_u32(g, "general.file_type"), types[i].file_type);
            akv_gguf_close(g);
        }
    }

    TEST_CASE(deterministic_by_seed) {
        akv_gguf_synth_shape s = tiny();
        s.n_vocab = 64;
        uint8_t a[1 << 16], b[1 << 16];
        size_t na = 0, nb = 0;
        for (int run = 0; run < 3; run++) {
            CHECK_OK(synth(&s, AKV_GGUF_TYPE_Q8_0, run == 2 ? 8 : 7, NULL, run ? path2 : path));
            FILE *f = fopen(run ? path2 : path, "rb");
            size_t n = f ? fread(run ? b : a, 1, sizeof a, f) : 0;
            if (f) fclose(f);
            if (run == 0) na = n;
            else nb = n;
            if (run == 1) CHECK(na == nb && na > 0 && !memcmp(a, b, na));
        }
        CHECK(na == nb && memcmp(a, b, na) != 0); /* seed 8 differs from seed 7 */
        unlink(path2);
    }

    TEST_CASE(vocabulary_from_another_file) {
        gb v = {0};
        build_vocab_image(&v);
        akv_gguf *vocab = NULL;
        CHECK_OK(akv_gguf_open_memory(v.p, v.n, &vocab));
        akv_gguf_synth_shape s = tiny();
        CHECK_OK(synth(&s, AKV_GGUF_TYPE_BF16, 3, vocab, path));
        akv_gguf *g = NULL;
        CHECK_OK(akv_gguf_open(path, &g));
        if (g) {
            s.n_vocab = 3;
            check_keys(g, &s);
            check_tensors(g, &s, AKV_GGUF_TYPE_BF16, 3);
            /* Every tokenizer kv is there, byte for byte; nothing else was copied. */
            for (size_t i = 0; i < akv_gguf_n_kv(vocab); i++) {
                const char *key = akv_gguf_kv_key(vocab, i);
                size_t j;
                bool is_tok = !strncmp(key, "tokenizer.", 10);
                if (!is_tok) continue;
                if (!CHECK(akv_gguf_find_kv(g, key, &j) == AKV_OK)) continue;
                const uint8_t *p1, *p2;
                size_t n1, n2;
                akv__gguf_kv_span(vocab, i, &p1, &n1);
                akv__gguf_kv_span(g, j, &p2, &n2);
                CHECK(n1 == n2 && !memcmp(p1, p2, n1));
            }
            akv_gguf_close(g);
        }
        akv_gguf_close(vocab);
        gb_free(&v);
        /* A file without a token list cannot lend its vocabulary. */
        gguf_sample_pos pos;
        gguf_sample(&v, 3, 0, &pos);
        CHECK_OK(akv_gguf_open_memory(v.p, v.n, &vocab));
        akv_log_set(silence, NULL, AKV_LOG_DEBUG);
        CHECK_STATUS(synth(&s, AKV_GGUF_TYPE_BF16, 3, vocab, path2), AKV_EFORMAT);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
        CHECK(access(path2, F_OK) != 0);
        akv_gguf_close(vocab);
        gb_free(&v);
    }

    TEST_CASE(bad_shapes_are_refused) {
        akv_log_set(silence, NULL, AKV_LOG_DEBUG);
        akv_gguf_synth_shape s = tiny(), b;
        b = s, b.n_layers = 0;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.n_kv_heads = 3;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.head_dim = 15;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.n_ff = 100; /* not a multiple of 32 */
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_Q8_0), AKV_EINVAL);
        CHECK_OK(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16));
        b = s, b.rms_eps = 0;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        /* what the loader would refuse is not written either */
        b = s, b.rms_eps = 2;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.rope_theta = 1;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.rope_theta = INFINITY;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        b = s, b.n_layers = 4097;
        CHECK_STATUS(akv_gguf_synth_check(&b, AKV_GGUF_TYPE_BF16), AKV_EINVAL);
        /* a type with no encoder; K types over rows that are no multiple of 256 (hidden 64) */
        CHECK_STATUS(akv_gguf_synth_check(&s, AKV_GGUF_TYPE_Q3_K), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_synth_check(&s, AKV_GGUF_TYPE_Q4_K), AKV_EINVAL);
        CHECK_STATUS(synth(&s, AKV_GGUF_TYPE_Q6_K, 1, NULL, path2), AKV_EINVAL);
        CHECK(access(path2, F_OK) != 0);
        akv_log_set(NULL, NULL, AKV_LOG_WARN);
    }

    TEST_CASE(presets) {
        akv_gguf_synth_shape s;
        CHECK_OK(akv_gguf_synth_find_preset("llama3-8b", &s));
        CHECK_EQ_INT(s.n_layers, 32);
        CHECK_EQ_INT(s.n_kv_heads, 8);
        CHECK_STATUS(akv_gguf_synth_find_preset("llama9-1t", &s), AKV_ENOTFOUND);
        for (size_t i = 0; i < akv_gguf_synth_n_presets(); i++) {
            const akv_gguf_synth_shape *p = akv_gguf_synth_preset(i);
            CHECK_OK(akv_gguf_synth_check(p, AKV_GGUF_TYPE_Q4_0));
        }
    }

    TEST_CASE(layer_slice_is_a_complete_smaller_model) {
        akv_gguf_synth_shape s = tiny();
        s.n_layers = 3;
        if (!CHECK(synth(&s, AKV_GGUF_TYPE_Q8_0, 7, NULL, path) == AKV_OK)) break;
        akv_gguf *g = NULL, *h = NULL;
        if (!CHECK(akv_gguf_open(path, &g) == AKV_OK)) break;
        CHECK_STATUS(akv_gguf_write_layer_slice(g, 0, path2), AKV_EINVAL);
        CHECK_STATUS(akv_gguf_write_layer_slice(g, 4, path2), AKV_EINVAL);
        if (CHECK(akv_gguf_write_layer_slice(g, 2, path2) == AKV_OK) &&
            CHECK(akv_gguf_open(path2, &h) == AKV_OK)) {
            uint32_t n = 0;
            CHECK_OK(akv_gguf_get_u32(h, "llama.block_count", &n));
            CHECK_EQ_INT(n, 2);
            CHECK_EQ_U64(akv_gguf_n_kv(h), akv_gguf_n_kv(g));
            size_t n_kept = 0;
            for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
                const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i), *u = NULL;
                akv_status st = akv_gguf_find_tensor(h, t->name, &u);
                if (!strncmp(t->name, "blk.2.", 6)) {
                    CHECK_STATUS(st, AKV_ENOTFOUND);
                    continue;
                }
                n_kept++;
                if (!CHECK(st == AKV_OK)) continue;
                CHECK_EQ_INT(u->type, t->type);
                CHECK_EQ_U64(u->n_bytes, t->n_bytes);
                CHECK(memcmp(u->data, t->data, t->n_bytes) == 0);
            }
            CHECK_EQ_U64(akv_gguf_n_tensors(h), n_kept);
            CHECK(n_kept < akv_gguf_n_tensors(g));
        }
        akv_gguf_close(h);
        akv_gguf_close(g);
    }

    unlink(path);
    unlink(path2);
    rmdir(dir);
    return test_finish();
}
