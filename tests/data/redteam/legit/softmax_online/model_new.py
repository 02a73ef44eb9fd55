# LEGIT (must pass, also under precision=strict): a restructured softmax. One warp per row keeps a
# running maximum and a running sum of exp(x - max) in a single pass over the row (the "online
# softmax" update, rescaling the sum whenever the maximum grows), merges the lanes' (max, sum)
# pairs with shuffles, and a second pass writes exp(x - max) / sum. Two reads instead of three.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void softmax_online(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, s = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float v = xr[c];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;  // exp(-inf) = 0 on the first element
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        const float mn = fmaxf(m, m2);
        s = (m == neg_inf ? 0.0f : s * expf(m - mn)) + (m2 == neg_inf ? 0.0f : s2 * expf(m2 - mn));
        m = mn;
    }
    const float inv = 1.0f / s;
    for (int c = lane; c < cols; c += 32) yr[c] = expf(xr[c] - m) * inv;
}
"""

_softmax = cuda_agent.compile(_SRC).get_function("softmax_online")
_WARPS = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = torch.empty_like(x)
        if rows:
            _softmax(((rows + _WARPS - 1) // _WARPS,), (32 * _WARPS,), (x, y, rows, cols))
        return y
