/*
 * akv/kv_repr.h — the representations of a K/V page: exact, and the compact forms made from
 * it, with the byte layout every reader and writer of a page shares (the pools, the
 * attention's ref, host and CUDA implementations, the codec of akv/kvq.h).
 *
 * Glossary
 *   exact        the page as the append wrote it, in the pool's element type (bf16, f16 or
 *                f32): page[2][n_kv_heads][P][head_dim] (akv/attn.h). The host copy of a page
 *                is always exact: it is authoritative, compact forms are made from it.
 *   row          one (K or V, head, token) of a page: head_dim elements.
 *   codes        a compact row's quantized elements; scales: the f16 factors that turn codes
 *                back into values, one per `group` consecutive elements of a row.
 *   q8           one int8 code per element, one scale per row (group = head_dim), symmetric:
 *                scale = max|x| / 127 (rounded up to an f16), code = round(x / scale). 8 + 16 / head_dim bits an
 *                element (8.25 at head_dim 64, 8.125 at 128).
 *   q4           one 4-bit code per element (two a byte, the even element in the low nibble),
 *                one scale per group of 32 elements, symmetric: scale = max|x| / 7 (rounded up), code =
 *                round(x / scale) in [-7, 7], stored as code + 8. K rows are rotated first by
 *                the normalised Walsh-Hadamard transform over head_dim (H/sqrt(d): orthonormal
 *                and its own inverse), which spreads a channel's outlier over the row; a reader
 *                rotates the query the same way, so q.k is unchanged: (Hq).(Hk) = q.k. V rows
 *                are not rotated. 4.5 bits an element.
 *   layout       a compact page holds every row's codes, then (16-byte aligned) every row's
 *                scales, each in the exact page's order: codes[2][n_kv_heads][P][code_row_bytes],
 *                scales[2][n_kv_heads][P][scales_per_row] (f16).
 *
 * Thread-safety: plain values and pure functions.
 */
#ifndef AKV_KV_REPR_H
#define AKV_KV_REPR_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dtype.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_repr {
    AKV_REPR_EXACT = 0, /* the pool's element type, as the append wrote it */
    AKV_REPR_Q8 = 1,    /* int8 codes, one f16 scale per row */
    AKV_REPR_Q4 = 2,    /* 4-bit codes, one f16 scale per 32 elements, K rotated */
    AKV_REPR_COUNT
} akv_repr;

enum { AKV_REPR_Q4_GROUP = 32 };

/* Where the parts of a page in one representation lie. */
typedef struct akv_repr_layout {
    akv_repr repr;
    uint32_t group;          /* elements per scale (0: exact, no scales) */
    uint32_t code_row_bytes; /* bytes of one row's codes (exact: of one row's elements) */
    uint32_t scales_per_row; /* head_dim / group (0: exact) */
    uint32_t rotate_k;       /* 1: K rows hold H k / sqrt(head_dim) (q4) */
    size_t scales_offset;    /* bytes from the page's start to its first scale (exact: 0) */
    size_t page_bytes;       /* the whole page */
} akv_repr_layout;

/* "exact", "q8", "q4"; "?" for another value. */
const char *akv_repr_name(akv_repr r);

/* AKV_OK and *out for a name of akv_repr_name; AKV_EINVAL for another. */
akv_status akv_repr_from_name(const char *name, akv_repr *out);

/* The layout of a page of n_kv_heads x page_tokens rows of head_dim elements in representation
 * r, whose exact form has element type `exact`. AKV_EINVAL for zero sizes, an invalid r or
 * dtype, or a page whose size overflows size_t; AKV_EUNSUPPORTED for a shape the form cannot
 * hold (q4: head_dim a power of two, at least 32). Nothing logged: callers name the setting. */
akv_status akv_repr_layout_of(akv_repr r, akv_dtype exact, uint32_t n_kv_heads,
                              uint32_t page_tokens, uint32_t head_dim, akv_repr_layout *out);

/* Bits one element takes in representation r at head_dim, every scale included (exact: the
 * dtype's bits); 0 for an invalid r or a shape it cannot hold. */
double akv_repr_bits(akv_repr r, akv_dtype exact, uint32_t head_dim);

#ifdef __cplusplus
}
#endif
#endif /* AKV_KV_REPR_H */
