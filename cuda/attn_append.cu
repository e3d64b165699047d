/*
 * attn_append.cu — writes new tokens' K/V rows into their page slots: decode's tail write
 * (one or a few tokens per sequence) and a prefill chunk. Sequence s's n_s new rows take
 * positions len_s - n_s .. len_s - 1 of its pages (the table already includes them).
 *
 * One thread per 16 bytes of destination (8 bf16): blockIdx.y = sequence, the x dimension
 * runs over (token, K/V, head, chunk). An f32 source is rounded to nearest even, bit-exact
 * with the reference (core/half.h). A row whose position would be negative (a table that
 * does not include the new tokens) is skipped, never written out of bounds.
 */
#include "attn_common.cuh"

struct app_args {
    attn_kv kv;
    const int *qo_indptr; /* [n_seq+1], or null: n_per_seq each */
    int n_per_seq;
    const void *k, *v;    /* [n_tokens] rows of `stride` elements */
    int src_f32;
    long long stride;
    int chunks;           /* D / 8 */
};

__global__ void __launch_bounds__(256) attn_append_kernel(const app_args a) {
    /* A programmatic dependent that lets its own dependent (the decode that reads these rows)
     * be scheduled at once: that kernel waits for this one's completion before it reads q or
     * the rows written here, and what it reads earlier its caller vouches nothing running
     * writes (akv_attn_decode.prefetch_history). This kernel reads nothing before its wait. */
    grid_dep_launch();
    grid_dep_wait();
    const int s = blockIdx.y;
    int start, n;
    if (a.qo_indptr) start = a.qo_indptr[s], n = a.qo_indptr[s + 1] - start;
    else start = s * a.n_per_seq, n = a.n_per_seq;
    const long long per_token = 2LL * a.kv.n_kv * a.chunks;
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int i = (int)(e / per_token);
    if (i >= n) return;
    int rem = (int)(e - (long long)i * per_token);
    const int kvsel = rem / (a.kv.n_kv * a.chunks);
    rem -= kvsel * a.kv.n_kv * a.chunks;
    const int h = rem / a.chunks, c = rem - h * a.chunks;
    const int pos = attn_seq_len(a.kv, s) - n + i;
    if (pos < 0) return;
    const int D = a.chunks * 8;
    const int page = a.kv.indices[a.kv.indptr[s] + (pos >> a.kv.log2_p)];
    const size_t slot = ((size_t)(kvsel * a.kv.n_kv + h) << a.kv.log2_p) + (size_t)(pos & ((1 << a.kv.log2_p) - 1));
    unsigned char *dst = const_cast<unsigned char *>(a.kv.pool) + (size_t)page * a.kv.page_bytes + slot * D * 2 + c * 16;
    const size_t off = (size_t)(start + i) * a.stride + (size_t)h * D + c * 8;
    *reinterpret_cast<uint4 *>(dst) = attn_load8_bf16(kvsel ? a.v : a.k, a.src_f32, off);
}

akv_status akv__attn_cuda_append_launch(const akv_attn_pages *kv, akv_dptr qo_indptr, uint32_t n_per_seq,
                                        uint32_t max_new, akv_dptr k, akv_dptr v, akv_dtype dtype,
                                        uint32_t stride, cudaStream_t stream, const char *op) {
    if (kv->dtype != AKV_DTYPE_BF16 || kv->head_dim % 8 != 0) {
        AKV_LOG_E("attn %s: appends take bf16 pages with a head dim that is a multiple of 8 (%s, %u)", op,
                  akv_dtype_name(kv->dtype), kv->head_dim);
        return AKV_EUNSUPPORTED;
    }
    if (kv->n_seq > 65535) {
        AKV_LOG_E("attn %s: %u sequences; one CUDA call takes at most 65535", op, kv->n_seq);
        return AKV_EUNSUPPORTED;
    }
    if (stride == 0) stride = kv->n_kv_heads * kv->head_dim;
    const uint64_t row_bytes = (uint64_t)stride * akv_dtype_size(dtype);
    akv_status st = attn_cuda_align_check(k, row_bytes, "k", op);
    if (st == AKV_OK) st = attn_cuda_align_check(v, row_bytes, "v", op);
    if (st != AKV_OK) return st;
    app_args a;
    a.kv = attn_kv_view(kv);
    a.qo_indptr = reinterpret_cast<const int *>(qo_indptr.addr);
    a.n_per_seq = (int)n_per_seq;
    a.k = reinterpret_cast<const void *>(k.addr);
    a.v = reinterpret_cast<const void *>(v.addr);
    a.src_f32 = dtype == AKV_DTYPE_F32;
    a.stride = stride;
    a.chunks = (int)(kv->head_dim / 8);
    const uint64_t n_threads = (uint64_t)max_new * 2 * kv->n_kv_heads * a.chunks;
    const uint64_t n_blocks = (n_threads + 255) / 256;
    if (n_blocks > 0x7fffffffu) {
        AKV_LOG_E("attn %s: %u new tokens per sequence are too many for one call", op, max_new);
        return AKV_EUNSUPPORTED;
    }
    return attn_launch_dependent(attn_append_kernel, dim3((unsigned)n_blocks, kv->n_seq), 256, 0, stream, a);
}

extern "C" akv_status akv_attn_cuda_append(const akv_attn_append *p, void *stream) {
    const char *op = "cuda append";
    akv_status st = akv__attn_append_check(p, op);
    if (st != AKV_OK || p->kv.n_seq == 0 || p->n_tokens == 0) return st;
    return akv__attn_cuda_append_launch(&p->kv, p->qo_indptr, p->n_per_seq, p->max_new, p->k, p->v, p->dtype,
                                        p->stride, static_cast<cudaStream_t>(stream), op);
}
