/*
 * dev/dev_impl.h — what a backend implements (the table behind akv_dev_backend).
 *
 * The front (dev.c) validates arguments, keeps the table of live allocations (so a foreign
 * free is AKV_EINVAL, usage is exact and every copy's ranges are checked), owns the event
 * objects (record serials, "never recorded" checks), coalesces batched spans, counts fault
 * points and injects submission/wait failures; then it calls the backend. A backend function
 * returns a status and logs its own detail once (e.g. the CUDA call and its message).
 */
#ifndef AKV_DEV_IMPL_H
#define AKV_DEV_IMPL_H

#include "akv/dev.h"
#include "dev/dev_op.h" /* the parts other modules see */

typedef enum akv_dev_copy_kind {
    AKV_COPY_H2D = 0, /* dst: device address, src: host address */
    AKV_COPY_D2H = 1, /* dst: host address, src: device address */
    AKV_COPY_D2D = 2, /* both device addresses */
} akv_dev_copy_kind;

/* One asynchronous 2D copy (a 1D copy is n_rows = 1, pitches = width). Addresses are raw
 * numbers: host addresses on the host side, device addresses on the device side. */
typedef struct akv_dev_copy2d {
    akv_dev_copy_kind kind;
    uint64_t dst, src;
    size_t dst_pitch, src_pitch; /* bytes between row starts */
    size_t width_bytes, n_rows;
} akv_dev_copy2d;

/* Submission flags the front passes down. */
enum {
    AKV_SUBMIT_FAIL_EXEC = 1u, /* injected: accept the work, fail it when it runs */
};

struct akv_dev_backend {
    const char *name;
    /* 1 for the host backend: device addresses are host addresses, and allocation failures
     * and execution faults can be injected (tests). */
    int is_host;
    /* Open device `params->device_index`; *state is the backend's own. Creates the queues. */
    akv_status (*open)(const akv_dev_params *params, void **state);
    void (*close)(void *state); /* never waits, submits or drains queued work */
    akv_status (*info)(void *state, akv_dev_info *out);
    akv_status (*mem_alloc)(void *state, size_t n_bytes, uint64_t *addr);
    akv_status (*mem_free)(void *state, uint64_t addr);
    akv_status (*pinned_alloc)(void *state, size_t n_bytes, void **p);
    akv_status (*pinned_free)(void *state, void *p);
    /* the device's address of a pinned block's byte at p (the front checked the range) */
    akv_status (*pinned_dptr)(void *state, const void *p, uint64_t *addr);
    /* Synchronous copy; `kind` says which side each address is on. */
    akv_status (*copy_sync)(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                            size_t n_bytes);
    akv_status (*memset_sync)(void *state, uint64_t dst, int byte, size_t n_bytes);

    /* Events: the backend's own handle behind a front akv_event. */
    akv_status (*event_create)(void *state, unsigned flags, void **ev);
    void (*event_destroy)(void *state, void *ev); /* never waits */
    akv_status (*event_record)(void *state, void *ev, akv_queue q);
    akv_status (*queue_wait)(void *state, akv_queue q, void *ev);
    /* *done: 1 complete, 0 pending, -1 complete and the work it covers failed (established:
     * a backend that cannot tell returns AKV_EDEVICE instead) */
    akv_status (*event_query)(void *state, void *ev, int *done);
    akv_status (*event_sync)(void *state, void *ev);
    akv_status (*event_elapsed_ns)(void *state, void *start, void *end, uint64_t *ns);
    akv_status (*queue_sync)(void *state, akv_queue q);
    akv_status (*dev_sync)(void *state);

    /* Asynchronous copies. copy_batch gets spans already checked and coalesced by the front
     * (kind H2D or D2H), and the method to use (never DEFAULT). */
    akv_status (*copy_async)(void *state, akv_queue q, const akv_dev_copy2d *c,
                             unsigned submit_flags);
    akv_status (*copy_batch_async)(void *state, akv_queue q, akv_dev_copy_kind kind,
                                   const akv_dev_xfer *x, size_t n, const akv_copy_config *cfg,
                                   unsigned submit_flags);
    akv_status (*host_fn_async)(void *state, akv_queue q, akv_dev_host_fn fn, void *arg,
                                unsigned flags);
    akv_status (*memset_async)(void *state, akv_queue q, uint64_t dst, int byte, size_t n_bytes,
                               unsigned submit_flags);
    /* The method DEFAULT stands for, and whether a method is available (AKV_OK) or not. */
    akv_copy_method default_copy_method;
    akv_status (*copy_method_check)(void *state, akv_copy_method m);

    /* Ops on the compute queue; `dev` is the front (host implementations need it). */
    akv_status (*op_launch)(void *state, akv_dev *dev, const akv_dev_op *op, const void *args,
                            unsigned submit_flags);
    int (*op_supported)(void *state, const akv_dev_op *op);
    /* Graphs of ops (the front checked every launch: supported, non-NULL arguments). */
    akv_status (*graph_create)(void *state, akv_dev *dev, const akv_dev_launch *l, size_t n,
                               void **g);
    akv_status (*graph_launch)(void *state, void *g, unsigned submit_flags);
    void (*graph_destroy)(void *state, void *g); /* never waits */

    /* Host backend only (NULL elsewhere): test controls. */
    akv_status (*inject_delays)(void *state, uint64_t seed, uint32_t max_delay_us,
                                uint32_t one_in);
    void (*clear_faults)(void *state);
};

/* The backend state of a device (for backend-specific extensions). */
void *akv__dev_state(const akv_dev *dev);
const akv_dev_backend *akv__dev_backend(const akv_dev *dev);

#endif
