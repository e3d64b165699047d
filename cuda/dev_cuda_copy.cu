/*
 * dev_cuda_copy.cu — a device-to-device copy by a kernel: the reference rate of the
 * benchmarks (akv/dev_cuda.h). 16-byte loads and stores, four independent loads in flight
 * per thread, a grid of 4 blocks of 512 threads per SM striding over the range.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "akv/dev_cuda.h"
#include "core/log.h"
#include "cuda_check.h"

__global__ void __launch_bounds__(512) dev_copy_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                                                       size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                    d = __ldcs(src + i + 3 * stride);
        __stcs(dst + i, a), __stcs(dst + i + stride, b), __stcs(dst + i + 2 * stride, c), __stcs(dst + i + 3 * stride, d);
    }
    for (; i < n; i += stride) __stcs(dst + i, __ldcs(src + i));
}

extern "C" akv_status akv_dev_cuda_copy_d2d_async(akv_dptr dst, akv_dptr src, size_t n_bytes, void *stream) {
    cudaStream_t cs = static_cast<cudaStream_t>(stream);
    if (n_bytes == 0) return AKV_OK;
    if ((dst.addr | src.addr | n_bytes) % 16 != 0)
        return AKV_CUDA_STATUS(cudaMemcpyAsync(reinterpret_cast<void *>(dst.addr), reinterpret_cast<const void *>(src.addr),
                                               n_bytes, cudaMemcpyDeviceToDevice, cs));
    int dev = 0, n_sm = 0;
    AKV_CUDA_TRY(cudaGetDevice(&dev));
    AKV_CUDA_TRY(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    dev_copy_kernel<<<4 * n_sm, 512, 0, cs>>>(reinterpret_cast<uint4 *>(dst.addr),
                                               reinterpret_cast<const uint4 *>(src.addr), n_bytes / 16);
    AKV_CUDA_TRY(cudaGetLastError());
    return AKV_OK;
}
