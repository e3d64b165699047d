/* test_gguf_model.c — the reader on the default model (SmolLM2-135M-Instruct, Q4_1): its
 * hyperparameters, tokenizer arrays and tensor index as the file states them; every tensor
 * dequantises to finite values; the smollm2-135m synth preset agrees with the file; a
 * synthetic model borrows its vocabulary; `akv gguf info` reports it. Skips (77) when
 * models/ has no copy (scripts/fetch-model fetches it). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"
#include "model_path.h"

#include <unistd.h>

#include "akv/gguf.h"
#include "akv/gguf_quant.h"
#include "akv/gguf_synth.h"
#include "gguf/gguf_impl.h"

int main(int argc, char **argv) {
    test_args(argc, argv);
    char path[4096];
    if (!test_model_path(path, sizeof path, 0))
        test_skip("no default model in models/ (run scripts/fetch-model)");
    akv_gguf *g = NULL;

    TEST_CASE(opens_and_validates) {
        CHECK_OK(akv_gguf_open(path, &g));
        if (!g) break;
        CHECK(akv__gguf_check(g));
        CHECK_EQ_INT(akv_gguf_version(g), 3);
        CHECK_EQ_U64(akv_gguf_alignment(g), 32);
    }
    if (!g) return test_finish();

    TEST_CASE(hyperparameters) {
        akv_gguf_str arch = {0};
        CHECK_OK(akv_gguf_get_str(g, "general.architecture", &arch));
        CHECK(arch.len == 5 && !memcmp(arch.ptr, "llama", 5));
        uint32_t v = 0;
        CHECK_OK(akv_gguf_get_u32(g, "llama.block_count", &v));
        CHECK_EQ_INT(v, 30);
        CHECK_OK(akv_gguf_get_u32(g, "llama.embedding_length", &v));
        CHECK_EQ_INT(v, 576);
        CHECK_OK(akv_gguf_get_u32(g, "llama.attention.head_count", &v));
        CHECK_EQ_INT(v, 9);
        CHECK_OK(akv_gguf_get_u32(g, "llama.attention.head_count_kv", &v));
        CHECK_EQ_INT(v, 3);
        CHECK_OK(akv_gguf_get_u32(g, "llama.vocab_size", &v));
        CHECK_EQ_INT(v, 49152);
        CHECK_OK(akv_gguf_get_u32(g, "llama.rope.dimension_count", &v));
        CHECK_EQ_INT(v, 64);
        float eps = 0;
        CHECK_OK(akv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps));
        CHECK_NEAR(eps, 1e-5, 1e-12);
    }

    TEST_CASE(tokenizer_arrays) {
        akv_gguf_arr tokens, merges, types;
        CHECK_OK(akv_gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens));
        CHECK_EQ_INT(tokens.type, AKV_GGUF_VTYPE_STRING);
        CHECK_EQ_U64(tokens.n, 49152);
        CHECK_OK(akv_gguf_get_arr(g, "tokenizer.ggml.token_type", &types));
        CHECK_EQ_U64(types.n, tokens.n);
        CHECK_OK(akv_gguf_get_arr(g, "tokenizer.ggml.merges", &merges));
        CHECK_EQ_INT(merges.type, AKV_GGUF_VTYPE_STRING);
        CHECK(merges.n > 0);
        /* Every element is reachable; token 1 (bos) is a special token string. */
        size_t total = 0;
        for (uint64_t i = 0; i < tokens.n; i++) total += akv_gguf_arr_str(g, &tokens, i).len;
        CHECK(total > tokens.n);
        uint32_t bos = 0;
        CHECK_OK(akv_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
        akv_gguf_str s = akv_gguf_arr_str(g, &tokens, bos);
        CHECK(s.len > 2 && s.ptr[0] == '<');
    }

    TEST_CASE(tensor_index) {
        /* 2 + 9 per layer: token_embd, output_norm; attn_norm, q, k, v, output, ffn_norm,
         * gate, up, down. The output projection is tied to token_embd (no output.weight). */
        uint32_t n_layers = 0, n_embd = 0, n_ff = 0;
        CHECK_OK(akv_gguf_get_u32(g, "llama.block_count", &n_layers));
        CHECK_OK(akv_gguf_get_u32(g, "llama.embedding_length", &n_embd));
        CHECK_OK(akv_gguf_get_u32(g, "llama.feed_forward_length", &n_ff));
        CHECK_EQ_U64(akv_gguf_n_tensors(g), 2 + 9 * (uint64_t)n_layers);
        const akv_gguf_tensor *t = NULL;
        CHECK_OK(akv_gguf_find_tensor(g, "token_embd.weight", &t));
        if (t) {
            CHECK_EQ_U64(t->ne[0], n_embd);
            CHECK_EQ_U64(t->ne[1], 49152);
        }
        char name[64];
        snprintf(name, sizeof name, "blk.%u.ffn_down.weight", n_layers - 1);
        CHECK_OK(akv_gguf_find_tensor(g, name, &t));
        if (t) {
            CHECK_EQ_U64(t->ne[0], n_ff);
            CHECK_EQ_U64(t->ne[1], n_embd);
            CHECK_EQ_INT(t->type, AKV_GGUF_TYPE_Q4_1);
        }
        /* The last tensor's data ends inside the file. */
        uint64_t end = 0;
        for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
            const akv_gguf_tensor *ti = akv_gguf_tensor_at(g, i);
            if (ti->offset + ti->n_bytes > end) end = ti->offset + ti->n_bytes;
        }
        CHECK(end <= akv_gguf_file_bytes(g));
        CHECK(end + 64 > akv_gguf_file_bytes(g));
    }

    TEST_CASE(every_tensor_dequantises) {
        int n_bad = 0;
        for (size_t i = 0; i < akv_gguf_n_tensors(g); i++) {
            const akv_gguf_tensor *t = akv_gguf_tensor_at(g, i);
            float *y = malloc(t->n_elems * sizeof *y);
            CHECK_OK(akv_gguf_dequant_f32(t->type, t->data, t->n_elems, y));
            double sum_sq = 0;
            for (uint64_t j = 0; j < t->n_elems; j++) {
                if (!isfinite(y[j]) && n_bad++ < 3) fprintf(stderr, "%s[%llu] = %g\n", t->name,
                                                           (unsigned long long)j, y[j]);
                sum_sq += (double)y[j] * y[j];
            }
            CHECK(sum_sq > 0); /* no tensor of a trained model is all zero */
            free(y);
        }
        CHECK_EQ_INT(n_bad, 0);
    }

    TEST_CASE(smollm2_preset_matches_the_file) {
        akv_gguf_synth_shape s;
        CHECK_OK(akv_gguf_synth_find_preset("smollm2-135m", &s));
        uint32_t v = 0;
        const struct {
            const char *key;
            uint32_t want;
        } keys[] = {{"llama.block_count", s.n_layers},
                    {"llama.embedding_length", s.n_embd},
                    {"llama.attention.head_count", s.n_heads},
                    {"llama.attention.head_count_kv", s.n_kv_heads},
                    {"llama.rope.dimension_count", s.head_dim},
                    {"llama.feed_forward_length", s.n_ff},
                    {"llama.vocab_size", s.n_vocab},
                    {"llama.context_length", s.n_ctx}};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            CHECK_OK(akv_gguf_get_u32(g, keys[i].key, &v));
            TEST_CHECK_(v == keys[i].want, "%s: file %u, preset %u", keys[i].key, v, keys[i].want);
        }
        float f = 0;
        CHECK_OK(akv_gguf_get_f32(g, "llama.rope.freq_base", &f));
        CHECK_NEAR(f, s.rope_theta, 0);
        CHECK_OK(akv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
        CHECK_NEAR(f, s.rms_eps, 0);
        const akv_gguf_tensor *t;
        CHECK_EQ_INT(akv_gguf_find_tensor(g, "output.weight", &t) == AKV_ENOTFOUND, s.tied);
    }

    char out[4200];
    snprintf(out, sizeof out, "/tmp/akv_test_gguf_model_%d.gguf", (int)getpid());
    TEST_CASE(synthetic_model_with_this_vocabulary) {
        akv_gguf_synth_params p = {
            .shape = {.name = "tiny", .n_layers = 1, .n_embd = 64, .n_heads = 2, .n_kv_heads = 1,
                      .head_dim = 32, .n_ff = 128, .n_vocab = 7, .n_ctx = 256,
                      .rope_theta = 1e4f, .rms_eps = 1e-5f},
            .type = AKV_GGUF_TYPE_Q8_0, .seed = 9, .vocab_from = g};
        CHECK_OK(akv_gguf_synth_write(&p, out));
        akv_gguf *s = NULL;
        CHECK_OK(akv_gguf_open(out, &s));
        if (!s) break;
        uint32_t v = 0;
        CHECK_OK(akv_gguf_get_u32(s, "llama.vocab_size", &v));
        CHECK_EQ_INT(v, 49152);
        const akv_gguf_tensor *t = NULL;
        CHECK_OK(akv_gguf_find_tensor(s, "token_embd.weight", &t));
        if (t) CHECK_EQ_U64(t->ne[1], 49152);
        int n_copied = 0;
        for (size_t i = 0; i < akv_gguf_n_kv(g); i++) {
            const char *key = akv_gguf_kv_key(g, i);
            size_t j;
            if (strncmp(key, "tokenizer.", 10) != 0) continue;
            if (!CHECK(akv_gguf_find_kv(s, key, &j) == AKV_OK)) continue;
            const uint8_t *p1, *p2;
            size_t n1, n2;
            akv__gguf_kv_span(g, i, &p1, &n1);
            akv__gguf_kv_span(s, j, &p2, &n2);
            TEST_CHECK_(n1 == n2 && !memcmp(p1, p2, n1), "%s differs", key);
            n_copied++;
        }
        CHECK(n_copied >= 5);
        akv_gguf_close(s);
        unlink(out);
    }

    TEST_CASE(akv_gguf_info_reports_it) {
        const char *build = getenv("AKV_BUILD_DIR");
        char akv[4200], cmd[8400];
        static char text[1 << 17];
        snprintf(akv, sizeof akv, "%s/tools/akv", build ? build : ".");
        if (access(akv, X_OK) != 0) {
            printf("  (no %s: run under ctest, which sets AKV_BUILD_DIR)\n", akv);
            break;
        }
        snprintf(cmd, sizeof cmd, "'%s' gguf info --tensors --meta '%s'", akv, path);
        FILE *f = popen(cmd, "r");
        if (!CHECK(f != NULL)) break;
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        CHECK_EQ_INT(pclose(f), 0);
        static const char *const want[] = {
            "architecture  llama",
            "layers 30  hidden 576  heads 9  kv heads 3  head dim 64  ffn 1536  vocab 49152",
            "tokenizer  gpt2 (pre smollm)  49152 tokens",
            "= 23040 bytes", /* 2 x 30 x 3 x 64 x 2 */
            "q4_1         210",
            "total        272",
            "tokenizer.ggml.bos_token_id                  1", /* --meta */
            "blk.29.ffn_down.weight           q4_1   1536 x 576", /* --tensors */
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            TEST_CHECK_(strstr(text, want[i]) != NULL, "info output lacks '%s':\n%s", want[i], text);
    }

    akv_gguf_close(g);
    return test_finish();
}
