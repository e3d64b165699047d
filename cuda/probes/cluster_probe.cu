/*
 * cuda/probes/cluster_probe.cu — thread-block cluster facts of the current device, behind
 * the decode's cluster merge (docs/attention.md, "The cluster merge"): how many clusters of
 * each size fit at once for the decode's block shapes (cudaOccupancyMaxActiveClusters), and
 * what two cluster barriers and a distributed-shared-memory read cost per kernel against the
 * same kernel without a cluster (graph replays of 100 launches; a same-run baseline).
 * Not built by CMake; on the GPU machine:
 *   nvcc -arch=sm_90 -O2 -std=c++17 -o /tmp/cluster_probe cuda/probes/cluster_probe.cu && /tmp/cluster_probe
 */
#include <cstdio>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
template <bool CL>
__global__ void k(float *o) {
  extern __shared__ float s[];
  s[threadIdx.x] = blockIdx.x;
  if constexpr (CL) {
    cg::cluster_group c = cg::this_cluster();
    c.sync();
    float *peer = c.map_shared_rank(s, (c.block_rank() + 1) % c.num_blocks());
    float v = peer[threadIdx.x];
    c.sync();
    o[blockIdx.x * blockDim.x + threadIdx.x] = v;
  } else {
    __syncthreads();
    o[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
  }
}
template <bool CL>
static float timeit(int blocks, int c, float *o) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = 200 * 1024;
  cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = c; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
  cfg.attrs = &a; cfg.numAttrs = CL ? 1 : 0;
  cudaStream_t st; cudaStreamCreate(&st); cfg.stream = st;
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 100; i++) cudaLaunchKernelEx(&cfg, k<CL>, o);
  cudaStreamEndCapture(st, &g); cudaGraphInstantiate(&ge, g, 0);
  cudaGraphLaunch(ge, st); cudaStreamSynchronize(st);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0, st);
  for (int r = 0; r < 10; r++) cudaGraphLaunch(ge, st);
  cudaEventRecord(e1, st); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000 / 1000; /* µs per kernel: 10 replays of 100 launches */
}

__global__ void plain(float *o) {
  extern __shared__ float s[];
  s[threadIdx.x] = 1;
  o[threadIdx.x] = s[threadIdx.x ^ 1];
}

// 128-thread blocks of the batch variant's shared memory (72 KiB at d=128, 52 at d=64, 104 for
// a 3-tile ring)
static void occupancy_128() {
  for (int kb : {72, 52, 104}) {
    cudaFuncSetAttribute(plain, cudaFuncAttributeMaxDynamicSharedMemorySize, kb * 1024);
    for (int c = 2; c <= 8; c++) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(c); cfg.blockDim = dim3(128); cfg.dynamicSmemBytes = kb * 1024;
      cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = c; a.val.clusterDim.y = a.val.clusterDim.z = 1;
      cfg.attrs = &a; cfg.numAttrs = 1;
      int n = -1;
      cudaOccupancyMaxActiveClusters(&n, plain, &cfg);
      printf("%d KiB x 128 threads, cluster %d: %d clusters (%d blocks)\n", kb, c, n, n * c);
    }
  }
}

int main() {
  cudaFuncSetAttribute(k<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(k<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(k<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  float *o; cudaMalloc(&o, 1 << 24);
  int cs[] = {4, 8, 14, 16};
  for (int blocks : {64, 112, 128}) for (int c : cs) {
    if (blocks % c) continue;
    float t0 = timeit<false>(blocks, c, o), t1 = timeit<true>(blocks, c, o);
    printf("blocks %d cluster %d: plain %.2f us, cluster %.2f us per kernel (%s)\n", blocks, c, t0, t1,
           cudaGetErrorString(cudaGetLastError()));
  }
  // 256-thread blocks of 200 KiB (the lone-sequence variant at d=128: one per SM)
  for (int c : {2, 4, 6, 7, 8, 10, 12, 14, 16}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c * 8); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = 200 * 1024;
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = c; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
    cfg.attrs = &a; cfg.numAttrs = 1;
    int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k<true>, &cfg);
    printf("cluster %d: max active %d (%d blocks) %s\n", c, n, n * c, cudaGetErrorString(e));
  }
  occupancy_128();
  return 0;
}
