/*
 * akv/kvq.h — the codec of the compact page forms (akv/kv_repr.h): the reference that defines
 * their bits. Every writer of a compact page (the host pass; CUDA kernels) produces exactly
 * these bytes from the same exact page, and every reader decodes them as akv_kvq_decode_row
 * does, so a compact page is the same wherever it was made or staged to.
 *
 * Numerics (all in f32, no fused multiply-add, round-to-nearest-even throughout):
 *   rotation  akv_kvq_fwht: the butterflies of stride 1, 2, 4, ... n/2, each (a + b, a - b),
 *             then every element times (float)(1 / sqrt(n)). The network fixes every
 *             element's sum, so a parallel implementation gives the same bits.
 *   scale     amax = max |x| over the group; s = the least f16 at or above amax / L (L = 127
 *             for q8, 7 for q4: rounded up, so no value is clipped and every value lies within
 *             half a step of its decode); the codes use s as stored: code = clamp(rint(x /
 *             f32(s)), -L, L); a group of zeros has s = 0 and code 0 everywhere.
 *   decode    x = (float)code * f32(s).
 * Inputs must be finite: the codec neither checks nor preserves NaN or infinities.
 *
 * Thread-safety: pure functions over the caller's memory.
 */
#ifndef AKV_KVQ_H
#define AKV_KVQ_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dtype.h"
#include "akv/kv_repr.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[n] <- H x / sqrt(n) in place (the normalised Walsh-Hadamard transform; its own inverse).
 * n a power of two, at most 4096; anything else leaves x as it is. */
void akv_kvq_fwht(float *x, uint32_t n);

/* One row of head_dim values (already rotated when it is a K row of a rotating form) into its
 * codes and scales (l: a compact layout of that head_dim). */
void akv_kvq_encode_row(const akv_repr_layout *l, uint32_t head_dim, const float *x,
                        uint8_t *codes, uint16_t *scales);

/* The values of one compact row (rotated, for a K row of a rotating form). */
void akv_kvq_decode_row(const akv_repr_layout *l, uint32_t head_dim, const uint8_t *codes,
                        const uint16_t *scales, float *out);

/* The shape of a page: what a compact page's rows are addressed by. */
typedef struct akv_kvq_page_shape {
    uint32_t n_kv_heads, page_tokens, head_dim;
    akv_dtype exact;       /* element type of the exact page */
} akv_kvq_page_shape;

/* Where row (kv, head, token) of a page in layout l keeps its codes and scales. */
static inline size_t akv_kvq_row_index(const akv_kvq_page_shape *s, uint32_t kv, uint32_t head,
                                       uint32_t token) {
    return ((size_t)kv * s->n_kv_heads + head) * s->page_tokens + token;
}
static inline const uint8_t *akv_kvq_codes(const akv_repr_layout *l, const akv_kvq_page_shape *s,
                                           const void *page, uint32_t kv, uint32_t head,
                                           uint32_t token) {
    return (const uint8_t *)page + akv_kvq_row_index(s, kv, head, token) * l->code_row_bytes;
}
static inline const uint16_t *akv_kvq_scales(const akv_repr_layout *l,
                                             const akv_kvq_page_shape *s, const void *page,
                                             uint32_t kv, uint32_t head, uint32_t token) {
    return (const uint16_t *)((const uint8_t *)page + l->scales_offset) +
           akv_kvq_row_index(s, kv, head, token) * l->scales_per_row;
}

/* Encodes tokens [0, n_tokens) of every (K|V, head) row of an exact page into a compact page
 * of layout l (K rows rotated first where l says so). Rows at and past n_tokens are left as
 * they are. AKV_EINVAL for an exact layout, a shape l was not made for, or n_tokens past the
 * page. */
akv_status akv_kvq_encode_page(const akv_repr_layout *l, const akv_kvq_page_shape *s,
                               const void *exact_page, void *compact_page, uint32_t n_tokens);

/* Compact pages made from exact pages of one geometry, as the arguments of a device op (the
 * hybrid route launches it by the name AKV_KVQ_OP_ENCODE: the host backend runs
 * akv_kvq_encode_pairs, the CUDA backend a kernel that computes the same bits). For each pair
 * i, compact page pairs[i][1] of dst_pool = akv_kvq_encode_page of exact page pairs[i][0] of
 * src_pool, every row. */
#define AKV_KVQ_OP_ENCODE "kvq_encode"
typedef struct akv_kvq_encode_args {
    uint64_t src_pool;   /* address of exact page 0; pages of the exact layout */
    uint64_t dst_pool;   /* address of compact page 0; pages of repr's layout */
    uint64_t pairs;      /* address of int32 [n_pages][2]: (exact page id, compact page id) */
    uint32_t n_pages;
    uint32_t repr;       /* AKV_REPR_Q8 or AKV_REPR_Q4 */
    uint32_t n_kv_heads, page_tokens, head_dim;
    akv_dtype dtype;     /* the exact pages' */
} akv_kvq_encode_args;

/* The op over host memory (the addresses are host addresses). AKV_EINVAL for shapes the
 * layouts refuse, or a representation that is not compact. */
akv_status akv_kvq_encode_pairs(const akv_kvq_encode_args *a);

/* Row (kv, head, token) of a page in layout l, widened to f32 (a compact row decoded; its K
 * rows stay rotated): what every reader of a page sees. */
void akv_kvq_read_row(const akv_repr_layout *l, const akv_kvq_page_shape *s, const void *page,
                      uint32_t kv, uint32_t head, uint32_t token, float *out);

/* Rows token .. token + n - 1 of (kv, head) of a compact page, decoded into out[n][head_dim]:
 * what akv_kvq_read_row gives row by row, the same bits, in one pass (a page's rows of a head
 * lie together; the host attention reads a page at a time). l compact. */
void akv_kvq_read_rows(const akv_repr_layout *l, const akv_kvq_page_shape *s, const void *page,
                       uint32_t kv, uint32_t head, uint32_t token, uint32_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif /* AKV_KVQ_H */
