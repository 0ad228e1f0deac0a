// rope.cu: rotary position embedding, in place, on the q and k heads of the fused qkv rows.
//
//   row t sits at position p = positions[t]; for each q or k head and each pair i < hd/2 (rotate-half layout):
//     (a, b) = (x[i], x[i + hd/2])
//     x[i]        = a cos(p theta_i) - b sin(p theta_i)
//     x[i + hd/2] = b cos(p theta_i) + a sin(p theta_i)
//   qkv (T, row_stride) bf16 with rows [q heads | k heads | v heads]; the first n_heads = nh + nkv heads rotate.
//   positions (T,) int32: in a batch every row has its own position (prefill: 0..len-1 per sequence; decode:
//   each sequence's length so far), so the position comes from a table, not from the row index.
//   cos, sin (max_model_len, hd/2) fp32: a table built once on the host (common/rope.py, llama3 scaling), in
//   float64 before rounding: p * theta reaches ~1e5 radians, where a float32 angle has lost its low digits.
//
// A rotation only mixes the two values of a pair, so every (head, pair) is independent: one thread each.
// Launch: grid T, block 256 (threads loop over n_heads * hd/2 pairs).
#include <cuda_bf16.h>

extern "C" __global__ void rope_inplace(__nv_bfloat16* __restrict__ qkv, const float* __restrict__ cos_table,
                                        const float* __restrict__ sin_table, const int* __restrict__ positions,
                                        int n_heads, int head_dim, int row_stride) {
    const int t = blockIdx.x, half = head_dim / 2;
    const long long p = positions[t];
    __nv_bfloat16* row = qkv + static_cast<long long>(t) * row_stride;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int head = k / half, i = k % half;
        __nv_bfloat16* x = row + head * head_dim;
        const float c = cos_table[p * half + i], s = sin_table[p * half + i];
        const float a = __bfloat162float(x[i]), b = __bfloat162float(x[i + half]);
        x[i] = __float2bfloat16(a * c - b * s);
        x[i + half] = __float2bfloat16(b * c + a * s);
    }
}
