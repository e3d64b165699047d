/*
 * cuda/cuda_check.h — turn a CUDA error into AKV_EDEVICE once, here, with the call and the
 * CUDA message logged. Every runtime call and every launch in cuda/ goes through these.
 */
#ifndef AKV_CUDA_CHECK_H
#define AKV_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "akv/status.h"
#include "core/log.h"

/* Evaluates a cudaError_t expression; on error logs and returns AKV_EDEVICE from the
 * enclosing function. */
#define AKV_CUDA_TRY(expr)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            AKV_LOG_E("cuda: %s failed: %s (%s) at %s:%d", #expr, cudaGetErrorString(e_),         \
                      cudaGetErrorName(e_), __FILE__, __LINE__);                                   \
            return AKV_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

/* AKV_CUDA_TRY for a launch by cudaLaunchKernelEx: a failed launch also leaves the runtime's
 * last error set (a <<<>>> launch's cudaGetLastError would have read and cleared it), so it is
 * cleared here and not reported again by the next launcher's check. */
static inline cudaError_t akv__cuda_launched(cudaError_t e) {
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}
#define AKV_CUDA_LAUNCH_TRY(expr) AKV_CUDA_TRY(akv__cuda_launched(expr))

/* The same, for a value that must be logged but the caller continues (e.g. in a free path),
 * evaluating to the akv_status. */
static inline akv_status akv__cuda_status(cudaError_t e, const char *what, const char *file,
                                          int line) {
    if (e == cudaSuccess) return AKV_OK;
    AKV_LOG_E("cuda: %s failed: %s (%s) at %s:%d", what, cudaGetErrorString(e),
              cudaGetErrorName(e), file, line);
    return AKV_EDEVICE;
}
#define AKV_CUDA_STATUS(expr) akv__cuda_status((expr), #expr, __FILE__, __LINE__)

#endif
