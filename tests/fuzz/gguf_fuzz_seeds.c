/* gguf_fuzz_seeds.c — writes the seed corpus of gguf_fuzz into a directory: the reader
 * tests' sample image (every value type; versions 2 and 3; alignments 32 and 64) and two
 * tiny synthetic models (bf16 and q4_0). Usage: gguf_fuzz_seeds DIR */
#include <stdio.h>

#include "akv/gguf_synth.h"
#include "gguf_build.h"

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
    const akv_gguf_type types[2] = {AKV_GGUF_TYPE_BF16, AKV_GGUF_TYPE_Q4_0};
    for (int i = 0; i < 2; i++) {
        akv_gguf_synth_params p = {
            .shape = {.name = "seed", .n_layers = 1, .n_embd = 32, .n_heads = 2, .n_kv_heads = 1,
                      .head_dim = 16, .n_ff = 32, .n_vocab = 4, .n_ctx = 64, .rope_theta = 1e4f,
                      .rms_eps = 1e-5f, .tied = i == 1},
            .type = types[i], .seed = 1};
        char path[1024];
        snprintf(path, sizeof path, "%s/synth_%d.gguf", argv[1], i);
        rc |= akv_gguf_synth_write(&p, path) != AKV_OK;
    }
    return rc;
}
