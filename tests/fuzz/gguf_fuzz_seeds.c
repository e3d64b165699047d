/* gguf_fuzz_seeds.c — writes the seed corpus of gguf_fuzz into a directory: the reader
 * tests' sample image (every value type; versions 2 and 3; alignments 32 and 64), a
 * tokenizer's metadata (a byte-level BPE vocabulary, merges, control tokens, a ChatML
 * template), and tiny synthetic models (bf16 and q4_0; one carrying that tokenizer), each
 * checked to be accepted by what it seeds. Usage: gguf_fuzz_seeds DIR */
#include <stdio.h>

#include "akv/chat.h"
#include "akv/gguf_synth.h"
#include "akv/model.h"
#include "akv/tok.h"
#include "gguf_build.h"

/* The kv header of a string array of n elements. */
static void seed_arr_str(gb *b, const char *key, uint64_t n) {
    gb_str(b, key);
    gb_u32(b, 9);  /* array */
    gb_u32(b, 8);  /* of strings */
    gb_u64(b, n);
}

/* A GGUF holding only a tokenizer: printable ASCII and 'Ġ' (a byte-level space) as tokens,
 * a few merges, two control tokens, and SmolLM2's ChatML template. */
static void seed_vocab(gb *b) {
    static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r"};
    static const char *const extra[] = {"he", "ll", "hell", "hello", "Ġw", "or"};
    static const char tmpl[] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    const uint64_t n_ascii = 94, n_tok = n_ascii + 1 + 6 + 2;
    gb_bytes(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0); /* tensors */
    gb_u64(b, 8); /* kvs */
    gb_str(b, "general.architecture"), gb_u32(b, 8), gb_str(b, "llama");
    gb_str(b, "tokenizer.ggml.model"), gb_u32(b, 8), gb_str(b, "gpt2");
    gb_str(b, "tokenizer.ggml.pre"), gb_u32(b, 8), gb_str(b, "smollm");
    seed_arr_str(b, "tokenizer.ggml.tokens", n_tok);
    for (int c = '!'; c <= '~'; c++) {
        char t[2] = {(char)c, 0};
        gb_str(b, t);
    }
    gb_str(b, "\xc4\xa0"); /* 'Ġ' */
    for (int i = 0; i < 6; i++) gb_str(b, extra[i]);
    gb_str(b, "<|im_start|>"), gb_str(b, "<|im_end|>");
    gb_str(b, "tokenizer.ggml.token_type"), gb_u32(b, 9), gb_u32(b, 5), gb_u64(b, n_tok);
    for (uint64_t i = 0; i < n_tok; i++) gb_u32(b, i + 2 >= n_tok ? 3 : 1);
    seed_arr_str(b, "tokenizer.ggml.merges", 6);
    for (int i = 0; i < 6; i++) gb_str(b, merges[i]);
    gb_str(b, "tokenizer.ggml.eos_token_id"), gb_u32(b, 4), gb_u32(b, (uint32_t)n_tok - 1);
    gb_str(b, "tokenizer.chat_template"), gb_u32(b, 8), gb_str(b, tmpl);
}

/* Whether the image at path opens and gives a tokenizer and a chat template (want_tok), a
 * model (want_model). */
static int seed_check(const char *path, int want_tok, int want_model) {
    akv_gguf *g = NULL;
    if (akv_gguf_open(path, &g) != AKV_OK) return 0;
    akv_tok *tok = NULL;
    akv_chat *chat = NULL;
    int ok = !want_tok || (akv_tok_create_from_gguf(g, NULL, &tok) == AKV_OK &&
                           akv_chat_create_from_gguf(g, NULL, &chat) == AKV_OK);
    akv_tok_destroy(tok);
    akv_chat_destroy(chat);
    akv_gguf_close(g);
    akv_model *m = NULL;
    ok = ok && (!want_model || akv_model_load(path, NULL, &m) == AKV_OK);
    akv_model_destroy(m);
    if (!ok) fprintf(stderr, "gguf_fuzz_seeds: %s is not accepted as it should be\n", path);
    return ok;
}

static int write_file(const char *dir, const char *name, const gb *b) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->p, 1, b->n, f) != b->n) return 1;
    return fclose(f) != 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gguf_fuzz_seeds DIR\n");
        return 2;
    }
    int rc = 0;
    const struct {
        const char *name;
        uint32_t version, alignment;
    } samples[] = {{"sample_v3.gguf", 3, 0}, {"sample_v2.gguf", 2, 0}, {"sample_a64.gguf", 3, 64}};
    for (size_t i = 0; i < 3; i++) {
        gb b = {0};
        gguf_sample_pos pos;
        gguf_sample(&b, samples[i].version, samples[i].alignment, &pos);
        rc |= write_file(argv[1], samples[i].name, &b);
        gb_free(&b);
    }
    gb v = {0};
    seed_vocab(&v);
    rc |= write_file(argv[1], "vocab.gguf", &v);
    gb_free(&v);
    char vpath[1024];
    snprintf(vpath, sizeof vpath, "%s/vocab.gguf", argv[1]);
    rc |= !seed_check(vpath, 1, 0);
    akv_gguf *vocab = NULL;
    rc |= akv_gguf_open(vpath, &vocab) != AKV_OK;
    const akv_gguf_type types[3] = {AKV_GGUF_TYPE_BF16, AKV_GGUF_TYPE_Q4_0, AKV_GGUF_TYPE_Q8_0};
    for (int i = 0; i < 3 && vocab; i++) {
        akv_gguf_synth_params p = {
            .shape = {.name = "seed", .n_layers = 1, .n_embd = 32, .n_heads = 2, .n_kv_heads = 1,
                      .head_dim = 16, .n_ff = 32, .n_vocab = 4, .n_ctx = 64, .rope_theta = 1e4f,
                      .rms_eps = 1e-5f, .tied = i == 1},
            .type = types[i], .seed = 1, .vocab_from = i == 2 ? vocab : NULL};
        char path[1024];
        snprintf(path, sizeof path, "%s/synth_%d.gguf", argv[1], i);
        rc |= akv_gguf_synth_write(&p, path) != AKV_OK || !seed_check(path, i == 2, 1);
    }
    akv_gguf_close(vocab);
    return rc;
}
