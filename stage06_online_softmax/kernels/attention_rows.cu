// attention.cu: causal self-attention with grouped-query heads over packed rows, with the online softmax: the
// keys are visited a tile at a time and no score is ever stored outside registers and shared memory.
//
//   for row r, of the sequence in seq_slot b = seq_slots[r], at position P = positions[r], and query head h of
//   key/value head g (the G = nh / nkv query heads h = g G .. g G + G - 1 share K[b, :, g] and V[b, :, g]):
//     s_j = (q_h . K[b, j, g]) / sqrt(hd)                              for j <= P
//     o_h = sum_{j <= P} exp(s_j - m) V[b, j, g]  /  sum_{j <= P} exp(s_j - m),    m = max_{j <= P} s_j
//
// The online softmax (Milakov & Gimelshein 2018; FlashAttention) computes the same o_h in one pass. After the
// keys of tiles 1..t it holds, per head, the running max m_t, the running sum l_t = sum_j exp(s_j - m_t) and the
// running output o_t = sum_j exp(s_j - m_t) V_j over the keys seen. A new tile with scores s_j, j in T:
//     m_{t+1} = max(m_t, max_{j in T} s_j)
//     a       = exp(m_t - m_{t+1})                      (<= 1: the old terms, re-expressed against the new max)
//     l_{t+1} = a l_t + sum_{j in T} exp(s_j - m_{t+1})
//     o_{t+1} = a o_t + sum_{j in T} exp(s_j - m_{t+1}) V_j
// By induction l_t and o_t are the sums over every key seen, each term taken against m_t; after the last tile,
// o / l is the softmax-weighted sum, exactly (in exact arithmetic) the two-pass result, and every exponent is
// <= 0, so nothing overflows. (m_0 = -inf, l_0 = 0, o_0 = 0; the first tile gives a = exp(-inf) = 0.)
//
// Launch: grid (n_rows, n_kv_heads), block 128 (4 warps). One block owns one row and one K/V head: it loads each
// tile of 32 keys and values into shared memory once, for all G query heads of the group (GQA: K/V are read
// from HBM once per group, not once per head). Warp w takes the heads w, w + 4, ...; in a tile, lane j computes
// s_j of key j for its warp's head, the warp reduces max and sum with shuffles, and lane i then owns output
// elements d = i, i + 32, ... of that head, adding p_j V[j, d] with p_j broadcast from lane j.
//   qkv (n_rows, row_stride) bf16: queries are the first nh heads of each row, RoPE applied;
//   K, V (B, max_model_len, nkv, hd) bf16, positions 0..P of each row's sequence written (kv_write ran first);
//   positions, seq_slots (n_rows,) i32; out (n_rows, nh * hd) bf16. hd even, at most 256 (lane i's elements
//   past hd are skipped); G at most WARPS * MAX_HEADS_PER_WARP.
// The causal mask is the loop bound (keys past P are never loaded); within the last tile, keys past P get
// p = 0. This kernel reads every row's keys again (a prefill chunk's rows do not share tiles); stage06's next
// step is tiles of query rows on tensor cores for prefill, and keys split over blocks for long decodes.
#include <cuda_bf16.h>

#define KEYS_PER_TILE 32          // = the warp size: lane j scores key j of the tile
#define WARPS 4
#define MAX_HEAD_DIM 256
#define MAX_HEADS_PER_WARP 8
#define PER_LANE (MAX_HEAD_DIM / 32)
#define NEG_INF (-__int_as_float(0x7f800000))

extern "C" __global__ void __launch_bounds__(WARPS * 32)
attention_online(const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ k_cache,
                 const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out,
                 const int* __restrict__ positions, const int* __restrict__ seq_slots, int max_model_len,
                 int n_heads, int n_kv_heads, int head_dim, int row_stride) {
    // K tile rows padded by one bf16 pair: lane j reads row j, so a row stride of hd / 2 + 1 words puts the 32
    // lanes' reads of one column in 32 different banks
    __shared__ __nv_bfloat162 k_tile[KEYS_PER_TILE][MAX_HEAD_DIM / 2 + 1];
    __shared__ __nv_bfloat16 v_tile[KEYS_PER_TILE][MAX_HEAD_DIM];
    const int r = blockIdx.x, g = blockIdx.y, group = n_heads / n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = head_dim / 2;
    const int last = positions[r], kv_stride = n_kv_heads * head_dim;
    const long long seq_base = static_cast<long long>(seq_slots[r]) * max_model_len * kv_stride + g * head_dim;
    const float scale = rsqrtf(static_cast<float>(head_dim));

    // this warp's heads: h = g * group + warp + WARPS * k, for k < mine
    const int mine = warp < group ? (group - warp + WARPS - 1) / WARPS : 0;
    float m[MAX_HEADS_PER_WARP], l[MAX_HEADS_PER_WARP], o[MAX_HEADS_PER_WARP][PER_LANE];
#pragma unroll
    for (int k = 0; k < MAX_HEADS_PER_WARP; ++k) {
        m[k] = NEG_INF;
        l[k] = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) o[k][e] = 0.0f;
    }

    for (int first = 0; first <= last; first += KEYS_PER_TILE) {
        const int n_keys = min(KEYS_PER_TILE, last + 1 - first);
        __syncthreads();                                  // the previous tile's readers are done
        for (int x = threadIdx.x; x < n_keys * half; x += blockDim.x) {
            const int j = x / half, d2 = x % half;
            const long long at = seq_base + static_cast<long long>(first + j) * kv_stride;
            k_tile[j][d2] = reinterpret_cast<const __nv_bfloat162*>(k_cache + at)[d2];
            reinterpret_cast<__nv_bfloat162*>(v_tile[j])[d2] =
                reinterpret_cast<const __nv_bfloat162*>(v_cache + at)[d2];
        }
        __syncthreads();
#pragma unroll                                     // k a constant: m, l, o stay in registers
        for (int k = 0; k < MAX_HEADS_PER_WARP; ++k) {
            if (k >= mine) break;
            const int h = g * group + warp + WARPS * k;
            const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(
                qkv + static_cast<long long>(r) * row_stride + h * head_dim);
            // s_j for key j = lane (q comes from global memory: L1 serves the 32 lanes' identical reads)
            float s = NEG_INF;
            if (lane < n_keys) {
                float dot = 0.0f;
                for (int d2 = 0; d2 < half; ++d2) {
                    const float2 qd = __bfloat1622float2(q[d2]), kd = __bfloat1622float2(k_tile[lane][d2]);
                    dot += qd.x * kd.x + qd.y * kd.y;
                }
                s = dot * scale;
            }
            float tile_max = s;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
            }
            const float m_new = fmaxf(m[k], tile_max);    // finite: the tile has at least one key
            const float a = __expf(m[k] - m_new);         // 0 on the first tile (m = -inf)
            const float p = lane < n_keys ? __expf(s - m_new) : 0.0f;
            float p_sum = p;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, off);
            l[k] = a * l[k] + p_sum;
            m[k] = m_new;
#pragma unroll
            for (int e = 0; e < PER_LANE; ++e) o[k][e] *= a;
            for (int j = 0; j < n_keys; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int e = 0; e < PER_LANE; ++e) {
                    const int d = lane + 32 * e;
                    if (d < head_dim) o[k][e] += pj * __bfloat162float(v_tile[j][d]);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MAX_HEADS_PER_WARP; ++k) {
        if (k >= mine) break;
        const int h = g * group + warp + WARPS * k;
        const float inv = 1.0f / l[k];
        __nv_bfloat16* dst = out + static_cast<long long>(r) * n_heads * head_dim + h * head_dim;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
            const int d = lane + 32 * e;
            if (d < head_dim) dst[d] = __float2bfloat16(o[k][e] * inv);
        }
    }
}
