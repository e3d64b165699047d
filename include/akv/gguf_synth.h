/*
 * akv/gguf_synth.h — synthetic Llama- and Qwen3-architecture GGUF models: real shapes, seeded
 * random weights, no download. Benchmarks and tests run any shape (an 8B model included) from a
 * file written here.
 *
 * The file has the keys and tensor names llama.cpp's "llama" architecture loads:
 *   general.architecture = "llama", general.name, general.file_type,
 *   general.quantization_version (quantised types), llama.block_count, .context_length,
 *   .embedding_length, .feed_forward_length, .attention.head_count, .head_count_kv,
 *   .attention.key_length, .value_length, .attention.layer_norm_rms_epsilon,
 *   .rope.freq_base, .rope.dimension_count, .vocab_size; akv.synth.seed, akv.synth.shape;
 *   tokenizer.* copied from another GGUF (vocab_from), or tokenizer.ggml.model = "none".
 * Tensors, ggml order (ne[0] first), in file order:
 *   token_embd.weight            [n_embd, n_vocab]          type
 *   blk.N.attn_norm.weight       [n_embd]                   f32
 *   blk.N.attn_q.weight          [n_embd, n_heads*head_dim]  type
 *   blk.N.attn_k.weight          [n_embd, n_kv_heads*head_dim]
 *   blk.N.attn_v.weight          [n_embd, n_kv_heads*head_dim]
 *   blk.N.attn_output.weight     [n_heads*head_dim, n_embd]
 *   blk.N.ffn_norm.weight        [n_embd]                   f32
 *   blk.N.ffn_gate.weight        [n_embd, n_ff]
 *   blk.N.ffn_up.weight          [n_embd, n_ff]
 *   blk.N.ffn_down.weight        [n_ff, n_embd]
 *   output_norm.weight           [n_embd]                   f32
 *   output.weight                [n_embd, n_vocab]          (absent when tied)
 *
 * Weights: element i of tensor k is a pure function of (seed, k, i): matrices uniform with
 * standard deviation 0.02, norm weights 1 +- 0.02 uniform; then encoded as `type`. The same
 * seed and shape give the same bytes on every machine.
 *
 * Thread-safety: akv_gguf_synth_write may run in several threads on different paths.
 */
#ifndef AKV_GGUF_SYNTH_H
#define AKV_GGUF_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/gguf.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_gguf_synth_shape {
    const char *name;     /* preset name, or a label for a custom shape */
    uint32_t n_layers;    /* transformer blocks */
    uint32_t n_embd;      /* hidden size */
    uint32_t n_heads;     /* query heads */
    uint32_t n_kv_heads;  /* K/V heads; divides n_heads (GQA) */
    uint32_t head_dim;    /* elements per head; even (RoPE rotates pairs) */
    uint32_t n_ff;        /* feed-forward hidden size */
    uint32_t n_vocab;     /* tokens; replaced by the token count of vocab_from */
    uint32_t n_ctx;       /* trained context length, tokens */
    float rope_theta;     /* RoPE base frequency */
    float rms_eps;        /* RMSNorm epsilon */
    bool tied;            /* no output.weight: the output projection is token_embd */
    bool qk_norm;         /* architecture "qwen3": each layer's Q and K heads RMS-normalised
                             (blk.N.attn_q_norm.weight, attn_k_norm.weight [head_dim], after
                             ffn_down), keys under "qwen3."; false: "llama" */
} akv_gguf_synth_shape;

/* Presets: "llama3-8b", "llama3.2-1b", "smollm2-135m", "qwen3-0.6b" (from the models' published
 * configurations; the smollm2 preset is checked against the default model's file by the
 * model-label test). i >= akv_gguf_synth_n_presets() is a programmer error. */
size_t akv_gguf_synth_n_presets(void);
const akv_gguf_synth_shape *akv_gguf_synth_preset(size_t i);

/* The preset called `name`; AKV_ENOTFOUND if there is none. */
akv_status akv_gguf_synth_find_preset(const char *name, akv_gguf_synth_shape *out);

/* Progress: called after each piece written: the tensor being written, its index, the
 * number of tensors, tensor-data bytes written so far and in all. */
typedef void (*akv_gguf_synth_progress_fn)(void *user, const char *tensor, size_t tensor_idx,
                                           size_t n_tensors, uint64_t bytes_done,
                                           uint64_t bytes_total);

typedef struct akv_gguf_synth_params {
    akv_gguf_synth_shape shape;
    akv_gguf_type type;          /* encoding of the matrices (any type akv_gguf_quantize
                                    handles); norms are always f32 */
    uint64_t seed;               /* weight stream */
    const akv_gguf *vocab_from;  /* NULL, or a GGUF whose tokenizer.* kvs are copied and
                                    whose tokenizer.ggml.tokens count becomes n_vocab */
    akv_gguf_synth_progress_fn progress; /* NULL = none */
    void *progress_user;
} akv_gguf_synth_params;

/* Checks a shape for `type`: every count > 0, n_heads a multiple of n_kv_heads, head_dim
 * even, every row length (n_embd, n_heads*head_dim, n_ff) a multiple of the type's block,
 * the file size representable. AKV_EINVAL (logged, naming the field) otherwise. */
akv_status akv_gguf_synth_check(const akv_gguf_synth_shape *s, akv_gguf_type type);

/* The file's general.architecture for shape s: "qwen3" with qk_norm, else "llama". */
const char *akv_gguf_synth_arch(const akv_gguf_synth_shape *s);

/* Writes the model to `path` (streaming: memory use is a few MiB whatever the shape).
 * AKV_EINVAL for a bad shape or type, AKV_EFORMAT when vocab_from has no token list,
 * AKV_EIO on a write error (the file is then absent), AKV_ENOMEM. */
akv_status akv_gguf_synth_write(const akv_gguf_synth_params *p, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GGUF_SYNTH_H */
