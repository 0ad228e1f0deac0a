// kv_write.cu: append the new tokens' keys and values to the layer's KV cache.
//
//   for token t of this forward, at position p = pos0 + t, and each KV head g:
//     K[p, g, :] = qkv[t, (nh + g) hd : (nh + g + 1) hd]            (after RoPE: rope.cu ran first)
//     V[p, g, :] = qkv[t, (nh + nkv + g) hd : (nh + nkv + g + 1) hd]
//   qkv (T, row_stride) bf16 rows [q | k | v];  K, V (max_model_len, nkv, hd) bf16.
//
// A copy, 4 bytes (two bf16) a thread. Positions past max_model_len are refused on the host (cache.py), so the
// kernel trusts pos0 + T <= max_model_len.
// Launch: grid T, block 256 (threads loop over nkv * hd / 2 pairs).
#include <cuda_bf16.h>

extern "C" __global__ void kv_write(const __nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ k_cache,
                                    __nv_bfloat16* __restrict__ v_cache, int pos0, int n_heads, int n_kv_heads,
                                    int head_dim, int row_stride) {
    const int t = blockIdx.x, width = n_kv_heads * head_dim;
    const __nv_bfloat162* k_src = reinterpret_cast<const __nv_bfloat162*>(
        qkv + static_cast<long long>(t) * row_stride + n_heads * head_dim);
    const __nv_bfloat162* v_src = k_src + width / 2;
    const long long dst = static_cast<long long>(pos0 + t) * width / 2;
    for (int i = threadIdx.x; i < width / 2; i += blockDim.x) {
        reinterpret_cast<__nv_bfloat162*>(k_cache)[dst + i] = k_src[i];
        reinterpret_cast<__nv_bfloat162*>(v_cache)[dst + i] = v_src[i];
    }
}
