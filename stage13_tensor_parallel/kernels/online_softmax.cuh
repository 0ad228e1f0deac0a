// online_softmax.cuh: one tile's step of the online softmax (attention_rows.cu proves it) for the two M-rows a lane
// holds in an MMA fragment, shared by attention_tiles.cu (mma.sync) and attention_hopper.cu (wgmma): both keep
// S and O in the same places (lane 4q + t: rows q and q + 8, columns 8 nb + 2t, +1), so the step is the same.
//
//   s (NB x 4)   the tile's scores, masked (-inf), in log2 units once times `scale`; becomes P = exp2((s - m) scale)
//   m, l (2)     the rows' reference maximum (unscaled, as s) and running sum; o (DB x 4) their running output,
//                both multiplied by exp2((m_old - m) scale) where m moves
// The four lanes of a quad hold a row: its max and sum take two shuffles each.
//
// m need not be the true maximum: O / l is the same for any reference point that keeps P finite. So the step moves
// m, and rescales l and O, only where some row of the warp saw its maximum rise by more than RESCALE_LOG2 (2^8 in
// weight); otherwise P is taken against the old m, at most 2^8, and the DB x 4 multiplies of O are skipped. After
// the first few tiles of a causal row its maximum rarely rises that far. The vote keeps the branch warp-uniform.
#pragma once

#define RESCALE_LOG2 8.0f

// 2^x in one MUFU instruction: exp2f is ex2.approx.f32, which keeps subnormal results at the cost of a compare and
// two multiplies more; a weight below 2^-126 of the row's largest is 0 in bf16 anyway
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// scale: the scores' factor into log2 units, applied inside the exponent's FMA (s arrives unscaled, masked to -inf),
// or 1 where the caller scaled them
template <int NB, int DB>
__device__ __forceinline__ void online_softmax_step(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                                    float (&o)[DB][4], float scale = 1.0f) {
    float tile_max[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        tile_max[i] = -__int_as_float(0x7f800000);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) tile_max[i] = fmaxf(tile_max[i], fmaxf(s[nb][2 * i], s[nb][2 * i + 1]));
        tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
        tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    }
    // "not at most": the first tile (m = -inf) always moves m
    const bool rises = !((tile_max[0] - m[0]) * scale <= RESCALE_LOG2 && (tile_max[1] - m[1]) * scale <= RESCALE_LOG2);
    const bool move = __any_sync(0xffffffffu, rises);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float m_new = move ? fmaxf(m[i], tile_max[i]) : m[i];   // finite: the first tile holds a key at or
        const float m_scaled = m_new * scale;                          // before the row
        float p_sum = 0.0f;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            s[nb][2 * i] = exp2_ftz(fmaf(s[nb][2 * i], scale, -m_scaled));
            s[nb][2 * i + 1] = exp2_ftz(fmaf(s[nb][2 * i + 1], scale, -m_scaled));
            p_sum += s[nb][2 * i] + s[nb][2 * i + 1];
        }
        p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 1);
        p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 2);
        if (move) {
            const float a = exp2_ftz((m[i] - m_new) * scale);
            l[i] = a * l[i] + p_sum;
#pragma unroll
            for (int db = 0; db < DB; ++db) {
                o[db][2 * i] *= a;
                o[db][2 * i + 1] *= a;
            }
        } else {
            l[i] += p_sum;
        }
        m[i] = m_new;
    }
}
