/*
 * tok/pretok.h — pre-tokenizers: regular-expression splitting of text into pre-tokens.
 *
 * A pre-tokenizer is a chain of 1..2 steps. Each step is a PCRE2 expression (UTF + UCP
 * mode) applied to every piece the previous step produced, with Hugging Face's "Isolated"
 * behaviour: each match is a piece and so is each stretch between matches, so no byte is
 * ever dropped. The last step's pieces go to a callback, in order.
 *
 * Invariants
 *   - The pieces handed to the callback tile the input exactly, in order, none empty.
 *   - Input must be well-formed UTF-8 (the tokenizer sanitises first); it is not rechecked.
 *
 * Thread-safety: an akv__pretok is immutable after creation; akv__pretok_split allocates
 * its own match state, so concurrent calls are safe.
 */
#ifndef AKV_TOK_PRETOK_H
#define AKV_TOK_PRETOK_H

#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"
#include "akv/tok.h"

typedef struct akv__pretok akv__pretok;

/* Receives one pre-token s[0..n), n >= 1. A non-OK status stops the split and is returned. */
typedef akv_status (*akv__pretok_fn)(void *ctx, const uint8_t *s, size_t n);

/* Compiles the expressions of `pre` (JIT when PCRE2 has it). AKV_ENOMEM, or AKV_EUNSUPPORTED
 * (logged with PCRE2's message) when this PCRE2 lacks Unicode support. */
akv_status akv__pretok_create(akv_tok_pre pre, akv__pretok **out);
void akv__pretok_destroy(akv__pretok *p);

/* Splits s[0..n) and calls fn for every pre-token. AKV_ENOMEM; AKV_EUNSUPPORTED (logged)
 * when PCRE2 gives up on a match (its match limit); or what fn returned. */
akv_status akv__pretok_split(const akv__pretok *p, const uint8_t *s, size_t n, akv__pretok_fn fn,
                             void *ctx);

/* The PCRE2 expression of step `step` of `pre`, or NULL past the last step (docs, tests). */
const char *akv__pretok_pattern(akv_tok_pre pre, int step);

#endif
