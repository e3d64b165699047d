/*
 * attn/attn_host_run.h — a batch of host parts (akv/attn_host.h) over a pool of the host's
 * threads: what a route runs for a step's layer. Internal: the pool is core's (core/par.h).
 *
 * Every chunk of every part is one task (part, K/V head, chunk), claimed by any thread; each
 * (part, K/V head)'s chunk states are then merged in chunk order (akv_attn_merge_state), so
 * the result is one fixed recipe per part, the same bits on any pool and thread count.
 */
#ifndef AKV_ATTN_HOST_RUN_H
#define AKV_ATTN_HOST_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "akv/attn_host.h"
#include "core/par.h"

/* Floats of scratch akv__attn_host_run needs for these parts (their chunk states, and where
 * each part's tasks begin). */
size_t akv__attn_host_scratch_floats(const akv_attn_host_part *parts, uint32_t n);

/* The states of parts[0..n) (each checked by akv_attn_host_part_check: AKV_EINVAL, nothing
 * written): o [n][n_heads][head_dim], lse [n][n_heads], the rows of part i from i * n_heads
 * (every part has the first's n_heads and head_dim, else AKV_EINVAL); a part with no page
 * gives the empty state (o 0, lse -inf). scratch holds akv__attn_host_scratch_floats(parts,
 * n) floats (it allocates nothing). par NULL runs every task on the caller. */
akv_status akv__attn_host_run(const akv_attn_host_part *parts, uint32_t n, akv_attn_host_isa isa,
                              akv_par *par, float *scratch, float *o, float *lse);

#endif
