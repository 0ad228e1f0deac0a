// grid_barrier.cu: rounds of work inside one launch, every block meeting every other at a barrier after each (a
// benchmarking tool, not part of any model): what a persistent kernel pays between two dependent steps, where a
// sequence of kernels pays a boundary (chain.cu).
//
//   round r: block k's thread 0 sets dst[k] = src[(k + 1) % n] + 1   (src, dst: the two halves of buf, swapped
//            each round), then the grid's barrier
//
// Every block reads a value another block wrote in the round before, so after R rounds every dst[k] is R only if no
// block passed a barrier before every block had arrived. Two barriers, each by one thread a block:
//   grid_barrier_generation  note the generation, count in (atomicAdd); the last of the n to arrive resets the count
//                            and moves the generation on, the others spin until it moves: reusable, leaves the
//                            count 0, three steps on the last arrival's path (its atomic, the reset, the generation)
//   grid_barrier_count       count in with a release add that returns nothing, spin until the count reaches
//                            n (r + 1): one step, but the count only grows (zero it before each launch)
// Every block must be resident at once (a cooperative launch checks that).
// Launch: grid n (at most the blocks the GPU holds at once), any block; buf (2 n) i32 zeros; counters (2) u32 zeros
// (generation: counters[0] 0 suffices, and each launch leaves it 0); after it buf[(rounds % 2) n + k] = rounds.

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

struct Generation {
    __device__ static void sync(unsigned* counters, int) {
        unsigned* arrived = counters;
        unsigned* generation = counters + 1;
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
};

struct Count {
    __device__ static void sync(unsigned* counters, int round) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counters) : "memory");   // the block's writes
        const unsigned target = gridDim.x * (round + 1);                                       // go out before it
        while (load_acquire(counters) < target) {}
    }
};

template <typename Barrier>
__device__ __forceinline__ void rounds_of(int* buf, unsigned* counters, int rounds) {
    const int n = gridDim.x, k = blockIdx.x;
    for (int r = 0; r < rounds; ++r) {
        const int* src = buf + (r % 2) * n;
        int* dst = buf + (1 - r % 2) * n;
        if (threadIdx.x == 0) dst[k] = __ldcg(src + (k + 1) % n) + 1;   // from L2: another SM wrote it
        __syncthreads();                               // the block's work of this round is done
        if (threadIdx.x == 0) Barrier::sync(counters, r);
        __syncthreads();
    }
}

extern "C" __global__ void grid_barrier_generation(int* buf, unsigned* counters, int rounds) {
    rounds_of<Generation>(buf, counters, rounds);
}

extern "C" __global__ void grid_barrier_count(int* buf, unsigned* counters, int rounds) {
    rounds_of<Count>(buf, counters, rounds);
}
