/*
 * dev_cuda.c — the CUDA backend of dev.h: device memory (cudaMalloc), pinned host memory
 * (cudaHostAlloc, portable and mapped), device properties, three non-blocking streams (the
 * queues; the copy streams at the highest priority so the copy kernel's blocks are scheduled
 * ahead of compute blocks), events, async copies by the configured method, and ops by name.
 * Every call is checked; errors become AKV_EDEVICE with the call and the CUDA message logged
 * once.
 *
 * Copy methods (docs/staging.md has the measurements that chose the default):
 *   EACH      cudaMemcpyAsync per span;
 *   COALESCE  the front merged adjacent spans; then cudaMemcpyAsync per span;
 *   BATCH     one cudaMemcpyBatchAsync per chunk of spans (CUDA 12.8+);
 *   KERNEL    copy_kernels.cu reads/writes the mapped pinned memory from the SMs.
 */
#include "dev/dev_impl.h"
#include "akv/dev_cuda.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "cuda_check.h"
#include "cuda_ops.h"

/* Measured choice of the default copy method: see docs/staging.md. cudaMemcpyBatchAsync came
 * with CUDA 12.8; before it, merged spans go one cudaMemcpyAsync each. */
#if CUDART_VERSION >= 12080
#define CUDA_DEFAULT_COPY_METHOD AKV_COPY_METHOD_BATCH
#else
#define CUDA_DEFAULT_COPY_METHOD AKV_COPY_METHOD_COALESCE
#endif
/* Copy kernel blocks when the configuration says 0. */
#define CUDA_DEFAULT_KERNEL_BLOCKS 16

typedef struct cuda_state {
    int ordinal;
    struct cudaDeviceProp prop;
    cudaStream_t streams[AKV_N_QUEUES];
    void *blas; /* cuBLAS handle, created by the first op that needs one; NULL until then */
} cuda_state;

static void cuda_destroy_streams(cuda_state *s) {
    /* cudaStreamDestroy returns at once; pending work completes and then frees the stream. */
    for (int i = 0; i < AKV_N_QUEUES; i++)
        if (s->streams[i]) (void)AKV_CUDA_STATUS(cudaStreamDestroy(s->streams[i]));
}

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
    int prio_low = 0, prio_high = 0;
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
    for (int i = 0; i < AKV_N_QUEUES && st == AKV_OK; i++)
        st = AKV_CUDA_STATUS(cudaStreamCreateWithPriority(
            &s->streams[i], cudaStreamNonBlocking, i == AKV_QUEUE_COMPUTE ? prio_low : prio_high));
    if (st != AKV_OK) {
        cuda_destroy_streams(s);
        akv__free(s);
        return st;
    }
    *state = s;
    return AKV_OK;
}

static void cuda_close(void *state) {
    cuda_state *s = state;
    if (s->blas) akv__cuda_blas_destroy(s->blas);
    cuda_destroy_streams(state);
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
    out->cc_major = s->prop.major;
    out->cc_minor = s->prop.minor;
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
    /* Mapped: the copy kernel reads it from the SMs (with unified addressing the host pointer
     * is also the device pointer). */
    cudaError_t e = cudaHostAlloc(&q, n_bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        AKV_LOG_E("cuda: cudaHostAlloc(%zu bytes) failed: %s", n_bytes, cudaGetErrorString(e));
        return AKV_ENOMEM;
    }
    *p = q;
    return AKV_OK;
}

static akv_status cuda_pinned_dptr(void *state, const void *p, uint64_t *addr) {
    cuda_state *s = state;
    void *d = NULL;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaHostGetDevicePointer(&d, (void *)(uintptr_t)p, 0)); /* allocated mapped */
    *addr = (uint64_t)(uintptr_t)d;
    return AKV_OK;
}

static akv_status cuda_pinned_free(void *state, void *p) {
    (void)state;
    return AKV_CUDA_STATUS(cudaFreeHost(p));
}

static const enum cudaMemcpyKind cuda_kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                 cudaMemcpyDeviceToDevice};

static akv_status cuda_copy_sync(void *state, akv_dev_copy_kind kind, uint64_t dst, uint64_t src,
                                 size_t n_bytes) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaMemcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n_bytes,
                            cuda_kinds[kind]));
    /* dev.h: the bytes have arrived on return; a device-to-device cudaMemcpy may return
     * before (it only orders the legacy stream), and so may one from pageable host memory
     * (it returns once the bytes are staged for the DMA). Device to host returns complete. */
    if (kind != AKV_COPY_D2H) AKV_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    return AKV_OK;
}

static akv_status cuda_memset_sync(void *state, uint64_t dst, int byte, size_t n_bytes) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaMemset((void *)(uintptr_t)dst, byte, n_bytes));
    /* cudaMemset of device memory may return before the bytes are set; dev.h promises they are
     * (the queues are non-blocking streams: nothing else would order them after it). */
    AKV_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    return AKV_OK;
}

/* ---- events and queues ---------------------------------------------------------------- */

static akv_status cuda_event_create(void *state, unsigned flags, void **ev) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    cudaEvent_t e = NULL;
    AKV_CUDA_TRY(cudaEventCreateWithFlags(
        &e, (flags & AKV_EVENT_TIMING) ? cudaEventDefault : cudaEventDisableTiming));
    *ev = e;
    return AKV_OK;
}

static void cuda_event_destroy(void *state, void *ev) {
    (void)state;
    /* Returns at once even while a record is pending (the runtime frees it afterwards). */
    (void)AKV_CUDA_STATUS(cudaEventDestroy((cudaEvent_t)ev));
}

static akv_status cuda_event_record(void *state, void *ev, akv_queue q) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, s->streams[q]));
    return AKV_OK;
}

static akv_status cuda_queue_wait(void *state, akv_queue q, void *ev) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaStreamWaitEvent(s->streams[q], (cudaEvent_t)ev, 0));
    return AKV_OK;
}

static akv_status cuda_event_query(void *state, void *ev, int *done) {
    (void)state;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) {
        *done = 0;
        return AKV_OK;
    }
    AKV_CUDA_TRY(e);
    *done = 1;
    return AKV_OK;
}

static akv_status cuda_event_sync(void *state, void *ev) {
    (void)state;
    AKV_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
    return AKV_OK;
}

static akv_status cuda_event_elapsed_ns(void *state, void *a, void *b, uint64_t *ns) {
    (void)state;
    float ms = 0;
    cudaError_t e = cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return AKV_ESTATE;
    }
    AKV_CUDA_TRY(e);
    *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
    return AKV_OK;
}

static akv_status cuda_queue_sync(void *state, akv_queue q) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaStreamSynchronize(s->streams[q]));
    return AKV_OK;
}

static akv_status cuda_dev_sync(void *state) {
    cuda_state *s = state;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaDeviceSynchronize());
    return AKV_OK;
}

/* ---- async copies ------------------------------------------------------------------------ */

static akv_status cuda_copy_async(void *state, akv_queue q, const akv_dev_copy2d *c,
                                  unsigned flags) {
    cuda_state *s = state;
    (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    void *dst = (void *)(uintptr_t)c->dst;
    const void *src = (const void *)(uintptr_t)c->src;
    if (c->n_rows == 1)
        AKV_CUDA_TRY(cudaMemcpyAsync(dst, src, c->width_bytes, cuda_kinds[c->kind], s->streams[q]));
    else
        AKV_CUDA_TRY(cudaMemcpy2DAsync(dst, c->dst_pitch, src, c->src_pitch, c->width_bytes,
                                       c->n_rows, cuda_kinds[c->kind], s->streams[q]));
    return AKV_OK;
}

/* Spans per cudaMemcpyBatchAsync call (arrays on the stack). */
#define CUDA_BATCH_CHUNK 128

static akv_status cuda_copy_batch_api(cuda_state *s, akv_queue q, akv_dev_copy_kind kind,
                                      const akv_dev_xfer *x, size_t n, unsigned cfg_flags) {
#if CUDART_VERSION >= 12080
    void *dsts[CUDA_BATCH_CHUNK];
    void *srcs[CUDA_BATCH_CHUNK];
    size_t sizes[CUDA_BATCH_CHUNK];
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = (cfg_flags & AKV_COPY_PREFER_OVERLAP) ? cudaMemcpyFlagPreferOverlapWithCompute
                                                       : cudaMemcpyFlagDefault;
    size_t attr_idx = 0;
    for (size_t i = 0; i < n; i += CUDA_BATCH_CHUNK) {
        size_t m = n - i < CUDA_BATCH_CHUNK ? n - i : CUDA_BATCH_CHUNK;
        for (size_t k = 0; k < m; k++) {
            void *d = (void *)(uintptr_t)x[i + k].d.addr;
            dsts[k] = kind == AKV_COPY_H2D ? d : x[i + k].h;
            srcs[k] = kind == AKV_COPY_H2D ? x[i + k].h : d;
            sizes[k] = x[i + k].n_bytes;
        }
#if CUDART_VERSION >= 13000
        AKV_CUDA_TRY(cudaMemcpyBatchAsync(dsts, (const void *const *)srcs, sizes, m, &attr,
                                          &attr_idx, 1, s->streams[q]));
#else
        size_t fail_idx = 0;
        AKV_CUDA_TRY(cudaMemcpyBatchAsync(dsts, srcs, sizes, m, &attr, &attr_idx, 1, &fail_idx,
                                          s->streams[q]));
#endif
    }
    return AKV_OK;
#else
    (void)s, (void)q, (void)kind, (void)x, (void)n, (void)cfg_flags;
    AKV_LOG_E("cuda: cudaMemcpyBatchAsync needs CUDA 12.8 or newer (built with %d)", CUDART_VERSION);
    return AKV_EUNSUPPORTED;
#endif
}

static akv_status cuda_copy_batch_async(void *state, akv_queue q, akv_dev_copy_kind kind,
                                        const akv_dev_xfer *x, size_t n,
                                        const akv_copy_config *cfg, unsigned flags) {
    cuda_state *s = state;
    (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    switch (cfg->method) {
    case AKV_COPY_METHOD_BATCH:
        return cuda_copy_batch_api(s, q, kind, x, n, cfg->flags);
    case AKV_COPY_METHOD_KERNEL:
        AKV_CUDA_TRY(akv__cuda_copy_kernel(x, n, kind == AKV_COPY_H2D,
                                           cfg->kernel_blocks ? cfg->kernel_blocks
                                                              : CUDA_DEFAULT_KERNEL_BLOCKS,
                                           s->streams[q]));
        return AKV_OK;
    default: /* EACH, COALESCE (the front coalesced) */
        for (size_t i = 0; i < n; i++) {
            void *d = (void *)(uintptr_t)x[i].d.addr;
            if (kind == AKV_COPY_H2D)
                AKV_CUDA_TRY(cudaMemcpyAsync(d, x[i].h, x[i].n_bytes, cudaMemcpyHostToDevice,
                                             s->streams[q]));
            else
                AKV_CUDA_TRY(cudaMemcpyAsync(x[i].h, d, x[i].n_bytes, cudaMemcpyDeviceToHost,
                                             s->streams[q]));
        }
        return AKV_OK;
    }
}

static akv_status cuda_memset_async(void *state, akv_queue q, uint64_t dst, int byte,
                                    size_t n_bytes, unsigned flags) {
    cuda_state *s = state;
    (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaMemsetAsync((void *)(uintptr_t)dst, byte, n_bytes, s->streams[q]));
    return AKV_OK;
}

static akv_status cuda_host_fn_async(void *state, akv_queue q, akv_dev_host_fn fn, void *arg,
                                     unsigned flags) {
    cuda_state *s = state;
    (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaLaunchHostFunc(s->streams[q], fn, arg));
    return AKV_OK;
}

static akv_status cuda_copy_method_check(void *state, akv_copy_method m) {
    cuda_state *s = state;
    if (m == AKV_COPY_METHOD_BATCH && CUDART_VERSION < 12080) return AKV_EUNSUPPORTED;
    if (m == AKV_COPY_METHOD_KERNEL && !s->prop.unifiedAddressing) return AKV_EUNSUPPORTED;
    return AKV_OK;
}

/* ---- ops ------------------------------------------------------------------------------------ */

static int cuda_op_supported(void *state, const akv_dev_op *op) {
    (void)state;
    return akv__cuda_op_find(op->name, NULL) != NULL;
}

/* The launcher of op, the cuBLAS handle created if it is the first op to need one, and what
 * the launcher gets (stream, handle, SM count). The current device must be s's. */
static akv_status cuda_launcher(cuda_state *s, const akv_dev_op *op, cudaStream_t stream,
                                akv_cuda_op_fn *fn, akv__cuda_launch *l) {
    int needs_blas = 0;
    if (!(*fn = akv__cuda_op_find(op->name, &needs_blas))) return AKV_EUNSUPPORTED;
    if (needs_blas && !s->blas) {
        akv_status st = akv__cuda_blas_create(&s->blas);
        if (st) return st;
    }
    *l = (akv__cuda_launch){.stream = stream, .blas = s->blas, .n_sm = s->prop.multiProcessorCount};
    return AKV_OK;
}

static akv_status cuda_op_launch(void *state, akv_dev *dev, const akv_dev_op *op,
                                 const void *args, unsigned flags) {
    cuda_state *s = state;
    (void)dev, (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    akv_cuda_op_fn fn;
    akv__cuda_launch l;
    akv_status st = cuda_launcher(s, op, s->streams[AKV_QUEUE_COMPUTE], &fn, &l);
    return st ? st : fn(args, &l);
}

/* ---- graphs ------------------------------------------------------------------------------------- */

/* Captures the launchers on a private stream (relaxed mode: launchers may set kernel
 * attributes while capturing) and instantiates the graph. The cuBLAS handle follows the
 * capture stream during the capture; every launcher that uses it sets its stream again. */
static akv_status cuda_graph_create(void *state, akv_dev *dev, const akv_dev_launch *l, size_t n,
                                    void **out) {
    cuda_state *s = state;
    (void)dev;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    cudaStream_t cs;
    AKV_CUDA_TRY(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    akv_status st = AKV_CUDA_STATUS(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    for (size_t i = 0; i < n && st == AKV_OK; i++) {
        akv_cuda_op_fn fn;
        akv__cuda_launch cl;
        if ((st = cuda_launcher(s, l[i].op, cs, &fn, &cl)) == AKV_OK) st = fn(l[i].args, &cl);
    }
    cudaGraph_t graph = NULL;
    akv_status end = AKV_CUDA_STATUS(cudaStreamEndCapture(cs, &graph)); /* ends it either way */
    if (st == AKV_OK) st = end;
    cudaGraphExec_t exec = NULL;
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (graph) (void)AKV_CUDA_STATUS(cudaGraphDestroy(graph));
    (void)AKV_CUDA_STATUS(cudaStreamDestroy(cs));
    if (st != AKV_OK) return st;
    *out = exec;
    return AKV_OK;
}

static akv_status cuda_graph_launch(void *state, void *g, unsigned flags) {
    cuda_state *s = state;
    (void)flags;
    AKV_CUDA_TRY(cudaSetDevice(s->ordinal));
    AKV_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g, s->streams[AKV_QUEUE_COMPUTE]));
    return AKV_OK;
}

/* An executable graph destroyed while a launch is in flight is freed when it completes. */
static void cuda_graph_destroy(void *state, void *g) {
    (void)state;
    (void)AKV_CUDA_STATUS(cudaGraphExecDestroy((cudaGraphExec_t)g));
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
    .pinned_dptr = cuda_pinned_dptr,
    .copy_sync = cuda_copy_sync,
    .memset_sync = cuda_memset_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .queue_wait = cuda_queue_wait,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_elapsed_ns = cuda_event_elapsed_ns,
    .queue_sync = cuda_queue_sync,
    .dev_sync = cuda_dev_sync,
    .copy_async = cuda_copy_async,
    .copy_batch_async = cuda_copy_batch_async,
    .host_fn_async = cuda_host_fn_async,
    .memset_async = cuda_memset_async,
    .default_copy_method = CUDA_DEFAULT_COPY_METHOD,
    .copy_method_check = cuda_copy_method_check,
    .op_launch = cuda_op_launch,
    .op_supported = cuda_op_supported,
    .graph_create = cuda_graph_create,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .inject_delays = NULL,
    .clear_faults = NULL,
};

const akv_dev_backend *akv_dev_cuda_backend(void) {
    return &cuda_backend;
}
