// hopper.cuh: the sm_90a instructions attention_hopper.cu is built from, one thin wrapper each (PTX ISA 8.x).
//
//   mbarrier   a 64-bit barrier in shared memory that counts arrivals and, for the tensor memory accelerator, bytes
//              (a transaction count): a phase completes when both reach zero, and waiting names the phase by its
//              parity, so one barrier serves a ring of stages round after round
//   TMA        cp.async.bulk.tensor: one instruction copies a box of a tensor, described by a 128-byte tensor map
//              the host encodes (cuTensorMapEncodeTiled), from global to shared memory, swizzled on the way; its
//              bytes count down the mbarrier it names when they have landed
//   wgmma      a 64 x N x 16 matrix multiply-add issued by a warpgroup (four warps, 128 threads) at once: A from
//              registers (a warp's 16 rows, laid out as mma.sync's m16n8k16 A fragment), B from shared memory
//              through a 64-bit descriptor, the 64 x N fp32 accumulator in registers (warp w rows 16w .. 16w + 15,
//              as mma.sync's C fragment, N / 8 of them side by side). It runs asynchronously: fence before,
//              commit the group, wait for it before reading the accumulator or reusing the operands
//
// Shared-memory operands are in the 128-byte swizzled layout TMA writes: rows of 128 bytes (64 bf16), the 16-byte
// chunk c of row r stored at chunk c ^ (r % 8), so eight rows make a 1,024-byte atom whose eight reads of one
// chunk column hit eight different bank groups. A descriptor gives the start address and two strides:
//   K-major (the reduced dimension contiguous: K's rows of head_dim for S = Q K^T): SBO = 1,024 bytes from one
//     8-row group to the next; the 16 columns of a k-step are 32 bytes further along the row, added to the start
//     (the swizzle is applied to the address, so the atom's pattern holds); LBO unused
//   MN-major (the output dimension contiguous: V's rows of head_dim for O = P V, read transposed): SBO = 1,024
//     bytes from 8 keys to the next 8, LBO = the bytes from one 64-column chunk of head_dim to the next
#pragma once
#include <cuda_bf16.h>

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarriers
__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// initialised barriers made visible to the async proxy (TMA) and the rest of the block: then __syncthreads()
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, int parity) {   // until phase `parity` is done
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(bar)) : "memory");
}
// one arrival, and `bytes` more to land before the phase completes
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// ---- TMA
// the tensor map was written by the host (a copy to the device) before the launch, in global memory: made visible
// to the tensormap proxy, at system scope as the host wrote it
__device__ __forceinline__ void tensormap_acquire(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" :: "l"(map) : "memory");
}
// the box at coordinates (c0, c1, c2) of the map's tensor into shared memory at dst; its bytes count down `bar`
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, int c0, int c1, int c2,
                                            unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)) : "memory");
}
// this thread's ordinary stores to shared memory, visible to the async proxy (wgmma's operand reads)
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- wgmma
// a shared-memory matrix descriptor, 128-byte swizzle: start address, LBO and SBO in 16-byte units
__device__ __forceinline__ unsigned long long smem_desc(const void* start, unsigned lbo, unsigned sbo) {
    return static_cast<unsigned long long>((smem_addr(start) & 0x3FFFF) >> 4) |
           static_cast<unsigned long long>((lbo >> 4) & 0x3FFF) << 16 |
           static_cast<unsigned long long>((sbo >> 4) & 0x3FFF) << 32 | 1ull << 62;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// after the wait: the accumulator's registers may be read (the compiler must not move a read above the wait)
template <int N>
__device__ __forceinline__ void wgmma_settle(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]) :: "memory");
}

#define WGMMA_D8(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]), \
                       "+f"(d[i + 1][0]), "+f"(d[i + 1][1]), "+f"(d[i + 1][2]), "+f"(d[i + 1][3])

// d (64 x 64, fp32) += a (64 x 16 bf16, registers) b (16 x 64 bf16, shared, descriptor); scale_d = 0: d = a b.
// transpose_b: 0 when b's rows of 16 are contiguous (K-major), 1 when its 64 columns are (MN-major)
template <int TRANSPOSE_B>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b,
                                                int scale_d) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}"
                 : WGMMA_D8(d, 0), WGMMA_D8(d, 2), WGMMA_D8(d, 4), WGMMA_D8(d, 6)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B), "r"(scale_d));
}

// the same, 64 x 128
template <int TRANSPOSE_B>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b,
                                                 int scale_d) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %70, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}"
                 : WGMMA_D8(d, 0), WGMMA_D8(d, 2), WGMMA_D8(d, 4), WGMMA_D8(d, 6),
                   WGMMA_D8(d, 8), WGMMA_D8(d, 10), WGMMA_D8(d, 12), WGMMA_D8(d, 14)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANSPOSE_B), "r"(scale_d));
}

// ---- register reallocation: every warp of a warpgroup executes it, with the same N (a multiple of 8, 24-256)
// lower this warpgroup's registers a thread to N, giving the rest to the block's pool
template <int N>
__device__ __forceinline__ void registers_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }

// raise them to N from that pool, waiting until a release has put enough there
template <int N>
__device__ __forceinline__ void registers_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
