/* tests/gpu/gpu_skip.h — how a gpu test starts: the CUDA backend, once a device answers on it,
 * or a skip (exit 77) saying which is missing: the backend in this build, or the device. */
#ifndef AKV_TESTS_GPU_SKIP_H
#define AKV_TESTS_GPU_SKIP_H

#include "test.h"

#include "akv/dev.h"
#ifdef AKV_HAVE_CUDA
#include "akv/dev_cuda.h"
#endif

static inline const akv_dev_backend *test_cuda_backend_or_skip(void) {
#ifndef AKV_HAVE_CUDA
    test_skip("built without the CUDA backend");
    return NULL;
#else
    akv_dev *dev = NULL;
    if (akv_dev_create(akv_dev_cuda_backend(), NULL, &dev) != AKV_OK)
        test_skip("no CUDA device answers on this machine");
    akv_dev_destroy(dev);
    return akv_dev_cuda_backend();
#endif
}

#endif
