/*
 * cuda/probes/hostfn_probe.cu — does a host function on one queue wait for a large host->device
 * copy on another? Behind the host-attended route's serialisation (docs/journal.md, sixth and
 * eighth sessions): the trace showed each layer's host part ending its own length after the
 * next layer's refill crossed the bus, whichever queue the host function was on.
 *
 * A pipeline of 32 "layers" like the route's: the copy queue refills slot l % 2 (256 MiB from
 * pinned memory, after layer l-2's compute freed it); the compute queue waits for layer l's
 * refill, runs a small kernel, then the host part (a 4 ms busy host section), then a small
 * kernel. The host part is delivered three ways:
 *   hostfn — cudaLaunchHostFunc on the compute queue (what the route does);
 *   flag   — a kernel writes a flag to mapped pinned memory; a host thread spinning on it runs
 *            the section and writes a second flag; a kernel on the compute queue spins on that;
 *   none   — no host section (the copies alone: the bus's floor for the pipeline).
 * Ideal: a layer costs max(copy, host section) ~ 4.8 ms; serialised: their sum ~ 9 ms.
 * Not built by CMake; on the GPU machine:
 *   nvcc -arch=sm_90 -O2 -std=c++17 -o /tmp/hostfn_probe cuda/probes/hostfn_probe.cu -lpthread && /tmp/hostfn_probe
 */
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static void busy(double ms) { double t = now_ms(); while (now_ms() - t < ms) {} }

static const double HOST_MS = 4.0;
static const int LAYERS = 32;
static const size_t SLOT = 256ull << 20;

__global__ void k_small(float *o) { o[threadIdx.x] += 1.0f; }
// the query rows to mapped pinned memory by the SMs (16 KiB: 32 heads x 128 floats)
__global__ void k_write(float *hq, const float *o) {
  for (int i = threadIdx.x; i < 4096; i += blockDim.x) hq[i] = o[i & 1023];
}
// the merge reading the host's states in place
__global__ void k_read(float *o, const volatile float *hs) {
  float a = 0;
  for (int i = threadIdx.x; i < 4096; i += blockDim.x) a += hs[i];
  o[threadIdx.x] += a;
}
__global__ void k_set(volatile unsigned *flag, unsigned v) {
  __threadfence_system();
  *flag = v;
}
__global__ void k_wait(volatile unsigned *flag, unsigned v) {
  while (*flag != v) __nanosleep(500);
}
static void CUDART_CB host_part(void *) { busy(HOST_MS); }

// The host section as memory traffic: READERS threads each summing their share of a pinned
// buffer (the host part's bytes), started by the caller and joined.
static const int READERS = 15;
static const float *rbuf;
static size_t rbytes;
static volatile double rsink;
static void read_part(int t) {
  const size_t n = rbytes / sizeof(float) / READERS;
  const float *p = rbuf + t * n;
  float a = 0;
  for (size_t i = 0; i < n; i += 16) a += p[i];
  rsink = a;
}
static void mem_section() {
  std::thread th[READERS];
  for (int t = 0; t < READERS; t++) th[t] = std::thread(read_part, t);
  for (int t = 0; t < READERS; t++) th[t].join();
}
static void CUDART_CB host_part_mem(void *) { mem_section(); }

struct Flags { volatile unsigned *ready, *done; unsigned *ready_d, *done_d; };

int main() {
  cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
  printf("hostfn_probe on %s; %d layers, %zu MiB a refill, %.1f ms host section\n", p.name, LAYERS,
         SLOT >> 20, HOST_MS);
  char *h; CK(cudaHostAlloc(&h, SLOT, cudaHostAllocDefault));
  for (size_t i = 0; i < SLOT; i += 4096) h[i] = (char)i;
  char *d[2]; CK(cudaMalloc(&d[0], SLOT)); CK(cudaMalloc(&d[1], SLOT));
  float *o; CK(cudaMalloc(&o, 1024 * sizeof(float)));
  Flags f;
  unsigned *fl; CK(cudaHostAlloc(&fl, 2 * LAYERS * sizeof(unsigned), cudaHostAllocMapped));
  for (int i = 0; i < 2 * LAYERS; i++) fl[i] = 0;
  unsigned *fld; CK(cudaHostGetDevicePointer(&fld, fl, 0));
  f.ready = fl; f.done = fl + LAYERS; f.ready_d = fld; f.done_d = fld + LAYERS;
  cudaStream_t cp, cs; CK(cudaStreamCreateWithFlags(&cp, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaEvent_t copied[LAYERS], computed[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    CK(cudaEventCreateWithFlags(&copied[l], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&computed[l], cudaEventDisableTiming));
  }
  // one copy alone, for the rate
  CK(cudaMemcpyAsync(d[0], h, SLOT, cudaMemcpyHostToDevice, cp)); CK(cudaStreamSynchronize(cp));
  double t0 = now_ms();
  for (int i = 0; i < 8; i++) CK(cudaMemcpyAsync(d[i & 1], h, SLOT, cudaMemcpyHostToDevice, cp));
  CK(cudaStreamSynchronize(cp));
  double copy_ms = (now_ms() - t0) / 8;
  printf("one refill alone: %.3f ms (%.1f GB/s)\n", copy_ms, SLOT / copy_ms / 1e6);

  // the host part's bytes: 256 MiB read by 15 threads
  rbytes = SLOT;
  { float *rb; CK(cudaHostAlloc(&rb, rbytes, cudaHostAllocDefault)); memset(rb, 0, rbytes); rbuf = rb; }
  { double t = now_ms(); mem_section(); mem_section(); printf("the memory section alone: %.3f ms\n", (now_ms() - t) / 2); }
  float *hq; CK(cudaHostAlloc(&hq, 4096 * sizeof(float), cudaHostAllocMapped));
  float *hq_d; CK(cudaHostGetDevicePointer(&hq_d, hq, 0));
  float *dq; CK(cudaMalloc(&dq, 4096 * sizeof(float)));
  enum { COPIES = 1, HOSTFN = 2, FLAG = 4, MAPW = 8, MAPR = 16, CED2H = 32, MEM = 64 };
  struct { const char *name; int bits; } modes[] = {
    {"copies alone", COPIES},
    {"hostfn", COPIES | HOSTFN},
    {"hostfn no-copy", HOSTFN},
    {"hostfn+mapw", COPIES | HOSTFN | MAPW},
    {"hostfn+mapw+r", COPIES | HOSTFN | MAPW | MAPR},
    {"hostfn+ced2h", COPIES | HOSTFN | CED2H},
    {"hostfn mem", COPIES | HOSTFN | MEM},
    {"hostfn mem nocp", HOSTFN | MEM},
    {"hostfn mem+mapw+r", COPIES | HOSTFN | MEM | MAPW | MAPR},
    {"flag", COPIES | FLAG},
    {"flag+mapw+r", COPIES | FLAG | MAPW | MAPR},
    {"flag mem+mapw+r", COPIES | FLAG | MEM | MAPW | MAPR},
  };
  const int NM = sizeof modes / sizeof modes[0];
  unsigned epoch = 0;
  for (int rep = 0; rep < 2; rep++)
    for (int m = 0; m < NM; m++) {
      const int b = modes[m].bits;
      epoch++;
      std::thread server;
      double host_start[LAYERS] = {0}, host_end[LAYERS] = {0};
      if (b & FLAG)
        server = std::thread([&, epoch, b] {
          for (int l = 0; l < LAYERS; l++) {
            while (f.ready[l] != epoch) {}
            host_start[l] = now_ms();
            if (b & MEM) mem_section(); else busy(HOST_MS);
            host_end[l] = now_ms();
            std::atomic_thread_fence(std::memory_order_seq_cst);
            f.done[l] = epoch;
          }
        });
      CK(cudaDeviceSynchronize());
      double s0 = now_ms();
      for (int l = 0; l < LAYERS; l++) {
        if (b & COPIES) {
          if (l >= 2) CK(cudaStreamWaitEvent(cp, computed[l - 2], 0));
          CK(cudaMemcpyAsync(d[l & 1], h, SLOT, cudaMemcpyHostToDevice, cp));
          CK(cudaEventRecord(copied[l], cp));
          CK(cudaStreamWaitEvent(cs, copied[l], 0));
        }
        k_small<<<1, 256, 0, cs>>>(o);
        if (b & MAPW) k_write<<<1, 256, 0, cs>>>(hq_d, o);
        if (b & CED2H) CK(cudaMemcpyAsync(hq, dq, 4096 * sizeof(float), cudaMemcpyDeviceToHost, cs));
        if (b & HOSTFN) CK(cudaLaunchHostFunc(cs, (b & MEM) ? host_part_mem : host_part, nullptr));
        if (b & FLAG) {
          k_set<<<1, 1, 0, cs>>>(f.ready_d + l, epoch);
          k_wait<<<1, 1, 0, cs>>>(f.done_d + l, epoch);
        }
        if (b & MAPR) k_read<<<1, 256, 0, cs>>>(o, hq_d);
        else k_small<<<1, 256, 0, cs>>>(o);
        CK(cudaEventRecord(computed[l], cs));
      }
      double issued = now_ms() - s0;
      CK(cudaDeviceSynchronize());
      double total = now_ms() - s0;
      if (b & FLAG) server.join();
      printf("%-18s rep %d: %7.2f ms = %.3f ms a layer (issued in %.2f ms)", modes[m].name, rep,
             total, total / LAYERS, issued);
      if (b & FLAG) {
        double gap = 0, len = 0;
        for (int l = 1; l < LAYERS; l++) gap += host_start[l] - host_end[l - 1];
        for (int l = 0; l < LAYERS; l++) len += host_end[l] - host_start[l];
        printf("; host section %.3f ms, its start after the previous end %.3f ms", len / LAYERS,
               gap / (LAYERS - 1));
      }
      printf("\n");
    }
  printf("ideal with copies: %.2f ms a layer (max of copy and host); serialised: %.2f\n",
         copy_ms > HOST_MS ? copy_ms : HOST_MS, copy_ms + HOST_MS);
  return 0;
}
