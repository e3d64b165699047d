/*
 * akv/dev.h — the device interface: the narrow platform layer under the memory layer.
 *
 * Everything the memory layer and the engine do to a device goes through here: device
 * memory, pinned host memory, three queues, events, asynchronous copies and an op table.
 * Two backends implement it: the host backend (device memory is host memory and every queue
 * is a real worker thread, so asynchrony and ordering are real on the CPU; it is the test bed
 * for every invariant, with injected delays and failures) and the CUDA backend (cuda/).
 *
 * Glossary
 *   device address  an akv_dptr: a number, never a C pointer. Host code cannot dereference
 *                   it by construction; it can only offset it and hand it to the backend.
 *   pinned memory   page-locked host memory the device can copy from at full bus speed
 *                   (cudaHostAlloc, mapped, on CUDA; plain aligned memory on the host backend).
 *                   Every asynchronous copy's host side must lie inside one live pinned block
 *                   of the same device: an async copy from the stack or the heap is refused.
 *   queue           an ordered stream of device work. Each device has three: AKV_QUEUE_H2D
 *                   (refills: host-to-device copies), AKV_QUEUE_D2H (write-backs) and
 *                   AKV_QUEUE_COMPUTE (ops). Work on one queue runs in submission order; work
 *                   on different queues is unordered unless an event orders it.
 *   event           a marker recorded on a queue: it completes when the work submitted to that
 *                   queue before the record has completed. Re-recording moves the marker; a
 *                   query, sync or wait refers to the latest record at the time of the call
 *                   (CUDA semantics). akv_dev_event_serial() counts records, so a holder can
 *                   tell that an event was re-recorded behind its back.
 *   queue wait      akv_dev_queue_wait_event(q, ev): work submitted to q afterwards starts only
 *                   after ev's current record completes. This is ordering ON THE DEVICE: the
 *                   host returns at once and never blocks on the hot path.
 *   op              a named kernel launched on the compute queue (akv_dev_op). The descriptor
 *                   carries the host implementation; the CUDA backend finds its launcher by the
 *                   op's name in cuda/cuda_ops.c (the only place CUDA code may live).
 *   wait point      a call where the host learns completion: event query and sync, queue sync,
 *                   device sync. Submission points: copies, memsets, records, waits, op launches.
 *
 * Invariants
 *   - Every successful alloc has exactly one free, on the same akv_dev; every event created
 *     is destroyed on the same akv_dev.
 *   - akv_dev_destroy refuses (AKV_EBUSY, nothing changed) while allocations, events or
 *     graphs live.
 *   - The byte counts reported by akv_dev_usage equal what the backend really holds.
 *   - A copy's device range lies in one live device allocation and its host range in one live
 *     pinned allocation, checked at submission (AKV_EINVAL, logged with the address).
 *   - A queue never waits on an event that has not been recorded (AKV_ESTATE): a wait that
 *     would silently order nothing is an error.
 *   - An error from work already accepted (a failed copy or op) is never lost: the queue it ran
 *     on is faulted, every event recorded on it afterwards reports AKV_EDEVICE, every queue that
 *     waits on such an event faults too, and queue/device sync report it.
 *
 * Ordering and the synchronous calls. The *_sync copies and memset are NOT ordered with queue
 * work (on CUDA they run on the legacy stream, the queues are non-blocking streams): sync the
 * queues first when both touch the same bytes. Freeing memory (akv_dev_mem_free,
 * akv_dev_pinned_free) waits until the device is idle on both backends (like cudaFree): free
 * only what no queued work uses, or the wait is all that stands between you and a device fault.
 *
 * Thread-safety: allocation, free, submission and wait calls are thread-safe. One event is
 * used by one thread at a time. create/destroy of the device are not thread-safe.
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
    uint64_t fail_seed;     /* host backend: nonzero turns on random queue delays from this
                               seed (max 50 us, one command in 16); 0 = none. See
                               akv_dev_inject_delays for finer control. */
} akv_dev_params;

typedef struct akv_dev_info {
    char name[96];                 /* "host", "NVIDIA H200", ... */
    int is_host;                   /* 1: device memory is host memory (host backend) */
    size_t total_bytes;            /* device memory; 0 = unknown/unbounded (host backend) */
    int n_sm;                      /* multiprocessors (host backend: worker threads) */
    size_t smem_per_block_bytes;   /* shared memory a block may opt into */
    size_t l2_bytes;               /* last-level cache */
    int cc_major, cc_minor;        /* compute capability (host backend: 0.0) */
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
/* The device's address of pinned host memory [host, host + n_bytes) (mapped: a kernel reads
 * and writes it across the bus in place, no copy; on the host backend the address itself).
 * Valid while the block is. AKV_EINVAL (logged) for a range outside one live pinned block. */
akv_status akv_dev_pinned_dptr(akv_dev *dev, const void *host, size_t n_bytes, akv_dptr *out);

/* Synchronous copies (set-up, tests, loading weights: never the hot path, which uses
 * queues). They return when the bytes have arrived. Each checks that the device range lies
 * inside one live device allocation (AKV_EINVAL otherwise, naming the address). */
akv_status akv_dev_copy_h2d_sync(akv_dev *dev, akv_dptr dst, const void *src, size_t n_bytes);
akv_status akv_dev_copy_d2h_sync(akv_dev *dev, void *dst, akv_dptr src, size_t n_bytes);
akv_status akv_dev_copy_d2d_sync(akv_dev *dev, akv_dptr dst, akv_dptr src, size_t n_bytes);
/* Sets n_bytes of device memory to `byte` (poisoning outputs before a kernel runs). */
akv_status akv_dev_memset_sync(akv_dev *dev, akv_dptr dst, int byte, size_t n_bytes);

/* ---- queues and events ------------------------------------------------------------------ */

typedef enum akv_queue {
    AKV_QUEUE_H2D = 0,     /* host-to-device copies (staging refills) */
    AKV_QUEUE_D2H = 1,     /* device-to-host copies (write-backs of new rows) */
    AKV_QUEUE_COMPUTE = 2, /* ops (kernels) */
} akv_queue;
#define AKV_N_QUEUES 3

/* "h2d", "d2h", "compute"; "(bad queue)" otherwise. */
const char *akv_queue_name(akv_queue q);

typedef struct akv_event akv_event; /* owned by its device; see akv_dev_event_create */

enum {
    AKV_EVENT_TIMING = 1u, /* the event records a device timestamp (akv_dev_event_elapsed_ns) */
};

/* Creates an event (never recorded yet). flags: 0 or AKV_EVENT_TIMING. */
akv_status akv_dev_event_create(akv_dev *dev, unsigned flags, akv_event **out);
/* Destroys an event; NULL is a no-op. Never waits: a pending record completes on its own (the
 * backend keeps what it needs), but nothing may query, sync or wait on `ev` afterwards. */
akv_status akv_dev_event_destroy(akv_dev *dev, akv_event *ev);
/* Records `ev` on queue q: it completes when everything submitted to q before completes. */
akv_status akv_dev_event_record(akv_dev *dev, akv_event *ev, akv_queue q);
/* Makes q wait ON THE DEVICE for ev's current record; returns at once. AKV_ESTATE if ev was
 * never recorded. */
akv_status akv_dev_queue_wait_event(akv_dev *dev, akv_queue q, akv_event *ev);
/* *done = 1 when ev's current record has completed, 0 when not yet; never blocks.
 * AKV_EDEVICE when the work it covers failed; AKV_ESTATE if never recorded. */
akv_status akv_dev_event_query(akv_dev *dev, akv_event *ev, int *done);
/* The outcome of ev's current record, once complete, without waiting and without being a wait
 * point (no injected failure): *failed = 1 when the backend establishes that the work it
 * covers failed while it ran (the host backend: a record that completed on a faulted queue;
 * it stays failed until recorded again), 0 when it completed without error. AKV_EDEVICE when
 * the backend cannot tell (CUDA after an error: the context's errors are sticky); AKV_ESTATE
 * if never recorded (logged: misuse) or not complete yet (not logged). */
akv_status akv_dev_event_outcome(akv_dev *dev, akv_event *ev, int *failed);
/* Blocks until ev's current record completes. AKV_EDEVICE when the work it covers failed
 * (the error is returned, never ignored); AKV_ESTATE if never recorded. */
akv_status akv_dev_event_sync(akv_dev *dev, akv_event *ev);
/* Device time between two completed records of AKV_EVENT_TIMING events, nanoseconds
 * (CUDA resolution is about 0.5 us). AKV_ESTATE if either is not complete, AKV_EINVAL without
 * AKV_EVENT_TIMING. */
akv_status akv_dev_event_elapsed_ns(akv_dev *dev, akv_event *start, akv_event *end,
                                    uint64_t *out_ns);
/* How many times ev has been recorded (0 = never). A holder that remembers the serial of
 * "its" record detects a re-record (a substituted event). */
uint64_t akv_dev_event_serial(const akv_event *ev);

/* Blocks until everything submitted to q has completed. AKV_EDEVICE when q is faulted. */
akv_status akv_dev_queue_sync(akv_dev *dev, akv_queue q);
/* Blocks until every queue of the device is idle (cudaDeviceSynchronize). AKV_EDEVICE when
 * any queue is faulted or the device reports an error. */
akv_status akv_dev_sync(akv_dev *dev);

/* ---- host work in queue order ----------------------------------------------------------- */

/* A function the host runs in queue q's order (cudaLaunchHostFunc): after everything submitted
 * to q before it has completed, and before anything submitted to q after it starts; other
 * queues go on meanwhile. It runs on a thread of the device's, never the caller's, must not
 * call into any device, and holds q up for as long as it runs. It is not told of failures: a
 * copy it reads may have failed, and on a failed queue it does not run at all; the fence of
 * the work after it says which (akv_dev_event_outcome), as for any queued work. What it must
 * report, it writes through arg, which the caller keeps valid until that fence. A submission
 * and execution point of fault injection, as an op launch. AKV_EINVAL for a NULL fn. */
typedef void (*akv_dev_host_fn)(void *arg);
akv_status akv_dev_host_fn_async(akv_dev *dev, akv_queue q, akv_dev_host_fn fn, void *arg);

/* ---- asynchronous copies ---------------------------------------------------------------- */

/* 1D copies on queue q (any queue; staging uses H2D for refills and D2H for write-backs).
 * n_bytes = 0 submits nothing and succeeds. */
akv_status akv_dev_copy_h2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, const void *src,
                                  size_t n_bytes);
akv_status akv_dev_copy_d2h_async(akv_dev *dev, akv_queue q, void *dst, akv_dptr src,
                                  size_t n_bytes);
akv_status akv_dev_copy_d2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, akv_dptr src,
                                  size_t n_bytes);

/* 2D (strided) copies: n_rows rows of width_bytes each; row r starts at dst + r * dst_pitch
 * and src + r * src_pitch. Pitches >= width_bytes. The write-back of a token's rows is one of
 * these per page: 2 * n_kv_heads rows of head_dim elements at a pitch of P * head_dim. */
akv_status akv_dev_copy_h2d_2d_async(akv_dev *dev, akv_queue q, akv_dptr dst, size_t dst_pitch,
                                     const void *src, size_t src_pitch, size_t width_bytes,
                                     size_t n_rows);
akv_status akv_dev_copy_d2h_2d_async(akv_dev *dev, akv_queue q, void *dst, size_t dst_pitch,
                                     akv_dptr src, size_t src_pitch, size_t width_bytes,
                                     size_t n_rows);

/* One span of a batched copy: n_bytes between a device address and a pinned host address. */
typedef struct akv_dev_xfer {
    akv_dptr d;     /* device side */
    void *h;        /* host side: inside one live pinned block of this device */
    size_t n_bytes; /* > 0 */
} akv_dev_xfer;

/* How a batch of spans (pages) travels; see docs/staging.md for the measurements. */
typedef enum akv_copy_method {
    AKV_COPY_METHOD_DEFAULT = 0,  /* the backend's measured choice */
    AKV_COPY_METHOD_EACH = 1,     /* one async copy per span */
    AKV_COPY_METHOD_COALESCE = 2, /* spans adjacent on both sides merged, then one copy each */
    AKV_COPY_METHOD_BATCH = 3,    /* coalesced, then one batched call (cudaMemcpyBatchAsync) */
    AKV_COPY_METHOD_KERNEL = 4,   /* coalesced, then a copy kernel over mapped pinned memory */
} akv_copy_method;
#define AKV_N_COPY_METHODS 5

/* "default", "each", "coalesce", "batch", "kernel"; "(bad method)" otherwise. */
const char *akv_copy_method_name(akv_copy_method m);

enum {
    AKV_COPY_PREFER_OVERLAP = 1u, /* BATCH: cudaMemcpyFlagPreferOverlapWithCompute (a hint) */
};

typedef struct akv_copy_config {
    akv_copy_method method; /* DEFAULT = the backend's choice */
    uint32_t kernel_blocks; /* KERNEL: thread blocks of the copy kernel; 0 = backend default */
    uint32_t flags;         /* AKV_COPY_* hints; 0 = none */
} akv_copy_config;

/* Sets how batched copies travel on this device. AKV_EUNSUPPORTED (nothing changed) when the
 * backend or the CUDA version lacks the method. */
akv_status akv_dev_set_copy_config(akv_dev *dev, const akv_copy_config *cfg);
/* The configuration in force, DEFAULT resolved to the method the backend really uses. */
akv_copy_config akv_dev_get_copy_config(const akv_dev *dev);

/* Batched copies of n spans (pages) on queue q, by the configured method. Spans within one
 * batch must not overlap on the written side (they may run in any order). n = 0 submits
 * nothing. Every span is checked before anything is submitted (all-or-nothing). */
akv_status akv_dev_copy_h2d_batch_async(akv_dev *dev, akv_queue q, const akv_dev_xfer *x,
                                        size_t n);
akv_status akv_dev_copy_d2h_batch_async(akv_dev *dev, akv_queue q, const akv_dev_xfer *x,
                                        size_t n);
/* The same by `method` for this call alone (the configuration in force unchanged; DEFAULT =
 * the configured one). AKV_COPY_METHOD_KERNEL moves the bytes with the SMs, so a small copy on
 * the compute queue never waits behind the copy engines' work of other queues. AKV_EUNSUPPORTED
 * (nothing submitted, nothing logged: the caller may fall back) where the backend lacks it,
 * AKV_EINVAL for a value that is no method. */
akv_status akv_dev_copy_h2d_batch_by_async(akv_dev *dev, akv_queue q, akv_copy_method method,
                                           const akv_dev_xfer *x, size_t n);
akv_status akv_dev_copy_d2h_batch_by_async(akv_dev *dev, akv_queue q, akv_copy_method method,
                                           const akv_dev_xfer *x, size_t n);

/* Sets n_bytes of device memory to `byte`, on queue q (poisoning a buffer in queue order). */
akv_status akv_dev_memset_async(akv_dev *dev, akv_queue q, akv_dptr dst, int byte, size_t n_bytes);

/* ---- ops: kernels on the compute queue ----------------------------------------------------- */

/* An op: a named kernel. The module that owns an op defines one const descriptor; its CUDA
 * launcher is registered under the same name in cuda/cuda_ops.c (so code outside cuda/ never
 * sees CUDA types). Device addresses inside `args` are akv_dptr values. */
typedef struct akv_dev_op {
    const char *name;  /* unique, e.g. "stage_probe"; the CUDA backend looks it up by name */
    size_t args_bytes; /* sizeof the op's argument struct; launch copies exactly this many */
    /* The host backend's implementation, run on the compute worker thread in queue order.
     * Device addresses are host addresses there (akv__dev_host_addr). Returns a status: an
     * error faults the compute queue like a failed kernel. NULL = no host implementation. */
    akv_status (*host)(akv_dev *dev, const void *args);
    /* Optional: writes a short description of the arguments that set the op's cost ("512 x
     * 6144 x 4096 bf16" for a product) into buf (cap bytes, NUL-terminated). The op profile
     * (below) keeps one row per name and description. NULL = the name alone. */
    void (*describe)(const void *args, char *buf, size_t cap);
} akv_dev_op;

/* Launches `op` on the compute queue with a copy of `args` (args_bytes must equal
 * op->args_bytes). AKV_EUNSUPPORTED, naming the op, when the backend has no implementation. */
akv_status akv_dev_op_launch(akv_dev *dev, const akv_dev_op *op, const void *args,
                             size_t args_bytes);
/* Whether the device's backend implements `op` (1) or not (0). */
int akv_dev_op_supported(const akv_dev *dev, const akv_dev_op *op);

/* Built-in op "busy": keeps the compute queue (and on CUDA the SMs) busy with a fixed amount
 * of arithmetic: benchmarks measure copies under compute, tests prove ordering with it. On
 * CUDA it lets a kernel launched after it as a programmatic dependent start at once (such a
 * kernel waits for it before it consumes anything, akv/attn.h). */
typedef struct akv_dev_busy_args {
    uint32_t n_blocks;  /* CUDA: thread blocks; 0 = enough to fill every SM */
    uint32_t n_threads; /* CUDA: threads per block; 0 = 512 */
    uint64_t n_iters;   /* dependent FMAs per thread (host: the loop runs n_iters / 64 times) */
    akv_dptr sink;      /* 8 bytes of device memory the result goes to (keeps the work alive) */
} akv_dev_busy_args;
extern const akv_dev_op akv_dev_op_busy;

/* ---- op profile: device time per op ------------------------------------------------------- */

/* While a profile runs, every op launch (and graph launch) is bracketed by two timing events
 * on the compute queue, so its device time can be read back: the time between the events
 * around a launch is the op's (a programmatic launch loses its overlap with the op before
 * it); the time between one launch's end and the next one's start is what the queue did
 * that was not an op (copies and waits submitted to it) or idled waiting for the host. For
 * finding where time goes, not for production: each launch costs two event records. */
typedef struct akv_dev_profile_row {
    char key[64];      /* the op's name, then its description where the op has one */
    uint64_t launches; /* timed launches with this key */
    uint64_t ns;       /* their device time, summed */
} akv_dev_profile_row;

typedef struct akv_dev_profile_summary {
    uint64_t launches; /* timed launches */
    uint64_t untimed;  /* launches after max_launches were reached (not in the rows) */
    uint64_t span_ns;  /* from the first timed launch's start to the last one's end */
    uint64_t ops_ns;   /* the timed launches' device time, summed (rows' ns summed) */
    size_t n_keys;     /* distinct keys; rows beyond the caller's capacity are not returned */
} akv_dev_profile_summary;

/* Starts a profile of up to max_launches launches (>= 1). AKV_ESTATE when one is running. */
akv_status akv_dev_profile_start(akv_dev *dev, size_t max_launches);
/* Ends the profile: waits for the compute queue, then fills up to cap rows (descending time)
 * and the summary. The profile ends even when the wait fails (the status is returned).
 * AKV_ESTATE when none is running. */
akv_status akv_dev_profile_stop(akv_dev *dev, akv_dev_profile_row *rows, size_t cap,
                                akv_dev_profile_summary *sum);

/* ---- graphs: a fixed sequence of ops submitted with one call --------------------------------- */

/* One launch of a graph: the op and its argument struct (op->args_bytes of them). */
typedef struct akv_dev_launch {
    const akv_dev_op *op;
    const void *args;
} akv_dev_launch;

typedef struct akv_graph akv_graph; /* owned by its device; see akv_dev_graph_create */

/* Builds a graph of n >= 1 launches: launching it on the compute queue does exactly what
 * launching the ops one by one in this order would, with these arguments (copied now; nothing
 * runs at build time). On CUDA it is a captured, instantiated CUDA graph (one submission for
 * the whole sequence, no launch gaps between the kernels); on the host backend the launches
 * are queued again at each launch. AKV_EINVAL for a NULL op or arguments; AKV_EUNSUPPORTED,
 * naming the op, when the backend lacks one; AKV_EDEVICE when the capture fails. */
akv_status akv_dev_graph_create(akv_dev *dev, const akv_dev_launch *launches, size_t n,
                                akv_graph **out);
/* Submits g's launches to the compute queue, in order. A submission point of kind
 * AKV_FAULT_OP (and an exec point AKV_FAULT_OP_EXEC on the host backend), like one op. */
akv_status akv_dev_graph_launch(akv_dev *dev, akv_graph *g);
/* Destroys g; NULL is a no-op. Never waits: launches in flight complete on their own. */
akv_status akv_dev_graph_destroy(akv_dev *dev, akv_graph *g);

#ifdef __cplusplus
}
#endif
#endif /* AKV_DEV_H */
