// gemv.cu: y = x W^T for the few rows of a small decode step, where the GEMM is a stream of the weights, with
// the kernels on either side of it fused in.
//
//   gemv           y[m, n] = sum_k x[m, k] W[n, k]        x (M, K) bf16, W (N, K) bf16 (Hugging Face's layout),
//                                                          y (M, N) bf16; M <= 8, K a multiple of 8; fp32 sums
//   gemv_norm      y[m, n] = r_m sum_k x[m, k] g[k] W[n, k],   r_m = 1 / sqrt(mean_k x[m, k]^2 + eps)
//                  (RMSNorm with weight g (K,) bf16 in front: x is the residual stream, the norm is not stored)
//   gemv_norm_silu act[m, j] = silu(a[m, j]) a[m, I + j],  a = gemv_norm(x) over W = [W_gate | W_up] (2I, K),
//                  act (M, I) bf16: SwiGLU's gate and its product, in the GEMM that makes them
//   gemv_norm_rope qkv = gemv_norm(x) over W = Wqkv, then RoPE on its q and k heads at positions[m] and the k and
//                  v heads into the KV cache at slot_mapping[m]: rope_kv_write.cu's work, in the GEMM that makes
//                  the values (the rotate-half pairs i, i + hd/2 of a head computed by one block)
//   gemv_residual  y[m, n] += bf16(sum_k x[m, k] W[n, k])  (y the residual stream: the add after o and down)
//   gemv_norm_head logits[m, n] = the gemv_norm sum, fp32 (the final norm and the LM head), and ids[m] = the first
//                  n with the largest logits[m, n]: greedy sampling, for the sampler to take (sampling.cu)
//
// At M = 1..8 a linear layer reads N K weights to do M N K multiply-adds: about one flop per byte, so its time is
// the time to stream W from HBM once, and the only question is how close to the copy bandwidth it gets. cuBLAS's
// heuristic picks tensor-core GEMM tiles for these shapes; the profile measured them at 1.5-2.8x their floor on
// the 1B's qkv, o and down projections at batch 1. This kernel does nothing but stream: `column_warps` warps
// share one output column n (one row of W, contiguous), each lane loads 16 bytes (8 weights) at a time, lane l of
// part p at k = 8 (l + 32 p), then every 8 * 32 * column_warps further, multiplies them by the same 8 elements of
// every x row (x is a few KiB, served from L1/L2 to every warp), and each warp sums its 32 partial dot products
// with shuffles; the column's partials meet in shared memory and are added in a fixed order (the same bits every
// run). Loads are unrolled four deep so each lane keeps 64 bytes of W in flight. column_warps (1, 2, 4 or 8)
// grows with K, so a long row (down's 8192) is streamed by several warps at once instead of one warp
// making 32 trips. Launched early (pdl.cuh), each lane loads its first four 16-byte words of weights while the
// kernel before (the attention, or another GEMM) still runs.
//
// The fusions add little to the stream. A column's warps read every x[m, k] once between them, so the first column
// of each block sums the norm's squares beside its dot products from the same loads, the block's columns share them
// through shared memory, and r_m scales each column's sum at the end: no pass over x before the stream, no
// normalised copy of x written and read back, and no bf16 rounding of it (the unfused path rounds x r g to bf16
// before its GEMM). g scales the 8 weights of a load once, not once a row. Every block sums its squares in the same
// order, so every column of a row gets the same r_m. The residual add reads and writes one element a column. What
// an epilogue reads besides its sums (the residual element; RoPE's position, its cos and sin, the cache slot) is
// loaded before the stream, not after it: a block's last dependent trips to memory would otherwise add to its tail,
// once a wave, where nothing else is in flight. Each fused kind still does more arithmetic a weight than the plain
// one, which matters where M is large enough that the plain GEMV is no longer purely a stream; the engine times
// both (graphs.py). For SwiGLU a block's first half of columns are gate rows j and its second half the up rows
// I + j of the same j, so the block holds both factors of its outputs and multiplies them before anything is stored
// (the unfused path rounds both to bf16 first); RoPE pairs the same way, dims i and i + hd/2 of a head, rotates the
// two sums and stores them, rounded once, into qkv and (k, v) the cache. Paired kinds need two columns a block
// (column_warps <= 4).
//
// The LM head's argmax costs the sampler a pass over V = 128,256 logits a row on one SM; here each block already
// holds its columns' logits in registers. A row's (logit, column) pairs are ordered by one 64-bit key (the
// logit's bits as an ordered integer above, the column's complement below: larger logit first, then smaller
// column), so "the first maximum" is the maximum key: each block takes its columns' with an atomicMax in shared
// memory and offers it to best[m] with one atomicMax in global memory. Then it fences and takes a ticket; the
// block that takes the last one knows every block's offer is in, reads best[m] and sets it back to 0 in one
// atomicExch, writes ids[m], and sets the ticket back to 0: the next launch starts clean (a CUDA graph replays
// the same buffers), whether or not anything read the ids. A NaN logit is never chosen (its key is 0).
//
// Launch: grid ceil(N / (8 / column_warps)) (paired kinds: ceil(N / 2 / (4 / column_warps))), block 256 (8
// warps: 8 / column_warps columns a block). One instantiation per M and kind (gemv_m1 .. gemv_norm_head_m8).
#include <cuda_bf16.h>
#include "pdl.cuh"

#define WARPS 8
#define VEC 8
#define PREFETCH 4     // 16-byte weight loads a lane issues before the previous kernel has finished (pdl.cuh)

union Pack {                                          // 8 bf16, loaded as one 16-byte word
    uint4 word;
    __nv_bfloat162 pair[VEC / 2];
};

enum Kind { PLAIN, NORM, NORM_SILU, NORM_ROPE, RESIDUAL, NORM_HEAD };

template <int KIND> constexpr bool has_norm = KIND == NORM || KIND == NORM_SILU || KIND == NORM_ROPE ||
                                              KIND == NORM_HEAD;
template <int KIND> constexpr bool paired = KIND == NORM_SILU || KIND == NORM_ROPE;   // two columns make an output

// what gemv_norm_rope needs beyond the GEMV (rope_kv_write.cu's arguments)
struct Rope {
    __nv_bfloat16* k_cache;                           // (num_blocks * BS, nkv, hd): cache slots
    __nv_bfloat16* v_cache;
    const int* slot_mapping;                          // (M,): -1 writes nothing
    const float* cos_table;                           // (max_len, hd / 2)
    const float* sin_table;
    const int* positions;                             // (M,)
    int n_heads, n_kv_heads, head_dim;
};

// gemv_norm_head's outputs, and where its blocks' argmaxes meet
struct Head {
    float* logits;                                    // (M, N) fp32
    unsigned long long* best;                         // (M,): 0 between launches
    int* ticket;                                      // (1,): 0 between launches
    int* ids;                                         // (M,): the greedy token of each row
};

// the row of W that makes member `second` (0 or 1) of pair p: SwiGLU's gate row p and up row I + p; RoPE's
// dims i and i + hd/2 of the head p / (hd/2), i = p % (hd/2) (rotate-half pairs)
template <int KIND>
__device__ __forceinline__ int pair_row(int p, int second, int n_cols, const Rope& rope) {
    if (KIND == NORM_SILU) return second ? n_cols / 2 + p : p;
    const int half = rope.head_dim / 2;
    return p / half * rope.head_dim + p % half + (second ? half : 0);
}

// what the RoPE epilogue of pair p, row m needs besides its two sums: the rotation at the row's position and
// the row's cache slot (loaded before the stream: the header)
struct RopeAt {
    float c, s;                                       // cos and sin of pair p's angle (q and k heads; v: unused)
    int slot;                                         // -1: nothing into the cache
};

__device__ __forceinline__ RopeAt rope_at(int m, int p, const Rope& rope) {
    const int half = rope.head_dim / 2, head = p / half, i = p % half;
    RopeAt at{0.0f, 0.0f, rope.slot_mapping[m]};
    if (head < rope.n_heads + rope.n_kv_heads) {     // a q or k head: rotated at the row's position
        const long long t = static_cast<long long>(rope.positions[m]) * half + i;
        at.c = rope.cos_table[t], at.s = rope.sin_table[t];
    }
    return at;
}

// RoPE on the pair (a, b) of row m and pair p, stored into qkv (M, n_cols); k and v pairs also into the cache
__device__ __forceinline__ void rope_store(float a, float b, int m, int p, const RopeAt& at,
                                           __nv_bfloat16* __restrict__ qkv, int n_cols, const Rope& rope) {
    const int half = rope.head_dim / 2, head = p / half, i = p % half;
    if (head < rope.n_heads + rope.n_kv_heads) {     // a q or k head: rotated
        const float ra = a * at.c - b * at.s, rb = b * at.c + a * at.s;
        a = ra, b = rb;
    }
    const __nv_bfloat16 qa = __float2bfloat16(a), qb = __float2bfloat16(b);
    __nv_bfloat16* row = qkv + static_cast<long long>(m) * n_cols + head * rope.head_dim;
    row[i] = qa;
    row[i + half] = qb;
    if (head < rope.n_heads || at.slot < 0) return;  // a query (attention reads it in qkv), or padding
    const int kv = head - rope.n_heads;              // k heads 0..nkv-1, then v heads
    __nv_bfloat16* cache = kv < rope.n_kv_heads ? rope.k_cache : rope.v_cache;
    __nv_bfloat16* dst = cache + (static_cast<long long>(at.slot) * rope.n_kv_heads + kv % rope.n_kv_heads) *
                                 rope.head_dim;
    dst[i] = qa;
    dst[i + half] = qb;
}

// (logit, column) as one key whose maximum is the largest logit at its first column; NaN orders below all
__device__ __forceinline__ unsigned long long greedy_key(float v, int n) {
    const unsigned int u = __float_as_uint(v);
    const unsigned int ordered = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return static_cast<unsigned long long>(ordered) << 32 | (0xffffffffu - static_cast<unsigned int>(n));
}

// gemv_norm_head's epilogue, called by every thread: `sum` is logits[m, n] where `valid`
template <int M>
__device__ __forceinline__ void head_store(float sum, bool valid, int m, int n, int n_cols, const Head& head) {
    __shared__ unsigned long long block_best[M];
    __shared__ bool last;
    if (threadIdx.x < M) block_best[threadIdx.x] = 0ull;
    __syncthreads();
    if (valid) {
        head.logits[static_cast<long long>(m) * n_cols + n] = sum;
        atomicMax(&block_best[m], greedy_key(sum, n));
    }
    __syncthreads();
    if (threadIdx.x < M) atomicMax(head.best + threadIdx.x, block_best[threadIdx.x]);
    __threadfence();                                  // this block's offers land before its ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(head.ticket, 1) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();                                  // every other block's ticket seen: its offers are in
    if (threadIdx.x < M) {
        const unsigned long long key = atomicExch(head.best + threadIdx.x, 0ull);
        head.ids[threadIdx.x] = static_cast<int>(0xffffffffu - static_cast<unsigned int>(key));
    }
    if (threadIdx.x == 0) *head.ticket = 0;
}

// acc[m] += the 8 weights in a . x[m, k .. k + 7]. With the norm (has_norm kinds) the weights are scaled by
// g[k .. k + 7] first (once, not once a row), and where `squares` sq[m] += x[m, k .. k + 7]^2.
template <int M, int KIND>
__device__ __forceinline__ void accumulate(float acc[M], float sq[M], const Pack& a,
                                           const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ g,
                                           int k, int k_dim, bool squares) {
    constexpr bool norm = has_norm<KIND>;
    float2 wf[VEC / 2];
    Pack gain;
    if (norm) gain.word = __ldg(reinterpret_cast<const uint4*>(g + k));
#pragma unroll
    for (int p = 0; p < VEC / 2; ++p) {
        wf[p] = __bfloat1622float2(a.pair[p]);
        if (norm) {
            const float2 gf = __bfloat1622float2(gain.pair[p]);
            wf[p] = make_float2(wf[p].x * gf.x, wf[p].y * gf.y);
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        Pack b;
        b.word = __ldg(reinterpret_cast<const uint4*>(x + static_cast<long long>(m) * k_dim + k));
#pragma unroll
        for (int p = 0; p < VEC / 2; ++p) {
            const float2 xf = __bfloat1622float2(b.pair[p]);
            acc[m] = fmaf(wf[p].x, xf.x, acc[m]);
            acc[m] = fmaf(wf[p].y, xf.y, acc[m]);
            if (norm && squares) sq[m] = fmaf(xf.x, xf.x, fmaf(xf.y, xf.y, sq[m]));
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// n_cols: W's rows N (NORM_SILU: 2I); y (M, N), or act (M, I) for NORM_SILU, or the residual stream (M, N)
template <int M, int KIND>
__device__ __forceinline__ void gemv_column(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,
                                            __nv_bfloat16* __restrict__ y, int n_cols, int k_dim, int column_warps,
                                            const __nv_bfloat16* __restrict__ g, float eps, const Rope& rope,
                                            const Head& head) {
    __shared__ float partial[WARPS][M], partial_sq[WARPS][M], total[WARPS][M];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % column_warps;
    const int cols = WARPS / column_warps, col = warp / column_warps;   // columns a block; this warp's
    const int half = cols / 2;                       // paired kinds: pairs a block
    if (paired<KIND> && cols < 2) __trap();          // a pair's two columns must be in one block
    int n, row;                                      // the output column (or pair), and the row of W that makes it
    if (paired<KIND>) {                              // columns [0, cols/2): first members of pairs; the rest: second
        n = blockIdx.x * half + col % half;
        row = n < n_cols / 2 ? pair_row<KIND>(n, col >= half, n_cols, rope) : -1;
    } else {
        n = row = blockIdx.x * cols + col;
        if (n >= n_cols) row = -1;
    }
    const bool valid = row >= 0;                     // every thread reaches the barriers below
    const bool squares = col == 0;                   // the block's first column sums the norm's squares for all:
    //                                                  valid wherever any column of the block is
    const __nv_bfloat16* wrow = w + static_cast<long long>(valid ? row : 0) * k_dim;
    const int stride = VEC * 32 * column_warps, first = VEC * (lane + 32 * part);
    launch_dependents();
    // the first PREFETCH loads of this lane's weights go out before the previous kernel has finished (weights
    // are never written during a step); only x has to wait for it
    Pack early[PREFETCH];
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) {
        const int k = first + i * stride;
        if (valid && k < k_dim) early[i].word = __ldg(reinterpret_cast<const uint4*>(wrow + k));
    }
    wait_for_inputs();
    // what the epilogue's thread (column or pair c, row m) below reads besides its sums, read now so that it
    // arrives under the stream: RoPE's rotation and cache slot, the residual add's element. Only these kinds hold
    // anything through the loop.
    RopeAt at{};
    float residual = 0.0f;
    if (KIND == NORM_ROPE) {
        const int p = blockIdx.x * half + static_cast<int>(threadIdx.x) / M;
        if (threadIdx.x < half * M && p < n_cols / 2) at = rope_at(threadIdx.x % M, p, rope);
    }
    if (KIND == RESIDUAL) {
        const int n_out = blockIdx.x * cols + static_cast<int>(threadIdx.x) / M;
        if (threadIdx.x < cols * M && n_out < n_cols)
            residual = __bfloat162float(y[static_cast<long long>(threadIdx.x % M) * n_cols + n_out]);
    }
    float acc[M], sq[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = sq[m] = 0.0f;
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) {
        const int k = first + i * stride;
        if (valid && k < k_dim) accumulate<M, KIND>(acc, sq, early[i], x, g, k, k_dim, squares);
    }
#pragma unroll 4
    for (int k = first + PREFETCH * stride; valid && k < k_dim; k += stride) {
        Pack a;
        a.word = __ldg(reinterpret_cast<const uint4*>(wrow + k));
        accumulate<M, KIND>(acc, sq, a, x, g, k, k_dim, squares);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float v = warp_sum(acc[m]), s = has_norm<KIND> ? warp_sum(sq[m]) : 0.0f;
        if (lane == 0) partial[warp][m] = v, partial_sq[warp][m] = s;
    }
    __syncthreads();
    // thread (c, m) adds column c's partials of row m in a fixed order (its warps c * column_warps + q)
    const int c = threadIdx.x / M, m = threadIdx.x % M;
    const bool mine = threadIdx.x < cols * M;
    float sum = 0.0f;
    if (mine) {
        float sum_sq = 0.0f;                         // column 0's squares: its warps are 0 .. column_warps - 1
        for (int q = 0; q < column_warps; ++q) {
            sum += partial[c * column_warps + q][m];
            sum_sq += partial_sq[q][m];
        }
        if (has_norm<KIND>) sum *= rsqrtf(sum_sq / k_dim + eps);
    }
    if (paired<KIND>) {                              // column c meets its partner c + cols / 2
        if (mine) total[c][m] = sum;
        __syncthreads();
        const int pair = blockIdx.x * half + c;
        if (threadIdx.x >= half * M || pair >= n_cols / 2) return;
        const float a = total[c][m], b = total[c + half][m];
        if (KIND == NORM_SILU) {                     // a = gate, b = up
            y[static_cast<long long>(m) * (n_cols / 2) + pair] = __float2bfloat16(a / (1.0f + __expf(-a)) * b);
        } else {
            rope_store(a, b, m, pair, at, y, n_cols, rope);
        }
        return;
    }
    const int col_n = blockIdx.x * cols + c;
    if (KIND == NORM_HEAD) {
        head_store<M>(sum, mine && col_n < n_cols, m, col_n, n_cols, head);
        return;
    }
    if (!mine || col_n >= n_cols) return;
    __nv_bfloat16* out = y + static_cast<long long>(m) * n_cols + col_n;
    if (KIND == RESIDUAL) {                          // x + d in bf16, d rounded first, as the unfused add
        *out = __float2bfloat16(residual + __bfloat162float(__float2bfloat16(sum)));
    } else {
        *out = __float2bfloat16(sum);
    }
}

#define KERNEL(NAME, KIND, M)                                                                                     \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) NAME##_m##M(                                       \
            const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,                           \
            __nv_bfloat16* __restrict__ y, int n_cols, int k_dim, int column_warps,                              \
            const __nv_bfloat16* __restrict__ g, float eps) {                                                    \
        gemv_column<M, KIND>(w, x, y, n_cols, k_dim, column_warps, g, eps, Rope{}, Head{});                      \
    }
#define KERNEL_ROPE(M)                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_norm_rope_m##M(                               \
            const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,                           \
            __nv_bfloat16* __restrict__ qkv, int n_cols, int k_dim, int column_warps,                            \
            const __nv_bfloat16* __restrict__ g, float eps, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,      \
            const int* slot_mapping, const float* cos_table, const float* sin_table, const int* positions,       \
            int n_heads, int n_kv_heads, int head_dim) {                                                         \
        gemv_column<M, NORM_ROPE>(w, x, qkv, n_cols, k_dim, column_warps, g, eps,                                \
                                  Rope{k_cache, v_cache, slot_mapping, cos_table, sin_table, positions,          \
                                       n_heads, n_kv_heads, head_dim}, Head{});                                  \
    }
#define KERNEL_HEAD(M)                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_norm_head_m##M(                               \
            const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x, float* logits, int n_cols, \
            int k_dim, int column_warps, const __nv_bfloat16* __restrict__ g, float eps,                         \
            unsigned long long* best, int* ticket, int* ids) {                                                   \
        gemv_column<M, NORM_HEAD>(w, x, nullptr, n_cols, k_dim, column_warps, g, eps, Rope{},                    \
                                  Head{logits, best, ticket, ids});                                              \
    }
#define INSTANTIATE(M)                                                                                            \
    KERNEL(gemv, PLAIN, M) KERNEL(gemv_norm, NORM, M) KERNEL(gemv_norm_silu, NORM_SILU, M)                      \
    KERNEL(gemv_residual, RESIDUAL, M) KERNEL_ROPE(M) KERNEL_HEAD(M)
INSTANTIATE(1)
INSTANTIATE(2)
INSTANTIATE(3)
INSTANTIATE(4)
INSTANTIATE(5)
INSTANTIATE(6)
INSTANTIATE(7)
INSTANTIATE(8)
