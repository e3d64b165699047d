/*
 * stage_probe.cu — the CUDA implementation of the "stage_probe" op (akv/testing/stage_probe.h).
 *
 * One block per sequence (blockIdx.x = sequence). Phase 1: the block writes the new tokens'
 * rows. __syncthreads makes them visible to the whole block. Phase 2: every thread sums
 * akv_stage_probe_term over a strided share of (token, element) pairs; the partial sums meet
 * in one shared 64-bit accumulator (wrapping addition: order-free, so the result is exact and
 * deterministic); thread 0 compares with the expected checksum and counts a mismatch.
 * Pointers: base = uint16_t pages [n_pages][2][H][P][D]; result = uint64_t[4].
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define AKV_STAGE_PROBE_FN static inline __host__ __device__
#include "akv/testing/stage_probe.h"
#include "cuda_check.h"
#include "cuda_ops.h"

__global__ void stage_probe_kernel(const akv_stage_probe_args a) {
    const akv_stage_probe_seq *q = &a.seq[blockIdx.x];
    const uint32_t H = a.n_kv_heads, D = a.head_dim, P = a.page_tokens, n_e = 2 * H * D;
    const size_t page_elems = (size_t)n_e * P;
    uint16_t *base = (uint16_t *)(uintptr_t)a.base.addr;
    for (uint32_t k = threadIdx.x; k < q->n_new * n_e; k += blockDim.x) {
        uint32_t t = q->new_token0 + k / n_e, e = k % n_e;
        uint16_t *pg = base + (size_t)q->page_ids[t / P] * page_elems;
        pg[akv_stage_probe_at(D, P, t, e)] = akv_stage_probe_value(q->seed, t, e);
    }
    __shared__ unsigned long long sum;
    if (threadIdx.x == 0) sum = 0;
    __syncthreads();
    unsigned long long part = 0;
    for (uint32_t k = threadIdx.x; k < q->n_tokens * n_e; k += blockDim.x) {
        uint32_t t = k / n_e, e = k % n_e;
        const uint16_t *pg = base + (size_t)q->page_ids[t / P] * page_elems;
        part += akv_stage_probe_term(t, e, pg[akv_stage_probe_at(D, P, t, e)]);
    }
    atomicAdd(&sum, part);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long *result = (unsigned long long *)(uintptr_t)a.result.addr;
        if (sum != q->expected) {
            atomicAdd(&result[0], 1ull);
            result[2] = sum;
            result[3] = q->expected;
        }
        atomicAdd(&result[1], 1ull);
    }
}

extern "C" akv_status akv__cuda_stage_probe_launch(const void *args, const akv__cuda_launch *l) {
    akv_stage_probe_args a;
    memcpy(&a, args, sizeof a);
    if (a.n_seq == 0) return AKV_OK;
    stage_probe_kernel<<<a.n_seq, 256, 0, l->stream>>>(a);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}
