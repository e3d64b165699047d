/*
 * akv/dtype.h — element types of K/V history, activations and weights in memory.
 *
 * (Quantised weight formats of GGUF files have their own enum in the GGUF reader; this one
 * is for dense arrays that kernels read element by element.)
 */
#ifndef AKV_DTYPE_H
#define AKV_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_dtype {
    AKV_DTYPE_F32 = 0,
    AKV_DTYPE_F16 = 1,
    AKV_DTYPE_BF16 = 2,
    AKV_DTYPE_COUNT
} akv_dtype;

/* Bytes per element; 0 for an invalid value. */
static inline size_t akv_dtype_size(akv_dtype t) {
    switch (t) {
    case AKV_DTYPE_F32: return 4;
    case AKV_DTYPE_F16: return 2;
    case AKV_DTYPE_BF16: return 2;
    default: return 0;
    }
}

/* "f32", "f16", "bf16"; "?" for an invalid value. */
static inline const char *akv_dtype_name(akv_dtype t) {
    switch (t) {
    case AKV_DTYPE_F32: return "f32";
    case AKV_DTYPE_F16: return "f16";
    case AKV_DTYPE_BF16: return "bf16";
    default: return "?";
    }
}

#ifdef __cplusplus
}
#endif
#endif
