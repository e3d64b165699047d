/*
 * dev.c — the device front: argument checks, live-allocation table, usage accounting, range
 * checks of every copy, event objects, span coalescing, fault counting and injection;
 * everything else is the backend's.
 */
#include "dev/dev_impl.h"

#include "akv/testing/dev_faults.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

typedef struct dev_alloc {
    uint64_t addr; /* device address, or host address of a pinned block */
    size_t n_bytes;
    int pinned; /* 1: pinned host memory; 0: device memory */
} dev_alloc;

/* One injectable point: a countdown to the failing pass, and the count of passes. */
typedef struct dev_fault {
    uint64_t at;     /* passes left until the failure; 0 = disarmed */
    int sticky;      /* the failure, once reached, repeats until cleared */
    int failing;     /* sticky and reached: every pass fails */
    uint64_t passes; /* passes since create */
} dev_fault;

struct akv_event {
    akv_dev *dev;    /* the device that created it */
    void *impl;      /* the backend's event */
    unsigned flags;  /* AKV_EVENT_* */
    uint64_t serial; /* records so far; 0 = never recorded */
};

struct akv_dev {
    const akv_dev_backend *backend;
    void *state;
    pthread_mutex_t mu; /* guards everything below */
    dev_alloc *allocs;  /* live allocations, unordered */
    size_t n_allocs, cap_allocs;
    akv_dev_usage usage;
    size_t n_events;                         /* live events */
    size_t n_graphs;                         /* live graphs */
    uint64_t fail_device_at, fail_pinned_at; /* injected failure countdowns; 0 = off */
    dev_fault faults[AKV_N_FAULTS];
    akv_copy_config copy_cfg; /* method never DEFAULT here: resolved at create / set */
    unsigned refused_methods; /* copy methods a test made unavailable (bit m), as a backend
                                 without them (akv_dev_refuse_copy_method) */
    struct dev_profile *profile; /* the running op profile, or NULL */
};

/* Adds delta (+1 or -1) to one of the device's live-object counters, under its lock. */
static void dev_count(akv_dev *dev, size_t *n, int delta) {
    pthread_mutex_lock(&dev->mu);
    *n = delta > 0 ? *n + 1 : *n - 1;
    pthread_mutex_unlock(&dev->mu);
}

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
    dev->copy_cfg = (akv_copy_config){.method = backend->default_copy_method, .kernel_blocks = 0};
    if (p.fail_seed && backend->inject_delays) backend->inject_delays(dev->state, p.fail_seed, 50, 16);
    *out = dev;
    return AKV_OK;
}

akv_status akv_dev_destroy(akv_dev *dev) {
    if (!dev) return AKV_OK;
    pthread_mutex_lock(&dev->mu);
    size_t n_live = dev->n_allocs, n_events = dev->n_events, n_graphs = dev->n_graphs;
    pthread_mutex_unlock(&dev->mu);
    if (dev->profile) {
        AKV_LOG_E("dev: destroy refused: a profile is running (akv_dev_profile_stop)");
        return AKV_EBUSY;
    }
    if (n_live || n_events || n_graphs) {
        AKV_LOG_E("dev: destroy refused: %zu allocation(s), %zu event(s) and %zu graph(s) still "
                  "live",
                  n_live, n_events, n_graphs);
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

/* The end of the live allocation of the kind that holds [addr, addr + n_bytes), or 0 when
 * none holds it whole (quiet). */
static uint64_t dev_alloc_end(akv_dev *dev, uint64_t addr, size_t n_bytes, int pinned) {
    uint64_t end = 0;
    pthread_mutex_lock(&dev->mu);
    for (size_t i = 0; i < dev->n_allocs && !end; i++) {
        const dev_alloc *a = &dev->allocs[i];
        if (a->pinned == pinned && addr >= a->addr && n_bytes <= a->n_bytes &&
            addr - a->addr <= a->n_bytes - n_bytes)
            end = a->addr + a->n_bytes;
    }
    pthread_mutex_unlock(&dev->mu);
    return end;
}

/* Whether [addr, addr+n) lies inside one live allocation of the given kind (pinned: host
 * memory from akv_dev_pinned_alloc; else device memory). Logs the range when it does not. */
static int dev_range_ok(akv_dev *dev, uint64_t addr, size_t n_bytes, int pinned) {
    int ok = dev_alloc_end(dev, addr, n_bytes, pinned) != 0;
    if (!ok)
        AKV_LOG_E("dev: %s range [0x%llx, +%zu) is not inside one live %s allocation",
                  pinned ? "host" : "device", (unsigned long long)addr, n_bytes,
                  pinned ? "pinned" : "device");
    return ok;
}

akv_status akv_dev_pinned_dptr(akv_dev *dev, const void *host, size_t n_bytes, akv_dptr *out) {
    if (!dev || !host || !out || n_bytes == 0) return AKV_EINVAL;
    if (!dev_range_ok(dev, (uint64_t)(uintptr_t)host, n_bytes, 1)) return AKV_EINVAL;
    uint64_t addr = 0;
    akv_status st = dev->backend->pinned_dptr(dev->state, host, &addr);
    if (st == AKV_OK) *out = (akv_dptr){addr};
    return st;
}

static int dev_fault_pass(akv_dev *dev, akv_dev_fault f);

/* A synchronous copy: a wait point (AKV_FAULT_SYNC), like every call that waits. */
static akv_status dev_copy(akv_dev *dev, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                           size_t n_bytes) {
    if (!dev || !dst || !src) return AKV_EINVAL;
    if (n_bytes == 0) return AKV_OK;
    if ((kind != AKV_COPY_D2H && !dev_range_ok(dev, dst, n_bytes, 0)) ||
        (kind != AKV_COPY_H2D && !dev_range_ok(dev, src, n_bytes, 0)))
        return AKV_EINVAL;
    if (dev_fault_pass(dev, AKV_FAULT_SYNC)) return AKV_EDEVICE;
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
    if (!dev_range_ok(dev, dst.addr, n_bytes, 0)) return AKV_EINVAL;
    return dev->backend->memset_sync(dev->state, dst.addr, byte, n_bytes);
}

akv_status akv_dev_inject_alloc_failure(akv_dev *dev, uint64_t nth_device, uint64_t nth_pinned) {
    if (!dev) return AKV_EINVAL;
    if (!dev->backend->is_host) return AKV_EUNSUPPORTED;
    pthread_mutex_lock(&dev->mu);
    dev->fail_device_at = nth_device;
    dev->fail_pinned_at = nth_pinned;
    pthread_mutex_unlock(&dev->mu);
    return AKV_OK;
}

/* ---- names ------------------------------------------------------------------------------ */

const char *akv_queue_name(akv_queue q) {
    static const char *const names[AKV_N_QUEUES] = {"h2d", "d2h", "compute"};
    return (unsigned)q < AKV_N_QUEUES ? names[q] : "(bad queue)";
}

const char *akv_copy_method_name(akv_copy_method m) {
    static const char *const names[AKV_N_COPY_METHODS] = {"default", "each", "coalesce", "batch",
                                                          "kernel"};
    return (unsigned)m < AKV_N_COPY_METHODS ? names[m] : "(bad method)";
}

const char *akv_dev_fault_name(akv_dev_fault f) {
    static const char *const names[AKV_N_FAULTS] = {"copy", "record",    "wait",   "op",
                                                    "sync", "copy_exec", "op_exec"};
    return (unsigned)f < AKV_N_FAULTS ? names[f] : "(bad fault)";
}

/* ---- fault points --------------------------------------------------------------------------- */

/* Counts one pass of point f; true when this pass must fail (logged as injected). */
static int dev_fault_pass(akv_dev *dev, akv_dev_fault f) {
    pthread_mutex_lock(&dev->mu);
    dev_fault *x = &dev->faults[f];
    x->passes++;
    int fail = x->failing;
    if (!fail && x->at && --x->at == 0) {
        fail = 1;
        x->failing = x->sticky;
    }
    pthread_mutex_unlock(&dev->mu);
    if (fail) AKV_LOG_E("dev: injected %s failure", akv_dev_fault_name(f));
    return fail;
}

akv_status akv_dev_inject_fault(akv_dev *dev, akv_dev_fault f, uint64_t nth, int sticky) {
    if (!dev || (unsigned)f >= AKV_N_FAULTS) return AKV_EINVAL;
    if ((f == AKV_FAULT_COPY_EXEC || f == AKV_FAULT_OP_EXEC) && !dev->backend->is_host) {
        AKV_LOG_E("dev: %s faults exist only on the host backend", akv_dev_fault_name(f));
        return AKV_EUNSUPPORTED;
    }
    pthread_mutex_lock(&dev->mu);
    dev->faults[f].at = nth;
    dev->faults[f].sticky = sticky != 0;
    dev->faults[f].failing = 0;
    pthread_mutex_unlock(&dev->mu);
    return AKV_OK;
}

akv_status akv_dev_clear_faults(akv_dev *dev) {
    if (!dev) return AKV_EINVAL;
    pthread_mutex_lock(&dev->mu);
    for (int f = 0; f < AKV_N_FAULTS; f++) {
        dev->faults[f].at = 0;
        dev->faults[f].sticky = dev->faults[f].failing = 0;
    }
    pthread_mutex_unlock(&dev->mu);
    if (dev->backend->clear_faults) dev->backend->clear_faults(dev->state);
    return AKV_OK;
}

uint64_t akv_dev_fault_passes(const akv_dev *dev, akv_dev_fault f) {
    if (!dev || (unsigned)f >= AKV_N_FAULTS) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&dev->mu);
    uint64_t n = dev->faults[f].passes;
    pthread_mutex_unlock((pthread_mutex_t *)&dev->mu);
    return n;
}

akv_status akv_dev_inject_delays(akv_dev *dev, uint64_t seed, uint32_t max_delay_us,
                                 uint32_t one_in) {
    if (!dev) return AKV_EINVAL;
    if (!dev->backend->inject_delays) return AKV_EUNSUPPORTED;
    return dev->backend->inject_delays(dev->state, seed, max_delay_us, one_in ? one_in : 1);
}

/* Submission flags for a copy: counts the copy and copy_exec points. AKV_EDEVICE when the
 * submission itself must fail. */
static akv_status dev_copy_submit_flags(akv_dev *dev, unsigned *flags) {
    if (dev_fault_pass(dev, AKV_FAULT_COPY)) return AKV_EDEVICE;
    *flags = dev_fault_pass(dev, AKV_FAULT_COPY_EXEC) ? AKV_SUBMIT_FAIL_EXEC : 0;
    return AKV_OK;
}

/* ---- events ----------------------------------------------------------------------------------- */

static int dev_queue_ok(akv_queue q) {
    if ((unsigned)q < AKV_N_QUEUES) return 1;
    AKV_LOG_E("dev: queue %d does not exist (0..%d)", (int)q, AKV_N_QUEUES - 1);
    return 0;
}

/* An event argument must exist and belong to this device. */
static int dev_event_ok(const akv_dev *dev, const akv_event *ev) {
    if (ev && ev->dev == dev) return 1;
    AKV_LOG_E("dev: %s", ev ? "event belongs to another device" : "event is NULL");
    return 0;
}

/* An event must have been recorded before anyone waits for it or asks about it. */
static int dev_event_recorded(const akv_event *ev, const char *what) {
    if (ev->serial) return 1;
    AKV_LOG_E("dev: %s on an event that was never recorded", what);
    return 0;
}

akv_status akv_dev_event_create(akv_dev *dev, unsigned flags, akv_event **out) {
    if (!dev || !out || (flags & ~(unsigned)AKV_EVENT_TIMING)) return AKV_EINVAL;
    akv_event *ev = akv__calloc(1, sizeof *ev);
    if (!ev) return AKV_ENOMEM;
    akv_status st = dev->backend->event_create(dev->state, flags, &ev->impl);
    if (st != AKV_OK) {
        akv__free(ev);
        return st;
    }
    ev->dev = dev;
    ev->flags = flags;
    dev_count(dev, &dev->n_events, +1);
    *out = ev;
    return AKV_OK;
}

akv_status akv_dev_event_destroy(akv_dev *dev, akv_event *ev) {
    if (!dev) return AKV_EINVAL;
    if (!ev) return AKV_OK;
    if (!dev_event_ok(dev, ev)) return AKV_EINVAL;
    dev->backend->event_destroy(dev->state, ev->impl);
    dev_count(dev, &dev->n_events, -1);
    akv__free(ev);
    return AKV_OK;
}

akv_status akv_dev_event_record(akv_dev *dev, akv_event *ev, akv_queue q) {
    if (!dev || !dev_event_ok(dev, ev) || !dev_queue_ok(q)) return AKV_EINVAL;
    if (dev_fault_pass(dev, AKV_FAULT_RECORD)) return AKV_EDEVICE;
    akv_status st = dev->backend->event_record(dev->state, ev->impl, q);
    if (st == AKV_OK) ev->serial++;
    return st;
}

akv_status akv_dev_queue_wait_event(akv_dev *dev, akv_queue q, akv_event *ev) {
    if (!dev || !dev_event_ok(dev, ev) || !dev_queue_ok(q)) return AKV_EINVAL;
    if (!dev_event_recorded(ev, "queue wait")) return AKV_ESTATE;
    if (dev_fault_pass(dev, AKV_FAULT_WAIT)) return AKV_EDEVICE;
    return dev->backend->queue_wait(dev->state, q, ev->impl);
}

akv_status akv_dev_event_query(akv_dev *dev, akv_event *ev, int *done) {
    if (!dev || !dev_event_ok(dev, ev) || !done) return AKV_EINVAL;
    if (!dev_event_recorded(ev, "query")) return AKV_ESTATE;
    if (dev_fault_pass(dev, AKV_FAULT_SYNC)) return AKV_EDEVICE;
    int d = 0;
    akv_status st = dev->backend->event_query(dev->state, ev->impl, &d);
    if (st == AKV_OK && d < 0) {
        AKV_LOG_E("dev: an event's record completed on a faulted queue");
        return AKV_EDEVICE;
    }
    if (st == AKV_OK) *done = d;
    return st;
}

akv_status akv_dev_event_outcome(akv_dev *dev, akv_event *ev, int *failed) {
    if (!dev || !dev_event_ok(dev, ev) || !failed) return AKV_EINVAL;
    if (!dev_event_recorded(ev, "outcome")) return AKV_ESTATE;
    int d = 0;
    akv_status st = dev->backend->event_query(dev->state, ev->impl, &d);
    if (st) return st;
    if (d == 0) return AKV_ESTATE; /* not complete yet: a normal answer, not logged */
    *failed = d < 0;
    return AKV_OK;
}

akv_status akv_dev_event_sync(akv_dev *dev, akv_event *ev) {
    if (!dev || !dev_event_ok(dev, ev)) return AKV_EINVAL;
    if (!dev_event_recorded(ev, "sync")) return AKV_ESTATE;
    if (dev_fault_pass(dev, AKV_FAULT_SYNC)) return AKV_EDEVICE;
    return dev->backend->event_sync(dev->state, ev->impl);
}

akv_status akv_dev_event_elapsed_ns(akv_dev *dev, akv_event *start, akv_event *end,
                                    uint64_t *out_ns) {
    if (!dev || !dev_event_ok(dev, start) || !dev_event_ok(dev, end) || !out_ns) return AKV_EINVAL;
    if (!(start->flags & end->flags & AKV_EVENT_TIMING)) {
        AKV_LOG_E("dev: elapsed time needs two events created with AKV_EVENT_TIMING");
        return AKV_EINVAL;
    }
    if (!dev_event_recorded(start, "elapsed time") || !dev_event_recorded(end, "elapsed time"))
        return AKV_ESTATE;
    uint64_t ns = 0;
    akv_status st = dev->backend->event_elapsed_ns(dev->state, start->impl, end->impl, &ns);
    if (st == AKV_OK) *out_ns = ns;
    return st;
}

uint64_t akv_dev_event_serial(const akv_event *ev) {
    return ev ? ev->serial : 0;
}

akv_status akv_dev_queue_sync(akv_dev *dev, akv_queue q) {
    if (!dev || !dev_queue_ok(q)) return AKV_EINVAL;
    if (dev_fault_pass(dev, AKV_FAULT_SYNC)) return AKV_EDEVICE;
    return dev->backend->queue_sync(dev->state, q);
}

akv_status akv_dev_sync(akv_dev *dev) {
    if (!dev) return AKV_EINVAL;
    if (dev_fault_pass(dev, AKV_FAULT_SYNC)) return AKV_EDEVICE;
    return dev->backend->dev_sync(dev->state);
}

/* ---- asynchronous copies ------------------------------------------------------------------ */

/* Checks one side of a 2D copy: the bytes from the first row's start to the last row's end
 * lie in one live allocation of the right kind. */
static int dev_extent_ok(akv_dev *dev, uint64_t addr, size_t pitch, size_t width, size_t n_rows,
                         int pinned) {
    size_t span;
    if (!akv__size_mul(pitch, n_rows - 1, &span) || !akv__size_add(span, width, &span)) {
        AKV_LOG_E("dev: 2D copy extent overflows (pitch %zu, %zu rows)", pitch, n_rows);
        return 0;
    }
    return dev_range_ok(dev, addr, span, pinned);
}

static akv_status dev_copy_async(akv_dev *dev, akv_queue q, const akv_dev_copy2d *c) {
    if (!dev || !dev_queue_ok(q)) return AKV_EINVAL;
    if (!c->dst || !c->src) {
        AKV_LOG_E("dev: async copy with a null address");
        return AKV_EINVAL;
    }
    if (c->width_bytes == 0 || c->n_rows == 0) return AKV_OK;
    if (c->dst_pitch < c->width_bytes || c->src_pitch < c->width_bytes) {
        AKV_LOG_E("dev: 2D copy pitch (dst %zu, src %zu) below the row width %zu", c->dst_pitch,
                  c->src_pitch, c->width_bytes);
        return AKV_EINVAL;
    }
    /* Device sides must be device memory; host sides pinned memory of this device. */
    if (!dev_extent_ok(dev, c->dst, c->dst_pitch, c->width_bytes, c->n_rows, c->kind == AKV_COPY_D2H) ||
        !dev_extent_ok(dev, c->src, c->src_pitch, c->width_bytes, c->n_rows, c->kind == AKV_COPY_H2D))
        return AKV_EINVAL;
    unsigned flags;
    if (dev_copy_submit_flags(dev, &flags) != AKV_OK) return AKV_EDEVICE;
    return dev->backend->copy_async(dev->state, q, c, flags);
}

akv_status akv_dev_copy_h2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, const void *src,
                                  size_t n_bytes) {
    return akv_dev_copy_h2d_2d_async(dev, q, dst, n_bytes, src, n_bytes, n_bytes, 1);
}

akv_status akv_dev_copy_d2h_async(akv_dev *dev, akv_queue q, void *dst, akv_dptr src,
                                  size_t n_bytes) {
    return akv_dev_copy_d2h_2d_async(dev, q, dst, n_bytes, src, n_bytes, n_bytes, 1);
}

akv_status akv_dev_copy_d2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, akv_dptr src,
                                  size_t n_bytes) {
    akv_dev_copy2d c = {AKV_COPY_D2D, dst.addr, src.addr, n_bytes, n_bytes, n_bytes, 1};
    return dev_copy_async(dev, q, &c);
}

akv_status akv_dev_copy_h2d_2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, size_t dst_pitch,
                                     const void *src, size_t src_pitch, size_t width_bytes,
                                     size_t n_rows) {
    akv_dev_copy2d c = {AKV_COPY_H2D, dst.addr,  (uint64_t)(uintptr_t)src, dst_pitch,
                        src_pitch,    width_bytes, n_rows};
    return dev_copy_async(dev, q, &c);
}

akv_status akv_dev_copy_d2h_2d_async(akv_dev *dev, akv_queue q, void *dst, size_t dst_pitch,
                                     akv_dptr src, size_t src_pitch, size_t width_bytes,
                                     size_t n_rows) {
    akv_dev_copy2d c = {AKV_COPY_D2H, (uint64_t)(uintptr_t)dst, src.addr, dst_pitch,
                        src_pitch,    width_bytes,              n_rows};
    return dev_copy_async(dev, q, &c);
}

/* Whether copy method m is available (AKV_OK) or not (AKV_EUNSUPPORTED): the backend's word,
 * unless a test refused it. */
static akv_status dev_method_check(akv_dev *dev, akv_copy_method m) {
    pthread_mutex_lock(&dev->mu);
    const bool refused = (dev->refused_methods >> m) & 1u;
    pthread_mutex_unlock(&dev->mu);
    return refused ? AKV_EUNSUPPORTED : dev->backend->copy_method_check(dev->state, m);
}

akv_status akv_dev_refuse_copy_method(akv_dev *dev, akv_copy_method m, int refuse) {
    if (!dev || m == AKV_COPY_METHOD_DEFAULT || (unsigned)m >= AKV_N_COPY_METHODS) return AKV_EINVAL;
    pthread_mutex_lock(&dev->mu);
    if (refuse) dev->refused_methods |= 1u << m;
    else dev->refused_methods &= ~(1u << m);
    pthread_mutex_unlock(&dev->mu);
    return AKV_OK;
}

akv_status akv_dev_set_copy_config(akv_dev *dev, const akv_copy_config *cfg) {
    if (!dev || !cfg || (unsigned)cfg->method >= AKV_N_COPY_METHODS) return AKV_EINVAL;
    akv_copy_config c = *cfg;
    if (c.method == AKV_COPY_METHOD_DEFAULT) c.method = dev->backend->default_copy_method;
    akv_status st = dev_method_check(dev, c.method);
    if (st != AKV_OK) {
        AKV_LOG_E("dev: copy method '%s' is not available on the %s backend",
                  akv_copy_method_name(c.method), dev->backend->name);
        return st;
    }
    pthread_mutex_lock(&dev->mu);
    dev->copy_cfg = c;
    pthread_mutex_unlock(&dev->mu);
    return AKV_OK;
}

akv_copy_config akv_dev_get_copy_config(const akv_dev *dev) {
    pthread_mutex_lock((pthread_mutex_t *)&dev->mu);
    akv_copy_config c = dev->copy_cfg;
    pthread_mutex_unlock((pthread_mutex_t *)&dev->mu);
    return c;
}

/* Spans handed to the backend per call: coalescing happens in chunks of this many, on the
 * stack (no allocation on the hot path). */
#define DEV_BATCH_CHUNK 128

/* method: the call's own (DEFAULT: the configured one). */
static akv_status dev_copy_batch(akv_dev *dev, akv_queue q, akv_dev_copy_kind kind,
                                 akv_copy_method method, const akv_dev_xfer *x, size_t n) {
    if (!dev || !dev_queue_ok(q) || (n && !x)) return AKV_EINVAL;
    if (n == 0) return AKV_OK;
    /* Every span first: all-or-nothing against bad input. */
    for (size_t i = 0; i < n; i++) {
        if (!x[i].d.addr || !x[i].h || x[i].n_bytes == 0) {
            AKV_LOG_E("dev: batch span %zu of %zu has a null address or no bytes", i, n);
            return AKV_EINVAL;
        }
        if (!dev_range_ok(dev, x[i].d.addr, x[i].n_bytes, 0) ||
            !dev_range_ok(dev, (uint64_t)(uintptr_t)x[i].h, x[i].n_bytes, 1))
            return AKV_EINVAL;
    }
    akv_copy_config cfg = akv_dev_get_copy_config(dev);
    if (method != AKV_COPY_METHOD_DEFAULT && method != cfg.method) {
        if (dev_method_check(dev, method) != AKV_OK) return AKV_EUNSUPPORTED;
        cfg.method = method;
    }
    unsigned flags;
    if (dev_copy_submit_flags(dev, &flags) != AKV_OK) return AKV_EDEVICE;
    if (cfg.method == AKV_COPY_METHOD_EACH)
        return dev->backend->copy_batch_async(dev->state, q, kind, x, n, &cfg, flags);
    /* Coalesce runs adjacent on both sides and inside one allocation on both sides (two
     * pinned arenas may be neighbours in the address space, and one copy may not span two
     * allocations), DEV_BATCH_CHUNK merged spans per backend call. A failure after the first
     * chunk leaves a prefix submitted: the caller treats any error here as a failed transport
     * (quarantine drains before anything is reused). */
    akv_dev_xfer m[DEV_BATCH_CHUNK];
    size_t n_m = 0;
    /* the ends of the allocations holding the last merged span, looked up at its first
     * adjacency (UINT64_MAX: not yet; 0: none holds it). Live allocations do not overlap, so
     * the one holding the span is the only one that can hold it grown. */
    uint64_t d_end = UINT64_MAX, h_end = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if (n_m) {
            /* adjacent on both sides: merged when the joined span still lies in one
             * allocation on each side (only adjacent spans pay the lookups) */
            akv_dev_xfer *last = &m[n_m - 1];
            const uint64_t h_addr = (uint64_t)(uintptr_t)last->h;
            if (last->d.addr + last->n_bytes == x[i].d.addr &&
                h_addr + last->n_bytes == (uint64_t)(uintptr_t)x[i].h) {
                if (d_end == UINT64_MAX) {
                    d_end = dev_alloc_end(dev, last->d.addr, last->n_bytes, 0);
                    h_end = dev_alloc_end(dev, h_addr, last->n_bytes, 1);
                }
                const size_t joined = last->n_bytes + x[i].n_bytes;
                if (last->d.addr + joined <= d_end && h_addr + joined <= h_end) {
                    last->n_bytes = joined;
                    continue;
                }
            }
        }
        d_end = h_end = UINT64_MAX; /* x[i] starts a new merged span */
        if (n_m == DEV_BATCH_CHUNK) {
            akv_status st = dev->backend->copy_batch_async(dev->state, q, kind, m, n_m, &cfg, flags);
            if (st != AKV_OK) return st;
            n_m = 0;
        }
        m[n_m++] = x[i];
    }
    return dev->backend->copy_batch_async(dev->state, q, kind, m, n_m, &cfg, flags);
}

akv_status akv_dev_copy_h2d_batch_async(akv_dev *dev, akv_queue q, const akv_dev_xfer *x,
                                        size_t n) {
    return dev_copy_batch(dev, q, AKV_COPY_H2D, AKV_COPY_METHOD_DEFAULT, x, n);
}

akv_status akv_dev_copy_d2h_batch_async(akv_dev *dev, akv_queue q, const akv_dev_xfer *x,
                                        size_t n) {
    return dev_copy_batch(dev, q, AKV_COPY_D2H, AKV_COPY_METHOD_DEFAULT, x, n);
}

akv_status akv_dev_copy_h2d_batch_by_async(akv_dev *dev, akv_queue q, akv_copy_method method,
                                           const akv_dev_xfer *x, size_t n) {
    if ((unsigned)method >= AKV_N_COPY_METHODS) return AKV_EINVAL;
    return dev_copy_batch(dev, q, AKV_COPY_H2D, method, x, n);
}

akv_status akv_dev_copy_d2h_batch_by_async(akv_dev *dev, akv_queue q, akv_copy_method method,
                                           const akv_dev_xfer *x, size_t n) {
    if ((unsigned)method >= AKV_N_COPY_METHODS) return AKV_EINVAL;
    return dev_copy_batch(dev, q, AKV_COPY_D2H, method, x, n);
}

akv_status akv_dev_memset_async(akv_dev *dev, akv_queue q, akv_dptr dst, int byte, size_t n_bytes) {
    if (!dev || !dev_queue_ok(q) || !dst.addr) return AKV_EINVAL;
    if (n_bytes == 0) return AKV_OK;
    if (!dev_range_ok(dev, dst.addr, n_bytes, 0)) return AKV_EINVAL;
    unsigned flags;
    if (dev_copy_submit_flags(dev, &flags) != AKV_OK) return AKV_EDEVICE;
    return dev->backend->memset_async(dev->state, q, dst.addr, byte, n_bytes, flags);
}

akv_status akv_dev_host_fn_async(akv_dev *dev, akv_queue q, akv_dev_host_fn fn, void *arg) {
    if (!dev || !dev_queue_ok(q)) return AKV_EINVAL;
    if (!fn) {
        AKV_LOG_E("dev: a host function that is NULL");
        return AKV_EINVAL;
    }
    if (dev_fault_pass(dev, AKV_FAULT_OP)) return AKV_EDEVICE;
    const unsigned flags = dev_fault_pass(dev, AKV_FAULT_OP_EXEC) ? AKV_SUBMIT_FAIL_EXEC : 0;
    return dev->backend->host_fn_async(dev->state, q, fn, arg, flags);
}

/* ---- ops ------------------------------------------------------------------------------------------ */

int akv_dev_op_supported(const akv_dev *dev, const akv_dev_op *op) {
    return dev && op && op->name && dev->backend->op_supported(dev->state, op);
}

akv_status akv__dev_op_check(const akv_dev *dev, const akv_dev_op *op, const void *args,
                             size_t args_bytes) {
    if (!op || !op->name) {
        AKV_LOG_E("dev: an op launch without an op (or without its name)");
        return AKV_EINVAL;
    }
    if (args_bytes != op->args_bytes || (!args && args_bytes)) {
        AKV_LOG_E("dev: op '%s' takes %zu bytes of arguments, got %zu%s", op->name, op->args_bytes,
                  args_bytes, args ? "" : " (and no pointer)");
        return AKV_EINVAL;
    }
    if (!dev->backend->op_supported(dev->state, op)) {
        AKV_LOG_E("dev: op '%s' has no %s implementation", op->name, dev->backend->name);
        return AKV_EUNSUPPORTED;
    }
    return AKV_OK;
}

/* ---- op profile ----------------------------------------------------------------------------- */

/* Timing events come from the backend directly: they are the profile's, not the caller's (no
 * live-event count, no injected record failures). */
typedef struct dev_profile {
    /* held from a launch's first record to its second: no other launch comes between */
    pthread_mutex_t mu;
    size_t cap, n; /* timed launches: room and used */
    uint64_t untimed;
    void **ev; /* 2 per slot (before, after), created when the slot is first used */
    char (*key)[sizeof(((akv_dev_profile_row *)0)->key)];
} dev_profile;

akv_status akv_dev_profile_start(akv_dev *dev, size_t max_launches) {
    if (!dev || max_launches == 0 || max_launches > SIZE_MAX / 4 / sizeof(void *))
        return AKV_EINVAL;
    if (dev->profile) {
        AKV_LOG_E("dev: a profile is already running");
        return AKV_ESTATE;
    }
    dev_profile *p = akv__calloc(1, sizeof *p);
    if (!p) return AKV_ENOMEM;
    p->ev = akv__calloc(2 * max_launches, sizeof *p->ev);
    p->key = akv__calloc(max_launches, sizeof *p->key);
    if (!p->ev || !p->key) {
        akv__free(p->ev), akv__free(p->key), akv__free(p);
        return AKV_ENOMEM;
    }
    p->cap = max_launches;
    pthread_mutex_init(&p->mu, NULL);
    dev->profile = p;
    return AKV_OK;
}

/* Records the event before a launch of op (NULL: a graph) and returns its slot (SIZE_MAX:
 * untimed). Leaves the profile's lock held for prof_after. */
static size_t prof_before(akv_dev *dev, const akv_dev_op *op, const void *args) {
    dev_profile *p = dev->profile;
    pthread_mutex_lock(&p->mu);
    if (p->n == p->cap) return SIZE_MAX;
    size_t i = p->n;
    const akv_dev_backend *b = dev->backend;
    for (int j = 0; j < 2; j++)
        if (!p->ev[2 * i + j] && b->event_create(dev->state, AKV_EVENT_TIMING, &p->ev[2 * i + j]))
            return SIZE_MAX;
    if (b->event_record(dev->state, p->ev[2 * i], AKV_QUEUE_COMPUTE)) return SIZE_MAX;
    int n = snprintf(p->key[i], sizeof p->key[i], "%s", op ? op->name : "graph");
    if (op && op->describe && n > 0 && (size_t)n + 2 < sizeof p->key[i]) {
        p->key[i][n] = ' ';
        op->describe(args, p->key[i] + n + 1, sizeof p->key[i] - (size_t)n - 1);
    }
    return i;
}

static void prof_after(akv_dev *dev, size_t i, akv_status launched) {
    dev_profile *p = dev->profile;
    if (i != SIZE_MAX && launched == AKV_OK &&
        dev->backend->event_record(dev->state, p->ev[2 * i + 1], AKV_QUEUE_COMPUTE) == AKV_OK)
        p->n++;
    else if (launched == AKV_OK)
        p->untimed++;
    pthread_mutex_unlock(&p->mu);
}

static int prof_row_cmp(const void *a, const void *b) {
    uint64_t x = ((const akv_dev_profile_row *)a)->ns, y = ((const akv_dev_profile_row *)b)->ns;
    return x < y ? 1 : x > y ? -1 : 0;
}

akv_status akv_dev_profile_stop(akv_dev *dev, akv_dev_profile_row *rows, size_t cap,
                                akv_dev_profile_summary *sum) {
    if (!dev || (cap && !rows) || !sum) return AKV_EINVAL;
    dev_profile *p = dev->profile;
    if (!p) {
        AKV_LOG_E("dev: profile stop without a running profile");
        return AKV_ESTATE;
    }
    dev->profile = NULL;
    memset(sum, 0, sizeof *sum);
    sum->launches = p->n, sum->untimed = p->untimed;
    const akv_dev_backend *b = dev->backend;
    akv_status st = b->queue_sync(dev->state, AKV_QUEUE_COMPUTE);
    akv_dev_profile_row *all = p->n ? akv__calloc(p->n, sizeof *all) : NULL;
    if (st == AKV_OK && p->n && !all) st = AKV_ENOMEM;
    for (size_t i = 0; st == AKV_OK && i < p->n; i++) {
        uint64_t ns = 0;
        if ((st = b->event_elapsed_ns(dev->state, p->ev[2 * i], p->ev[2 * i + 1], &ns))) break;
        size_t k = 0;
        while (k < sum->n_keys && strcmp(all[k].key, p->key[i]))
            k++;
        if (k == sum->n_keys) memcpy(all[sum->n_keys++].key, p->key[i], sizeof all[k].key);
        all[k].launches++, all[k].ns += ns;
        sum->ops_ns += ns;
    }
    if (st == AKV_OK && p->n)
        st = b->event_elapsed_ns(dev->state, p->ev[0], p->ev[2 * p->n - 1], &sum->span_ns);
    const size_t n_out = cap < sum->n_keys ? cap : sum->n_keys;
    if (st == AKV_OK && sum->n_keys) qsort(all, sum->n_keys, sizeof *all, prof_row_cmp);
    if (st == AKV_OK && n_out) memcpy(rows, all, n_out * sizeof *rows);
    for (size_t i = 0; i < 2 * p->cap && p->ev[i]; i++)
        b->event_destroy(dev->state, p->ev[i]);
    pthread_mutex_destroy(&p->mu);
    akv__free(all), akv__free(p->ev), akv__free(p->key), akv__free(p);
    return st;
}

akv_status akv_dev_op_launch(akv_dev *dev, const akv_dev_op *op, const void *args,
                             size_t args_bytes) {
    if (!dev) return AKV_EINVAL;
    akv_status st = akv__dev_op_check(dev, op, args, args_bytes);
    if (st != AKV_OK) return st;
    if (dev_fault_pass(dev, AKV_FAULT_OP)) return AKV_EDEVICE;
    unsigned flags = dev_fault_pass(dev, AKV_FAULT_OP_EXEC) ? AKV_SUBMIT_FAIL_EXEC : 0;
    if (!dev->profile) return dev->backend->op_launch(dev->state, dev, op, args, flags);
    size_t slot = prof_before(dev, op, args);
    st = dev->backend->op_launch(dev->state, dev, op, args, flags);
    prof_after(dev, slot, st);
    return st;
}

/* ---- graphs --------------------------------------------------------------------------------------- */

struct akv_graph {
    akv_dev *dev;
    void *impl;
};

akv_status akv_dev_graph_create(akv_dev *dev, const akv_dev_launch *launches, size_t n,
                                akv_graph **out) {
    if (!dev || !launches || !n || !out) return AKV_EINVAL;
    for (size_t i = 0; i < n; i++) {
        const akv_dev_op *op = launches[i].op;
        akv_status st = akv__dev_op_check(dev, op, launches[i].args, op ? op->args_bytes : 0);
        if (st != AKV_OK) return st;
    }
    akv_graph *g = akv__calloc(1, sizeof *g);
    if (!g) return AKV_ENOMEM;
    akv_status st = dev->backend->graph_create(dev->state, dev, launches, n, &g->impl);
    if (st != AKV_OK) {
        akv__free(g);
        return st;
    }
    g->dev = dev;
    dev_count(dev, &dev->n_graphs, +1);
    *out = g;
    return AKV_OK;
}

akv_status akv_dev_graph_launch(akv_dev *dev, akv_graph *g) {
    if (!dev || !g || g->dev != dev) return AKV_EINVAL;
    if (dev_fault_pass(dev, AKV_FAULT_OP)) return AKV_EDEVICE;
    unsigned flags = dev_fault_pass(dev, AKV_FAULT_OP_EXEC) ? AKV_SUBMIT_FAIL_EXEC : 0;
    if (!dev->profile) return dev->backend->graph_launch(dev->state, g->impl, flags);
    size_t slot = prof_before(dev, NULL, NULL);
    akv_status st = dev->backend->graph_launch(dev->state, g->impl, flags);
    prof_after(dev, slot, st);
    return st;
}

akv_status akv_dev_graph_destroy(akv_dev *dev, akv_graph *g) {
    if (!dev) return AKV_EINVAL;
    if (!g) return AKV_OK;
    if (g->dev != dev) return AKV_EINVAL;
    dev->backend->graph_destroy(dev->state, g->impl);
    dev_count(dev, &dev->n_graphs, -1);
    akv__free(g);
    return AKV_OK;
}

void *akv__dev_state(const akv_dev *dev) {
    return dev->state;
}

const akv_dev_backend *akv__dev_backend(const akv_dev *dev) {
    return dev->backend;
}

void *akv__dev_host_addr(const akv_dev *dev, akv_dptr p) {
    AKV_ASSERT(dev->backend->is_host);
    return (void *)(uintptr_t)p.addr;
}
