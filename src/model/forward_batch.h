/*
 * model/forward_batch.h — what both forward passes do with a batch (akv/forward.h): the
 * groups of sequences their attention calls run over, and the rows each sequence owns.
 */
#ifndef AKV_MODEL_FORWARD_BATCH_H
#define AKV_MODEL_FORWARD_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "akv/forward.h"

/* Consecutive sequences s0..s1-1 of a batch attended by one call. */
typedef struct akv__fwd_group {
    uint32_t s0, s1;  /* the view of the table: sequences s0 .. s1-1 */
    uint32_t row0;    /* their first token row (rows of q, k, v and the attention output) */
    uint32_t n_rows;  /* their rows: every new token of s0..s1-1 */
    uint32_t n_new;   /* decode: the new tokens of each; prefill: the most of any */
    bool decode;      /* a decode call (n_new tokens each), else one causal prefill call */
} akv__fwd_group;

/* Cuts a checked batch into groups: each run of equal counts up to max_decode is one decode
 * group, everything after the first count above it one prefill group. Writes up to n_seq
 * groups; returns how many. */
uint32_t akv__forward_groups(const akv_forward_batch *b, uint32_t max_decode, akv__fwd_group *out);

/* The layer's parts against the pass: 1..max_parts of them (the device pass attends one, the
 * host pass an exact part and the past parts of older history); part 0 exact and the
 * queries' own (not past), any other past; every table over n_seq sequences of the model's
 * K/V heads and head dim; host states (akv_kv_parts.host_o) with their log-sum-exp, in a step
 * of n_rows = n_seq rows. AKV_EUNSUPPORTED (logged) for parts the pass cannot attend,
 * AKV_EINVAL for tables of another shape. */
akv_status akv__forward_parts_check(const akv_model_config *c, const char *who, uint32_t layer,
                                    const akv_kv_parts *parts, uint32_t n_seq, uint32_t n_rows,
                                    uint32_t max_parts);

/* The table of a group's sequences g->s0 .. g->s1-1 (a view: akv/attn.h). */
akv_attn_pages akv__forward_view(const akv_attn_pages *pg, const akv__fwd_group *g);

#endif
