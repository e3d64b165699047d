/*
 * attn_decode.cu — paged split-KV decode: 1..4 new queries per sequence, GQA, bf16 pages,
 * FP32 accumulation on the tensor cores, and the merge of the partitions.
 *
 * Work decomposition. One block (NW = 4 or 8 warps) per (partition p, K/V head h x row tile,
 * sequence s). Its query rows are the group's heads times the sequence's queries, row r =
 * qi*group + gi (query qi, head h*group + gi), padded to 16 (MT = 1) or 32 (MT = 2) rows; more
 * rows take more row tiles (blockIdx.y). The block streams its partition's keys in steps of
 * NW/4 tiles of 64 keys through a STAGES-deep cp.async ring; group g of 4 warps loads and
 * takes tile g of each step, warp w of a group keys 16w..16w+15 of its tile, keeps its own
 * online-softmax state (m, l in the log2 domain, O), and the NW warp states are merged in
 * shared memory in warp order at the end. So K/V is read once per GQA group, whatever the
 * number of queries, and the query rows ride along on tensor-core columns that are free
 * anyway. A lone sequence runs 8 warps (variant 0): one block per SM, twice the warps of a
 * 4-warp block on half the partitions, so the key loop keeps the rate of two blocks per SM
 * while the merge (on the sequence's critical path) has half the states to read.
 *
 * Partitions (akv_attn_split_plan): positions [p*part_tokens, (p+1)*part_tokens). A sequence
 * of len keys uses n_used = min(n_parts, ceil(len/part_tokens)) of them; a block whose
 * partition starts past the length returns at once (partition 0 always runs, so a sequence
 * of length 0 still gets its empty output). With n_used <= 1 the block writes the final
 * output. Otherwise it writes an f32 partial state (o normalised, lse natural) to the
 * workspace, and the LAST block of its (sequence, K/V head, row tile) to arrive merges
 * partitions 0..n_used-1 in place of a second kernel: every block bumps an arrival counter in
 * the workspace with an acquire-release atomic after a barrier (which publishes its state);
 * the block that sees n_used-1 resets the counter to 0 (so a workspace stays ready for the
 * next call) and merges. The merge reads every state back from the workspace in a fixed
 * order that depends on (n_used, rows, D) only, never on which block came last, so results
 * are bitwise reproducible. Nothing depends on where pages lie: same contents, same bits.
 *
 * Cluster merge (CL; sm_90, one sequence, at most ATTN_CLUSTER_MAX partitions, 16-row
 * tiles): the partitions of one (head, row tile) are one thread-block cluster. Each block
 * keeps its state in its own shared memory; after a cluster barrier every block merges a
 * share of the (row, 4 columns) items by reading the states of partitions 0..n_used-1 from
 * its peers' shared memory (distributed shared memory), in partition order; a second
 * barrier keeps every state alive until all reads are done. No workspace traffic, no
 * counter, no last block: the chain after the key loop is two barriers and one round of
 * on-chip loads instead of a global write, an atomic and a round of L2 loads. Whether a
 * call runs it depends on the split, the grid and the device only (akv_attn_cuda_decode),
 * never on page placement; its merge order differs from the workspace merge's, so the two
 * agree to rounding, not bitwise.
 *
 * Numerics: scores s = q.k in f32 on bf16 operands; exponent base 2 with the scale folded
 * into log2(e)*scale; probabilities rounded to bf16 for the P V product, and the row sum l
 * adds the same rounded values, so the normalisation matches the weights used. A row with
 * no visible key keeps m = -inf, l = 0 and ends as the empty state (o = 0, lse = -inf).
 */
#include "attn_common.cuh"

/* The profiling build's stamps (akv_attn_cuda_decode_timeline; cmake -DAKV_ATTN_TIMELINE=ON):
 * thread 0 of each block writes %globaltimer and clock64 at point i into a device array. */
#ifdef AKV_ATTN_TIMELINE
#define DEC_TL_ON 1
#define DEC_TL_MAX 16384
__device__ unsigned long long dec_tl[DEC_TL_MAX][12];
__device__ unsigned dec_tl_smid[DEC_TL_MAX];
__device__ unsigned dec_tl_grid;
static __device__ __forceinline__ void dec_stamp(int i) {
    if (threadIdx.x != 0) return;
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (b >= DEC_TL_MAX) return;
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    if (i == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        dec_tl_smid[b] = sm;
        for (int j = 1; j < 6; j++) dec_tl[b][j] = dec_tl[b][6 + j] = 0;
        if (b == 0) dec_tl_grid = gridDim.x * gridDim.y * gridDim.z;
    }
    dec_tl[b][i] = ns;
    dec_tl[b][6 + i] = (unsigned long long)clock64();
}
#else
static __device__ __forceinline__ void dec_stamp(int) {}
#define DEC_TL_ON 0
#endif

/* ST: the cp.async ring depth in steps of the exact pages, NW: warps per block
 * (akv__attn_decode_stages and akv__attn_decode_warps: variant 0 runs 8 warps, a ring of 3
 * steps at d=128 and 4 at d=64; variants 1 and 2 run 4 warps, 2 and 3 steps). A step is NW/4
 * tiles of 64 keys: each group of 4 warps takes one tile of it, warp w of a group keys
 * 16w..16w+15 of its tile. RP: the pages' akv_repr. A compact tile's slot holds the codes of
 * its K rows, of its V rows, then their scales (rows of CB and SB bytes; dec_cchunk); each
 * warp turns its keys' codes into the products' operands in registers (dec_step_c). A compact
 * block takes no more shared memory than the exact one (the split plan counts blocks per SM by
 * the exact block), spent on a deeper ring: at d=128 under variant 0, 5 steps of q8 and 10 of
 * q4 where exact has 3, about the same bytes in flight. */
template <int D, int RP>
struct dec_form {
    static constexpr int CB = RP == AKV_REPR_EXACT ? 2 * D : RP == AKV_REPR_Q8 ? D : D / 2; /* a row's codes */
    static constexpr int SB = RP == AKV_REPR_EXACT ? 0 : RP == AKV_REPR_Q8 ? 2 : D / 16;    /* its scales */
};

template <int D, int ST, int NW, int RP = AKV_REPR_EXACT>
struct dec_cfg {
    static constexpr int NT = 32 * NW;                     /* threads */
    static constexpr int GROUPS = NW / 4;                  /* tiles per step */
    static constexpr int TILE = 64;                        /* keys per tile */
    static constexpr int STEP = TILE * GROUPS;             /* keys per step */
    static constexpr int CB = dec_form<D, RP>::CB, SB = dec_form<D, RP>::SB;
    static constexpr int KV_BYTES = TILE * CB;             /* the codes of one of K, V for a tile */
    static constexpr int TILE_BYTES = 2 * TILE * (CB + SB);
    static constexpr int STAGE_BYTES = GROUPS * TILE_BYTES;
    static constexpr int Q_BYTES = 32 * D * 2;             /* up to 32 query rows */
    static constexpr int EXACT_SMEM = ST * GROUPS * 2 * TILE * 2 * D + Q_BYTES;
    static constexpr int STAGES = RP == AKV_REPR_EXACT ? ST : (EXACT_SMEM - Q_BYTES) / STAGE_BYTES;
    static constexpr int SO_STRIDE = D + 8; /* floats per scratch row (attn_decode_kernel step 3) */
    /* the end-of-block scratch (NW warps x 32 rows x D floats, m and l; or 16 rows and a
     * cluster-merged block's own state) reuses the ring and the query tile (both dead once the
     * key loop is over) */
    static constexpr int END_A = NW * 32 * SO_STRIDE * 4 + 2 * NW * 32 * 4;
    static constexpr int END_B = NW * 16 * SO_STRIDE * 4 + 2 * NW * 16 * 4 + (16 * D + 16) * 4;
    static constexpr int RING = STAGES * STAGE_BYTES + Q_BYTES;
    static constexpr int SMEM = RP == AKV_REPR_EXACT ? RING : RING > END_A ? (RING > END_B ? RING : END_B)
                                                                         : (END_A > END_B ? END_A : END_B);
    static_assert(NW == 4 || NW == 8, "one or two groups of 4 warps");
    static_assert(STAGES >= 2, "one step loads while another is used");
    static_assert(END_A <= SMEM, "scratch fits the ring and the query tile");
    static_assert(SMEM <= EXACT_SMEM, "a compact block fits where the exact one does");
};

struct dec_args {
    attn_kv kv;
    const void *q;  /* [n_seq*n_query] token rows of q_stride elements */
    int q_f32;
    long long q_stride;
    void *o;        /* [n_seq][n_query][n_heads][D] */
    int o_f32;
    float *lse;     /* [n_seq][n_query][n_heads] or null */
    float *ws_o;    /* [n_seq][n_kv][n_parts][rows][D] partial outputs */
    float *ws_lse;  /* [n_seq][n_kv][n_parts][rows] partial LSEs (natural log) */
    unsigned *ws_cnt; /* [n_seq][gridDim.y] arrival counters: 0 between calls */
    int n_heads, group, n_query, rows, n_row_tiles;
    int n_parts, part_tokens;
    float scale_log2; /* scale * log2(e) */
    int prefetch;     /* akv_attn_decode.prefetch_history */
    int n_mask;       /* the queries' rows at the history's end: n_query, or 0 for a past part
                         (every key visible to every row) */
};

/* Issue the cp.async of keys t0..t0+63 (K and V) into one tile's slot; positions >= t_end
 * are zero-filled. 128 threads (a group of 4 warps), D/8 chunks per row (V lies n_kv*P rows
 * after K in the same page).
 * Pages of at least a tile (P >= 64; tiles start at multiples of 64) hold the whole tile:
 * `page` is its page id, looked up by the caller one tile ahead (dec_tile_page), so no load
 * of the page table stands between the loop and the copies. Smaller pages: one lookup per
 * row (page = -1).
 * The common tile (in one page, every row visible) takes a straight path: a thread's rows are
 * r0 + i*RPP, RPP a multiple of 8, so their swizzled offsets (attn_swz XORs with r & 7) and
 * their sources lie at fixed strides from the first: two copies per pass with constant
 * offsets, where the general path computes each row's page, validity and swizzle (about 25
 * instructions per pass on the key loop's path, half of a warp's instructions per tile at
 * d=128). The same bytes land at the same places either way. */
template <int D>
static __device__ __forceinline__ void dec_load_tile(const attn_kv &kv, int pb, int h, int t0, int t_end,
                                                     uint32_t stage, int tid, int page) {
    constexpr int CPR = D / 8, RPP = 128 / CPR; /* chunks per row, rows per pass */
    constexpr int KV_BYTES = 64 * D * 2;         /* K of the tile, then V */
    static_assert(RPP % 8 == 0, "a thread's rows share their swizzle");
    const int c = tid % CPR;
    const size_t v_off = ((size_t)kv.n_kv << kv.log2_p) * (D * 2);
    if (page >= 0 && t0 + 64 <= t_end) {
        const int r0 = tid / CPR;
        const unsigned char *k = kv.pool + (size_t)page * kv.page_bytes +
                                 (((size_t)h << kv.log2_p) + (size_t)(t0 & ((1 << kv.log2_p) - 1)) + r0) * (D * 2) +
                                 c * 16;
        const unsigned char *v = k + v_off;
        const uint32_t dst = stage + attn_swz<D>(r0, c);
#pragma unroll
        for (int i = 0; i < 64 / RPP; i++) {
            attn_cp16_all(dst + i * RPP * D * 2, k + i * RPP * D * 2);
            attn_cp16_all(dst + KV_BYTES + i * RPP * D * 2, v + i * RPP * D * 2);
        }
        return;
    }
    const unsigned char *tile =
        page >= 0 ? kv.pool + (size_t)page * kv.page_bytes +
                        (((size_t)h << kv.log2_p) + (size_t)(t0 & ((1 << kv.log2_p) - 1))) * (D * 2)
                  : nullptr;
#pragma unroll
    for (int i = 0; i < 64 / RPP; i++) {
        const int r = tid / CPR + i * RPP, t = t0 + r;
        const bool valid = t < t_end;
        /* an invalid row reads the page table at a position inside the partition (a group's
         * tile may start past it; its keys are zero-filled and masked) */
        const unsigned char *row =
            page >= 0 ? tile + (size_t)r * (D * 2) : attn_row<D>(kv, pb, 0, h, valid ? t : min(t0, t_end - 1));
        const unsigned char *k = valid ? row + c * 16 : kv.pool;
        attn_cp16(stage + attn_swz<D>(r, c), k, valid);
        attn_cp16(stage + KV_BYTES + attn_swz<D>(r, c), valid ? k + v_off : kv.pool, valid);
    }
}

/* The page id holding the tile at t0 when pages hold whole tiles (P >= 64) and the tile has a
 * visible key (t0 < t_end: never a lookup past the sequence's pages); -1 otherwise (per-row
 * lookups, or nothing to load). */
static __device__ __forceinline__ int dec_tile_page(const attn_kv &kv, int pb, int t0, int t_end) {
    return kv.log2_p >= 6 && t0 < t_end ? __ldg(kv.indices + pb + (t0 >> kv.log2_p)) : -1;
}

/* ---- compact pages ---------------------------------------------------------------------- */

/* Where 16-byte chunk k of code row r lies in a compact tile's row: rows of 128 bytes (q8 at
 * d=128) XOR it with r & 7, so the K loads of a warp (8 rows, chunks 2c and 2c+1) and its V
 * loads (4 rows, chunk g) each spread over all 8 bank groups; shorter rows keep their order. */
template <int CB>
static __device__ __forceinline__ int dec_cchunk(int r, int k) {
    return CB == 128 ? k ^ (r & 7) : k;
}

/* The cp.async of a compact tile, keys t0..t0+63 of head h: the codes of its K and V rows,
 * then their scales, into one tile's slot (dec_cfg: [K codes][V codes][K scales][V scales],
 * rows unswizzled). Rows at or past t_end are zero-filled, except where a 16-byte chunk of
 * scales holds a live row too (RPC rows a chunk): dec_step_c masks K rows past t_end and takes
 * V scales past it as 0.
 * 128 threads. page: the tile's page id when pages hold whole tiles (dec_tile_page), else -1 (a
 * lookup per code row and per scale chunk: pages of at least 8 tokens keep a chunk's rows in
 * one page). */
template <int D, int RP>
static __device__ __forceinline__ void dec_load_ctile(const attn_kv &kv, int pb, int h, int t0, int t_end,
                                                      uint32_t slot, int tid, int page) {
    using C = dec_form<D, RP>;
    constexpr int CB = C::CB, SB = C::SB, CPR = CB / 16, RPC = 16 / SB;
    constexpr int N_CODE = 2 * 64 * CPR, N_SC = 2 * 64 / RPC;
    const int pmask = (1 << kv.log2_p) - 1;
    if (page >= 0 && t0 + 64 <= t_end) {
        /* the common tile (in one page, every row live): a thread's code chunks lie at fixed
         * strides from its first (RPP rows a pass, a multiple of 8: one swizzle), the scales of
         * the tile's 64 rows are one contiguous run for K and one for V */
        constexpr int RPP = 128 / CPR;
        static_assert(RPP % 8 == 0, "a thread's rows share their swizzle");
        const size_t row0 = ((size_t)h << kv.log2_p) + (size_t)(t0 & pmask), v_rows = (size_t)kv.n_kv << kv.log2_p;
        const unsigned char *pg = kv.pool + (size_t)page * kv.page_bytes;
        const int r0 = tid / CPR, c = tid % CPR;
        const unsigned char *k = pg + (row0 + r0) * CB + c * 16;
        const uint32_t dst = slot + r0 * CB + dec_cchunk<CB>(r0, c) * 16;
#pragma unroll
        for (int i = 0; i < 64 / RPP; i++) {
            attn_cp16_all(dst + i * RPP * CB, k + i * RPP * CB);
            attn_cp16_all(dst + 64 * CB + i * RPP * CB, k + v_rows * CB + i * RPP * CB);
        }
        if (tid < 64 / RPC) {
            const unsigned char *sk = pg + kv.scales_off + row0 * SB + tid * 16;
            attn_cp16_all(slot + 2 * 64 * CB + tid * 16, sk);
            attn_cp16_all(slot + 2 * 64 * CB + 64 * SB + tid * 16, sk + v_rows * SB);
        }
        return;
    }
    auto src = [&](int kvsel, int t, bool valid, unsigned long long base, int bytes) -> const unsigned char * {
        if (!valid) return kv.pool;
        const int pg = page >= 0 ? page : __ldg(kv.indices + pb + (t >> kv.log2_p));
        const size_t row = ((size_t)(kvsel * kv.n_kv + h) << kv.log2_p) + (size_t)(t & pmask);
        return kv.pool + (size_t)pg * kv.page_bytes + base + row * bytes;
    };
#pragma unroll
    for (int i = tid; i < N_CODE; i += 128) {
        const int kvsel = i / (64 * CPR), r = (i / CPR) % 64, c = i % CPR, t = t0 + r;
        const bool valid = t < t_end;
        attn_cp16(slot + (kvsel * 64 + r) * CB + dec_cchunk<CB>(r, c) * 16,
                  src(kvsel, t, valid, 0, CB) + (valid ? c * 16 : 0), valid);
    }
    for (int i = tid; i < N_SC; i += 128) {
        const int kvsel = i / (64 / RPC), r = (i % (64 / RPC)) * RPC, t = t0 + r;
        const bool valid = t < t_end;
        attn_cp16(slot + 2 * 64 * CB + (kvsel * 64 + r) * SB, src(kvsel, t, valid, kv.scales_off, SB), valid);
    }
}

/* Byte j (0..3) of x, 0..255, as a float: 2^23 + byte is the float whose low mantissa bits are
 * the byte, exact, and `bias` subtracts 2^23 and the codes' offset exactly. */
template <int J>
static __device__ __forceinline__ float dec_byte(uint32_t x, float bias) {
    return __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7540u + J)) - bias;
}
/* Two floats that bf16 holds exactly (small integers) as a bf16 pair: their high halves. */
static __device__ __forceinline__ uint32_t dec_hi_pair(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
}
/* A pair of q4 codes + 8 in the low nibbles of each half of x, as the bf16 pair of
 * (code) x s2 (bf16 0x4300 | n is 128 + n, exact; minus 136, times the scales). */
static __device__ __forceinline__ uint32_t dec_q4_pair(uint32_t x, uint32_t s2) {
    const uint32_t v = (x & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162 *>(&v);
    const __nv_bfloat162 off = __floats2bfloat162_rn(136.0f, 136.0f);
    b = __hmul2(__hsub2(b, off), *reinterpret_cast<const __nv_bfloat162 *>(&s2));
    return *reinterpret_cast<uint32_t *>(&b);
}
/* N 32-bit words from shared memory at addr (16-byte aligned for 4, 8 for 2). */
template <int N>
static __device__ __forceinline__ void dec_lds(uint32_t addr, uint32_t *w) {
    if constexpr (N == 4) {
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(addr));
    } else if constexpr (N == 2) {
        asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
    } else {
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[0]) : "r"(addr));
    }
}
/* Two f16 at addr (4-byte aligned) as floats. */
static __device__ __forceinline__ float2 dec_lds_f16x2(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return __half22float2(*reinterpret_cast<const __half2 *>(&v));
}
static __device__ __forceinline__ float dec_lds_f16(uint32_t addr) {
    unsigned short h;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(h) : "r"(addr));
    return __half2float(__ushort_as_half(h));
}

/* The head-dim order of a compact K row in the products. dec_step_c gives lane (g, c) of a
 * warp the elements c*D/4 .. c*D/4 + D/4 - 1 of its keys' K rows (one contiguous run of
 * codes), taken in the order its B fragments want; the query tile holds the query in the same
 * order, so every score is the same sum. Physical element p of a row is logical column
 * dec_qcol(p) of the query tile:
 *   q8: p = c*D/4 + 4m + j (word m, byte j) -> 16m + 2c + (j & 1) + 8(j >> 1)
 *   q4: p = c*D/4 + 8i + o (word i, nibble o) -> 16(2i + h) + 2c + hi + 8r, with o = 2h + r + 4hi
 * (a word's nibbles pair as (o, o + 4): the low nibbles of its bytes h and h + 2). */
template <int D, int RP>
static __device__ __forceinline__ int dec_qcol(int p) {
    constexpr int E = D / 4;
    const int c = p / E, q = p % E;
    if constexpr (RP == AKV_REPR_Q8) {
        const int m = q / 4, j = q % 4;
        return 16 * m + 2 * c + (j & 1) + 8 * (j >> 1);
    } else {
        const int i = q / 8, o = q % 8, h = (o >> 1) & 1, r = o & 1, hi = o >> 2;
        return 16 * (2 * i + h) + 2 * c + hi + 8 * r;
    }
}

/* The query rows row0.. of the block for a compact tile, rounded to bf16 into the swizzled
 * query tile in dec_qcol's order; padding rows are zero. For q4 each row is first rotated as
 * q4 pages rotate K (attn_fwht_row). Warp w takes rows w, w + NW, ...; a lane holds elements
 * E*lane .. E*lane + E - 1 of a row. */
template <int D, int NW, int MT, int RP>
static __device__ __forceinline__ void dec_store_q_compact(const dec_args &a, int s, int h, int row0, unsigned char *sq,
                                                           int warp, int lane) {
    constexpr int E = D / 32;
    for (int r = warp; r < 16 * MT; r += NW) {
        const int gr = row0 + r;
        float x[E];
#pragma unroll
        for (int j = 0; j < E; j++) x[j] = 0.0f;
        if (gr < a.rows) {
            const int qi = gr / a.group, gi = gr - qi * a.group;
            const size_t off = (size_t)(s * a.n_query + qi) * a.q_stride + (size_t)(h * a.group + gi) * D + lane * E;
#pragma unroll
            for (int j = 0; j < E; j++)
                x[j] = a.q_f32 ? static_cast<const float *>(a.q)[off + j]
                               : __bfloat162float(static_cast<const __nv_bfloat16 *>(a.q)[off + j]);
        }
        if constexpr (RP == AKV_REPR_Q4) attn_fwht_row<E>(x, lane);
#pragma unroll
        for (int j = 0; j < E; j++) {
            const int col = dec_qcol<D, RP>(lane * E + j);
            *reinterpret_cast<__nv_bfloat16 *>(sq + attn_swz<D>(r, col / 8) + (col % 8) * 2) = __float2bfloat16_rn(x[j]);
        }
    }
}

/* Final output of merged row gr (columns 4*c4..4*c4+3): O / S, and lse = M + log S. */
template <int D>
static __device__ __forceinline__ void dec_merge_store(const dec_args &a, int s, int h, int gr, int c4, float4 acc,
                                                       float M, float S) {
    const bool empty = !(S > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / S;
    const int qi = gr / a.group, gi = gr - qi * a.group;
    const size_t orow = (size_t)(s * a.n_query + qi) * a.n_heads + h * a.group + gi;
    attn_store2(a.o, a.o_f32, orow * D + c4 * 4, acc.x * inv, acc.y * inv);
    attn_store2(a.o, a.o_f32, orow * D + c4 * 4 + 2, acc.z * inv, acc.w * inv);
    if (c4 == 0 && a.lse) a.lse[orow] = empty ? -INFINITY : M + logf(S);
}

/* A running merge of partial states: M = the largest lse so far, S = sum exp(lse_p - M),
 * acc = sum exp(lse_p - M) o_p. Empty states (lse -inf) add nothing. */
struct dec_run {
    float M, S;
    float4 acc;
};

/* Folds U states (lse l[u], o x[u]) into r, in u order: one rescale to the group's max, then
 * the weighted sum. */
template <int U>
static __device__ __forceinline__ void dec_fold(dec_run &r, const float (&l)[U], const float4 (&x)[U]) {
    float mx = r.M;
#pragma unroll
    for (int u = 0; u < U; u++) mx = fmaxf(mx, l[u]);
    if (mx == -INFINITY) return; /* nothing but empty states so far */
    const float f = r.M == -INFINITY ? 0.0f : expf(r.M - mx);
    r.S *= f, r.acc.x *= f, r.acc.y *= f, r.acc.z *= f, r.acc.w *= f;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const float w = l[u] == -INFINITY ? 0.0f : expf(l[u] - mx);
        r.S += w;
        r.acc.x += w * x[u].x, r.acc.y += w * x[u].y, r.acc.z += w * x[u].z, r.acc.w += w * x[u].w;
    }
    r.M = mx;
}

/* Loads states p..p+U-1 (those < p1; the rest read as empty) of one item through L2 (__ldcg:
 * other blocks wrote them during this launch). */
template <int U>
static __device__ __forceinline__ void dec_load_states(const float *src, const float *lsrc, size_t step, int rows,
                                                       int p, int p1, float (&l)[U], float4 (&x)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const bool in = p + u < p1;
        x[u] = in ? __ldcg(reinterpret_cast<const float4 *>(src + (size_t)(p + u) * step)) : make_float4(0, 0, 0, 0);
        l[u] = in ? __ldcg(lsrc + (size_t)(p + u) * rows) : -INFINITY;
    }
}

/* Merge of partitions 0..n_used-1 of rows row0..row0+R-1 (those < rows) by the last block
 * to arrive, NT threads, into the final output. Items are (row, 4 columns); when fewer than
 * NT, the partitions are cut into ns = min(8, NT/items) contiguous slices. A thread folds its
 * slice's states in partition order, U at a time, the next U already loading while it folds
 * the current ones (so a slice of n states costs about n/(2U) memory round trips, not one
 * per state group plus two for the row statistics); then the slices' runs are combined in
 * slice order. The order depends on (n_used, rows, D) only, never on which block came last,
 * so results are bitwise reproducible. o = acc / S, lse = M + log S. */
template <int D, int R, int U, int NT>
static __device__ void dec_merge(const dec_args &a, int s, int h, int row0, int n_used, unsigned char *smem,
                                 int tid) {
    constexpr int C4 = D / 4;
    dec_run *s_run = reinterpret_cast<dec_run *>(smem); /* [NT] slice runs */
    const int nr = min(R, a.rows - row0);
    /* state (p, r) of these rows: index base + p*rows + r */
    const size_t base = (size_t)(s * a.kv.n_kv + h) * a.n_parts * a.rows + row0;
    const int n_items = nr * C4;
    const int ns = max(1, min(8, NT / n_items)), chunk = (n_used + ns - 1) / ns;
    const size_t step = (size_t)a.rows * D;
    for (int t = tid; t < n_items * ns; t += NT) {
        const int item = t % n_items, j = t / n_items, r = item / C4, c4 = item % C4;
        const float *src = a.ws_o + (base + r) * D + c4 * 4, *lsrc = a.ws_lse + base + r;
        const int p0 = j * chunk, p1 = min(n_used, p0 + chunk);
        dec_run run = {-INFINITY, 0.0f, make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
        float la[U], lb[U];
        float4 xa[U], xb[U];
        dec_load_states<U>(src, lsrc, step, a.rows, p0, p1, la, xa);
        for (int p = p0; p < p1; p += 2 * U) {
            if (p + U < p1) dec_load_states<U>(src, lsrc, step, a.rows, p + U, p1, lb, xb);
            dec_fold<U>(run, la, xa);
            if (p + 2 * U < p1) dec_load_states<U>(src, lsrc, step, a.rows, p + 2 * U, p1, la, xa);
            if (p + U < p1) dec_fold<U>(run, lb, xb);
        }
        if (ns > 1) s_run[t] = run; /* t = j*n_items + item < NT */
        else dec_merge_store<D>(a, s, h, row0 + r, c4, run.acc, run.M, run.S);
    }
    if (ns > 1) {
        __syncthreads();
        if (tid < n_items) {
            float M = -INFINITY;
            for (int j = 0; j < ns; j++) M = fmaxf(M, s_run[j * n_items + tid].M);
            float S = 0.0f;
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int j = 0; j < ns && M != -INFINITY; j++) {
                const dec_run x = s_run[j * n_items + tid];
                const float f = x.M == -INFINITY ? 0.0f : expf(x.M - M);
                S += f * x.S;
                acc.x += f * x.acc.x, acc.y += f * x.acc.y, acc.z += f * x.acc.z, acc.w += f * x.acc.w;
            }
            dec_merge_store<D>(a, s, h, row0 + tid / C4, tid % C4, acc, M, S);
        }
    }
}

/* Partitions a cluster merge takes at most (a portable cluster size). */
#define ATTN_CLUSTER_MAX 8

/* The cluster merge (see the top of the file): block `rank` of the cluster merges items
 * rank, rank + n_used, ... of rows row0..row0+R-1 (those < rows); each item folds the states
 * of partitions 0..n_used-1, read from shared memory at st_u (the [R][D] partial outputs,
 * then R LSEs) in each peer block, in partition order. */
template <int D, int R, int NT>
static __device__ void dec_cluster_merge(const dec_args &a, int s, int h, int row0, int n_used, int rank,
                                         uint32_t st_u, int tid) {
    constexpr int C4 = D / 4;
    const int n_items = min(R, a.rows - row0) * C4;
    const uint32_t lse_u = st_u + R * D * 4;
    for (int i = rank + tid * n_used; i < n_items; i += NT * n_used) {
        const int r = i / C4, c4 = i % C4;
        float l[ATTN_CLUSTER_MAX];
        float4 x[ATTN_CLUSTER_MAX];
#pragma unroll
        for (int u = 0; u < ATTN_CLUSTER_MAX; u++) {
            const bool in = u < n_used;
            x[u] = in ? attn_cluster_ld4(st_u + (uint32_t)(r * D + c4 * 4) * 4, u) : make_float4(0, 0, 0, 0);
            l[u] = in ? attn_cluster_ld1(lse_u + (uint32_t)r * 4, u) : -INFINITY;
        }
        dec_run run = {-INFINITY, 0.0f, make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
        dec_fold<ATTN_CLUSTER_MAX>(run, l, x);
        dec_merge_store<D>(a, s, h, row0 + r, c4, run.acc, run.M, run.S);
    }
}

/* The S fragment of query row tile mt for key step ks: Q from registers (QREG: MMA fragments)
 * or from the shared tile at sq_u. */
template <int D, bool QREG>
static __device__ __forceinline__ void dec_qfrag(const uint32_t (&qr)[QREG ? D / 16 : 1][4], uint32_t sq_u, int mt,
                                                 int ks, int lane, uint32_t (&qf)[4]) {
    if constexpr (QREG) {
        qf[0] = qr[ks][0], qf[1] = qr[ks][1], qf[2] = qr[ks][2], qf[3] = qr[ks][3];
    } else {
        attn_ldsm_x4(qf, sq_u + attn_swz<D>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    }
}

/* The scores of a warp's 16 keys (t0..t0+15) masked past k1 and past each row's causal limit,
 * then the online softmax: sc holds the probabilities after. */
template <int D, int MT>
static __device__ __forceinline__ void dec_softmax(float (&sc)[MT][2][4], int lane, int t0, int k1, int all_see,
                                                   const int (&limit)[MT][2], float (&m)[MT][2], float (&l)[MT][2],
                                                   float (&acc)[MT][D / 8][4], float scale_log2) {
    if (t0 + 16 > k1 || t0 + 15 > all_see) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = t0 + nt * 8 + (lane & 3) * 2 + (e & 1);
                    if (t >= k1 || t > limit[mt][e >> 1]) sc[mt][nt][e] = -INFINITY;
                }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        attn_softmax_step<2, D / 8>(sc[mt], acc[mt], m[mt][0], l[mt][0], 0, scale_log2);
        attn_softmax_step<2, D / 8>(sc[mt], acc[mt], m[mt][1], l[mt][1], 1, scale_log2);
    }
}

/* One step of a group's warp over exact pages: S = Q K^T over its 16 keys (t0..t0+15) of the
 * tile whose K is at kb and V at vb, masked past k1 and past each row's causal limit, the
 * online softmax, then O += P V. */
template <int D, int MT, bool QREG>
static __device__ __forceinline__ void dec_step(uint32_t kb, uint32_t vb, const uint32_t (&qr)[QREG ? D / 16 : 1][4],
                                                uint32_t sq_u, int gw, int lane, int t0, int k1, int all_see,
                                                const int (&limit)[MT][2], float (&m)[MT][2], float (&l)[MT][2],
                                                float (&acc)[MT][D / 8][4], float scale_log2) {
    /* S = Q K^T: [16*MT rows] x [16 keys] */
    float sc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[mt][0][e] = sc[mt][1][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        uint32_t kf[4];
        attn_ldsm_x4(kf, kb + attn_swz<D>(gw * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t qf[4];
            dec_qfrag<D, QREG>(qr, sq_u, mt, ks, lane, qf);
            attn_mma(sc[mt][0], qf, kf[0], kf[1]);
            attn_mma(sc[mt][1], qf, kf[2], kf[3]);
        }
    }
    dec_softmax<D, MT>(sc, lane, t0, k1, all_see, limit, m, l, acc, scale_log2);
    /* O += P V with P [16*MT rows] x [16 keys] from the S fragments */
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) attn_pack_p(sc[mt][0], sc[mt][1], pa[mt]);
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
        uint32_t vf[4];
        attn_ldsm_x4_t(vf, vb + attn_swz<D>(gw * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            attn_mma(acc[mt][2 * dp], pa[mt], vf[0], vf[1]);
            attn_mma(acc[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
        }
    }
}

/* The same step over a compact tile (the slot at `slot`, dec_cfg's layout), its codes turned
 * into the products' operands in registers. Lane (g, c) = (lane / 4, lane % 4):
 *   K: keys 16gw + g (n-tile 0) and + 8 (n-tile 1), elements c*D/4 .. of their rows in
 *      dec_qcol's order: per key step two bf16 pairs of codes (q8: exact integers, each
 *      key's scale applied to its score column after the product; q4: code x scale, the
 *      scale of the lane's group);
 *   V: keys 16gw + 2c, +1, +8, +9 (the keys of the lane's P fragment), columns g*D/8 ..
 *      g*D/8 + D/8 - 1: output n-tile dn takes column g*D/8 + dn of the loading lane g, so
 *      acc[dn] holds columns n*D/8 + dn for n = 2c, 2c+1 (the block's scratch store puts them
 *      back in order). q8 scales V by folding each key's scale into its probability (after the
 *      row sums took the probabilities themselves); q4 multiplies codes by the (key, group)
 *      scale. Keys at or past k1 get V scales of 0 (a dead row's scale may be anything); their
 *      scores are masked. */
template <int D, int MT, bool QREG, int RP>
static __device__ __forceinline__ void dec_step_c(uint32_t slot, const uint32_t (&qr)[QREG ? D / 16 : 1][4],
                                                  uint32_t sq_u, int gw, int lane, int t0, int k1, int all_see,
                                                  const int (&limit)[MT][2], float (&m)[MT][2], float (&l)[MT][2],
                                                  float (&acc)[MT][D / 8][4], float scale_log2) {
    using F = dec_form<D, RP>;
    constexpr int CB = F::CB, SB = F::SB, KW = CB / 16, VW = CB / 32; /* words a lane takes of a K, a V row */
    const int g = lane >> 2, c = lane & 3;
    const uint32_t kcodes = slot, vcodes = slot + 64 * CB, kscales = slot + 2 * 64 * CB, vscales = kscales + 64 * SB;
    /* 1. the K codes of keys 16gw + g and + 8 (q4: and their group's scale, as a bf16 pair) */
    uint32_t kw[2][KW], ks2[2] = {0, 0};
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const int r = gw * 16 + nt * 8 + g;
        const uint32_t row = kcodes + r * CB;
        if constexpr (KW == 8) {
            dec_lds<4>(row + dec_cchunk<CB>(r, 2 * c) * 16, kw[nt]);
            dec_lds<4>(row + dec_cchunk<CB>(r, 2 * c + 1) * 16, kw[nt] + 4);
        } else {
            dec_lds<KW>(row + c * KW * 4, kw[nt]);
        }
        if constexpr (RP == AKV_REPR_Q4) {
            const float sk = dec_lds_f16(kscales + r * SB + (c * (D / 4) / 32) * 2);
            ks2[nt] = attn_pack_bf16(sk, sk);
        }
    }
    /* 2. S = Q K^T, even and odd key steps in two accumulators (half the dependent chain of
     *    products), added after */
    float sc[MT][2][4], sc2[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[mt][0][e] = sc[mt][1][e] = sc2[mt][0][e] = sc2[mt][1][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        uint32_t kf[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            if constexpr (RP == AKV_REPR_Q8) {
                const uint32_t u = kw[nt][ks] ^ 0x80808080u; /* int8 + 128 */
                kf[nt][0] = dec_hi_pair(dec_byte<0>(u, 8388736.0f), dec_byte<1>(u, 8388736.0f));
                kf[nt][1] = dec_hi_pair(dec_byte<2>(u, 8388736.0f), dec_byte<3>(u, 8388736.0f));
            } else {
                const uint32_t x = kw[nt][ks / 2] >> ((ks & 1) * 8);
                kf[nt][0] = dec_q4_pair(x, ks2[nt]);
                kf[nt][1] = dec_q4_pair(x >> 4, ks2[nt]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t qf[4];
            dec_qfrag<D, QREG>(qr, sq_u, mt, ks, lane, qf);
            float(&acc_s)[2][4] = ks & 1 ? sc2[mt] : sc[mt];
            attn_mma(acc_s[0], qf, kf[0][0], kf[0][1]);
            attn_mma(acc_s[1], qf, kf[1][0], kf[1][1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[mt][0][e] += sc2[mt][0][e], sc[mt][1][e] += sc2[mt][1][e];
    /* 3. q8: each key's K scale on its score column; the V scales of the lane's P keys */
    float2 sv[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
    if constexpr (RP == AKV_REPR_Q8) {
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int r = gw * 16 + nt * 8 + 2 * c;
            const float2 sk = dec_lds_f16x2(kscales + r * SB);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                sc[mt][nt][0] *= sk.x, sc[mt][nt][1] *= sk.y;
                sc[mt][nt][2] *= sk.x, sc[mt][nt][3] *= sk.y;
            }
            const float2 v = dec_lds_f16x2(vscales + r * SB);
            const int t = t0 + nt * 8 + 2 * c;
            sv[nt] = make_float2(t < k1 ? v.x : 0.0f, t + 1 < k1 ? v.y : 0.0f);
        }
    }
    dec_softmax<D, MT>(sc, lane, t0, k1, all_see, limit, m, l, acc, scale_log2);
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if constexpr (RP == AKV_REPR_Q8) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                sc[mt][nt][0] *= sv[nt].x, sc[mt][nt][1] *= sv[nt].y;
                sc[mt][nt][2] *= sv[nt].x, sc[mt][nt][3] *= sv[nt].y;
            }
        }
        attn_pack_p(sc[mt][0], sc[mt][1], pa[mt]);
    }
    /* 4. the V codes of keys 16gw + 2c, +1, +8, +9 (q4: their group's scales, as two bf16 pairs) */
    uint32_t vw[4][VW], vs2[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int r = gw * 16 + 2 * c + (k & 1) + (k >> 1) * 8;
        if constexpr (VW == 4) dec_lds<4>(vcodes + r * CB + dec_cchunk<CB>(r, g) * 16, vw[k]);
        else dec_lds<VW>(vcodes + r * CB + g * VW * 4, vw[k]);
    }
    if constexpr (RP == AKV_REPR_Q4) {
        const int grp = g * (D / 8) / 32;
#pragma unroll
        for (int hk = 0; hk < 2; hk++) {
            const int r = gw * 16 + 2 * c + hk * 8, t = t0 + 2 * c + hk * 8;
            const float s0 = t < k1 ? dec_lds_f16(vscales + r * SB + grp * 2) : 0.0f;
            const float s1 = t + 1 < k1 ? dec_lds_f16(vscales + (r + 1) * SB + grp * 2) : 0.0f;
            vs2[hk] = attn_pack_bf16(s0, s1);
        }
    }
    /* 5. O += P V: n-tile dn, column g*D/8 + dn of keys (2c, 2c+1) and (2c+8, 2c+9) */
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) {
        uint32_t b0, b1;
        if constexpr (RP == AKV_REPR_Q8) {
            const int w = dn / 4;
            const uint32_t a0 = vw[0][w] ^ 0x80808080u, a1 = vw[1][w] ^ 0x80808080u;
            const uint32_t a2 = vw[2][w] ^ 0x80808080u, a3 = vw[3][w] ^ 0x80808080u;
            const uint32_t sel = 0x7540u + (dn % 4);
            auto f = [&](uint32_t x) { return __uint_as_float(__byte_perm(x, 0x4B000000u, sel)) - 8388736.0f; };
            b0 = dec_hi_pair(f(a0), f(a1));
            b1 = dec_hi_pair(f(a2), f(a3));
        } else {
            const int w = dn / 8, byte = (dn % 8) / 2, sh = (dn % 2) * 4;
            const uint32_t sel = (uint32_t)byte | (uint32_t)(4 + byte) << 8;
            b0 = dec_q4_pair(__byte_perm(vw[0][w], vw[1][w], sel) >> sh, vs2[0]);
            b1 = dec_q4_pair(__byte_perm(vw[2][w], vw[3][w], sel) >> sh, vs2[1]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) attn_mma(acc[mt][dn], pa[mt], b0, b1);
    }
}

/* MINB: the blocks per multiprocessor the split counts on, as a register bound for the
 * compiler (1 = no bound). CL: the partitions merge in a cluster (launched in clusters of
 * n_parts blocks along x), else through the workspace. */
template <int D, int MT, int ST, int MINB, int NW, bool CL, int RP>
__global__ void __launch_bounds__(32 * NW, MINB) attn_decode_kernel(const dec_args a) {
    using C = dec_cfg<D, ST, NW, RP>;
    constexpr int NT = C::NT;
    extern __shared__ __align__(128) unsigned char smem[];
    /* Launched as a programmatic dependent (attn_launch_dependent): grid_dep_wait returns
     * once the kernel before it on the stream has completed and its writes are visible. It comes
     * before any global access, unless the caller vouches (akv_attn_decode.prefetch_history)
     * that nothing still running writes the page tables or the keys below the queries' own
     * positions: then the table lookups and the first steps' loads of such keys go first (they
     * overlap the previous kernel's tail), and q, the queries' own rows and the workspace after.
     * The profiling build always waits first: its stamps (one array for every call) must not
     * be written while the previous call still writes its own. */
    const bool prefetch = a.prefetch && !DEC_TL_ON;
    if (!prefetch) grid_dep_wait();
    dec_stamp(0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* group, warp and thread in it (one group: the block's own, with no arithmetic) */
    const int grp = NW == 4 ? 0 : warp >> 2, gw = NW == 4 ? warp : warp & 3, gtid = NW == 4 ? tid : tid & 127;
    const int part = blockIdx.x;
    const int h = blockIdx.y / a.n_row_tiles, rt = blockIdx.y % a.n_row_tiles;
    const int s = blockIdx.z;
    const int pb = a.kv.indptr[s];
    const int len = attn_seq_len(a.kv, s);
    const int k0 = part * a.part_tokens; /* < capacity for every partition of the plan */
    /* in unsigned: k0 + part_tokens may pass 2^31 - 1 (both are below it) */
    const int k1 = (int)min((unsigned)k0 + (unsigned)a.part_tokens, (unsigned)len);
    const int n_used = len > 0 ? min(a.n_parts, (len - 1) / a.part_tokens + 1) : 0;
    const bool direct = n_used <= 1; /* this block alone writes the output */
    if (part > 0 && k0 >= len) return; /* an empty partition: nobody waits for it */
    const int n_steps = k1 > k0 ? (k1 - k0 + C::STEP - 1) / C::STEP : 0;
    const int row0 = rt * 16 * MT;
    const uint32_t ring = attn_smem_addr(smem);
    unsigned char *sq = smem + C::STAGES * C::STAGE_BYTES;
    const uint32_t sq_u = attn_smem_addr(sq);

    /* 1. the first STAGES-1 steps in flight (with prefetch_history, those below the queries'
     *    rows before the wait), the query rows into registers and then into shared memory as
     *    bf16, swizzled; padding rows are zero */
    /* group g loads tile g of every step (keys t0 + 64g ..) */
    const int gk = grp * C::TILE;
    const uint32_t gslot = grp * C::TILE_BYTES;
    /* step st's tile into its ring slot (its page looked up here) */
    auto load = [&](int t0, uint32_t slot, int page) {
        if constexpr (RP == AKV_REPR_EXACT) dec_load_tile<D>(a.kv, pb, h, t0, k1, slot, gtid, page);
        else dec_load_ctile<D, RP>(a.kv, pb, h, t0, k1, slot, gtid, page);
    };
    auto load_step = [&](int st) {
        const int t0 = k0 + st * C::STEP + gk;
        load(t0, ring + st * C::STAGE_BYTES + gslot, dec_tile_page(a.kv, pb, t0, k1));
    };
    int st = 0;
    if (prefetch) { /* the steps whose tile lies below the queries' rows, then the wait */
        for (; st < C::STAGES - 1 && st < n_steps; st++) {
            if (min(k0 + st * C::STEP + gk + C::TILE, k1) > len - a.n_mask) break;
            load_step(st);
            attn_cp_commit();
        }
        grid_dep_wait();
    }
    constexpr int QCH = 16 * MT * (D / 8), QPT = RP != AKV_REPR_EXACT ? 0 : (QCH + NT - 1) / NT; /* 16-byte chunks of q, per thread */
    uint4 qv[QPT > 0 ? QPT : 1]; /* their loads overlap the lookups of the steps below */
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int idx = tid + i * NT, r = idx / (D / 8), c = idx % (D / 8), gr = row0 + r;
        qv[i] = make_uint4(0, 0, 0, 0);
        if (idx < QCH && gr < a.rows) {
            const int qi = gr / a.group, gi = gr - qi * a.group;
            const size_t off = (size_t)(s * a.n_query + qi) * a.q_stride + (size_t)(h * a.group + gi) * D + c * 8;
            qv[i] = attn_load8_bf16(a.q, a.q_f32, off);
        }
    }
    for (; st < C::STAGES - 1; st++) {
        if (st < n_steps) load_step(st);
        attn_cp_commit();
    }
    /* the page of this group's next tile to load, looked up a step ahead */
    int next_page = C::STAGES - 1 < n_steps ? dec_tile_page(a.kv, pb, k0 + (C::STAGES - 1) * C::STEP + gk, k1) : -1;
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int idx = tid + i * NT;
        if (idx < QCH) *reinterpret_cast<uint4 *>(sq + attn_swz<D>(idx / (D / 8), idx % (D / 8))) = qv[i];
    }
    if constexpr (RP != AKV_REPR_EXACT) dec_store_q_compact<D, NW, MT, RP>(a, s, h, row0, sq, warp, lane);
    /* One row tile (16 rows) of q stays in registers as MMA fragments for the whole key loop
     * (D/4 registers) instead of D/16 shared-memory loads per tile: where the registers are
     * there (not d=128 under variant 1/2's 3-blocks-per-SM bound, not 32 rows). */
    constexpr bool QREG = MT == 1 && (D == 64 || MINB == 1);
    uint32_t qr[QREG ? D / 16 : 1][4];
    if constexpr (QREG) {
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
            attn_ldsm_x4(qr[ks], sq_u + attn_swz<D>(lane & 15, 2 * ks + (lane >> 4)));
    }
    /* the causal rule: row qi of n sees keys <= len - n + qi (padding rows see all) */
    int limit[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            limit[mt][hf] = len - a.n_mask + (row0 + mt * 16 + (lane >> 2) + hf * 8) / a.group;
    const int all_see = len - a.n_mask; /* keys <= this are visible to every row */

    float m[MT][2], l[MT][2], acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
    }

    /* 2. the key steps */
    for (int it = 0; it < n_steps; it++) {
        attn_cp_wait<C::STAGES - 2>();
        __syncthreads(); /* step `it` landed for all; everyone is done with the stage refilled next */
        if (it == 0) dec_stamp(1);
        {
            const int nt = it + C::STAGES - 1;
            if (nt < n_steps) {
                load(k0 + nt * C::STEP + gk, ring + (nt % C::STAGES) * C::STAGE_BYTES + gslot, next_page);
                if (nt + 1 < n_steps) next_page = dec_tile_page(a.kv, pb, k0 + (nt + 1) * C::STEP + gk, k1);
            }
            attn_cp_commit();
        }
        const uint32_t kb = ring + (it % C::STAGES) * C::STAGE_BYTES + gslot, vb = kb + C::KV_BYTES;
        const int t0 = k0 + it * C::STEP + gk + gw * 16; /* this warp's 16 keys */

        if constexpr (RP == AKV_REPR_EXACT)
            dec_step<D, MT, QREG>(kb, vb, qr, sq_u, gw, lane, t0, k1, all_see, limit, m, l, acc, a.scale_log2);
        else
            dec_step_c<D, MT, QREG, RP>(kb, qr, sq_u, gw, lane, t0, k1, all_see, limit, m, l, acc, a.scale_log2);
    }

    /* 3. the warps' states into shared memory (the ring is free once every copy landed) */
    attn_cp_wait<0>();
    __syncthreads();
    dec_stamp(2);
    /* the next kernel on the stream may be scheduled once every block is here (its blocks
     * take the multiprocessors this grid's tail leaves idle, and wait for its completion) */
    grid_dep_launch();
    /* Rows of the scratch are D + 8 floats apart: a warp's float2 stores cover 8 rows x 8
     * banks, which at a stride of D (a multiple of 32 banks) all hit the same 8 banks (8
     * wavefronts per store); 8 more floats put rows r and r+4 alone on their banks (2). */
    constexpr int R = 16 * MT, SO = C::SO_STRIDE;
    float *so = reinterpret_cast<float *>(smem); /* [NW][R][SO] */
    float *sm = so + NW * R * SO;                /* [NW][R] */
    float *sl = sm + NW * R;                     /* [NW][R] */
    float *cst = sl + NW * R;                    /* CL: [R][D] this partition's state, then [R] LSEs */
    static_assert(!CL || (MT == 1 && (NW * R * SO + 2 * NW * R + R * D + R) * 4 <= C::SMEM),
                  "a cluster-merged block keeps its state beside the scratch");
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float lsum = attn_quad_sum(l[mt][hf]);
            const int r = mt * 16 + (lane >> 2) + hf * 8;
            if ((lane & 3) == 0) sm[warp * R + r] = m[mt][hf], sl[warp * R + r] = lsum;
#pragma unroll
            for (int dn = 0; dn < D / 8; dn++) {
                float *row = so + (size_t)(warp * R + r) * SO;
                if constexpr (RP == AKV_REPR_EXACT) {
                    *reinterpret_cast<float2 *>(row + dn * 8 + (lane & 3) * 2) =
                        make_float2(acc[mt][dn][2 * hf], acc[mt][dn][2 * hf + 1]);
                } else { /* columns n*D/8 + dn, n = 2c, 2c+1 (dec_step_c) */
                    row[(lane & 3) * 2 * (D / 8) + dn] = acc[mt][dn][2 * hf];
                    row[((lane & 3) * 2 + 1) * (D / 8) + dn] = acc[mt][dn][2 * hf + 1];
                }
            }
        }
    __syncthreads();

    /* 4. merge the warps in order and write the final output or the partition's state (the
     *    block's real rows only: a GQA group of 4 fills 4 of its 16) */
    const int nr = min(R, a.rows - row0);
    for (int idx = tid; idx < nr * D; idx += NT) {
        const int r = idx / D, c = idx % D, gr = row0 + r;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) M = fmaxf(M, sm[w * R + r]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float mw = sm[w * R + r];
            const float f = mw == -INFINITY ? 0.0f : attn_exp2(mw - M);
            L += f * sl[w * R + r];
            O += f * so[(size_t)(w * R + r) * SO + c];
        }
        const bool empty = !(L > 0.0f);
        const float out = empty ? 0.0f : O / L;
        const float lse = empty ? -INFINITY : (M + log2f(L)) * ATTN_LN2;
        const int qi = gr / a.group, gi = gr - qi * a.group;
        if (direct) {
            const size_t orow = (size_t)(s * a.n_query + qi) * a.n_heads + h * a.group + gi;
            attn_store1(a.o, a.o_f32, orow * D + c, out);
            if (c == 0 && a.lse) a.lse[orow] = lse;
        } else if (CL) {
            cst[r * D + c] = out;
            if (c == 0) cst[R * D + r] = lse;
        } else {
            const size_t prow = ((size_t)(s * a.kv.n_kv + h) * a.n_parts + part) * a.rows + gr;
            a.ws_o[prow * D + c] = out;
            if (c == 0) a.ws_lse[prow] = lse;
        }
    }
    dec_stamp(3);
    if (direct) return;
    if constexpr (CL) {
        /* the used partitions are blocks 0..n_used-1 of this cluster (the rest returned at
         * the start: exited threads do not hold up a cluster barrier, and nobody reads them) */
        attn_cluster_sync(); /* every used partition's state is in its block's shared memory */
        dec_stamp(4);
        dec_cluster_merge<D, R, NT>(a, s, h, row0, n_used, part, attn_smem_addr(cst), tid);
        attn_cluster_sync(); /* no block leaves while a peer may still read its state */
        dec_stamp(5);
        return;
    }

    /* 5. arrival: the last block of this (sequence, head, row tile) merges the partitions. The
     *    barrier orders the block's state writes before thread 0's count, whose release (at
     *    GPU scope, cumulative over what the barrier ordered) publishes them; its acquire, in
     *    the last block, orders every other block's published state before the merge's reads
     *    (which the second barrier extends to the whole block). One fence per block, not 128. */
    __shared__ int s_last;
    __syncthreads();
    if (tid == 0) {
        unsigned *cnt = a.ws_cnt + (size_t)s * gridDim.y + blockIdx.y;
        const bool last = attn_atomic_add_acq_rel(cnt, 1u) == (unsigned)(n_used - 1);
        if (last) atomicExch(cnt, 0u); /* every other block has counted: ready for the next call */
        s_last = last;
    }
    __syncthreads();
    dec_stamp(4);
    if (s_last) {
        /* states loaded per group: 2 x 16 in flight at d=128 with no register bound (variant
         * 0: 210 registers, one 8-warp block per SM), else 2 x 8 (the 3-4 blocks per SM of
         * variants 1 and 2 bound the registers; d=64 merges fewer columns per item) */
        dec_merge<D, R, MINB == 1 && D == 128 ? 16 : 8, NT>(a, s, h, row0, n_used, smem, tid);
        dec_stamp(5);
    }
}

/* Max active clusters + 1 of one kernel per device and cluster size; 0 = not asked yet. */
typedef int dec_cluster_cache[16][ATTN_CLUSTER_MAX + 1];

/* Whether the cluster-merged `kernel` takes a grid of n_clusters clusters of `cluster`
 * blocks at once on the current device (*fits): the device has compute capability 9+, the
 * kernel's binary was built for it (a build for an older architecture would run the
 * barriers' trap), and every cluster is resident in one round (a cluster waiting for a second
 * round would double the call). The answer comes from the kernel's own `cache` after the
 * first question per device and cluster size; a failing CUDA query is the call's error
 * (AKV_EDEVICE), never a silent choice that a later call might make differently. */
static akv_status dec_clusters_fit(void (*kernel)(const dec_args), int block, size_t smem, int cluster,
                                   unsigned n_clusters, dec_cluster_cache &cache, bool *fits) {
    int dev = 0;
    AKV_CUDA_TRY(cudaGetDevice(&dev));
    *fits = false;
    if (dev < 0 || dev >= 16) return AKV_OK; /* beyond the cache: the workspace merge */
    int c = __atomic_load_n(&cache[dev][cluster], __ATOMIC_RELAXED);
    if (c == 0) {
        int n = 0;
        cudaFuncAttributes fa; /* a binary for sm_90+ runs only on a device of 9+ */
        AKV_CUDA_TRY(cudaFuncGetAttributes(&fa, kernel));
        if (fa.binaryVersion >= 90) {
            cudaLaunchAttribute attr[2];
            const cudaLaunchConfig_t cfg =
                attn_launch_config(dim3((unsigned)cluster, 1, 1), block, smem, nullptr, cluster, attr);
            AKV_CUDA_TRY(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
        }
        c = n + 1;
        __atomic_store_n(&cache[dev][cluster], c, __ATOMIC_RELAXED);
    }
    *fits = n_clusters <= (unsigned)(c - 1);
    return AKV_OK;
}

/* The kernel a decode launches, its block and its cluster size (1: none). */
struct dec_pick {
    void (*kernel)(const dec_args);
    int threads;
    size_t smem;
    int cluster;
};

/* Picks, for `cluster` > 1 (a 16-row tile, at most ATTN_CLUSTER_MAX partitions, grid.x =
 * cluster), the cluster-merged kernel where its clusters fit the device at once
 * (dec_clusters_fit), else the workspace-merged one; opts the kernel into its shared memory. */
template <int D, int MT, int ST, int MINB, int NW, int RP>
static akv_status dec_pick_kernel(dim3 grid, int cluster, dec_pick *out) {
    using C = dec_cfg<D, ST, NW, RP>;
    static_assert(C::SMEM <= 227 * 1024, "decode block fits an H100/H200 SM");
    *out = {attn_decode_kernel<D, MT, ST, MINB, NW, false, RP>, C::NT, (size_t)C::SMEM, 1};
    if constexpr (MT == 1) {
        if (cluster > 1) {
            static dec_cluster_cache cache; /* this kernel's */
            auto kc = attn_decode_kernel<D, MT, ST, MINB, NW, true, RP>;
            AKV_CUDA_TRY(cudaFuncSetAttribute(kc, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
            bool fits = false;
            akv_status st = dec_clusters_fit(kc, C::NT, C::SMEM, cluster, grid.y * grid.z, cache, &fits);
            if (st != AKV_OK) return st;
            if (fits) {
                out->kernel = kc, out->cluster = cluster;
                return AKV_OK;
            }
        }
    }
    AKV_CUDA_TRY(cudaFuncSetAttribute(out->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    return AKV_OK;
}

static akv_status dec_check(const akv_attn_decode *p, const char *op) {
    akv_status st = akv__attn_decode_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = attn_cuda_kv_check(&p->kv, op, true)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->q_dtype, "q_dtype", op)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->o_dtype, "o_dtype", op)) != AKV_OK) return st;
    const uint32_t q_stride = p->q_stride ? p->q_stride : p->n_heads * p->kv.head_dim;
    return attn_cuda_align_check(p->q, (uint64_t)q_stride * akv_dtype_size(p->q_dtype), "q", op);
}

/* The variant (akv_attn_decode_variant_fit) and split of a checked decode on the current
 * device. */
static akv_status dec_split(const akv_attn_decode *p, uint32_t *variant, akv_attn_split *out) {
    uint32_t n_sm;
    size_t smem;
    akv_status st = attn_cuda_device(&n_sm, &smem);
    if (st != AKV_OK) return st;
    if ((st = akv_attn_tuning_check(&p->tuning)) != AKV_OK) return st;
    *variant = akv_attn_decode_variant_fit(&p->tuning, p->kv.n_seq ? p->kv.n_seq : 1,
                                           p->kv.head_dim, smem);
    return akv_attn_split_plan_variant((uint64_t)p->kv.max_pages * p->kv.page_tokens,
                                       p->kv.n_seq ? p->kv.n_seq : 1, p->kv.n_kv_heads,
                                       p->kv.head_dim, n_sm, smem, &p->tuning, *variant, out);
}

extern "C" akv_status akv_attn_cuda_decode_timeline(akv_attn_timeline_block *out, uint32_t max,
                                                    uint32_t *n_blocks) {
#ifdef AKV_ATTN_TIMELINE
    if (!out || !n_blocks) {
        AKV_LOG_E("attn timeline: NULL argument");
        return AKV_EINVAL;
    }
    AKV_CUDA_TRY(cudaDeviceSynchronize());
    unsigned grid = 0;
    AKV_CUDA_TRY(cudaMemcpyFromSymbol(&grid, dec_tl_grid, sizeof grid));
    *n_blocks = grid;
    uint32_t n = grid < max ? grid : max;
    if (n > DEC_TL_MAX) n = DEC_TL_MAX;
    static unsigned long long t[DEC_TL_MAX][12];
    static unsigned sm[DEC_TL_MAX];
    AKV_CUDA_TRY(cudaMemcpyFromSymbol(t, dec_tl, (size_t)n * sizeof t[0]));
    AKV_CUDA_TRY(cudaMemcpyFromSymbol(sm, dec_tl_smid, (size_t)n * sizeof sm[0]));
    for (uint32_t b = 0; b < n; b++) {
        out[b].smid = sm[b];
        for (int i = 0; i < 6; i++) out[b].ns[i] = t[b][i], out[b].clk[i] = t[b][6 + i];
    }
    return AKV_OK;
#else
    (void)out, (void)max, (void)n_blocks;
    AKV_LOG_E("attn timeline: this build has none (cmake -DAKV_ATTN_TIMELINE=ON)");
    return AKV_EUNSUPPORTED;
#endif
}

extern "C" akv_status akv_attn_cuda_decode_split(const akv_attn_decode *p, akv_attn_split *out) {
    akv_status st = dec_check(p, "cuda decode split");
    if (st != AKV_OK) return st;
    uint32_t variant;
    return dec_split(p, &variant, out);
}

/* A checked decode's launch on the current device: its split, rows, grid and kernel. */
struct dec_plan {
    akv_attn_split sp;
    int rows, n_row_tiles;
    dim3 grid;
    dec_pick pick;
};

/* The kernel of a variant's block (warps, head dim, the exact ring's stages) and row tiles
 * (mt) for pages of representation RP; *found = false for a configuration without one. */
template <int RP>
static akv_status dec_pick_repr(uint32_t warps, int D, uint32_t stages, int mt, dim3 grid, int cl, dec_pick *k,
                                bool *found) {
    if (warps == 8 && D == 128 && stages == 3) return mt == 1 ? dec_pick_kernel<128, 1, 3, 1, 8, RP>(grid, cl, k) : dec_pick_kernel<128, 2, 3, 1, 8, RP>(grid, 1, k);
    if (warps == 8 && D == 64 && stages == 4) return mt == 1 ? dec_pick_kernel<64, 1, 4, 1, 8, RP>(grid, cl, k) : dec_pick_kernel<64, 2, 4, 1, 8, RP>(grid, 1, k);
    /* d=128 with 32 rows needs 235 registers: bound to 3 blocks per SM it spills, so it keeps
     * 2 (the plan counts 3; only GQA groups above 4 x queries take it) */
    if (warps == 4 && D == 128 && stages == 2) return mt == 1 ? dec_pick_kernel<128, 1, 2, 3, 4, RP>(grid, cl, k) : dec_pick_kernel<128, 2, 2, 1, 4, RP>(grid, 1, k);
    /* d=64 decoding compact tiles needs more than the 128 registers of 4 blocks per SM: 3 */
    constexpr int B64 = RP == AKV_REPR_EXACT ? 4 : 3;
    if (warps == 4 && D == 64 && stages == 3) return mt == 1 ? dec_pick_kernel<64, 1, 3, B64, 4, RP>(grid, cl, k) : dec_pick_kernel<64, 2, 3, B64, 4, RP>(grid, 1, k);
    *found = false;
    return AKV_OK;
}

static akv_status dec_prepare(const akv_attn_decode *p, const char *op, dec_plan *out) {
    uint32_t variant; /* the split and the ring agree */
    akv_status st = dec_split(p, &variant, &out->sp);
    if (st != AKV_OK) return st;
    const akv_attn_split &sp = out->sp;
    const int D = (int)p->kv.head_dim, group = (int)(p->n_heads / p->kv.n_kv_heads);
    const int rows = group * (int)p->n_query, mt = rows <= 16 ? 1 : 2, n_row_tiles = (rows + 16 * mt - 1) / (16 * mt);
    if ((uint64_t)p->kv.n_kv_heads * n_row_tiles > 65535) {
        AKV_LOG_E("attn %s: %u K/V heads x %d row tiles exceed a grid dimension", op, p->kv.n_kv_heads, n_row_tiles);
        return AKV_EUNSUPPORTED;
    }
    out->rows = rows;
    out->n_row_tiles = n_row_tiles;
    const dim3 grid(sp.n_parts, p->kv.n_kv_heads * n_row_tiles, p->kv.n_seq);
    out->grid = grid;
    /* the ring depth of the variant: must match what the plan sized the split for */
    const uint32_t stages = akv__attn_decode_stages((uint32_t)D, variant);
    const uint32_t warps = akv__attn_decode_warps(variant);
    /* a lone sequence's partitions of each (head, row tile) as one cluster, where they are
     * few (its merge is on the call's critical path; batches measured no better with them:
     * docs/attention.md) */
    const int cl = !p->tuning.no_cluster && p->kv.n_seq == 1 && sp.n_parts >= 2 &&
                           sp.n_parts <= ATTN_CLUSTER_MAX
                       ? (int)sp.n_parts : 1;
    bool found = true;
    switch (p->kv.repr) {
    case AKV_REPR_Q8: st = dec_pick_repr<AKV_REPR_Q8>(warps, D, stages, mt, grid, cl, &out->pick, &found); break;
    case AKV_REPR_Q4: st = dec_pick_repr<AKV_REPR_Q4>(warps, D, stages, mt, grid, cl, &out->pick, &found); break;
    default: st = dec_pick_repr<AKV_REPR_EXACT>(warps, D, stages, mt, grid, cl, &out->pick, &found); break;
    }
    if (found) return st;
    AKV_LOG_E("attn %s: no decode kernel for head dim %d, %u stages, %u warps", op, D, stages, warps);
    return AKV_EUNSUPPORTED;
}

extern "C" akv_status akv_attn_cuda_decode_cluster_size(const akv_attn_decode *p, uint32_t *out) {
    const char *op = "cuda decode cluster size";
    if (!out) {
        AKV_LOG_E("attn %s: NULL output", op);
        return AKV_EINVAL;
    }
    *out = 1;
    akv_status st = dec_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    dec_plan pl;
    if ((st = dec_prepare(p, op, &pl)) != AKV_OK) return st;
    *out = (uint32_t)pl.pick.cluster;
    return AKV_OK;
}

extern "C" akv_status akv_attn_cuda_decode(const akv_attn_decode *p, akv_dptr workspace,
                                           size_t workspace_bytes, void *stream) {
    const char *op = "cuda decode";
    akv_status st = dec_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    dec_plan pl;
    if ((st = dec_prepare(p, op, &pl)) != AKV_OK) return st;
    const akv_attn_split &sp = pl.sp;
    size_t need = 0, lse_off = 0, cnt_off = 0;
    if ((st = akv__attn_decode_workspace_layout(p, &sp, &lse_off, &cnt_off, &need)) != AKV_OK) return st;
    if (need > 0 && (workspace_bytes < need || workspace.addr == 0 || workspace.addr % 256 != 0)) {
        AKV_LOG_E("attn %s: the workspace (0x%llx, %zu bytes) is not a 256-aligned buffer of the %zu bytes "
                  "this split (%u partitions of %u keys) needs", op, (unsigned long long)workspace.addr,
                  workspace_bytes, need, sp.n_parts, sp.part_tokens);
        return AKV_EINVAL;
    }
    const int D = (int)p->kv.head_dim;
    dec_args a;
    a.kv = attn_kv_view(&p->kv);
    a.q = reinterpret_cast<const void *>(p->q.addr);
    a.q_f32 = p->q_dtype == AKV_DTYPE_F32;
    a.q_stride = p->q_stride ? p->q_stride : (long long)p->n_heads * D;
    a.o = reinterpret_cast<void *>(p->o.addr);
    a.o_f32 = p->o_dtype == AKV_DTYPE_F32;
    a.lse = reinterpret_cast<float *>(p->lse.addr);
    a.ws_o = need ? reinterpret_cast<float *>(workspace.addr) : nullptr;
    a.ws_lse = need ? reinterpret_cast<float *>(workspace.addr + lse_off) : nullptr;
    a.ws_cnt = need ? reinterpret_cast<unsigned *>(workspace.addr + cnt_off) : nullptr;
    a.n_heads = (int)p->n_heads;
    a.n_query = (int)p->n_query;
    a.group = pl.rows / a.n_query;
    a.rows = pl.rows;
    a.n_row_tiles = pl.n_row_tiles;
    a.n_parts = (int)sp.n_parts;
    a.part_tokens = (int)sp.part_tokens;
    a.scale_log2 = akv__attn_scale(p->scale, p->kv.head_dim) * ATTN_LOG2E;
    a.prefetch = p->prefetch_history;
    a.n_mask = p->kv.past ? 0 : a.n_query;
    /* the merge is fused: a cluster or the last block of each (sequence, head) does it */
    return attn_launch_dependent(pl.pick.kernel, pl.grid, pl.pick.threads, pl.pick.smem,
                                 static_cast<cudaStream_t>(stream), a, pl.pick.cluster);
}
