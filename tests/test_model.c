/* test_model.c — configuration and weight binding on tiny synthetic GGUF files: every
 * hyperparameter read from the file, each bad file refused with the right status. */
#include "model_build.h"

#include <math.h>

#include "akv/model.h"
#include "core/alloc.h"
#include "core/assert.h"

static const tm_shape llama_shape = {.arch = "llama",
                                     .n_layers = 2,
                                     .n_embd = 32,
                                     .n_ff = 48,
                                     .n_heads = 4,
                                     .n_kv_heads = 2,
                                     .n_vocab = 11};

/* Writes m, loads it, removes the file; returns the status (and the model when wanted). */
static akv_status load_tm(const tm_model *m, akv_model **out) {
    char path[64];
    tm_write(m, path);
    akv_model *model = NULL;
    akv_status st = akv_model_load(path, NULL, &model);
    unlink(path);
    if (out)
        *out = model;
    else
        akv_model_destroy(model);
    return st;
}

typedef struct progress_log {
    int n_calls;
    uint64_t last_done, total;
    int monotone;
} progress_log;

static void on_progress(void *user, uint64_t done, uint64_t total) {
    progress_log *p = user;
    if (done < p->last_done) p->monotone = 0;
    p->n_calls++, p->last_done = done, p->total = total;
}

int main(void) {
    uint64_t seed = test_seed(7);

    TEST_CASE(config_from_file) {
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        tm_find_kv(&m, "llama.rope.freq_base")->f = 500000.0f;
        char path[64];
        tm_write(&m, path);
        akv_gguf *g = NULL;
        CHECK_OK(akv_gguf_open(path, &g));
        akv_model_config c;
        memset(&c, 0xab, sizeof c);
        CHECK_OK(akv_model_config_read(g, &c));
        CHECK_EQ_INT(c.arch, AKV_MODEL_ARCH_LLAMA);
        CHECK_STR(c.arch_name, "llama");
        CHECK_EQ_INT(c.n_layers, 2);
        CHECK_EQ_INT(c.n_embd, 32);
        CHECK_EQ_INT(c.n_ff, 48);
        CHECK_EQ_INT(c.n_heads, 4);
        CHECK_EQ_INT(c.n_kv_heads, 2);
        CHECK_EQ_INT(c.head_dim, 8);
        CHECK_EQ_INT(c.n_rot, 8);
        CHECK_EQ_INT(c.n_vocab, 11);
        CHECK_EQ_INT(c.n_ctx_train, 4096);
        CHECK_NEAR(c.rms_eps, 1e-5, 1e-12);
        CHECK_NEAR(c.rope_base, 500000.0, 0);
        CHECK_NEAR(c.rope_freq_scale, 1.0, 0);
        CHECK_EQ_INT(c.rope_mode, AKV_ROPE_NORMAL);
        CHECK(!c.has_rope_factors && !c.tied_output && !c.has_qkv_bias);
        akv_gguf_close(g);
        unlink(path);
        tm_free(&m);
    }

    TEST_CASE(config_defaults_of_the_convention) {
        /* absent head_count_kv = no GQA, absent rope keys = head_dim and base 10000, absent
         * vocab_size = the embedding's rows */
        tm_shape s = llama_shape;
        s.n_kv_heads = 4;
        tm_model m;
        tm_init(&m, &s, seed);
        tm_drop(&m, "llama.attention.head_count_kv");
        tm_drop(&m, "llama.rope.dimension_count");
        tm_drop(&m, "llama.rope.freq_base");
        tm_drop(&m, "llama.vocab_size");
        char path[64];
        tm_write(&m, path);
        akv_gguf *g = NULL;
        akv_model_config c;
        CHECK_OK(akv_gguf_open(path, &g));
        CHECK_OK(akv_model_config_read(g, &c));
        CHECK_EQ_INT(c.n_kv_heads, 4);
        CHECK_EQ_INT(c.n_rot, 8);
        CHECK_NEAR(c.rope_base, 10000.0, 0);
        CHECK_EQ_INT(c.n_vocab, 11);
        akv_gguf_close(g);
        unlink(path);
        tm_free(&m);
    }

    TEST_CASE(load_binds_every_weight) {
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        akv_model *model = NULL;
        char path[64];
        tm_write(&m, path);
        progress_log pl = {.monotone = 1};
        akv_model_load_params lp = {.progress = on_progress, .progress_user = &pl};
        CHECK_OK(akv_model_load(path, &lp, &model));
        unlink(path);
        if (!model) break;
        const akv_model_config *c = akv_model_get_config(model);
        CHECK_BYTES(akv_model_tok_embd(model), tm_find(&m, "token_embd.weight")->data,
                    (size_t)c->n_embd * c->n_vocab * 4);
        CHECK_BYTES(akv_model_output(model), tm_find(&m, "output.weight")->data,
                    (size_t)c->n_embd * c->n_vocab * 4);
        CHECK_BYTES(akv_model_output_norm(model), tm_find(&m, "output_norm.weight")->data,
                    (size_t)c->n_embd * 4);
        const akv_model_layer *L = akv_model_get_layer(model, 1);
        CHECK_BYTES(L->wk, tm_find(&m, "blk.1.attn_k.weight")->data, 16 * 32 * 4);
        CHECK_BYTES(L->w_down, tm_find(&m, "blk.1.ffn_down.weight")->data, 48 * 32 * 4);
        CHECK_BYTES(L->ffn_norm, tm_find(&m, "blk.1.ffn_norm.weight")->data, 32 * 4);
        CHECK(L->bq == NULL && L->bk == NULL && L->bv == NULL);
        CHECK_EQ_INT(pl.n_calls, 3 + 2 * 9);
        CHECK(pl.monotone && pl.last_done == pl.total);
        CHECK_EQ_U64(pl.total, akv_model_weight_bytes(model));
        const float *inv = akv_model_rope_inv_freq(model);
        for (int i = 0; i < 4; i++)
            CHECK_NEAR(inv[i], pow(10000.0, -2.0 * i / 8), 1e-7);
        akv_model_destroy(model);
        tm_free(&m);
    }

    TEST_CASE(tied_output_rope_factors_qwen2_bias) {
        tm_shape s = llama_shape;
        s.arch = "qwen2", s.tied = true, s.rope_factors = true;
        tm_model m;
        tm_init(&m, &s, seed);
        akv_model *model = NULL;
        CHECK_OK(load_tm(&m, &model));
        if (!model) break;
        const akv_model_config *c = akv_model_get_config(model);
        CHECK(c->tied_output && c->has_rope_factors && c->has_qkv_bias);
        CHECK_EQ_INT(c->rope_mode, AKV_ROPE_NEOX);
        CHECK(akv_model_output(model) == akv_model_tok_embd(model));
        const float *f = tm_find(&m, "rope_freqs.weight")->data,
                    *inv = akv_model_rope_inv_freq(model);
        for (int i = 0; i < 4; i++)
            CHECK_NEAR(inv[i], pow(10000.0, -2.0 * i / 8) / f[i], 1e-7);
        const akv_model_layer *L = akv_model_get_layer(model, 0);
        CHECK(L->bq && L->bk && L->bv);
        if (L->bk) CHECK_BYTES(L->bk, tm_find(&m, "blk.0.attn_k.bias")->data, 16 * 4);
        akv_model_destroy(model);
        tm_free(&m);
    }

    TEST_CASE(bad_files_are_refused) {
        /* Each edit of a valid model, and the status it must give. */
        static const struct {
            const char *what;
            const char *drop; /* a key or tensor to remove */
            const char *kv;   /* a kv to change ... */
            uint32_t u;       /* ... to this u32 */
            const char *str;  /* ... or this string */
            int status;
        } cases[] = {
            {"no architecture", "general.architecture", 0, 0, 0, AKV_EFORMAT},
            {"architecture gpt2", 0, "general.architecture", 0, "gpt2", AKV_EUNSUPPORTED},
            {"no block_count", "llama.block_count", 0, 0, 0, AKV_EFORMAT},
            {"no embedding_length", "llama.embedding_length", 0, 0, 0, AKV_EFORMAT},
            {"no feed_forward_length", "llama.feed_forward_length", 0, 0, 0, AKV_EFORMAT},
            {"no context_length", "llama.context_length", 0, 0, 0, AKV_EFORMAT},
            {"no head_count", "llama.attention.head_count", 0, 0, 0, AKV_EFORMAT},
            {"no epsilon", "llama.attention.layer_norm_rms_epsilon", 0, 0, 0, AKV_EFORMAT},
            {"zero layers", 0, "llama.block_count", 0, 0, AKV_EFORMAT},
            {"2^32-1 layers (refused before per-layer arrays are sized)", 0, "llama.block_count", UINT32_MAX, 0,
             AKV_EFORMAT},
            {"kv heads 3 of 4", 0, "llama.attention.head_count_kv", 3, 0, AKV_EFORMAT},
            {"odd n_rot", 0, "llama.rope.dimension_count", 7, 0, AKV_EFORMAT},
            {"n_rot > head_dim", 0, "llama.rope.dimension_count", 16, 0, AKV_EFORMAT},
            {"vocab mismatch", 0, "llama.vocab_size", 12, 0, AKV_EFORMAT},
            {"missing tensor", "blk.1.ffn_up.weight", 0, 0, 0, AKV_EFORMAT},
            {"missing embedding", "token_embd.weight", 0, 0, 0, AKV_EFORMAT},
            {"missing output norm", "output_norm.weight", 0, 0, 0, AKV_EFORMAT},
        };
        for (size_t i = 0; i < AKV_ARRAY_LEN(cases); i++) {
            tm_model m;
            tm_init(&m, &llama_shape, seed);
            if (cases[i].drop) tm_drop(&m, cases[i].drop);
            if (cases[i].kv) {
                tm_kv *kv = tm_find_kv(&m, cases[i].kv);
                AKV_ASSERT(kv);
                if (cases[i].str)
                    snprintf(kv->s, sizeof kv->s, "%s", cases[i].str);
                else
                    kv->u = cases[i].u;
            }
            int64_t live = akv__alloc_live();
            int st = load_tm(&m, NULL);
            if (st != cases[i].status) printf("  case: %s\n", cases[i].what);
            CHECK_STATUS(st, cases[i].status);
            CHECK_EQ_INT(akv__alloc_live(), live);
            tm_free(&m);
        }
    }

    TEST_CASE(unsupported_variants) {
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        tm_u32(&m, "expert_count", 8);
        CHECK_STATUS(load_tm(&m, NULL), AKV_EUNSUPPORTED);
        tm_free(&m);

        tm_init(&m, &llama_shape, seed);
        snprintf(tm_kv_add(&m, "llama.rope.scaling.type", 8)->s, 32, "yarn");
        CHECK_STATUS(load_tm(&m, NULL), AKV_EUNSUPPORTED);
        tm_free(&m);

        tm_init(&m, &llama_shape, seed);
        tm_u32(&m, "attention.value_length", 16);
        CHECK_STATUS(load_tm(&m, NULL), AKV_EUNSUPPORTED);
        tm_free(&m);

        /* a type the dequantiser lacks: Q5_0 (32 elements in 22 bytes) */
        tm_init(&m, &llama_shape, seed);
        tm_tensor *t = tm_find(&m, "output_norm.weight");
        t->type = 6, t->raw_bytes = 22;
        CHECK_STATUS(load_tm(&m, NULL), AKV_EUNSUPPORTED);
        tm_free(&m);
    }

    TEST_CASE(linear_rope_scaling) {
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        snprintf(tm_kv_add(&m, "llama.rope.scaling.type", 8)->s, 32, "linear");
        tm_f32(&m, "rope.scaling.factor", 4.0f);
        akv_model *model = NULL;
        CHECK_OK(load_tm(&m, &model));
        if (model) {
            CHECK_NEAR(akv_model_get_config(model)->rope_freq_scale, 0.25, 0);
            CHECK_NEAR(akv_model_rope_inv_freq(model)[0], 0.25, 0);
        }
        akv_model_destroy(model);
        tm_drop(&m, "llama.rope.scaling.factor");
        CHECK_STATUS(load_tm(&m, NULL), AKV_EFORMAT);
        tm_free(&m);
    }

    TEST_CASE(wrong_shapes) {
        const char *names[] = {"blk.0.ffn_gate.weight", "blk.1.attn_v.weight",
                               "blk.0.ffn_down.weight", "blk.1.attn_norm.weight", "output.weight"};
        for (size_t i = 0; i < AKV_ARRAY_LEN(names); i++) {
            tm_model m;
            tm_init(&m, &llama_shape, seed);
            tm_tensor *t = tm_find(&m, names[i]);
            AKV_ASSERT(t);
            if (t->n_dims == 2) {
                uint64_t x = t->ne[0]; /* transposed: same bytes, wrong shape */
                t->ne[0] = t->ne[1], t->ne[1] = x;
            } else {
                t->ne[0] /= 2;
            }
            int st = load_tm(&m, NULL);
            if (st != AKV_EFORMAT) printf("  tensor: %s\n", names[i]);
            CHECK_STATUS(st, AKV_EFORMAT);
            tm_free(&m);
        }
    }

    TEST_CASE(allocation_failures_are_clean) {
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        char path[64];
        tm_write(&m, path);
        int n_failed = 0;
        for (uint64_t nth = 1; nth < 200; nth++) {
            int64_t live = akv__alloc_live();
            akv_model *model = NULL;
            akv__alloc_fail_nth(nth);
            akv_status st = akv_model_load(path, NULL, &model);
            bool fired = akv__alloc_failure_fired();
            akv__alloc_fail_nth(0);
            if (!fired) {
                CHECK_OK(st);
                akv_model_destroy(model);
                break;
            }
            n_failed++;
            CHECK(st != AKV_OK && model == NULL);
            CHECK_EQ_INT(akv__alloc_live(), live);
        }
        CHECK(n_failed > 3);
        unlink(path);
        tm_free(&m);
    }

    CHECK_EQ_INT(akv__alloc_live(), 0);
    return test_finish();
}
