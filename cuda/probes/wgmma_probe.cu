/*
 * cuda/probes/wgmma_probe.cu — the warpgroup products of cuda/attn_wgmma.cuh, one tile each,
 * against a host product: S = A B^T with A [64][128] and B [128][128] K-major in their
 * swizzled panels (the prefill's S = Q K^T), and O = P V with P [64][128] in registers and
 * V [128][128] read MN-major (its O += P V). Prints the largest error of each; a wrong
 * descriptor or fragment layout shows as errors of the size of the values. Not built by
 * CMake; on the GPU machine:
 *   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -std=c++17 -I . \
 *     -o /tmp/wgmma_probe cuda/probes/wgmma_probe.cu && /tmp/wgmma_probe
 */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/attn_wgmma.cuh"

static __device__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* a [64][128], b [128][128], v [128][128] bf16 row-major; s, o [64][128] f32 */
__global__ void probe(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const __nv_bfloat16 *v,
                      float *s, float *o) {
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *base = sm + ((1024 - ((uintptr_t)__cvta_generic_to_shared(sm) & 1023)) & 1023);
    unsigned char *sa = base, *sb = base + 64 * 256, *sv = sb + 128 * 256;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < 64 * 16; i += 128)
        *reinterpret_cast<uint4 *>(sa + wg_swz(64, i >> 4, i & 15)) =
            reinterpret_cast<const uint4 *>(a)[i];
    for (int i = tid; i < 128 * 16; i += 128) {
        *reinterpret_cast<uint4 *>(sb + wg_swz(128, i >> 4, i & 15)) =
            reinterpret_cast<const uint4 *>(b)[i];
        *reinterpret_cast<uint4 *>(sv + wg_swz(128, i >> 4, i & 15)) =
            reinterpret_cast<const uint4 *>(v)[i];
    }
    wg_fence_smem();
    __syncthreads();
    const uint32_t ua = (uint32_t)__cvta_generic_to_shared(sa),
                   ub = (uint32_t)__cvta_generic_to_shared(sb),
                   uv = (uint32_t)__cvta_generic_to_shared(sv);
    float d[16][4];
    for (int n = 0; n < 16; n++)
        for (int e = 0; e < 4; e++)
            d[n][e] = 0.0f;
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ks++)
        wg_mma_ss(d, wg_desc(ua + (ks >> 2) * 64 * 128 + (ks & 3) * 32, 16, 1024),
                  wg_desc(ub + (ks >> 2) * 128 * 128 + (ks & 3) * 32, 16, 1024), ks > 0);
    wg_commit();
    wg_wait<0>();
    wg_pin(d);
    const int g = lane >> 2, c = lane & 3, r0 = warp * 16 + g;
    for (int n = 0; n < 16; n++)
        for (int e = 0; e < 4; e++)
            s[(r0 + (e >> 1) * 8) * 128 + n * 8 + 2 * c + (e & 1)] = d[n][e];
    /* P = A (as [64][128] probabilities stand-in) in A-fragment registers */
    uint32_t pa[8][4];
    for (int kk = 0; kk < 8; kk++) {
        auto at = [&](int r, int k) { return __bfloat162float(a[r * 128 + k]); };
        const int k0 = kk * 16 + 2 * c;
        pa[kk][0] = pack2(at(r0, k0), at(r0, k0 + 1));
        pa[kk][1] = pack2(at(r0 + 8, k0), at(r0 + 8, k0 + 1));
        pa[kk][2] = pack2(at(r0, k0 + 8), at(r0, k0 + 9));
        pa[kk][3] = pack2(at(r0 + 8, k0 + 8), at(r0 + 8, k0 + 9));
    }
    for (int n = 0; n < 16; n++)
        for (int e = 0; e < 4; e++)
            d[n][e] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wg_mma_rs_t(d, pa[kk], wg_desc(uv + kk * 16 * 128, 128 * 128, 1024));
    wg_commit();
    wg_wait<0>();
    wg_pin(d);
    for (int n = 0; n < 16; n++)
        for (int e = 0; e < 4; e++)
            o[(r0 + (e >> 1) * 8) * 128 + n * 8 + 2 * c + (e & 1)] = d[n][e];
}

int main() {
    const int na = 64 * 128, nb = 128 * 128;
    __nv_bfloat16 *ha = new __nv_bfloat16[na], *hb = new __nv_bfloat16[nb],
                  *hv = new __nv_bfloat16[nb];
    srand(7);
    auto rnd = [] { return (float)(rand() % 17 - 8) / 8.0f; }; /* exact in bf16, exact sums */
    for (int i = 0; i < na; i++)
        ha[i] = __float2bfloat16(rnd());
    for (int i = 0; i < nb; i++)
        hb[i] = __float2bfloat16(rnd()), hv[i] = __float2bfloat16(rnd());
    __nv_bfloat16 *da, *db, *dv;
    float *ds, *dout;
    cudaMalloc(&da, na * 2), cudaMalloc(&db, nb * 2), cudaMalloc(&dv, nb * 2);
    cudaMalloc(&ds, na * 4), cudaMalloc(&dout, na * 4);
    cudaMemcpy(da, ha, na * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, nb * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv, nb * 2, cudaMemcpyHostToDevice);
    const int smem = 1024 + 64 * 256 + 2 * 128 * 256;
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    probe<<<1, 128, smem>>>(da, db, dv, ds, dout);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("wgmma probe: %s\n", cudaGetErrorString(e));
        return 1;
    }
    float *hs = new float[na], *ho = new float[na];
    cudaMemcpy(hs, ds, na * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ho, dout, na * 4, cudaMemcpyDeviceToHost);
    double es = 0, eo = 0;
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < 128; n++) {
            double ws = 0, wo = 0;
            for (int k = 0; k < 128; k++) {
                ws += (double)__bfloat162float(ha[r * 128 + k]) * __bfloat162float(hb[n * 128 + k]);
                wo += (double)__bfloat162float(ha[r * 128 + k]) * __bfloat162float(hv[k * 128 + n]);
            }
            es = fmax(es, fabs(ws - hs[r * 128 + n]));
            eo = fmax(eo, fabs(wo - ho[r * 128 + n]));
        }
    printf("wgmma probe: S = A B^T (K-major, SS) max error %g; O = P V (registers, MN-major V) max "
           "error %g\n",
           es, eo);
    return es == 0 && eo == 0 ? 0 : 2;
}
