/*
 * tok/tok_impl.h — the inside of an akv_tok, shared by the tokenizer's files.
 *
 * Layout: token i's text is text[text_off[i] .. text_off[i+1] - 1) followed by a NUL; its
 * piece is piece[piece_off[i] .. piece_off[i+1]). The text map is open addressing over ids,
 * keyed by text. Specials are the ids matched in the input, grouped by their first byte:
 * special[special_start[b] .. special_start[b+1]) start with byte b, longest first.
 * byte_token[b]: BPE, the token of b's byte-level character; SPM, the token <0xNN> (else the
 * one-byte text b), the byte fallback.
 */
#ifndef AKV_TOK_TOK_IMPL_H
#define AKV_TOK_TOK_IMPL_H

#include "akv/tok.h"
#include "tok/bpe.h"
#include "tok/pretok.h"

struct akv_tok {
    size_t n_tokens;
    char *text;                /* all texts, NUL after each */
    size_t *text_off;          /* [n_tokens + 1] byte offsets into text */
    uint8_t *piece;            /* all pieces */
    size_t *piece_off;         /* [n_tokens + 1] byte offsets into piece */
    uint8_t *type;             /* [n_tokens] akv_tok_type */
    int32_t *map;              /* [map_mask + 1] text -> id; -1 = empty slot */
    size_t map_mask;           /* capacity - 1, capacity a power of two >= 2 n_tokens */
    akv__bpe_merges merges;    /* (a, b) -> (rank, ab) */
    int32_t byte_token[256];   /* byte -> its token (or the unknown token) */
    uint8_t byte_text[256][3]; /* byte -> its byte-level character: [0] = length, UTF-8 */
    int32_t *special;          /* [n_special] ids, grouped by first byte, longest first */
    size_t n_special;
    uint32_t special_start[257]; /* first-byte groups of special[] */
    akv__pretok *pretok;         /* compiled pre-tokenizer */
    akv_tok_pre pre;
    bool ignore_merges;     /* a pre-token that is a token is emitted whole (Llama 3) */
    akv_tok_specials sp;    /* special ids, add_bos / add_eos */
    size_t max_text_bytes;  /* longest token text */
    size_t max_piece_bytes; /* longest piece */
    akv_tok_model model;    /* BPE: merges and pretok; SPM: scores (tok/spm.h) */
    float *scores;          /* SPM: [n_tokens] */
    bool add_space_prefix;  /* SPM */
};

/* Validity walker: every invariant of akv/tok.h and of the layout above. */
bool akv__tok_check(const akv_tok *tok);

#endif
