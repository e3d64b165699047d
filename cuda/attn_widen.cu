/*
 * attn_widen.cu — compact pages of a past part widened to exact bf16 pages with their own
 * table (akv_attn_widen, akv/attn.h), bit for bit as akv_attn_ref_widen makes them.
 *
 * Grid: x = a sequence's widened page j (0 .. max_out-1), y = the sequence, z = row groups of
 * a page; blocks of 4 warps, one warp per row (one K or V of one head and token), lane l
 * holding elements E*l .. E*l + E - 1 (E = head_dim / 32). Each block first finds its
 * sequence's out offset o_s (the pages the sequences before it give: thread 0 sums them, the
 * sequences are few). A row is decoded as the codec decodes it, code x scale in f32 (exact: an
 * f16 scale times a code of at most 8 bits), a q4 K row rotated back by the codec's
 * butterflies (attn_fwht_row, its own inverse), then rounded to bf16 (nearest even). The
 * blocks of page 0 and row group 0 write the sequence's out_indptr and out_last; each
 * page's row group 0 writes its out_indices entry.
 */
#include <cuda_fp16.h>

#include "attn_common.cuh"

struct wd_args {
    attn_kv kv;
    unsigned char *out;        /* exact pages */
    unsigned long long out_page_bytes;
    int *out_indptr, *out_indices, *out_last;
    int first, max_out, n_seq, rows, k_rows, page_tokens;
};

/* The pages sequence s gives: those from `first` on that it has, at most max_out. */
static __device__ __forceinline__ int wd_give(const wd_args &a, int s) {
    const int n = a.kv.indptr[s + 1] - a.kv.indptr[s] - a.first;
    return n <= 0 ? 0 : n < a.max_out ? n : a.max_out;
}

template <int D, int RP>
__global__ void __launch_bounds__(128) attn_widen_kernel(const wd_args a) {
    constexpr int E = D / 32;                     /* elements a lane */
    constexpr int G = RP == AKV_REPR_Q8 ? D : 32; /* elements a scale */
    constexpr int CB = RP == AKV_REPR_Q8 ? D : D / 2; /* code bytes a row */
    constexpr int SPR = D / G;                    /* scales a row */
    __shared__ int s_off;
    const int j = blockIdx.x, s = blockIdx.y, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        int o = 0;
        for (int i = 0; i < s; i++) o += wd_give(a, i);
        s_off = o;
    }
    __syncthreads();
    const int off = s_off, give = wd_give(a, s);
    if (j == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
        a.out_indptr[s] = off;
        if (s == a.n_seq - 1) a.out_indptr[s + 1] = off + give;
        const bool to_end = a.kv.indptr[s] + a.first + give == a.kv.indptr[s + 1];
        a.out_last[s] = give == 0 ? 0 : to_end ? a.kv.last[s] : a.page_tokens;
    }
    if (j >= give) return;
    if (blockIdx.z == 0 && threadIdx.x == 0) a.out_indices[off + j] = off + j;
    const unsigned char *src =
        a.kv.pool + (size_t)__ldg(a.kv.indices + a.kv.indptr[s] + a.first + j) * a.kv.page_bytes;
    unsigned char *dst = a.out + (size_t)(off + j) * a.out_page_bytes;
    for (int row = blockIdx.z * 4 + (threadIdx.x >> 5); row < a.rows; row += gridDim.z * 4) {
        const unsigned char *codes = src + (size_t)row * CB;
        const unsigned short *sc =
            reinterpret_cast<const unsigned short *>(src + a.kv.scales_off) + (size_t)row * SPR;
        const float scale = __half2float(__ushort_as_half(sc[lane * E / G]));
        float x[E];
        if constexpr (RP == AKV_REPR_Q8) {
#pragma unroll
            for (int e = 0; e < E; e++) x[e] = __fmul_rn((float)(signed char)codes[lane * E + e], scale);
        } else {
#pragma unroll
            for (int e = 0; e < E; e += 2) {
                const unsigned b = codes[(lane * E + e) / 2];
                x[e] = __fmul_rn((float)((int)(b & 15u) - 8), scale);
                x[e + 1] = __fmul_rn((float)((int)(b >> 4) - 8), scale);
            }
            if (row < a.k_rows) attn_fwht_row<E>(x, lane);
        }
        __nv_bfloat16 *o = reinterpret_cast<__nv_bfloat16 *>(dst) + (size_t)row * D + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) o[e] = __float2bfloat16_rn(x[e]);
    }
}

template <int D, int RP>
static akv_status wd_launch(const wd_args &a, dim3 grid, cudaStream_t stream) {
    attn_widen_kernel<D, RP><<<grid, 128, 0, stream>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}

extern "C" akv_status akv_attn_cuda_widen(const akv_attn_widen *p, void *stream) {
    const char *op = "cuda widen";
    akv_status st = akv__attn_widen_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0) return st;
    if ((st = attn_cuda_kv_check(&p->kv, op, true)) != AKV_OK) return st;
    if (p->max_out > 2147483647u) { /* grid x */
        AKV_LOG_E("attn %s: max_out %u exceeds a grid dimension", op, p->max_out);
        return AKV_EUNSUPPORTED;
    }
    akv_repr_layout le;
    if ((st = akv_repr_layout_of(AKV_REPR_EXACT, p->kv.dtype, p->kv.n_kv_heads, p->kv.page_tokens,
                                 p->kv.head_dim, &le)) != AKV_OK)
        return st;
    wd_args a;
    a.kv = attn_kv_view(&p->kv);
    a.out = reinterpret_cast<unsigned char *>(p->out_pool.addr);
    a.out_page_bytes = le.page_bytes;
    a.out_indptr = reinterpret_cast<int *>(p->out_indptr.addr);
    a.out_indices = reinterpret_cast<int *>(p->out_indices.addr);
    a.out_last = reinterpret_cast<int *>(p->out_last.addr);
    a.first = (int)p->first;
    a.max_out = (int)p->max_out;
    a.n_seq = (int)p->kv.n_seq;
    a.k_rows = (int)(p->kv.n_kv_heads * p->kv.page_tokens);
    a.rows = 2 * a.k_rows;
    a.page_tokens = (int)p->kv.page_tokens;
    /* enough row groups that a few pages fill the device, at most a page's rows */
    unsigned groups = (unsigned)((a.rows + 3) / 4);
    if (groups > 16) groups = 16;
    const dim3 grid(p->max_out, p->kv.n_seq, groups);
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    const bool q8 = p->kv.repr == AKV_REPR_Q8;
    if (p->kv.head_dim == 128)
        return q8 ? wd_launch<128, AKV_REPR_Q8>(a, grid, cs) : wd_launch<128, AKV_REPR_Q4>(a, grid, cs);
    return q8 ? wd_launch<64, AKV_REPR_Q8>(a, grid, cs) : wd_launch<64, AKV_REPR_Q4>(a, grid, cs);
}
