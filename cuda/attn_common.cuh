/*
 * cuda/attn_common.cuh — what the attention kernels share: the device view of a paged K/V
 * table, the swizzled shared-memory layout of [rows][head_dim] bf16 tiles, the warp-level
 * tensor-core primitives (mma.sync m16n8k16 bf16 -> f32, ldmatrix), cp.async, and the
 * host-side helpers of the launchers (device properties, launch checks).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; lane = threadIdx.x % 32, g = lane/4,
 * c = lane%4):
 *   A 16x16 (row-major) 4 regs: {row g, cols 2c,2c+1}, {row g+8, 2c..}, {row g, 2c+8..}, {row g+8, 2c+8..}
 *   B 16x8  ("col")     2 regs: {k 2c,2c+1; n g}, {k 2c+8,2c+9; n g}
 *   C 16x8  f32         4 regs: {row g, cols 2c, 2c+1}, {row g+8, cols 2c, 2c+1}
 * so the C fragments of two adjacent n8 tiles of S = Q K^T are, converted to bf16, exactly
 * the A fragment of P for the next product P V (no shuffle).
 *
 * Shared tiles: row r of a [rows][D] bf16 tile is 2D bytes; its 16-byte chunk k is stored
 * at chunk k ^ (r & 7). The 8 rows an ldmatrix phase reads (consecutive r, same k) then hit
 * 8 different bank groups, and a cp.async of 8 consecutive chunks of one row as well.
 */
#ifndef AKV_CUDA_ATTN_COMMON_CUH
#define AKV_CUDA_ATTN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "attn/attn_impl.h"
}
#include "core/log.h"
#include "grid_dep.cuh"
#include "cuda_check.h"

#define ATTN_LN2 0.6931471805599453f
#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_FULL_MASK 0xffffffffu

/* The paged K/V table of one call, as the kernels see it. Exact pages are bf16; a compact
 * page (akv/kv_repr.h) holds its rows' codes from its start and their f16 scales from
 * scales_off, each in the exact page's row order. */
struct attn_kv {
    const unsigned char *pool; /* page id k at pool + k*page_bytes */
    unsigned long long page_bytes;
    unsigned long long scales_off; /* compact pages: bytes from a page's start to its scales */
    const int *indptr;  /* [n_seq+1] */
    const int *indices; /* page ids */
    const int *last;    /* [n_seq] last_page_len */
    int log2_p;         /* page_tokens = 1 << log2_p */
    int n_kv;           /* K/V heads */
};

static __device__ __forceinline__ int attn_seq_len(const attn_kv &kv, int s) {
    int pb = kv.indptr[s], pe = kv.indptr[s + 1];
    return pe > pb ? ((pe - pb - 1) << kv.log2_p) + kv.last[s] : 0;
}

/* Address of row (kvsel: 0 K / 1 V, head h, position t) of the sequence whose page ids
 * start at indices[pb]. Rows are D bf16 = 2D bytes. */
template <int D>
static __device__ __forceinline__ const unsigned char *attn_row(const attn_kv &kv, int pb, int kvsel,
                                                                int h, int t) {
    int page = __ldg(kv.indices + pb + (t >> kv.log2_p));
    size_t slot = ((size_t)(kvsel * kv.n_kv + h) << kv.log2_p) + (size_t)(t & ((1 << kv.log2_p) - 1));
    return kv.pool + (size_t)page * kv.page_bytes + slot * (D * 2);
}

/* Byte offset of chunk k (8 bf16) of row r in a swizzled [rows][D] bf16 tile. */
template <int D>
static __device__ __forceinline__ uint32_t attn_swz(int r, int k) {
    return (uint32_t)(r * (D * 2) + ((k ^ (r & 7)) << 4));
}

static __device__ __forceinline__ uint32_t attn_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronous; an invalid row is zero-filled (nothing read). */
static __device__ __forceinline__ void attn_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
/* 16 bytes global -> shared, asynchronous, every byte read. */
static __device__ __forceinline__ void attn_cp16_all(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
/* Thread-block clusters (sm_90+). attn_cluster_sync: a barrier over every thread of the
 * cluster (exited threads do not hold it up) whose arrival releases, and whose wait acquires,
 * the threads' earlier shared-memory writes at cluster scope. attn_cluster_ld4/ld1: loads
 * from the shared memory of block `rank` of the cluster, at the offset that `addr` (a
 * shared-memory address of this block) has in this block. Only called from kernels
 * launched with a cluster, which the launchers do on devices of compute capability 9+. */
static __device__ __forceinline__ void attn_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* not .aligned: callers may arrive from divergent code (a loop of per-lane trip counts) */
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;\n" ::: "memory");
#else
    __trap();
#endif
}
/* (called only under __CUDA_ARCH__ >= 900, by the loaders below) */
static __device__ __forceinline__ uint32_t attn_cluster_addr(uint32_t addr, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
static __device__ __forceinline__ float4 attn_cluster_ld4(uint32_t addr, int rank) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(attn_cluster_addr(addr, rank))
                 : "memory");
#endif
    return v;
}
static __device__ __forceinline__ float attn_cluster_ld1(uint32_t addr, int rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(attn_cluster_addr(addr, rank)) : "memory");
#endif
    return v;
}

/* The launch of kernel<<<grid, block, smem, stream>>>(arg) as a programmatic dependent of the
 * stream's previous kernel (the kernel must call grid_dep_wait before any global
 * access), in clusters of `cluster_x` x 1 x 1 blocks when cluster_x > 1. `attr` backs the
 * configuration's attributes. */
static inline cudaLaunchConfig_t attn_launch_config(dim3 grid, int block, size_t smem, cudaStream_t stream, int cluster_x,
                                             cudaLaunchAttribute (&attr)[2]) {
    cudaLaunchConfig_t cfg = grid_dep_config(grid, dim3(block), smem, stream, attr);
    if (cluster_x > 1) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[cfg.numAttrs].val.clusterDim.x = (unsigned)cluster_x;
        attr[cfg.numAttrs].val.clusterDim.y = attr[cfg.numAttrs].val.clusterDim.z = 1;
        cfg.numAttrs++;
    }
    return cfg;
}

/* Launches kernel as attn_launch_config describes. */
template <typename Arg>
static akv_status attn_launch_dependent(void (*kernel)(Arg), dim3 grid, int block, size_t smem, cudaStream_t stream,
                                        const Arg &arg, int cluster_x = 1) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = attn_launch_config(grid, block, smem, stream, cluster_x, attr);
    AKV_CUDA_LAUNCH_TRY(cudaLaunchKernelEx(&cfg, kernel, arg));
    return AKV_OK;
}

/* atomicAdd with acquire-release semantics at GPU scope (the old value). */
static __device__ __forceinline__ unsigned attn_atomic_add_acq_rel(unsigned *p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
static __device__ __forceinline__ void attn_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
static __device__ __forceinline__ void attn_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void attn_ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void attn_ldsm_x4_t(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a * b, bf16 inputs, f32 accumulators. */
static __device__ __forceinline__ void attn_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as a bf16 pair (lo in the low half: the lower column index). */
static __device__ __forceinline__ uint32_t attn_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Sum over the 4 lanes of a quad (the lanes that hold one fragment row). */
static __device__ __forceinline__ float attn_quad_sum(float x) {
    x += __shfl_xor_sync(ATTN_FULL_MASK, x, 1);
    return x + __shfl_xor_sync(ATTN_FULL_MASK, x, 2);
}

/* 2^x on the special-function unit (ftz; max relative error 2^-22; ex2(-inf) = 0). */
static __device__ __forceinline__ float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* One online-softmax step for fragment row half hf (0: row lane/4, 1: row lane/4 + 8) of an
 * m16 tile: s[NT][4] are the raw scores of this key tile (masked ones -inf), `scale` is
 * scale*log2(e), m the running maximum (log2 domain, scaled), l the running sum, acc[DN][4]
 * the output accumulators. On return s holds the probabilities (f32; the P V product rounds
 * them to bf16). A row with no key yet keeps m = -inf and l = 0 without producing a NaN.
 * The accumulators are rescaled only when some row of the warp saw a new maximum (alpha is
 * exactly 1 otherwise: most tiles of a long history). All lanes must call it. */
template <int NT, int DN>
static __device__ __forceinline__ void attn_softmax_step(float (&s)[NT][4], float (&acc)[DN][4], float &m,
                                                         float &l, int hf, float scale) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(ATTN_FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(ATTN_FULL_MASK, mx, 2));
    const float m_new = fmaxf(m, mx * scale);
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = attn_exp2(m - base);
    m = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 2 * hf; e < 2 * hf + 2; e++) {
            const float p = attn_exp2(fmaf(s[nt][e], scale, -base));
            s[nt][e] = p;
            sum += p;
        }
    l = l * alpha + sum;
    if (__any_sync(ATTN_FULL_MASK, alpha != 1.0f)) {
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            acc[dn][2 * hf] *= alpha;
            acc[dn][2 * hf + 1] *= alpha;
        }
    }
}

/* The A fragment of P for 16 keys from the C fragments of their two n8 tiles. */
static __device__ __forceinline__ void attn_pack_p(const float (&lo)[4], const float (&hi)[4], uint32_t (&pa)[4]) {
    pa[0] = attn_pack_bf16(lo[0], lo[1]);
    pa[1] = attn_pack_bf16(lo[2], lo[3]);
    pa[2] = attn_pack_bf16(hi[0], hi[1]);
    pa[3] = attn_pack_bf16(hi[2], hi[3]);
}

/* The normalised Walsh-Hadamard transform of a row held by a warp, lane l holding elements
 * E*l .. E*l + E - 1: the butterflies of stride 1, 2, 4, ... as akv_kvq_fwht pairs them, each
 * (a + b, a - b) rounded as the codec rounds it (in registers below E, across lanes above),
 * then the factor (float)(1/sqrt(32 E)). The query of q4 pages and their K rows (the encoder)
 * are rotated by it. */
template <int E>
static __device__ __forceinline__ void attn_fwht_row(float (&x)[E], int lane) {
    const float k = E == 2 ? 0.125f : 0.0883883476483184405f; /* (float)(1 / sqrt(32 E)) */
    static_assert(E == 2 || E == 4, "head dims 64 and 128");
#pragma unroll
    for (int st = 1; st < E; st *= 2)
#pragma unroll
        for (int j = 0; j < E; j++)
            if (!(j & st)) {
                const float u = x[j], v = x[j + st];
                x[j] = __fadd_rn(u, v), x[j + st] = __fsub_rn(u, v);
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2)
#pragma unroll
        for (int j = 0; j < E; j++) {
            const float o = __shfl_xor_sync(ATTN_FULL_MASK, x[j], m);
            x[j] = (lane & m) ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
        }
#pragma unroll
    for (int j = 0; j < E; j++) x[j] = __fmul_rn(x[j], k);
}

/* Eight consecutive elements at `src` + off (bf16 or f32), as 8 bf16 (16 bytes). */
static __device__ __forceinline__ uint4 attn_load8_bf16(const void *src, int is_f32, size_t off) {
    if (!is_f32) return *reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(src) + off);
    const float4 *f = reinterpret_cast<const float4 *>(static_cast<const float *>(src) + off);
    float4 x = f[0], y = f[1];
    return make_uint4(attn_pack_bf16(x.x, x.y), attn_pack_bf16(x.z, x.w), attn_pack_bf16(y.x, y.y),
                      attn_pack_bf16(y.z, y.w));
}

/* Stores two adjacent outputs (bf16 or f32) at element offset off (even). */
static __device__ __forceinline__ void attn_store2(void *dst, int is_f32, size_t off, float a, float b) {
    if (is_f32) {
        *reinterpret_cast<float2 *>(static_cast<float *>(dst) + off) = make_float2(a, b);
    } else {
        *reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(dst) + off) = __floats2bfloat162_rn(a, b);
    }
}
static __device__ __forceinline__ void attn_store1(void *dst, int is_f32, size_t off, float a) {
    if (is_f32) static_cast<float *>(dst)[off] = a;
    else static_cast<__nv_bfloat16 *>(dst)[off] = __float2bfloat16_rn(a);
}

/* ---- host side ------------------------------------------------------------------------ */

/* The device view of a validated table. */
static inline attn_kv attn_kv_view(const akv_attn_pages *kv) {
    attn_kv v;
    akv_repr_layout l;
    if (akv__attn_layout(kv, &l) != AKV_OK) l.page_bytes = l.scales_offset = 0; /* checked before */
    v.pool = reinterpret_cast<const unsigned char *>(kv->pool.addr);
    v.page_bytes = l.page_bytes;
    v.scales_off = l.scales_offset;
    v.indptr = reinterpret_cast<const int *>(kv->indptr.addr);
    v.indices = reinterpret_cast<const int *>(kv->indices.addr);
    v.last = reinterpret_cast<const int *>(kv->last_page_len.addr);
    v.log2_p = (int)akv__attn_log2(kv->page_tokens);
    v.n_kv = (int)kv->n_kv_heads;
    return v;
}

/* What the CUDA kernels take beyond the common validation: bf16 pages (the exact form of a
 * compact table), head dim 64/128, f32/bf16 activations, a batch that fits a grid. Compact
 * and past parts only where `parts_ok` (the decode), compact pages of at least 8 tokens (a
 * 16-byte load of q8 scales stays in one page). */
static inline akv_status attn_cuda_kv_check(const akv_attn_pages *kv, const char *op, bool parts_ok) {
    if (kv->dtype != AKV_DTYPE_BF16) {
        AKV_LOG_E("attn %s: pages are %s; the CUDA kernels take bf16", op, akv_dtype_name(kv->dtype));
        return AKV_EUNSUPPORTED;
    }
    if (!parts_ok && (kv->repr != AKV_REPR_EXACT || kv->past)) {
        AKV_LOG_E("attn %s: a %s part; this CUDA kernel takes exact pages of the queries' own "
                  "history (the decode reads compact and past parts)",
                  op, kv->past ? "past" : akv_repr_name((akv_repr)kv->repr));
        return AKV_EUNSUPPORTED;
    }
    if (kv->repr != AKV_REPR_EXACT && kv->page_tokens < 8) {
        AKV_LOG_E("attn %s: compact pages of %u tokens; the CUDA decode reads them from 8", op,
                  kv->page_tokens);
        return AKV_EUNSUPPORTED;
    }
    if (kv->head_dim != 64 && kv->head_dim != 128) {
        AKV_LOG_E("attn %s: head_dim %u; the CUDA kernels take 64 and 128", op, kv->head_dim);
        return AKV_EUNSUPPORTED;
    }
    if (kv->n_seq > 65535) {
        AKV_LOG_E("attn %s: %u sequences; one CUDA call takes at most 65535", op, kv->n_seq);
        return AKV_EUNSUPPORTED;
    }
    return AKV_OK;
}

static inline akv_status attn_cuda_dtype_check(akv_dtype t, const char *field, const char *op) {
    if (t == AKV_DTYPE_F32 || t == AKV_DTYPE_BF16) return AKV_OK;
    AKV_LOG_E("attn %s: %s is %s; the CUDA kernels take f32 or bf16", op, field, akv_dtype_name(t));
    return AKV_EUNSUPPORTED;
}

/* A 16-byte vector access needs 16-byte aligned rows. */
static inline akv_status attn_cuda_align_check(akv_dptr p, uint64_t stride_bytes, const char *field,
                                               const char *op) {
    if (p.addr % 16 == 0 && stride_bytes % 16 == 0) return AKV_OK;
    AKV_LOG_E("attn %s: %s (address 0x%llx, row stride %llu bytes) is not 16-byte aligned", op, field,
              (unsigned long long)p.addr, (unsigned long long)stride_bytes);
    return AKV_EINVAL;
}

/* SM count and the shared memory a block may opt into, of the current device. */
static inline akv_status attn_cuda_device(uint32_t *n_sm, size_t *smem_optin) {
    int dev = 0, sm = 0, smem = 0;
    AKV_CUDA_TRY(cudaGetDevice(&dev));
    AKV_CUDA_TRY(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, dev));
    AKV_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    *n_sm = (uint32_t)sm;
    *smem_optin = (size_t)smem;
    return AKV_OK;
}

/* The launchers of attn_append.cu, shared with the prefill. */
akv_status akv__attn_cuda_append_launch(const akv_attn_pages *kv, akv_dptr qo_indptr, uint32_t n_per_seq,
                                        uint32_t max_new, akv_dptr k, akv_dptr v, akv_dtype dtype,
                                        uint32_t stride, cudaStream_t stream, const char *op);

#endif
