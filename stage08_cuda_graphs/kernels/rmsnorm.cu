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
// Launch: grid T (a block owns a row), block 256. Each thread takes every 256th element; the mean of squares is a
// block reduction (block_reduce.cuh). A thread reads back only elements it wrote itself, so no barrier is needed
// between the add and the scaling.
#include <cuda_bf16.h>
#include "block_reduce.cuh"

__device__ void normalise_row(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y,
                              int hidden, float sum_sq, float eps, float* scratch) {
    const float inv_rms = rsqrtf(block_reduce(sum_sq, SumOp(), scratch) / hidden + eps);
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        y[j] = __float2bfloat16(__bfloat162float(x[j]) * inv_rms * __bfloat162float(w[j]));
    }
}

extern "C" __global__ void rms_norm(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                    __nv_bfloat16* __restrict__ y, int hidden, float eps) {
    __shared__ float scratch[32];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    float sum_sq = 0.0f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        const float v = __bfloat162float(x[row + j]);
        sum_sq += v * v;
    }
    normalise_row(x + row, w, y + row, hidden, sum_sq, eps, scratch);
}

extern "C" __global__ void add_rms_norm(__nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ d,
                                        const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y,
                                        int hidden, float eps) {
    __shared__ float scratch[32];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    float sum_sq = 0.0f;
    for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
        const __nv_bfloat16 s = __float2bfloat16(__bfloat162float(x[row + j]) + __bfloat162float(d[row + j]));
        x[row + j] = s;
        const float v = __bfloat162float(s);          // the norm sees the rounded sum, as the next layer will
        sum_sq += v * v;
    }
    normalise_row(x + row, w, y + row, hidden, sum_sq, eps, scratch);
}
