/*
 * akv/forward.h — the Llama-family forward pass on the host: tokens in, logits out, attention
 * through a paged K/V history that the caller places.
 *
 * One call runs a chunk of n new tokens of ONE sequence (a prefill chunk, or n = 1 for a
 * decode step) through every layer:
 *
 *   x = embed(tokens)                                           [n][n_embd]
 *   per layer L:
 *     h = rmsnorm(x) ; q,k,v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv) ; rope(q), rope(k)
 *     pages = kv->begin_layer(L)      the layer's page table, already sized for the n new
 *                                     tokens (they are its last n positions)
 *     n = 1: append k,v into their slots, then decode attention; else causal prefill
 *            attention that writes k,v into their slots first
 *     kv->end_layer(L)                the new rows are in the pages (write-back, sealing)
 *     x += attn Wo^T ; h = rmsnorm(x) ; x += (silu(h Wg^T) * (h Wu^T)) Wd^T
 *   logits = rmsnorm(x) Wout^T                                  the last token, or every one
 *
 * The K/V of token t of the sequence sits in page indices[t / P] at slot t % P (the page
 * layout of akv/attn.h). Position = index in the sequence: the chunk's tokens are at
 * positions pos0 .. pos0+n-1 and the table must hold exactly pos0+n tokens.
 *
 * Where the pages live and how they got there (resident in a device pool, staged from the
 * host pool, written back after the layer) is the caller's: the two hooks are where a route
 * plugs in. On the host backend device addresses are host addresses, so the page table and
 * pool of a route are plain host memory.
 *
 * Thread-safety: one akv_forward per thread; the model may be shared.
 */
#ifndef AKV_FORWARD_H
#define AKV_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/attn.h"
#include "akv/model.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_forward akv_forward;

/* Where a step's attention history is, layer by layer (see the file comment). */
typedef struct akv_forward_kv {
    void *user;
    /* Fills *pages for `layer`: a table of one sequence holding pos0+n tokens, whose last n
     * slots receive the chunk's K/V. A status other than AKV_OK stops the pass. */
    akv_status (*begin_layer)(void *user, uint32_t layer, akv_attn_pages *pages);
    /* The chunk's K/V of `layer` is in its slots and the layer's attention has read the
     * pages. NULL = nothing to do. */
    akv_status (*end_layer)(void *user, uint32_t layer);
    /* 1 = begin_layer enqueues nothing (the tables are in place before the run) and hands the
     * same table at every decode step, and end_layer may run after later layers' work is
     * enqueued: the device pass may then replay a decode step as one graph and call every
     * end_layer after it (akv/forward_dev.h). 0 = the hooks run in layer order between the
     * launches (a staged route's copies and leases). The host pass ignores it. */
    int replayable;
} akv_forward_kv;

typedef struct akv_forward_params {
    uint32_t max_chunk; /* most tokens per call (scratch is sized for it); 0 = 256 */
    uint32_t n_layers;  /* run only the first n layers (tests); 0 = every layer */
    uint32_t no_graphs; /* device pass: 1 = launch every op of a decode step one by one; 0 =
                           replay decode steps as graphs where the hooks allow (forward_dev.h) */
} akv_forward_params;

/* max_chunk 256, every layer. */
akv_forward_params akv_forward_default_params(void);

/* Scratch for chunks of up to max_chunk tokens of `model` (which must outlive it).
 * AKV_EINVAL for n_layers above the model's; AKV_ENOMEM. */
akv_status akv_forward_create(const akv_model *model, const akv_forward_params *params,
                              akv_forward **out);
void akv_forward_destroy(akv_forward *f);

/* Runs tokens[n] (1 <= n <= max_chunk) at positions pos0.. through the model (see the file
 * comment). logits receives [n_vocab] floats for the last token, or [n][n_vocab] when
 * all_logits; NULL = none wanted (a prefill chunk that is not the last). AKV_EINVAL (logged)
 * for a token outside the vocabulary, a bad n or a page table of the wrong length; a hook's
 * or the attention's status otherwise. On error the pages may hold part of the chunk's K/V:
 * the caller truncates its table back to pos0 tokens. */
akv_status akv_forward_run(akv_forward *f, const int32_t *tokens, uint32_t n, uint32_t pos0,
                           const akv_forward_kv *kv, float *logits, bool all_logits);

/* The residual stream after the last run's final layer, before the output norm:
 * [n][n_embd] of that run; borrowed, valid until the next run (tests compare it). */
const float *akv_forward_hidden(const akv_forward *f);

#ifdef __cplusplus
}
#endif
#endif /* AKV_FORWARD_H */
