/*
 * kvq_encode.cu — compact pages made on the device from exact bf16 pages (the op AKV_KVQ_OP_ENCODE):
 * the codec of akv/kvq.h, bit for bit.
 *
 * One warp per row (a row: one K or V of one head and token of a page, head_dim elements),
 * lane l holding elements E*l .. E*l + E - 1 (E = head_dim / 32). Blocks of 4 warps; grid x =
 * the page pairs, grid y = row groups of a page. Every step is the codec's arithmetic in f32
 * with IEEE intrinsics (nothing contracted):
 *   - q4 K rows rotated (attn_fwht_row: the codec's butterflies and factor);
 *   - a group's largest magnitude (a row for q8, 32 elements for q4) by a warp max, which is
 *     exact in any order; the scale = the least f16 at or above amax / L (round to nearest,
 *     then the next f16 up if that fell below);
 *   - code = clamp(rint(x / scale)), rint as the codec takes it: x / scale + 1.5 x 2^23, less
 *     1.5 x 2^23 (round to nearest even), 0 for a scale of 0;
 *   - q8 codes as int8 bytes, q4 as code + 8 in nibbles (the even element low); the group's
 *     first lane stores its scale.
 */
#include <cuda_fp16.h>

#include "attn_common.cuh"
#include "cuda_ops.h"
extern "C" {
#include "akv/kvq.h"
}

struct kvq_enc_args {
    const unsigned char *src; /* exact pool */
    unsigned char *dst;       /* compact pool */
    const int *pairs;         /* [n][2] */
    unsigned long long src_page_bytes, dst_page_bytes, scales_off;
    int rows;                 /* rows a page: 2 * n_kv_heads * page_tokens */
    int k_rows;               /* its K rows: n_kv_heads * page_tokens */
};

template <int D, int RP>
__global__ void __launch_bounds__(128) kvq_encode_kernel(const kvq_enc_args a) {
    constexpr int E = D / 32;                                   /* elements a lane */
    constexpr int G = RP == AKV_REPR_Q8 ? D : 32;               /* elements a scale */
    constexpr int LPG = G / E;                                  /* lanes a group */
    constexpr int CB = RP == AKV_REPR_Q8 ? D : D / 2;           /* code bytes a row */
    constexpr int SPR = D / G;                                  /* scales a row */
    const float levels = RP == AKV_REPR_Q8 ? 127.0f : 7.0f;
    const float magic = 12582912.0f;
    const int lane = threadIdx.x & 31;
    const int pair = blockIdx.x;
    const unsigned char *src = a.src + (size_t)a.pairs[2 * pair] * a.src_page_bytes;
    unsigned char *dst = a.dst + (size_t)a.pairs[2 * pair + 1] * a.dst_page_bytes;
    for (int row = blockIdx.y * 4 + (threadIdx.x >> 5); row < a.rows; row += gridDim.y * 4) {
        float x[E];
        const __nv_bfloat16 *in = reinterpret_cast<const __nv_bfloat16 *>(src) + (size_t)row * D + lane * E;
#pragma unroll
        for (int j = 0; j < E; j++) x[j] = __bfloat162float(in[j]);
        if (RP == AKV_REPR_Q4 && row < a.k_rows) attn_fwht_row<E>(x, lane);
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < E; j++) amax = fmaxf(amax, fabsf(x[j]));
#pragma unroll
        for (int m = 1; m < LPG; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(ATTN_FULL_MASK, amax, m));
        const float want = __fdiv_rn(amax, levels);
        unsigned short h = __half_as_ushort(__float2half_rn(want));
        if (__half2float(__ushort_as_half(h)) < want) h++; /* positive and finite: the next up */
        const float s = __half2float(__ushort_as_half(h));
        int c[E];
#pragma unroll
        for (int j = 0; j < E; j++) {
            float v = s > 0.0f ? __fsub_rn(__fadd_rn(__fdiv_rn(x[j], s), magic), magic) : 0.0f;
            v = v > levels ? levels : v < -levels ? -levels : v;
            c[j] = (int)v;
        }
        unsigned char *codes = dst + (size_t)row * CB;
        if constexpr (RP == AKV_REPR_Q8) {
#pragma unroll
            for (int j = 0; j < E; j++) codes[lane * E + j] = (unsigned char)(signed char)c[j];
        } else {
#pragma unroll
            for (int j = 0; j < E; j += 2)
                codes[(lane * E + j) / 2] = (unsigned char)((c[j] + 8) | (c[j + 1] + 8) << 4);
        }
        if (lane % LPG == 0)
            reinterpret_cast<unsigned short *>(dst + a.scales_off)[(size_t)row * SPR + lane / LPG] = h;
    }
}

template <int D, int RP>
static akv_status kvq_launch(const kvq_enc_args &a, unsigned n_pages, cudaStream_t stream) {
    /* enough row groups to fill the device for a few pages, at most a page's rows */
    unsigned groups = (unsigned)((a.rows + 3) / 4);
    if (groups > 64) groups = 64;
    kvq_encode_kernel<D, RP><<<dim3(n_pages, groups), 128, 0, stream>>>(a);
    AKV_CUDA_LAUNCH_TRY(cudaGetLastError());
    return AKV_OK;
}

extern "C" akv_status akv__cuda_kvq_encode_launch(const void *args, const akv__cuda_launch *l) {
    akv_kvq_encode_args q;
    memcpy(&q, args, sizeof q);
    const akv_kvq_encode_args *p = &q;
    if (p->n_pages == 0) return AKV_OK;
    akv_repr_layout le, lc;
    if (p->dtype != AKV_DTYPE_BF16 || (p->head_dim != 64 && p->head_dim != 128) ||
        (p->repr != AKV_REPR_Q8 && p->repr != AKV_REPR_Q4) || p->n_pages > 65535u * 16u ||
        akv_repr_layout_of(AKV_REPR_EXACT, p->dtype, p->n_kv_heads, p->page_tokens, p->head_dim, &le) ||
        akv_repr_layout_of((akv_repr)p->repr, p->dtype, p->n_kv_heads, p->page_tokens, p->head_dim, &lc) ||
        !p->src_pool || !p->dst_pool || !p->pairs) {
        AKV_LOG_E("kvq encode: %u pages of %s from %s pages, head_dim %u: the CUDA encoder takes "
                  "q8 or q4 from bf16, head_dim 64 or 128, and all three addresses",
                  p->n_pages, akv_repr_name((akv_repr)p->repr), akv_dtype_name(p->dtype), p->head_dim);
        return AKV_EUNSUPPORTED;
    }
    kvq_enc_args a;
    a.src = reinterpret_cast<const unsigned char *>(p->src_pool);
    a.dst = reinterpret_cast<unsigned char *>(p->dst_pool);
    a.pairs = reinterpret_cast<const int *>(p->pairs);
    a.src_page_bytes = le.page_bytes, a.dst_page_bytes = lc.page_bytes, a.scales_off = lc.scales_offset;
    a.k_rows = (int)(p->n_kv_heads * p->page_tokens);
    a.rows = 2 * a.k_rows;
    cudaStream_t s = l->stream;
    for (unsigned at = 0; at < p->n_pages; at += 65535u) { /* grid x at most 65535 */
        kvq_enc_args b = a;
        b.pairs = a.pairs + 2 * at;
        const unsigned n = p->n_pages - at < 65535u ? p->n_pages - at : 65535u;
        akv_status st;
        if (p->head_dim == 128)
            st = p->repr == AKV_REPR_Q8 ? kvq_launch<128, AKV_REPR_Q8>(b, n, s) : kvq_launch<128, AKV_REPR_Q4>(b, n, s);
        else
            st = p->repr == AKV_REPR_Q8 ? kvq_launch<64, AKV_REPR_Q8>(b, n, s) : kvq_launch<64, AKV_REPR_Q4>(b, n, s);
        if (st) return st;
    }
    return AKV_OK;
}
