/*
 * akv/dev_cuda.h — the CUDA backend of akv/dev.h.
 *
 * Present only in builds with the CUDA backend: the akv_cuda library defines AKV_HAVE_CUDA
 * for everything that links it. No CUDA type appears here; callers need no CUDA headers.
 */
#ifndef AKV_DEV_CUDA_H
#define AKV_DEV_CUDA_H

#include "akv/dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend. akv_dev_create() on it returns AKV_EDEVICE (logged with the CUDA
 * message) when no usable device is present, e.g. on a machine without a GPU. */
const akv_dev_backend *akv_dev_cuda_backend(void);

#ifdef __cplusplus
}
#endif
#endif
