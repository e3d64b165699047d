/* test_model.c — configuration and weight binding on tiny synthetic GGUF files: every
 * hyperparameter read from the file, each bad file refused with the right status. */
#include "model_build.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "akv/log.h"
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

/* The load of m fails with `want` (its logged refusal silenced). */
#define load_refused(m, want)                                                                      \
    do {                                                                                           \
        akv_log_set(NULL, NULL, AKV_LOG_OFF);                                                      \
        CHECK_STATUS(load_tm(m, NULL), want);                                                      \
        akv_log_set(NULL, NULL, AKV_LOG_WARN);                                                     \
    } while (0)

/* The last error logged, for tests that check a message. */
static int cap_n;
static char cap_last[1024];
static void capture_log(akv_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    cap_n++;
    snprintf(cap_last, sizeof cap_last, "%s", msg);
}
static void capture_begin(void) {
    cap_n = 0, cap_last[0] = '\0';
    akv_log_set(capture_log, NULL, AKV_LOG_ERROR);
}
static void capture_end(void) {
    akv_log_set(NULL, NULL, AKV_LOG_WARN);
}

/* A load's progress hook that cuts the file to its first 4 KiB after the first tensor. */
struct cut_state {
    const char *path;
    bool cut;
};
static void cut_after_first(void *user, uint64_t done, uint64_t total) {
    struct cut_state *c = user;
    (void)done, (void)total;
    if (!c->cut) c->cut = truncate(c->path, 4096) == 0;
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

int main(int argc, char **argv) {
    test_args(argc, argv);
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
        CHECK_BYTES(akv_model_tok_embd(model)->data, tm_find(&m, "token_embd.weight")->data,
                    (size_t)c->n_embd * c->n_vocab * 4);
        CHECK_BYTES(akv_model_output(model)->data, tm_find(&m, "output.weight")->data,
                    (size_t)c->n_embd * c->n_vocab * 4);
        CHECK_BYTES(akv_model_output_norm(model), tm_find(&m, "output_norm.weight")->data,
                    (size_t)c->n_embd * 4);
        const akv_model_layer *L = akv_model_get_layer(model, 1);
        CHECK_BYTES(L->wk.data, tm_find(&m, "blk.1.attn_k.weight")->data, 16 * 32 * 4);
        CHECK_BYTES(L->w_down.data, tm_find(&m, "blk.1.ffn_down.weight")->data, 48 * 32 * 4);
        CHECK(L->wk.type == AKV_OPS_W_F32 && L->wk.rows == 16 && L->wk.cols == 32 &&
              L->wk.row_bytes == 32 * 4);
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

    TEST_CASE(qwen3_head_norms_no_bias) {
        /* qwen3: NEOX, no biases, a Q and a K norm of head_dim weights each layer (a head
         * dimension apart from n_embd / n_heads, as Qwen3's files have); a file without one is
         * refused naming it */
        tm_shape s = llama_shape;
        s.arch = "qwen3", s.head_dim = 16;
        tm_model m;
        tm_init(&m, &s, seed);
        akv_model *model = NULL;
        CHECK_OK(load_tm(&m, &model));
        if (model) {
            const akv_model_config *c = akv_model_get_config(model);
            CHECK(c->arch == AKV_MODEL_ARCH_QWEN3 && c->has_qk_norm && !c->has_qkv_bias);
            CHECK_EQ_INT(c->rope_mode, AKV_ROPE_NEOX);
            CHECK_EQ_INT(c->head_dim, 16);
            const akv_model_layer *L = akv_model_get_layer(model, 1);
            CHECK(L->q_norm && L->k_norm && !L->bq);
            if (L->k_norm) CHECK_BYTES(L->k_norm, tm_find(&m, "blk.1.attn_k_norm.weight")->data, 16 * 4);
            akv_model_destroy(model);
            model = NULL;
        }
        tm_drop(&m, "blk.1.attn_q_norm.weight");
        load_refused(&m, AKV_EFORMAT);
        tm_free(&m);
    }

    TEST_CASE(gemma3_keys_and_refusals) {
        /* gemma3: the window's keys with their defaults (pattern 6, local base 10000), the
         * embedding scale, post-norms required; a soft-cap or a missing post-norm refused */
        tm_shape s = llama_shape;
        s.arch = "gemma3", s.head_dim = 16;
        tm_model m;
        tm_init(&m, &s, seed);
        tm_u32(&m, "attention.sliding_window", 512);
        akv_model *model = NULL;
        CHECK_OK(load_tm(&m, &model));
        if (model) {
            const akv_model_config *c = akv_model_get_config(model);
            CHECK(c->arch == AKV_MODEL_ARCH_GEMMA3 && c->has_qk_norm && c->has_post_norms &&
                  c->ffn_act == AKV_FFN_GEGLU && c->n_swa == 512 && c->swa_pattern == 6 &&
                  c->rope_base_swa == 10000.0 && c->attn_scale == 0.0f);
            CHECK_NEAR(c->embd_scale, sqrt((double)s.n_embd), 1e-5);
            CHECK(akv_model_layer_is_swa(c, 0) && akv_model_layer_is_swa(c, 4) && !akv_model_layer_is_swa(c, 5));
            CHECK(akv_model_get_layer(model, 1)->attn_post_norm && akv_model_get_layer(model, 1)->ffn_post_norm);
            akv_model_destroy(model);
            model = NULL;
        }
        tm_f32(&m, "final_logit_softcapping", 30.0f);
        load_refused(&m, AKV_EUNSUPPORTED);
        tm_drop(&m, "gemma3.final_logit_softcapping");
        tm_drop(&m, "blk.1.post_ffw_norm.weight");
        load_refused(&m, AKV_EFORMAT);
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

        /* a head dimension the attention does not take, refused when the file is opened */
        tm_init(&m, &llama_shape, seed);
        tm_u32(&m, "attention.key_length", 512);
        tm_u32(&m, "attention.value_length", 512);
        capture_begin();
        CHECK_STATUS(load_tm(&m, NULL), AKV_EUNSUPPORTED);
        capture_end();
        TEST_CHECK_(strstr(cap_last, "512") && strstr(cap_last, "1..256"), "message: %s", cap_last);
        tm_free(&m);

        /* a type the dequantiser lacks: Q8_1 (32 elements in 36 bytes) */
        tm_init(&m, &llama_shape, seed);
        tm_tensor *t = tm_find(&m, "output_norm.weight");
        t->type = 9, t->raw_bytes = 36;
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

    TEST_CASE(non_finite_weights_are_refused_naming_the_tensor) {
        const float bad[2] = {NAN, -INFINITY};
        for (int b = 0; b < 2; b++) {
            tm_model m;
            tm_init(&m, &llama_shape, seed);
            tm_tensor *t = tm_find(&m, "blk.1.ffn_up.weight");
            AKV_ASSERT(t);
            t->data[37] = bad[b];
            capture_begin();
            CHECK_STATUS(load_tm(&m, NULL), AKV_EFORMAT);
            capture_end();
            TEST_CHECK_(strstr(cap_last, "blk.1.ffn_up.weight") && strstr(cap_last, "element 37") &&
                            strstr(cap_last, b ? "infinity" : "NaN"),
                        "message: %s", cap_last);
            tm_free(&m);
        }
    }

    TEST_CASE(a_file_cut_while_it_loads_fails_cleanly) {
        /* the file is truncated in place after the first tensor is dequantised (an in-place
         * copy over a model in use): the load ends in AKV_EIO naming a tensor, not SIGBUS */
        tm_model m;
        tm_init(&m, &llama_shape, seed);
        char path[64];
        tm_write(&m, path);
        struct cut_state st_cut = {.path = path};
        akv_model_load_params lp = {.progress = cut_after_first, .progress_user = &st_cut};
        akv_model *model = NULL;
        capture_begin();
        int64_t live = akv__alloc_live();
        CHECK_STATUS(akv_model_load(path, &lp, &model), AKV_EIO);
        capture_end();
        CHECK(model == NULL && st_cut.cut);
        CHECK_EQ_INT(akv__alloc_live(), live);
        TEST_CHECK_(strstr(cap_last, "cannot be read") != NULL, "last message: %s", cap_last);
        unlink(path);
        tm_free(&m);
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
