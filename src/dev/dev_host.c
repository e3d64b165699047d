/*
 * dev_host.c — the host backend: device memory is host memory.
 *
 * It exists so that every invariant of the memory layer and the staging lifecycle runs on
 * the CPU, in CI, under the sanitizers. Device memory is page-aligned host memory; its
 * "device address" is the host address as a number. Pinned memory is page-aligned memory
 * (the host backend has no bus to pin for).
 */
#define _POSIX_C_SOURCE 200809L
#include "dev/dev_impl.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

typedef struct host_state {
    int device_index;
} host_state;

static akv_status host_open(const akv_dev_params *params, void **state) {
    if (params->device_index != 0) return AKV_EDEVICE; /* the host is one device */
    host_state *s = akv__calloc(1, sizeof *s);
    if (!s) return AKV_ENOMEM;
    *state = s;
    return AKV_OK;
}

static void host_close(void *state) {
    akv__free(state);
}

static akv_status host_info(void *state, akv_dev_info *out) {
    (void)state;
    memset(out, 0, sizeof *out);
    strcpy(out->name, "host");
    out->is_host = 1;
    out->n_sm = 1;
    out->smem_per_block_bytes = 227 * 1024;
    out->l2_bytes = 0;
    return AKV_OK;
}

static akv_status host_aligned(size_t n_bytes, size_t align, void **p) {
    /* Not through core/alloc: these are the backend's "device" and "pinned" bytes,
     * accounted by the dev front, and injected there. */
    void *q = NULL;
    if (posix_memalign(&q, align, n_bytes) != 0) return AKV_ENOMEM;
    *p = q;
    return AKV_OK;
}

static akv_status host_mem_alloc(void *state, size_t n_bytes, uint64_t *addr) {
    (void)state;
    void *p;
    if (host_aligned(n_bytes, 4096, &p) != AKV_OK) return AKV_EDEVMEM;
    *addr = (uint64_t)(uintptr_t)p;
    return AKV_OK;
}

static akv_status host_mem_free(void *state, uint64_t addr) {
    (void)state;
    free((void *)(uintptr_t)addr);
    return AKV_OK;
}

static akv_status host_pinned_alloc(void *state, size_t n_bytes, void **p) {
    (void)state;
    return host_aligned(n_bytes, 4096, p);
}

static akv_status host_pinned_free(void *state, void *p) {
    (void)state;
    free(p);
    return AKV_OK;
}

static akv_status host_copy_sync(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                                 size_t n_bytes) {
    (void)state;
    (void)kind; /* every address is a host address here */
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n_bytes);
    return AKV_OK;
}

static akv_status host_memset_sync(void *state, uint64_t dst, int byte, size_t n_bytes) {
    (void)state;
    memset((void *)(uintptr_t)dst, byte, n_bytes);
    return AKV_OK;
}

static const akv_dev_backend host_backend = {
    .name = "host",
    .open = host_open,
    .close = host_close,
    .info = host_info,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .pinned_alloc = host_pinned_alloc,
    .pinned_free = host_pinned_free,
    .copy_sync = host_copy_sync,
    .memset_sync = host_memset_sync,
};

const akv_dev_backend *akv_dev_host_backend(void) {
    return &host_backend;
}
