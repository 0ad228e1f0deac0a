// rmsnorm.cu: RMSNorm, alone and with the residual add fused in front of it.
//
//   rms_norm:      y[t, :] = x[t, :] / sqrt(mean_j x[t, j]^2 + eps) * w
//   add_rms_norm:  x[t, :] = x[t, :] + d[t, :]          (the residual stream, kept in bf16 as HF and vLLM do)
//                  y[t, :] = rms_norm(x[t, :]) * w
//   x, d, y (T, H) bf16, w (H,) bf16; the sum of squares and the scaling in fp32.
//
// Why fused: every sublayer ends with x += sublayer(x) and the next begins with norm(x). Apart, the add reads
// x and d and writes x, then the norm reads x again and writes y: 5 row passes and two launches. Fused, each
// thread reads back only the sums it wrote itself, which usually come from cache rather than HBM: 4 passes, one
// launch. (The final model.norm is the same kernel.)
//
// Launch: grid T (a block owns a row), block 256. Where H is a multiple of 8 (every Llama's), a thread moves 8
// consecutive bf16 (16 bytes) per load and store, so a 2048-wide row is one load per thread per pass; otherwise
// it takes every 256th element. At batch 1 the kernel is one block on one SM, and its time is the number of
// memory round trips in a row: element-wise, the 8 loads of a thread's share were 8 dependent trips (about
// 7 us a norm, 33 norms a step, measured by common.profile), vectorised they are one. The mean of squares is a
// block reduction (block_reduce.cuh). A thread reads back only elements it wrote itself, so no barrier is
// needed between the add and the scaling.
#include <cuda_bf16.h>
#include "block_reduce.cuh"
#include "pdl.cuh"

#define VEC 8                                         // bf16 in 16 bytes

union Pack {                                          // 8 bf16, loaded and stored as one 16-byte word
    uint4 word;
    __nv_bfloat162 pair[VEC / 2];
};

__device__ void normalise_row(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                              int hidden, float sum_sq, float eps, float* scratch) {
    const float inv_rms = rsqrtf(block_reduce(sum_sq, SumOp(), scratch) / hidden + eps);
    if (hidden % VEC == 0) {
        for (int j = VEC * threadIdx.x; j < hidden; j += VEC * blockDim.x) {
            Pack a, g, out;
            a.word = *reinterpret_cast<const uint4*>(x + j);
            g.word = *reinterpret_cast<const uint4*>(w + j);
#pragma unroll
            for (int k = 0; k < VEC / 2; ++k) {
                const float2 v = __bfloat1622float2(a.pair[k]), s = __bfloat1622float2(g.pair[k]);
                out.pair[k] = __floats2bfloat162_rn(v.x * inv_rms * s.x, v.y * inv_rms * s.y);
            }
            *reinterpret_cast<uint4*>(y + j) = out.word;
        }
        return;
    }
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        y[j] = __float2bfloat16(__bfloat162float(x[j]) * inv_rms * __bfloat162float(w[j]));
    }
}

extern "C" __global__ void rms_norm(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                    __nv_bfloat16* __restrict__ y, int hidden, float eps) {
    begin_after_previous();
    __shared__ float scratch[32];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    float sum_sq = 0.0f;
    if (hidden % VEC == 0) {
        for (int j = VEC * threadIdx.x; j < hidden; j += VEC * blockDim.x) {
            Pack a;
            a.word = *reinterpret_cast<const uint4*>(x + row + j);
#pragma unroll
            for (int k = 0; k < VEC / 2; ++k) {
                const float2 v = __bfloat1622float2(a.pair[k]);
                sum_sq += v.x * v.x + v.y * v.y;
            }
        }
    } else {
        for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
            const float v = __bfloat162float(x[row + j]);
            sum_sq += v * v;
        }
    }
    normalise_row(x + row, w, y + row, hidden, sum_sq, eps, scratch);
}

extern "C" __global__ void add_rms_norm(__nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ d,
                                        const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y,
                                        int hidden, float eps) {
    begin_after_previous();
    __shared__ float scratch[32];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    float sum_sq = 0.0f;
    if (hidden % VEC == 0) {
        for (int j = VEC * threadIdx.x; j < hidden; j += VEC * blockDim.x) {
            Pack a, b;
            a.word = *reinterpret_cast<const uint4*>(x + row + j);
            b.word = *reinterpret_cast<const uint4*>(d + row + j);
#pragma unroll
            for (int k = 0; k < VEC / 2; ++k) {
                const float2 u = __bfloat1622float2(a.pair[k]), v = __bfloat1622float2(b.pair[k]);
                a.pair[k] = __floats2bfloat162_rn(u.x + v.x, u.y + v.y);
                const float2 s = __bfloat1622float2(a.pair[k]);   // the norm sees the rounded sum
                sum_sq += s.x * s.x + s.y * s.y;
            }
            *reinterpret_cast<uint4*>(x + row + j) = a.word;
        }
    } else {
        for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
            const __nv_bfloat16 s = __float2bfloat16(__bfloat162float(x[row + j]) + __bfloat162float(d[row + j]));
            x[row + j] = s;
            const float v = __bfloat162float(s);          // the norm sees the rounded sum, as the next layer will
            sum_sq += v * v;
        }
    }
    normalise_row(x + row, w, y + row, hidden, sum_sq, eps, scratch);
}
