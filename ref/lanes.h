/*
 * ref/lanes.h — the 8-lane sum that the host products' recipes end with (matmul.c's
 * row-invariant f32 product, qmatmul.c's block product): ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
 * (l3 + l7)), in portable C and as the AVX2 sequence that performs exactly those additions, so
 * the two agree bit for bit.
 */
#ifndef AKV_REF_LANES_H
#define AKV_REF_LANES_H

enum { AKV_LANES = 8 };

static inline float akv__lanes_sum(const float l[AKV_LANES]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static inline __attribute__((target("avx2"), always_inline)) float akv__lanes_sum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l_i + l_{i+4} */
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                 /* s0+s2, s1+s3 */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif

#endif
