// grid_barrier.cu: rounds of work inside one launch, every block meeting every other at a barrier after each (a
// benchmarking tool, not part of any model): what a persistent kernel pays between two dependent steps, where a
// sequence of kernels pays a boundary (chain.cu).
//
//   round r: block k's thread 0 sets dst[k] = src[(k + 1) % n] + 1   (src, dst: the two halves of buf, swapped
//            each round), then the grid's barrier
//
// Every block reads a value another block wrote in the round before, so after R rounds every dst[k] is R only if no
// block passed a barrier before every block had arrived. The barrier: each block's thread 0 notes the generation,
// counts itself in (`arrived`); the last of the n to arrive resets the count and moves the generation on, and the
// others spin until they see it move. Every block must be resident at once (a cooperative launch checks that), and
// `arrived` must be 0 at the launch; each barrier leaves it 0.
// Launch: grid n (at most the blocks the GPU holds at once), any block; buf (2 n) i32 zeros, counters (2) u32 with
// counters[0] (arrived) 0; after the launch buf[(rounds % 2) n + k] = rounds for every k.

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void grid_sync(unsigned* arrived, unsigned* generation) {
    __syncthreads();                                   // the block's work of this round is done
    if (threadIdx.x == 0) {
        const unsigned gen = load_acquire(generation); // it cannot move before this block has arrived
        __threadfence();                               // the block's writes, visible before its arrival
        if (atomicAdd(arrived, 1) == gridDim.x - 1) {
            *arrived = 0;
            __threadfence();                           // the reset, before the generation that lets the rest go
            atomicAdd(generation, 1);
        } else {
            while (load_acquire(generation) == gen) {}
        }
    }
    __syncthreads();
}

extern "C" __global__ void grid_barrier(int* buf, unsigned* counters, int rounds) {
    const int n = gridDim.x, k = blockIdx.x;
    for (int r = 0; r < rounds; ++r) {
        const int* src = buf + (r % 2) * n;
        int* dst = buf + (1 - r % 2) * n;
        if (threadIdx.x == 0) dst[k] = __ldcg(src + (k + 1) % n) + 1;   // from L2: another SM wrote it
        grid_sync(counters, counters + 1);
    }
}
