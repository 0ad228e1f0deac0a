// checksum.cu: proves the GPU copy of a tensor equals the bytes in the file, without copying it back.
//
//   c = sum_i (w_i + 1) * (2i + 1)   mod 2^64,   w_i the i-th 16-bit word of the tensor
//
// The weight (2i + 1) makes the sum depend on position (a swapped or shifted block changes it), the + 1 makes
// zero words count. The host computes the same sum with numpy over the mapped file (weights.py).
// Addition mod 2^64 is associative, so the order of the parallel reduction does not matter: the result is
// bit-exact, not "close".
//
// Launch: grid ~ 4 blocks per SM, block 256, grid-stride loop; each warp reduces with shuffles and one lane
// adds into *out with a 64-bit atomic (*out must be zeroed first).

#include "pdl.cuh"

extern "C" __global__ void checksum_u16(const unsigned short* __restrict__ words,
                                        unsigned long long n,
                                        unsigned long long* __restrict__ out) {
    begin_after_previous();
    unsigned long long acc = 0;
    const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        acc += (static_cast<unsigned long long>(words[i]) + 1ull) * (2ull * i + 1ull);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        acc += __shfl_down_sync(0xffffffffu, acc, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(out, acc);
    }
}
