/*
 * akv/forward.h — the Llama-family forward pass on the host: tokens in, logits out, attention
 * through a paged K/V history that the caller places.
 *
 * One call (akv_forward_step) runs ONE batch step: n_seq sequences, each with its new tokens
 * (a prefill chunk, or one token for a decode step), through every layer at once:
 *
 *   x = embed(tokens)                                         [n][n_embd], n = sum of n_new
 *   per layer L:
 *     h = rmsnorm(x) ; q,k,v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv) ; rope(q), rope(k)
 *     parts = kv->begin_layer(L)      the layer's history: a list of parts, each a page table
 *                                     over the batch (akv_kv_part), already sized for the
 *                                     new tokens (each sequence's last n_new positions)
 *     attention by groups of sequences (below): K/V of the new tokens into their slots, then
 *     decode attention, or causal prefill attention that writes them first
 *     kv->end_layer(L)                the new rows are in the pages (write-back, sealing)
 *     x += attn Wo^T ; h = rmsnorm(x) ; x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = rmsnorm(x) Wout^T                                the rows asked for
 *
 * Groups. The batch is ordered by new-token count (non-decreasing: the decodes first). The
 * products run over every row of the batch at once; the attention runs per group of
 * consecutive sequences, each group on its view of the table (akv/attn.h, "view"): one decode
 * call for every run of equal counts up to the pass's decode limit (1 on the host, where the
 * prefill path is as fast for a few rows; AKV_ATTN_MAX_QUERIES on a device), one prefill call
 * for the rest.
 *
 * Batch invariance (host pass). A sequence's logits are the same bits whatever else is in
 * its batch: the products compute every element by one fixed recipe (akv_ops_matmul_cols),
 * norms, RoPE and SwiGLU are per row, and the host attention decides everything per sequence
 * (akv_attn_host_*). So the same sequence fed the same tokens in the same chunks gives the
 * same logits alone or among others (docs/engine.md).
 *
 * Parts (akv/kv_parts.h: the hooks a route hands the pass). A part is a page table over the
 * batch in one representation of the K/V. Part 0 is exact and holds the queries' own rows;
 * the host pass takes past parts of older history beside it (the compact tier's), attends
 * each and merges them with the exact LSE merge of akv/attn.h; the device pass takes one past
 * part (akv/forward_dev.h). Anything else is refused (AKV_EUNSUPPORTED).
 *
 * The K/V of token t of a sequence sits in page indices[indptr[s] + t / P] at slot t % P (the
 * page layout of akv/attn.h). Position = index in the sequence: a sequence's new tokens are at
 * positions pos0 .. pos0+n_new-1 and the table must hold exactly pos0+n_new tokens for it.
 *
 * Where the pages live and how they got there (resident in a device pool, staged from the
 * host pool, written back after the layer) is the caller's: the two hooks are where a route
 * plugs in. On the host backend device addresses are host addresses, so the page table and
 * pool of a route are plain host memory.
 *
 * Thread-safety: one akv_forward per thread; the model may be shared. The pass's own worker
 * threads (params.threads) run its products.
 */
#ifndef AKV_FORWARD_H
#define AKV_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/attn.h"
#include "akv/kv_parts.h"
#include "akv/fwd_sample.h"
#include "akv/model.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_forward akv_forward;

/* Which logits of a sequence a step computes. */
typedef enum akv_forward_logits {
    AKV_FORWARD_LOGITS_NONE = 0, /* none (a prefill chunk that is not the prompt's last) */
    AKV_FORWARD_LOGITS_LAST = 1, /* its last new token's */
    AKV_FORWARD_LOGITS_ALL = 2,  /* every new token's */
    AKV_FORWARD_LOGITS_ARGMAX = 3, /* its last new token's greedy choice: the row is computed
                                      (it takes a row of `logits`, as LAST) and the first id of
                                      its largest logit goes to chosen[s] (NaN and -inf never
                                      chosen; -1 when every logit is one: akv_fwd_argmax_ref);
                                      the device pass leaves the row's values on the device
                                      (that row of `logits` is not written) */
    AKV_FORWARD_LOGITS_SAMPLE = 4, /* its last new token's draw by sample[s] (akv/fwd_sample.h,
                                      the host sampler's law) goes to chosen[s], as ARGMAX
                                      (-1 when no logit is a candidate); the penalties change
                                      the row, which the device pass leaves on the device */
} akv_forward_logits;

/* The most penalised tokens one SAMPLE draw may carry (a repeat_last_n of up to this many
 * always fits). */
#define AKV_FORWARD_SAMPLE_PEN_MAX 256

/* One batch step: n_seq sequences and their new tokens. */
typedef struct akv_forward_batch {
    uint32_t n_seq;          /* >= 1 */
    const uint32_t *n_new;   /* [n_seq] new tokens of each, >= 1, non-decreasing */
    const uint32_t *pos0;    /* [n_seq] position of each sequence's first new token */
    const int32_t *tokens;   /* [sum n_new] the new tokens, sequence after sequence */
    const uint8_t *logits;   /* [n_seq] akv_forward_logits of each; NULL = LAST for every one */
    int32_t *chosen;         /* [n_seq] out: the ARGMAX and SAMPLE sequences' tokens (the others'
                                entries untouched); required when one asks for either */
    const akv_fwd_sample_row *sample; /* [n_seq] the SAMPLE sequences' draws (the others'
                                entries unread); required when one asks for SAMPLE */
    const int32_t *pen;      /* [2][n_pen] the draws' penalised ids (distinct within a row),
                                then their counts; sample[s].pen_off indexes them */
    uint32_t n_pen;
} akv_forward_batch;

typedef struct akv_forward_params {
    uint32_t max_step_tokens; /* most tokens per step, every sequence's together (scratch is
                                 sized for it); 0 = 256 */
    uint32_t max_logits; /* device pass: most logit rows per step; 0 = max_step_tokens */
    uint32_t n_layers;   /* run only the first n layers (tests); 0 = every layer */
    uint32_t no_graphs;  /* device pass: 1 = launch every op of a decode step one by one; 0 =
                            replay decode steps as graphs where the hooks allow (forward_dev.h) */
    uint32_t threads;    /* host pass: threads of the products, the caller's included; 0 =
                            one per online core */
    akv_attn_tuning attn; /* device pass: every decode's tuning (zero: the default) */
    akv_weights weights;  /* device pass: NATIVE (0) keeps a matrix in its block format where
                             the device has a product for it (akv/forward_ops.h: every block
                             format of akv/ops.h), BF16 widens every matrix; the host pass
                             stores what its model stores */
    akv_ops_wtype synthetic_type; /* device pass, synthetic weights: the matrices' format (a
                             block format of akv/ops.h); 0 = bf16 */
} akv_forward_params;

/* max_step_tokens 256, every layer, a thread per core. */
akv_forward_params akv_forward_default_params(void);

/* Scratch for steps of up to max_step_tokens tokens of `model` (which must outlive it), and the
 * pass's threads. AKV_EINVAL for n_layers above the model's or more than 1024 threads;
 * AKV_ENOMEM. */
akv_status akv_forward_create(const akv_model *model, const akv_forward_params *params,
                              akv_forward **out);
void akv_forward_destroy(akv_forward *f);

/* Runs one batch step (see the file comment). logits receives, in sequence order, the rows
 * b->logits asks for ([n_vocab] floats each); NULL = none computed. AKV_EINVAL (logged) for
 * a token outside the vocabulary, a bad batch (no sequence, a count of 0, counts that
 * decrease, more than max_step_tokens tokens, a position past 2^31) or a page table of the wrong
 * shape or length; AKV_EUNSUPPORTED for more than one part or a representation the pass does
 * not read; a hook's or the attention's status otherwise. On error the pages may hold part of
 * the step's K/V: the caller truncates each table back to its pos0 tokens. */
akv_status akv_forward_step(akv_forward *f, const akv_forward_batch *b, const akv_kv_hooks *kv,
                            float *logits);

/* The step of one sequence: tokens[n] (1 <= n <= max_step_tokens) at positions pos0..; logits of
 * the last token, or of every one when all_logits; NULL = none. */
akv_status akv_forward_run(akv_forward *f, const int32_t *tokens, uint32_t n, uint32_t pos0,
                           const akv_kv_hooks *kv, float *logits, bool all_logits);

/* Sequence s's logits mode (akv_forward_logits; modes NULL: LAST), and the rows of logits a
 * mode of a sequence of n_new new tokens takes (n_new for ALL, 1 for LAST, ARGMAX and SAMPLE). */
static inline uint8_t akv_forward_batch_mode(const akv_forward_batch *b, uint32_t s) {
    return b->logits ? b->logits[s] : (uint8_t)AKV_FORWARD_LOGITS_LAST;
}
static inline uint32_t akv_forward_mode_rows(uint8_t mode, uint32_t n_new) {
    return mode == AKV_FORWARD_LOGITS_ALL ? n_new : mode != AKV_FORWARD_LOGITS_NONE;
}

/* Rows of logits a batch asks for (its sum over sequences: 1 for LAST, ARGMAX and SAMPLE, n_new for
 * ALL). */
uint32_t akv_forward_batch_logit_rows(const akv_forward_batch *b);

/* Checks a batch against a pass's limits (the rules of akv_forward_step, every token id in
 * [0, n_vocab) among them; logged naming what is wrong): AKV_OK or AKV_EINVAL. *n_tokens =
 * its total new tokens. */
akv_status akv_forward_batch_check(const akv_forward_batch *b, uint32_t max_step_tokens,
                                   uint32_t n_vocab, const char *who, uint32_t *n_tokens);

/* The residual stream after the last step's final layer, before the output norm:
 * [n][n_embd] of that step (every sequence's rows in order); borrowed, valid until the next
 * step (tests compare it). */
const float *akv_forward_hidden(const akv_forward *f);

#ifdef __cplusplus
}
#endif
#endif /* AKV_FORWARD_H */
