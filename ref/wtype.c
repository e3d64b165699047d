/* wtype.c — the weight formats' geometry and names (akv/ops.h): elements and bytes per
 * block, bytes per row. No other dependency, so the model (and its fuzzer) can size rows
 * without the products. */
#include "akv/ops.h"

enum { QB = AKV_OPS_QBLOCK, QK = 256 };

/* Elements and bytes of one block of each format (GGUF's). */
static size_t wt_block(akv_ops_wtype t, size_t *bytes) {
    size_t e = 0, b = 0;
    switch (t) {
    case AKV_OPS_W_F32:
        e = 1, b = 4;
        break;
    case AKV_OPS_W_BF16:
        e = 1, b = 2;
        break;
    case AKV_OPS_W_Q8_0:
        e = QB, b = 2 + QB;
        break;
    case AKV_OPS_W_Q4_0:
        e = QB, b = 2 + QB / 2;
        break;
    case AKV_OPS_W_Q4_1:
        e = QB, b = 4 + QB / 2;
        break;
    case AKV_OPS_W_Q5_0:
        e = QB, b = 2 + 4 + QB / 2;
        break;
    case AKV_OPS_W_Q5_1:
        e = QB, b = 4 + 4 + QB / 2;
        break;
    case AKV_OPS_W_Q4_K:
        e = QK, b = 4 + 12 + QK / 2;
        break;
    case AKV_OPS_W_Q5_K:
        e = QK, b = 4 + 12 + QK / 8 + QK / 2;
        break;
    case AKV_OPS_W_Q6_K:
        e = QK, b = QK / 2 + QK / 4 + QK / 16 + 2;
        break;
    }
    if (bytes) *bytes = b;
    return e;
}

size_t akv_ops_wblock_elems(akv_ops_wtype t) {
    return wt_block(t, NULL);
}

size_t akv_ops_wblock_bytes(akv_ops_wtype t) {
    size_t bytes;
    wt_block(t, &bytes);
    return bytes;
}

size_t akv_ops_wrow_bytes(akv_ops_wtype t, size_t k) {
    size_t bytes, e = wt_block(t, &bytes);
    return e && k && k % e == 0 ? k / e * bytes : 0;
}

const char *akv_ops_wtype_name(akv_ops_wtype t) {
    switch (t) {
    case AKV_OPS_W_F32:
        return "f32";
    case AKV_OPS_W_BF16:
        return "bf16";
    case AKV_OPS_W_Q8_0:
        return "q8_0";
    case AKV_OPS_W_Q4_0:
        return "q4_0";
    case AKV_OPS_W_Q4_1:
        return "q4_1";
    case AKV_OPS_W_Q5_0:
        return "q5_0";
    case AKV_OPS_W_Q5_1:
        return "q5_1";
    case AKV_OPS_W_Q4_K:
        return "q4_K";
    case AKV_OPS_W_Q5_K:
        return "q5_K";
    case AKV_OPS_W_Q6_K:
        return "q6_K";
    }
    return "?";
}
