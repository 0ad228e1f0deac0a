// block_reduce.cuh: one value from every thread of a block -> one result, returned to every thread.
//
// Two levels: inside a warp, 5 butterfly shuffles (lanes swap registers, no memory traffic); across warps, lane 0
// of each warp writes its partial to shared memory and every warp reduces those (at most 32) the same way.
// The order of operations is fixed by the thread layout, so a float sum is the same bits on every run (atomics
// would not be).
// Requirements: blockDim.x a multiple of 32, every thread of the block calls it (it synchronises), and
// `scratch` is a __shared__ T[32], which may be reused by the next call.
#pragma once

#define NEG_INF __int_as_float(0xff800000)

struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
    __device__ float identity() const { return 0.0f; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ float identity() const { return NEG_INF; }
};
struct MinIntOp {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
    __device__ int identity() const { return 0x7fffffff; }
};
struct MaxIntOp {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
    __device__ int identity() const { return -1; }
};

template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));   // butterfly: every lane ends with the result
    }
    return v;
}

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();                                  // a previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_reduce(lane < n_warps ? scratch[lane] : op.identity(), op);
}
