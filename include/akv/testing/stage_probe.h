/*
 * akv/testing/stage_probe.h — the "stage_probe" op: an attention stand-in that proves what a staged
 * attention saw.
 *
 * For each sequence it first writes the new tokens' K/V rows (as a decode step's K/V append
 * does) into the page that holds them, then reads every row of tokens [0, n_tokens) through
 * the page list, exactly those rows, and compares a checksum with the one the caller computed
 * from the value formula below. A page staged one event too late, a slot overwritten one event
 * too early, a write-back that never reached the host copy: each changes what the op reads,
 * and the op counts a mismatch in device memory. Used by the staging tests on both backends.
 *
 * Values: the element (kv, h, t, i) of a sequence with seed s, token t, element index
 * e = (kv * n_kv_heads + h) * head_dim + i, is akv_stage_probe_value(s, t, e) (16 bits: the
 * probe needs 2-byte elements, i.e. bf16 or f16 geometry). The checksum of a sequence is the
 * wrapping sum over its tokens and elements of akv_stage_probe_term(t, e, value): order-free but
 * bound to each position, so swapped pages and stale rows both show.
 *
 * AKV_STAGE_PROBE_FN qualifies the formula functions (cuda/stage_probe.cu redefines it to
 * compile them for the device too); elsewhere they are static inline.
 */
#ifndef AKV_STAGE_PROBE_H
#define AKV_STAGE_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AKV_STAGE_PROBE_MAX_SEQ   8  /* sequences per launch */
#define AKV_STAGE_PROBE_MAX_PAGES 64 /* pages per sequence */

typedef struct akv_stage_probe_seq {
    uint64_t seed;       /* the sequence's value seed */
    uint64_t expected;   /* checksum of tokens [0, n_tokens) computed by the caller */
    uint32_t n_tokens;   /* tokens to check, the new ones included: 1..n_pages * P */
    uint32_t n_pages;    /* pages in token order: ceil(n_tokens / P) */
    uint32_t new_token0; /* tokens [new_token0, new_token0 + n_new) are written first */
    uint32_t n_new;      /* 0 = write nothing */
    uint32_t page_ids[AKV_STAGE_PROBE_MAX_PAGES]; /* device pool page ids, token order */
} akv_stage_probe_seq;

typedef struct akv_stage_probe_args {
    akv_dptr base;   /* device pool base: page k at base + k * page_bytes */
    akv_dptr result; /* uint64_t[4] in device memory: mismatches, sequences checked,
                        last mismatching checksum (got), its expected value */
    uint32_t n_kv_heads, head_dim, page_tokens; /* the geometry; 2-byte elements */
    uint32_t n_seq;                             /* 1..AKV_STAGE_PROBE_MAX_SEQ */
    akv_stage_probe_seq seq[AKV_STAGE_PROBE_MAX_SEQ];
} akv_stage_probe_args;

extern const akv_dev_op akv_stage_probe_op;

#ifndef AKV_STAGE_PROBE_FN
#define AKV_STAGE_PROBE_FN static inline
#endif

AKV_STAGE_PROBE_FN uint64_t akv_stage_probe_mix(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

AKV_STAGE_PROBE_FN uint16_t akv_stage_probe_value(uint64_t seed, uint32_t t, uint32_t e) {
    return (uint16_t)akv_stage_probe_mix(seed ^ ((uint64_t)t << 32 | e) * 0x9E3779B97F4A7C15ull);
}

/* Position of element e of token t in a page [2][H][P][D] (elements): e = (kv * H + h) * D + i
 * lies at ((kv * H + h) * P + t % P) * D + i. */
AKV_STAGE_PROBE_FN size_t akv_stage_probe_at(uint32_t head_dim, uint32_t page_tokens, uint32_t t,
                                             uint32_t e) {
    return ((size_t)(e / head_dim) * page_tokens + t % page_tokens) * head_dim + e % head_dim;
}

AKV_STAGE_PROBE_FN uint64_t akv_stage_probe_term(uint32_t t, uint32_t e, uint16_t v) {
    return akv_stage_probe_mix(((uint64_t)t << 40) ^ ((uint64_t)e << 16) ^ v);
}

/* The checksum a sequence of seed `seed` has over tokens [0, n_tokens) when every row holds
 * its formula value (what the caller passes as `expected`). */
AKV_STAGE_PROBE_FN uint64_t akv_stage_probe_expected(uint64_t seed, uint32_t n_tokens,
                                                     uint32_t n_kv_heads, uint32_t head_dim) {
    uint64_t sum = 0;
    uint32_t n_e = 2 * n_kv_heads * head_dim;
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t e = 0; e < n_e; e++)
            sum += akv_stage_probe_term(t, e, akv_stage_probe_value(seed, t, e));
    return sum;
}

#ifdef __cplusplus
}
#endif
#endif /* AKV_STAGE_PROBE_H */
