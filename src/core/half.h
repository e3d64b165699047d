/*
 * core/half.h — conversions between float and the 16-bit formats (bf16, IEEE f16), on the
 * host. Bit-exact with the CUDA intrinsics' round-to-nearest-even (__float2bfloat16_rn,
 * __float2half_rn), so reference and device agree on every rounding. NaN stays NaN.
 */
#ifndef AKV_CORE_HALF_H
#define AKV_CORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t akv__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float akv__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float akv_bf16_to_f32(uint16_t h) {
    return akv__f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest, ties to even; NaN is kept quiet (never rounded into Inf). */
static inline uint16_t akv_f32_to_bf16(float f) {
    uint32_t u = akv__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float akv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return akv__f32_from_bits(sign);
        /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        man &= 0x3ffu;
        return akv__f32_from_bits(sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13));
    }
    if (exp == 31) return akv__f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf/nan */
    return akv__f32_from_bits(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* Round to nearest, ties to even, with subnormals and overflow to Inf. */
static inline uint16_t akv_f32_to_f16(float f) {
    uint32_t u = akv__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* overflow -> Inf */
    if (a < 0x38800000u) {                                           /* subnormal or zero */
        if (a < 0x33000000u) return sign;                            /* < half the least */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 113 - (int)(a >> 23) + 13;                       /* 14..24 */
        uint32_t half_bits = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_bits & 1u))) half_bits++;
        return (uint16_t)(sign | half_bits);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15, keep 23-bit mantissa */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

#endif
