/*
 * fwd_kernels.cu — the elementwise and row kernels of the forward pass (akv/forward_ops.h):
 * embedding lookup, RMSNorm, RoPE, SwiGLU, add (residual or bias), f32<->bf16 cast, fill.
 *
 * Numerics mirror the host implementations (ref/forward_ops.c over ref/ops.c): every
 * float operation that the host does as separate multiply and add is written with the _rn
 * intrinsics so nvcc cannot contract it into an FMA; RMSNorm's sum of squares and RoPE's
 * angles are in double as on the host. What still differs: the order of RMSNorm's double
 * sum, and expf / cos / sin of the CUDA math library against glibc (each within an ulp or
 * two). The fill is bit-exact with the host's.
 *
 * Launch shapes: elementwise kernels are grid-stride loops of 256 threads over at most
 * 8 blocks per SM; embedding is one block of 256 per row, RMSNorm one block of 1024 per row
 * (its weights read before the wait, a row of up to 8192 held in registers between the sum
 * and the scaling: a decode step's norm was 16 dependent loads a thread in two passes). Every
 * kernel is a programmatic dependent (grid_dep.cuh) that lets its successor be scheduled at once
 * and then waits for its predecessor before reading anything.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "akv/forward_ops.h"
#include "cuda_check.h"
#include "cuda_ops.h"
#include "core/half.h"
#include "grid_dep.cuh"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float fwd_load(const void *p, bool bf16, size_t i) {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
}

__device__ __forceinline__ void fwd_store(void *p, bool bf16, size_t i, float v) {
    if (bf16)
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    else
        static_cast<float *>(p)[i] = v;
}

template <typename T> inline T *fwd_ptr(akv_dptr d) {
    return reinterpret_cast<T *>(static_cast<uintptr_t>(d.addr));
}

/* Blocks for a grid-stride loop over n elements: enough for n, at most 8 per SM. */
unsigned fwd_grid(const akv__cuda_launch *l, uint64_t n) {
    uint64_t want = (n + kThreads - 1) / kThreads, cap = (uint64_t)l->n_sm * 8;
    return (unsigned)(want < 1 ? 1 : want > cap ? cap : want);
}

/* Launches kernel k with `blocks` blocks of kThreads on the launch's stream as a programmatic
 * dependent (grid_dep.cuh: every kernel here lets its successor be scheduled at once and waits
 * for its predecessor before it reads anything), and checks it. */
template <typename... P, typename... A>
akv_status fwd_launch(const akv__cuda_launch *l, unsigned blocks, void (*k)(P...), A... args) {
    return grid_dep_launch_kernel(k, dim3(blocks), dim3(kThreads), 0, l->stream, args...);
}

/* The first statement of every kernel here: the successor may be scheduled; then wait for the
 * predecessor (its outputs are this kernel's inputs). */
__device__ __forceinline__ void fwd_dep() {
    grid_dep_launch();
    grid_dep_wait();
}

bool fwd_dtype_ok(akv_dtype t) {
    return t == AKV_DTYPE_F32 || t == AKV_DTYPE_BF16;
}

/* ---- embedding: blockIdx.x = token; y f32 [n][E], table [V][E] ---------------------------- */
__global__ void embed_kernel(float *y, const void *table, bool bf16, const int32_t *ids,
                             uint32_t n_embd, uint32_t n_vocab) {
    fwd_dep();
    const int32_t id = ids[blockIdx.x];
    const bool ok = id >= 0 && (uint32_t)id < n_vocab;
    float *yr = y + (size_t)blockIdx.x * n_embd;
    for (uint32_t i = threadIdx.x; i < n_embd; i += blockDim.x)
        yr[i] = ok ? fwd_load(table, bf16, (size_t)id * n_embd + i) : __int_as_float(0x7fc00000);
}

/* ---- RMSNorm: blockIdx.x = row of y; it normalises row rows[r] of x (rows NULL: row r) ------ */
constexpr int kNormThreads = 1024; /* a 4096-wide row: 4 elements a thread */
constexpr int kNormHeld = 8;       /* elements a thread holds between the passes (8192 a row) */

__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(void *y, bool y_bf16, const float *x, const float *w, const int32_t *rows,
                   uint32_t n, float eps) {
    /* a thread's elements are threadIdx.x + j * kNormThreads: the first kNormHeld stay in
     * registers, any beyond (rows wider than 8192) are read again for the scaling. The
     * weights first: no kernel writes them, so they may be read before the wait. */
    constexpr uint32_t held = kNormHeld * kNormThreads;
    float wv[kNormHeld], xv[kNormHeld];
#pragma unroll
    for (int j = 0; j < kNormHeld; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        wv[j] = i < n ? w[i] : 0.0f;
    }
    fwd_dep();
    __shared__ double part[kNormThreads / 32];
    const float *xr = x + (size_t)(rows ? rows[blockIdx.x] : (int32_t)blockIdx.x) * n;
    double ss = 0;
#pragma unroll
    for (int j = 0; j < kNormHeld; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        xv[j] = i < n ? xr[i] : 0.0f;
        ss += (double)xv[j] * (double)xv[j];
    }
    for (uint32_t i = threadIdx.x + held; i < n; i += kNormThreads)
        ss += (double)xr[i] * (double)xr[i];
    for (int o = 16; o > 0; o /= 2)
        ss += __shfl_down_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = part[threadIdx.x];
        for (int o = 16; o > 0; o /= 2)
            t += __shfl_down_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const float scale = (float)(1.0 / sqrt(part[0] / (double)n + (double)eps));
    const size_t yr = (size_t)blockIdx.x * n;
#pragma unroll
    for (int j = 0; j < kNormHeld; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        if (i < n) fwd_store(y, y_bf16, yr + i, __fmul_rn(__fmul_rn(xv[j], scale), wv[j]));
    }
    for (uint32_t i = threadIdx.x + held; i < n; i += kNormThreads)
        fwd_store(y, y_bf16, yr + i, __fmul_rn(__fmul_rn(xr[i], scale), w[i]));
}

/* ---- head norm: one warp per (token, head), in place; heads [0, n_a) weighted by wa, the next
 * n_b by wb (qwen3's Q and K heads); the sum of squares in double, as the reference's --------- */
__global__ void head_norm_kernel(float *x, const float *wa, const float *wb, uint32_t n_tokens,
                                 uint32_t n_a, uint32_t n_b, uint32_t head_dim, size_t stride,
                                 float eps) {
    fwd_dep();
    const uint32_t lane = threadIdx.x & 31, heads = n_a + n_b, per_block = blockDim.x / 32;
    const uint64_t total = (uint64_t)n_tokens * heads;
    for (uint64_t g = blockIdx.x * (uint64_t)per_block + threadIdx.x / 32; g < total;
         g += (uint64_t)gridDim.x * per_block) { /* g is the warp's: its lanes loop together */
        const uint32_t h = (uint32_t)(g % heads);
        float *v = x + (g / heads) * stride + (size_t)h * head_dim;
        const float *w = h < n_a ? wa : wb;
        double ss = 0;
        for (uint32_t i = lane; i < head_dim; i += 32) ss += (double)v[i] * (double)v[i];
        for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float scale = (float)(1.0 / sqrt(ss / (double)head_dim + (double)eps));
        for (uint32_t i = lane; i < head_dim; i += 32) v[i] = __fmul_rn(__fmul_rn(v[i], scale), w[i]);
    }
}

/* ---- RoPE: one thread per (token, head, pair); x f32 rows at `stride` ---------------------- */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, uint32_t n_tokens,
                            uint32_t n_heads, uint32_t head_dim, uint32_t n_pairs, size_t stride,
                            bool neox) {
    fwd_dep();
    const uint64_t total = (uint64_t)n_tokens * n_heads * n_pairs;
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < total;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(g % n_pairs);
        const uint64_t th = g / n_pairs;
        const uint32_t h = (uint32_t)(th % n_heads), t = (uint32_t)(th / n_heads);
        const double ang = (double)pos[t] * (double)inv_freq[i];
        const float c = (float)cos(ang), s = (float)sin(ang);
        float *v = x + (size_t)t * stride + (size_t)h * head_dim;
        const uint32_t ia = neox ? i : 2 * i, ib = neox ? i + n_pairs : 2 * i + 1;
        const float a = v[ia], b = v[ib];
        v[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[ib] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

/* ---- SwiGLU: y [rows][n] = silu(gate) * up; gate/up f32 rows at in_stride ------------------ */
__global__ void swiglu_kernel(void *y, bool y_bf16, const float *gate, const float *up,
                              uint32_t n_rows, uint32_t n, size_t in_stride) {
    fwd_dep();
    const uint64_t total = (uint64_t)n_rows * n;
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < total;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = g / n, i = g % n;
        const float gv = gate[r * in_stride + i], uv = up[r * in_stride + i];
        const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
        fwd_store(y, y_bf16, g, __fmul_rn(silu, uv));
    }
}

/* ---- add: y[r][i] += a[r][i] (a_stride 0: one row broadcast) ------------------------------ */
__global__ void add_kernel(float *y, const float *a, uint32_t n_rows, uint32_t n, size_t a_stride) {
    fwd_dep();
    const uint64_t total = (uint64_t)n_rows * n;
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < total;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = g / n, i = g % n;
        y[g] = __fadd_rn(y[g], a[r * a_stride + i]);
    }
}

/* ---- argmax: y[r] = the first index of row r's largest value (akv_fwd_argmax_ref) ---------- */
/* One block a row: each thread keeps the largest value of its strided share and its first index
 * (NaN and -inf are never taken: a value is taken only when it is larger, or equal at a lower
 * index to one taken), then a tree in shared memory by the same rule; -1 when none is taken. */
__global__ void argmax_kernel(int32_t *y, const float *x, uint32_t n) {
    fwd_dep();
    __shared__ float sv[kThreads];
    __shared__ int32_t si[kThreads];
    const float *row = x + (size_t)blockIdx.x * n;
    float best = -INFINITY;
    int32_t at = -1;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = row[i];
        if (v > best) best = v, at = (int32_t)i; /* strided: a later i of one thread is larger */
    }
    sv[threadIdx.x] = best, si[threadIdx.x] = at;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int32_t oi = si[threadIdx.x + s];
            if (oi >= 0 && (si[threadIdx.x] < 0 || ov > sv[threadIdx.x] ||
                            (ov == sv[threadIdx.x] && oi < si[threadIdx.x])))
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = si[0];
}

/* ---- cast and fill -------------------------------------------------------------------------- */
__global__ void cast_kernel(void *y, bool y_bf16, const void *x, bool x_bf16, uint64_t n) {
    fwd_dep();
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < n;
         g += (uint64_t)gridDim.x * blockDim.x)
        fwd_store(y, y_bf16, g, fwd_load(x, x_bf16, g));
}

/* akv_fwd_fill_value (forward_ops.h), operation for operation. */
__global__ void fill_kernel(void *y, bool y_bf16, uint64_t n, uint64_t seed, float center,
                            float scale) {
    fwd_dep();
    for (uint64_t g = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; g < n;
         g += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (g + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = __fsub_rn(__fmul_rn((float)(z >> 40), 1.0f / 8388608.0f), 1.0f);
        fwd_store(y, y_bf16, g, __fadd_rn(center, __fmul_rn(scale, u)));
    }
}

} // namespace

extern "C" akv_status akv__cuda_fwd_embed(const void *args, const akv__cuda_launch *l) {
    akv_fwd_embed_args a;
    memcpy(&a, args, sizeof a);
    if (!fwd_dtype_ok(a.table_dtype) || a.n_embd == 0) return AKV_EINVAL;
    if (a.n == 0) return AKV_OK;
    return fwd_launch(l, a.n, embed_kernel, fwd_ptr<float>(a.y), fwd_ptr<const void>(a.table),
                      a.table_dtype == AKV_DTYPE_BF16, fwd_ptr<const int32_t>(a.ids), a.n_embd,
                      a.n_vocab);
}

extern "C" akv_status akv__cuda_fwd_rmsnorm(const void *args, const akv__cuda_launch *l) {
    akv_fwd_rmsnorm_args a;
    memcpy(&a, args, sizeof a);
    if (!fwd_dtype_ok(a.y_dtype) || a.n == 0) return AKV_EINVAL;
    if (a.n_rows == 0) return AKV_OK;
    return grid_dep_launch_kernel(rmsnorm_kernel, dim3(a.n_rows), dim3(kNormThreads), 0, l->stream,
                                  fwd_ptr<void>(a.y), a.y_dtype == AKV_DTYPE_BF16,
                                  fwd_ptr<const float>(a.x), fwd_ptr<const float>(a.w),
                                  fwd_ptr<const int32_t>(a.rows), a.n, a.eps);
}

extern "C" akv_status akv__cuda_fwd_rope(const void *args, const akv__cuda_launch *l) {
    akv_fwd_rope_args a;
    memcpy(&a, args, sizeof a);
    if (a.n_rot % 2 || a.n_rot > a.head_dim) return AKV_EINVAL;
    const uint64_t total = (uint64_t)a.n_tokens * a.n_heads * (a.n_rot / 2);
    if (total == 0) return AKV_OK;
    const size_t stride = a.stride ? a.stride : (size_t)a.n_heads * a.head_dim;
    return fwd_launch(l, fwd_grid(l, total), rope_kernel, fwd_ptr<float>(a.x),
                      fwd_ptr<const int32_t>(a.pos), fwd_ptr<const float>(a.inv_freq), a.n_tokens,
                      a.n_heads, a.head_dim, a.n_rot / 2, stride, a.mode == AKV_ROPE_NEOX);
}

extern "C" akv_status akv__cuda_fwd_head_norm(const void *args, const akv__cuda_launch *l) {
    akv_fwd_head_norm_args a;
    memcpy(&a, args, sizeof a);
    if (a.head_dim == 0 || a.stride < (uint64_t)(a.n_a + a.n_b) * a.head_dim) return AKV_EINVAL;
    const uint64_t heads = (uint64_t)a.n_tokens * (a.n_a + a.n_b);
    if (heads == 0) return AKV_OK;
    return fwd_launch(l, fwd_grid(l, heads * 32), head_norm_kernel, fwd_ptr<float>(a.x),
                      fwd_ptr<const float>(a.wa), fwd_ptr<const float>(a.wb), a.n_tokens, a.n_a,
                      a.n_b, a.head_dim, (size_t)a.stride, a.eps);
}

extern "C" akv_status akv__cuda_fwd_swiglu(const void *args, const akv__cuda_launch *l) {
    akv_fwd_swiglu_args a;
    memcpy(&a, args, sizeof a);
    if (!fwd_dtype_ok(a.y_dtype)) return AKV_EINVAL;
    const uint64_t total = (uint64_t)a.n_rows * a.n;
    if (total == 0) return AKV_OK;
    return fwd_launch(l, fwd_grid(l, total), swiglu_kernel, fwd_ptr<void>(a.y),
                      a.y_dtype == AKV_DTYPE_BF16, fwd_ptr<const float>(a.gate),
                      fwd_ptr<const float>(a.up), a.n_rows, a.n, a.in_stride ? a.in_stride : a.n);
}

extern "C" akv_status akv__cuda_fwd_add(const void *args, const akv__cuda_launch *l) {
    akv_fwd_add_args a;
    memcpy(&a, args, sizeof a);
    const uint64_t total = (uint64_t)a.n_rows * a.n;
    if (total == 0) return AKV_OK;
    return fwd_launch(l, fwd_grid(l, total), add_kernel, fwd_ptr<float>(a.y),
                      fwd_ptr<const float>(a.a), a.n_rows, a.n, a.a_stride);
}

extern "C" akv_status akv__cuda_fwd_argmax(const void *args, const akv__cuda_launch *l) {
    akv_fwd_argmax_args a;
    memcpy(&a, args, sizeof a);
    if (a.n_rows == 0) return AKV_OK;
    return fwd_launch(l, a.n_rows, argmax_kernel, fwd_ptr<int32_t>(a.y), fwd_ptr<const float>(a.x), a.n);
}

extern "C" akv_status akv__cuda_fwd_cast(const void *args, const akv__cuda_launch *l) {
    akv_fwd_cast_args a;
    memcpy(&a, args, sizeof a);
    if (!fwd_dtype_ok(a.x_dtype) || !fwd_dtype_ok(a.y_dtype)) return AKV_EINVAL;
    if (a.n == 0) return AKV_OK;
    return fwd_launch(l, fwd_grid(l, a.n), cast_kernel, fwd_ptr<void>(a.y),
                      a.y_dtype == AKV_DTYPE_BF16, fwd_ptr<const void>(a.x),
                      a.x_dtype == AKV_DTYPE_BF16, a.n);
}

extern "C" akv_status akv__cuda_fwd_fill(const void *args, const akv__cuda_launch *l) {
    akv_fwd_fill_args a;
    memcpy(&a, args, sizeof a);
    if (a.w_type) {
        akv_status st = akv__cuda_fill_blocks(a.y.addr, a.n, a.seed, a.w_type,
                                              akv_f32_to_f16(a.scale), akv_f32_to_f16(a.center),
                                              l->n_sm, l->stream);
        if (st == AKV_EINVAL) AKV_LOG_E("cuda fill: %llu bytes are not whole blocks of type %u",
                                        (unsigned long long)a.n, a.w_type);
        return st;
    }
    if (!fwd_dtype_ok(a.y_dtype)) return AKV_EINVAL;
    if (a.n == 0) return AKV_OK;
    return fwd_launch(l, fwd_grid(l, a.n), fill_kernel, fwd_ptr<void>(a.y),
                      a.y_dtype == AKV_DTYPE_BF16, a.n, a.seed, a.center, a.scale);
}
