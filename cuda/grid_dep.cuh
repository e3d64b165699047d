/*
 * cuda/grid_dep.cuh — programmatic dependent launch (sm_90+), shared by the attention and
 * forward kernels.
 *
 * A kernel launched as a programmatic dependent (grid_dep_config, grid_dep_launch_kernel) may be scheduled while the
 * kernel before it on the stream is still running: once every block of that kernel has called
 * grid_dep_launch, or exited. grid_dep_wait then blocks until that kernel has completed and
 * its writes are visible; before it, a kernel may only read what no kernel since the stream's
 * last copy, memset or event wait writes (its weights, say). On older devices, or when
 * launched plainly, the wait returns at once and the launch does nothing.
 */
#ifndef AKV_CUDA_GRID_DEP_CUH
#define AKV_CUDA_GRID_DEP_CUH

#include <cuda_runtime.h>

#include "cuda_check.h"

static __device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* The configuration of kernel<<<grid, block, smem, stream>>> as a programmatic dependent (its
 * attribute at attr[0], cfg.numAttrs 1); a caller may add attributes after it. Every kernel
 * of the project launches so (measured: 0.3 us less per attention call at 1K-8K, nothing lost
 * elsewhere; docs/attention.md); an A/B against plain launches is an A/B of builds. */
static inline cudaLaunchConfig_t grid_dep_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                                 cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 1;
    return cfg;
}

/* Launches kernel<<<grid, block, smem, stream>>>(args...) as grid_dep_config describes. */
template <typename... P, typename... A>
static akv_status grid_dep_launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t stream, A... args) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = grid_dep_config(grid, block, smem, stream, attr);
    AKV_CUDA_LAUNCH_TRY(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
    return AKV_OK;
}

#endif
