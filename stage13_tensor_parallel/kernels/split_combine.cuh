// split_combine.cuh: flash-decoding's splits of a row merged by the last of its blocks to finish, in the attention
// kernel itself: no second kernel a layer.
//
// A row whose keys are split over `used` blocks (z = 0 .. used - 1, attention_rows.cu says why) leaves, for every
// query head h of the K/V head g each block owns, (o_z, m_z, l_z) in `partial`; the row's output is
//     o_h = sum_z exp(m_z - M) o_z  /  sum_z exp(m_z - M) l_z,        M = max_z m_z.
// Which block merges? Every block, once its partials are written, makes them visible to the whole GPU
// (__threadfence) and counts itself into arrivals[i, g] with one atomic add. The block that reads used - 1 there
// is the last: every other block of (i, g) fenced its partials before its count, so it may read them all, merges
// its G heads, and sets the count back to 0, ready for the next launch (a CUDA graph replays the same buffers).
// The others return. The cost is a fence and an atomic a block, and the merge, a few hundred fp32 reads from L2,
// at the end of the one block that finishes last; the second launch it replaces cost a kernel's start and end.
//
// The merge is two rounds of reads from L2, each issued all at once: first thread (head, z) reads m_z and l_z
// and the warp of a head turns them into weights w_z = exp(m_z - M) / sum_z' exp(m_z' - M) l_z' in shared
// memory; then thread (head, d) adds w_z o_z[d] over z = 0, 1, .. in order, its loads unrolled eight deep, not
// one dependent read after another. Partials are read with ld.global.cg (L2, not L1): another SM wrote them, and
// this SM's L1 is not kept coherent with it.
//   partial (n_tiles, n_splits, nh, hd + 2) f32: o_z, then m_z, l_z; arrivals (n_tiles, nkv) i32, zero between
//   launches; out (R, nh hd) bf16, row r of tile i.
#pragma once
#include <cuda_bf16.h>

#define MAX_SPLITS 32             // kernels.py's MAX_SPLITS: a split a lane in the merge
#define MAX_GROUP 32              // kernels.py's ATTENTION_MAX_GROUP: query heads a K/V head

// call with every thread of block (i, g, z) of a one-row tile i = (row r, 1, seq_slot, position P), after its
// partials are written; the row's splits with keys are z = 0 .. P / keys_per_split. Returns whether it merged.
// (Everything is read again here rather than passed: nothing is kept live through the attention's loop for it.)
__device__ __forceinline__ bool merge_if_last(const float* partial, int* __restrict__ arrivals,
                                              __nv_bfloat16* __restrict__ out, const int* __restrict__ tiles,
                                              const int* __restrict__ split_keys, int n_heads, int n_kv_heads,
                                              int head_dim) {
    const int i = blockIdx.x, g = blockIdx.y, n_splits = gridDim.z;
    __shared__ bool last;
    __shared__ float weights[MAX_GROUP][MAX_SPLITS];
    __threadfence();                                  // this thread's partials, visible before the count below
    __syncthreads();                                  // ... for every thread of the block
    int* count = arrivals + static_cast<long long>(i) * n_kv_heads + g;
    if (threadIdx.x == 0) last = atomicAdd(count, 1) == tiles[4 * i + 3] / *split_keys;
    __syncthreads();
    if (!last) return false;
    __threadfence();                                  // the other blocks' counts seen: their partials are too
    const int r = tiles[4 * i], used = tiles[4 * i + 3] / *split_keys + 1;
    const int group = n_heads / n_kv_heads, lane = threadIdx.x % 32;
    const long long split_stride = static_cast<long long>(n_heads) * (head_dim + 2);
    const float* first = partial + (static_cast<long long>(i) * n_splits * n_heads + g * group) * (head_dim + 2);
    for (int j = threadIdx.x / 32; j < group; j += blockDim.x / 32) {   // warp: head g G + j, lane: split z
        const float* stats = first + lane * split_stride + j * (head_dim + 2) + head_dim;
        const float m_z = lane < used ? __ldcg(stats) : -__int_as_float(0x7f800000);
        const float l_z = lane < used ? __ldcg(stats + 1) : 0.0f;
        float big = m_z;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, off));
        const float e_z = lane < used ? __expf(m_z - big) : 0.0f;
        float total = 0.0f;                           // in split order: the same bits every run
        for (int z = 0; z < used; ++z) total += __shfl_sync(0xffffffffu, e_z * l_z, z);
        weights[j][lane] = e_z / total;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < group * head_dim; e += blockDim.x) {   // element d of head g G + j
        const int j = e / head_dim, d = e % head_dim;
        const float* o = first + j * (head_dim + 2) + d;
        float acc = 0.0f;
#pragma unroll 8
        for (int z = 0; z < used; ++z) acc += weights[j][z] * __ldcg(o + z * split_stride);
        out[static_cast<long long>(r) * n_heads * head_dim + (g * group + j) * head_dim + d] = __float2bfloat16(acc);
    }
    if (threadIdx.x == 0) *count = 0;                 // every block of (i, g) has counted: ready for the next launch
    return true;
}
