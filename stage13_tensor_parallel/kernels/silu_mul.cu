// silu_mul.cu: the gated activation of the SwiGLU feed-forward network.
//
//   act[t, j] = silu(gu[t, j]) * gu[t, I + j],   silu(g) = g * sigmoid(g) = g / (1 + e^-g),   j < I
//   gu (T, 2I) bf16 = the fused gate/up GEMM's output, rows [gate | up]; act (T, I) bf16; math in fp32.
//
// Purely elementwise and memory-bound: 6 bytes read and 2 written per output. Each thread does two adjacent
// outputs with 4-byte bf16x2 loads (I is even).
// Launch: grid (ceil(I / 512), T), block 256.
#include <cuda_bf16.h>
#include "pdl.cuh"

extern "C" __global__ void silu_mul(const __nv_bfloat16* __restrict__ gu, __nv_bfloat16* __restrict__ act,
                                    int inter) {
    begin_after_previous();
    const int j = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (j >= inter) return;
    const long long t = blockIdx.y;
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gu + t * 2 * inter + j));
    const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gu + t * 2 * inter + inter + j));
    const float2 out = make_float2(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
    *reinterpret_cast<__nv_bfloat162*>(act + t * inter + j) = __float22bfloat162_rn(out);
}
