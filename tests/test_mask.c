/* test_mask.c (unit) — a constrained answer's token mask (src/engine/mask.h): the trie walk
 * over the pieces in byte order gives the reference's bits (every piece fed to a copy of the
 * state) on a synthetic vocabulary of awkward pieces (empty and missing ones, duplicates,
 * prefix chains, every single byte, UTF-8 and invalid bytes, long pieces) at every prefix of
 * valid and invalid JSON texts; the cache gives the same bits, hits a state met again, and
 * evicts the least recently used. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "akv/json_prefix.h"
#include "engine/mask.h"

enum { NV = 4000 };

typedef struct vocab_src {
    uint8_t *bytes[NV];
    size_t n[NV];
} vocab_src;

static const uint8_t *src_piece(const void *user, int32_t id, size_t *n) {
    const vocab_src *s = user;
    *n = s->n[id];
    return s->bytes[id];
}

static void vocab_make(vocab_src *s, uint64_t *rng) {
    static const char alpha[] = "{}[]:,\"\\ \t\n0123456789-+.eEtrufalsn abcxyz/";
    memset(s, 0, sizeof *s);
    for (int id = 0; id < NV; id++) {
        size_t n;
        if (id < 256) n = 1;                              /* every byte alone */
        else if (id % 97 == 0) n = 0;                     /* empty (some with no bytes at all) */
        else n = 1 + test_rand_below(rng, id % 5 == 0 ? 24 : 6);
        if (n == 0 && id % 2) continue; /* NULL piece */
        s->bytes[id] = malloc(n + 1);
        s->n[id] = n;
        for (size_t i = 0; i < n; i++) {
            const uint64_t r = test_rand_below(rng, 100);
            s->bytes[id][i] = id < 256   ? (uint8_t)id
                              : r < 85   ? (uint8_t)alpha[test_rand_below(rng, sizeof alpha - 1)]
                              : r < 95   ? (uint8_t)(0xC3 + (r & 1) * 0x2A) /* UTF-8 lead bytes */
                                         : (uint8_t)test_rand_below(rng, 256);
        }
        /* duplicates and prefix chains of an earlier piece */
        if (id > 300 && id % 11 == 0 && s->n[id - 7] && s->bytes[id - 7]) {
            const size_t k = s->n[id - 7] - (id % 3 == 0 && s->n[id - 7] > 1);
            free(s->bytes[id]);
            s->bytes[id] = malloc(k + 1);
            memcpy(s->bytes[id], s->bytes[id - 7], k);
            s->n[id] = k;
        }
    }
}

static bool feed_prefix(void *state, const uint8_t *bytes, size_t n) {
    return akv_json_prefix_feed(state, bytes, n);
}

int main(int argc, char **argv) {
    test_args(argc, argv);
    uint64_t rng = test_seed(11);
    static vocab_src src;
    vocab_make(&src, &rng);
    akv__vocab v = {.piece = src_piece, .user = &src, .n_vocab = NV};
    CHECK_OK(akv__vocab_order(&v));
    const akv__mask_machine m = {sizeof(akv_json_prefix), feed_prefix};
    static const char *texts[] = {
        "{\"name\": \"Fel\\u00e9ix \\\"the\\\" cat\", \"a\": [1, -2.5e+3, true, null], \"o\": {}}",
        "[{\"k\":[[],[{}]]}, \"x\", 0.25, false]",
        "{\"bad\": tru", /* a literal cut */
        "  {\"n\" : -0.0E-2 , \"s\":\"\\/\\b\\n\"}  ",
        "{\"x\": 01}", /* invalid: a leading zero */
    };
    const size_t W = (NV + 63) / 64;
    uint64_t fast[W], ref[W];
    uint32_t n_states = 0, n_differ = 0, prev_set = 0;
    TEST_CASE(trie_walk_gives_the_reference_bits) {
        for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++)
            for (int only = 0; only < 2; only++) {
                akv_json_prefix p;
                akv_json_prefix_init(&p, only);
                const size_t len = strlen(texts[t]);
                for (size_t i = 0; i <= len; i++) {
                    const uint32_t a = akv__mask_fill(&m, &p, &v, fast);
                    const uint32_t b = akv__mask_ref(&m, &p, &v, ref);
                    n_states++;
                    TEST_CHECK_(a == b && !memcmp(fast, ref, sizeof fast),
                                "text %zu at %zu (object only %d): %u against %u allowed", t, i,
                                only, a, b);
                    n_differ += a != prev_set;
                    prev_set = a;
                    if (i == len || !akv_json_prefix_feed(&p, (const uint8_t *)texts[t] + i, 1)) break;
                }
            }
        printf("  %u states, the allowed count changed %u times\n", n_states, n_differ);
        CHECK(n_states > 150 && n_differ > 40); /* the states are not all alike */
    }
    TEST_CASE(cache_hits_a_state_again_and_evicts_the_least_recent) {
        akv__mask_cache c;
        CHECK_OK(akv__mask_cache_init(&c, NV, m.size));
        akv_json_prefix st[AKV__MASK_CACHE + 2];
        static const char deep[] = "[[[[[[[[[[[[[[[[[[[[[[[[";
        for (int k = 0; k < AKV__MASK_CACHE + 2; k++) { /* distinct states: k + 1 arrays open */
            akv_json_prefix_init(&st[k], false);
            CHECK(akv_json_prefix_feed(&st[k], (const uint8_t *)deep, (size_t)k + 1));
        }
        for (int k = 0; k < AKV__MASK_CACHE; k++) {
            const uint64_t *bits = akv__mask_get(&c, &m, &st[k], &v);
            akv__mask_ref(&m, &st[k], &v, ref);
            CHECK(!memcmp(bits, ref, sizeof ref));
        }
        CHECK(c.hits == 0 && c.misses == AKV__MASK_CACHE);
        /* state 0 again: a hit, the same bits (a copy of its bytes: a plain value) */
        akv_json_prefix again = st[0];
        const uint64_t *bits = akv__mask_get(&c, &m, &again, &v);
        akv__mask_ref(&m, &st[0], &v, ref);
        CHECK(c.hits == 1 && !memcmp(bits, ref, sizeof ref));
        /* two new states evict 1 and 2 (0 was used last): 0 still hits, 1 misses */
        akv__mask_get(&c, &m, &st[AKV__MASK_CACHE], &v);
        akv__mask_get(&c, &m, &st[AKV__MASK_CACHE + 1], &v);
        const uint64_t h = c.hits, mi = c.misses;
        bits = akv__mask_get(&c, &m, &st[0], &v);
        CHECK(c.hits == h + 1 && !memcmp(bits, ref, sizeof ref));
        bits = akv__mask_get(&c, &m, &st[1], &v);
        akv__mask_ref(&m, &st[1], &v, ref);
        CHECK(c.misses == mi + 1 && !memcmp(bits, ref, sizeof ref));
        akv__mask_cache_free(&c);
    }
    akv__vocab_free(&v);
    for (int id = 0; id < NV; id++) free(src.bytes[id]);
    return test_finish();
}
