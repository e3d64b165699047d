/*
 * akv/forward_ops.h — the device ops of the forward pass that runs on a device's queues
 * (akv/forward_dev.h): argument structs and op descriptors (akv_dev_op, dev.h).
 *
 * Each op is a named kernel launched on the compute queue with akv_dev_op_launch. The
 * descriptor (defined in ref/forward_ops.c) carries the host backend's implementation,
 * built on ref/ (the oracle); the CUDA backend registers a launcher under the same name in
 * cuda/cuda_ops.c (kernels in cuda/fwd_kernels.cu, matrix products through cuBLAS in
 * cuda/fwd_gemm.c, attention through the launchers of akv/attn.h).
 *
 * Conventions: every akv_dptr is a device address; arrays are row-major and contiguous unless a
 * stride (in elements, between the starts of consecutive rows) says otherwise; dtypes are f32
 * or bf16 (converted with round-to-nearest-even). Shapes are [rows][cols].
 *
 * Numerics, mirroring the host forward pass (forward.c, ops.h) wherever it is cheap:
 *   rmsnorm   the sum of squares accumulates in double; scale = (float)(1/sqrt(ss/n + eps)).
 *   rope      the angle pos*inv_freq[i] is formed in double and its cos/sin rounded to float;
 *             the rotation (a c - b s, a s + b c) in float without fused multiply-adds.
 *   swiglu    g / (1 + expf(-g)) * u in float.
 *   matmul    bf16 x bf16 products with f32 accumulation (cuBLAS, tensor cores); the host
 *             implementation widens both to f32 and uses akv_ops_ref_matmul. beta = 1 adds
 *             the product into y (the residual stream), so there is no separate residual add.
 *
 * Thread-safety: the descriptors are immutable.
 */
#ifndef AKV_FORWARD_OPS_H
#define AKV_FORWARD_OPS_H

#include <math.h>
#include <stdint.h>

#include "akv/attn.h"
#include "akv/dev.h"
#include "akv/dtype.h"
#include "akv/fwd_sample.h"
#include "akv/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Op names (the CUDA table's keys). */
#define AKV_FWD_OP_EMBED "fwd_embed"
#define AKV_FWD_OP_RMSNORM "fwd_rmsnorm"
#define AKV_FWD_OP_ROPE "fwd_rope"
#define AKV_FWD_OP_HEAD_NORM "fwd_head_norm"
#define AKV_FWD_OP_SWIGLU "fwd_swiglu"
#define AKV_FWD_OP_ADD "fwd_add"
#define AKV_FWD_OP_CAST "fwd_cast"
#define AKV_FWD_OP_FILL "fwd_fill"
#define AKV_FWD_OP_ARGMAX "fwd_argmax"
#define AKV_FWD_OP_SAMPLE "fwd_sample"
#define AKV_FWD_OP_MATMUL "fwd_matmul"
#define AKV_FWD_OP_ATTN_APPEND "fwd_attn_append"
#define AKV_FWD_OP_ATTN_DECODE "fwd_attn_decode"
#define AKV_FWD_OP_ATTN_PREFILL "fwd_attn_prefill"
#define AKV_FWD_OP_ATTN_MERGE "fwd_attn_merge"
#define AKV_FWD_OP_ATTN_WIDEN "fwd_attn_widen"

/* y[t] = table[ids[t]] widened to f32. An id outside [0, n_vocab) gives a row of NaN (the
 * caller validates ids on the host first; the kernel never reads outside the table). */
typedef struct akv_fwd_embed_args {
    akv_dptr y;            /* f32 [n][n_embd] */
    akv_dptr table;        /* [n_vocab][n_embd], table_dtype */
    akv_dptr ids;          /* int32 [n] */
    uint32_t n, n_embd, n_vocab;
    akv_dtype table_dtype; /* f32 or bf16 */
} akv_fwd_embed_args;

/* y[r] = x[i] / sqrt(mean(x[i]^2) + eps) * w, for r < n_rows, i = rows[r] (rows 0 = r). */
typedef struct akv_fwd_rmsnorm_args {
    akv_dptr y;        /* [n_rows][n], y_dtype */
    akv_dptr x;        /* f32 rows of n */
    akv_dptr w;        /* f32 [n] */
    akv_dptr rows;     /* int32 [n_rows]: the row of x each row of y normalises (a gather: the
                          output head's rows); 0 = row r */
    uint32_t n_rows, n;
    float eps;
    akv_dtype y_dtype; /* f32 or bf16 */
} akv_fwd_rmsnorm_args;

/* Each of the first n_a + n_b heads of each token row RMS-normalised in place
 * (akv_ops_ref_rmsnorm's arithmetic over one head): heads [0, n_a) with weights wa, heads
 * [n_a, n_a + n_b) with wb. Qwen3's Q and K heads before RoPE. */
typedef struct akv_fwd_head_norm_args {
    akv_dptr x;        /* f32: row t at x + t*stride, heads of head_dim from its start */
    akv_dptr wa, wb;   /* f32 [head_dim] each */
    uint32_t n_tokens, n_a, n_b, head_dim;
    uint32_t stride;   /* elements between token rows (>= (n_a + n_b) * head_dim) */
    float eps;
} akv_fwd_head_norm_args;

/* Rotates the first n_rot elements of each head of each token row in place (akv_ops_ref_rope's
 * pairs and angles: inv_freq already folds base, linear scale and Llama 3 factors). */
typedef struct akv_fwd_rope_args {
    akv_dptr x;          /* f32: row t at x + t*stride, n_heads heads of head_dim */
    akv_dptr pos;        /* int32 [n_tokens] positions */
    akv_dptr inv_freq;   /* f32 [n_rot/2] radians per position */
    uint32_t n_tokens, n_heads, head_dim, n_rot;
    uint32_t stride;     /* elements between token rows; 0 = n_heads*head_dim */
    akv_rope_mode mode;
} akv_fwd_rope_args;

/* y[r][i] = silu(gate[r][i]) * up[r][i], r < n_rows, i < n. */
typedef struct akv_fwd_swiglu_args {
    akv_dptr y;          /* [n_rows][n] contiguous, y_dtype */
    akv_dptr gate, up;   /* f32, rows at in_stride */
    uint32_t n_rows, n;
    uint32_t in_stride;  /* elements between rows of gate and of up; 0 = n */
    akv_dtype y_dtype;   /* f32 or bf16 */
} akv_fwd_swiglu_args;

/* y[r][i] += a[r][i] (a_stride 0: a[i] on every row, a bias). */
typedef struct akv_fwd_add_args {
    akv_dptr y;         /* f32 [n_rows][n] */
    akv_dptr a;         /* f32, rows at a_stride */
    uint32_t n_rows, n;
    uint32_t a_stride;  /* 0 = broadcast one row */
} akv_fwd_add_args;

/* y[i] = x[i] converted, i < n. */
typedef struct akv_fwd_cast_args {
    akv_dptr y, x;
    uint64_t n;
    akv_dtype y_dtype, x_dtype; /* f32 or bf16 each */
} akv_fwd_cast_args;

/* y[r] = the first index of row r's largest value, NaN and -inf never chosen (-1 when every
 * value of the row is one): greedy decoding's choice, as the host sampler makes it with no
 * penalty (akv/sample.h), without the row leaving the device. */
typedef struct akv_fwd_argmax_args {
    akv_dptr y;         /* int32 [n_rows] */
    akv_dptr x;         /* f32 [n_rows][n] */
    uint32_t n_rows, n;
} akv_fwd_argmax_args;

/* The reference of one row (what the host op, the host pass and the sampler compute): the
 * first index of the largest logit; -1 when none is larger than -inf (a NaN compares false).
 * Inline so that the sampler shares it without linking the reference ops. */
static inline int32_t akv_fwd_argmax_ref(const float *x, uint32_t n) {
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) return -1;
    uint32_t best = 0;
    while (!(x[best] == mx)) best++;
    return (int32_t)best;
}

/* y[r] = the token row r's parameters draw from its logits (akv/fwd_sample.h: the host
 * sampler's law), for every row whose temp is >= 0 (temp 0: the greedy choice, as argmax);
 * -1 where no logit is a candidate. The penalties change x in place (those rows' values are
 * not wanted back). pen holds every row's penalised ids, then their counts. */
typedef struct akv_fwd_sample_args {
    akv_dptr y;    /* int32 [n_rows] */
    akv_dptr x;    /* f32 [n_rows][n] */
    akv_dptr rows; /* akv_fwd_sample_row [n_rows] */
    akv_dptr pen;  /* int32 [2][n_pen]: ids, then counts */
    uint32_t n_rows, n, n_pen;
} akv_fwd_sample_args;

/* The reference of one row (the host op's): sorts the candidates, as the host sampler does,
 * and keeps its prefixes; x changed by the penalties. -1: no candidate; -2: out of memory. */
int32_t akv_fwd_sample_ref(const akv_fwd_sample_row *row, const int32_t *pen_ids,
                           const int32_t *pen_counts, float *x, uint32_t n);

/* y[i] = center + scale * u(seed, i), u uniform in [-1, 1) from a hash of (seed, i): the same
 * values on every backend (synthetic weights for benchmarks). With w_type a block format
 * (akv/ops.h) y is instead n bytes of blocks of that format: byte i is akv_fwd_fill_byte
 * (seed, i) except the blocks' f16 scale fields, which hold `scale` (and `center` where the
 * format has a second one: Q4_1's minimum, the K formats' dmin) rounded to f16. */
typedef struct akv_fwd_fill_args {
    akv_dptr y;
    uint64_t n;
    uint64_t seed;
    float center, scale;
    akv_dtype y_dtype; /* f32 or bf16 (w_type 0) */
    uint32_t w_type;   /* 0, or the block format (akv_ops_wtype) of the bytes */
} akv_fwd_fill_args;

/* How the CUDA backend computes a product (the host ignores it). AUTO over bf16 W: the skinny
 * kernel (cuda/fwd_gemv.cu: one warp per output row, a stream over W) for m = 1 when k is a
 * multiple of 8 and x, W are 16-byte aligned, cuBLAS otherwise (GEMV takes m <= 4). AUTO over
 * block W: integer dots one warp per output row (GEMV, m <= AKV_FWD_QGEMV_MAX_ROWS) below
 * AKV_FWD_TILES_MIN_ROWS rows, integer tensor-core tiles (TILES, any m) up to
 * AKV_FWD_TILES_MAX_ROWS, W widened to bf16 for cuBLAS (CUBLAS) above. The
 * others force one (a shape it cannot take is refused: AKV_EUNSUPPORTED for bf16 W,
 * AKV_EINVAL for block W and for TILES over bf16 W); benchmarks compare them. */
typedef enum akv_fwd_matmul_algo {
    AKV_FWD_MATMUL_AUTO = 0,
    AKV_FWD_MATMUL_CUBLAS = 1,
    AKV_FWD_MATMUL_GEMV = 2,
    AKV_FWD_MATMUL_TILES = 3,
} akv_fwd_matmul_algo;

/* y[m][n] = beta * y + x[m][k] · W[n][k]^T; bf16 x, f32 accumulation and output. W is bf16
 * rows (w_type 0 or AKV_OPS_W_BF16) or rows of a block format (w_type, akv/ops.h: k a multiple
 * of its block). On CUDA the skinny kernel (m <= 4) reads its first pieces of W before it
 * waits for the kernel before it on the stream (cuda/grid_dep.cuh): no kernel since the
 * stream's last copy, memset or event wait may write W (weights never are). Block W on CUDA
 * (GEMV, TILES) quantizes x to 8 bits per 32 elements into `scratch`
 * (akv_fwd_qgemv_scratch_bytes) and takes integer dot products with the blocks decoded in
 * registers (the host pass's recipe of akv/ops.h, summed in another order); CUBLAS widens W
 * into `scratch` (n * k bf16) and takes the bf16 product. The host backend decodes W with
 * akv_ops_wrow_to_f32 and runs its f32 product over bf16 x (no 8-bit x). */
typedef struct akv_fwd_matmul_args {
    akv_dptr y;           /* f32 [m][n] contiguous */
    akv_dptr x;           /* bf16 [m][k] */
    akv_dptr w;           /* bf16 [n][k] */
    uint32_t m, n, k;
    uint32_t beta;        /* 0: y = x W^T; 1: y += x W^T */
    akv_dptr workspace;   /* CUDA: cuBLAS workspace (0 = the library's own); host: unused */
    uint64_t workspace_bytes;
    uint32_t algo;        /* akv_fwd_matmul_algo; 0 = AUTO */
    uint32_t w_type;      /* akv_ops_wtype of W; 0 = bf16 */
    akv_dptr scratch;     /* CUDA, block W: akv_fwd_qgemv_scratch_bytes(m, k) for GEMV and
                             TILES, n * k * 2 for CUBLAS; 16-byte aligned */
    uint64_t scratch_bytes;
} akv_fwd_matmul_args;

/* The most rows the one-warp-per-row block product takes, and AUTO's picks over block W
 * (measured on the H200, docs/benchmarks.md): one warp per output row below
 * AKV_FWD_TILES_MIN_ROWS rows, tensor-core tiles up to AKV_FWD_TILES_MAX_ROWS, W widened
 * above. */
enum { AKV_FWD_QGEMV_MAX_ROWS = 4, AKV_FWD_TILES_MIN_ROWS = 4, AKV_FWD_TILES_MAX_ROWS = 16 };

/* Bytes of x quantized for a block product of m rows of k: int8 quants, then a scale and a
 * scaled sum per 32 elements. */
static inline uint64_t akv_fwd_qgemv_scratch_bytes(uint32_t m, uint32_t k) {
    return (uint64_t)m * k + 2ull * m * (k / 32) * sizeof(float);
}

/* Attention through akv/attn.h (the CUDA launchers, or the ref on the host backend). */
typedef struct akv_fwd_attn_append_args {
    akv_attn_append p;
} akv_fwd_attn_append_args;

typedef struct akv_fwd_attn_decode_args {
    akv_attn_decode p;
    akv_dptr workspace;       /* akv_attn_decode_workspace_bytes() of the CUDA split; host: unused */
    uint64_t workspace_bytes;
} akv_fwd_attn_decode_args;

typedef struct akv_fwd_attn_prefill_args {
    akv_attn_prefill p;
} akv_fwd_attn_prefill_args;

/* The exact merge of two parts' states (the pass's parts of a layer's history). */
typedef struct akv_fwd_attn_merge_args {
    akv_attn_merge p;
} akv_fwd_attn_merge_args;

/* A compact past part's pages widened to exact pages with their own table (what the prefill
 * of a prompt chunk reads of its compacted history). */
typedef struct akv_fwd_attn_widen_args {
    akv_attn_widen p;
} akv_fwd_attn_widen_args;

extern const akv_dev_op akv_fwd_op_embed;
extern const akv_dev_op akv_fwd_op_rmsnorm;
extern const akv_dev_op akv_fwd_op_rope;
extern const akv_dev_op akv_fwd_op_head_norm;
extern const akv_dev_op akv_fwd_op_swiglu;
extern const akv_dev_op akv_fwd_op_add;
extern const akv_dev_op akv_fwd_op_cast;
extern const akv_dev_op akv_fwd_op_fill;
extern const akv_dev_op akv_fwd_op_argmax;
extern const akv_dev_op akv_fwd_op_sample;
extern const akv_dev_op akv_fwd_op_matmul;
extern const akv_dev_op akv_fwd_op_attn_append;
extern const akv_dev_op akv_fwd_op_attn_decode;
extern const akv_dev_op akv_fwd_op_attn_prefill;
extern const akv_dev_op akv_fwd_op_attn_merge;
extern const akv_dev_op akv_fwd_op_attn_widen;

/* The value of element i of a fill (seed, center, scale), as a float before rounding to the
 * fill's dtype: the formula both backends use. */
static inline float akv_fwd_fill_value(uint64_t seed, uint64_t i, float center, float scale) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f; /* 24 bits -> [-1, 1) */
    return center + scale * u;
}

/* Byte i of a block fill (seed), before its scale fields are set: the top byte of the fill's
 * hash. */
static inline uint8_t akv_fwd_fill_byte(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint8_t)(z >> 56);
}

/* Where format t's f16 scale fields lie in a block: the first at *a, the second (or -1) at
 * *b, byte offsets. */
static inline void akv_fwd_block_scales(uint32_t t, int *a, int *b) {
    *a = t == AKV_OPS_W_Q6_K ? 208 : 0;
    *b = t == AKV_OPS_W_Q4_1 || t == AKV_OPS_W_Q4_K || t == AKV_OPS_W_Q5_K ? 2 : -1;
}

#ifdef __cplusplus
}
#endif
#endif /* AKV_FORWARD_OPS_H */
