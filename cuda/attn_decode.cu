/*
 * attn_decode.cu — paged split-KV decode: 1..4 new queries per sequence, GQA, bf16 pages,
 * FP32 accumulation on the tensor cores, and the merge of the partitions.
 *
 * Work decomposition. One block (4 warps) per (partition p, K/V head h x row tile, sequence s).
 * Its query rows are the group's heads times the sequence's queries, row r = qi*group + gi
 * (query qi, head h*group + gi), padded to 16 (MT = 1) or 32 (MT = 2) rows; more rows take
 * more row tiles (blockIdx.y). The block streams its partition's keys in tiles of 64
 * through a STAGES-deep cp.async ring; warp w takes keys 16w..16w+15 of each tile, keeps its
 * own online-softmax state (m, l in the log2 domain, O), and the 4 warp states are merged in
 * shared memory in warp order at the end. So K/V is read once per GQA group, whatever the
 * number of queries, and the query rows ride along on tensor-core columns that are free
 * anyway.
 *
 * Partitions (akv_attn_split_plan): positions [p*part_tokens, (p+1)*part_tokens). A sequence
 * of len keys uses n_used = min(n_parts, ceil(len/part_tokens)) of them; a block whose
 * partition starts past the length returns at once (partition 0 always runs, so a sequence
 * of length 0 still gets its empty output). With n_used <= 1 the block writes the final
 * output. Otherwise it writes an f32 partial state (o normalised, lse natural) to the
 * workspace, and the LAST block of its (sequence, K/V head, row tile) to arrive merges
 * partitions 0..n_used-1 in place of a second kernel: every block fences its state
 * (__threadfence) and bumps an arrival counter in the workspace; the block that sees
 * n_used-1 resets the counter to 0 (so a workspace stays ready for the next call) and
 * merges. The merge reads every state back from the workspace in a fixed order that depends
 * on (n_used, rows, D) only, never on which block came last, so results are bitwise
 * reproducible. Nothing depends on where pages lie: same contents, same bits.
 *
 * Numerics: scores s = q.k in f32 on bf16 operands; exponent base 2 with the scale folded
 * into log2(e)*scale; probabilities rounded to bf16 for the P V product, and the row sum l
 * adds the same rounded values, so the normalisation matches the weights used. A row with
 * no visible key keeps m = -inf, l = 0 and ends as the empty state (o = 0, lse = -inf).
 */
#include "attn_common.cuh"

/* ST: the cp.async ring depth (akv__attn_decode_stages: 3 at d=128, 4 at d=64 in variant 0,
 * one less in variants 1 and 2). */
template <int D, int ST>
struct dec_cfg {
    static constexpr int TILE = 64;                        /* keys per stage */
    static constexpr int STAGES = ST;                      /* cp.async ring depth */
    static constexpr int KV_BYTES = TILE * D * 2;          /* one of K, V for a tile */
    static constexpr int STAGE_BYTES = 2 * KV_BYTES;
    static constexpr int Q_BYTES = 32 * D * 2;             /* up to 32 query rows */
    static constexpr int SMEM = STAGES * STAGE_BYTES + Q_BYTES;
    /* the end-of-block scratch (4 warps x 32 rows x D floats, m and l) reuses the ring and
     * the query tile (both dead once the key loop is over) */
    static_assert(STAGES >= 2, "one tile loads while another is used");
    static_assert(4 * 32 * D * 4 + 2 * 4 * 32 * 4 <= SMEM, "scratch fits the ring and the query tile");
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
};

/* Issue the cp.async of keys t0..t0+63 (K and V) into one stage; positions >= t_end are
 * zero-filled. 128 threads, D/8 chunks per row (V lies n_kv*P rows after K in the same page).
 * Pages of at least a tile (P >= 64; tiles start at multiples of 64) hold the whole tile:
 * `page` is its page id, looked up by the caller one tile ahead (dec_tile_page), so no load
 * of the page table stands between the loop and the copies. Smaller pages: one lookup per
 * row (page = -1). */
template <int D, int ST>
static __device__ __forceinline__ void dec_load_tile(const attn_kv &kv, int pb, int h, int t0, int t_end,
                                                     uint32_t stage, int tid, int page) {
    constexpr int CPR = D / 8, RPP = 128 / CPR; /* chunks per row, rows per pass */
    const int c = tid % CPR;
    const size_t v_off = ((size_t)kv.n_kv << kv.log2_p) * (D * 2);
    const unsigned char *tile =
        page >= 0 ? kv.pool + (size_t)page * kv.page_bytes +
                        (((size_t)h << kv.log2_p) + (size_t)(t0 & ((1 << kv.log2_p) - 1))) * (D * 2)
                  : nullptr;
#pragma unroll
    for (int i = 0; i < 64 / RPP; i++) {
        const int r = tid / CPR + i * RPP, t = t0 + r;
        const bool valid = t < t_end;
        const unsigned char *row = page >= 0 ? tile + (size_t)r * (D * 2) : attn_row<D>(kv, pb, 0, h, valid ? t : t0);
        const unsigned char *k = valid ? row + c * 16 : kv.pool;
        attn_cp16(stage + attn_swz<D>(r, c), k, valid);
        attn_cp16(stage + dec_cfg<D, ST>::KV_BYTES + attn_swz<D>(r, c), valid ? k + v_off : kv.pool, valid);
    }
}

/* The page id holding the tile at t0 when pages hold whole tiles (P >= 64) and the tile has a
 * visible key (t0 < t_end: never a lookup past the sequence's pages); -1 otherwise (per-row
 * lookups, or nothing to load). */
static __device__ __forceinline__ int dec_tile_page(const attn_kv &kv, int pb, int t0, int t_end) {
    return kv.log2_p >= 6 && t0 < t_end ? __ldg(kv.indices + pb + (t0 >> kv.log2_p)) : -1;
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

/* The partition weight of a state: exp(lse_p - M) (0 for an empty state or row). Phase A
 * and phase B of dec_merge compute it from the same inputs, so the sum and the weights
 * agree bit for bit. */
static __device__ __forceinline__ float dec_weight(float lse_p, float M) {
    return (M == -INFINITY || lse_p == -INFINITY) ? 0.0f : expf(lse_p - M);
}

/* Merge of partitions 0..n_used-1 of rows row0..row0+R-1 (those < rows) by the last block
 * to arrive, 128 threads, into the final output. The workspace is read through L2 (__ldcg:
 * other blocks wrote it during this launch). Phase A, a warp per row: M = max lse_p, S =
 * sum w_p (lanes stride the partitions, then a fixed shuffle tree). Phase B: items are
 * (row, 4 columns); when fewer than 128, the partitions are cut into ns = 128/items
 * contiguous slices, each summed in partition order with 8 loads in flight, and the slices
 * added in slice order. o = O / S, lse = M + log S. */
template <int D, int R>
static __device__ void dec_merge(const dec_args &a, int s, int h, int row0, int n_used, unsigned char *smem,
                                 int tid) {
    constexpr int C4 = D / 4;
    float *s_m = reinterpret_cast<float *>(smem);           /* [R] */
    float *s_s = s_m + R;                                   /* [R] */
    float4 *s_acc = reinterpret_cast<float4 *>(smem + 256); /* [128] slice partial sums */
    static_assert(2 * R * 4 <= 256, "row statistics fit before the slice sums");
    const int lane = tid & 31, warp = tid >> 5;
    const int nr = min(R, a.rows - row0);
    /* state (p, r) of these rows: index base + p*rows + r */
    const size_t base = (size_t)(s * a.kv.n_kv + h) * a.n_parts * a.rows + row0;
    for (int r = warp; r < nr; r += 4) {
        const float *lp = a.ws_lse + base + r;
        float M = -INFINITY, S = 0.0f;
        for (int p = lane; p < n_used; p += 32) M = fmaxf(M, __ldcg(lp + (size_t)p * a.rows));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(ATTN_FULL_MASK, M, o));
        for (int p = lane; p < n_used; p += 32) S += dec_weight(__ldcg(lp + (size_t)p * a.rows), M);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(ATTN_FULL_MASK, S, o);
        if (lane == 0) s_m[r] = M, s_s[r] = S;
    }
    __syncthreads();
    const int n_items = nr * C4;
    const int ns = max(1, min(8, 128 / n_items)), chunk = (n_used + ns - 1) / ns;
    const size_t step = (size_t)a.rows * D;
    for (int t = tid; t < n_items * ns; t += 128) {
        const int item = t % n_items, j = t / n_items, r = item / C4, c4 = item % C4;
        const float M = s_m[r];
        const float *src = a.ws_o + (base + r) * D + c4 * 4, *lsrc = a.ws_lse + base + r;
        const int p1 = min(n_used, (j + 1) * chunk);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int p = j * chunk;
        for (; p + 8 <= p1; p += 8) {
            float4 x[8];
            float l[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                x[u] = __ldcg(reinterpret_cast<const float4 *>(src + (size_t)(p + u) * step));
                l[u] = __ldcg(lsrc + (size_t)(p + u) * a.rows);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float w = dec_weight(l[u], M);
                acc.x += w * x[u].x, acc.y += w * x[u].y, acc.z += w * x[u].z, acc.w += w * x[u].w;
            }
        }
        for (; p < p1; p++) {
            const float4 x = __ldcg(reinterpret_cast<const float4 *>(src + (size_t)p * step));
            const float w = dec_weight(__ldcg(lsrc + (size_t)p * a.rows), M);
            acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
        }
        if (ns > 1) s_acc[t] = acc; /* t = j*n_items + item < 128 */
        else dec_merge_store<D>(a, s, h, row0 + r, c4, acc, M, s_s[r]);
    }
    if (ns > 1) {
        __syncthreads();
        if (tid < n_items) {
            float4 acc = s_acc[tid];
            for (int j = 1; j < ns; j++) {
                const float4 x = s_acc[j * n_items + tid];
                acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
            }
            const int r = tid / C4;
            dec_merge_store<D>(a, s, h, row0 + r, tid % C4, acc, s_m[r], s_s[r]);
        }
    }
}

/* MINB: the blocks per multiprocessor the split counts on, as a register bound for the
 * compiler (1 = no bound: variant 0's code as it was measured). */
template <int D, int MT, int ST, int MINB>
__global__ void __launch_bounds__(128, MINB) attn_decode_kernel(const dec_args a) {
    using C = dec_cfg<D, ST>;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int part = blockIdx.x;
    const int h = blockIdx.y / a.n_row_tiles, rt = blockIdx.y % a.n_row_tiles;
    const int s = blockIdx.z;
    const int pb = a.kv.indptr[s];
    const int len = attn_seq_len(a.kv, s);
    const int k0 = part * a.part_tokens;
    const int k1 = min(k0 + a.part_tokens, len);
    const int n_used = len > 0 ? min(a.n_parts, (len - 1) / a.part_tokens + 1) : 0;
    const bool direct = n_used <= 1; /* this block alone writes the output */
    if (part > 0 && k0 >= len) return; /* an empty partition: nobody waits for it */
    const int n_tiles = k1 > k0 ? (k1 - k0 + C::TILE - 1) / C::TILE : 0;
    const int row0 = rt * 16 * MT;
    const uint32_t ring = attn_smem_addr(smem);
    unsigned char *sq = smem + C::STAGES * C::STAGE_BYTES;
    const uint32_t sq_u = attn_smem_addr(sq);

    /* 1. the query rows into registers (their loads overlap the page-table lookups), the
     *    first STAGES-1 tiles in flight, then the rows into shared memory as bf16, swizzled;
     *    padding rows are zero */
    constexpr int QPT = 16 * MT * (D / 8) / 128; /* 16-byte chunks of q per thread */
    uint4 qv[QPT];
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int idx = tid + i * 128, r = idx / (D / 8), c = idx % (D / 8), gr = row0 + r;
        qv[i] = make_uint4(0, 0, 0, 0);
        if (gr < a.rows) {
            const int qi = gr / a.group, gi = gr - qi * a.group;
            const size_t off = (size_t)(s * a.n_query + qi) * a.q_stride + (size_t)(h * a.group + gi) * D + c * 8;
            qv[i] = attn_load8_bf16(a.q, a.q_f32, off);
        }
    }
    for (int st = 0; st < C::STAGES - 1; st++) {
        if (st < n_tiles)
            dec_load_tile<D, ST>(a.kv, pb, h, k0 + st * C::TILE, k1, ring + st * C::STAGE_BYTES, tid,
                                 dec_tile_page(a.kv, pb, k0 + st * C::TILE, k1));
        attn_cp_commit();
    }
    /* the page of the next tile to load, looked up a tile ahead */
    int next_page = C::STAGES - 1 < n_tiles ? dec_tile_page(a.kv, pb, k0 + (C::STAGES - 1) * C::TILE, k1) : -1;
#pragma unroll
    for (int i = 0; i < QPT; i++) {
        const int idx = tid + i * 128;
        *reinterpret_cast<uint4 *>(sq + attn_swz<D>(idx / (D / 8), idx % (D / 8))) = qv[i];
    }
    /* One row tile (16 rows) of q stays in registers as MMA fragments for the whole key loop
     * (D/4 registers) instead of D/16 shared-memory loads per tile: where the registers are
     * there (not d=128 under variant 1/2's 3-blocks-per-SM bound, not 32 rows). */
    constexpr bool QREG = MT == 1 && (D == 64 || MINB == 1);
    uint32_t qr[QREG ? D / 16 : 1][4];
    if (QREG) {
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < (QREG ? D / 16 : 0); ks++)
            attn_ldsm_x4(qr[ks], sq_u + attn_swz<D>(lane & 15, 2 * ks + (lane >> 4)));
    }
    /* the causal rule: row qi of n sees keys <= len - n + qi (padding rows see all) */
    int limit[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            limit[mt][hf] = len - a.n_query + (row0 + mt * 16 + (lane >> 2) + hf * 8) / a.group;
    const int all_see = len - a.n_query; /* keys <= this are visible to every row */

    float m[MT][2], l[MT][2], acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
    }

    /* 2. the key tiles */
    for (int it = 0; it < n_tiles; it++) {
        attn_cp_wait<C::STAGES - 2>();
        __syncthreads(); /* tile `it` landed for all; everyone is done with the stage refilled next */
        {
            const int nt = it + C::STAGES - 1;
            if (nt < n_tiles) {
                dec_load_tile<D, ST>(a.kv, pb, h, k0 + nt * C::TILE, k1, ring + (nt % C::STAGES) * C::STAGE_BYTES, tid,
                                     next_page);
                if (nt + 1 < n_tiles) next_page = dec_tile_page(a.kv, pb, k0 + (nt + 1) * C::TILE, k1);
            }
            attn_cp_commit();
        }
        const uint32_t kb = ring + (it % C::STAGES) * C::STAGE_BYTES, vb = kb + C::KV_BYTES;
        const int t0 = k0 + it * C::TILE + warp * 16; /* this warp's 16 keys */

        /* S = Q K^T: [16*MT rows] x [16 keys] */
        float sc[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[mt][0][e] = sc[mt][1][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t kf[4];
            attn_ldsm_x4(kf, kb + attn_swz<D>(warp * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (QREG) {
                    attn_mma(sc[mt][0], qr[QREG ? ks : 0], kf[0], kf[1]);
                    attn_mma(sc[mt][1], qr[QREG ? ks : 0], kf[2], kf[3]);
                } else {
                    uint32_t qf[4];
                    attn_ldsm_x4(qf, sq_u + attn_swz<D>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
                    attn_mma(sc[mt][0], qf, kf[0], kf[1]);
                    attn_mma(sc[mt][1], qf, kf[2], kf[3]);
                }
            }
        }
        /* mask keys past the partition or past the row's causal limit */
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
        /* online softmax, then O += P V with P [16*MT rows] x [16 keys] from the S fragments */
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            attn_softmax_step<2, D / 8>(sc[mt], acc[mt], m[mt][0], l[mt][0], 0, a.scale_log2);
            attn_softmax_step<2, D / 8>(sc[mt], acc[mt], m[mt][1], l[mt][1], 1, a.scale_log2);
            attn_pack_p(sc[mt][0], sc[mt][1], pa[mt]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t vf[4];
            attn_ldsm_x4_t(vf, vb + attn_swz<D>(warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                attn_mma(acc[mt][2 * dp], pa[mt], vf[0], vf[1]);
                attn_mma(acc[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
            }
        }
    }

    /* 3. the warps' states into shared memory (the ring is free once every copy landed) */
    attn_cp_wait<0>();
    __syncthreads();
    constexpr int R = 16 * MT;
    float *so = reinterpret_cast<float *>(smem); /* [4][R][D] */
    float *sm = so + 4 * R * D;                  /* [4][R] */
    float *sl = sm + 4 * R;                      /* [4][R] */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float lsum = attn_quad_sum(l[mt][hf]);
            const int r = mt * 16 + (lane >> 2) + hf * 8;
            if ((lane & 3) == 0) sm[warp * R + r] = m[mt][hf], sl[warp * R + r] = lsum;
#pragma unroll
            for (int dn = 0; dn < D / 8; dn++)
                *reinterpret_cast<float2 *>(so + (size_t)(warp * R + r) * D + dn * 8 + (lane & 3) * 2) =
                    make_float2(acc[mt][dn][2 * hf], acc[mt][dn][2 * hf + 1]);
        }
    __syncthreads();

    /* 4. merge the 4 warps in order and write the final output or the partition's state */
    for (int idx = tid; idx < R * D; idx += 128) {
        const int r = idx / D, c = idx % D, gr = row0 + r;
        if (gr >= a.rows) continue;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++) M = fmaxf(M, sm[w * R + r]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float mw = sm[w * R + r];
            const float f = mw == -INFINITY ? 0.0f : attn_exp2(mw - M);
            L += f * sl[w * R + r];
            O += f * so[(size_t)(w * R + r) * D + c];
        }
        const bool empty = !(L > 0.0f);
        const float out = empty ? 0.0f : O / L;
        const float lse = empty ? -INFINITY : (M + log2f(L)) * ATTN_LN2;
        const int qi = gr / a.group, gi = gr - qi * a.group;
        if (direct) {
            const size_t orow = (size_t)(s * a.n_query + qi) * a.n_heads + h * a.group + gi;
            attn_store1(a.o, a.o_f32, orow * D + c, out);
            if (c == 0 && a.lse) a.lse[orow] = lse;
        } else {
            const size_t prow = ((size_t)(s * a.kv.n_kv + h) * a.n_parts + part) * a.rows + gr;
            a.ws_o[prow * D + c] = out;
            if (c == 0) a.ws_lse[prow] = lse;
        }
    }
    if (direct) return;

    /* 5. arrival: the last block of this (sequence, head, row tile) merges the partitions */
    __shared__ int s_last;
    __threadfence(); /* this thread's partial state is visible device-wide before the count */
    __syncthreads();
    if (tid == 0) {
        unsigned *cnt = a.ws_cnt + (size_t)s * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(cnt, 1u) == (unsigned)(n_used - 1);
        if (last) atomicExch(cnt, 0u); /* every other block has counted: ready for the next call */
        __threadfence(); /* the others' states, fenced before their counts, are read after ours */
        s_last = last;
    }
    __syncthreads();
    if (s_last) dec_merge<D, R>(a, s, h, row0, n_used, smem, tid);
}

template <int D, int MT, int ST, int MINB>
static akv_status dec_launch(const dec_args &a, dim3 grid, cudaStream_t stream) {
    using C = dec_cfg<D, ST>;
    static_assert(C::SMEM <= 227 * 1024, "decode block fits an H100/H200 SM");
    AKV_CUDA_TRY(cudaFuncSetAttribute(attn_decode_kernel<D, MT, ST, MINB>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    attn_decode_kernel<D, MT, ST, MINB><<<grid, 128, C::SMEM, stream>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}

static akv_status dec_check(const akv_attn_decode *p, const char *op) {
    akv_status st = akv__attn_decode_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = attn_cuda_kv_check(&p->kv, op)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->q_dtype, "q_dtype", op)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->o_dtype, "o_dtype", op)) != AKV_OK) return st;
    const uint32_t q_stride = p->q_stride ? p->q_stride : p->n_heads * p->kv.head_dim;
    return attn_cuda_align_check(p->q, (uint64_t)q_stride * akv_dtype_size(p->q_dtype), "q", op);
}

/* The split of a checked decode for one variant, on the current device. */
static akv_status dec_split(const akv_attn_decode *p, uint32_t variant, akv_attn_split *out) {
    uint32_t n_sm;
    size_t smem;
    akv_status st = attn_cuda_device(&n_sm, &smem);
    if (st != AKV_OK) return st;
    return akv_attn_split_plan_variant((uint64_t)p->kv.max_pages * p->kv.page_tokens,
                                       p->kv.n_seq ? p->kv.n_seq : 1, p->kv.n_kv_heads,
                                       p->kv.head_dim, n_sm, smem, variant, out);
}

extern "C" akv_status akv_attn_cuda_decode_split(const akv_attn_decode *p, akv_attn_split *out) {
    akv_status st = dec_check(p, "cuda decode split");
    if (st != AKV_OK) return st;
    return dec_split(p, akv_attn_decode_variant_for(p->kv.n_seq), out);
}

extern "C" akv_status akv_attn_cuda_decode(const akv_attn_decode *p, akv_dptr workspace,
                                           size_t workspace_bytes, void *stream) {
    const char *op = "cuda decode";
    akv_status st = dec_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    akv_attn_split sp;
    size_t need = 0, lse_off = 0, cnt_off = 0;
    const uint32_t variant = akv_attn_decode_variant_for(p->kv.n_seq); /* the split and the ring agree */
    if ((st = dec_split(p, variant, &sp)) != AKV_OK) return st;
    if ((st = akv__attn_decode_workspace_layout(p, &sp, &lse_off, &cnt_off, &need)) != AKV_OK) return st;
    if (need > 0 && (workspace_bytes < need || workspace.addr == 0 || workspace.addr % 256 != 0)) {
        AKV_LOG_E("attn %s: the workspace (0x%llx, %zu bytes) is not a 256-aligned buffer of the %zu bytes "
                  "this split (%u partitions of %u keys) needs", op, (unsigned long long)workspace.addr,
                  workspace_bytes, need, sp.n_parts, sp.part_tokens);
        return AKV_EINVAL;
    }
    const int D = (int)p->kv.head_dim, group = (int)(p->n_heads / p->kv.n_kv_heads);
    const int rows = group * (int)p->n_query, mt = rows <= 16 ? 1 : 2, n_row_tiles = (rows + 16 * mt - 1) / (16 * mt);
    if ((uint64_t)p->kv.n_kv_heads * n_row_tiles > 65535) {
        AKV_LOG_E("attn %s: %u K/V heads x %d row tiles exceed a grid dimension", op, p->kv.n_kv_heads, n_row_tiles);
        return AKV_EUNSUPPORTED;
    }
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
    a.group = group;
    a.n_query = (int)p->n_query;
    a.rows = rows;
    a.n_row_tiles = n_row_tiles;
    a.n_parts = (int)sp.n_parts;
    a.part_tokens = (int)sp.part_tokens;
    a.scale_log2 = akv__attn_scale(p->scale, p->kv.head_dim) * ATTN_LOG2E;
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    const dim3 grid(sp.n_parts, p->kv.n_kv_heads * n_row_tiles, p->kv.n_seq);
    /* the ring depth of the variant: must match what the plan sized the split for */
    const uint32_t stages = akv__attn_decode_stages((uint32_t)D, variant);
    if (D == 128 && stages == 3) st = mt == 1 ? dec_launch<128, 1, 3, 1>(a, grid, cs) : dec_launch<128, 2, 3, 1>(a, grid, cs);
    /* d=128 with 32 rows needs 235 registers: bound to 3 blocks per SM it spills, so it keeps
     * 2 (the plan counts 3; only GQA groups above 4 x queries take it) */
    else if (D == 128) st = mt == 1 ? dec_launch<128, 1, 2, 3>(a, grid, cs) : dec_launch<128, 2, 2, 1>(a, grid, cs);
    else if (stages == 4) st = mt == 1 ? dec_launch<64, 1, 4, 1>(a, grid, cs) : dec_launch<64, 2, 4, 1>(a, grid, cs);
    else st = mt == 1 ? dec_launch<64, 1, 3, 4>(a, grid, cs) : dec_launch<64, 2, 3, 4>(a, grid, cs);
    return st; /* the merge is fused: the last block of each (sequence, head) does it */
}
