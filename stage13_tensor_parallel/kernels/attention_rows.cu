// attention_rows.cu: causal self-attention with grouped-query heads one row at a time, with the online softmax and
// flash-decoding's split of the keys over several blocks; for the head_dims that attention_tiles.cu's tensor-core
// kernel has no instantiation for (any even head_dim up to 256). No score is ever stored outside registers and
// shared memory.
//
//   for row r, of the sequence in seq_slot b, at position P, and query head h of
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
// Flash-decoding (Dao et al. 2023): one decode row has too few queries to fill a GPU, so its keys are cut into
// n_splits ranges of keys_per_split; block z runs the recurrence over its range only and leaves (m_z, l_z, o_z).
// The same algebra merges them exactly: with M = max_z m_z,
//     o_h = sum_z exp(m_z - M) o_z  /  sum_z exp(m_z - M) l_z,
// done by the last of the row's blocks to finish (split_combine.cuh, shared with attention_tiles.cu).
// n_splits = 1 skips the partials: the block writes o / l itself.
// keys_per_split is read from device memory (split_keys), not passed by value: a CUDA graph replays each kernel
// with the arguments it was captured with, and the split a decode step wants depends on its longest row, which
// changes every step. The host writes it with the step's other inputs; n_splits (the grid's z) is fixed when the
// graph is captured, at the most a step of that batch size may use, and the blocks past a row's keys return at
// once. A null split_keys means no split (prompt tiles).
//
// attention_rows: grid (n_tiles, nkv, n_splits), block 128 (4 warps). Block (i, g, z) owns the one row r of tile i,
// K/V head g and keys z keys_per_split .. min(P, (z + 1) keys_per_split - 1): it loads each tile of 32 keys and values
// into shared memory once, for all G query heads of the group (GQA: K/V are read from HBM once per group, not once
// per head). Warp w takes the heads w, w + 4, ...; in a tile, lane j computes s_j of key j for its warp's head,
// the warp reduces max and sum with shuffles, and lane i then owns output elements d = i, i + 32, ... of that
// head, adding p_j V[j, d] with p_j broadcast from lane j.
//   qkv (R, row_stride) bf16: queries are the first nh heads of each row, RoPE applied;
//   K, V (num_blocks, BS, nkv, hd) bf16, paged: position p of seq_slot b is cache slot
//   block_tables[b][p / BS] * BS + p % BS (BS = 1 << block_shift; block_tables (B, table_width) i32), positions
//   0..P of each row's sequence written (rope_kv_write ran first);
//   tiles (n_tiles, 4) i32: row r, 1 row, seq_slot b, position P; out (R, nh * hd) bf16 (the tiles' rows written);
//   partial (n_tiles, n_splits, nh, hd + 2) f32: o_z, then m_z, l_z, and arrivals (n_tiles, nkv) i32, zero
//   between launches: where the splits meet (unused when n_splits = 1).
//   hd even, at most 256 (lane i's elements past hd are skipped); G at most WARPS * MAX_HEADS_PER_WARP.
//   Dynamic shared memory: 32 (hd/2 + 1) bf16 pairs (K), 32 hd bf16 (V), G hd bf16 (the group's queries).
// The causal mask is the loop bound (keys past P are never loaded); within the last tile, keys past P get p = 0.
#include <cuda_bf16.h>
#include "pdl.cuh"
#include "split_combine.cuh"

#define KEYS_PER_TILE 32          // = the warp size: lane j scores key j of the tile
#define WARPS 4
#define MAX_HEAD_DIM 256
#define MAX_HEADS_PER_WARP 8
#define PER_LANE (MAX_HEAD_DIM / 32)
#define NEG_INF (-__int_as_float(0x7f800000))

extern "C" __global__ void __launch_bounds__(WARPS * 32)
attention_rows(const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ k_cache,
               const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out,
               float* __restrict__ partial, int* __restrict__ arrivals, const int* __restrict__ tiles,
               const int* __restrict__ block_tables, int table_width, int block_shift, int n_heads, int n_kv_heads,
               int head_dim, int row_stride, const int* __restrict__ split_keys) {
    begin_after_previous();
    const int keys_per_split = split_keys ? *split_keys : 1 << 30;
    const int* tile = tiles + 4 * blockIdx.x;
    const int r = tile[0], g = blockIdx.y, z = blockIdx.z, group = n_heads / n_kv_heads;
    const int begin = z * keys_per_split, last = min(tile[3], begin + keys_per_split - 1);
    if (begin > last) return;                             // a split past this row's keys: nothing to do
    // K tile rows padded by one bf16 pair: lane j reads row j, so a row stride of hd / 2 + 1 words puts the 32
    // lanes' reads of one column in 32 different banks
    extern __shared__ __nv_bfloat162 smem[];
    const int half = head_dim / 2;
    __nv_bfloat162* k_tile = smem;                                                  // [32][hd / 2 + 1]
    __nv_bfloat162* v_tile = k_tile + KEYS_PER_TILE * (half + 1);                   // [32][hd / 2]
    __nv_bfloat162* q_group = v_tile + KEYS_PER_TILE * half;                        // [G][hd / 2]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kv_stride = n_kv_heads * head_dim;
    const int* table = block_tables + static_cast<long long>(tile[2]) * table_width;   // this sequence's blocks
    const int in_block = (1 << block_shift) - 1;
    const float scale = rsqrtf(static_cast<float>(head_dim));

    const __nv_bfloat162* q_row = reinterpret_cast<const __nv_bfloat162*>(
        qkv + static_cast<long long>(r) * row_stride + g * group * head_dim);        // the group's G heads
    for (int x = threadIdx.x; x < group * half; x += blockDim.x) q_group[x] = q_row[x];

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

    for (int first = begin; first <= last; first += KEYS_PER_TILE) {
        const int n_keys = min(KEYS_PER_TILE, last + 1 - first);
        __syncthreads();                                  // the previous tile's readers are done
        for (int x = threadIdx.x; x < n_keys * half; x += blockDim.x) {
            const int j = x / half, d2 = x % half;
            const int p = first + j;
            const long long slot = (static_cast<long long>(table[p >> block_shift]) << block_shift) | (p & in_block);
            const long long at = slot * kv_stride + g * head_dim;
            k_tile[j * (half + 1) + d2] = reinterpret_cast<const __nv_bfloat162*>(k_cache + at)[d2];
            v_tile[j * half + d2] = reinterpret_cast<const __nv_bfloat162*>(v_cache + at)[d2];
        }
        __syncthreads();
#pragma unroll                                     // k a constant: m, l, o stay in registers
        for (int k = 0; k < MAX_HEADS_PER_WARP; ++k) {
            if (k >= mine) break;
            const __nv_bfloat162* q = q_group + (warp + WARPS * k) * half;   // all lanes read one word: a broadcast
            float s = NEG_INF;                                               // s_j for key j = lane
            if (lane < n_keys) {
                float dot = 0.0f;
                for (int d2 = 0; d2 < half; ++d2) {
                    const float2 qd = __bfloat1622float2(q[d2]);
                    const float2 kd = __bfloat1622float2(k_tile[lane * (half + 1) + d2]);
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
            const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(v_tile);
            for (int j = 0; j < n_keys; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int e = 0; e < PER_LANE; ++e) {
                    const int d = lane + 32 * e;
                    if (d < head_dim) o[k][e] += pj * __bfloat162float(v[j * head_dim + d]);
                }
            }
        }
    }
    const bool whole = gridDim.z == 1;                    // one split: the final output, else this split's partial
#pragma unroll
    for (int k = 0; k < MAX_HEADS_PER_WARP; ++k) {
        if (k >= mine) break;
        const int h = g * group + warp + WARPS * k;
        if (whole) {
            const float inv = 1.0f / l[k];
            __nv_bfloat16* dst = out + static_cast<long long>(r) * n_heads * head_dim + h * head_dim;
#pragma unroll
            for (int e = 0; e < PER_LANE; ++e) {
                const int d = lane + 32 * e;
                if (d < head_dim) dst[d] = __float2bfloat16(o[k][e] * inv);
            }
        } else {
            float* dst = partial + ((static_cast<long long>(blockIdx.x) * gridDim.z + z) * n_heads + h) *
                                   (head_dim + 2);
#pragma unroll
            for (int e = 0; e < PER_LANE; ++e) {
                const int d = lane + 32 * e;
                if (d < head_dim) dst[d] = o[k][e];
            }
            if (lane == 0) {
                dst[head_dim] = m[k];
                dst[head_dim + 1] = l[k];
            }
        }
    }
    if (!whole) merge_if_last(partial, arrivals, out, tiles, split_keys, n_heads, n_kv_heads, head_dim);
}
