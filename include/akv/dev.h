/*
 * akv/dev.h — the device interface: the narrow platform layer under the memory layer.
 *
 * Everything the memory layer and the engine do to a device goes through here: device
 * memory, pinned host memory, and (extended by the staging work) queues, events and an op
 * table. Two backends implement it: the host backend (device memory is host memory; it is
 * the test bed for every invariant, with fault injection) and the CUDA backend (cuda/).
 *
 * Glossary
 *   device address  an akv_dptr: a number, never a C pointer. Host code cannot dereference
 *                   it by construction; it can only offset it and hand it to the backend.
 *   pinned memory   page-locked host memory the device can copy from at full bus speed
 *                   (cudaHostAlloc on CUDA; plain aligned memory on the host backend).
 *
 * Invariants
 *   - Every successful alloc has exactly one free, on the same akv_dev.
 *   - akv_dev_destroy refuses (AKV_EBUSY, nothing changed) while allocations are live.
 *   - The byte counts reported by akv_dev_usage equal what the backend really holds.
 *
 * Thread-safety: allocation and free are thread-safe; create/destroy are not.
 */
#ifndef AKV_DEV_H
#define AKV_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "akv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct akv_dev akv_dev;
typedef struct akv_dev_backend akv_dev_backend; /* a backend's function table (opaque) */

/* A device address. Host code never dereferences it (it is not a pointer type). */
typedef struct akv_dptr {
    uint64_t addr; /* 0 = null */
} akv_dptr;

static inline akv_dptr akv_dptr_offset(akv_dptr p, size_t n_bytes) {
    akv_dptr q = {p.addr + (uint64_t)n_bytes};
    return q;
}

typedef struct akv_dev_params {
    int device_index;       /* which device of the backend (CUDA ordinal); 0 = the first */
    uint64_t fail_seed;     /* host backend: seed for injected delays/failures; 0 = none */
} akv_dev_params;

typedef struct akv_dev_info {
    char name[96];                 /* "host", "NVIDIA H200", ... */
    int is_host;                   /* 1: device memory is host memory (host backend) */
    size_t total_bytes;            /* device memory; 0 = unknown/unbounded (host backend) */
    int n_sm;                      /* multiprocessors (host backend: worker threads) */
    size_t smem_per_block_bytes;   /* shared memory a block may opt into */
    size_t l2_bytes;               /* last-level cache */
} akv_dev_info;

typedef struct akv_dev_usage {
    size_t device_bytes; /* live device allocations, bytes */
    size_t pinned_bytes; /* live pinned host allocations, bytes */
    size_t n_device;     /* live device allocations */
    size_t n_pinned;     /* live pinned allocations */
} akv_dev_usage;

akv_dev_params akv_dev_default_params(void);

/* The host backend: always available. */
const akv_dev_backend *akv_dev_host_backend(void);

/* Short name of a backend ("host", "cuda"). */
const char *akv_dev_backend_name(const akv_dev_backend *backend);

/* Create a device on `backend`. AKV_EDEVICE if the backend cannot open the device. */
akv_status akv_dev_create(const akv_dev_backend *backend, const akv_dev_params *params,
                          akv_dev **out);

/* Destroy; NULL is a no-op (AKV_OK). AKV_EBUSY, and nothing changes, while any allocation
 * is live. Never waits, submits or drains. */
akv_status akv_dev_destroy(akv_dev *dev);

akv_status akv_dev_get_info(const akv_dev *dev, akv_dev_info *out);
akv_dev_usage akv_dev_get_usage(const akv_dev *dev);

/* Device memory. `n_bytes` > 0. The memory is uninitialised. AKV_EDEVMEM when the device
 * cannot provide it. Alignment: at least 256 bytes. */
akv_status akv_dev_mem_alloc(akv_dev *dev, size_t n_bytes, akv_dptr *out);
/* Free; a null address is a no-op. AKV_EINVAL for an address this device did not give. */
akv_status akv_dev_mem_free(akv_dev *dev, akv_dptr p);

/* Pinned host memory. `n_bytes` > 0; alignment at least 4096 bytes. AKV_ENOMEM when it
 * cannot be had. */
akv_status akv_dev_pinned_alloc(akv_dev *dev, size_t n_bytes, void **out);
akv_status akv_dev_pinned_free(akv_dev *dev, void *p);

/* Synchronous copies (set-up, tests, loading weights: never the hot path, which uses
 * queues). They return when the bytes have arrived. Each checks that the device range lies
 * inside one live device allocation (AKV_EINVAL otherwise, naming the address). */
akv_status akv_dev_copy_h2d_sync(akv_dev *dev, akv_dptr dst, const void *src, size_t n_bytes);
akv_status akv_dev_copy_d2h_sync(akv_dev *dev, void *dst, akv_dptr src, size_t n_bytes);
akv_status akv_dev_copy_d2d_sync(akv_dev *dev, akv_dptr dst, akv_dptr src, size_t n_bytes);
/* Sets n_bytes of device memory to `byte` (poisoning outputs before a kernel runs). */
akv_status akv_dev_memset_sync(akv_dev *dev, akv_dptr dst, int byte, size_t n_bytes);

/* Host backend only (tests): fail the n-th device (resp. pinned) allocation from now,
 * once; 0 disarms. AKV_EUNSUPPORTED on other backends. */
akv_status akv_dev_inject_alloc_failure(akv_dev *dev, uint64_t nth_device, uint64_t nth_pinned);

#ifdef __cplusplus
}
#endif
#endif /* AKV_DEV_H */
