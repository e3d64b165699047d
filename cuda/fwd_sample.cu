/*
 * fwd_sample.cu — the "fwd_sample" op (akv/forward_ops.h): each row's token drawn on the
 * device by the host sampler's law (akv/fwd_sample.h), so only ids cross the bus.
 *
 * One block of 1024 threads a row; no sort. The kept set is always the prefix of the order
 * (key descending, id ascending) up to a pivot (K, I), and each filter moves the pivot:
 *   top-k   a radix select of the k-th largest key (four passes of 8 bits, a 256-bin count
 *           histogram in shared memory over the keys still matching the chosen prefix); ties
 *           at K are kept in id order up to k;
 *   top-p   the same select with the bins summing fixed-point weights instead of counts (the
 *           bin where the running mass from the top crosses top_p of the kept weight), then
 *           the tie count at K that reaches it;
 *   min-p   a threshold on the weight, which falls with the key;
 *   draw    the kept weights in id order: each thread sums a contiguous slice, one block scan,
 *           and the thread whose slice holds the target walks it.
 * Sums are in 64-bit integers, so every order of addition gives the same bits and a seeded
 * request draws the same tokens on every run. Passes over the row read it from L2 (a 128K
 * vocabulary is 512 KB).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AKV_SAMPLE_FN static __host__ __device__ __forceinline__
#include "akv/forward_ops.h"
#include "cuda_check.h"
#include "cuda_ops.h"
#include "grid_dep.cuh"

namespace {

constexpr int kT = 1024;     /* threads a row */
constexpr int kWarps = kT / 32;

struct sample_smem {
    uint32_t hist[256];
    unsigned long long mhist[256];
    unsigned long long part[kWarps];
    uint32_t upart[kWarps];
    float fpart[kWarps];
    /* broadcasts from thread 0 */
    uint32_t prefix, remain, count;
    unsigned long long above;
    int32_t found;
};

/* ---- block-wide reductions and the scan (every thread calls; every thread gets the result) -- */

/* The block's combination of v by `pick` (which of two to keep), starting from `none`. */
template <typename T, typename F>
__device__ T block_pick(T v, T none, F pick, T *part) {
    for (int o = 16; o > 0; o >>= 1) v = pick(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); /* part[] free */
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    T t = none;
    for (int w = 0; w < kWarps; w++) t = pick(t, part[w]);
    return t;
}

__device__ uint32_t block_max_u32(uint32_t v, sample_smem &s) {
    return block_pick(v, 0u, [](uint32_t a, uint32_t b) { return b > a ? b : a; }, s.upart);
}

__device__ uint32_t block_min_u32(uint32_t v, sample_smem &s) {
    return block_pick(v, UINT32_MAX, [](uint32_t a, uint32_t b) { return b < a ? b : a; }, s.upart);
}

__device__ unsigned long long block_sum(unsigned long long v, sample_smem &s) {
    return block_pick(v, 0ull, [](unsigned long long a, unsigned long long b) { return a + b; }, s.part);
}

/* The largest value, NaN never (a comparison with NaN is false). */
__device__ float block_max_f(float v, sample_smem &s) {
    return block_pick(v, -INFINITY, [](float a, float b) { return b > a ? b : a; }, s.fpart);
}

/* This thread's exclusive prefix of v over the block, in thread order. */
__device__ unsigned long long block_exclusive(unsigned long long v, sample_smem &s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    __syncthreads();
    if (lane == 31) s.part[warp] = inc;
    __syncthreads();
    unsigned long long before = 0;
    for (int w = 0; w < warp; w++) before += s.part[w];
    return before + inc - v;
}

/* ---- the row ---------------------------------------------------------------------------- */

struct row_view {
    const float *x;
    uint32_t n;
    uint32_t K, I;     /* the pivot: kept = key > K, or key == K and id <= I */
    float mx, temp, min_p;
    bool min_p_on;
};

__device__ __forceinline__ bool pivot_keeps(const row_view &r, uint32_t key, uint32_t i) {
    return key != 0 && (key > r.K || (key == r.K && i <= r.I));
}

/* Element i's fixed-point weight if the pivot (and, with `final`, min-p) keeps it, else 0. */
__device__ __forceinline__ unsigned long long kept_wfx(const row_view &r, uint32_t i, bool final) {
    const float v = r.x[i];
    const uint32_t key = akv_sample_key(v);
    if (!pivot_keeps(r, key, i)) return 0;
    const float w = akv_sample_weight(v, r.mx, r.temp);
    if (final && r.min_p_on && !(w >= r.min_p)) return 0;
    return akv_sample_wfx(w);
}

/* The first id (in id order) at which the running sum of wt(i) exceeds target; -1 if none.
 * Each thread takes a contiguous slice of ids. */
template <typename F>
__device__ int32_t block_find(uint32_t n, unsigned long long target, F wt, sample_smem &s) {
    const uint32_t slice = (n + kT - 1) / kT;
    const uint32_t lo = threadIdx.x * slice, hi = min(n, lo + slice);
    unsigned long long mine = 0;
    for (uint32_t i = lo; i < hi; i++) mine += wt(i);
    const unsigned long long before = block_exclusive(mine, s);
    if (threadIdx.x == 0) s.found = -1;
    __syncthreads();
    if (mine && before <= target && target < before + mine) {
        unsigned long long acc = before;
        for (uint32_t i = lo; i < hi; i++)
            if ((acc += wt(i)) > target) {
                s.found = (int32_t)i;
                break;
            }
    }
    __syncthreads();
    return s.found;
}

/* A radix select over the keys the pivot keeps, from the top: with counts (by_mass false) the
 * key of the `want`-th element; with fixed-point weights (by_mass true) the key at which the
 * running mass first reaches `target`. Leaves in s: prefix = that key K', count = the kept
 * elements with key K', remain = (counts) how many of them the select reaches, above =
 * (weights) the mass of the kept keys above K'. */
__device__ void radix_select(const row_view &r, bool by_mass, uint32_t want, double target,
                             sample_smem &s) {
    uint32_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) s.remain = want, s.above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int j = threadIdx.x; j < 256; j += kT) s.hist[j] = 0, s.mhist[j] = 0;
        __syncthreads();
        for (uint32_t i = threadIdx.x; i < r.n; i += kT) {
            const float v = r.x[i];
            const uint32_t key = akv_sample_key(v);
            if (!pivot_keeps(r, key, i) || (key & mask) != prefix) continue;
            const uint32_t b = (key >> shift) & 255u;
            atomicAdd(&s.hist[b], 1u);
            if (by_mass) atomicAdd(&s.mhist[b], akv_sample_wfx(akv_sample_weight(v, r.mx, r.temp)));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int sel = 0;
            if (by_mass) {
                unsigned long long above = s.above;
                for (int b = 255; b >= 0; b--) {
                    if ((double)(above + s.mhist[b]) >= target || b == 0) { sel = b; break; }
                    above += s.mhist[b];
                }
                s.above = above;
            } else {
                uint32_t remain = s.remain;
                for (int b = 255; b >= 0; b--) {
                    if (s.hist[b] >= remain || b == 0) { sel = b; break; }
                    remain -= s.hist[b];
                }
                s.remain = remain;
            }
            s.prefix = prefix | ((uint32_t)sel << shift);
            s.count = s.hist[sel];
        }
        __syncthreads();
        prefix = s.prefix;
        mask |= 0xFFu << shift;
    }
}

__global__ void __launch_bounds__(kT) sample_kernel(int32_t *y, float *x, const akv_fwd_sample_row *rows,
                                                    const int32_t *pen, uint32_t n_pen, uint32_t n) {
    grid_dep_launch();
    grid_dep_wait();
    __shared__ sample_smem s;
    const akv_fwd_sample_row rw = rows[blockIdx.x];
    if (rw.temp < 0) return;
    float *xr = x + (size_t)blockIdx.x * n;
    /* 1. the penalties, in place (distinct ids: one thread each) */
    for (uint32_t j = threadIdx.x; j < rw.pen_n; j += kT) {
        const int32_t t = pen[rw.pen_off + j];
        xr[t] = akv_sample_penalise(&rw, xr[t], (uint32_t)pen[n_pen + rw.pen_off + j]);
    }
    __syncthreads();
    /* 2. greedy: the first index of the largest value (akv_fwd_argmax_ref) */
    if (rw.temp == 0.0f) {
        float mx = -INFINITY;
        for (uint32_t i = threadIdx.x; i < n; i += kT) mx = xr[i] > mx ? xr[i] : mx;
        mx = block_max_f(mx, s);
        uint32_t first = UINT32_MAX;
        for (uint32_t i = threadIdx.x; i < n && mx != -INFINITY; i += kT)
            if (xr[i] == mx) { first = i; break; }
        first = block_min_u32(first, s);
        if (threadIdx.x == 0) y[blockIdx.x] = mx == -INFINITY ? -1 : (int32_t)first;
        return;
    }
    /* the candidates: their count and the largest key */
    uint32_t kmax = 0;
    unsigned long long n_valid = 0;
    for (uint32_t i = threadIdx.x; i < n; i += kT) {
        const uint32_t key = akv_sample_key(xr[i]);
        kmax = key > kmax ? key : kmax;
        n_valid += key != 0;
    }
    kmax = block_max_u32(kmax, s);
    n_valid = block_sum(n_valid, s);
    if (kmax == 0) {
        if (threadIdx.x == 0) y[blockIdx.x] = -1;
        return;
    }
    row_view r = {xr, n, 1u, n - 1, akv_sample_key_value(kmax), rw.temp, rw.min_p, rw.min_p > 0};
    /* 3. top-k */
    if (rw.top_k > 0 && (unsigned long long)rw.top_k < n_valid) {
        radix_select(r, false, (uint32_t)rw.top_k, 0, s);
        const uint32_t K = s.prefix, need = s.remain, count = s.count;
        uint32_t I = n - 1;
        if (need < count)
            I = (uint32_t)block_find(n, need - 1, [&](uint32_t i) -> unsigned long long {
                return akv_sample_key(xr[i]) == K;
            }, s);
        r.K = K, r.I = I;
    }
    /* 4. top-p over the kept weight */
    if (rw.top_p < 1.0f) {
        unsigned long long z = 0;
        for (uint32_t i = threadIdx.x; i < n; i += kT) z += kept_wfx(r, i, false);
        z = block_sum(z, s);
        const double target = (double)rw.top_p * (double)z;
        radix_select(r, true, 0, target, s);
        const uint32_t K = s.prefix, count = s.count;
        const unsigned long long above = s.above;
        const unsigned long long wk = akv_sample_wfx(akv_sample_weight(akv_sample_key_value(K), r.mx, r.temp));
        /* the fewest ties at K whose weight, with the mass above, reaches the target */
        uint32_t need = count;
        if (wk > 0) {
            double j = ceil((target - (double)above) / (double)wk);
            need = j < 1 ? 1u : j > count ? count : (uint32_t)j;
            while (need > 1 && (double)(above + (unsigned long long)(need - 1) * wk) >= target) need--;
            while (need < count && (double)(above + (unsigned long long)need * wk) < target) need++;
        }
        uint32_t I = K == r.K ? r.I : n - 1;
        if (need < count) {
            const row_view before = r;
            I = (uint32_t)block_find(n, need - 1, [&](uint32_t i) -> unsigned long long {
                const uint32_t key = akv_sample_key(xr[i]);
                return key == K && pivot_keeps(before, key, i);
            }, s);
        }
        r.K = K, r.I = I;
    }
    /* 5. min-p (in the weight) and 6. the draw by id */
    unsigned long long total = 0;
    for (uint32_t i = threadIdx.x; i < n; i += kT) total += kept_wfx(r, i, true);
    total = block_sum(total, s);
    const unsigned long long t = akv_sample_target(rw.u, total ? total : 1);
    const int32_t id = block_find(n, t, [&](uint32_t i) { return kept_wfx(r, i, true); }, s);
    if (threadIdx.x == 0) y[blockIdx.x] = id;
}

} // namespace

extern "C" akv_status akv__cuda_fwd_sample(const void *args, const akv__cuda_launch *l) {
    akv_fwd_sample_args a;
    memcpy(&a, args, sizeof a);
    if (a.n_rows == 0 || a.n == 0) return AKV_OK;
    return grid_dep_launch_kernel(sample_kernel, dim3(a.n_rows), dim3(kT), 0, l->stream,
                                  reinterpret_cast<int32_t *>(static_cast<uintptr_t>(a.y.addr)),
                                  reinterpret_cast<float *>(static_cast<uintptr_t>(a.x.addr)),
                                  reinterpret_cast<const akv_fwd_sample_row *>(static_cast<uintptr_t>(a.rows.addr)),
                                  reinterpret_cast<const int32_t *>(static_cast<uintptr_t>(a.pen.addr)),
                                  a.n_pen, a.n);
}
