/*
 * akv/attn.h — attention over a paged K/V history: decode (split-KV), causal prefill, the
 * write of new tokens' K/V into their page slots, and the exact merge of partial states.
 *
 * Two implementations share these parameter structs:
 *   akv_attn_ref_*   plain C (ref/), FP32 accumulation; the host backend's implementation
 *                    and the test oracle (with float64 variants for the tests).
 *   akv_attn_cuda_*  CUDA (cuda/), bf16 in, FP32 accumulation, tensor cores. Declared here
 *                    without CUDA types; defined only in builds with the CUDA backend
 *                    (AKV_HAVE_CUDA). A stream is a `void *` (the CUDA stream handle; NULL = the
 *                    default stream). Launchers enqueue and return: they never synchronise.
 *
 * Glossary
 *   page        P consecutive tokens of one layer of one context, K and V for all K/V
 *               heads: page[2][n_kv_heads][P][head_dim], index 0 = K, 1 = V; element
 *               (kv, h, t, i) at ((kv*n_kv_heads + h)*P + t)*head_dim + i. Page id k of a
 *               pool lies at pool + k*page_bytes, page_bytes = 2*n_kv_heads*P*head_dim*elem.
 *               A compact page (kv.repr q8 or q4) holds the same rows as codes and scales
 *               (akv/kv_repr.h) and its own page_bytes; a reader decodes each row as
 *               akv_kvq_read_row does, and where the form rotates K (q4) it rotates the
 *               query by the same transform (akv_kvq_fwht), so every score is q.k of the
 *               decoded rows.
 *   part        one table of a layer's history: a history may be read as several (an exact
 *               part of recent pages and a compact part of older ones), each call giving
 *               states (o, lse) that merge exactly (akv_attn_merge_state). A part of older
 *               history (kv.past) has every key before every query.
 *   page table  CSR, one layer, n_seq sequences: indptr[n_seq+1], indices (sequence s's page
 *               ids, oldest first, at indices[indptr[s]] .. indices[indptr[s+1]-1]),
 *               last_page_len[n_seq] (1..P; 0 only for a sequence with no page). indptr[0]
 *               need not be 0: sequences k..k+m-1 of a table are themselves a table (indptr
 *               + k, last_page_len + k, n_seq = m, the same indices), a *view*: the forward
 *               pass hands each attention call the view of its sequences. Sequence s holds len_s = (n_pages_s - 1)*P + last_page_len[s]
 *               tokens at positions 0..len_s-1.
 *   capacity    max_pages: the most pages any sequence of the table may own. It is the one
 *               input, with the device, of the split-KV partitioning (akv_attn_split_plan).
 *   GQA         n_heads query heads share n_kv_heads K/V heads; n_heads = group*n_kv_heads
 *               and query head j reads K/V head j / group (consecutive heads share).
 *   new queries The queries of a call are the LAST tokens of their sequence: for a sequence
 *               of len tokens with n new queries, query q (0-based) sits at position
 *               len - n + q and sees keys 0..len-n+q (causal). So in decode with 4 queries the
 *               later queries see more keys, and a prefill chunk is the same rule with n =
 *               chunk length. The table must already include the new tokens: their K/V is
 *               written first (akv_attn_*_append, or the prefill's k_new/v_new).
 *   state       a partial attention result of one query row over some set of keys: the
 *               normalised output o[head_dim] and lse.
 *
 * LSE convention (every lse here): natural logarithm of sum_t exp(score_t), where
 * score_t = scale * dot(q, k_t) and scale is 1/sqrt(head_dim) unless set. An EMPTY state (no
 * key visible: a sequence of length 0, a query before the first key, an empty partition)
 * is lse = -INFINITY with o = 0; merging with it changes nothing, and it never makes a NaN.
 *
 * Merge (exact, associative up to FP32 rounding):
 *   lse = m + log(exp(lse_a - m) + exp(lse_b - m)), m = max(lse_a, lse_b);
 *   o = o_a*exp(lse_a - lse) + o_b*exp(lse_b - lse).
 *
 * Split-KV decode (CUDA): the keys of each (sequence, K/V head) are cut into n_parts
 * partitions of part_tokens consecutive positions (akv_attn_split_plan). The cut depends
 * only on the capacity, the batch size, the geometry and the device (SM count, shared
 * memory, and for the CUDA cluster merge how many clusters it holds) — never on where pages
 * physically lie or on the lengths. The arithmetic inside a partition and the merge order
 * are fixed, so the same page contents give the same bits whether the pages are resident or
 * staged, and wherever the sequence sits in a batch of the same size, as long as max_pages
 * is the same. Partitions past a sequence's length are skipped. The merge of the partitions
 * runs inside the decode kernel (the last block of a sequence and head to finish merges
 * them in partition order, or, for a lone sequence's few partitions on sm_90, the
 * partitions' cluster through shared memory): one launch per call.
 *
 * Invariants
 *   - Every call validates the host-visible parameters and returns AKV_EINVAL (logged,
 *     naming the field) before touching memory. The ref functions also validate the page
 *     table (akv_attn_table_check); the CUDA launchers cannot read it (device memory) and
 *     trust it: the caller checks its host copy.
 *   - Outputs are all-or-nothing only as far as validation goes: once launched, a kernel
 *     writes every output element (the tests poison outputs to prove it).
 *   - Pages that receive new tokens' K/V must not be shared between sequences.
 *
 * Thread-safety: every function is reentrant; calls on distinct outputs may run in
 * parallel (host) or on different streams (CUDA).
 */
#ifndef AKV_ATTN_H
#define AKV_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "akv/dev.h"
#include "akv/dtype.h"
#include "akv/kv_repr.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    AKV_ATTN_MAX_QUERIES = 4,      /* new queries per sequence in decode */
    AKV_ATTN_MAX_PAST_QUERIES = 8192, /* queries per sequence of a decode over a past part (a
                                         prompt chunk reading its older history) */
    AKV_ATTN_MAX_HEAD_DIM = 256,   /* ref; the CUDA kernels take 64 and 128 */
    AKV_ATTN_TILE_TOKENS = 64,     /* keys per CUDA tile; partitions are multiples of it */
    AKV_ATTN_MAX_PARTS = 1024,     /* most split-KV partitions per (sequence, K/V head) */
    AKV_ATTN_DECODE_VARIANTS = 3,  /* decode configurations (akv_attn_tuning.variant) */
};

/* A paged K/V history of one layer for a batch of n_seq sequences. */
typedef struct akv_attn_pages {
    akv_dptr pool;          /* page pool base; page id k at pool + k*page_bytes */
    akv_dptr indptr;        /* int32 [n_seq + 1], indptr[0] >= 0, non-decreasing */
    akv_dptr indices;       /* int32 [indptr[n_seq]] page ids < n_pages, oldest first */
    akv_dptr last_page_len; /* int32 [n_seq], 1..page_tokens; 0 iff the sequence has no page */
    uint32_t n_seq;         /* sequences in the batch; 0 = nothing to do */
    uint32_t n_pages;       /* pages in the pool (the bound for page ids) */
    uint32_t max_pages;     /* capacity: most pages any sequence may own (>= 1) */
    uint32_t n_kv_heads;    /* K/V heads (>= 1) */
    uint32_t head_dim;      /* elements per head row: ref 1..256 (multiple of 8 on CUDA
                               appends), CUDA attention 64 or 128 */
    uint32_t page_tokens;   /* P, tokens per page: a power of two, 1..65536 */
    akv_dtype dtype;        /* element type of the exact pages (a compact table's exact
                               form): ref f32/f16/bf16; CUDA bf16 */
    uint32_t repr;          /* akv_repr of the pages (akv/kv_repr.h): 0 = exact, in dtype;
                               q8/q4 = compact pages of that layout, read in place (ref, host
                               and the CUDA decode, pages of at least 8 tokens there; the CUDA
                               prefill refuses them: akv_attn_widen makes them exact) */
    uint32_t past;          /* 1 = every key of the table precedes every query (a part of
                               older history: no causal mask inside it, and nothing of the
                               call is written to it); 0 = the queries are the table's last
                               tokens (the causal rule of the file comment) */
    uint32_t reserved;      /* 0; fills what would be padding: the device pass compares
                               argument structs byte for byte (graph records) */
} akv_attn_pages;

/* The decode's tuning: how the split-KV decode plans and launches, for A/B measurement.
 * Zero is the default, the configuration measured best on the H200 (docs/attention.md); the
 * engine takes one in its params (engine.attn) and the device pass puts it in every decode's
 * arguments, so nothing process-wide chooses it. */
typedef struct akv_attn_tuning {
    uint32_t variant;    /* AKV_ATTN_VARIANT_AUTO (0): by batch size (akv_attn_decode_variant_for);
                            AKV_ATTN_VARIANT(v): variant v (0..AKV_ATTN_DECODE_VARIANTS-1) */
    uint32_t waves;      /* waves of blocks a batch's split aims at, 1..16; 0 = 1 */
    uint32_t max_parts;  /* a cap on the partition count, 1..AKV_ATTN_MAX_PARTS; 0 = none */
    uint32_t no_cluster; /* CUDA: 1 = never merge in thread-block clusters; 0 = where they fit */
} akv_attn_tuning;
#define AKV_ATTN_VARIANT_AUTO 0u
#define AKV_ATTN_VARIANT(v) ((uint32_t)(v) + 1u)

/* AKV_EINVAL (logged) for a variant, waves or max_parts out of range. NULL is the default. */
akv_status akv_attn_tuning_check(const akv_attn_tuning *t);

/* Decode: n_query (1..4) new queries per sequence, all already in the table. */
typedef struct akv_attn_decode {
    akv_attn_pages kv;
    uint32_t n_heads;  /* query heads, a multiple of kv.n_kv_heads */
    uint32_t n_query;  /* new queries per sequence, 1..AKV_ATTN_MAX_QUERIES; over a past part
                          (kv.past) 1..AKV_ATTN_MAX_PAST_QUERIES (a prompt chunk) */
    akv_dptr q;        /* [n_seq][n_query] rows of [n_heads][head_dim], q_dtype */
    akv_dtype q_dtype; /* f32 or bf16 (also f16 in the ref); CUDA rounds q to bf16 */
    uint32_t q_stride; /* elements from one query token's row to the next; 0 = n_heads*head_dim */
    akv_dptr o;        /* [n_seq][n_query][n_heads][head_dim], o_dtype: the normalised output */
    akv_dtype o_dtype; /* f32 or bf16 (also f16 in the ref) */
    akv_dptr lse;      /* f32 [n_seq][n_query][n_heads] (natural log); 0 = not wanted */
    float scale;       /* score scale; 0 = 1/sqrt(head_dim); else finite and > 0 */
    /* CUDA (the ref ignores it): true when no kernel enqueued on the stream since its last
     * copy, memset or event wait writes the page tables or the keys below the queries' own
     * positions (< len - n_query; the queries' rows may be written there, e.g. by
     * akv_attn_cuda_append). Kernels in that span may still run, or have ended without their
     * writes being visible yet, when this one starts: the decode, a programmatic dependent
     * of the stream's previous kernel, looks up its pages and loads its first such keys
     * before it waits for that kernel; q, the queries' rows and the workspace always wait.
     * A copy, memset or event wait makes the next launch wait in full. false: every read
     * waits. */
    bool prefetch_history;
    akv_attn_tuning tuning; /* how the CUDA decode plans and launches (zero: the default) */
} akv_attn_decode;

/* Causal prefill of a chunk of new tokens per sequence over its history and itself. The
 * table includes the chunk: the chunk's tokens are the last n_s positions of sequence s. */
/* Which CUDA prefill kernel runs (akv_attn_prefill.kernel; docs/attention.md "Prefill"); the
 * host and reference paths ignore it. */
typedef enum akv_attn_prefill_kernel {
    AKV_ATTN_PREFILL_AUTO = 0,  /* wgmma where it can run, else mma.sync */
    AKV_ATTN_PREFILL_MMA = 1,   /* warp-level mma.sync: every device, head_dim 64 and 128 */
    AKV_ATTN_PREFILL_WGMMA = 2, /* warpgroup products: an sm_90a build on a compute capability 9
                                   device, head_dim 128; elsewhere AKV_EUNSUPPORTED */
    AKV_ATTN_PREFILL_KERNELS = 3,
} akv_attn_prefill_kernel;

typedef struct akv_attn_prefill {
    akv_attn_pages kv;
    uint32_t n_heads;     /* query heads, a multiple of kv.n_kv_heads */
    akv_dptr qo_indptr;   /* int32 [n_seq + 1]: chunk rows of sequence s are
                             qo_indptr[s] .. qo_indptr[s+1]-1, qo_indptr[0] = 0 */
    uint32_t n_tokens;    /* qo_indptr[n_seq]: rows of q, o, lse, k_new, v_new */
    uint32_t max_chunk;   /* >= the longest chunk (CUDA sizes its grid from it) */
    akv_dptr q;           /* [n_tokens] rows of [n_heads][head_dim], q_dtype */
    akv_dtype q_dtype;    /* f32 or bf16 (also f16 in the ref) */
    uint32_t q_stride;    /* elements between token rows of q; 0 = n_heads*head_dim */
    akv_dptr k_new;       /* [n_tokens] rows of [n_kv_heads][head_dim], kv_new_dtype: the
                             chunk's K, written into its page slots before attending;
                             0 (with v_new 0) = already in the pages */
    akv_dptr v_new;       /* same shape, V */
    akv_dtype kv_new_dtype; /* f32 or the page dtype */
    uint32_t kv_stride;   /* elements between token rows of k_new/v_new; 0 = n_kv_heads*head_dim */
    akv_dptr o;           /* [n_tokens][n_heads][head_dim], o_dtype */
    akv_dtype o_dtype;
    akv_dptr lse;         /* f32 [n_tokens][n_heads]; 0 = not wanted */
    float scale;          /* 0 = 1/sqrt(head_dim) */
    uint32_t kernel;      /* akv_attn_prefill_kernel (0 = AUTO) */
} akv_attn_prefill;

/* Write new tokens' K/V into their page slots (decode's tail write, a prefill chunk). The
 * table already includes them: sequence s's n_s new tokens take positions len_s-n_s..len_s-1. */
typedef struct akv_attn_append {
    akv_attn_pages kv;
    akv_dptr qo_indptr;   /* int32 [n_seq + 1] rows per sequence; 0 = uniform n_per_seq */
    uint32_t n_per_seq;   /* with qo_indptr 0: every sequence has this many new tokens */
    uint32_t n_tokens;    /* rows of k/v (= qo_indptr[n_seq], or n_seq*n_per_seq) */
    uint32_t max_new;     /* >= the most new tokens of any sequence (CUDA grid) */
    akv_dptr k;           /* [n_tokens] rows of [n_kv_heads][head_dim], dtype */
    akv_dptr v;           /* same shape */
    akv_dtype dtype;      /* f32 or the page dtype; converted with round-to-nearest-even */
    uint32_t stride;      /* elements between token rows; 0 = n_kv_heads*head_dim */
} akv_attn_append;

/* Merge two arrays of partial states row by row: out = merge(a, b). */
typedef struct akv_attn_merge {
    uint32_t n_rows;      /* states per array */
    uint32_t head_dim;
    akv_dptr o_a, lse_a;  /* f32 [n_rows][head_dim], f32 [n_rows] */
    akv_dptr o_b, lse_b;  /* same */
    akv_dptr o;           /* [n_rows][head_dim], o_dtype; may be o_a or o_b when f32 */
    akv_dtype o_dtype;    /* f32 or bf16 (also f16 in the ref) */
    akv_dptr lse;         /* f32 [n_rows]; may be lse_a or lse_b; 0 = not wanted */
} akv_attn_merge;

/* Widen: pages of a compact past part as exact pages of the same rows, for the kernels that
 * read exact pages only (the CUDA prefill: a prompt chunk is bound by its products, and a
 * page is widened in one pass over its bytes). Each row is akv_kvq_read_row's, a rotated K
 * row rotated back (akv_kvq_fwht is its own inverse), rounded to kv.dtype (nearest even).
 * Sequence s of kv gives its pages first .. first + max_out - 1 (those it has), in order, to
 * out pages o_s, o_s + 1, ..., o_s = the pages the sequences before it give; the call writes
 * the out table over the same n_seq: out_indptr[s] = o_s (out_indptr[0] = 0), out_indices[o]
 * = o, out_last[s] = its last widened page's length (kv's last_page_len where the range
 * reaches the sequence's last page, else page_tokens; 0 where it gives none). So the out
 * table (pool out_pool, exact, past) holds the widened keys of each sequence, and its states
 * merge with the other parts'. */
typedef struct akv_attn_widen {
    akv_attn_pages kv;    /* a compact past part (q8 or q4) */
    uint32_t first;       /* each sequence's first page to widen */
    uint32_t max_out;     /* pages a sequence gives at most (>= 1) */
    akv_dptr out_pool;    /* n_seq * max_out exact pages of kv.dtype (the exact page layout) */
    akv_dptr out_indptr;  /* int32 [n_seq + 1], written */
    akv_dptr out_indices; /* int32 [n_seq * max_out], written as far as the pages given */
    akv_dptr out_last;    /* int32 [n_seq], written */
} akv_attn_widen;

/* The split-KV partitioning of decode (see the file comment). */
typedef struct akv_attn_split {
    uint32_t part_tokens; /* keys per partition: a multiple of AKV_ATTN_TILE_TOKENS */
    uint32_t n_parts;     /* partitions per (sequence, K/V head): ceil(capacity/part_tokens) */
} akv_attn_split;

/* The address of host memory as an akv_dptr, for the ref functions (on the host backend,
 * device addresses are host addresses, so its allocations can be passed as they are). */
static inline akv_dptr akv_attn_host_ptr(const void *p) {
    akv_dptr d = {(uint64_t)(uintptr_t)p};
    return d;
}

/* ---- plans and checks (plain C, every build) ------------------------------------------ */

/* The split-KV partitioning for a batch of n_seq sequences with a capacity of capacity_tokens
 * keys each (max_pages*page_tokens) on a device with n_sm multiprocessors and smem_per_block
 * bytes of shared memory a block may opt into (akv_dev_info's fields). The rule, for head
 * dim d:
 *   blocks_per_sm = clamp(smem_per_block / akv_attn_decode_smem_bytes_variant(d, v), 1, 4)
 *   fill          = floor(blocks_per_sm * n_sm / n_kv_heads) (at least 1) for a single
 *                   sequence: one wave and no block of a second (every partition is merge
 *                   work on its critical path); over a batch
 *                   min(ceil(blocks_per_sm * n_sm / n_kv_heads),
 *                       ceil(waves * blocks_per_sm * n_sm / (n_kv_heads * n_seq))),
 *                   `waves` = 1 (t->waves overrides it, and t->max_parts caps n_parts,
 *                   for tuning); chosen by measurement, docs/attention.md
 *   min_part      = 128 keys (two tiles: what a block puts in flight before its first wait)
 *   n_parts       = clamp(ceil(capacity / min_part), 1, min(fill, AKV_ATTN_MAX_PARTS))
 *   step          = 64 keys x warps/4 (a step of the variant's block: 128 for variant 0)
 *   part_tokens   = round_up(ceil(capacity / n_parts), step); n_parts = ceil(capacity / part_tokens)
 * There is no limit on the number of keys: a partition grows with the capacity.
 * AKV_EINVAL for zero inputs or a head dim other than 64/128; AKV_EUNSUPPORTED when the
 * device's shared memory cannot hold one decode block. */
akv_status akv_attn_split_plan(uint64_t capacity_tokens, uint32_t n_seq, uint32_t n_kv_heads,
                               uint32_t head_dim, uint32_t n_sm, size_t smem_per_block,
                               const akv_attn_tuning *t, akv_attn_split *out);

/* The same plan for an explicit decode variant (akv_attn_split_plan uses
 * akv_attn_decode_variant_fit(t, n_seq, head_dim, smem_per_block)): a function of its
 * arguments only (t: its waves and max_parts; NULL = the default). Variants 0 and 1 follow the rule above with their own blocks_per_sm and step;
 * variant 2 takes floor instead of ceil in `fill` over a batch too and, drops a last round of blocks that would be under half full:
 *   rounds = ceil(n_parts * n_kv_heads * n_seq / (blocks_per_sm * n_sm)); if the last round
 *   holds fewer than half the slots, n_parts = floor((rounds-1) * slots / (n_kv_heads * n_seq)).
 * AKV_EINVAL also for a variant >= AKV_ATTN_DECODE_VARIANTS. */
akv_status akv_attn_split_plan_variant(uint64_t capacity_tokens, uint32_t n_seq, uint32_t n_kv_heads,
                                       uint32_t head_dim, uint32_t n_sm, size_t smem_per_block,
                                       const akv_attn_tuning *t, uint32_t variant,
                                       akv_attn_split *out);

/* Shared memory one CUDA decode block of a variant uses for head dim 64 or 128 (0 for others
 * and for a variant out of range). */
size_t akv_attn_decode_smem_bytes_variant(uint32_t head_dim, uint32_t variant);

/* Decode variants: alternative CUDA decode configurations, for A/B measurement.
 *   0  blocks of 8 warps taking two 64-key tiles per step, a cp.async ring of 3 steps at
 *      d=128 (200 KiB: one block per SM on an H100/H200), 4 at d=64 (132 KiB, one per SM);
 *      partitions are whole steps (128 keys).
 *   1  blocks of 4 warps, one tile per step, a ring of 2 tiles at d=128 (3 blocks per SM), 3
 *      at d=64 (4 blocks per SM); the plan's blocks_per_sm follows the shared memory.
 *   2  variant 1's blocks, and the whole-rounds split (akv_attn_split_plan_variant).
 * Every variant gives results within the same tolerance of the float64 reference, bitwise
 * reproducible and independent of page placement; variants differ from each other in the
 * last bits (another split, another merge order).
 * A decode's tuning (akv_attn_tuning.variant) forces one or leaves AUTO, which picks per call
 * (akv_attn_decode_variant_for): variant 0 for a single sequence, 2 for a batch, as measured
 * on the H200 (docs/attention.md: a lone sequence's time after its key loop is the merge of
 * its partitions, which 8-warp blocks halve at the same streaming rate; at batch 8 variant 2
 * is up to 17 % faster at d=128 than 4-warp blocks with 3 tiles). The choice depends on the batch
 * size only, never on page placement, so resident and staged runs of one batch agree
 * bitwise. A plan, a workspace size and its zeroing hold for one tuning: re-plan, re-size
 * and re-zero after changing it. */
/* The variant a decode of n_seq sequences runs under t (NULL = the default): the forced one,
 * or AUTO's choice. t must pass akv_attn_tuning_check. */
uint32_t akv_attn_decode_variant_for(const akv_attn_tuning *t, uint32_t n_seq);
/* The same on a device whose blocks may opt into smem_per_block bytes of shared memory: under
 * AUTO, variant 2 (the smallest block) where the choice's block does not fit (variant 0 takes
 * 200 KiB at d=128: H100/H200 hold it, an A100's 163 KiB does not). akv_attn_split_plan and
 * the CUDA decode plan and launch with it. */
uint32_t akv_attn_decode_variant_fit(const akv_attn_tuning *t, uint32_t n_seq, uint32_t head_dim,
                                     size_t smem_per_block);

/* Device workspace a CUDA decode with these parameters and this split needs (partial
 * outputs and LSEs of every partition, and one arrival counter per sequence, K/V head and
 * 16 query rows); 0 when n_parts is 1 (no merge). AKV_EOVERFLOW if it does not fit a
 * size_t. */
akv_status akv_attn_decode_workspace_bytes(const akv_attn_decode *p, const akv_attn_split *split,
                                           size_t *out);

/* Validity walker for a page table held in host memory (the arrays kv->indptr etc. point
 * at): indptr starts at 0 and never decreases; each sequence owns at most max_pages pages;
 * ids are < n_pages; last_page_len is 1..P for a sequence with pages and 0 without. Logs
 * the first violation and returns AKV_EINVAL; never writes. Duplicate ids are allowed
 * (shared, read-only prefix pages). */
akv_status akv_attn_table_check(const akv_attn_pages *kv);

/* ---- reference (ref/, host memory) ---------------------------------------------------- */
/* Every address in the parameters is read as a host address. Each function validates the
 * parameters and the table first (AKV_EINVAL, nothing written). FP32 accumulation; the
 * float64 variants accumulate in double and write double outputs with the shapes of o/lse
 * (the struct's o/lse fields are then ignored). */

akv_status akv_attn_ref_decode(const akv_attn_decode *p);
akv_status akv_attn_ref_decode_f64(const akv_attn_decode *p, double *o, double *lse);

/* Writes k_new/v_new into the pages (when given), then attends. */
akv_status akv_attn_ref_prefill(const akv_attn_prefill *p);
akv_status akv_attn_ref_prefill_f64(const akv_attn_prefill *p, double *o, double *lse);

/* AKV_EINVAL also when a sequence has fewer tokens than new rows. */
akv_status akv_attn_ref_append(const akv_attn_append *p);

akv_status akv_attn_ref_merge(const akv_attn_merge *p);

/* AKV_EINVAL also for a table that is not a compact past part. */
akv_status akv_attn_ref_widen(const akv_attn_widen *p);

/* The exact merge of one state into another, in place: (o_a, *lse_a) = merge(a, b), over
 * head_dim elements. An empty b leaves a bit-identical; an empty a becomes b exactly. */
void akv_attn_merge_state(uint32_t head_dim, float *o_a, float *lse_a, const float *o_b,
                          float lse_b);

/* ---- CUDA launchers (cuda/; builds with AKV_HAVE_CUDA) -------------------------------- */
/* Each validates, enqueues on `stream` (NULL = default) on the current CUDA device, checks
 * the launch, and returns: AKV_EINVAL (bad parameters, logged), AKV_EUNSUPPORTED (a valid
 * shape the kernels do not take: head dim other than 64/128, pages not bf16, f16 queries or
 * outputs; named in the log), AKV_EDEVICE (a CUDA error).
 * Device properties (SM count, shared memory) are read from the current device. */

/* Split-KV decode. `workspace` holds akv_attn_decode_workspace_bytes() bytes for the split
 * of akv_attn_cuda_decode_split() (it may be 0 when that is 0), 256-byte aligned. Zero it
 * (every byte) once before its first call: it holds arrival counters that every completed
 * call leaves at zero again, so a workspace is zeroed once, not per call (a workspace from
 * a failed launch must be zeroed again, and so must one used before by a decode of another
 * layout: another n_seq, split or n_query moves the counters onto bytes that held partial
 * states). One workspace must not be shared by calls in flight at the same time. The kernel
 * is launched as a programmatic dependent of the stream's previous kernel (its blocks may be
 * scheduled while that kernel finishes; they wait for its completion before touching memory,
 * but for what p->prefetch_history allows them to read early) and lets the next one be
 * scheduled once its key loops are done. akv_attn_cuda_append is launched the same way and lets its dependent start
 * at once, so a decode right after the append of its queries' rows prefetches while the
 * append waits for its own predecessor and writes. */
akv_status akv_attn_cuda_decode(const akv_attn_decode *p, akv_dptr workspace,
                                size_t workspace_bytes, void *stream);

/* Cluster merge: where a call decodes one sequence, its split has 2..8 partitions, its rows
 * (GQA group x n_query) are at most 16 and the device (compute capability 9+, with a build
 * for it) holds all its clusters at once, the partitions of each K/V head run as one
 * thread-block cluster and merge through their shared memory, not the workspace (which such
 * a call leaves untouched, though it is still sized and required as for any split: the
 * other merge uses it). On by default; p->tuning.no_cluster turns it off (A/B, tests). The
 * choice depends on
 * the split, batch, geometry and device, never on page placement; the two merges agree to
 * rounding, not bitwise. "Device" includes how many clusters it holds, which depends on
 * how its multiprocessors are grouped: two units of one model may differ there and so
 * choose differently near the limit (ranks that must agree bitwise turn it off). */
/* The cluster size a CUDA decode with these parameters launches with on the current device:
 * its partition count when it merges in clusters, else 1. */
akv_status akv_attn_cuda_decode_cluster_size(const akv_attn_decode *p, uint32_t *out);

/* The split a CUDA decode with these parameters uses on the current device. */
akv_status akv_attn_cuda_decode_split(const akv_attn_decode *p, akv_attn_split *out);

/* A profiling build's view of the last decode launch (cmake -DAKV_ATTN_TIMELINE=ON: thread
 * 0 of every block stamps the global timer and its multiprocessor's clock at 6 points;
 * AKV_EUNSUPPORTED in a normal build). Points: 0 block start, 1 first key tile landed, 2 key
 * loop done, 3 output or partial state written, 4 arrival counted (split only), 5 merge done
 * (only the block that merged); a point not reached reads 0. A cluster-merged call stamps 4
 * when its first cluster barrier is passed and 5 after its second (its merge done), in every
 * used block. `ns` from %globaltimer (comparable across blocks), `clk` from clock64 (durations
 * within a block). Fills up to `max` blocks in grid order (x fastest); *n_blocks = the grid
 * size of that launch. Synchronises the device. */
typedef struct akv_attn_timeline_block {
    uint64_t ns[6], clk[6];
    uint32_t smid;
} akv_attn_timeline_block;
akv_status akv_attn_cuda_decode_timeline(akv_attn_timeline_block *out, uint32_t max, uint32_t *n_blocks);

/* Chunked causal prefill: writes k_new/v_new into the pages (when given), then attends
 * (flash-attention style, no key split: route chunks of <= 4 tokens to decode). Over a past
 * part of exact pages (kv.past) every row sees every key of its sequence; compact pages are
 * refused (akv_attn_cuda_widen makes them exact). */
akv_status akv_attn_cuda_prefill(const akv_attn_prefill *p, void *stream);

/* Widen (akv_attn_widen): bit-exact with akv_attn_ref_widen; bf16 pages, head dim 64/128. */
akv_status akv_attn_cuda_widen(const akv_attn_widen *p, void *stream);

/* Writes new tokens' K/V into their page slots (bit-exact with akv_attn_ref_append). */
akv_status akv_attn_cuda_append(const akv_attn_append *p, void *stream);

/* Merges two arrays of partial states (f32 inputs). */
akv_status akv_attn_cuda_merge(const akv_attn_merge *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* AKV_ATTN_H */
