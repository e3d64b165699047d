/* mask.h — which tokens may follow a constrained answer's text (a JSON answer, akv/engine.h's
 * formats), fast: the vocabulary's pieces in byte order, walked as a trie for the first
 * bytes, and a small cache of the masks of states already seen.
 *
 * Glossary
 *   machine    a byte-level recognizer of the answer's format: a state of `size` bytes and a
 *              feed that advances a state by some bytes, false when a byte cannot follow
 *              (akv/json_prefix.h, akv/json_schema.h). A state is a plain value: a copy of its
 *              bytes is the same state.
 *   vocab      the pieces of every token id (NULL or empty: never allowed), and their order by
 *              bytes (akv__vocab_order): ids whose pieces share a prefix are adjacent, so
 *              one feed of a prefix decides for all of them.
 *   mask       one bit a token: its whole piece may follow the state. End-of-generation
 *              tokens and the rule for a whole value are the caller's (request.c).
 *   cache      the last AKV__MASK_CACHE masks by their states' bytes: a state met again (each
 *              token inside a string leaves the same state) costs a lookup. A state holds
 *              everything its feed reads, so equal bytes give the same mask; bytes that differ
 *              only where the feed does not look cost a miss, never a wrong mask.
 *
 * Thread-safety: a cache is its owner's; the order is read-only once built. */
#ifndef AKV_ENGINE_MASK_H
#define AKV_ENGINE_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"

typedef struct akv__mask_machine {
    size_t size;                                            /* a state's bytes */
    bool (*feed)(void *state, const uint8_t *bytes, size_t n);
} akv__mask_machine;

/* The pieces: piece(user, id, &n) for id < n_vocab. */
typedef const uint8_t *(*akv__piece_fn)(const void *user, int32_t id, size_t *n);

/* A node of the trie over the pieces' first bytes: the pieces in order[lo, hi) share the
 * node's path; those in [lo, end) end at it; its children (one per next byte, in byte order)
 * are nodes[child, child + n_child) and partition [end, hi). */
typedef struct akv__vocab_node {
    uint32_t lo, end, hi;
    uint32_t child, n_child;
    uint8_t byte; /* the byte from its parent */
} akv__vocab_node;

typedef struct akv__vocab {
    akv__piece_fn piece;
    const void *user;
    uint32_t n_vocab;
    int32_t *order;          /* [n_vocab] ids by their pieces' bytes (a prefix first) */
    const uint8_t **bytes;   /* [n_vocab] in that order: each piece */
    uint32_t *len;           /* [n_vocab] ... its length (0: empty or none) */
    akv__vocab_node *nodes;  /* the trie's first levels; nodes[0] is the root */
    uint32_t n_nodes;
} akv__vocab;

/* Sorts the ids and builds the trie once (AKV_ENOMEM). */
akv_status akv__vocab_order(akv__vocab *v);
void akv__vocab_free(akv__vocab *v);

/* bits[(n_vocab + 63) / 64]: bit id set when id's piece is not empty and its whole piece may
 * follow `state`. Returns how many are set. The reference (akv__mask_ref: every piece fed to
 * a copy of the state) gives the same bits. */
uint32_t akv__mask_fill(const akv__mask_machine *m, const void *state, const akv__vocab *v,
                        uint64_t *bits);
uint32_t akv__mask_ref(const akv__mask_machine *m, const void *state, const akv__vocab *v,
                       uint64_t *bits);

enum { AKV__MASK_CACHE = 16 };

typedef struct akv__mask_cache {
    uint32_t n_words;  /* of a mask: (n_vocab + 63) / 64 */
    size_t key_bytes;
    uint8_t *keys;     /* [AKV__MASK_CACHE][key_bytes] */
    uint64_t *bits;    /* [AKV__MASK_CACHE][n_words] */
    uint64_t *used;    /* [AKV__MASK_CACHE] the lookup it last served (0: empty) */
    uint64_t clock;
    uint64_t hits, misses;
} akv__mask_cache;

akv_status akv__mask_cache_init(akv__mask_cache *c, uint32_t n_vocab, size_t key_bytes);
void akv__mask_cache_free(akv__mask_cache *c);

/* The mask of `state` (m->size == the cache's key_bytes): from the cache, or filled
 * (akv__mask_fill) into the least recently used entry. The bits stay valid until the next
 * call. */
const uint64_t *akv__mask_get(akv__mask_cache *c, const akv__mask_machine *m, const void *state,
                              const akv__vocab *v);

#endif /* AKV_ENGINE_MASK_H */
