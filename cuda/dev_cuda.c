/*
 * dev_cuda.c — the CUDA backend of dev.h: device memory (cudaMalloc), pinned host memory
 * (cudaHostAlloc), device properties. Every call is checked; errors become AKV_EDEVICE with
 * the call and the CUDA message logged once.
 */
#include "dev/dev_impl.h"
#include "akv/dev_cuda.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "cuda_check.h"

typedef struct cuda_state {
    int ordinal;
    struct cudaDeviceProp prop;
} cuda_state;

static akv_status cuda_open(const akv_dev_params *params, void **state) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        AKV_LOG_I("cuda: no usable device (%s)",
                  e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return AKV_EDEVICE;
    }
    if (params->device_index >= n) {
        AKV_LOG_E("cuda: device index %d out of range (%d device(s))", params->device_index, n);
        return AKV_EDEVICE;
    }
    cuda_state *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    s->ordinal = params->device_index;
    akv_status st = AKV_CUDA_STATUS(cudaSetDevice(s->ordinal));
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaGetDeviceProperties(&s->prop, s->ordinal));
    if (st != AKV_OK) {
        akv__free(s);
        return st;
    }
    *state = s;
    return AKV_OK;
}

static void cuda_close(void *state) {
    akv__free(state);
}

static akv_status cuda_info(void *state, akv_dev_info *out) {
    cuda_state *s = state;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, s->prop.name);
    out->is_host = 0;
    out->total_bytes = s->prop.totalGlobalMem;
    out->n_sm = s->prop.multiProcessorCount;
    out->smem_per_block_bytes = s->prop.sharedMemPerBlockOptin;
    out->l2_bytes = (size_t)s->prop.l2CacheSize;
    return AKV_OK;
}

static akv_status cuda_mem_alloc(void *state, size_t n_bytes, uint64_t *addr) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n_bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        AKV_LOG_E("cuda: cudaMalloc(%zu bytes) failed: out of device memory", n_bytes);
        return AKV_EDEVMEM;
    }
    AKV_CUDA_TRY(e);
    *addr = (uint64_t)(uintptr_t)p;
    return AKV_OK;
}

static akv_status cuda_mem_free(void *state, uint64_t addr) {
    (void)state;
    return AKV_CUDA_STATUS(cudaFree((void *)(uintptr_t)addr));
}

static akv_status cuda_pinned_alloc(void *state, size_t n_bytes, void **p) {
    (void)state;
    void *q = NULL;
    cudaError_t e = cudaHostAlloc(&q, n_bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        AKV_LOG_E("cuda: cudaHostAlloc(%zu bytes) failed: %s", n_bytes, cudaGetErrorString(e));
        return AKV_ENOMEM;
    }
    *p = q;
    return AKV_OK;
}

static akv_status cuda_pinned_free(void *state, void *p) {
    (void)state;
    return AKV_CUDA_STATUS(cudaFreeHost(p));
}

static akv_status cuda_copy_sync(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                                 size_t n_bytes) {
    cuda_state *s = state;
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                cudaMemcpyDeviceToDevice};
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaMemcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n_bytes,
                            kinds[kind]));
    return AKV_OK;
}

static akv_status cuda_memset_sync(void *state, uint64_t dst, int byte, size_t n_bytes) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaMemset((void *)(uintptr_t)dst, byte, n_bytes));
    return AKV_OK;
}

static const akv_dev_backend cuda_backend = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .info = cuda_info,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .copy_sync = cuda_copy_sync,
    .memset_sync = cuda_memset_sync,
};

const akv_dev_backend *akv_dev_cuda_backend(void) {
    return &cuda_backend;
}
