/*
 * core/hash.h — a fast 64-bit checksum of bytes, to tell a damaged or truncated file (a saved
 * session) from a whole one. Not cryptographic: it detects accidents, not forgeries.
 *
 * Streaming: h = akv_hash64_init(); h = akv_hash64_add(h, bytes, n) ... in any pieces gives the
 * same value as one call over their concatenation only when every piece but the last is a
 * multiple of 8 bytes (what its users feed: headers padded to 8, rows of whole elements).
 */
#ifndef AKV_CORE_HASH_H
#define AKV_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t akv_hash64_init(void) {
    return 0x9e3779b97f4a7c15ull;
}

static inline uint64_t akv_hash64_mix(uint64_t x) {
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t akv_hash64_add(uint64_t h, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h = (h << 29) | (h >> 35);
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i);
        h = akv_hash64_mix(h ^ w ^ ((uint64_t)(n - i) << 56));
    }
    return h;
}

static inline uint64_t akv_hash64_final(uint64_t h, uint64_t total_bytes) {
    return akv_hash64_mix(h ^ total_bytes);
}

/* The checksum of one block of n bytes in eight independent lanes (each 8-byte word i goes to
 * lane i mod 8, as akv_hash64_add's chain), folded into one value with n: several times the
 * chain's rate, since the lanes' multiplies overlap. Not streaming: a block is hashed whole
 * (a saved session's layer). */
static inline uint64_t akv_hash64_block(const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    uint64_t lane[8];
    for (int k = 0; k < 8; k++) lane[k] = akv_hash64_init() + (uint64_t)k;
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 8; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, 8);
            const uint64_t h = (lane[k] ^ w) * 0x100000001b3ull;
            lane[k] = (h << 29) | (h >> 35);
        }
    uint64_t h = akv_hash64_add(akv_hash64_init(), p + i, n - i); /* the tail, as a chain */
    for (int k = 0; k < 8; k++) h = akv_hash64_mix(h ^ lane[k]);
    return akv_hash64_final(h, n);
}

#endif /* AKV_CORE_HASH_H */
