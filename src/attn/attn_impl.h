/*
 * attn/attn_impl.h — the attention's shared contract, which the reference (ref/attn.c) and the
 * CUDA launchers (cuda/) both implement against: validation of the host-visible parameters
 * (each logs the first bad field, naming the op and the field, and returns AKV_EINVAL), the
 * decode blocks' geometry and small helpers. The plans themselves (split, variants, tuning,
 * workspace) are public in akv/attn.h and live in attn_plan.c.
 */
#ifndef AKV_ATTN_IMPL_H
#define AKV_ATTN_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "akv/attn.h"

/* Bytes of one page of this table; false on overflow (checked by the validators). */
bool akv__attn_page_bytes(const akv_attn_pages *kv, size_t *out);

/* The layout of kv's pages (its repr over its shape): akv_repr_layout_of's status. */
akv_status akv__attn_layout(const akv_attn_pages *kv, akv_repr_layout *out);

/* log2 of page_tokens (a power of two, validated). */
unsigned akv__attn_log2(uint32_t pow2);

/* The effective score scale: p->scale, or 1/sqrt(head_dim) when 0. */
float akv__attn_scale(float scale, uint32_t head_dim);

/* Parameter validation. `op` names the caller in the log ("ref decode", "cuda prefill"). */
akv_status akv__attn_pages_check(const akv_attn_pages *kv, const char *op);
akv_status akv__attn_decode_check(const akv_attn_decode *p, const char *op);
akv_status akv__attn_prefill_check(const akv_attn_prefill *p, const char *op);
akv_status akv__attn_append_check(const akv_attn_append *p, const char *op);
akv_status akv__attn_merge_check(const akv_attn_merge *p, const char *op);
akv_status akv__attn_widen_check(const akv_attn_widen *p, const char *op);

/* The decode workspace of akv_attn_decode_workspace_bytes: byte offsets of the partial LSEs
 * and of the arrival counters (after the partial outputs at 0), and the total (all 0 when
 * the split has one partition). AKV_EOVERFLOW (logged) if it does not fit a size_t. */
akv_status akv__attn_decode_workspace_layout(const akv_attn_decode *p, const akv_attn_split *split,
                                             size_t *lse_off, size_t *cnt_off, size_t *total);

/* cp.async ring depth (tiles of 64 keys) of the CUDA decode block for head dim 64/128 and a
 * decode variant (0 for other head dims); akv_attn_decode_smem_bytes_variant follows it. */
uint32_t akv__attn_decode_stages(uint32_t head_dim, uint32_t variant);
/* Warps per CUDA decode block of a variant (4 or 8: a step is warps/4 tiles). */
uint32_t akv__attn_decode_warps(uint32_t variant);

/* Whether `t` is one of the dtypes the reference reads and writes (f32, f16, bf16). */
bool akv__attn_dtype_ok(akv_dtype t);

#endif
