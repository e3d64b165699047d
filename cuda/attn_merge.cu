/*
 * attn_merge.cu — the exact merge of two arrays of partial attention states (the hybrid and
 * host-attended routes combine their parts with it). Same arithmetic as
 * akv_attn_merge_state: an empty side (lse -inf) leaves the other exactly; otherwise
 * weights exp(lse_x - lse) with lse = m + log(exp(lse_a - m) + exp(lse_b - m)).
 *
 * One warp per row, 4 rows per block; outputs may alias the inputs (each element is read
 * before it is written by the same thread, the LSE after a warp barrier).
 */
#include "attn_common.cuh"

struct mg_args {
    const float *o_a, *lse_a, *o_b, *lse_b; /* [n_rows][D], [n_rows] */
    void *o;                                 /* [n_rows][D] */
    int o_f32;
    float *lse;                              /* [n_rows] or null */
    int n_rows, D;
};

__global__ void __launch_bounds__(128) attn_merge_kernel(const mg_args a) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= a.n_rows) return;
    const float la = a.lse_a[r], lb = a.lse_b[r];
    float wa, wb, lse;
    if (lb == -INFINITY) {
        wa = 1.0f, wb = 0.0f, lse = la;
    } else if (la == -INFINITY) {
        wa = 0.0f, wb = 1.0f, lse = lb;
    } else {
        const float mx = fmaxf(la, lb), ea = expf(la - mx), eb = expf(lb - mx), sum = ea + eb;
        wa = ea / sum, wb = eb / sum, lse = mx + logf(sum);
    }
    const size_t row = (size_t)r * a.D;
    for (int c = lane; c < a.D; c += 32) {
        const float xa = a.o_a[row + c], xb = a.o_b[row + c];
        /* an empty side contributes nothing, not 0 * (its o), which could be NaN */
        const float v = wb == 0.0f ? xa : wa == 0.0f ? xb : wa * xa + wb * xb;
        attn_store1(a.o, a.o_f32, row + c, v);
    }
    __syncwarp();
    if (lane == 0 && a.lse) a.lse[r] = lse;
}

extern "C" akv_status akv_attn_cuda_merge(const akv_attn_merge *p, void *stream) {
    const char *op = "cuda merge";
    akv_status st = akv__attn_merge_check(p, op);
    if (st != AKV_OK || p->n_rows == 0) return st;
    if ((st = attn_cuda_dtype_check(p->o_dtype, "o_dtype", op)) != AKV_OK) return st;
    mg_args a;
    a.o_a = reinterpret_cast<const float *>(p->o_a.addr);
    a.lse_a = reinterpret_cast<const float *>(p->lse_a.addr);
    a.o_b = reinterpret_cast<const float *>(p->o_b.addr);
    a.lse_b = reinterpret_cast<const float *>(p->lse_b.addr);
    a.o = reinterpret_cast<void *>(p->o.addr);
    a.o_f32 = p->o_dtype == AKV_DTYPE_F32;
    a.lse = reinterpret_cast<float *>(p->lse.addr);
    a.n_rows = (int)p->n_rows;
    a.D = (int)p->head_dim;
    attn_merge_kernel<<<(p->n_rows + 3) / 4, 128, 0, static_cast<cudaStream_t>(stream)>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}
