/*
 * akv/tok.h — the tokenizer: byte-level BPE (the GGUF "gpt2" model) and SentencePiece-style
 * (the GGUF "llama" model, SPM).
 *
 * Turns UTF-8 text into token ids and back, the way Hugging Face `tokenizers` and llama.cpp
 * do for GPT-2-style vocabularies (SmolLM2, Llama 3, GPT-2, StarCoder, ...) and as llama.cpp
 * does for SentencePiece vocabularies with scores (Gemma 3, Llama 2).
 *
 * Glossary
 *   token       an entry of the vocabulary: an id in [0, n_tokens), its text and its type.
 *   byte-level  every byte 0..255 is drawn as one printable Unicode character (the GPT-2
 *               byte-to-unicode table: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves,
 *               the 68 others become U+0100..U+0143 in byte order, so ' ' is 'Ġ'). Token
 *               texts and merges are written in these characters. A complete vocabulary
 *               has a token for every byte, so no text is ever "unknown"; a byte that has
 *               none is dropped from the input (Hugging Face's BPE without unk_token and
 *               llama.cpp do the same; SmolLM2 lacks 0x04 0x06 0x13 0x14 0x16 0x1D and the
 *               lead bytes 0xF1 0xF2 of U+40000..U+BFFFF, and a warning at creation says so).
 *   merge       a pair of tokens "A B" whose concatenation AB is a token; its rank is its
 *               position in the merge list (0 merges first).
 *   pre-token   a piece of text cut out by the pre-tokenizer (a regular expression over
 *               Unicode classes); BPE runs inside each piece, never across pieces.
 *   special     a token of type CONTROL (BOS, EOS, <|im_start|>, ...) or USER_DEFINED. Its
 *               text is matched literally in the input (CONTROL only when the caller allows
 *               it, USER_DEFINED always) and is never split by BPE.
 *   piece       the bytes a token stands for: the byte-level text mapped back to bytes for
 *               normal tokens, the literal text for special tokens. A piece may be part of
 *               a UTF-8 sequence (a lone byte token).
 *
 * Encoding, step by step
 *   1. Invalid UTF-8 in the input becomes U+FFFD, one per maximal ill-formed subpart
 *      (Unicode §3.9, the WHATWG and Python "replace" rule), so encoding never fails on
 *      bytes, and decode(encode(x)) == x for every valid UTF-8 x whose bytes all have tokens.
 *   2. Special-token texts are cut out, leftmost first, longest first at a position.
 *   3. Each remaining fragment is split by the pre-tokenizer (akv_tok_pre).
 *   4. Each pre-token starts as one symbol per byte; the adjacent pair of lowest merge rank
 *      (leftmost on ties) is merged until no pair has a merge. With `ignore_merges`
 *      (llama-bpe) a pre-token that is itself a token is emitted whole first.
 *   5. BOS (and EOS) are added when the vocabulary says so and the caller asks for it.
 *
 * SPM (akv_tok_model SPM) replaces steps 3 and 4, per fragment between special tokens: a
 * space is put first when add_space_prefix is set and the fragment begins the text or follows
 * a special token (not Gemma's); every ' ' becomes U+2581 ('▁', the vocabulary's space);
 * the fragment starts as one symbol per character, and the adjacent pair whose joined text
 * is the token of highest score (leftmost on ties) is joined until no pair is a token; a
 * symbol that is no token is emitted as its bytes' tokens (<0xNN>, "byte fallback"; a byte
 * with none is dropped). No pre-tokenizer, no merges. Pieces: U+2581 back to ' ' in normal
 * tokens, a <0xNN> token (type BYTE) the one byte.
 *
 * Invariants
 *   - An akv_tok is immutable after creation; every id it returns is < n_tokens.
 *   - Every merge names tokens of the vocabulary and produces one; creation refuses anything
 *     else.
 *
 * Thread-safety: an akv_tok may be used from any number of threads at once (all functions
 * taking `const akv_tok *`). An akv_tok_ids / akv_tok_text / akv_tok_stream belongs to one
 * thread at a time.
 */
#ifndef AKV_TOK_H
#define AKV_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_tok akv_tok;
typedef struct akv_gguf akv_gguf; /* akv/gguf.h */

/* Token types, with the values GGUF's tokenizer.ggml.token_type uses. */
typedef enum akv_tok_type {
    AKV_TOK_TYPE_UNDEFINED = 0,    /* treated as NORMAL */
    AKV_TOK_TYPE_NORMAL = 1,       /* byte-level text, produced by BPE */
    AKV_TOK_TYPE_UNKNOWN = 2,      /* the unknown token; decoded like CONTROL */
    AKV_TOK_TYPE_CONTROL = 3,      /* BOS, EOS, <|im_start|>: parsed only with PARSE_SPECIAL */
    AKV_TOK_TYPE_USER_DEFINED = 4, /* literal text, always parsed out of the input */
    AKV_TOK_TYPE_UNUSED = 5,       /* byte-level text that BPE may produce; treated as NORMAL */
    AKV_TOK_TYPE_BYTE = 6,         /* treated as NORMAL (byte-level vocabularies need no <0xNN>) */
} akv_tok_type;

/* Pre-tokenizers (tokenizer.ggml.pre). The exact expressions are in docs/tok.md and
 * src/tok/pretok.c; \s below means Unicode White_Space, \p{L} letters, \p{N} numbers.
 *   GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   SMOLLM  first every \p{N} character on its own, then GPT2 inside each part
 *           (HF: Sequence[Digits(individual_digits), ByteLevel]; also StarCoder's)
 *   LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   and ignore_merges
 *   QWEN2   LLAMA3's expression with \p{N} (every digit alone) for \p{N}{1,3}, without
 *           ignore_merges (Qwen2's and Qwen3's tokenizer.json) */
typedef enum akv_tok_pre {
    AKV_TOK_PRE_GPT2 = 0,   /* "gpt2" */
    AKV_TOK_PRE_SMOLLM = 1, /* "smollm" (also "starcoder") */
    AKV_TOK_PRE_LLAMA3 = 2, /* "llama-bpe" */
    AKV_TOK_PRE_QWEN2 = 3,  /* "qwen2" */
} akv_tok_pre;

/* Tokenizer models (tokenizer.ggml.model). */
typedef enum akv_tok_model {
    AKV_TOK_MODEL_BPE = 0, /* "gpt2": byte-level BPE over pre-tokens, by merge rank */
    AKV_TOK_MODEL_SPM = 1, /* "llama": SentencePiece pairs by score, byte fallback */
} akv_tok_model;

/* Encode flags. */
enum {
    AKV_TOK_ADD_SPECIAL = 1u << 0,   /* add BOS/EOS where the vocabulary asks (add_bos/add_eos) */
    AKV_TOK_PARSE_SPECIAL = 1u << 1, /* match CONTROL token texts in the input */
};
/* Decode flags. */
enum {
    AKV_TOK_DECODE_SPECIAL = 1u << 0, /* CONTROL/UNKNOWN tokens give their text (else nothing) */
    AKV_TOK_DECODE_LOSSY = 1u << 1,   /* invalid UTF-8 in the result becomes U+FFFD */
};

/* A vocabulary given as arrays. Nothing is retained: akv_tok_create copies it all. */
typedef struct akv_tok_params {
    size_t n_tokens;            /* vocabulary size, 1 .. INT32_MAX */
    const char *const *tokens;  /* [n_tokens] token texts, byte-level UTF-8 */
    const size_t *token_bytes;  /* [n_tokens] lengths of tokens[i]; NULL: NUL-terminated */
    const int32_t *token_types; /* [n_tokens] akv_tok_type values; NULL: all NORMAL */
    size_t n_merges;            /* merges, rank = index */
    const char *const *merges;  /* [n_merges] "A B": two token texts, one space between */
    const size_t *merge_bytes;  /* [n_merges] lengths; NULL: NUL-terminated */
    akv_tok_pre pre;            /* pre-tokenizer */
    int32_t bos_id;             /* begin-of-sequence token; -1 = none */
    int32_t eos_id;             /* end-of-sequence token; -1 = none */
    int32_t eot_id;             /* end-of-turn token (Llama 3 <|eot_id|>); -1 = none */
    int32_t unk_id;             /* unknown token (reported, never emitted); -1 = none */
    int32_t pad_id;             /* padding token; -1 = none */
    bool add_bos;               /* AKV_TOK_ADD_SPECIAL puts bos_id first */
    bool add_eos;               /* AKV_TOK_ADD_SPECIAL puts eos_id last */
    akv_tok_model model;        /* BPE (merges, pre) or SPM (scores, add_space_prefix) */
    const float *scores;        /* SPM: [n_tokens] each token's score (finite); else unused */
    bool add_space_prefix;      /* SPM: a space before a fragment that begins the text or
                                   follows a special token */
} akv_tok_params;

/* Special token ids of a vocabulary; -1 where it has none. */
typedef struct akv_tok_specials {
    int32_t bos_id, eos_id, eot_id, unk_id, pad_id;
    bool add_bos, add_eos;
} akv_tok_specials;

/* A growable array of ids owned by the caller: zero-initialise, pass to akv_tok_encode
 * (which appends), free with akv_tok_ids_free. On an error nothing is appended. */
typedef struct akv_tok_ids {
    int32_t *ids; /* [n_ids] token ids */
    size_t n_ids; /* ids held */
    size_t cap;   /* capacity, in ids */
} akv_tok_ids;

/* A growable byte string owned by the caller, the same way. Always NUL-terminated once
 * anything was appended (the NUL is not counted); it may hold NUL bytes itself. */
typedef struct akv_tok_text {
    char *bytes;    /* [n_bytes] + NUL */
    size_t n_bytes; /* bytes held, not counting the NUL */
    size_t cap;     /* capacity in bytes, including room for the NUL */
} akv_tok_text;

/* Streaming decoder state: holds back the bytes of a UTF-8 sequence that a token split, so
 * that text can be shown token by token. Zero-initialise (or akv_tok_stream_reset). */
typedef struct akv_tok_stream {
    uint8_t pending[4]; /* bytes of an incomplete UTF-8 sequence, at most 3 */
    uint8_t n_pending;  /* how many */
} akv_tok_stream;

/* Defaults: no tokens, pre GPT2, every special id -1, add_bos/add_eos false. */
akv_tok_params akv_tok_default_params(void);

/* Builds a tokenizer from arrays. AKV_EINVAL (logged) for missing arrays, a special id out
 * of range or add_bos/add_eos without the id; AKV_EFORMAT (logged, naming the token or
 * merge) for a token type that is not a GGUF one, a merge that is not "A B" of two tokens
 * whose concatenation is a token; AKV_ENOMEM. Duplicate token texts keep the first id; a duplicate
 * merge keeps its first rank. Special (CONTROL, USER_DEFINED, UNKNOWN) tokens whose text is empty
 * or not valid UTF-8 are never matched in the input. */
akv_status akv_tok_create(const akv_tok_params *params, akv_tok **out);

/* Builds the tokenizer of a GGUF file from its tokenizer.ggml.* keys: model ("gpt2": BPE, with
 * pre (akv_tok_pre_from_name; `pre`, when not NULL, overrides it) and merges; "llama": SPM,
 * with scores and add_space_prefix (optional, true when absent, as llama.cpp)), tokens, token_type
 * (optional), bos/eos/eot/unknown/padding_token_id (optional; eot defaults to the first of
 * <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|> that the vocabulary has),
 * add_bos_token/add_eos_token (optional, false when absent). AKV_EUNSUPPORTED (logged) for
 * another model, a missing or unknown tokenizer.ggml.pre; AKV_EINVAL for an unknown `pre`;
 * AKV_EFORMAT (logged, naming the key) for a missing or mistyped array, an id outside the
 * vocabulary or a bad token type; then as akv_tok_create. Nothing borrowed from the file is
 * kept: the GGUF may be closed afterwards. */
akv_status akv_tok_create_from_gguf(const akv_gguf *gguf, const char *pre, akv_tok **out);

/* NULL is a no-op. */
void akv_tok_destroy(akv_tok *tok);

size_t akv_tok_n_tokens(const akv_tok *tok);
akv_tok_pre akv_tok_get_pre(const akv_tok *tok);
akv_tok_specials akv_tok_get_specials(const akv_tok *tok);
akv_tok_model akv_tok_get_model(const akv_tok *tok);

/* The type of token `id`; AKV_TOK_TYPE_UNDEFINED when id is out of range. */
akv_tok_type akv_tok_token_type(const akv_tok *tok, int32_t id);

/* The text of token `id` as the vocabulary writes it (byte-level for normal tokens), NUL-
 * terminated, borrowed until akv_tok_destroy; *n_bytes (optional) gets its length. NULL when
 * id is out of range. */
const char *akv_tok_token_text(const akv_tok *tok, int32_t id, size_t *n_bytes);

/* The piece of token `id` (the bytes it stands for; not NUL-terminated, may split a UTF-8
 * sequence), borrowed until akv_tok_destroy. NULL when id is out of range. */
const uint8_t *akv_tok_token_piece(const akv_tok *tok, int32_t id, size_t *n_bytes);

/* The id whose text is exactly text[0..n_bytes), or -1. */
int32_t akv_tok_find(const akv_tok *tok, const char *text, size_t n_bytes);

/* The longest piece of any token, in bytes. */
size_t akv_tok_max_piece_bytes(const akv_tok *tok);

/* Encodes text[0..n_bytes) (any bytes; see step 1 above) and appends the ids to *out.
 * flags: AKV_TOK_ADD_SPECIAL | AKV_TOK_PARSE_SPECIAL. AKV_ENOMEM, or AKV_EOVERFLOW when
 * the result would not fit in memory sizes; on error *out is unchanged. */
akv_status akv_tok_encode(const akv_tok *tok, const char *text, size_t n_bytes, uint32_t flags,
                          akv_tok_ids *out);

/* A stretch of a text: bytes [off, off + n_bytes). */
typedef struct akv_tok_span {
    size_t off, n_bytes;
} akv_tok_span;

/* A growable list of spans owned by the caller: zero-initialise, free with
 * akv_tok_spans_free. */
typedef struct akv_tok_spans {
    akv_tok_span *spans; /* [n] */
    size_t n, cap;
} akv_tok_spans;

/* Appends a span. AKV_ENOMEM (nothing changes). */
akv_status akv_tok_spans_push(akv_tok_spans *spans, size_t off, size_t n_bytes);
void akv_tok_spans_free(akv_tok_spans *spans); /* frees and zeroes; NULL is a no-op */

/* How akv_tok_encode_with encodes. */
typedef struct akv_tok_encode_opts {
    uint32_t flags;            /* AKV_TOK_ADD_SPECIAL | AKV_TOK_PARSE_SPECIAL */
    const akv_tok_span *plain; /* [n_plain] sorted, disjoint stretches of the text read as
                                  plain text: no CONTROL token text is matched that reaches
                                  into one (a chat message's content, so a user cannot open a
                                  turn of another role); USER_DEFINED texts still are */
    size_t n_plain;
    size_t max_ids;            /* 0 = no limit; else the call stops with AKV_EFULL (nothing
                                  appended) as soon as it would append more ids than this, and
                                  the merge loop's memory stays within about 60 bytes per
                                  byte of max_ids * akv_tok_max_piece_bytes */
} akv_tok_encode_opts;

/* akv_tok_encode with plain stretches and a limit. Invalid UTF-8 is replaced stretch by
 * stretch (between the spans' edges), so the spans keep their edges. AKV_EINVAL (logged) for
 * spans that are not sorted, disjoint and inside the text; AKV_EFULL past max_ids; then as
 * akv_tok_encode. */
akv_status akv_tok_encode_with(const akv_tok *tok, const char *text, size_t n_bytes,
                               const akv_tok_encode_opts *opts, akv_tok_ids *out);

/* Decodes ids[0..n_ids) and appends the bytes to *out. flags: AKV_TOK_DECODE_SPECIAL (emit
 * the text of CONTROL/UNKNOWN tokens; USER_DEFINED are always emitted), AKV_TOK_DECODE_LOSSY
 * (replace invalid UTF-8 by U+FFFD, as HF's ByteLevel decoder does; otherwise the raw bytes
 * come back). AKV_EINVAL (naming it) for an id out of range; on error *out is unchanged. */
akv_status akv_tok_decode(const akv_tok *tok, const int32_t *ids, size_t n_ids, uint32_t flags,
                          akv_tok_text *out);

/* Streaming decode: appends the piece of `id` to *out, except a trailing incomplete UTF-8
 * sequence, which waits in *stream for the next token. What it appends is always valid
 * UTF-8: a sequence that the next bytes prove invalid becomes U+FFFD. flags as for
 * akv_tok_decode (LOSSY is implied). AKV_EINVAL for a bad id; on error nothing changes. */
akv_status akv_tok_stream_push(const akv_tok *tok, akv_tok_stream *stream, int32_t id,
                               uint32_t flags, akv_tok_text *out);

/* Ends a stream: a held-back incomplete sequence becomes one U+FFFD. The stream is then
 * empty and can be reused. AKV_ENOMEM; on error nothing changes. */
akv_status akv_tok_stream_flush(akv_tok_stream *stream, akv_tok_text *out);

void akv_tok_stream_reset(akv_tok_stream *stream);

/* Append to / free the caller-owned buffers (append: AKV_EINVAL, logged, for a NULL text, or
 * NULL bytes with n_bytes > 0; AKV_ENOMEM / AKV_EOVERFLOW; on error nothing changes). */
akv_status akv_tok_text_append(akv_tok_text *text, const void *bytes, size_t n_bytes);
void akv_tok_text_free(akv_tok_text *text); /* frees and zeroes; NULL is a no-op */
void akv_tok_ids_free(akv_tok_ids *ids);    /* frees and zeroes; NULL is a no-op */

/* "gpt2", "smollm", "llama-bpe", "qwen2"; never NULL. */
const char *akv_tok_pre_name(akv_tok_pre pre);

/* The pre-tokenizer a GGUF tokenizer.ggml.pre name selects: "gpt2"; "smollm" and
 * "starcoder"; "llama-bpe" and "llama3". AKV_EUNSUPPORTED for any other name (not logged). */
akv_status akv_tok_pre_from_name(const char *name, akv_tok_pre *out);

#ifdef __cplusplus
}
#endif
#endif /* AKV_TOK_H */
