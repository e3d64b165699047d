/*
 * cuda/attn_wgmma.cuh — the warpgroup matrix products (wgmma, sm_90a) of the wgmma prefill
 * kernel (attn_prefill.cu), and the shared-memory descriptors they read.
 *
 * One product is issued by the 128 threads of a warpgroup (4 consecutive warps, the first at a
 * warp index divisible by 4) and runs asynchronously: wg_fence() before the first product
 * whose accumulators or A registers other instructions wrote, wg_commit() after a batch,
 * wg_wait<N>() until at most N batches are in flight, then wg_pin() on the accumulators so the
 * compiler places no read of them above the wait.
 *
 * Accumulators of an m64nN product (f32): warp w of the warpgroup holds rows 16w..16w+15, and
 * within the warp d[j][0..3] are mma.sync's C fragment of the j-th n8 tile, {row g, cols
 * 8j+2c, 8j+2c+1}, {row g+8, same cols} (g = lane/4, c = lane%4). An A operand in registers
 * is mma.sync's m16n8k16 A fragment of the warp's 16 rows, so the C fragments of two adjacent
 * n8 tiles of S, rounded to bf16, are the A fragment of P for the next product (attn_pack_p).
 *
 * Shared tiles (128-byte swizzle): a [rows][64] bf16 panel is rows of 128 bytes whose 16-byte
 * chunk k sits at chunk k ^ (row & 7); the panel's base is 1024-byte aligned. A [rows][128]
 * tile is two such panels, columns 0..63 then 64..127 (wg_swz). Read K-major (the product's
 * reduction runs along the row: Q and K in S = Q K^T) the descriptor strides 1024 bytes per
 * 8 rows, and a k16 step adds 32 bytes within the panel; read MN-major (V in O += P V, the
 * reduction runs down the rows) it strides 1024 bytes per 8 rows and a panel's bytes per 64
 * columns.
 */
#ifndef AKV_CUDA_ATTN_WGMMA_CUH
#define AKV_CUDA_ATTN_WGMMA_CUH

#include <stdint.h>

/* wgmma is compiled only for the sm_90a target; elsewhere these trap (the launcher never
 * picks the wgmma kernel there: akv__attn_cuda_wgmma_built). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AKV_WGMMA_ON 1
#else
#define AKV_WGMMA_ON 0
#endif

/* The 64 accumulators of an m64n128 product (d[16][4]) as read-write asm operands %0..%63. */
#define WG_ACC4(d, n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define WG_ACC(d)                                                                                  \
    WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5),      \
        WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), \
        WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15)

/* Byte offset of chunk k (8 bf16, 0..15) of row r in a swizzled [rows][128] bf16 tile. */
static __device__ __forceinline__ uint32_t wg_swz(int rows, int r, int k) {
    return (uint32_t)((k >> 3) * rows * 128 + r * 128 + (((k & 7) ^ (r & 7)) << 4));
}

/* A shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
 * byte offsets (fields in 16-byte units). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

static __device__ __forceinline__ void wg_fence() {
#if AKV_WGMMA_ON
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_commit() {
#if AKV_WGMMA_ON
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> static __device__ __forceinline__ void wg_wait() {
#if AKV_WGMMA_ON
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Ordinary shared-memory writes (stores, cp.async) made visible to the products' reads; each
 * writing thread, before the barrier the readers pass. */
static __device__ __forceinline__ void wg_fence_smem() {
#if AKV_WGMMA_ON
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* Accumulators the compiler must treat as rewritten here (after a wait, before a fence). */
static __device__ __forceinline__ void wg_pin(float (&d)[16][4]) {
    asm volatile(""
                 : WG_ACC(d));
}

/* d (+)= A B for an m64n128k16 tile, A and B K-major in shared memory; scale_d 0 ignores d. */
static __device__ __forceinline__ void wg_mma_ss(float (&d)[16][4], uint64_t da, uint64_t db,
                                                 int scale_d) {
#if AKV_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC(d)
        : "l"(da), "l"(db), "r"(scale_d));
#else
    (void)d, (void)da, (void)db, (void)scale_d;
    __trap();
#endif
}

/* d += A B for an m64n128k16 tile, A in registers (a[4], the warp's 16 rows), B MN-major in
 * shared memory. */
static __device__ __forceinline__ void wg_mma_rs_t(float (&d)[16][4], const uint32_t (&a)[4],
                                                   uint64_t db) {
#if AKV_WGMMA_ON
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WG_ACC(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#else
    (void)d, (void)a, (void)db;
    __trap();
#endif
}

#endif
