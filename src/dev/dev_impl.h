/*
 * dev/dev_impl.h — what a backend implements (the table behind akv_dev_backend).
 *
 * The front (dev.c) validates arguments, keeps the table of live allocations (so a foreign
 * free is AKV_EINVAL and usage is exact) and calls the backend. A backend function returns
 * a status and logs its own detail once (e.g. the CUDA call and its message).
 */
#ifndef AKV_DEV_IMPL_H
#define AKV_DEV_IMPL_H

#include "akv/dev.h"

typedef enum akv_dev_copy_kind {
    AKV_COPY_H2D = 0, /* dst: device address, src: host address */
    AKV_COPY_D2H = 1, /* dst: host address, src: device address */
    AKV_COPY_D2D = 2, /* both device addresses */
} akv_dev_copy_kind;

struct akv_dev_backend {
    const char *name;
    /* Open device `params->device_index`; *state is the backend's own. */
    akv_status (*open)(const akv_dev_params *params, void **state);
    void (*close)(void *state); /* never waits, submits or drains */
    akv_status (*info)(void *state, akv_dev_info *out);
    akv_status (*mem_alloc)(void *state, size_t n_bytes, uint64_t *addr);
    akv_status (*mem_free)(void *state, uint64_t addr);
    akv_status (*pinned_alloc)(void *state, size_t n_bytes, void **p);
    akv_status (*pinned_free)(void *state, void *p);
    /* Synchronous copy; `kind` says which side each address is on. */
    akv_status (*copy_sync)(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                            size_t n_bytes);
    akv_status (*memset_sync)(void *state, uint64_t dst, int byte, size_t n_bytes);
};

/* The backend state of a device (for backend-specific extensions). */
void *akv__dev_state(const akv_dev *dev);
const akv_dev_backend *akv__dev_backend(const akv_dev *dev);

/* Host backend only: the host address behind a device address (asserts the backend). */
void *akv__dev_host_addr(const akv_dev *dev, akv_dptr p);

#endif
