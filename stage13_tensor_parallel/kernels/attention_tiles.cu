// attention_tiles.cu: causal GQA attention in FlashAttention-2's shape, on tensor cores, for prompt chunks and
// decode rows alike (head_dim 64 and 128; attention_rows.cu serves the others).
//
// The same online softmax as attention_rows.cu (the recurrence and its proof are there), but a block owns a tile
// of queries instead of one row: TILE_M = 64 "M-rows", each a (query row, query head) pair of one K/V head's group,
// row-major in the group (M-row m = query row m / G, head g G + m % G), so a tile holds 64 / G consecutive query
// rows of one chunk (positions first_pos .. first_pos + n_rows - 1). Each tile of TILE_N = 64 keys and values is
// loaded into shared memory once and serves all 64 M-rows: per byte of K/V read, 64 queries' worth of work.
//
//   S = Q K^T / sqrt(hd)      (64 x 64)   four warps, 16 M-rows each: 8 key blocks x hd/16 steps of mma m16n8k16
//   mask S[m, j] = -inf where key j > position of M-row m (or past the split's keys; only tiles that reach there)
//   m_new = max(m, rowmax S);  P = exp(S - m_new);  l = exp(m - m_new) l + rowsum P;  O = exp(m - m_new) O + P V
//   after the last tile: out = O / l
//
// A decode row is a tile of one row: G of the 64 M-rows hold queries, and the warps that hold none only load.
// Its keys are split over gridDim.z blocks as in attention_rows.cu (flash-decoding), each leaving (m, l, O) in
// `partial`, merged by the last of them to finish (split_combine.cuh); a prompt chunk's tiles run unsplit
// (gridDim.z = 1) and write out themselves.
// keys_per_split comes from device memory (split_keys; null: unsplit), so a captured graph follows each step's
// split (attention_rows.cu says why).
//
// The mma (bf16 in, fp32 accumulate) is warp-wide: mma.sync.m16n8k16 multiplies a 16x16 A by a 16x8 B into a
// 16x8 C, each spread over the 32 lanes in fixed places. With lane = 4 q + t (q = lane / 4, t = lane % 4):
//   A (row-major):  a[0] = A[q][2t, 2t+1]  a[1] = A[q+8][2t, 2t+1]  a[2] = A[q][2t+8, 2t+9]  a[3] = A[q+8][2t+8, ..]
//   B (k x n):      b[0] = B[2t, 2t+1][q]  b[1] = B[2t+8, 2t+9][q]
//   C (fp32):       c[0], c[1] = C[q][2t, 2t+1]      c[2], c[3] = C[q+8][2t, 2t+1]
// So a lane holds two M-rows (q and q + 8 of its warp's 16) throughout, and the row statistics need only the
// four lanes of a quad (two shuffles). Three placements make the kernel short:
//   - Q's A fragments are bf16 pairs of one row: read straight from global memory once, kept in registers.
//   - K's B fragment b[0] = K[key q][d 2t, 2t+1], a pair within one key's row: one 32-bit shared-memory read.
//   - P's A fragment for keys 16k..16k+15 is exactly the C fragments of S's key blocks 2k and 2k+1, rounded to
//     bf16: the probabilities never leave registers.
//   - V's B fragment needs V[key 2t, 2t+1][d q], two rows: ldmatrix .trans reads 8x8 bf16 blocks of the
//     row-major V tile and hands each lane its transposed pairs.
// Shared-memory rows are padded by 8 bf16 (16 bytes): eight consecutive rows then start in eight different
// groups of four banks, so the 8 x 4 words of one fragment read (or ldmatrix phase) hit 32 different banks.
//
// K/V tiles arrive by cp.async (global -> shared without a trip through registers), in STAGES buffers: with two
// (head_dim 64), tile j + 1 is on its way while tile j is computed, so a block waits on memory once per loop,
// not once per tile; head_dim 128 keeps one buffer (two would need 68 KiB, past the 48 KiB of static shared
// memory) and its copy is issued as soon as the last reader of the previous tile is done.
//
// The cache is paged: key position p of the sequence in seq_slot b lives in cache slot
//   block_tables[b][p / BS] * BS + p % BS        (BS = block_size = 1 << block_shift, a power of two)
// so each 16-byte copy of a K/V tile looks its key's block up in the sequence's row of the block tables (a few
// hundred bytes a sequence, read through L1): a tile's 64 keys may come from up to 64 / BS + 1 blocks anywhere
// in the pool. Nothing else changes: the tile in shared memory is the same, whatever block its keys came from.
//
// Launch: grid (n_tiles, nkv, n_splits), block 128. tiles (n_tiles, 4) i32: first row, n_rows (<= 64 / G),
// seq_slot, first_pos; the tile's rows are consecutive in qkv and out and their K/V are in the cache
// (rope_kv_write ran first). Block z takes keys z keys_per_split .. (z + 1) keys_per_split - 1 (n_splits > 1:
// one-row tiles only).
//   qkv (R, row_stride) bf16 (queries = the first nh heads, RoPE applied); K, V (num_blocks, BS, nkv, HD) bf16;
//   block_tables (B, table_width) i32: the blocks of seq_slot b's positions 0, BS, 2 BS, .. in order;
//   out (R, nh HD) bf16, the tiles' rows written; partial (n_tiles, n_splits, nh, HD + 2) f32 and arrivals
//   (n_tiles, nkv) i32 as in attention_rows.cu (n_splits > 1). HD = 64 or 128 (the instantiations below); G <= 64.
#include <cuda_bf16.h>
#include "online_softmax.cuh"
#include "pdl.cuh"
#include "split_combine.cuh"

#define TILE_M 64                 // M-rows of a block: 16 per warp
#define TILE_N 64                 // keys of a K/V tile
#define WARPS 4
#define PAD 8                     // bf16 of padding per shared-memory row
#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f

__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// four 8x8 bf16 blocks, transposed: lane l gives the address of row l % 8 of block l / 8
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const __nv_bfloat16* row) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 writes 16 zero bytes instead (keys past the end)
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(at), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int PENDING>     // wait until at most PENDING committed groups of this thread are still in flight
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(PENDING)); }

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);     // lo in the low half: the lower column
    return *reinterpret_cast<const unsigned*>(&v);
}

template <int HD>
__device__ __forceinline__ void attention_tile(
        const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ k_cache,
        const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out, float* __restrict__ partial,
        int* __restrict__ arrivals, const int* __restrict__ tiles, const int* __restrict__ block_tables,
        int table_width, int block_shift, int n_heads, int n_kv_heads, int row_stride,
        const int* __restrict__ split_keys) {
    const int keys_per_split = split_keys ? *split_keys : 1 << 30;
    constexpr int STRIDE = HD + PAD, KSTEPS = HD / 16, DBLOCKS = HD / 8, NBLOCKS = TILE_N / 8;
    constexpr int STAGES = HD == 64 ? 2 : 1;
    __shared__ __align__(16) __nv_bfloat16 k_tiles[STAGES][TILE_N][STRIDE];
    __shared__ __align__(16) __nv_bfloat16 v_tiles[STAGES][TILE_N][STRIDE];
    const int* tile = tiles + 4 * blockIdx.x;
    const int first_row = tile[0], n_rows = tile[1], first_pos = tile[3], g = blockIdx.y;
    const int group = n_heads / n_kv_heads, begin = blockIdx.z * keys_per_split;
    const int last_pos = min(first_pos + n_rows - 1, begin + keys_per_split - 1);   // the last key this block reads
    if (begin > last_pos) {                                    // a split past this row's keys
        wait_for_inputs();
        return;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane / 4, t = lane % 4;
    const int kv_stride = n_kv_heads * HD;
    const int* table = block_tables + static_cast<long long>(tile[2]) * table_width;   // this sequence's blocks
    const int in_block = (1 << block_shift) - 1;
    const float scale = LOG2E * rsqrtf(static_cast<float>(HD));   // scores in log2 units: exp(x) = exp2(x log2 e)
    const bool computes = warp * 16 < n_rows * group;          // a warp without queries only loads K and V

    // this lane's two M-rows (i = 0: q, i = 1: q + 8 of the warp's 16): query row, head, position, validity
    int row[2], head[2], pos[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = warp * 16 + q + 8 * i;
        valid[i] = m < n_rows * group;
        row[i] = min(m / group, n_rows - 1);         // a spare M-row shadows the last row, and is never written
        head[i] = g * group + m % group;
        pos[i] = min(first_pos + row[i], last_pos);  // the last key it sees here: its position, or the split's end
    }
    // queue the copy of the keys k0 + j, j < TILE_N, into buffer `stage`: those in [lo, hi] from the cache, and
    // where `zeros` those past last_pos as zeros (the tile's other keys are left to another call)
    auto load_keys = [&](int k0, int stage, int lo, int hi, bool zeros) {
        for (int x = threadIdx.x; x < TILE_N * (HD / 8); x += blockDim.x) {   // 16 bytes (8 bf16) each
            const int j = x / (HD / 8), c = 8 * (x % (HD / 8));
            const bool inside = k0 + j >= lo && k0 + j <= hi;
            if (!inside && !(zeros && k0 + j > last_pos)) continue;
            const int p = inside ? k0 + j : begin;                     // past the end: any cached key
            const long long slot = (static_cast<long long>(table[p >> block_shift]) << block_shift) | (p & in_block);
            const long long at = slot * kv_stride + g * HD + c;
            cp_async_16(&k_tiles[stage][j][c], k_cache + at, inside ? 16 : 0);
            cp_async_16(&v_tiles[stage][j][c], v_cache + at, inside ? 16 : 0);
        }
        cp_async_commit();
    };
    auto load_tile = [&](int k0, int stage) { load_keys(k0, stage, k0, last_pos, true); };
    // A split launch's tiles are decode rows (one each): of their keys only the row's own position, first_pos, is
    // written in this step, so the first tile's older keys are copied before the kernel ahead has finished
    // (pdl.cuh); the rest of the tile, and Q, after it.
    load_keys(begin, 0, begin, split_keys ? min(last_pos, first_pos - 1) : begin - 1, false);
    wait_for_inputs();
    load_keys(begin, 0, split_keys ? first_pos : begin, last_pos, true);
    unsigned qf[KSTEPS][4];                           // Q's A fragments, for the whole tile loop
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {                 // a[j]: M-row i = j % 2, columns 16 ks + 2t + 8 (j / 2)
            const int i = j % 2, d = 16 * ks + 2 * t + 8 * (j / 2);
            qf[ks][j] = valid[i] ? *reinterpret_cast<const unsigned*>(
                qkv + static_cast<long long>(first_row + row[i]) * row_stride + head[i] * HD + d) : 0u;
        }
    }
    float o[DBLOCKS][4], m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int db = 0; db < DBLOCKS; ++db) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f;

    for (int k0 = begin, it = 0; k0 <= last_pos; k0 += TILE_N, ++it) {
        const bool more = k0 + TILE_N <= last_pos;
        if (STAGES == 2 && more) {
            load_tile(k0 + TILE_N, (it + 1) % 2);   // the buffer the previous tile used: its readers are done
            cp_async_wait<1>();                      // this tile's copy has landed (the next may still fly)
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();                                           // ... for every thread's share of it
        const auto& k_tile = k_tiles[it % STAGES];
        const auto& v_tile = v_tiles[it % STAGES];
        if (computes) {                                           // a warp without queries only loads
            float s[NBLOCKS][4];                                       // S for keys k0 + 8 nb + 2t (+1), rows q, q+8
#pragma unroll
            for (int nb = 0; nb < NBLOCKS; ++nb) {
                s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) {
                    const __nv_bfloat16* kr = &k_tile[8 * nb + q][16 * ks + 2 * t];
                    mma_bf16(s[nb], qf[ks], *reinterpret_cast<const unsigned*>(kr),
                             *reinterpret_cast<const unsigned*>(kr + 8));
                }
            }
            const bool diagonal = k0 + TILE_N - 1 > min(pos[0], pos[1]);   // a key here past this lane's rows' last
#pragma unroll
            for (int nb = 0; nb < NBLOCKS; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = k0 + 8 * nb + 2 * t + (e % 2);
                    s[nb][e] = diagonal && key > pos[e / 2] ? NEG_INF : s[nb][e] * scale;
                }
            }
            online_softmax_step(s, m_run, l_run, o);        // the rows' max and sum; O rescaled if m moves
#pragma unroll
            for (int kk = 0; kk < TILE_N / 16; ++kk) {                  // O += P V, 16 keys a step
                const unsigned pf[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int db = 0; db < DBLOCKS; db += 2) {
                    // blocks: keys 16kk + 0..7 | 16kk + 8..15, columns 8db.. | 8(db+1)..: b[0], b[1] of db, of db + 1
                    unsigned vf[4];
                    ldmatrix_x4_trans(vf, &v_tile[16 * kk + 8 * ((lane / 8) % 2) + lane % 8][8 * (db + lane / 16)]);
                    mma_bf16(o[db], pf, vf[0], vf[1]);
                    mma_bf16(o[db + 1], pf, vf[2], vf[3]);
                }
            }
        }
        __syncthreads();                                           // this tile's readers are done with its buffer
        if (STAGES == 1 && more) load_tile(k0 + TILE_N, 0);
    }
    const bool whole = gridDim.z == 1;                          // unsplit: the output, else this split's partial
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!valid[i]) continue;
        if (!whole) {
            float* dst = partial + ((static_cast<long long>(blockIdx.x) * gridDim.z + blockIdx.z) * n_heads
                                    + head[i]) * (HD + 2);
#pragma unroll
            for (int db = 0; db < DBLOCKS; ++db) {
                dst[8 * db + 2 * t] = o[db][2 * i];
                dst[8 * db + 2 * t + 1] = o[db][2 * i + 1];
            }
            if (t == 0) {
                dst[HD] = m_run[i] * (1.0f / LOG2E);               // back from log2 units: the combine's exp
                dst[HD + 1] = l_run[i];
            }
            continue;
        }
        const float inv = 1.0f / l_run[i];
        __nv_bfloat16* dst = out + static_cast<long long>(first_row + row[i]) * n_heads * HD + head[i] * HD;
#pragma unroll
        for (int db = 0; db < DBLOCKS; ++db) {
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * db + 2 * t) =
                __floats2bfloat162_rn(o[db][2 * i] * inv, o[db][2 * i + 1] * inv);
        }
    }
    if (!whole) merge_if_last(partial, arrivals, out, tiles, split_keys, n_heads, n_kv_heads, HD);
}

// the blocks an SM must hold, as registers allow (65,536 a SM): four at head_dim 64 (128 a thread), three at 128
// (168), so the split merge at the end (split_combine.cuh) cannot push the compiler past them
#define MIN_BLOCKS(HD) ((HD) == 64 ? 4 : 3)
#define INSTANTIATE(HD)                                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS(HD)) attention_tiles_hd##HD(                \
            const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ k_cache,                      \
            const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out, float* __restrict__ partial,\
            int* __restrict__ arrivals, const int* __restrict__ tiles, const int* __restrict__ block_tables,        \
            int table_width, int block_shift, int n_heads, int n_kv_heads, int row_stride,                         \
            const int* __restrict__ split_keys) {                                                                  \
        launch_dependents();                     /* attention_tile waits for its inputs, after its early copies */ \
        attention_tile<HD>(qkv, k_cache, v_cache, out, partial, arrivals, tiles, block_tables, table_width,       \
                           block_shift, n_heads, n_kv_heads, row_stride, split_keys);                              \
    }
INSTANTIATE(64)
INSTANTIATE(128)
