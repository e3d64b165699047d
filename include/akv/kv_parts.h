/*
 * akv/kv_parts.h — what a step's attention reads of a layer's history, and the hooks through
 * which a route hands it to a forward pass: the parts, their representation and where their
 * pages lie.
 *
 * Glossary
 *   run        a stretch of one sequence's logical pages [first, first + n_pages) that share a
 *              residence and a representation: what a route's placement says of a sequence
 *              for a step (akv_route_seq_runs).
 *   residence  where a run's pages are for the step: in the device window (kept between
 *              steps), in a device slot they were staged into for this step, or only in the
 *              host pool (the host-attended route's host part: the host's cores attend them
 *              where they lie and hand the pass their states).
 *   part       a page table over the step's sequences, in batch order, in ONE representation
 *              and read by ONE attention call; its pages may come from several residences (a
 *              staged route's table mixes window pages and slot pages). Parts merge exactly:
 *              each gives (output, log-sum-exp) per head and the pass combines them with the
 *              exact merge of akv/attn.h. The passes take an exact part and past parts of older
 *              history (the compact tier's).
 *
 * Thread-safety: plain values and a table of hooks; the hooks are called on the pass's thread.
 */
#ifndef AKV_KV_PARTS_H
#define AKV_KV_PARTS_H

#include <stdint.h>

#include "akv/attn.h"
#include "akv/geom.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum akv_kv_residence {
    AKV_KV_WINDOW = 0, /* in the device pool, the sequence's window */
    AKV_KV_STAGED,     /* copied into a device slot from the host pool for this step */
    AKV_KV_HOST,       /* in the host pool only */
    AKV_KV_RESIDENCE_COUNT
} akv_kv_residence;

/* "window", "staged", "host"; "?" for another value. */
const char *akv_kv_residence_name(akv_kv_residence r);

/* A stretch of a sequence's logical pages, the same in every layer. */
typedef struct akv_kv_run {
    uint32_t first;           /* logical page */
    uint32_t n_pages;
    akv_kv_residence residence;
    akv_repr repr;
} akv_kv_run;

/* One part of a layer's history: a page table over the step's n_seq sequences, in batch
 * order, in one representation (kv.repr) and, for older history, past (kv.past). */
typedef struct akv_kv_part {
    akv_attn_pages kv;
} akv_kv_part;

enum { AKV_KV_MAX_PARTS = 4 };

/* What begin_layer is given (q, q_stride: the pass sets them) and hands the pass (the rest). */
typedef struct akv_kv_parts {
    /* in: the step's query rows of the layer, f32 [rows][q_stride] in batch order (a
     * sequence's new tokens in order), RoPE applied; complete once the compute queue's work
     * so far has run (queued) or now (direct) */
    akv_dptr q;
    uint32_t q_stride; /* floats from a row to the next */
    uint32_t n_heads;  /* query heads of a row ([n_heads][head_dim] from its start) */
    /* out: the parts the pass attends */
    uint32_t n_parts;
    akv_kv_part part[AKV_KV_MAX_PARTS];
    /* out: states of older history attended outside the pass (the host part), one row per
     * sequence (given only in a step where every sequence has one new token): f32 host_o
     * [n_seq][n_heads][head_dim] (normalised), host_lse [n_seq][n_heads] (natural log; -inf:
     * an empty state, which leaves the pass's own result bit for bit), written by work that
     * begin_layer put in the compute queue's order (queued) or before it returned (direct).
     * The pass merges them into its parts' result exactly. host_o.addr 0 = none. */
    akv_dptr host_o, host_lse;
    const uint64_t *host_tokens; /* host memory [n_seq]: each sequence's tokens in the host
                                    part (with its table's, the whole history); valid until the
                                    next begin_layer */
} akv_kv_parts;

/* Where a step's attention history is, layer by layer: a route's hooks into a forward pass. */
typedef struct akv_kv_hooks {
    void *user;
    /* Fills *parts for `layer`: tables of the step's sequences, in batch order, sequence s
     * holding pos0[s]+n_new[s] tokens, whose last n_new[s] slots receive the step's K/V. A
     * status other than AKV_OK stops the pass. */
    akv_status (*begin_layer)(void *user, uint32_t layer, akv_kv_parts *parts);
    /* The step's K/V of `layer` is in its slots and the layer's attention has read the pages.
     * NULL = nothing to do. */
    akv_status (*end_layer)(void *user, uint32_t layer);
    /* 1 = begin_layer enqueues nothing (the tables are in place before the run) and hands the
     * same tables at every decode step of the same batch, and end_layer may run after later
     * layers' work is enqueued: the device pass may then replay a decode step as one graph
     * and call every end_layer after it (akv/forward_dev.h). 0 = the hooks run in layer order
     * between the launches (a staged route's copies and leases). The host pass ignores it. */
    int replayable;
} akv_kv_hooks;

#ifdef __cplusplus
}
#endif
#endif /* AKV_KV_PARTS_H */
