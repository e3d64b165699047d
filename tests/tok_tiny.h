/*
 * tests/tok_tiny.h — a tiny byte-level vocabulary for the tokenizer's tests and fuzz target:
 * the 256 byte tokens (id = byte value) and a few extras with their merges.
 */
#ifndef AKV_TEST_TOK_TINY_H
#define AKV_TEST_TOK_TINY_H

#include <stdbool.h>
#include <string.h>

#include "akv/tok.h"

/* The test's own copy of GPT-2's byte-to-unicode table (the oracle; spot-checked in test_tok.c). */
static inline size_t byte_char(unsigned b, char out[3]) {
    unsigned cp = b, next = 256;
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) {
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) next++;
        cp = next;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

enum { MAX_EXTRA = 16 };

/* Ids 0..255 are the byte tokens (minus `skip_byte` if >= 0: then id `skip_byte` is a filler
 * "<unused>" CONTROL token); extras follow from 256. */
typedef struct tiny {
    char bytes[256][3];
    const char *texts[256 + MAX_EXTRA];
    size_t lens[256 + MAX_EXTRA];
    int32_t types[256 + MAX_EXTRA];
    akv_tok_params p;
} tiny;

static inline void tiny_init(tiny *t, const char *const *extra, const int32_t *extra_types,
                             size_t n_extra, const char *const *merges, size_t n_merges,
                             int skip_byte) {
    memset(t, 0, sizeof *t);
    for (unsigned b = 0; b < 256; b++) {
        t->lens[b] = byte_char(b, t->bytes[b]);
        t->texts[b] = t->bytes[b];
        t->types[b] = AKV_TOK_TYPE_NORMAL;
    }
    if (skip_byte >= 0) {
        t->texts[skip_byte] = "<unused>";
        t->lens[skip_byte] = 8;
        t->types[skip_byte] = AKV_TOK_TYPE_CONTROL;
    }
    for (size_t i = 0; i < n_extra; i++) {
        t->texts[256 + i] = extra[i];
        t->lens[256 + i] = strlen(extra[i]);
        t->types[256 + i] = extra_types ? extra_types[i] : AKV_TOK_TYPE_NORMAL;
    }
    t->p = akv_tok_default_params();
    t->p.n_tokens = 256 + n_extra;
    t->p.tokens = t->texts;
    t->p.token_bytes = t->lens;
    t->p.token_types = t->types;
    t->p.merges = merges;
    t->p.n_merges = n_merges;
}

/* Extras: merges build "ab", "bc", "abc", "aa", "aaaa", "Ġa"; specials follow. */
static const char *const extra[] = {"ab", "bc",           "abc",  "aa",  "aaaa",
                                    "Ġa", "<|im_start|>", "<|im", "[U]", "Ńä"};
static const int32_t extra_types[] = {1, 1, 1, 1, 1, 1, 3, 3, 4, 1};
enum { AB = 256, BC, ABC, AA, AAAA, GA, IM_START, IM, USER, ODD };
static const char *const merges_bc_first[] = {"b c", "a b", "a bc", "a a", "aa aa", "Ġ a"};
static const char *const merges_ab_first[] = {"a b", "b c", "a bc", "a a", "aa aa", "Ġ a"};

#endif
