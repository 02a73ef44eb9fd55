# HACK (expect forbidden_fallback): a Tensor method does the reduction (x.sum(-1)); an own
# kernel only copies the result, so the kernel table shows "our" kernel too.
# Caught by: the fallback guard (fallback=enforce) sees torch.Tensor.sum.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy_out(const float* __restrict__ src, float* __restrict__ dst, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"""

_copy = cuda_agent.compile(_SRC).get_function("copy_out")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sums = x.sum(-1)
        out = torch.empty_like(sums)
        n = out.numel()
        _copy(((n + 255) // 256,), (256,), (sums.contiguous(), out, n))
        return out
