// rope_kv_write.cu: rotary position embedding on the q and k heads of the fused qkv rows, and the new tokens' keys
// and values written into the KV cache, in one kernel (at batch 1 each was a launch of ~1-3 us over a few KiB).
//
//   RoPE, in place, for row t at position p = positions[t], each q or k head and each pair i < hd/2
//   (rotate-half layout):
//     (a, b) = (x[i], x[i + hd/2])
//     x[i]        = a cos(p theta_i) - b sin(p theta_i)
//     x[i + hd/2] = b cos(p theta_i) + a sin(p theta_i)
//   then, with s = slot_mapping[t], for each KV head g:
//     K[s, g, :] = the k head g of row t (rotated)        V[s, g, :] = the v head g of row t
//   and no cache write when s = -1 (a padding row, or the row of a finished sequence).
//
//   qkv (T, row_stride) bf16 with rows [q heads | k heads | v heads] (nh, nkv, nkv heads of hd);
//   positions (T,) int32: every row has its own position (prefill: 0..len-1 per sequence; decode: each sequence's
//   length so far); cos, sin (max_model_len, hd/2) fp32, a table built once on the host (common/rope.py, llama3
//   scaling) in float64 before rounding: p * theta reaches ~1e5 radians, where a float32 angle has lost its low
//   digits. A null cos_table skips the rotation (a plain cache write, for tests that fill a cache).
//   K, V (num_blocks * BS, nkv, hd) bf16: the paged (num_blocks, BS, nkv, hd) cache seen as one list of cache
//   slots, so position p of a sequence whose block table is T is slot s = T[p / BS] * BS + p % BS (vLLM's slot
//   mapping; packing.py computes it per row, from blocks the block manager gave the row's sequence, so the kernel
//   trusts it).
//
// A rotation only mixes the two values of a pair, and a pair's cache write needs only those two, so every
// (head, pair) of every row is independent: one thread each, one trip to memory.
// Launch: grid (T, ceil((nh + 2 nkv) hd/2 / 256)), block 256.
#include <cuda_bf16.h>
#include "pdl.cuh"

extern "C" __global__ void rope_kv_write(__nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ k_cache,
                                         __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ slot_mapping,
                                         const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                         const int* __restrict__ positions, int n_heads, int n_kv_heads,
                                         int head_dim, int row_stride) {
    begin_after_previous();
    const int t = blockIdx.x, half = head_dim / 2;
    const int k = blockIdx.y * blockDim.x + threadIdx.x;
    if (k >= (n_heads + 2 * n_kv_heads) * half) return;
    const int head = k / half, i = k % half;
    __nv_bfloat16* x = qkv + static_cast<long long>(t) * row_stride + head * head_dim;
    __nv_bfloat16 a = x[i], b = x[i + half];
    if (cos_table != nullptr && head < n_heads + n_kv_heads) {          // a q or k head: rotate it
        const long long p = positions[t];
        const float c = cos_table[p * half + i], s = sin_table[p * half + i];
        const float af = __bfloat162float(a), bf = __bfloat162float(b);
        a = __float2bfloat16(af * c - bf * s);
        b = __float2bfloat16(bf * c + af * s);
        x[i] = a;
        x[i + half] = b;
    }
    if (head < n_heads) return;                                         // a query: attention reads it in qkv
    const int slot = slot_mapping[t];
    if (slot < 0) return;                                               // padding: its keys must never exist
    const int g = head - n_heads;                                       // k heads 0..nkv-1, then v heads
    __nv_bfloat16* cache = g < n_kv_heads ? k_cache : v_cache;
    __nv_bfloat16* dst = cache + (static_cast<long long>(slot) * n_kv_heads + g % n_kv_heads) * head_dim;
    dst[i] = a;
    dst[i + half] = b;
}
