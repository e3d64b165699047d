/*
 * attn/exp8.h — e^x on eight float lanes for x <= 0 (the softmax's weights, scores minus their
 * maximum), shared by the host attentions (ref/attn.c, attn/attn_host.c).
 *
 * One range reduction (x = k ln 2 + r, ln 2 in two parts, k by rounding with 1.5 * 2^23) and
 * e^r = 1 + r + r^2 P(r) with Cephes' degree-5 P (about 1.3 ulp), with no fused multiply-add
 * (the build passes -ffp-contract=off): every operation is one IEEE operation on one lane, so
 * every instruction set it is compiled for gives the same bits. Arguments below -87 (weights
 * under 1.7e-38 of the row's largest) take e^-87.
 */
#ifndef AKV_ATTN_EXP8_H
#define AKV_ATTN_EXP8_H

#include <stdint.h>

typedef float fv8 __attribute__((vector_size(32)));
typedef int32_t iv8 __attribute__((vector_size(32)));
typedef uint32_t uv8 __attribute__((vector_size(32)));

#define SM_CLAMP  (-87.0f)
#define SM_LOG2E  1.44269504088896341f
#define SM_LN2_HI 0.693359375f
#define SM_LN2_LO (-2.12194440e-4f)
#define SM_ROUND  12582912.0f /* 1.5 * 2^23: x + it rounds x to an integer in the low bits */

static inline __attribute__((always_inline)) void exp_neg8(fv8 *px) {
    fv8 x = *px;
    const fv8 lo = (fv8){0} + SM_CLAMP;
    const iv8 under = x < lo;
    x = (fv8)((under & (iv8)lo) | (~under & (iv8)x));
    const fv8 t = x * SM_LOG2E + SM_ROUND, k = t - SM_ROUND;
    const fv8 r = (x - k * SM_LN2_HI) - k * SM_LN2_LO;
    fv8 p = (fv8){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    /* 2^k from t's bits minus SM_ROUND's (unsigned: a NaN's bits shift defined) */
    const iv8 scale = (iv8)((((uv8)t - 0x4B400000u) + 127u) << 23);
    *px = p * (fv8)scale;
}

#endif
