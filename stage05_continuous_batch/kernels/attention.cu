// attention.cu: causal self-attention with grouped-query heads over a batch's KV cache, the naive way (the
// score matrix is materialised). Rows are packed: any row may belong to any sequence, so each row says whose
// cache it reads (seq_slots[r]). One launch serves prompt rows (whole prompts or chunks of them) and decode rows
// (one per sequence, over that sequence's own cache length) together.
//
//   for row r (r < n_rows), of the sequence in seq_slot b = seq_slots[r], at position P = positions[r],
//   and head h, whose key/value head is g = h / (nh / nkv) (GQA: a group of query heads shares one K/V head):
//     s_j = (q_r . K[b, j, g]) / sqrt(hd)          for j <= P
//     p_j = exp(s_j - m) / sum_{j' <= P} exp(s_j' - m),   m = max_{j <= P} s_j      (fp32)
//     o_r = sum_{j <= P} p_j V[b, j, g]
//   qkv (n_rows, row_stride) bf16: the queries are the first nh heads of each row, RoPE already applied;
//   K, V (B, max_model_len, nkv, hd) bf16: the cache, positions 0..P of every row's sequence written
//   (kv_write.cu ran first, for this forward's rows too);
//   seq_slots (n_rows,) i32, each < B; scores (nh, n_rows, max_keys) fp32 scratch, max_keys > every P; row (h, r)
//   holds p_0..p_P; out (n_rows, nh*hd).
//
// The causal mask and the padding mask are both the loop bound: a row attends to keys 0..P of its own
// sequence and nothing else. Sequences sit in separate cache regions, so one never sees another's keys; a padding
// row (batch.py) sits at its sequence's last real position and writes no key, so no query ever reads a padding
// key, and a real row's result does not depend on what the padding rows hold.
// Numerical stability: exp(s - m) <= 1, so nothing overflows however large the scores; the result is the same
// softmax because the factor exp(-m) cancels between numerator and denominator.
// Cost: in prefill the score matrix is written and read back once per layer; stage06 (online softmax) computes
// the same o_r without storing it.
//
// Launch: grid (n_rows, nh), block 256; one block owns one (r, h) score row, in three phases (in decode that is
// B * nh blocks, each reading its sequence's whole K/V history):
//   1. scores: thread j computes s_j for j = tid, tid + 256, ... <= P (q_r, pre-scaled, sits in shared memory);
//   2. softmax: block max, exp in place, block sum, normalise;
//   3. P.V: the 256 threads form 256/hd groups of hd lanes; lane d of group r sums p_j v_j[d] over
//      j = r, r + groups, ...; the groups' partials are added through shared memory. (hd divides 256.)
#include <cuda_bf16.h>
#include "block_reduce.cuh"

#define MAX_HEAD_DIM 256

extern "C" __global__ void attention_naive(const __nv_bfloat16* __restrict__ qkv,
                                           const __nv_bfloat16* __restrict__ k_cache,
                                           const __nv_bfloat16* __restrict__ v_cache, float* __restrict__ scores,
                                           __nv_bfloat16* __restrict__ out, const int* __restrict__ positions,
                                           const int* __restrict__ seq_slots, int n_rows, int max_keys,
                                           int max_model_len, int n_heads, int n_kv_heads, int head_dim,
                                           int row_stride) {
    __shared__ float q[MAX_HEAD_DIM];
    __shared__ float partial[256];
    __shared__ float scratch[32];
    const int i = blockIdx.x, h = blockIdx.y, g = h / (n_heads / n_kv_heads);
    const int last = positions[i], kv_stride = n_kv_heads * head_dim;
    const long long seq_base = static_cast<long long>(seq_slots[i]) * max_model_len * kv_stride;
    const __nv_bfloat16* k_base = k_cache + seq_base + g * head_dim;        // K[b, j, g] = k_base + j * kv_stride
    const __nv_bfloat16* v_base = v_cache + seq_base + g * head_dim;
    float* p = scores + (static_cast<long long>(h) * n_rows + i) * max_keys;

    const float scale = rsqrtf(static_cast<float>(head_dim));
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        q[d] = __bfloat162float(qkv[static_cast<long long>(i) * row_stride + h * head_dim + d]) * scale;
    }
    __syncthreads();

    // 1. s_j = q_i . K[j] (already scaled), j <= P
    float m = NEG_INF;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        const __nv_bfloat162* k =
            reinterpret_cast<const __nv_bfloat162*>(k_base + static_cast<long long>(j) * kv_stride);
        float s = 0.0f;
        for (int d = 0; d < head_dim / 2; ++d) {
            const float2 kd = __bfloat1622float2(k[d]);
            s += q[2 * d] * kd.x + q[2 * d + 1] * kd.y;
        }
        p[j] = s;
        m = fmaxf(m, s);
    }
    // 2. softmax over j <= P, in place
    m = block_reduce(m, MaxOp(), scratch);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        const float e = __expf(p[j] - m);
        p[j] = e;
        sum += e;
    }
    const float inv_sum = 1.0f / block_reduce(sum, SumOp(), scratch);
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        p[j] *= inv_sum;
    }
    __syncthreads();   // phase 3 reads p_j written by other threads (global memory, same block: a barrier suffices)

    // 3. o_i[d] = sum_j p_j V[j, g, d]
    const int d = threadIdx.x % head_dim, group = threadIdx.x / head_dim, n_groups = blockDim.x / head_dim;
    float acc = 0.0f;
    for (int j = group; j <= last; j += n_groups) {
        acc += p[j] * __bfloat162float(v_base[static_cast<long long>(j) * kv_stride + d]);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (group == 0) {
        for (int r = 1; r < n_groups; ++r) acc += partial[r * head_dim + d];
        out[static_cast<long long>(i) * n_heads * head_dim + h * head_dim + d] = __float2bfloat16(acc);
    }
}
