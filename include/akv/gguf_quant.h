/*
 * akv/gguf_quant.h — converting GGUF tensor data to and from float, row by row.
 *
 * Block layouts (ggml-common.h; all little-endian, f16 = IEEE half, no padding):
 *
 *   type  elems bytes  layout                           element i of the block
 *   F32     1    4     float                            x
 *   F16     1    2     half                             x
 *   BF16    1    2     bfloat16                         x
 *   Q8_0   32   34     d:f16, qs:int8[32]               d * qs[i]
 *   Q4_0   32   18     d:f16, qs:u8[16]                 d * (nib(i) - 8)
 *   Q4_1   32   20     d:f16, m:f16, qs:u8[16]          d * nib(i) + m
 *                      nib(i) = qs[i] & 15 for i < 16, qs[i - 16] >> 4 for i >= 16
 *   Q5_0   32   22     d:f16, qh:u32, qs:u8[16]         d * (q5(i) - 16)
 *   Q5_1   32   24     d:f16, m:f16, qh:u32, qs:u8[16]  d * q5(i) + m
 *                      q5(i) = nib(i) | (bit i of qh) << 4 (decoded only: no quantiser)
 *   Q4_K  256  144     d:f16, dmin:f16, scales:u8[12],  d * sc[j] * q4(i) - dmin * mn[j],
 *                      qs:u8[128]                       j = i / 32 (8 sub-blocks of 32);
 *                      sc[j], mn[j] are 6-bit: for j < 4 the low 6 bits of scales[j] and
 *                      scales[j + 4]; for j >= 4 the low nibble (sc) / high nibble (mn) of
 *                      scales[j + 4] with 2 more bits from the top of scales[j - 4] / scales[j];
 *                      q4(i): 64-element chunk c = i / 64 uses qs[32c .. 32c + 31], low
 *                      nibbles for its first 32 elements, high nibbles for the next 32.
 *   Q5_K  256  176     d:f16, dmin:f16, scales:u8[12],  d * sc[j] * q5(i) - dmin * mn[j],
 *                      qh:u8[32], qs:u8[128]            sc, mn as Q4_K; q5(i) = q4(i) | bit j
 *                                                       of qh[i % 32], as bit 4 (j = i / 32).
 *   Q6_K  256  210     ql:u8[128], qh:u8[64],           d * scales[i / 16] * (q6(i) - 32)
 *                      scales:int8[16], d:f16           q6(i): 128-element half h, quarter
 *                      u = (i % 128) / 32, l = i % 32: low 4 bits from ql[64h + l + 32(u & 1)]
 *                      (low nibble for u < 2, high for u >= 2), high 2 bits from
 *                      qh[32h + l] >> 2u.
 *
 * Quantisers (for the writer) exist for every type above; each picks its scales from the
 * extreme values of a block (K types: of each sub-block, then the super-block's d and dmin
 * from those), so the error of one element is bounded by its step: Q8_0 <= d/2, Q4_0 <= |d|
 * (d/2 except at the far end of the range), Q4_1 <= d/2, plus the f16 rounding of the scale
 * (and the minimum); Q4_K and Q5_K <= half the sub-block's step d * sc, which is at most
 * (range + dmin) / levels + d (the range taken with 0, levels 15 or 31); Q6_K <= one step of
 * its 16 values (at the far end), at most amax / 32 + d. F16/BF16 round to nearest even.
 * The K encoders take one pass of extremes (no search for scales that lower the error, as
 * llama.cpp's quantizer does), so their error is larger than llama.cpp's on real weights.
 *
 * Thread-safety: every function here is pure and thread-safe.
 */
#ifndef AKV_GGUF_QUANT_H
#define AKV_GGUF_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/gguf.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether akv_gguf_dequant_* / akv_gguf_quantize handle `type` (an akv_gguf_type). */
bool akv_gguf_can_dequant(uint32_t type);
bool akv_gguf_can_quantize(uint32_t type);

/* Decodes `n_elems` elements of `type` starting at `src` (any alignment) into dst[n_elems].
 * n_elems must be a multiple of the type's block size (a row always is). Returns
 * AKV_EUNSUPPORTED for a type this build cannot decode, AKV_EINVAL for a bad count or NULL
 * pointer; dst is then untouched. The bf16 variant rounds each f32 value to nearest even
 * (BF16 sources are copied bit for bit). */
akv_status akv_gguf_dequant_f32(uint32_t type, const void *src, size_t n_elems, float *dst);
akv_status akv_gguf_dequant_bf16(uint32_t type, const void *src, size_t n_elems, uint16_t *dst);

/* Every element of tensor t of g as f32 into dst[t->n_elems]: a memory image's data decoded
 * in place; a file's read through akv_gguf_tensor_read in pieces of whole blocks, so a file
 * that changed since it was opened gives AKV_EIO (logged) instead of a fault. Errors as
 * akv_gguf_dequant_f32, and AKV_ENOMEM (the read buffer). */
akv_status akv_gguf_tensor_f32(const akv_gguf *g, const akv_gguf_tensor *t, float *dst);

/* Encodes src[n_elems] (a multiple of the block size) as `type` into dst, which holds
 * akv_gguf_type_bytes(type, n_elems) bytes. AKV_EUNSUPPORTED / AKV_EINVAL as above.
 * Non-finite inputs give unspecified (but in-bounds) blocks. */
akv_status akv_gguf_quantize(uint32_t type, const float *src, size_t n_elems, void *dst);

#ifdef __cplusplus
}
#endif
#endif /* AKV_GGUF_QUANT_H */
