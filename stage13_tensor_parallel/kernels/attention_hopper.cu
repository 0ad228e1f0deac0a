// attention_hopper.cu: causal GQA attention of prompt tiles on Hopper's own pipeline (sm_90a; head_dim 64 and 128):
// the online softmax of attention_tiles.cu (the recurrence and its proof are in attention_rows.cu), with both
// matrix products on warpgroup MMA and the K/V tiles brought by the tensor memory accelerator into a ring of
// shared-memory stages, which mbarriers pass between a producer and two or three consumer warpgroups.
//
//   S = Q K^T / sqrt(hd)   per consumer warpgroup: 64 M-rows x TILE_N keys, hd / 16 wgmma m64n{TILE_N}k16 (Q from
//                          registers); TILE_N 128 at head_dim 64, 64 at 128
//   mask S[m, j] = -inf where key j > the position of M-row m          (only tiles that reach past a row)
//   m_new = max(m, rowmax S);  P = exp(S - m_new);  l = exp(m - m_new) l + rowsum P;  O = exp(m - m_new) O + P V
//   O += P V               TILE_N / 16 wgmma m64n{hd}k16, P from registers (S's accumulator, rounded to bf16)
//   after the last tile: out = O / l
//
// A block owns a tile of TILE_M M-rows, 64 for each of its consumer warpgroups, each M-row a (query row, query
// head) pair of K/V head g's group, row-major in the group (M-row m = query row m / G, head g G + m % G: TILE_M / G
// consecutive query rows of one chunk), as in attention_tiles.cu but taller. Its threads are specialised:
//
//   the first warp after them (the producer): for the block's u-th key tile (u = 0, 1, .. from the first of its
//     piece: below) it waits until stage u % STAGES is empty, tells the stage's `full` barrier how many bytes are
//     coming, and issues the TMA copies of the tile's keys and values
//   warps 0-3, 4-7 (and 8-11): the consumer warpgroups, M-rows 0-63, 64-127 (and 128-191): wait until stage
//     u % STAGES is full, compute S, the softmax and O += P V, then arrive on the stage's `empty` barrier (one
//     arrival a warp),
//
// so the copies of tile j + 1 are in flight while tile j is multiplied. Nothing but the barriers orders the two
// sides: no __syncthreads() after the start.
//
// Head_dim 64: three consumer warpgroups (TILE_M 192) and 128-key tiles. A warpgroup's own steps are serial (S,
// its softmax, P V, each waiting for the one before), so the tensor cores work only while another warpgroup has a
// product to issue: a third is a third that can. 128 keys a tile halve what comes once a tile (the waits for the
// products, the maximum's and sum's shuffles, the barriers), but S then holds 64 floats a thread, and 13 warps
// (three warpgroups and a producer warp) would get 128 registers each (four warps on some sub-partition's 16,384).
// So the producer is a whole warpgroup that keeps 24 registers a thread (setmaxnreg) and the consumers take 160:
// 16 warps, 128 x 24 + 384 x 160 = 64,512 of the SM's 65,536 (setmaxnreg counts in eights: 168 would not fit).
// Head_dim 128: two consumer warpgroups, 64-key tiles, one producer warp: O alone is 64 registers.
//
// The cache is paged: the keys of positions p .. p + BS - 1 (a whole block of seq_slot b, BS = 1 << block_shift)
// sit in consecutive cache slots block_tables[b][p / BS] * BS ... The tensor map (tma.py) views one layer's K (or
// V) as a 3-D tensor (head_dim, nkv, slots) with a box of (64, 1, ROWS), ROWS = min(BS, 64): one copy moves ROWS
// keys of one head, 64 dims of each, so a tile is TILE_N / ROWS copies (x hd / 64) from anywhere in the pool.
// Each lands at a multiple of 1,024 bytes (ROWS >= 8: the engine takes attention_tiles.cu for smaller blocks), the
// swizzle's period. Copies past the tile's last key are not made; the rows of V past it, stale or never written,
// are zeroed by the consumers before P V reads them (P is 0 there, but 0 * NaN is not 0), and S is set to -inf
// there whatever K held.
//
// A launch's last wave may hold fewer blocks than the GPU has SMs: in a chunk deep into a long prompt every tile
// reads about as many keys, so the SMs the last wave leaves idle wait for a whole tile's time. The launch then
// splits its last tiles by keys into `parts` pieces (packing.split_tail): piece z of a tile runs the recurrence over
// its own key tiles only (the last piece holds the diagonal), leaves (O, m, l) of every M-row in `partial`, and the
// last piece of the tile to finish merges them, as split_combine.cuh merges a decode row's splits:
//     O = sum_z 2^((m_z - M) scale) O_z,   l = sum_z 2^((m_z - M) scale) l_z,   M = max_z m_z,   out = O / l
// Each consumer thread writes its own registers (its fragment of O, its two rows' m and l) and the merging block's
// same thread reads the other pieces' same places: the record needs no layout of its own.
//
// Launch: grid (nkv, n_pieces), block 512 (head_dim 64) or 288 (128), dynamic shared memory STAGES * 2 * TILE_N *
// hd * 2 bytes + 1 KiB (the stages aligned to 1,024 bytes; STAGES 2 at head_dim 64, 3 at 128). pieces (n_pieces, 8)
// i32: first row, n_rows (<= TILE_M / G), seq_slot, first position, first and end key tile, merge slot (-1: a
// whole tile, which writes out itself), part z; the tiles' K/V are in the cache (rope_kv_write ran first). partial
// (slots, nkv, parts, RECORD, CONSUMERS) f32 and arrivals (slots, nkv) i32, zero between launches, for split tiles.
// qkv (R, row_stride) bf16 (queries = the first nh heads, RoPE applied); kv_maps: this layer's two 128-byte tensor
// maps, K then V, in global memory; block_tables (B, table_width) i32; out (R, nh hd) bf16, the tiles' rows
// written. G <= 32.
#include <cuda_bf16.h>
#include "hopper.cuh"
#include "online_softmax.cuh"
#include "pdl.cuh"

#define BOX_ROWS 64               // a TMA copy's keys at most (tma.py's box)
#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f

template <int HD> constexpr int warpgroups = HD == 64 ? 3 : 2;   // consumer warpgroups (kernels.py's HOPPER_TILE_M)
template <int HD> constexpr int consumers = 128 * warpgroups<HD>;  // their threads
// the producer: a whole warpgroup at head_dim 64, so that setmaxnreg (a warpgroup's instruction) can hand its
// registers to the consumers; one warp at 128 (kernels.py's launch: 2 TILE_M + 128 or 32 threads)
template <int HD> constexpr int producers = HD == 64 ? 128 : 32;
template <int HD> constexpr int threads = consumers<HD> + producers<HD>;
#define PRODUCER_REGISTERS 24     // head_dim 64: what the producer warpgroup keeps (setmaxnreg's least)
#define CONSUMER_REGISTERS 160    // and what each consumer thread then gets: 128 x 24 + 384 x 160 <= 65,536
template <int HD> constexpr int tile_n = HD == 64 ? 128 : 64;      // keys of a K/V tile (kernels.py's HOPPER_TILE_N)

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);     // lo in the low half: the lower column
    return *reinterpret_cast<const unsigned*>(&v);
}

template <int HD> constexpr int record = HD / 8 * 4 + 4;        // a consumer thread's piece of a split: O, m, l

// A piece of a split tile: leave this thread's (O, m, l) in piece z's record, count the piece in, and if it is the
// last of the tile's `parts` to finish, merge every piece's record into o and l (returns true: write out) against
// the largest m. Called by every consumer thread (barrier 1 is theirs; the producer has returned).
template <int HD>
__device__ __forceinline__ bool merge_pieces(float (&o)[HD / 8][4], float (&m)[2], float (&l)[2],
                                             float* __restrict__ partial, int* __restrict__ arrivals, int slot,
                                             int g, int n_kv_heads, int z, int parts, float scale) {
    constexpr int CONSUMERS = consumers<HD>, RECORD = record<HD>;
    __shared__ bool last;
    const int tid = threadIdx.x;
    // (slot, g, z): RECORD values a thread, value e of every thread together (each store a warp's 128 bytes)
    float* base = partial + static_cast<long long>(slot * n_kv_heads + g) * parts * RECORD * CONSUMERS;
    float* mine = base + static_cast<long long>(z) * RECORD * CONSUMERS + tid;
#pragma unroll
    for (int db = 0; db < HD / 8; ++db) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * db + e) * CONSUMERS] = o[db][e];
    }
    mine[(RECORD - 4) * CONSUMERS] = m[0], mine[(RECORD - 3) * CONSUMERS] = m[1];
    mine[(RECORD - 2) * CONSUMERS] = l[0], mine[(RECORD - 1) * CONSUMERS] = l[1];
    __threadfence();                                  // this thread's record, visible before the count below
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
    int* count = arrivals + slot * n_kv_heads + g;
    if (tid == 0) last = atomicAdd(count, 1) == parts - 1;
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
    if (!last) return false;
    __threadfence();                                  // the other pieces' counts seen: their records are too
    float big[2] = {m[0], m[1]};
    for (int y = 0; y < parts; ++y) {
        const float* rec = base + static_cast<long long>(y) * RECORD * CONSUMERS + tid;
        big[0] = fmaxf(big[0], __ldcg(rec + (RECORD - 4) * CONSUMERS));
        big[1] = fmaxf(big[1], __ldcg(rec + (RECORD - 3) * CONSUMERS));
    }
    // in piece order, this piece's own record read back like the others': the same bits whichever piece merges
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = 0.0f;
#pragma unroll
    for (int db = 0; db < HD / 8; ++db) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f;
    for (int y = 0; y < parts; ++y) {
        const float* rec = base + static_cast<long long>(y) * RECORD * CONSUMERS + tid;
        float a[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {                // m of every piece is finite: each holds a key of every row
            a[i] = exp2f((__ldcg(rec + (RECORD - 4 + i) * CONSUMERS) - big[i]) * scale);
            l[i] += a[i] * __ldcg(rec + (RECORD - 2 + i) * CONSUMERS);
        }
#pragma unroll
        for (int db = 0; db < HD / 8; ++db) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[db][e] += a[e / 2] * __ldcg(rec + (4 * db + e) * CONSUMERS);
        }
    }
    if (tid == 0) *count = 0;                         // every piece has counted: ready for the next launch
    return true;
}

template <int HD>
__device__ __forceinline__ void attention_hopper(
        const __nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ out, const unsigned long long* kv_maps,
        const int* __restrict__ pieces, const int* __restrict__ block_tables, int table_width, int block_shift,
        int n_heads, int n_kv_heads, int row_stride, float* __restrict__ partial, int* __restrict__ arrivals,
        int parts) {
    constexpr int TILE_N = tile_n<HD>, CHUNKS = HD / 64, KSTEPS = HD / 16, DBLOCKS = HD / 8, NBLOCKS = TILE_N / 8;
    constexpr int STAGES = HD == 64 ? 2 : 3;                    // tiles in flight (kernels.py's HOPPER_STAGES)
    constexpr int CONSUMERS = consumers<HD>;
    constexpr int CHUNK_BYTES = TILE_N * 128;                    // a tile's 64-column chunk: TILE_N rows of 128 B
    constexpr int STAGE_BYTES = 2 * CHUNKS * CHUNK_BYTES;        // K, then V
    extern __shared__ unsigned char smem_raw[];
    __shared__ unsigned long long full[STAGES], empty[STAGES];
    unsigned char* stages = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);   // 1,024-byte aligned
    // a tile's K/V heads are consecutive blocks, and the tiles come longest first (plan_attention): blocks start
    // about in launch order, so the last wave is the shortest tiles of every head, not the longest of the last head
    const int* tile = pieces + 8 * blockIdx.y;
    const int first_row = tile[0], n_rows = tile[1], first_pos = tile[3], g = blockIdx.x;
    const int group = n_heads / n_kv_heads, last_pos = first_pos + n_rows - 1;
    const int kt_begin = tile[4], kt_end = tile[5], slot = tile[6];   // this piece's key tiles [kt_begin, kt_end)
    // the warp's index through a shuffle: the compiler then knows it is the same in every lane, so the branches
    // on it below are not divergent and it need not serialise the wgmma instructions behind them
    const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0), lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);                    // the producer's arrival, with the bytes it expects
            mbar_init(&empty[s], CONSUMERS / 32);      // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= CONSUMERS / 32) {                      // ---- the producer
        if constexpr (producers<HD> == 128) registers_release<PRODUCER_REGISTERS>();
        if (warp != CONSUMERS / 32 || lane != 0) return;
        const int rows = min(1 << block_shift, BOX_ROWS), in_block = (1 << block_shift) - 1;
        const int* table = block_tables + static_cast<long long>(tile[2]) * table_width;
        const unsigned long long* k_map = kv_maps;
        const unsigned long long* v_map = kv_maps + 16;
        tensormap_acquire(k_map);
        tensormap_acquire(v_map);
        for (int j = kt_begin; j < kt_end; ++j) {
            const int u = j - kt_begin, s = u % STAGES, k0 = j * TILE_N;   // u: the piece's own count, its stage
            mbar_wait(&empty[s], ((u / STAGES) & 1) ^ 1);  // a fresh barrier's "previous" phase counts as done
            const int copies = (min(TILE_N, last_pos + 1 - k0) + rows - 1) / rows;
            mbar_arrive_expect_tx(&full[s], copies * rows * HD * 2 * 2);
            unsigned char* k_tile = stages + s * STAGE_BYTES;
            for (int c = 0; c < copies; ++c) {
                const int p = k0 + c * rows;
                const int slot = (table[p >> block_shift] << block_shift) | (p & in_block);
#pragma unroll
                for (int h = 0; h < CHUNKS; ++h) {
                    tma_load_3d(k_tile + h * CHUNK_BYTES + c * rows * 128, k_map, 64 * h, g, slot, &full[s]);
                    tma_load_3d(k_tile + (CHUNKS + h) * CHUNK_BYTES + c * rows * 128, v_map, 64 * h, g, slot,
                                &full[s]);
                }
            }
        }
        return;
    }

    // ---- a consumer: warpgroup c, its warp w (16 M-rows), lane (q, t) as in mma.sync's fragments
    if constexpr (producers<HD> == 128) registers_claim<CONSUMER_REGISTERS>();
    const int c = warp / 4, w = warp % 4, q = lane / 4, t = lane % 4;
    const float scale = LOG2E * rsqrtf(static_cast<float>(HD));   // scores in log2 units: exp(x) = exp2(x log2 e)
    int row[2], head[2], pos[2];                       // this lane's two M-rows: q and q + 8 of the warp's 16
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = 64 * c + 16 * w + q + 8 * i;
        valid[i] = m < n_rows * group;
        row[i] = min(m / group, n_rows - 1);           // a spare M-row shadows the last row, and is never written
        head[i] = g * group + m % group;
        pos[i] = first_pos + row[i];
    }
    unsigned qf[KSTEPS][4];                            // Q as wgmma's A operand, for the whole loop
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {                  // a[e]: M-row e % 2, columns 16 ks + 2t + 8 (e / 2)
            const int i = e % 2, d = 16 * ks + 2 * t + 8 * (e / 2);
            qf[ks][e] = valid[i] ? *reinterpret_cast<const unsigned*>(
                qkv + static_cast<long long>(first_row + row[i]) * row_stride + head[i] * HD + d) : 0u;
        }
    }
    float o[DBLOCKS][4], m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int db = 0; db < DBLOCKS; ++db) o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f;

    // Tiles whose keys all come at or before the block's first position need no mask for any of its rows: every
    // tile left of the diagonal. The step is written once and run by two loops, the first with `diagonal` false:
    // inlined, that loop holds no compare or select of the mask (as a lane's `if`, the compiler makes the mask
    // selects on every score of every tile), nor the zeroing of V's stale rows, which only the last tile needs.
    auto step = [&](int j, bool diagonal) {
        const int u = j - kt_begin, s = u % STAGES, k0 = j * TILE_N;
        unsigned char* k_tile = stages + s * STAGE_BYTES;
        unsigned char* v_tile = k_tile + CHUNKS * CHUNK_BYTES;
        mbar_wait(&full[s], (u / STAGES) & 1);

        float sc[NBLOCKS][4];                          // S for keys k0 + 8 nb + 2t (+1), rows q, q + 8
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {          // 16 dims a step: chunk ks / 4, 32 bytes into its rows
            const unsigned long long b = smem_desc(k_tile + (ks / 4) * CHUNK_BYTES + (ks % 4) * 32, 16, 1024);
            if constexpr (TILE_N == 64) {
                wgmma_m64n64k16<0>(sc, qf[ks], b, ks > 0);
            } else {
                wgmma_m64n128k16<0>(sc, qf[ks], b, ks > 0);
            }
        }
        wgmma_commit();
        wgmma_wait_all();
        wgmma_settle(sc);

        if (diagonal) {
#pragma unroll
            for (int nb = 0; nb < NBLOCKS; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = k0 + 8 * nb + 2 * t + (e % 2);
                    if (key > pos[e / 2]) sc[nb][e] = NEG_INF;
                }
            }
        }
        online_softmax_step(sc, m_run, l_run, o, scale);      // the rows' max and sum; O rescaled if m moves

        const int n_valid = min(TILE_N, last_pos + 1 - k0);
        if (diagonal && n_valid < TILE_N) {            // V past the last key: zeros, 16 bytes a thread, the rows
            for (int x = threadIdx.x; x < (TILE_N - n_valid) * CHUNKS * 8; x += CONSUMERS) {   // shared by all
                const int r = n_valid + x / (CHUNKS * 8), chunk = x % (CHUNKS * 8);               // warpgroups
                uint4* at = reinterpret_cast<uint4*>(v_tile + (chunk / 8) * CHUNK_BYTES + r * 128 + (chunk % 8) * 16);
                *at = make_uint4(0, 0, 0, 0);
            }
            fence_async_shared();                      // visible to wgmma (the async proxy), once every consumer
            asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");   // has written its share (barrier 1)
        }
        unsigned pf[TILE_N / 16][4];                   // P as wgmma's A operand: S's registers, in bf16, 16 keys
#pragma unroll                                         // a step (written before the fence, which orders them)
        for (int kk = 0; kk < TILE_N / 16; ++kk) {
            pf[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
            pf[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
            pf[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pf[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < TILE_N / 16; ++kk) {     // O += P V, 16 keys a step: V rows 16 kk .. 16 kk + 15
            const unsigned long long b = smem_desc(v_tile + kk * 16 * 128, CHUNK_BYTES, 1024);
            if constexpr (HD == 64) {
                wgmma_m64n64k16<1>(o, pf[kk], b, 1);
            } else {
                wgmma_m64n128k16<1>(o, pf[kk], b, 1);
            }
        }
        wgmma_commit();
        wgmma_wait_all();
        wgmma_settle(o);
        if (lane == 0) mbar_arrive(&empty[s]);         // this warp is done with stage s
    };
    const int n_unmasked = min(kt_end, (first_pos + 1) / TILE_N);   // key tiles left of the diagonal
    for (int j = kt_begin; j < n_unmasked; ++j) step(j, false);
    for (int j = max(kt_begin, n_unmasked); j < kt_end; ++j) step(j, true);

    if (slot >= 0 && !merge_pieces<HD>(o, m_run, l_run, partial, arrivals, slot, g, n_kv_heads, tile[7], parts,
                                       scale))
        return;                                      // a piece of a split tile, not the last to finish
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!valid[i]) continue;
        const float inv = 1.0f / l_run[i];
        __nv_bfloat16* dst = out + static_cast<long long>(first_row + row[i]) * n_heads * HD + head[i] * HD;
#pragma unroll
        for (int db = 0; db < DBLOCKS; ++db) {
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * db + 2 * t) =
                __floats2bfloat162_rn(o[db][2 * i] * inv, o[db][2 * i + 1] * inv);
        }
    }
}

#define INSTANTIATE(HD)                                                                                            \
    extern "C" __global__ void __launch_bounds__(threads<HD>) attention_hopper_hd##HD(                                 \
            const __nv_bfloat16* __restrict__ qkv, __nv_bfloat16* __restrict__ out,                                \
            const unsigned long long* kv_maps, const int* __restrict__ pieces,                                     \
            const int* __restrict__ block_tables, int table_width, int block_shift, int n_heads, int n_kv_heads,   \
            int row_stride, float* __restrict__ partial, int* __restrict__ arrivals, int parts) {                  \
        begin_after_previous();                                                                                    \
        attention_hopper<HD>(qkv, out, kv_maps, pieces, block_tables, table_width, block_shift, n_heads,          \
                             n_kv_heads, row_stride, partial, arrivals, parts);                                    \
    }
INSTANTIATE(64)
INSTANTIATE(128)
