/* kv_repr.c — the representations of a K/V page and their layouts (akv/kv_repr.h). */
#include "akv/kv_repr.h"

#include <string.h>

static const char *const repr_names[AKV_REPR_COUNT] = {"exact", "q8", "q4"};

const char *akv_repr_name(akv_repr r) {
    return (unsigned)r < AKV_REPR_COUNT ? repr_names[r] : "?";
}

akv_status akv_repr_from_name(const char *name, akv_repr *out) {
    for (int r = 0; name && r < AKV_REPR_COUNT; r++)
        if (!strcmp(name, repr_names[r])) return (*out = (akv_repr)r), AKV_OK;
    return AKV_EINVAL;
}

static size_t align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

akv_status akv_repr_layout_of(akv_repr r, akv_dtype exact, uint32_t n_kv_heads,
                              uint32_t page_tokens, uint32_t head_dim, akv_repr_layout *out) {
    if ((unsigned)r >= AKV_REPR_COUNT || !akv_dtype_size(exact) || !n_kv_heads || !page_tokens ||
        !head_dim)
        return AKV_EINVAL;
    akv_repr_layout l = {.repr = r};
    switch (r) {
    case AKV_REPR_EXACT: l.code_row_bytes = head_dim * (uint32_t)akv_dtype_size(exact); break;
    case AKV_REPR_Q8:
        l.group = head_dim, l.code_row_bytes = head_dim, l.scales_per_row = 1;
        break;
    case AKV_REPR_Q4:
        /* the rotation needs a power of two; a group needs whole groups */
        if (head_dim < AKV_REPR_Q4_GROUP || (head_dim & (head_dim - 1))) return AKV_EUNSUPPORTED;
        l.group = AKV_REPR_Q4_GROUP, l.code_row_bytes = head_dim / 2;
        l.scales_per_row = head_dim / AKV_REPR_Q4_GROUP, l.rotate_k = 1;
        break;
    default: return AKV_EINVAL;
    }
    /* rows of the page: 2 x n_kv_heads x P, at most 2^17 x 2^16 (no overflow in 64 bits) */
    const uint64_t rows = 2ull * n_kv_heads * page_tokens;
    const uint64_t codes = rows * l.code_row_bytes, scales = rows * l.scales_per_row * 2ull;
    if (codes / l.code_row_bytes != rows || codes > SIZE_MAX / 2 || scales > SIZE_MAX / 2)
        return AKV_EINVAL;
    if (r == AKV_REPR_EXACT) {
        l.page_bytes = (size_t)codes;
    } else {
        l.scales_offset = align16((size_t)codes);
        l.page_bytes = align16(l.scales_offset + (size_t)scales);
    }
    *out = l;
    return AKV_OK;
}

double akv_repr_bits(akv_repr r, akv_dtype exact, uint32_t head_dim) {
    akv_repr_layout l;
    if (akv_repr_layout_of(r, exact, 1, 1, head_dim, &l) != AKV_OK) return 0;
    return r == AKV_REPR_EXACT ? 8.0 * (double)akv_dtype_size(exact)
                               : 8.0 * l.code_row_bytes / head_dim + 16.0 * l.scales_per_row / head_dim;
}
