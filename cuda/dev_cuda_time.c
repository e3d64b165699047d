/*
 * dev_cuda_time.c — timing of device work for the benchmarks (akv/dev_cuda.h): the work is
 * captured into a CUDA graph, so launch gaps and host overhead stay out of the figure, and
 * each graph replay is timed with events; the median replay counts.
 */
#include "akv/dev_cuda.h"

#include <stdlib.h>

#include "core/alloc.h"
#include "core/log.h"
#include "cuda_check.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

akv_status akv_dev_cuda_time_us(akv_dev_cuda_issue_fn issue, void *arg, int n_calls, int n_reps,
                                double *us_out) {
    if (!issue || !us_out || n_calls < 1 || n_reps < 1) {
        AKV_LOG_E("cuda time: bad arguments (n_calls %d, n_reps %d)", n_calls, n_reps);
        return AKV_EINVAL;
    }
    cudaStream_t stream = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    float *ms = akv__calloc((size_t)n_reps, sizeof *ms);
    akv_status st = ms ? AKV_OK : AKV_ENOMEM;
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaEventCreate(&ev[0]));
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaEventCreate(&ev[1]));
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    if (st == AKV_OK) {
        for (int i = 0; i < n_calls && st == AKV_OK; i++) st = issue(arg, stream);
        /* end the capture whatever happened, so the stream is usable again */
        akv_status end = AKV_CUDA_STATUS(cudaStreamEndCapture(stream, &graph));
        if (st == AKV_OK) st = end;
    }
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaGraphLaunch(exec, stream)); /* warm-up */
    for (int r = 0; r < n_reps && st == AKV_OK; r++) {
        st = AKV_CUDA_STATUS(cudaEventRecord(ev[0], stream));
        if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaGraphLaunch(exec, stream));
        if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaEventRecord(ev[1], stream));
        if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaEventSynchronize(ev[1]));
        if (st == AKV_OK) st = AKV_CUDA_STATUS(cudaEventElapsedTime(&ms[r], ev[0], ev[1]));
    }
    if (st == AKV_OK) {
        qsort(ms, (size_t)n_reps, sizeof *ms, cmp_float);
        *us_out = 1000.0 * ms[n_reps / 2] / n_calls;
    }
    if (stream) (void)AKV_CUDA_STATUS(cudaStreamSynchronize(stream));
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    if (ev[0]) (void)cudaEventDestroy(ev[0]);
    if (ev[1]) (void)cudaEventDestroy(ev[1]);
    if (stream) (void)cudaStreamDestroy(stream);
    akv__free(ms);
    return st;
}
