/*
 * core/rng.h — a small seeded random generator (splitmix64): reproducible across platforms,
 * so a seed names a sampling run exactly. Not for cryptography.
 */
#ifndef AKV_CORE_RNG_H
#define AKV_CORE_RNG_H

#include <stdint.h>

#include "core/hash.h"

typedef struct akv_rng {
    uint64_t state;
} akv_rng;

static inline uint64_t akv_rng_next(akv_rng *r) {
    return akv_hash64_mix(r->state += 0x9E3779B97F4A7C15ull); /* splitmix64's finaliser */
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double akv_rng_uniform(akv_rng *r) {
    return (double)(akv_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
