/*
 * tok/bpe.h — the merge table and the merge loop of byte-level BPE.
 *
 * Glossary
 *   merge table  a hash map (a, b) -> (rank, result) over token ids: merging adjacent symbols
 *                a and b gives token `result`; lower rank merges first.
 *   symbol       a token in a word being merged; it starts as one byte's token.
 *
 * The loop (one pre-token): put every adjacent pair that has a merge in a min-heap keyed by
 * (rank, position of the left symbol); pop the best; skip it when stale (either symbol has
 * changed or is gone); otherwise merge the right symbol into the left one and push the two
 * new pairs it forms with its neighbours. This is Hugging Face's and llama.cpp's order
 * (lowest rank first, leftmost on ties) in O(n log n) for an n-byte pre-token.
 *
 * Invariants
 *   - Every symbol alive after the loop is a token id of the vocabulary or a byte without a
 *     token (-1), which is left out of the output.
 *   - Keys are unique: the first (lowest-rank) entry of a pair wins.
 */
#ifndef AKV_TOK_BPE_H
#define AKV_TOK_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"
#include "akv/tok.h"

typedef struct akv__bpe_slot {
    uint64_t key;   /* (a << 32) | b; UINT64_MAX = empty */
    int32_t rank;   /* position in the merge list */
    int32_t result; /* token id of ab */
} akv__bpe_slot;

typedef struct akv__bpe_merges {
    akv__bpe_slot *slots; /* [mask + 1], open addressing, linear probing */
    size_t mask;          /* capacity - 1; capacity is a power of two >= 2 n_max */
    size_t n;             /* entries held */
} akv__bpe_merges;

/* Room for n_max merges. AKV_ENOMEM / AKV_EOVERFLOW. */
akv_status akv__bpe_merges_init(akv__bpe_merges *m, size_t n_max);
void akv__bpe_merges_deinit(akv__bpe_merges *m);

/* Adds (a, b) -> (rank, result); false (and nothing changes) when (a, b) is already there.
 * The table must have room (at most n_max adds). */
bool akv__bpe_merges_add(akv__bpe_merges *m, int32_t a, int32_t b, int32_t rank, int32_t result);

/* Looks (a, b) up; false when the pair has no merge. */
bool akv__bpe_merges_find(const akv__bpe_merges *m, int32_t a, int32_t b, int32_t *rank,
                          int32_t *result);

/* Per-call working memory of the merge loop, reused across words; zero-initialise. */
typedef struct akv__bpe_scratch {
    struct akv__bpe_sym *syms;
    size_t cap_syms;
    struct akv__bpe_pair *heap;
    size_t cap_heap;
} akv__bpe_scratch;

void akv__bpe_scratch_free(akv__bpe_scratch *sc);

/* Merges w[0..n) (n >= 1), whose bytes start as the symbols byte_token[w[i]] (-1: a byte
 * without a token, which never merges and is left out), and appends the resulting ids to
 * *out. AKV_ENOMEM / AKV_EOVERFLOW (out may then hold part of the word; the
 * caller restores it). */
akv_status akv__bpe_word(const akv__bpe_merges *m, const int32_t byte_token[256], const uint8_t *w,
                         size_t n, akv__bpe_scratch *sc, akv_tok_ids *out);

#endif
