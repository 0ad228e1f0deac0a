// kv_write.cu: write the new tokens' keys and values into the batch's KV cache.
//
//   for row t of this forward and each KV head g, with s = slot_mapping[t]:
//     K[s, g, :] = qkv[t, (nh + g) hd : (nh + g + 1) hd]            (after RoPE: rope.cu ran first)
//     V[s, g, :] = qkv[t, (nh + nkv + g) hd : (nh + nkv + g + 1) hd]
//   and nothing when s = -1 (a padding row, or the row of a finished sequence).
//   qkv (T, row_stride) bf16 rows [q | k | v];  K, V (num_blocks * BS, nkv, hd) bf16: the paged
//   (num_blocks, BS, nkv, hd) cache seen as one list of cache slots, so position p of a sequence whose block
//   table is T is slot s = T[p / BS] * BS + p % BS (vLLM's slot mapping; packing.py computes it per row).
//
// A copy, 4 bytes (two bf16) a thread. The host builds slot_mapping from blocks the block manager gave the row's
// sequence, so the kernel trusts it.
// Launch: grid T, block 256 (threads loop over nkv * hd / 2 pairs).
#include <cuda_bf16.h>

extern "C" __global__ void kv_write(const __nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ k_cache,
                                    __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ slot_mapping,
                                    int n_heads, int n_kv_heads, int head_dim, int row_stride) {
    const int t = blockIdx.x, width = n_kv_heads * head_dim;
    const int slot = slot_mapping[t];
    if (slot < 0) return;                                     // padding: its keys must never exist
    const __nv_bfloat162* k_src = reinterpret_cast<const __nv_bfloat162*>(
        qkv + static_cast<long long>(t) * row_stride + n_heads * head_dim);
    const __nv_bfloat162* v_src = k_src + width / 2;
    const long long dst = static_cast<long long>(slot) * width / 2;
    for (int i = threadIdx.x; i < width / 2; i += blockDim.x) {
        reinterpret_cast<__nv_bfloat162*>(k_cache)[dst + i] = k_src[i];
        reinterpret_cast<__nv_bfloat162*>(v_cache)[dst + i] = v_src[i];
    }
}
