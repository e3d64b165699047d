/*
 * akv/geom.h — the attention geometry of a model and the page it implies.
 *
 * Glossary
 *   geometry     the model's attention shape: layers with K/V history, K/V heads per layer,
 *                head dimension, element type of the K/V history.
 *   token bytes  one token of one layer, K and V for every K/V head:
 *                2 * n_kv_heads * head_dim * elem_bytes.
 *   representation  how a page holds its K/V (akv_repr, akv/kv_repr.h): exact, the geometry's
 *                element type as the append wrote it, or a compact form made from it (q8,
 *                q4); the host copy is always exact (it is authoritative). Each has its bits
 *                per element, every scale included, and so its page bytes, which is what
 *                admission, the fit formula and the pools count.
 *   page         P = page_tokens consecutive tokens of ONE layer of ONE context, laid out as
 *                page[2][n_kv_heads][P][head_dim] elements (index 0 = K, 1 = V). Element
 *                (kv, h, t, i) is at ((kv * n_kv_heads + h) * P + t) * head_dim + i. One token's
 *                rows are 2 * n_kv_heads rows of head_dim elements at a uniform pitch of
 *                P * head_dim elements, so writing back new tokens is one 2D copy per page.
 *
 * Tokens per page (P). Unless the caller overrides it, P is the power of two that puts the
 * page size closest to 256 KiB on a log scale (ties go to the smaller page), then clamped to
 * [16, 1024]. Why 256 KiB: it is the fragment size the K/V arena work settled on, large enough
 * that the per-page bookkeeping is negligible and small enough that a short context wastes
 * little of its last page. Examples: Llama-3-8B (8 K/V heads, head dim 128, bf16: 4 KiB per
 * token) -> P = 64, 256 KiB pages; SmolLM2-135M (3 heads, head dim 64, bf16: 768 B per token)
 * -> P = 256, 192 KiB pages (384 KiB is as far above 256 KiB in log terms as 192 KiB is below
 * it: 256/192 = 1.33 < 384/256 = 1.5).
 *
 * Invariants (established by akv_geom_init, relied on everywhere else)
 *   - every field is non-zero and within the limits below; page_tokens is a power of two;
 *   - page_bytes * n_layers (one page in every layer) fits in size_t, so sizes derived from a
 *     geometry need no further overflow checks up to that product.
 *
 * Thread-safety: a geometry is a plain value; every function here is pure.
 */
#ifndef AKV_GEOM_H
#define AKV_GEOM_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dtype.h"
#include "akv/kv_repr.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits akv_geom_init enforces ("absurd" values are configuration errors, not models). */
#define AKV_GEOM_MAX_LAYERS 4096u
#define AKV_GEOM_MAX_KV_HEADS 1024u
#define AKV_GEOM_MAX_HEAD_DIM 4096u
#define AKV_GEOM_MAX_PAGE_TOKENS 65536u
#define AKV_GEOM_MAX_PAGE_BYTES ((size_t)1 << 30) /* one page is at most 1 GiB */
#define AKV_GEOM_AUTO_PAGE_BYTES ((size_t)256 << 10) /* the size automatic P aims at */
#define AKV_GEOM_AUTO_MIN_TOKENS 16u
#define AKV_GEOM_AUTO_MAX_TOKENS 1024u

typedef struct akv_geom {
    uint32_t n_layers;    /* attention layers with a K/V history */
    uint32_t n_kv_heads;  /* K/V heads per layer */
    uint32_t head_dim;    /* elements per head row */
    uint32_t page_tokens; /* P: tokens per page, a power of two */
    akv_dtype dtype;      /* element type of the K/V history (bf16 by default) */
} akv_geom;

/* Fills *g (all-or-nothing). page_tokens = 0 chooses P automatically (see above); otherwise
 * it must be a power of two in [1, AKV_GEOM_MAX_PAGE_TOKENS]. AKV_EINVAL, logged naming the
 * field, for a zero or absurd value, an invalid dtype, or a page over AKV_GEOM_MAX_PAGE_BYTES;
 * AKV_EOVERFLOW if a derived size overflows size_t. */
/* Whether *g is a geometry akv_geom_init could have made (every field in range, P a power of
 * two): AKV_OK, else the status and log line akv_geom_init gives for it. The pools check the
 * geometry they are given with it. */
akv_status akv_geom_check(const akv_geom *g);

akv_status akv_geom_init(akv_geom *g, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                         akv_dtype dtype, uint32_t page_tokens);

/* Bits one element of a page in representation r takes, every scale included (exact: the
 * dtype's bits; akv/kv_repr.h). 0 for an invalid r or a geometry r cannot hold. */
double akv_geom_repr_bits(const akv_geom *g, akv_repr r);

/* Bytes of one page in representation r (exact: akv_geom_page_bytes). 0 for an invalid r or
 * a geometry r cannot hold (q4: a head dim that is not a power of two of at least 32). */
size_t akv_geom_repr_page_bytes(const akv_geom *g, akv_repr r);

/* Bytes of one token of one layer, K and V for all K/V heads. */
size_t akv_geom_token_bytes(const akv_geom *g);

/* Bytes of one exact page: page_tokens * akv_geom_token_bytes(g); the unit of both pools. */
size_t akv_geom_page_bytes(const akv_geom *g);

/* Elements between one token's row and the next head's (or V's) row in a page:
 * page_tokens * head_dim (the pitch of the write-back's 2D copy, in elements). */
size_t akv_geom_row_pitch(const akv_geom *g);

/* Pages one layer needs to hold n_tokens tokens: ceil(n_tokens / P) (0 for 0 tokens). */
uint64_t akv_geom_pages_for_tokens(const akv_geom *g, uint64_t n_tokens);

/* The automatic P for a given token size (exposed so tools can print how it was chosen). */
uint32_t akv_geom_auto_page_tokens(size_t token_bytes);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GEOM_H */
