/*
 * copy_kernels.cu — the copy kernel (AKV_COPY_METHOD_KERNEL) and the "busy" op.
 *
 * Copy kernel. Moves a batch of spans between device memory and mapped pinned host memory
 * with loads and stores issued by the SMs instead of the copy engines: one launch carries up
 * to COPY_MAX_SPANS spans by value. Every thread walks the spans in order and, inside each,
 * takes 16-byte words at a grid stride, four loads in flight before the stores (a PCIe read
 * takes about a microsecond; in-flight loads are what the bandwidth is made of). Spans not
 * 16-byte aligned go byte by byte. blockIdx.x: which slice of every span's words.
 *
 * Busy kernel. n_iters dependent FMAs per thread; n_blocks x n_threads threads; writes one
 * float to the sink only if the result is an impossible value (keeps the loop alive). It lets
 * a programmatic dependent launched after it start at once (which then waits for it).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "grid_dep.cuh"

#define COPY_MAX_SPANS 64
#define COPY_THREADS 512

struct copy_args {
    uint64_t dst[COPY_MAX_SPANS];
    uint64_t src[COPY_MAX_SPANS];
    uint64_t n_bytes[COPY_MAX_SPANS];
    uint32_t n_spans;
};

__global__ void copy_kernel(const copy_args a) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n_threads = (size_t)gridDim.x * blockDim.x;
    for (uint32_t s = 0; s < a.n_spans; s++) {
        const size_t n = a.n_bytes[s];
        if (((a.dst[s] | a.src[s]) & 15) == 0) {
            const uint4 *src = (const uint4 *)a.src[s];
            uint4 *dst = (uint4 *)a.dst[s];
            const size_t n_words = n / 16;
            size_t i = tid;
            for (; i + 3 * n_threads < n_words; i += 4 * n_threads) {
                uint4 v0 = src[i], v1 = src[i + n_threads], v2 = src[i + 2 * n_threads],
                      v3 = src[i + 3 * n_threads];
                dst[i] = v0;
                dst[i + n_threads] = v1;
                dst[i + 2 * n_threads] = v2;
                dst[i + 3 * n_threads] = v3;
            }
            for (; i < n_words; i += n_threads) dst[i] = src[i];
            const unsigned char *sb = (const unsigned char *)a.src[s];
            unsigned char *db = (unsigned char *)a.dst[s];
            for (size_t j = n_words * 16 + tid; j < n; j += n_threads) db[j] = sb[j];
        } else {
            const unsigned char *sb = (const unsigned char *)a.src[s];
            unsigned char *db = (unsigned char *)a.dst[s];
            for (size_t j = tid; j < n; j += n_threads) db[j] = sb[j];
        }
    }
}

extern "C" cudaError_t akv__cuda_copy_kernel(const akv_dev_xfer *x, size_t n, int to_device,
                                             unsigned n_blocks, cudaStream_t stream) {
    copy_args a;
    for (size_t i = 0; i < n; i += COPY_MAX_SPANS) {
        a.n_spans = (uint32_t)(n - i < COPY_MAX_SPANS ? n - i : COPY_MAX_SPANS);
        for (uint32_t k = 0; k < a.n_spans; k++) {
            uint64_t h = (uint64_t)(uintptr_t)x[i + k].h, d = x[i + k].d.addr;
            a.dst[k] = to_device ? d : h;
            a.src[k] = to_device ? h : d;
            a.n_bytes[k] = x[i + k].n_bytes;
        }
        copy_kernel<<<n_blocks, COPY_THREADS, 0, stream>>>(a);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

__global__ void busy_kernel(uint64_t n_iters, float *sink) {
    /* a programmatic dependent launched after it may be scheduled at once (it waits for this
     * kernel's completion before it consumes anything: tests overlap such launches with it) */
    grid_dep_launch();
    float a = 1.0f + threadIdx.x * 1e-6f;
    const float b = 0.999999f, c = 1e-7f;
    for (uint64_t i = 0; i < n_iters; i++) a = fmaf(a, b, c);
    if (a == -1.0f && sink) *sink = a; /* never true; the compiler cannot know */
}

extern "C" akv_status akv__cuda_busy_launch(const void *args, const akv__cuda_launch *l) {
    akv_dev_busy_args a;
    memcpy(&a, args, sizeof a);
    unsigned n_threads = a.n_threads ? a.n_threads : 512;
    /* 0 blocks: a full SM's threads on every SM */
    unsigned n_blocks = a.n_blocks ? a.n_blocks : (unsigned)l->n_sm * (2048u / n_threads);
    busy_kernel<<<n_blocks, n_threads, 0, l->stream>>>(a.n_iters, (float *)(uintptr_t)a.sink.addr);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}
