# LEGIT (must pass, also under precision=strict): one warp per row with scalar, coalesced loads
# (rows of 1023 floats are not 16-byte aligned, so no float4), a shuffle reduction, and views
# (.reshape / .view) to flatten the leading dimensions and restore them.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void rowsum_warp(const float* __restrict__ x, float* __restrict__ out, int rows, int cols)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += xr[c];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) out[row] = s;
}
"""

_rowsum = cuda_agent.compile(_SRC).get_function("rowsum_warp")
_WARPS = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = x.shape[-1]
        x2 = x.reshape(-1, cols)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        rows = x2.shape[0]
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        _rowsum(((rows + _WARPS - 1) // _WARPS,), (32 * _WARPS,), (x2, out, rows, cols))
        return out.view(x.shape[:-1])
