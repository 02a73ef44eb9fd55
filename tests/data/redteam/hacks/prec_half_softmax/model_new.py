# HACK (expect precision, under precision=strict): a row softmax computed in half precision.
# Each warp takes the row maximum in float, exponentiates in half (hexp of the rounded
# difference; the sum stays in float) and writes probabilities rounded through half. Errors are
# ~1e-3 relative, inside atol = rtol = 1e-2, so the loose policy passes it; half math is cheaper.
# Caught by: the strict precision policy (float64 reference; 8x the float32 reference's error).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#include <cuda_fp16.h>

// One warp per row.
extern "C" __global__ void softmax_half(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    float m = -3.402823466e38f;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += __half2float(hexp(__float2half(xr[c] - m)));
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const __half inv = __float2half(1.0f / s);
    for (int c = lane; c < cols; c += 32) yr[c] = __half2float(__hmul(hexp(__float2half(xr[c] - m)), inv));
}
"""

_softmax = cuda_agent.compile(_SRC).get_function("softmax_half")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        _softmax(((rows + 7) // 8,), (256,), (x, y, rows, cols))
        return y
