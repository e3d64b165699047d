/* geom.c — attention geometry, page size and the automatic tokens-per-page rule. */
#include "akv/geom.h"

#include "core/alloc.h"
#include "core/log.h"

uint32_t akv_geom_auto_page_tokens(size_t token_bytes) {
    const uint64_t aim = AKV_GEOM_AUTO_PAGE_BYTES; /* 2^18 */
    if (token_bytes == 0) return AKV_GEOM_AUTO_MIN_TOKENS;
    /* lo: the largest power of two with token_bytes * lo <= aim (0 if even one token is
     * larger than the aim; the clamp below then decides). */
    uint64_t lo = 0;
    if (token_bytes <= aim) {
        lo = 1;
        while (token_bytes * lo * 2 <= aim) lo *= 2;
    }
    uint64_t p = lo;
    if (lo && token_bytes * lo < aim) {
        /* Candidates a = tb*lo < aim < b = 2a. In log terms lo is at least as close as 2*lo
         * iff aim / a <= b / aim, i.e. a * b >= aim^2, i.e. 2 a^2 >= 2^36. a < 2^18 so a^2
         * fits in 64 bits. Equality (a tie) keeps lo: ties go down. */
        uint64_t a = token_bytes * lo;
        if (2 * a * a < aim * aim) p = 2 * lo;
    }
    if (p < AKV_GEOM_AUTO_MIN_TOKENS) p = AKV_GEOM_AUTO_MIN_TOKENS;
    if (p > AKV_GEOM_AUTO_MAX_TOKENS) p = AKV_GEOM_AUTO_MAX_TOKENS;
    return (uint32_t)p;
}

/* Checks one field against [1, max]; logs naming it. */
static int geom_field_ok(const char *name, uint32_t v, uint32_t max) {
    if (v == 0 || v > max) {
        AKV_LOG_E("geom: %s = %u is out of range [1, %u]", name, v, max);
        return 0;
    }
    return 1;
}

akv_status akv_geom_init(akv_geom *g, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                         akv_dtype dtype, uint32_t page_tokens) {
    if (!g) {
        AKV_LOG_E("geom: init of a NULL geometry");
        return AKV_EINVAL;
    }
    if (!geom_field_ok("n_layers", n_layers, AKV_GEOM_MAX_LAYERS) ||
        !geom_field_ok("n_kv_heads", n_kv_heads, AKV_GEOM_MAX_KV_HEADS) ||
        !geom_field_ok("head_dim", head_dim, AKV_GEOM_MAX_HEAD_DIM))
        return AKV_EINVAL;
    size_t elem = akv_dtype_size(dtype);
    if (elem == 0) {
        AKV_LOG_E("geom: dtype %d is not a valid K/V element type", (int)dtype);
        return AKV_EINVAL;
    }
    if (page_tokens != 0 && (page_tokens > AKV_GEOM_MAX_PAGE_TOKENS ||
                             (page_tokens & (page_tokens - 1)) != 0)) {
        AKV_LOG_E("geom: {=page_tokens} = %u must be a power of two in [1, %u] (or 0 = automatic)",
                  page_tokens, AKV_GEOM_MAX_PAGE_TOKENS);
        return AKV_EINVAL;
    }
    size_t token_bytes, page_bytes, all_layers;
    if (!akv__size_mul(2 * (size_t)n_kv_heads, head_dim, &token_bytes) ||
        !akv__size_mul(token_bytes, elem, &token_bytes))
        return AKV_EOVERFLOW;
    uint32_t p = page_tokens ? page_tokens : akv_geom_auto_page_tokens(token_bytes);
    if (!akv__size_mul(token_bytes, p, &page_bytes) ||
        !akv__size_mul(page_bytes, n_layers, &all_layers)) {
        AKV_LOG_E("geom: page size overflows size_t (%zu bytes per token, %u tokens per page)",
                  token_bytes, p);
        return AKV_EOVERFLOW;
    }
    if (page_bytes > AKV_GEOM_MAX_PAGE_BYTES) {
        AKV_LOG_E("geom: a page of %u tokens x %zu bytes = %zu bytes exceeds the %zu-byte limit; "
                  "lower {=page_tokens}",
                  p, token_bytes, page_bytes, AKV_GEOM_MAX_PAGE_BYTES);
        return AKV_EINVAL;
    }
    *g = (akv_geom){.n_layers = n_layers,
                    .n_kv_heads = n_kv_heads,
                    .head_dim = head_dim,
                    .page_tokens = p,
                    .dtype = dtype};
    return AKV_OK;
}

akv_status akv_geom_check(const akv_geom *g) {
    if (!g) {
        AKV_LOG_E("geom: NULL geometry");
        return AKV_EINVAL;
    }
    if (g->page_tokens == 0) {
        AKV_LOG_E("geom: {=page_tokens} = 0 (a geometry from akv_geom_init has its page size)");
        return AKV_EINVAL;
    }
    akv_geom t;
    return akv_geom_init(&t, g->n_layers, g->n_kv_heads, g->head_dim, g->dtype, g->page_tokens);
}

double akv_geom_repr_bits(const akv_geom *g, akv_repr r) {
    return akv_repr_bits(r, g->dtype, g->head_dim);
}

size_t akv_geom_repr_page_bytes(const akv_geom *g, akv_repr r) {
    akv_repr_layout l;
    return akv_repr_layout_of(r, g->dtype, g->n_kv_heads, g->page_tokens, g->head_dim, &l) == AKV_OK
               ? l.page_bytes
               : 0;
}

size_t akv_geom_token_bytes(const akv_geom *g) {
    return 2 * (size_t)g->n_kv_heads * g->head_dim * akv_dtype_size(g->dtype);
}

size_t akv_geom_page_bytes(const akv_geom *g) {
    return akv_geom_token_bytes(g) * g->page_tokens;
}

size_t akv_geom_row_pitch(const akv_geom *g) {
    return (size_t)g->page_tokens * g->head_dim;
}

uint64_t akv_geom_pages_for_tokens(const akv_geom *g, uint64_t n_tokens) {
    return n_tokens / g->page_tokens + (n_tokens % g->page_tokens != 0);
}
