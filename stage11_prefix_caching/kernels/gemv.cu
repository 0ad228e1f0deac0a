// gemv.cu: y = x W^T for the few rows of a small decode step, where the GEMM is a stream of the weights.
//
//   y[m, n] = sum_k x[m, k] W[n, k]        x (M, K) bf16, W (N, K) bf16 (Hugging Face's layout), y (M, N) bf16;
//                                          M <= 8, K a multiple of 8; fp32 accumulation, y rounded once
//
// At M = 1..8 a linear layer reads N K weights to do M N K multiply-adds: about one flop per byte, so its time is
// the time to stream W from HBM once, and the only question is how close to the copy bandwidth it gets. cuBLAS's
// heuristic picks tensor-core GEMM tiles for these shapes; the profile measured them at 1.5-2.8x their floor on
// the 1B's qkv, o and down projections at batch 1. This kernel does nothing but stream: `column_warps` warps
// share one output column n (one row of W, contiguous), each lane loads 16 bytes (8 weights) at a time, lane l of
// part p at k = 8 (l + 32 p), then every 8 * 32 * column_warps further, multiplies them by the same 8 elements of
// every x row (x is a few KiB, served from L1/L2 to every warp), and each warp sums its 32 partial dot products
// with shuffles; the column's partials meet in shared memory and are added in a fixed order (the same bits every
// run). Loads are unrolled four deep so each lane keeps 64 bytes of W in flight. column_warps (1, 2, 4 or 8)
// grows with K, so a long row (down's 8192) is streamed by several warps at once instead of one warp
// making 32 trips. The engine times it against cuBLAS per shape at start and keeps it only where it is clearly
// faster (graphs.py), so it runs only where it wins. Launched early (pdl.cuh), each lane loads its first four
// 16-byte words of weights while the kernel before (a norm, the attention) still runs: at 2 warps a column that
// is all of qkv's 2048-long rows, so most of the stream overlaps the small kernels between two GEMMs.
//
// Launch: grid ceil(N / (8 / column_warps)), block 256 (8 warps: 8 / column_warps columns a block). One
// instantiation per M (gemv_m1 .. gemv_m8).
#include <cuda_bf16.h>
#include "pdl.cuh"

#define WARPS 8
#define VEC 8
#define PREFETCH 4     // 16-byte weight loads a lane issues before the previous kernel has finished (pdl.cuh)

union Pack {                                          // 8 bf16, loaded as one 16-byte word
    uint4 word;
    __nv_bfloat162 pair[VEC / 2];
};

template <int M>       // acc[m] += the 8 weights in a . x[m, k .. k + 7]
__device__ __forceinline__ void accumulate(float acc[M], const Pack& a, const __nv_bfloat16* __restrict__ x, int k,
                                           int k_dim) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
        Pack b;
        b.word = __ldg(reinterpret_cast<const uint4*>(x + static_cast<long long>(m) * k_dim + k));
#pragma unroll
        for (int p = 0; p < VEC / 2; ++p) {
            const float2 wf = __bfloat1622float2(a.pair[p]), xf = __bfloat1622float2(b.pair[p]);
            acc[m] = fmaf(wf.x, xf.x, acc[m]);
            acc[m] = fmaf(wf.y, xf.y, acc[m]);
        }
    }
}

template <int M>
__device__ __forceinline__ void gemv_column(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,
                                            __nv_bfloat16* __restrict__ y, int n_cols, int k_dim, int column_warps) {
    __shared__ float partial[WARPS][M];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % column_warps;
    const int n = blockIdx.x * (WARPS / column_warps) + warp / column_warps;
    const bool valid = n < n_cols;                   // every thread reaches the barrier below
    const __nv_bfloat16* row = w + static_cast<long long>(valid ? n : 0) * k_dim;
    const int stride = VEC * 32 * column_warps, first = VEC * (lane + 32 * part);
    launch_dependents();
    // the first PREFETCH loads of this lane's weights go out before the previous kernel has finished (weights
    // are never written during a step); only x has to wait for it
    Pack early[PREFETCH];
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) {
        const int k = first + i * stride;
        if (valid && k < k_dim) early[i].word = __ldg(reinterpret_cast<const uint4*>(row + k));
    }
    wait_for_inputs();
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) {
        const int k = first + i * stride;
        if (valid && k < k_dim) accumulate<M>(acc, early[i], x, k, k_dim);
    }
#pragma unroll 4
    for (int k = first + PREFETCH * stride; valid && k < k_dim; k += stride) {
        Pack a;
        a.word = __ldg(reinterpret_cast<const uint4*>(row + k));
        accumulate<M>(acc, a, x, k, k_dim);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float v = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) partial[warp][m] = v;
    }
    __syncthreads();
    if (valid && part == 0 && lane < M) {            // lane m adds row m's partials of the column's warps
        float total = 0.0f;
        for (int q = 0; q < column_warps; ++q) total += partial[warp + q][lane];
        y[static_cast<long long>(lane) * n_cols + n] = __float2bfloat16(total);
    }
}

#define INSTANTIATE(M)                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_m##M(                                         \
            const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,                           \
            __nv_bfloat16* __restrict__ y, int n_cols, int k_dim, int column_warps) {                            \
        gemv_column<M>(w, x, y, n_cols, k_dim, column_warps);                                                    \
    }
INSTANTIATE(1)
INSTANTIATE(2)
INSTANTIATE(3)
INSTANTIATE(4)
INSTANTIATE(5)
INSTANTIATE(6)
INSTANTIATE(7)
INSTANTIATE(8)
