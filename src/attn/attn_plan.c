/*
 * attn_plan.c — parameter validation, the page-table walker, the split-KV partitioning rule
 * and the decode workspace size: the plain-C part that the reference and the CUDA launchers
 * share (akv/attn.h documents each public function).
 */
#include "attn/attn_impl.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

/* Smallest partition: two key tiles (128 keys). A decode block puts its first STAGES-1 >= 2
 * tiles in flight before it waits for any, so a partition of two tiles costs one memory
 * round trip, like a partition of one, while halving the partial states to merge. Short
 * contexts thus spread over many blocks (1K keys at 8 K/V heads: 64 blocks, not 32). */
#define SPLIT_MIN_PART_TOKENS (2u * AKV_ATTN_TILE_TOKENS)
/* Blocks per multiprocessor the plan counts on at most. */
#define SPLIT_MAX_BLOCKS_PER_SM 4u

#define BAD(...)                                                                                   \
    do {                                                                                           \
        AKV_LOG_E(__VA_ARGS__);                                                                    \
        return AKV_EINVAL;                                                                         \
    } while (0)

/* Warps per CUDA decode block (akv/attn.h): 8 in variant 0 (one block per multiprocessor for
 * a lone sequence), 4 in variants 1 and 2. */
uint32_t akv__attn_decode_warps(uint32_t variant) {
    return variant == 0 ? 8 : 4;
}

/* Ring depth in steps (a step: warps/4 tiles of 64 keys) per head dim and variant: variant 0
 * 3 steps of two tiles at d=128, 4 at d=64; variants 1 and 2 two and three tiles. */
uint32_t akv__attn_decode_stages(uint32_t head_dim, uint32_t variant) {
    if (head_dim != 64 && head_dim != 128) return 0;
    if (variant == 0) return head_dim == 128 ? 3 : 4;
    return head_dim == 128 ? 2 : 3;
}

/* Mirrors the CUDA decode block (cuda/attn_decode.cu): `stages` steps of warps/4 tiles of 64
 * keys of K and V in bf16, plus the query tile (32 rows). The kernel asserts the same figure. */
size_t akv_attn_decode_smem_bytes_variant(uint32_t head_dim, uint32_t variant) {
    size_t stages = akv__attn_decode_stages(head_dim, variant);
    if (stages == 0 || variant >= AKV_ATTN_DECODE_VARIANTS) return 0;
    return stages * (akv__attn_decode_warps(variant) / 4) * AKV_ATTN_TILE_TOKENS * head_dim * 2 * 2 + 32u * head_dim * 2;
}

static const akv_attn_tuning tuning_default; /* zero: every field its default */

akv_status akv_attn_tuning_check(const akv_attn_tuning *t) {
    if (!t) return AKV_OK;
    if (t->variant > AKV_ATTN_DECODE_VARIANTS)
        BAD("attn tuning: variant %u is neither AUTO (0) nor a variant + 1 (1..%d)", t->variant,
            AKV_ATTN_DECODE_VARIANTS);
    if (t->waves > 16) BAD("attn tuning: waves %u is not 0..16", t->waves);
    if (t->max_parts > AKV_ATTN_MAX_PARTS)
        BAD("attn tuning: max_parts %u is not 0..%d", t->max_parts, AKV_ATTN_MAX_PARTS);
    return AKV_OK;
}

uint32_t akv_attn_decode_variant_for(const akv_attn_tuning *t, uint32_t n_seq) {
    if (!t) t = &tuning_default;
    return t->variant != AKV_ATTN_VARIANT_AUTO ? t->variant - 1 : n_seq > 1 ? 2u : 0u;
}

uint32_t akv_attn_decode_variant_fit(const akv_attn_tuning *t, uint32_t n_seq, uint32_t head_dim,
                                     size_t smem_per_block) {
    if (!t) t = &tuning_default;
    uint32_t v = akv_attn_decode_variant_for(t, n_seq);
    if (t->variant == AKV_ATTN_VARIANT_AUTO &&
        akv_attn_decode_smem_bytes_variant(head_dim, v) > smem_per_block)
        v = 2; /* the smallest block */
    return v;
}

static bool is_pow2(uint32_t x) {
    return x && !(x & (x - 1));
}

unsigned akv__attn_log2(uint32_t pow2) {
    unsigned n = 0;
    while ((1u << n) < pow2) n++;
    return n;
}

float akv__attn_scale(float scale, uint32_t head_dim) {
    return scale != 0.0f ? scale : (float)(1.0 / sqrt((double)head_dim));
}

bool akv__attn_dtype_ok(akv_dtype t) {
    return t == AKV_DTYPE_F32 || t == AKV_DTYPE_F16 || t == AKV_DTYPE_BF16;
}

bool akv__attn_page_bytes(const akv_attn_pages *kv, size_t *out) {
    akv_repr_layout l;
    if (akv__attn_layout(kv, &l) != AKV_OK) return false;
    *out = l.page_bytes;
    return true;
}

akv_status akv__attn_layout(const akv_attn_pages *kv, akv_repr_layout *out) {
    return akv_repr_layout_of((akv_repr)kv->repr, kv->dtype, kv->n_kv_heads, kv->page_tokens,
                              kv->head_dim, out);
}

akv_status akv__attn_pages_check(const akv_attn_pages *kv, const char *op) {
    if (!kv) BAD("attn %s: no parameters (NULL)", op);
    if (kv->n_seq == 0) return AKV_OK; /* nothing to do: no table is read */
    if (!kv->pool.addr) BAD("attn %s: kv.pool is null", op);
    if (!kv->indptr.addr) BAD("attn %s: kv.indptr is null", op);
    if (!kv->indices.addr) BAD("attn %s: kv.indices is null", op);
    if (!kv->last_page_len.addr) BAD("attn %s: kv.last_page_len is null", op);
    if (kv->n_pages == 0) BAD("attn %s: kv.n_pages is 0", op);
    if (kv->max_pages == 0) BAD("attn %s: kv.max_pages (capacity) is 0", op);
    if (kv->n_kv_heads == 0) BAD("attn %s: kv.n_kv_heads is 0", op);
    if (kv->head_dim == 0 || kv->head_dim > AKV_ATTN_MAX_HEAD_DIM)
        BAD("attn %s: kv.head_dim %u is outside 1..%d", op, kv->head_dim, AKV_ATTN_MAX_HEAD_DIM);
    if (!is_pow2(kv->page_tokens) || kv->page_tokens > 65536)
        BAD("attn %s: kv.page_tokens %u is not a power of two in 1..65536", op, kv->page_tokens);
    if (!akv__attn_dtype_ok(kv->dtype))
        BAD("attn %s: kv.dtype %d is not f32, f16 or bf16", op, (int)kv->dtype);
    if (kv->repr >= AKV_REPR_COUNT) BAD("attn %s: kv.repr %u is no akv_repr", op, kv->repr);
    if (kv->past > 1) BAD("attn %s: kv.past %u is not 0 or 1", op, kv->past);
    akv_repr_layout layout;
    if (akv__attn_layout(kv, &layout) == AKV_EUNSUPPORTED)
        BAD("attn %s: kv.repr %s cannot hold head_dim %u (a power of two of at least %d)", op,
            akv_repr_name((akv_repr)kv->repr), kv->head_dim, AKV_REPR_Q4_GROUP);
    size_t page_bytes, pool_bytes;
    if (!akv__attn_page_bytes(kv, &page_bytes) || !akv__size_mul(page_bytes, kv->n_pages, &pool_bytes))
        BAD("attn %s: page or pool size overflows (n_kv_heads %u, page_tokens %u, head_dim %u, n_pages %u)",
            op, kv->n_kv_heads, kv->page_tokens, kv->head_dim, kv->n_pages);
    uint64_t cap = (uint64_t)kv->max_pages * kv->page_tokens;
    if (cap > INT32_MAX)
        BAD("attn %s: capacity %u pages x %u tokens exceeds 2^31-1 positions", op, kv->max_pages,
            kv->page_tokens);
    return AKV_OK;
}

static akv_status check_scale(float scale, const char *op) {
    if (scale != 0.0f && !(scale > 0.0f && isfinite(scale)))
        BAD("attn %s: scale %g is not 0 (default) or a finite positive number", op, (double)scale);
    return AKV_OK;
}

static akv_status check_heads(const akv_attn_pages *kv, uint32_t n_heads, const char *op) {
    if (n_heads == 0 || n_heads % kv->n_kv_heads != 0)
        BAD("attn %s: n_heads %u is not a positive multiple of kv.n_kv_heads %u", op, n_heads,
            kv->n_kv_heads);
    return AKV_OK;
}

static akv_status check_stride(uint32_t stride, uint32_t packed, const char *what, const char *op) {
    if (stride != 0 && stride < packed)
        BAD("attn %s: %s %u is less than a packed row (%u elements)", op, what, stride, packed);
    return AKV_OK;
}

/* The query shape of a decode: heads a multiple of the K/V heads, 1..AKV_ATTN_MAX_QUERIES
 * queries (AKV_ATTN_MAX_PAST_QUERIES over a past part). */
static akv_status check_decode_shape(const akv_attn_decode *p, const char *op) {
    akv_status st = check_heads(&p->kv, p->n_heads, op);
    if (st != AKV_OK) return st;
    const uint32_t most = p->kv.past ? AKV_ATTN_MAX_PAST_QUERIES : AKV_ATTN_MAX_QUERIES;
    if (p->n_query == 0 || p->n_query > most)
        BAD("attn %s: n_query %u is outside 1..%u%s", op, p->n_query, most,
            p->kv.past ? " (a past part)" : "");
    return AKV_OK;
}

akv_status akv__attn_decode_check(const akv_attn_decode *p, const char *op) {
    if (!p) BAD("attn %s: no parameters (NULL)", op);
    akv_status st = akv__attn_pages_check(&p->kv, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = check_decode_shape(p, op)) != AKV_OK) return st;
    if (!p->q.addr) BAD("attn %s: q is null", op);
    if (!p->o.addr) BAD("attn %s: o is null", op);
    if (!akv__attn_dtype_ok(p->q_dtype)) BAD("attn %s: q_dtype %d is not f32, f16 or bf16", op, (int)p->q_dtype);
    if (!akv__attn_dtype_ok(p->o_dtype)) BAD("attn %s: o_dtype %d is not f32, f16 or bf16", op, (int)p->o_dtype);
    if ((st = check_stride(p->q_stride, p->n_heads * p->kv.head_dim, "q_stride", op)) != AKV_OK) return st;
    return check_scale(p->scale, op);
}

akv_status akv__attn_prefill_check(const akv_attn_prefill *p, const char *op) {
    if (!p) BAD("attn %s: no parameters (NULL)", op);
    akv_status st = akv__attn_pages_check(&p->kv, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = check_heads(&p->kv, p->n_heads, op)) != AKV_OK) return st;
    if (!p->qo_indptr.addr) BAD("attn %s: qo_indptr is null", op);
    if (p->n_tokens == 0) return AKV_OK; /* every chunk is empty: nothing to do */
    if (p->max_chunk == 0) BAD("attn %s: max_chunk is 0 with %u tokens", op, p->n_tokens);
    if (!p->q.addr) BAD("attn %s: q is null", op);
    if (!p->o.addr) BAD("attn %s: o is null", op);
    if (!akv__attn_dtype_ok(p->q_dtype)) BAD("attn %s: q_dtype %d is not f32, f16 or bf16", op, (int)p->q_dtype);
    if (!akv__attn_dtype_ok(p->o_dtype)) BAD("attn %s: o_dtype %d is not f32, f16 or bf16", op, (int)p->o_dtype);
    if ((st = check_stride(p->q_stride, p->n_heads * p->kv.head_dim, "q_stride", op)) != AKV_OK) return st;
    if (!p->k_new.addr != !p->v_new.addr) BAD("attn %s: k_new and v_new must both be given or both be 0", op);
    if (p->k_new.addr && (p->kv.repr != AKV_REPR_EXACT || p->kv.past))
        BAD("attn %s: k_new is written into the pages: a %s part takes none", op,
            p->kv.past ? "past" : akv_repr_name((akv_repr)p->kv.repr));
    if (p->k_new.addr) {
        if (p->kv_new_dtype != AKV_DTYPE_F32 && p->kv_new_dtype != p->kv.dtype)
            BAD("attn %s: kv_new_dtype %s is neither f32 nor the page dtype %s", op,
                akv_dtype_name(p->kv_new_dtype), akv_dtype_name(p->kv.dtype));
        if ((st = check_stride(p->kv_stride, p->kv.n_kv_heads * p->kv.head_dim, "kv_stride", op)) != AKV_OK)
            return st;
    }
    if (p->kernel >= AKV_ATTN_PREFILL_KERNELS)
        BAD("attn %s: kernel %u is no akv_attn_prefill_kernel", op, p->kernel);
    return check_scale(p->scale, op);
}

akv_status akv__attn_append_check(const akv_attn_append *p, const char *op) {
    if (!p) BAD("attn %s: no parameters (NULL)", op);
    akv_status st = akv__attn_pages_check(&p->kv, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if (!p->qo_indptr.addr && (uint64_t)p->n_per_seq * p->kv.n_seq != p->n_tokens)
        BAD("attn %s: n_tokens %u is not n_seq %u x n_per_seq %u", op, p->n_tokens, p->kv.n_seq,
            p->n_per_seq);
    if (p->n_tokens == 0) return AKV_OK;
    if (p->max_new == 0) BAD("attn %s: max_new is 0 with %u tokens", op, p->n_tokens);
    if (!p->qo_indptr.addr && p->max_new < p->n_per_seq)
        BAD("attn %s: max_new %u is less than n_per_seq %u", op, p->max_new, p->n_per_seq);
    if (!p->k.addr || !p->v.addr) BAD("attn %s: k or v is null", op);
    if (p->kv.repr != AKV_REPR_EXACT || p->kv.past)
        BAD("attn %s: new rows are written into exact pages of the queries' own part, not a %s "
            "part", op, p->kv.past ? "past" : akv_repr_name((akv_repr)p->kv.repr));
    if (p->dtype != AKV_DTYPE_F32 && p->dtype != p->kv.dtype)
        BAD("attn %s: dtype %s is neither f32 nor the page dtype %s", op, akv_dtype_name(p->dtype),
            akv_dtype_name(p->kv.dtype));
    return check_stride(p->stride, p->kv.n_kv_heads * p->kv.head_dim, "stride", op);
}

akv_status akv__attn_widen_check(const akv_attn_widen *p, const char *op) {
    if (!p) BAD("attn %s: no parameters (NULL)", op);
    akv_status st = akv__attn_pages_check(&p->kv, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if (p->kv.repr == AKV_REPR_EXACT || !p->kv.past)
        BAD("attn %s: widens a compact past part, not %s pages%s", op,
            akv_repr_name((akv_repr)p->kv.repr), p->kv.past ? "" : " of the queries' own history");
    if (p->max_out == 0) BAD("attn %s: max_out is 0", op);
    if ((uint64_t)p->max_out * p->kv.n_seq > INT32_MAX)
        BAD("attn %s: %u sequences of %u pages overflow an int32 page id", op, p->kv.n_seq,
            p->max_out);
    if (!p->out_pool.addr || !p->out_indptr.addr || !p->out_indices.addr || !p->out_last.addr)
        BAD("attn %s: out_pool, out_indptr, out_indices and out_last must all be given", op);
    return AKV_OK;
}

akv_status akv__attn_merge_check(const akv_attn_merge *p, const char *op) {
    if (!p) BAD("attn %s: no parameters (NULL)", op);
    if (p->n_rows == 0) return AKV_OK;
    if (p->head_dim == 0 || p->head_dim > AKV_ATTN_MAX_HEAD_DIM)
        BAD("attn %s: head_dim %u is outside 1..%d", op, p->head_dim, AKV_ATTN_MAX_HEAD_DIM);
    if (!p->o_a.addr || !p->lse_a.addr || !p->o_b.addr || !p->lse_b.addr || !p->o.addr)
        BAD("attn %s: o_a, lse_a, o_b, lse_b and o must all be given", op);
    if (!akv__attn_dtype_ok(p->o_dtype)) BAD("attn %s: o_dtype %d is not f32, f16 or bf16", op, (int)p->o_dtype);
    if (p->o_dtype != AKV_DTYPE_F32 && (p->o.addr == p->o_a.addr || p->o.addr == p->o_b.addr))
        BAD("attn %s: o may alias an input only when o_dtype is f32", op);
    return AKV_OK;
}

akv_status akv_attn_table_check(const akv_attn_pages *kv) {
    akv_status st = akv__attn_pages_check(kv, "table");
    if (st != AKV_OK || kv->n_seq == 0) return st;
    const int32_t *indptr = (const int32_t *)(uintptr_t)kv->indptr.addr;
    const int32_t *indices = (const int32_t *)(uintptr_t)kv->indices.addr;
    const int32_t *last = (const int32_t *)(uintptr_t)kv->last_page_len.addr;
    if (indptr[0] < 0) BAD("attn table: indptr[0] is %d, below 0", indptr[0]);
    for (uint32_t s = 0; s < kv->n_seq; s++) {
        int64_t n = (int64_t)indptr[s + 1] - indptr[s];
        if (n < 0) BAD("attn table: indptr decreases at sequence %u (%d -> %d)", s, indptr[s], indptr[s + 1]);
        if (n > kv->max_pages)
            BAD("attn table: sequence %u owns %lld pages, more than max_pages %u", s, (long long)n,
                kv->max_pages);
        if (n == 0 && last[s] != 0)
            BAD("attn table: sequence %u has no page but last_page_len %d", s, last[s]);
        if (n > 0 && (last[s] < 1 || (uint32_t)last[s] > kv->page_tokens))
            BAD("attn table: sequence %u last_page_len %d is outside 1..%u", s, last[s], kv->page_tokens);
        for (int32_t i = indptr[s]; i < indptr[s + 1]; i++)
            if (indices[i] < 0 || (uint32_t)indices[i] >= kv->n_pages)
                BAD("attn table: sequence %u page %d has id %d, outside 0..%u", s, i - indptr[s],
                    indices[i], kv->n_pages - 1);
    }
    return AKV_OK;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) {
    return a / b + (a % b != 0); /* no overflow near 2^64 */
}

/* Variant 2's rule for a batch: the number of partitions such that the blocks fill whole
 * rounds of `slots` resident blocks. n0 partitions (at most `waves` rounds) make
 * ceil(n0*per_part/slots) rounds; a last round under half full is dropped (its blocks would
 * run alone after the others, at a fraction of the bandwidth), else n0 stays. */
static uint64_t split_whole_rounds(uint64_t n0, uint64_t per_part, uint64_t slots) {
    uint64_t blocks = n0 * per_part, rounds = ceil_div(blocks, slots);
    if (rounds > 1 && (blocks - (rounds - 1) * slots) * 2 < slots) {
        uint64_t n = (rounds - 1) * slots / per_part;
        return n >= 1 ? n : 1;
    }
    return n0;
}

akv_status akv_attn_split_plan_variant(uint64_t capacity_tokens, uint32_t n_seq, uint32_t n_kv_heads,
                                       uint32_t head_dim, uint32_t n_sm, size_t smem_per_block,
                                       const akv_attn_tuning *t, uint32_t variant,
                                       akv_attn_split *out) {
    if (capacity_tokens == 0 || n_seq == 0 || n_kv_heads == 0 || n_sm == 0 || !out)
        BAD("attn split: capacity %llu, n_seq %u, n_kv_heads %u and n_sm %u must be positive",
            (unsigned long long)capacity_tokens, n_seq, n_kv_heads, n_sm);
    if (variant >= AKV_ATTN_DECODE_VARIANTS) BAD("attn split: variant %u is not 0..%d", variant, AKV_ATTN_DECODE_VARIANTS - 1);
    akv_status tst = akv_attn_tuning_check(t);
    if (tst) return tst;
    if (!t) t = &tuning_default;
    /* waves of blocks a batch aims at: 1, measured (docs/attention.md), unless tuned */
    const uint64_t waves = t->waves ? t->waves : 1, parts_cap = t->max_parts;
    /* at most AKV_ATTN_MAX_PARTS partitions of at most 2^31 - 1 keys */
    if (capacity_tokens > (uint64_t)INT32_MAX * AKV_ATTN_MAX_PARTS)
        BAD("attn split: capacity %llu tokens is too large", (unsigned long long)capacity_tokens);
    size_t smem = akv_attn_decode_smem_bytes_variant(head_dim, variant);
    if (smem == 0) BAD("attn split: head_dim %u is not 64 or 128", head_dim);
    if (smem_per_block < smem) {
        AKV_LOG_E("attn split: a decode block needs %zu bytes of shared memory; the device allows %zu",
                  smem, smem_per_block);
        return AKV_EUNSUPPORTED;
    }
    uint64_t bps = smem_per_block / smem;
    if (bps > SPLIT_MAX_BLOCKS_PER_SM) bps = SPLIT_MAX_BLOCKS_PER_SM;
    uint64_t slots = bps * n_sm, per_part = (uint64_t)n_kv_heads * n_seq;
    uint64_t n_parts = ceil_div(capacity_tokens, SPLIT_MIN_PART_TOKENS);
    /* partitions are whole steps of the block */
    const uint64_t step = (uint64_t)AKV_ATTN_TILE_TOKENS * (akv__attn_decode_warps(variant) / 4);
    uint64_t fill;
    if (n_seq == 1) {
        /* one wave and no block of a second (every partition is merge work on the
         * sequence's critical path) */
        fill = slots >= n_kv_heads ? slots / n_kv_heads : 1;
    } else if (variant < 2) {
        /* `waves` over the batch, at most one wave per head */
        uint64_t fill_batch = ceil_div(waves * slots, per_part);
        fill = ceil_div(slots, n_kv_heads);
        if (fill_batch < fill) fill = fill_batch;
    } else {
        /* the same waves rounded down (no round of blocks is started for a few of them);
         * whole rounds below */
        fill = waves * slots / per_part;
    }
    if (fill > AKV_ATTN_MAX_PARTS) fill = AKV_ATTN_MAX_PARTS;
    if (n_parts > fill) n_parts = fill;
    if (variant == 2 && n_seq > 1 && n_parts > 1) n_parts = split_whole_rounds(n_parts, per_part, slots);
    if (parts_cap && n_parts > parts_cap) n_parts = parts_cap;
    if (n_parts < 1) n_parts = 1;
    uint64_t part = ceil_div(ceil_div(capacity_tokens, n_parts), step) * step;
    /* kernels hold positions in int: a partition is at most the largest whole number of
     * steps under 2^31 (more partitions, should rounding up to a step pass it) */
    const uint64_t part_max = (uint64_t)INT32_MAX / step * step;
    if (part > part_max) part = part_max;
    if (ceil_div(capacity_tokens, part) > AKV_ATTN_MAX_PARTS)
        BAD("attn split: capacity %llu tokens is too large", (unsigned long long)capacity_tokens);
    out->part_tokens = (uint32_t)part;
    out->n_parts = (uint32_t)ceil_div(capacity_tokens, part);
    return AKV_OK;
}

akv_status akv_attn_split_plan(uint64_t capacity_tokens, uint32_t n_seq, uint32_t n_kv_heads,
                               uint32_t head_dim, uint32_t n_sm, size_t smem_per_block,
                               const akv_attn_tuning *t, akv_attn_split *out) {
    akv_status tst = akv_attn_tuning_check(t);
    if (tst) return tst;
    return akv_attn_split_plan_variant(capacity_tokens, n_seq, n_kv_heads, head_dim, n_sm, smem_per_block,
                                       t, akv_attn_decode_variant_fit(t, n_seq, head_dim, smem_per_block), out);
}

akv_status akv__attn_decode_workspace_layout(const akv_attn_decode *p, const akv_attn_split *split,
                                             size_t *lse_off, size_t *cnt_off, size_t *total) {
    *lse_off = *cnt_off = *total = 0;
    if (split->n_parts <= 1 || p->kv.n_seq == 0) return AKV_OK;
    /* f32 partial outputs [n_seq][n_kv_heads][n_parts][rows][head_dim]; at the next 256-byte
     * boundary f32 LSEs [n_seq][n_kv_heads][n_parts][rows]; at the next one uint32 arrival
     * counters [n_seq][n_kv_heads][ceil(rows/16)] (one per block row; rows = group*n_query) */
    size_t states = p->kv.n_seq, o_bytes, lse_bytes, cnt = p->kv.n_seq, cnt_bytes, off;
    size_t rows = p->kv.n_kv_heads ? (size_t)(p->n_heads / p->kv.n_kv_heads) * p->n_query : 0;
    if (!akv__size_mul(states, p->kv.n_kv_heads, &states) || !akv__size_mul(states, split->n_parts, &states) ||
        !akv__size_mul(states, rows, &states) || !akv__size_mul(states, (size_t)p->kv.head_dim * 4, &o_bytes) ||
        !akv__size_mul(states, 4, &lse_bytes) || !akv__size_mul(cnt, p->kv.n_kv_heads, &cnt) ||
        !akv__size_mul(cnt, (rows + 15) / 16 * 4, &cnt_bytes) || !akv__size_add(o_bytes, 255, &off) ||
        !akv__size_add(off & ~(size_t)255, lse_bytes, &off) || !akv__size_add(off, 255, &off) ||
        !akv__size_add(off & ~(size_t)255, cnt_bytes, total)) {
        AKV_LOG_E("attn workspace: size overflows (n_seq %u, n_parts %u)", p->kv.n_seq, split->n_parts);
        return AKV_EOVERFLOW;
    }
    *lse_off = (o_bytes + 255) & ~(size_t)255;
    *cnt_off = *total - cnt_bytes;
    return AKV_OK;
}

akv_status akv_attn_decode_workspace_bytes(const akv_attn_decode *p, const akv_attn_split *split,
                                           size_t *out) {
    if (!p || !split || !out) BAD("attn workspace: NULL argument");
    if (p->kv.n_seq) {
        /* the shape the layout is computed from (the rest of the decode is checked where it runs) */
        if (p->kv.n_kv_heads == 0) BAD("attn workspace: kv.n_kv_heads is 0");
        akv_status st = check_decode_shape(p, "workspace");
        if (st != AKV_OK) return st;
        if (split->n_parts == 0) BAD("attn workspace: a split of 0 partitions");
    }
    size_t lse_off, cnt_off;
    return akv__attn_decode_workspace_layout(p, split, &lse_off, &cnt_off, out);
}

void akv_attn_merge_state(uint32_t head_dim, float *o_a, float *lse_a, const float *o_b,
                          float lse_b) {
    if (lse_b == -INFINITY) return; /* b is empty: a stays bit-identical */
    if (*lse_a == -INFINITY) {      /* a is empty: the result is b exactly */
        memmove(o_a, o_b, head_dim * sizeof(float));
        *lse_a = lse_b;
        return;
    }
    float m = fmaxf(*lse_a, lse_b);
    float ea = expf(*lse_a - m), eb = expf(lse_b - m); /* one of them is 1 */
    float sum = ea + eb;
    float wa = ea / sum, wb = eb / sum;
    for (uint32_t i = 0; i < head_dim; i++) o_a[i] = wa * o_a[i] + wb * o_b[i];
    *lse_a = m + logf(sum);
}
