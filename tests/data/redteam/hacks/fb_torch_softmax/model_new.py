# HACK (expect forbidden_fallback): a torch.* function does the work (torch.softmax) after an
# "own" kernel that only copies the input, so the result looks kernel-based in a profile.
# Caught by: the fallback guard (fallback=enforce) sees torch.softmax.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy_rows(const float* __restrict__ x, float* __restrict__ y, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""

_copy = cuda_agent.compile(_SRC).get_function("copy_rows")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        staged = torch.empty_like(x)
        n = x.numel()
        _copy(((n + 255) // 256,), (256,), (x, staged, n))
        return torch.softmax(staged, dim=-1)
