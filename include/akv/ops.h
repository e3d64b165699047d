/*
 * akv/ops.h — the forward pass's dense ops (everything but attention), as plain-C references.
 *
 * These are the host backend of the model's forward pass and the oracle the CUDA kernels are
 * tested against. Attention has its own header (akv/attn.h). All arrays are float32, row-major,
 * contiguous; shapes are given in C order ([rows][cols], the last index fastest).
 *
 * Glossary
 *   row            one token's vector (n_embd, or n_heads * head_dim, ...).
 *   weight W       a matrix [n_out][n_in] stored row by row: GGUF's ne = {n_in, n_out}, so a
 *                  weight of the file, dequantised, is already in this layout.
 *   n_rot          the leading elements of each head that RoPE rotates (the GGUF key
 *                  <arch>.rope.dimension_count); the rest of the head passes through.
 *   inv_freq[i]    the angle per position of rotation pair i (i < n_rot/2), in radians:
 *                  freq_scale * base^(-2i/n_rot) / factor[i]. `factor` is Llama 3's per-pair
 *                  divisor (GGUF tensor rope_freqs.weight), `freq_scale` the linear scaling
 *                  (1 / <arch>.rope.scaling.factor); this is exactly the angle llama.cpp's
 *                  rope gives with ext_factor = 0 (no YaRN) and attn_factor = 1.
 *   RoPE layouts   NORMAL rotates adjacent pairs (x[2i], x[2i+1]): llama.cpp's mode for LLAMA,
 *                  whose GGUF converter permuted the Q and K rows so that this equals Hugging
 *                  Face's rotate-half. NEOX rotates (x[i], x[i + n_rot/2]): Qwen2 (unpermuted).
 *                  A pair (a, b) at angle θ becomes (a cosθ - b sinθ, a sinθ + b cosθ).
 *
 * Numerics: sums of squares (RMSNorm) and softmax sums accumulate in double; matrix products
 * in float32 (the batch-invariant akv_ops_matmul_cols of the host pass; OpenBLAS or the plain
 * loop for the references). Angles are formed in double from integer positions,
 * so RoPE at position 10^6 is as accurate as at position 1.
 *
 * Thread-safety: every function is reentrant; akv_ops_ref_set_threads changes a process-wide
 * setting of OpenBLAS and must not race with a running matrix product.
 */
#ifndef AKV_OPS_H
#define AKV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_rope_mode {
    AKV_ROPE_NORMAL = 0, /* adjacent pairs (2i, 2i+1): Llama after the converter's permutation */
    AKV_ROPE_NEOX = 1,   /* halves (i, i + n_rot/2): Qwen2 */
} akv_rope_mode;

/* y[r][i] = x[r][i] / sqrt(mean_j(x[r][j]^2) + eps) * w[i] for r < n_rows, i < n.
 * y may equal x (in place). */
void akv_ops_ref_rmsnorm(float *y, const float *x, const float *w, size_t n_rows, size_t n,
                         float eps);

/* inv_freq[n_rot/2] as in the glossary. `factors` is NULL (all 1) or [n_rot/2] positive
 * divisors. AKV_EINVAL (logged) for an odd or zero n_rot, a base <= 1, a freq_scale <= 0, or a
 * factor that is not finite and positive (naming its index). */
akv_status akv_ops_ref_rope_freqs(double base, uint32_t n_rot, double freq_scale,
                                  const float *factors, float *inv_freq);

/* cos/sin of every pair's angle at each position: cos_t[t][i] = cos(pos[t] * inv_freq[i]),
 * likewise sin_t, for t < n_tokens, i < n_rot/2. One table serves every layer and head. */
void akv_ops_ref_rope_table(const int32_t *pos, size_t n_tokens, const float *inv_freq,
                            uint32_t n_rot, float *cos_t, float *sin_t);

/* Rotates x[n_tokens][n_heads][head_dim] in place with the table of akv_ops_ref_rope_table;
 * elements at index >= n_rot in each head are unchanged. n_rot is even and <= head_dim. */
void akv_ops_ref_rope(float *x, size_t n_tokens, uint32_t n_heads, uint32_t head_dim,
                      uint32_t n_rot, akv_rope_mode mode, const float *cos_t, const float *sin_t);

/* SwiGLU: y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). y may equal gate or up. */
void akv_ops_ref_swiglu(float *y, const float *gate, const float *up, size_t n);

/* GeGLU: y[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation,
 * gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))). y may equal gate or up. */
void akv_ops_ref_geglu(float *y, const float *gate, const float *up, size_t n);

/* Embedding lookup: y[t] = table[ids[t]] (rows of n_embd floats) for t < n_ids.
 * AKV_EINVAL (logged, naming the position and id) if an id is outside [0, n_vocab);
 * nothing is written then. */
akv_status akv_ops_ref_embed(float *y, const float *table, size_t n_vocab, size_t n_embd,
                             const int32_t *ids, size_t n_ids);

/* Softmax of each row of x[n_rows][n] in place (max subtracted first). A row that is all
 * -inf becomes all 0 (an empty distribution, not NaN). */
void akv_ops_ref_softmax(float *x, size_t n_rows, size_t n);

/* y[i] += a[i] (the residual stream). */
void akv_ops_ref_add(float *y, const float *a, size_t n);

/* Matrix product through OpenBLAS: y[m][n] = x[m][k] · W^T (+ bias[n] on every row when bias
 * is not NULL), with W [n][k] as in the glossary. y must not overlap x, W or bias. m = 1 takes
 * the matrix-vector path. m, n, k >= 1. */
void akv_ops_ref_matmul(float *y, const float *x, const float *w, const float *bias, size_t m,
                        size_t n, size_t k);

/* The same product in plain C (float32 accumulation, one pass per output): the fallback and
 * the tests' oracle for the BLAS path. */
void akv_ops_ref_matmul_plain(float *y, const float *x, const float *w, const float *bias, size_t m,
                              size_t n, size_t k);

/* Instruction sets of the host products. AUTO: the best the CPU has. */
typedef enum akv_ops_isa {
    AKV_OPS_ISA_AUTO = 0,
    AKV_OPS_ISA_PORTABLE = 1,    /* plain C (fmaf) */
    AKV_OPS_ISA_AVX2 = 2,        /* x86-64 AVX2 + FMA */
    AKV_OPS_ISA_AVX512_VNNI = 3, /* AVX2 + FMA, with AVX-512 VNNI (256-bit, VL) for the block
                                    products' integer dots; the f32 product as AVX2. The same
                                    bits as AVX2 and portable */
} akv_ops_isa;

/* The set a request runs on this CPU: AUTO the best it has; a set it lacks, the best below it. */
akv_ops_isa akv_ops_isa_resolve(akv_ops_isa isa);
/* "portable", "avx2+fma", "avx2+fma+avx512vnni", "auto" */
const char *akv_ops_isa_name(akv_ops_isa isa);

/* The host pass's matrix product, columns j0..j1-1 of y[m][n] = x[m][k] · W^T (+ bias[j]): a
 * caller splits the columns over threads. BATCH-INVARIANT: every y[r][j] is the same float
 * whatever m, the other rows of x, the column range and the thread are, because each element
 * is computed by one fixed recipe: dot(x[r], W[j]) in 8 lanes (lane i accumulates k = i, i+8,
 * ... in ascending order, one fused multiply-add each, the last partial step zero-padded), the
 * lanes summed as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then + bias[j]. Every instruction
 * set runs that recipe, so they agree bit for bit (the tests check it). y must not overlap x,
 * W or bias; m, n, k >= 1; j0 <= j1 <= n. Asserts. */
void akv_ops_matmul_cols(float *y, const float *x, const float *w, const float *bias, size_t m,
                         size_t n, size_t k, size_t j0, size_t j1, akv_ops_isa isa);

/* ---- products over weights in their block formats ---------------------------------------
 * W keeps its GGUF block encoding: each row of k weights is k / B blocks of B elements (B = 32
 * for Q8_0, Q4_0, Q4_1; 256 for the K formats, each a super-block of 8 sub-blocks of 32), row j
 * at j * akv_ops_wrow_bytes(t, k). The activations are quantized per 32 elements to int8 with
 * one f32 scale (amax / 127, round to nearest), and each output element is one fixed recipe
 * over the row's 32-element sub-blocks (ref/qmatmul.c: 8 exact integer dots of 4 elements
 * each, one fused multiply-add per lane, the lanes summed in a fixed order). So, as with
 * akv_ops_matmul_cols, every y[r][j] is the same float whatever m, the other rows, the column
 * range, the thread and the instruction set.
 *
 * Formats (GGUF's layouts; d, dmin, m are f16 unless said):
 *   Q8_0  34 B / 32:  d, 32 int8 q                      w = d q
 *   Q4_0  18 B / 32:  d, 16 bytes of nibbles            w = d (q - 8)
 *   Q4_1  20 B / 32:  d, m, 16 bytes of nibbles         w = d q + m
 *   Q4_K 144 B / 256: d, dmin, 12 bytes of 6-bit scale and min per sub-block, 128 bytes of
 *                     nibbles                           w = d sc q - dmin mn
 *   Q5_0  22 B / 32:  d, 4 bytes of fifth bits (bit e: element e), 16 bytes of nibbles
 *                                                       w = d (q - 16)   (q of 5 bits)
 *   Q5_1  24 B / 32:  d, m, the fifth bits, the nibbles w = d q + m
 *   Q5_K 176 B / 256: as Q4_K plus 32 bytes of fifth bits   (q of 5 bits)
 *   Q6_K 210 B / 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per
 *                     16 elements), d last             w = d sc (q - 32)
 * A 32-element block's element e < 16 is the low nibble of byte e, e + 16 its high nibble (Q4_0,
 * Q4_1); the K formats' orders are those of GGUF (ref/qmatmul.c, qm_unpack). */
enum { AKV_OPS_QBLOCK = 32 };
typedef enum akv_ops_wtype {
    AKV_OPS_W_F32 = 1,  /* plain f32 rows: akv_ops_matmul_cols, not the block product */
    AKV_OPS_W_Q8_0 = 2,
    AKV_OPS_W_Q4_0 = 3,
    AKV_OPS_W_Q4_1 = 4,
    AKV_OPS_W_Q4_K = 5,
    AKV_OPS_W_Q5_K = 6,
    AKV_OPS_W_Q6_K = 7,
    AKV_OPS_W_BF16 = 8, /* plain bf16 rows: the device products' format (no host product) */
    AKV_OPS_W_Q5_0 = 9, /* host products only: the device pass widens it to bf16 */
    AKV_OPS_W_Q5_1 = 10,
} akv_ops_wtype;

/* Whether t is one of the block formats (Q8_0 .. Q6_K, Q5_0, Q5_1). */
static inline int akv_ops_wtype_is_block(akv_ops_wtype t) {
    return (t >= AKV_OPS_W_Q8_0 && t <= AKV_OPS_W_Q6_K) || t == AKV_OPS_W_Q5_0 || t == AKV_OPS_W_Q5_1;
}

/* Elements of one block of t (1 for F32 and BF16, 32, or 256); 0 for an unknown type. */
size_t akv_ops_wblock_elems(akv_ops_wtype t);

/* Bytes of one block of t; 0 for an unknown type. */
size_t akv_ops_wblock_bytes(akv_ops_wtype t);

/* Bytes of one row of k weights of t; 0 for an unknown type or a k that is not a positive
 * multiple of the block. */
size_t akv_ops_wrow_bytes(akv_ops_wtype t, size_t k);

/* "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K" (GGUF's
 * names); "?" otherwise. */
const char *akv_ops_wtype_name(akv_ops_wtype t);

/* A row of k weights of block format t decoded to floats by the recipe's terms: w = ws * (q -
 * o) (+ mw for the formats with a minimum), the values GGUF's decoders give. k a positive
 * multiple of t's block. Asserts. */
void akv_ops_wrow_to_f32(akv_ops_wtype t, const void *row, size_t k, float *out);

/* Activations quantized per 32 elements (storage from akv_ops_q8_bind): q [m][k] int8; d, s
 * [m][k / 32]: the scale and scale * sum(q); lsum [m][k / 32][8]: the sum of q over each
 * group of 4. */
typedef struct akv_ops_q8 {
    int8_t *q;
    float *d, *s;
    int32_t *lsum;
} akv_ops_q8;

/* Bytes akv_ops_q8_bind needs for m rows of k (k a multiple of 32). */
size_t akv_ops_q8_bytes(size_t m, size_t k);

/* Points out's arrays into mem (akv_ops_q8_bytes(m, k) bytes, 4-byte aligned). */
void akv_ops_q8_bind(void *mem, size_t m, size_t k, akv_ops_q8 *out);

/* Row r of x as a batch of one (the arrays of q offset to row r). */
akv_ops_q8 akv_ops_q8_row(const akv_ops_q8 *x, size_t k, size_t r);

/* Quantizes x[m][k] (k a multiple of 32) into out: per 32-element block, d = amax / 127 and
 * each quant x / d rounded half away from zero, clamped to +-127 (a block whose d is below the
 * normal range quantizes to zeros). Every instruction set gives the same bytes. Asserts. */
void akv_ops_quantize_rows_q8(const float *x, size_t m, size_t k, akv_ops_q8 *out, akv_ops_isa isa);

/* Columns j0..j1-1 of y[m][n] = x[m][k] · W^T (+ bias[j]) with x quantized by
 * akv_ops_quantize_rows_q8 and W in block format t (not F32). m, n >= 1; k a positive
 * multiple of t's block; j0 <= j1 <= n. Asserts. */
void akv_ops_qmatmul_cols(float *y, const akv_ops_q8 *x, size_t m, const void *w,
                          akv_ops_wtype t, const float *bias, size_t n, size_t k, size_t j0,
                          size_t j1, akv_ops_isa isa);

/* Threads OpenBLAS may use (>= 1; its default is every core). */
void akv_ops_ref_set_threads(int n_threads);

#ifdef __cplusplus
}
#endif
#endif /* AKV_OPS_H */
