/*
 * tok/spm.h — the SentencePiece-style loop of akv/tok.h (model SPM): pairs joined by score.
 *
 * Glossary
 *   symbol  a stretch of the escaped fragment (' ' written U+2581); it starts as one character
 *           and grows by absorbing its right neighbour.
 *   pair    two adjacent symbols whose joined text is a token; its priority is that token's
 *           score (higher first), then the left symbol's position (leftmost first).
 *
 * The loop (one fragment between special tokens): every adjacent pair that is a token goes
 * into a max-heap; pop the best; skip it when stale (either symbol has changed or is gone);
 * otherwise join the right symbol into the left and push the two pairs the result forms with
 * its neighbours. Then each symbol is emitted: its token, or, when it is no token (only a
 * single character can be: a joined symbol always is one), its bytes' tokens. This is
 * llama.cpp's llm_tokenizer_spm order; its re-segmentation of a symbol that is no token never
 * applies to valid UTF-8 (every input here is), so it is not needed.
 */
#ifndef AKV_TOK_SPM_H
#define AKV_TOK_SPM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"
#include "akv/tok.h"

/* The loop's memory, reused across fragments of one encode; zero-initialise, free with
 * akv__spm_scratch_free. */
typedef struct akv__spm_scratch {
    uint8_t *text; /* the escaped fragment */
    size_t cap_text;
    struct akv__spm_sym *sym;
    size_t cap_sym;
    struct akv__spm_pair *heap;
    size_t cap_heap, n_heap;
} akv__spm_scratch;

void akv__spm_scratch_free(akv__spm_scratch *sc);

/* Receives each id in order; a nonzero status stops the fragment and is returned. */
typedef akv_status (*akv__spm_emit_fn)(void *ctx, int32_t id);

/* Encodes s[0..n) (valid UTF-8, no special token in it) with tok's SPM vocabulary: a space
 * first when space_prefix, then the loop above. */
akv_status akv__spm_encode(const akv_tok *tok, const uint8_t *s, size_t n, bool space_prefix,
                           akv__spm_scratch *sc, akv__spm_emit_fn emit, void *ctx);

#endif
