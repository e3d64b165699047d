/* test_gguf_model.c — the reader on the default model (SmolLM2-135M-Instruct, Q4_1): its
 * hyperparameters, tokenizer arrays and tensor index as the file states them. Skips (77)
 * when models/ has no copy (scripts/fetch-model fetches it). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <unistd.h>

#include "akv/gguf.h"
#include "gguf/gguf_impl.h"

int main(void) {
    const char *src = getenv("AKV_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", src ? src : ".");
    if (access(path, R_OK) != 0) test_skip("no default model in models/ (run scripts/fetch-model)");
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

    akv_gguf_close(g);
    return test_finish();
}
