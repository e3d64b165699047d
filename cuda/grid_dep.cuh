/*
 * cuda/grid_dep.cuh — programmatic dependent launch (sm_90+), shared by the attention and
 * forward kernels.
 *
 * A kernel launched as a programmatic dependent (grid_dep_config) may be scheduled while the
 * kernel before it on the stream is still running: once every block of that kernel has called
 * grid_dep_launch, or exited. grid_dep_wait then blocks until that kernel has completed and
 * its writes are visible; before it, a kernel may only read what no kernel since the stream's
 * last copy, memset or event wait writes (its weights, say). On older devices, or when
 * launched plainly, the wait returns at once and the launch does nothing.
 */
#ifndef AKV_CUDA_GRID_DEP_CUH
#define AKV_CUDA_GRID_DEP_CUH

#include <cuda_runtime.h>

#include "core/env.h"

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

/* Whether launches are programmatic dependents: on unless AKV_ATTN_PDL=0 (an A/B switch for
 * benchmarks; it covers the forward kernels too), read once. */
static inline bool grid_dep_enabled() {
    static const int on = akv__env_int("AKV_ATTN_PDL", 0, 1, 1);
    return on != 0;
}

/* Adds the programmatic-dependent attribute to cfg (when enabled), at attr[cfg->numAttrs]. */
static inline void grid_dep_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr) {
    if (!grid_dep_enabled()) return;
    cfg->attrs = attr;
    attr[cfg->numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[cfg->numAttrs++].val.programmaticStreamSerializationAllowed = 1;
}

#endif
