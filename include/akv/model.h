/*
 * akv/model.h — a Llama-family model read from a GGUF file: its configuration and its weights.
 *
 * Architectures: `llama` (Llama 2/3, SmolLM, Mistral-style dense models), `qwen2` (the same
 * block with a bias on Q, K and V and the NEOX RoPE layout), `qwen3` (dense: qwen2's block
 * without the biases, each Q and K head RMS-normalised before RoPE) and `gemma3` (qwen3's
 * attention with each sub-block's output RMS-normalised before its residual add, a GELU-tanh
 * gate, the embedding scaled by sqrt(n_embd), local layers that attend a sliding window with
 * their own RoPE base; the host pass only). Every hyperparameter
 * comes from the file's metadata under the architecture's prefix (`llama.*`, `qwen2.*`,
 * `qwen3.*`, `gemma3.*`); the defaults
 * below are those of the GGUF convention (a key whose absence has a defined meaning), never
 * a model's numbers from memory:
 *
 *   key (after "<arch>.")                 field        if absent
 *   block_count                           n_layers     required
 *   embedding_length                      n_embd       required
 *   feed_forward_length                   n_ff         required
 *   context_length                        n_ctx_train  required
 *   attention.head_count                  n_heads      required
 *   attention.head_count_kv               n_kv_heads   n_heads (no GQA)
 *   attention.key_length, value_length    head_dim     n_embd / n_heads (both must agree)
 *   attention.layer_norm_rms_epsilon      rms_eps      required
 *   rope.dimension_count                  n_rot        head_dim
 *   rope.freq_base                        rope_base    10000
 *   rope.scaling.type                     -            none; "linear" uses rope.scaling.factor;
 *                                                      "yarn"/others: AKV_EUNSUPPORTED
 *   vocab_size                            n_vocab      rows of token_embd.weight
 *   expert_count                          -            0; > 0 (mixture of experts): unsupported
 * gemma3 also (llama.cpp's reading of the same keys):
 *   attention.sliding_window              n_swa        0 (every layer global)
 *   attention.sliding_window_pattern      swa_pattern  6 (an array form: unsupported)
 *   rope.freq_base_swa                    rope_base_swa 10000
 *   final_logit_softcapping               -            0; non-zero: unsupported
 *   attn_scale: 1/sqrt(n_embd/n_heads) for the 62-layer (27B) shape, else 1/sqrt(head_dim)
 * Llama 3's RoPE scaling travels as the tensor rope_freqs.weight ([n_rot/2] divisors of each
 * pair's frequency, as llama.cpp applies them); its presence sets has_rope_factors.
 *
 * Weights (tensor names; shapes as [rows][cols] = GGUF ne {cols, rows}):
 *   token_embd.weight        [n_vocab][n_embd]
 *   output_norm.weight       [n_embd]
 *   output.weight            [n_vocab][n_embd]     absent = tied to token_embd (tied_output)
 *   rope_freqs.weight        [n_rot/2]             optional
 *   blk.L.attn_norm.weight   [n_embd]
 *   blk.L.attn_q.weight      [n_heads*head_dim][n_embd]     .bias [n_heads*head_dim] (qwen2)
 *   blk.L.attn_k.weight      [n_kv_heads*head_dim][n_embd]  .bias (qwen2)
 *   blk.L.attn_v.weight      [n_kv_heads*head_dim][n_embd]  .bias (qwen2)
 *   blk.L.attn_q_norm.weight [head_dim]            qwen3: every Q head's RMSNorm weights,
 *   blk.L.attn_k_norm.weight [head_dim]            and every K head's, applied before RoPE
 *   blk.L.attn_output.weight [n_embd][n_heads*head_dim]
 *   blk.L.ffn_norm.weight    [n_embd]
 *   blk.L.ffn_gate.weight    [n_ff][n_embd]
 *   blk.L.ffn_up.weight      [n_ff][n_embd]
 *   blk.L.ffn_down.weight    [n_embd][n_ff]
 *   blk.L.post_attention_norm.weight [n_embd]      gemma3: the attention's output normalised
 *   blk.L.post_ffw_norm.weight       [n_embd]      gemma3: the feed-forward's output normalised
 * Every required tensor must exist with exactly its shape (AKV_EFORMAT naming the tensor, the
 * shape found and the shape expected); a tensor of a type this build cannot dequantise is
 * AKV_EUNSUPPORTED naming both; a non-finite weight (or block scale) is AKV_EFORMAT naming
 * the tensor and the block.
 *
 * Storage (akv_model_load_params.weights). NATIVE (the default): a matrix whose format has a
 * block product (akv/ops.h: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) stays in its blocks, copied
 * from the file as they are; F32 matrices are copied; other formats (F16, BF16, Q5_0, ...)
 * are widened to f32 and say so in the log. F32: every matrix widened to f32 (the comparison
 * point). Vectors (norms, biases) are always f32.
 *
 * Ownership: the model owns a copy of every weight (read with pread, so a file changed under
 * it gives AKV_EIO, not a fault); the GGUF stays open for the model's lifetime because the
 * tokenizer and chat template read its metadata (akv_model_gguf). Pointers from getters are
 * borrowed and valid until akv_model_destroy.
 *
 * Thread-safety: a loaded model is immutable; any number of forward passes may read it.
 */
#ifndef AKV_MODEL_H
#define AKV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/gguf.h"
#include "akv/ops.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_model_arch {
    AKV_MODEL_ARCH_LLAMA = 0,
    AKV_MODEL_ARCH_QWEN2 = 1,
    AKV_MODEL_ARCH_QWEN3 = 2,
    AKV_MODEL_ARCH_GEMMA3 = 3,
} akv_model_arch;

/* The feed-forward block's gate: SWIGLU = silu(gate) * up; GEGLU = gelu(gate) * up with the
 * tanh approximation of GELU (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))). */
typedef enum akv_ffn_act {
    AKV_FFN_SWIGLU = 0,
    AKV_FFN_GEGLU = 1,
} akv_ffn_act;

typedef struct akv_model_config {
    akv_model_arch arch;
    char arch_name[16];      /* "llama", "qwen2", "qwen3" (general.architecture) */
    uint32_t n_layers;       /* transformer blocks */
    uint32_t n_embd;         /* width of the residual stream */
    uint32_t n_ff;           /* width of the feed-forward hidden layer */
    uint32_t n_heads;        /* query heads */
    uint32_t n_kv_heads;     /* K/V heads; n_heads is a multiple of it */
    uint32_t head_dim;       /* elements per head */
    uint32_t n_rot;          /* leading elements of a head that RoPE rotates (even) */
    uint32_t n_vocab;        /* rows of the embedding and the output */
    uint32_t n_ctx_train;    /* context length the model was trained for, tokens */
    float rms_eps;           /* RMSNorm epsilon */
    double rope_base;        /* RoPE theta */
    double rope_freq_scale;  /* linear RoPE scaling: 1 / factor (1 = none) */
    akv_rope_mode rope_mode; /* NORMAL for llama, NEOX for qwen2 and qwen3 */
    bool has_rope_factors;   /* rope_freqs.weight present (Llama 3 scaling) */
    bool tied_output;        /* no output.weight: the output reuses token_embd */
    bool has_qkv_bias;       /* Q, K, V carry a bias (qwen2) */
    bool has_qk_norm;        /* each head of Q and K RMS-normalised before RoPE (qwen3, gemma3) */
    bool has_post_norms;     /* each sub-block's output RMS-normalised (attn_post_norm,
                                ffn_post_norm) before its residual add (gemma3) */
    akv_ffn_act ffn_act;     /* SWIGLU; GEGLU for gemma3 */
    float embd_scale;        /* the embedding's rows times this (gemma3: sqrt(n_embd)); 1 = none */
    float attn_scale;        /* attention score scale; 0 = 1/sqrt(head_dim) */
    uint32_t n_swa;          /* local layers' sliding window, tokens: a query sees the n_swa
                                newest keys, itself included; 0 = every layer global */
    uint32_t swa_pattern;    /* layer l is local when n_swa and l % swa_pattern < swa_pattern - 1 */
    double rope_base_swa;    /* RoPE theta of local layers */
} akv_model_config;

/* Whether layer l attends through the sliding window (akv_model_config.n_swa). */
static inline bool akv_model_layer_is_swa(const akv_model_config *c, uint32_t l) {
    return c->n_swa > 0 && c->swa_pattern > 0 && l % c->swa_pattern < c->swa_pattern - 1;
}

/* A weight matrix [rows][cols] in its storage format: row r is row_bytes bytes at data + r *
 * row_bytes (akv_ops_wrow_bytes(type, cols)); F32 rows are floats. */
typedef struct akv_model_mat {
    const void *data;
    akv_ops_wtype type;
    uint32_t rows, cols;
    size_t row_bytes;
} akv_model_mat;

/* How weight matrices are stored. NATIVE: in their block formats where the pass has a
 * product for the format, widened otherwise; BF16, F32: every matrix widened. The host model
 * (this header, "Storage") takes NATIVE or F32, the device pass (akv/forward_dev.h) NATIVE or
 * BF16, the engine (akv/engine.h) any, mapping it to both. */
typedef enum akv_weights {
    AKV_WEIGHTS_NATIVE = 0,
    AKV_WEIGHTS_BF16 = 1,
    AKV_WEIGHTS_F32 = 2,
} akv_weights;

/* "native", "bf16", "f32"; "?" otherwise. */
const char *akv_weights_name(akv_weights w);

/* The weights of one block, shapes as in the file comment. Bias pointers are NULL when the
 * architecture has none. */
typedef struct akv_model_layer {
    const float *attn_norm;       /* [n_embd] */
    akv_model_mat wq, wk, wv;     /* [n_heads*head_dim][n_embd], [n_kv_heads*head_dim][n_embd] x2 */
    const float *bq, *bk, *bv;    /* [n_heads*head_dim], [n_kv_heads*head_dim] x2, or NULL */
    const float *q_norm, *k_norm; /* [head_dim] each, or NULL (has_qk_norm) */
    akv_model_mat wo;             /* [n_embd][n_heads*head_dim] */
    const float *ffn_norm;        /* [n_embd] */
    akv_model_mat w_gate, w_up;   /* [n_ff][n_embd] */
    akv_model_mat w_down;         /* [n_embd][n_ff] */
    const float *attn_post_norm;  /* [n_embd] or NULL (has_post_norms) */
    const float *ffn_post_norm;   /* [n_embd] or NULL (has_post_norms) */
} akv_model_layer;

typedef struct akv_model akv_model;

/* Progress of a load: `done` of `total` bytes of weights read so far. */
typedef void (*akv_model_progress_fn)(void *user, uint64_t done, uint64_t total);

typedef struct akv_model_load_params {
    akv_model_progress_fn progress; /* NULL = no reports; else called after every tensor */
    void *progress_user;
    akv_weights weights;            /* NATIVE (0) or F32 */
} akv_model_load_params;

/* Fills *out from the metadata of an open GGUF (the table in the file comment), checking
 * every value (non-zero sizes, n_heads a multiple of n_kv_heads, n_rot even and <= head_dim,
 * finite positive epsilon and base, a vocabulary that matches token_embd.weight).
 * AKV_EUNSUPPORTED (logged with the key and value) for an architecture other than llama/qwen2,
 * a mixture of experts, a RoPE scaling other than none/linear, K and V of different widths;
 * AKV_EFORMAT (logged naming the key) for a missing required key, a value of the wrong type
 * or out of range. All-or-nothing. */
akv_status akv_model_config_read(const akv_gguf *g, akv_model_config *out);

/* Opens the GGUF at `path`, reads its configuration and binds every weight (the file
 * comment: the checks, the storage). `params` may be NULL. AKV_EIO / AKV_EFORMAT /
 * AKV_EUNSUPPORTED / AKV_ENOMEM, logged once with the detail; *out is set only on success. */
akv_status akv_model_load(const char *path, const akv_model_load_params *params, akv_model **out);

/* The same over a GGUF image of n_bytes at `data`, which the caller keeps alive and unchanged
 * until akv_model_destroy (tests and fuzzing). */
akv_status akv_model_load_memory(const void *data, size_t n_bytes,
                                 const akv_model_load_params *params, akv_model **out);

/* Frees the weights and closes the file. NULL is a no-op. */
void akv_model_destroy(akv_model *m);

const akv_model_config *akv_model_get_config(const akv_model *m);

/* Block `layer` (< n_layers; else assertion). */
const akv_model_layer *akv_model_get_layer(const akv_model *m, uint32_t layer);

const akv_model_mat *akv_model_tok_embd(const akv_model *m); /* [n_vocab][n_embd] */
const float *akv_model_output_norm(const akv_model *m);      /* [n_embd] */
const akv_model_mat *akv_model_output(const akv_model *m);   /* [n_vocab][n_embd]; = tok_embd if tied */

/* Row `row` of w as n = w->cols floats (a block row decoded by GGUF's decoders, an F32 row
 * copied). AKV_EINVAL for a row out of range. */
akv_status akv_model_mat_row_f32(const akv_model_mat *w, uint32_t row, float *out);

/* The RoPE angle per position of each pair: [n_rot/2] radians (base, linear scale and Llama 3
 * factors folded in; akv_ops_ref_rope_freqs). */
const float *akv_model_rope_inv_freq(const akv_model *m);
/* The same for the local layers (akv_model_layer_is_swa: rope_base_swa, scale 1, no
 * factors); NULL when the model has no sliding window. */
const float *akv_model_rope_inv_freq_local(const akv_model *m);

/* The open file (metadata for the tokenizer and the chat template). */
const akv_gguf *akv_model_gguf(const akv_model *m);

/* Bytes of weights the model holds, as stored (block matrices at their block size; the tied
 * output counted once). */
size_t akv_model_weight_bytes(const akv_model *m);

/* Bytes of weights one decode step reads: every matrix but the embedding table (of which a
 * step reads one row), the output head included (so a tied table counts once, as the
 * head), and the f32 vectors. */
size_t akv_model_step_weight_bytes(const akv_model *m);

#ifdef __cplusplus
}
#endif
#endif /* AKV_MODEL_H */
