/*
 * attn_prefill.cu — chunked causal prefill over a paged history (flash-attention style).
 *
 * The chunk's K/V is first written into its page slots (attn_append.cu), then every chunk
 * row attends keys 0..hist+i from the pages, where hist = len - chunk and i is the row's
 * index in the chunk (the causal rule of akv/attn.h). Over a past part (kv.past: older
 * history, every key before every row) hist = len and every row sees keys 0..len-1: the
 * mask then hides only the keys past the sequence in its last tile.
 *
 * Work decomposition. One block (4 warps, 128 threads) per (tile of 128 chunk rows, query
 * head, sequence); blockIdx.x runs the row tiles last-first, so the longest blocks (the
 * most keys under the causal mask) start first. Warp w owns rows 32w..32w+31 (two m16
 * tiles). The block walks key tiles of 64 with one K and one V buffer, FA2-style: V(j) is
 * loaded while S = Q K(j)^T and the softmax run, K(j+1) while P V(j) runs. Only tiles that
 * cross a warp's diagonal are masked. Rows of the block's query head only: the G query
 * heads of a GQA group read the same K/V tiles, through L2.
 *
 * Numerics as in attn_decode.cu: f32 scores and accumulators, base-2 exponent with the
 * scale folded in, P rounded to bf16 for the tensor cores and summed as rounded.
 *
 * Two kernels. The mma.sync kernel above runs on every device and both head sizes. The wgmma
 * kernel (head_dim 128, sm_90a builds on devices of compute capability 9) gives each block
 * two warpgroups of 64 rows over the same 128 chunk rows, walks key tiles of 128 through two
 * shared-memory stages (the tile after next loads while this one computes) and issues both
 * products as warpgroup matrix products from shared memory (attn_wgmma.cuh): S = Q K^T with
 * Q and K in their panels, O += P V with P in registers. The two warpgroups run their
 * softmax while the other's products hold the tensor cores. A warpgroup whose rows all lie
 * before a key tile skips it. akv_attn_prefill.kernel picks one (AUTO: wgmma where it can run).
 */
#include "attn_common.cuh"
#include "attn_wgmma.cuh"

template <int D>
struct pf_cfg {
    static constexpr int BR = 128, BC = 64;
    static constexpr int Q_BYTES = BR * D * 2;
    static constexpr int KV_BYTES = BC * D * 2;
    static constexpr int SMEM = Q_BYTES + 2 * KV_BYTES; /* Q, K, V */
};

struct pf_args {
    attn_kv kv;
    const int *qo_indptr; /* [n_seq+1] */
    const void *q;        /* [n_tokens] rows of q_stride elements */
    int q_f32;
    long long q_stride;
    void *o; /* [n_tokens][n_heads][D] */
    int o_f32;
    float *lse; /* [n_tokens][n_heads] or null */
    int n_heads, group, n_q_tiles;
    int past; /* 1: the table is a past part (no causal mask) */
    float scale_log2;
};

/* cp.async of K or V rows t0..t0+63 of head h into a swizzled [64][D] tile; positions >=
 * t_end are zero-filled. */
template <int D>
static __device__ __forceinline__ void pf_load_kv(const attn_kv &kv, int pb, int kvsel, int h, int t0,
                                                  int t_end, uint32_t dst, int tid) {
    constexpr int CPR = D / 8, RPP = 128 / CPR;
    const int c = tid % CPR;
#pragma unroll
    for (int i = 0; i < 64 / RPP; i++) {
        const int r = tid / CPR + i * RPP, t = t0 + r;
        const bool valid = t < t_end;
        const unsigned char *src = valid ? attn_row<D>(kv, pb, kvsel, h, t) + c * 16 : kv.pool;
        attn_cp16(dst + attn_swz<D>(r, c), src, valid);
    }
}

/* Where a block works: chunk rows m0..m0+rows_here-1 of sequence blockIdx.z (row tiles of br,
 * the last launched first), query head `head` over K/V head h, the hist keys before the
 * chunk (a past part: all of them), and kv_end, the keys any of its rows sees. False for a
 * tile past the chunk. */
struct pf_block {
    int head, h, qs, m0, pb, hist, rows_here, kv_end;
};
static __device__ __forceinline__ bool pf_block_of(const pf_args &a, int br, pf_block &b) {
    const int tile = a.n_q_tiles - 1 - (int)blockIdx.x, s = blockIdx.z;
    b.head = blockIdx.y, b.h = b.head / a.group;
    b.qs = a.qo_indptr[s];
    const int chunk = a.qo_indptr[s + 1] - b.qs;
    b.m0 = tile * br;
    if (b.m0 >= chunk) return false;
    b.pb = a.kv.indptr[s];
    const int len = attn_seq_len(a.kv, s);
    b.hist = a.past ? len : len - chunk;
    b.rows_here = min(br, chunk - b.m0);
    b.kv_end = a.past ? len : b.hist + b.m0 + b.rows_here; /* keys from here are masked */
    return true;
}

/* The causal rule on the scores of an m16 tile whose first row is chunk row `row`, keys t0..:
 * row i sees keys up to hist + i and below kv_end (which the causal rule implies for the
 * rows of a block; a past part's limit). */
template <int NT>
static __device__ __forceinline__ void pf_mask(float (&sc)[NT][4], int t0, int hist, int kv_end, int row,
                                               int lane) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int t = t0 + nt * 8 + (lane & 3) * 2 + (e & 1);
            const int i = row + (lane >> 2) + (e >> 1) * 8;
            if (t > hist + i || t >= kv_end) sc[nt][e] = -INFINITY;
        }
}

/* Row half hf of an m16 tile, block row r: normalised and written, with its lse. All lanes
 * call it (the row's sum is a quad reduction). */
template <int DN>
static __device__ __forceinline__ void pf_store(const pf_args &a, const pf_block &b, int r, const float (&acc)[DN][4],
                                                float m, float l, int hf, int lane) {
    const float lsum = attn_quad_sum(l);
    if (r >= b.rows_here) return;
    const bool empty = !(lsum > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / lsum;
    const size_t orow = (size_t)(b.qs + b.m0 + r) * a.n_heads + b.head;
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
        attn_store2(a.o, a.o_f32, orow * (DN * 8) + dn * 8 + (lane & 3) * 2, acc[dn][2 * hf] * inv,
                    acc[dn][2 * hf + 1] * inv);
    if ((lane & 3) == 0 && a.lse) a.lse[orow] = empty ? -INFINITY : (m + log2f(lsum)) * ATTN_LN2;
}

template <int D>
__global__ void __launch_bounds__(128, 2) attn_prefill_kernel(const pf_args a) {
    using C = pf_cfg<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    pf_block b;
    if (!pf_block_of(a, C::BR, b)) return;
    const int head = b.head, h = b.h, qs = b.qs, m0 = b.m0, pb = b.pb, hist = b.hist;
    const int rows_here = b.rows_here, kv_end = b.kv_end;
    const int n_tiles = (kv_end + C::BC - 1) / C::BC;
    unsigned char *sq = smem;
    const uint32_t sq_u = attn_smem_addr(sq), sk = sq_u + C::Q_BYTES, sv = sk + C::KV_BYTES;

    /* 1. K(0) in flight while the query rows are stored (bf16, swizzled, padding zero) */
    pf_load_kv<D>(a.kv, pb, 0, h, 0, kv_end, sk, tid);
    attn_cp_commit();
    for (int idx = tid; idx < C::BR * (D / 8); idx += 128) {
        const int r = idx / (D / 8), c = idx % (D / 8);
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < rows_here) val = attn_load8_bf16(a.q, a.q_f32, (size_t)(qs + m0 + r) * a.q_stride + (size_t)head * D + c * 8);
        *reinterpret_cast<uint4 *>(sq + attn_swz<D>(r, c)) = val;
    }
    const int wrow = m0 + warp * 32; /* chunk index of this warp's first row */

    float m[2][2], l[2][2], acc[2][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
    }

    for (int j = 0; j < n_tiles; j++) {
        const int t0 = j * C::BC;
        __syncthreads(); /* everyone is done with V(j-1) (and Q is stored) */
        pf_load_kv<D>(a.kv, pb, 1, h, t0, kv_end, sv, tid);
        attn_cp_commit();
        attn_cp_wait<1>();
        __syncthreads(); /* K(j) landed for all */

        /* 2. S = Q K^T: per warp [32 rows] x [64 keys] */
        float sc[2][8][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t qf[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                attn_ldsm_x4(qf[mt], sq_u + attn_swz<D>(warp * 32 + mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
            for (int kp = 0; kp < 4; kp++) {
                uint32_t kf[4];
                attn_ldsm_x4(kf, sk + attn_swz<D>(kp * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    attn_mma(sc[mt][2 * kp], qf[mt], kf[0], kf[1]);
                    attn_mma(sc[mt][2 * kp + 1], qf[mt], kf[2], kf[3]);
                }
            }
        }
        /* 3. the causal mask, on tiles that cross this warp's diagonal or the end only */
        if (t0 + C::BC - 1 > hist + wrow || t0 + C::BC > kv_end) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++) pf_mask<8>(sc[mt], t0, hist, kv_end, wrow + mt * 16, lane);
        }
        /* 4. online softmax in the log2 domain (scores are scaled on the fly) */
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            attn_softmax_step<8, D / 8>(sc[mt], acc[mt], m[mt][0], l[mt][0], 0, a.scale_log2);
            attn_softmax_step<8, D / 8>(sc[mt], acc[mt], m[mt][1], l[mt][1], 1, a.scale_log2);
        }
        /* P as bf16 A fragments now: half the registers of S through the wait below */
        uint32_t pa[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int kk = 0; kk < 4; kk++) attn_pack_p(sc[mt][2 * kk], sc[mt][2 * kk + 1], pa[mt][kk]);
        attn_cp_wait<0>();
        __syncthreads(); /* V(j) landed for all; everyone is done with K(j) */
        if (j + 1 < n_tiles) {
            pf_load_kv<D>(a.kv, pb, 0, h, t0 + C::BC, kv_end, sk, tid);
            attn_cp_commit();
        }
        /* 5. O += P V, 16 keys at a time */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vf[4];
                attn_ldsm_x4_t(vf, sv + attn_swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    attn_mma(acc[mt][2 * dp], pa[mt][kk], vf[0], vf[1]);
                    attn_mma(acc[mt][2 * dp + 1], pa[mt][kk], vf[2], vf[3]);
                }
            }
        }
    }

    /* 6. normalise and write the rows of the chunk */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            pf_store<D / 8>(a, b, warp * 32 + mt * 16 + (lane >> 2) + hf * 8, acc[mt], m[mt][hf], l[mt][hf], hf,
                            lane);
}

/* ---- the wgmma kernel ------------------------------------------------------------------- */

struct pw_cfg {
    static constexpr int D = 128, BR = 128, BC = 128, THREADS = 256;
    static constexpr int Q_BYTES = BR * D * 2, KV_BYTES = BC * D * 2, STAGE = 2 * KV_BYTES;
    static constexpr int SMEM = Q_BYTES + 2 * STAGE + 1024; /* + the slack of a 1024-byte base */
};

/* cp.async of the K and V rows t0..t0+127 of head h into their swizzled panels; positions >=
 * t_end are zero-filled. The V row of a slot is the K row's n_kv << log2_p rows on. */
static __device__ __forceinline__ void pw_load_kv(const attn_kv &kv, int pb, int h, int t0,
                                                  int t_end, uint32_t sk, uint32_t sv, int tid) {
    using C = pw_cfg;
    const int c = tid & 15;
    const size_t v_off = ((size_t)kv.n_kv << kv.log2_p) * (C::D * 2);
#pragma unroll
    for (int i = 0; i < C::BC / 16; i++) {
        const int r = (tid >> 4) + 16 * i, t = t0 + r;
        const bool valid = t < t_end;
        const unsigned char *src = valid ? attn_row<C::D>(kv, pb, 0, h, t) + c * 16 : kv.pool;
        const uint32_t o = wg_swz(C::BC, r, c);
        attn_cp16(sk + o, src, valid);
        attn_cp16(sv + o, valid ? src + v_off : kv.pool, valid);
    }
}

__global__ void __launch_bounds__(256, 1) attn_prefill_wg_kernel(const pf_args a) {
    using C = pw_cfg;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = attn_smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *gq = smem_raw + (base - raw); /* the Q panels, by generic pointer */
    const uint32_t sq = base, sk0 = base + C::Q_BYTES;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    pf_block b;
    if (!pf_block_of(a, C::BR, b)) return;
    const int head = b.head, h = b.h, qs = b.qs, m0 = b.m0, pb = b.pb, hist = b.hist;
    const int rows_here = b.rows_here, kv_end = b.kv_end;
    const int n_tiles = (kv_end + C::BC - 1) / C::BC;

    pw_load_kv(a.kv, pb, h, 0, kv_end, sk0, sk0 + C::KV_BYTES, tid);
    attn_cp_commit();
    for (int idx = tid; idx < C::BR * (C::D / 8); idx += C::THREADS) {
        const int r = idx >> 4, c = idx & 15;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < rows_here)
            val = attn_load8_bf16(a.q, a.q_f32,
                                  (size_t)(qs + m0 + r) * a.q_stride + (size_t)head * C::D + c * 8);
        *reinterpret_cast<uint4 *>(gq + wg_swz(C::BR, r, c)) = val;
    }
    const int wg_row = m0 + wg * 64;            /* chunk index of the warpgroup's first row */
    const int w_row = wg_row + (warp & 3) * 16; /* ... and of this warp's */
    const uint32_t sq_wg = sq + (uint32_t)wg * 64 * 128; /* its 64 rows of each Q panel */

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[16][4], sc[16][4];
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = sc[n][e] = 0.0f;

    for (int j = 0; j < n_tiles; j++) {
        const int t0 = j * C::BC;
        const uint32_t sk = sk0 + (uint32_t)(j & 1) * C::STAGE, sv = sk + C::KV_BYTES;
        attn_cp_wait<0>();
        wg_fence_smem();
        __syncthreads(); /* tile j (and Q) landed for all; every product of tile j-1 is done */
        if (j + 1 < n_tiles) {
            const uint32_t nk = sk0 + (uint32_t)((j + 1) & 1) * C::STAGE;
            pw_load_kv(a.kv, pb, h, t0 + C::BC, kv_end, nk, nk + C::KV_BYTES, tid);
            attn_cp_commit();
        }
        /* the causal mask hides this tile from every row of the warpgroup */
        if (t0 > hist + wg_row + 63) continue;

        /* S = Q K^T: [64 rows] x [128 keys] a warpgroup, 8 steps of 16 along the head */
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < C::D / 16; ks++) {
            const uint32_t koff = (uint32_t)(ks & 3) * 32; /* within the panel */
            wg_mma_ss(sc, wg_desc(sq_wg + (uint32_t)(ks >> 2) * C::BR * 128 + koff, 16, 1024),
                      wg_desc(sk + (uint32_t)(ks >> 2) * C::BC * 128 + koff, 16, 1024), ks > 0);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin(sc);
        if (t0 + C::BC - 1 > hist + w_row || t0 + C::BC > kv_end)
            pf_mask<16>(sc, t0, hist, kv_end, w_row, lane);
        attn_softmax_step<16, 16>(sc, acc, m[0], l[0], 0, a.scale_log2);
        attn_softmax_step<16, 16>(sc, acc, m[1], l[1], 1, a.scale_log2);
        uint32_t pa[8][4];
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            attn_pack_p(sc[2 * kk], sc[2 * kk + 1], pa[kk]);

        /* O += P V: 8 steps of 16 keys; V read down its rows (MN-major) */
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < C::BC / 16; kk++)
            wg_mma_rs_t(acc, pa[kk], wg_desc(sv + (uint32_t)kk * 16 * 128, C::BC * 128, 1024));
        wg_commit();
        wg_wait<0>();
        wg_pin(acc);
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        pf_store<16>(a, b, wg * 64 + (warp & 3) * 16 + (lane >> 2) + hf * 8, acc, m[hf], l[hf], hf, lane);
}

template <int D>
static akv_status pf_launch(const pf_args &a, dim3 grid, cudaStream_t stream) {
    AKV_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      pf_cfg<D>::SMEM));
    attn_prefill_kernel<D><<<grid, 128, pf_cfg<D>::SMEM, stream>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}

static akv_status pw_launch(const pf_args &a, dim3 grid, cudaStream_t stream) {
    AKV_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_wg_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, pw_cfg::SMEM));
    attn_prefill_wg_kernel<<<grid, pw_cfg::THREADS, pw_cfg::SMEM, stream>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}

/* Whether the wgmma kernel can run here: built for sm_90a, a compute capability 9 device. */
static akv_status pw_available(bool *yes) {
    *yes = false;
#if defined(AKV_CUDA_WGMMA)
    int dev = 0, major = 0;
    AKV_CUDA_TRY(cudaGetDevice(&dev));
    AKV_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    *yes = major == 9;
#endif
    return AKV_OK;
}

extern "C" akv_status akv_attn_cuda_prefill(const akv_attn_prefill *p, void *stream) {
    const char *op = "cuda prefill";
    akv_status st = akv__attn_prefill_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0 || p->n_tokens == 0) return st;
    if (p->kv.repr != AKV_REPR_EXACT) {
        AKV_LOG_E("attn %s: %s pages; the CUDA prefill reads exact pages (akv_attn_cuda_widen "
                  "makes a compact part's)", op, akv_repr_name((akv_repr)p->kv.repr));
        return AKV_EUNSUPPORTED;
    }
    if ((st = attn_cuda_kv_check(&p->kv, op, true)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->q_dtype, "q_dtype", op)) != AKV_OK) return st;
    if ((st = attn_cuda_dtype_check(p->o_dtype, "o_dtype", op)) != AKV_OK) return st;
    const uint32_t D = p->kv.head_dim;
    const uint32_t q_stride = p->q_stride ? p->q_stride : p->n_heads * D;
    if ((st = attn_cuda_align_check(p->q, (uint64_t)q_stride * akv_dtype_size(p->q_dtype), "q", op)) != AKV_OK)
        return st;
    if (p->n_heads > 65535) {
        AKV_LOG_E("attn %s: %u query heads exceed a grid dimension", op, p->n_heads);
        return AKV_EUNSUPPORTED;
    }
    bool wg = false;
    if (p->kernel != AKV_ATTN_PREFILL_MMA && D == 128 && (st = pw_available(&wg)) != AKV_OK)
        return st;
    if (p->kernel == AKV_ATTN_PREFILL_WGMMA && !wg) {
        AKV_LOG_E(
            "attn %s: the wgmma kernel needs head_dim 128 (here %u), an sm_90a build and a compute "
            "capability 9 device",
            op, D);
        return AKV_EUNSUPPORTED;
    }
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    if (p->k_new.addr) {
        st = akv__attn_cuda_append_launch(&p->kv, p->qo_indptr, 0, p->max_chunk, p->k_new, p->v_new,
                                          p->kv_new_dtype, p->kv_stride, cs, op);
        if (st != AKV_OK) return st;
    }
    pf_args a;
    a.kv = attn_kv_view(&p->kv);
    a.qo_indptr = reinterpret_cast<const int *>(p->qo_indptr.addr);
    a.q = reinterpret_cast<const void *>(p->q.addr);
    a.q_f32 = p->q_dtype == AKV_DTYPE_F32;
    a.q_stride = q_stride;
    a.o = reinterpret_cast<void *>(p->o.addr);
    a.o_f32 = p->o_dtype == AKV_DTYPE_F32;
    a.lse = reinterpret_cast<float *>(p->lse.addr);
    a.n_heads = (int)p->n_heads;
    a.group = (int)(p->n_heads / p->kv.n_kv_heads);
    a.past = p->kv.past != 0;
    const int br = wg ? pw_cfg::BR : pf_cfg<128>::BR;
    a.n_q_tiles = (int)((p->max_chunk + br - 1) / br);
    a.scale_log2 = akv__attn_scale(p->scale, D) * ATTN_LOG2E;
    const dim3 grid(a.n_q_tiles, p->n_heads, p->kv.n_seq);
    if (wg) return pw_launch(a, grid, cs);
    return D == 128 ? pf_launch<128>(a, grid, cs) : pf_launch<64>(a, grid, cs);
}
