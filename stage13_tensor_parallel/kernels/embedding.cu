// embedding.cu: the first layer of the model is a table lookup.
//
//   out[t, :] = table[id, :]            id = ids[t]                      ids (T,) int32, table (V, H) bf16,
//                                                                        out (T, H) bf16
//   with prev_rows (T,) int32 given:    id = prev_ids[prev_rows[t]]  where prev_rows[t] >= 0
//
// prev_rows is asynchronous scheduling's: the host plans step t+1 before it has read step t's sampled ids,
// so a decode row's token is named by where step t's sampler wrote it (prev_ids, on the GPU), not by value.
//
// No arithmetic, only bytes: T*H*2 read and T*H*2 written. Each row is H bf16 = H*2 bytes, a multiple of
// 16 when H % 8 == 0 (checked by the launcher), so each thread moves 16 bytes (8 values) per load/store:
// wide, coalesced accesses are what make a copy run at memory bandwidth.
//
// Launch: grid (T, ceil(H / (8 * blockDim.x))), block 256. blockIdx.x picks the token, blockIdx.y a slice
// of the row, so any H and any T are covered and a short prompt still spreads over many blocks.
#include <cuda_bf16.h>
#include "pdl.cuh"

extern "C" __global__ void embedding_gather(const int* __restrict__ ids,
                                            const int* __restrict__ prev_rows,     // null: every id is in ids
                                            const int* __restrict__ prev_ids,
                                            const __nv_bfloat16* __restrict__ table,
                                            __nv_bfloat16* __restrict__ out,
                                            int hidden) {
    begin_after_previous();
    const int t = blockIdx.x;
    const int vec = blockIdx.y * blockDim.x + threadIdx.x;   // which 8-value chunk of the row
    const int n_vec = hidden / 8;
    if (vec >= n_vec) return;
    const int prev = prev_rows ? prev_rows[t] : -1;
    // ids were range-checked on the host; prev_ids are the sampler's, each < V
    const long long row = prev >= 0 ? prev_ids[prev] : ids[t];
    const uint4* src = reinterpret_cast<const uint4*>(table + row * hidden);
    uint4* dst = reinterpret_cast<uint4*>(out + static_cast<long long>(t) * hidden);
    dst[vec] = src[vec];
}
