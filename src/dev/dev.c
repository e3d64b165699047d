/*
 * dev.c — the device front: argument checks, live-allocation table, usage accounting,
 * fault injection for allocations; everything else is the backend's.
 */
#include "dev/dev_impl.h"

#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

typedef struct dev_alloc {
    uint64_t addr; /* device address, or host address of a pinned block */
    size_t n_bytes;
    int pinned; /* 1: pinned host memory; 0: device memory */
} dev_alloc;

struct akv_dev {
    const akv_dev_backend *backend;
    void *state;
    pthread_mutex_t mu;
    dev_alloc *allocs; /* live allocations, unordered */
    size_t n_allocs, cap_allocs;
    akv_dev_usage usage;
    uint64_t fail_device_at, fail_pinned_at; /* injected failure countdowns; 0 = off */
};

akv_dev_params akv_dev_default_params(void) {
    return (akv_dev_params){.device_index = 0, .fail_seed = 0};
}

const char *akv_dev_backend_name(const akv_dev_backend *backend) {
    return backend ? backend->name : "(none)";
}

akv_status akv_dev_create(const akv_dev_backend *backend, const akv_dev_params *params,
                          akv_dev **out) {
    if (!backend || !out) return AKV_EINVAL;
    akv_dev_params p = params ? *params : akv_dev_default_params();
    if (p.device_index < 0) {
        AKV_LOG_E("dev: device_index %d is negative", p.device_index);
        return AKV_EINVAL;
    }
    akv_dev *dev = akv__calloc(1, sizeof *dev);
    if (!dev) return AKV_ENOMEM;
    dev->backend = backend;
    akv_status st = backend->open(&p, &dev->state);
    if (st != AKV_OK) {
        akv__free(dev);
        return st;
    }
    pthread_mutex_init(&dev->mu, NULL);
    *out = dev;
    return AKV_OK;
}

akv_status akv_dev_destroy(akv_dev *dev) {
    if (!dev) return AKV_OK;
    pthread_mutex_lock(&dev->mu);
    size_t n_live = dev->n_allocs;
    pthread_mutex_unlock(&dev->mu);
    if (n_live) {
        AKV_LOG_E("dev: destroy refused: %zu allocation(s) still live", n_live);
        return AKV_EBUSY;
    }
    dev->backend->close(dev->state);
    pthread_mutex_destroy(&dev->mu);
    akv__free(dev->allocs);
    akv__free(dev);
    return AKV_OK;
}

akv_status akv_dev_get_info(const akv_dev *dev, akv_dev_info *out) {
    if (!dev || !out) return AKV_EINVAL;
    return dev->backend->info(dev->state, out);
}

akv_dev_usage akv_dev_get_usage(const akv_dev *dev) {
    akv_dev_usage u;
    pthread_mutex_lock((pthread_mutex_t *)&dev->mu);
    u = dev->usage;
    pthread_mutex_unlock((pthread_mutex_t *)&dev->mu);
    return u;
}

/* Counts down an injected failure; true when this call must fail. Caller holds mu. */
static int dev_take_failure(uint64_t *at) {
    if (*at == 0) return 0;
    return --*at == 0;
}

/* Records a new allocation; caller holds mu. On failure the caller undoes the allocation. */
static akv_status dev_track(akv_dev *dev, uint64_t addr, size_t n_bytes, int pinned) {
    akv_status st = akv__array_reserve((void **)&dev->allocs, &dev->cap_allocs, dev->n_allocs + 1,
                                       sizeof *dev->allocs);
    if (st != AKV_OK) return st;
    dev->allocs[dev->n_allocs++] = (dev_alloc){.addr = addr, .n_bytes = n_bytes, .pinned = pinned};
    if (pinned) {
        dev->usage.pinned_bytes += n_bytes;
        dev->usage.n_pinned++;
    } else {
        dev->usage.device_bytes += n_bytes;
        dev->usage.n_device++;
    }
    return AKV_OK;
}

/* Removes a tracked allocation; AKV_EINVAL when this device never gave it. Caller holds mu. */
static akv_status dev_untrack(akv_dev *dev, uint64_t addr, int pinned) {
    for (size_t i = 0; i < dev->n_allocs; i++) {
        dev_alloc *a = &dev->allocs[i];
        if (a->addr != addr || a->pinned != pinned) continue;
        if (pinned) {
            dev->usage.pinned_bytes -= a->n_bytes;
            dev->usage.n_pinned--;
        } else {
            dev->usage.device_bytes -= a->n_bytes;
            dev->usage.n_device--;
        }
        *a = dev->allocs[--dev->n_allocs];
        return AKV_OK;
    }
    return AKV_EINVAL;
}

akv_status akv_dev_mem_alloc(akv_dev *dev, size_t n_bytes, akv_dptr *out) {
    if (!dev || !out || n_bytes == 0) return AKV_EINVAL;
    pthread_mutex_lock(&dev->mu);
    akv_status st = AKV_EDEVMEM;
    uint64_t addr = 0;
    if (dev_take_failure(&dev->fail_device_at)) {
        AKV_LOG_W("dev: injected device allocation failure (%zu bytes)", n_bytes);
        goto done;
    }
    st = dev->backend->mem_alloc(dev->state, n_bytes, &addr);
    if (st != AKV_OK) goto done;
    st = dev_track(dev, addr, n_bytes, 0);
    if (st != AKV_OK) dev->backend->mem_free(dev->state, addr);
done:
    pthread_mutex_unlock(&dev->mu);
    if (st == AKV_OK) out->addr = addr;
    return st;
}

akv_status akv_dev_mem_free(akv_dev *dev, akv_dptr p) {
    if (!dev) return AKV_EINVAL;
    if (p.addr == 0) return AKV_OK;
    pthread_mutex_lock(&dev->mu);
    akv_status st = dev_untrack(dev, p.addr, 0);
    pthread_mutex_unlock(&dev->mu);
    if (st != AKV_OK) {
        AKV_LOG_E("dev: free of device address 0x%llx that this device did not allocate",
                  (unsigned long long)p.addr);
        return st;
    }
    return dev->backend->mem_free(dev->state, p.addr);
}

akv_status akv_dev_pinned_alloc(akv_dev *dev, size_t n_bytes, void **out) {
    if (!dev || !out || n_bytes == 0) return AKV_EINVAL;
    pthread_mutex_lock(&dev->mu);
    akv_status st = AKV_ENOMEM;
    void *p = NULL;
    if (dev_take_failure(&dev->fail_pinned_at)) {
        AKV_LOG_W("dev: injected pinned allocation failure (%zu bytes)", n_bytes);
        goto done;
    }
    st = dev->backend->pinned_alloc(dev->state, n_bytes, &p);
    if (st != AKV_OK) goto done;
    st = dev_track(dev, (uint64_t)(uintptr_t)p, n_bytes, 1);
    if (st != AKV_OK) dev->backend->pinned_free(dev->state, p);
done:
    pthread_mutex_unlock(&dev->mu);
    if (st == AKV_OK) *out = p;
    return st;
}

akv_status akv_dev_pinned_free(akv_dev *dev, void *p) {
    if (!dev) return AKV_EINVAL;
    if (!p) return AKV_OK;
    pthread_mutex_lock(&dev->mu);
    akv_status st = dev_untrack(dev, (uint64_t)(uintptr_t)p, 1);
    pthread_mutex_unlock(&dev->mu);
    if (st != AKV_OK) {
        AKV_LOG_E("dev: free of pinned block %p that this device did not allocate", p);
        return st;
    }
    return dev->backend->pinned_free(dev->state, p);
}

/* Whether [addr, addr+n) lies inside one live device allocation. */
static int dev_range_ok(akv_dev *dev, uint64_t addr, size_t n_bytes) {
    int ok = 0;
    pthread_mutex_lock(&dev->mu);
    for (size_t i = 0; i < dev->n_allocs && !ok; i++) {
        const dev_alloc *a = &dev->allocs[i];
        ok = !a->pinned && addr >= a->addr && n_bytes <= a->n_bytes &&
             addr - a->addr <= a->n_bytes - n_bytes;
    }
    pthread_mutex_unlock(&dev->mu);
    if (!ok)
        AKV_LOG_E("dev: device range [0x%llx, +%zu) is not inside one live allocation",
                  (unsigned long long)addr, n_bytes);
    return ok;
}

static akv_status dev_copy(akv_dev *dev, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                           size_t n_bytes) {
    if (!dev || !dst || !src) return AKV_EINVAL;
    if (n_bytes == 0) return AKV_OK;
    if ((kind != AKV_COPY_D2H && !dev_range_ok(dev, dst, n_bytes)) ||
        (kind != AKV_COPY_H2D && !dev_range_ok(dev, src, n_bytes)))
        return AKV_EINVAL;
    return dev->backend->copy_sync(dev->state, kind, dst, src, n_bytes);
}

akv_status akv_dev_copy_h2d_sync(akv_dev *dev, akv_dptr dst, const void *src, size_t n_bytes) {
    return dev_copy(dev, AKV_COPY_H2D, dst.addr, (uint64_t)(uintptr_t)src, n_bytes);
}

akv_status akv_dev_copy_d2h_sync(akv_dev *dev, void *dst, akv_dptr src, size_t n_bytes) {
    return dev_copy(dev, AKV_COPY_D2H, (uint64_t)(uintptr_t)dst, src.addr, n_bytes);
}

akv_status akv_dev_copy_d2d_sync(akv_dev *dev, akv_dptr dst, akv_dptr src, size_t n_bytes) {
    return dev_copy(dev, AKV_COPY_D2D, dst.addr, src.addr, n_bytes);
}

akv_status akv_dev_memset_sync(akv_dev *dev, akv_dptr dst, int byte, size_t n_bytes) {
    if (!dev || !dst.addr) return AKV_EINVAL;
    if (n_bytes == 0) return AKV_OK;
    if (!dev_range_ok(dev, dst.addr, n_bytes)) return AKV_EINVAL;
    return dev->backend->memset_sync(dev->state, dst.addr, byte, n_bytes);
}

akv_status akv_dev_inject_alloc_failure(akv_dev *dev, uint64_t nth_device, uint64_t nth_pinned) {
    if (!dev) return AKV_EINVAL;
    if (dev->backend != akv_dev_host_backend()) return AKV_EUNSUPPORTED;
    pthread_mutex_lock(&dev->mu);
    dev->fail_device_at = nth_device;
    dev->fail_pinned_at = nth_pinned;
    pthread_mutex_unlock(&dev->mu);
    return AKV_OK;
}

void *akv__dev_state(const akv_dev *dev) {
    return dev->state;
}

const akv_dev_backend *akv__dev_backend(const akv_dev *dev) {
    return dev->backend;
}

void *akv__dev_host_addr(const akv_dev *dev, akv_dptr p) {
    AKV_ASSERT(dev->backend == akv_dev_host_backend());
    return (void *)(uintptr_t)p.addr;
}
