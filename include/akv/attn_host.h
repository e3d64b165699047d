/*
 * akv/attn_host.h — decode attention over history pages where they lie in host memory: the
 * host's share of a step's attention (the host part of the host-attended route).
 *
 * A host part is one sequence's query (one token, every query head, f32) and a list of pages of
 * one layer in host memory, read in place: exact pages (akv/geom.h's page layout: [K, V][K/V
 * head][token][head dim]) and compact ones (q8, q4: akv/kv_repr.h) alike, a compact vector's
 * codes widened and scaled as they are loaded (the values of akv/kvq.h's decode, the ones
 * every other reader sees); each key and value row is read from memory once for all the
 * query heads of its K/V head (a GQA group). It yields, per query head,
 * the output normalised over the part's keys and the log-sum-exp of the scores (natural log),
 * which merge exactly with the other parts' states (akv_attn_merge_state, the device's merge).
 * Every key of the part precedes the query (a past part: no causal mask).
 *
 * Work is cut into chunks: (K/V head, pages [page0, page1)). A chunk's state is a fixed recipe
 * over its own keys, so a caller that fixes the chunks (AKV_ATTN_HOST_CHUNK_TOKENS) and merges
 * their states in chunk order gets the same bits on any thread and any thread count.
 *
 * Numerics: FP32 scores and accumulation; keys in blocks of 32, the running maximum and sum
 * rescaled per block (online softmax); e^x by an eight-lane polynomial (about 1.3 ulp).
 * Instruction sets: portable C, AVX2 + FMA,
 * AVX-512F (512-bit), chosen at run time for the CPU (AUTO) or named (tests run every one the
 * CPU has); they differ in the order of summation only (within FP32 rounding of each other).
 *
 * Thread-safety: every function is reentrant; a chunk reads the part and writes only its own
 * outputs, so chunks of one part run on several threads at once.
 */
#ifndef AKV_ATTN_HOST_H
#define AKV_ATTN_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "akv/dtype.h"
#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    AKV_ATTN_HOST_MAX_HEAD_DIM = 256,
    AKV_ATTN_HOST_CHUNK_TOKENS = 1024, /* keys a chunk takes at most (whole pages; a page
                                          longer than it is a chunk by itself) */
};

/* Instruction sets of the host attention. */
typedef enum akv_attn_host_isa {
    AKV_ATTN_HOST_AUTO = 0,
    AKV_ATTN_HOST_PORTABLE = 1, /* plain C */
    AKV_ATTN_HOST_AVX2 = 2,     /* x86-64 AVX2 + FMA + F16C, 8 lanes */
    AKV_ATTN_HOST_AVX512 = 3,   /* x86-64 AVX-512F, 16 lanes */
    AKV_ATTN_HOST_ISAS = 4,
} akv_attn_host_isa;

/* The set a request runs on this CPU: AUTO the widest it has; a set it lacks, the best below. */
akv_attn_host_isa akv_attn_host_isa_resolve(akv_attn_host_isa isa);
/* "auto", "portable", "avx2", "avx512" */
const char *akv_attn_host_isa_name(akv_attn_host_isa isa);

/* One sequence's query over some of its history's pages in host memory. */
typedef struct akv_attn_host_part {
    const void *const *pages; /* [n_pages] page addresses, oldest first; the caller keeps them
                                 valid and unwritten while a chunk reads them */
    uint32_t n_pages;         /* 0 = an empty part (every state empty) */
    uint32_t last_len;        /* tokens in the last page, 1..page_tokens (the others are full) */
    uint32_t n_kv_heads;      /* >= 1 */
    uint32_t head_dim;        /* 1..AKV_ATTN_HOST_MAX_HEAD_DIM */
    uint32_t page_tokens;     /* tokens a page holds, >= 1 */
    akv_dtype dtype;          /* the pages' element type: bf16, f16 or f32 */
    uint32_t n_heads;         /* query heads, a multiple of n_kv_heads */
    const float *q;           /* [n_heads][head_dim] */
    float scale;              /* score scale; 0 = 1/sqrt(head_dim); else finite and > 0 */
    uint32_t repr;            /* akv_repr of the pages (akv/kv_repr.h): 0 = exact, in dtype;
                                 q8 / q4 = compact pages of that layout for an exact page of
                                 dtype, read in place (q4's K rows are rotated: the query is
                                 rotated the same way) */
    uint32_t first_skip;      /* tokens at the start of the first page not attended (a sliding
                                 window's start); below that page's token count */
} akv_attn_host_part;

/* AKV_EINVAL (logged, naming the field) for a part the functions below cannot read: a NULL
 * page or query, a zero or oversize shape, a dtype other than the three, a last_len outside
 * 1..page_tokens, a first_skip that leaves the first page nothing, a bad scale, a
 * representation that is not one or cannot hold the shape (q4: head_dim a power of two, at
 * least 32). */
akv_status akv_attn_host_part_check(const akv_attn_host_part *p);

/* Chunks of the part per K/V head: its pages cut into runs of max(1, CHUNK_TOKENS /
 * page_tokens) pages, the last run shorter (0 for an empty part). Chunk c covers pages
 * [c * run, min((c + 1) * run, n_pages)); akv_attn_host_chunk_pages gives its bounds. */
uint32_t akv_attn_host_chunks(const akv_attn_host_part *p);
void akv_attn_host_chunk_pages(const akv_attn_host_part *p, uint32_t chunk, uint32_t *page0,
                               uint32_t *page1);

/* The state of the query heads of K/V head kv_head (heads kv_head * G .. + G - 1, G = n_heads
 * / n_kv_heads) over the part's pages [page0, page1): o [G][head_dim], each row normalised
 * over those keys, lse [G]. An empty range gives o 0 and lse -inf (the merge's empty state).
 * For a part that akv_attn_host_part_check accepts, kv_head < n_kv_heads and page0 <= page1 <=
 * n_pages (asserted). */
void akv_attn_host_chunk(const akv_attn_host_part *p, akv_attn_host_isa isa, uint32_t kv_head,
                         uint32_t page0, uint32_t page1, float *o, float *lse);

#ifdef __cplusplus
}
#endif

#endif
