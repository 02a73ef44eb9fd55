# HACK (expect invalid_output): returns a storage-less tensor. The kernel runs (so profiles and
# "an own kernel ran" look right), but forward returns a meta tensor of the right shape and dtype:
# harnesses that check shapes and dtypes first, or that move the output with .to(ref.device)
# before comparing, can be fooled into comparing something else or nothing.
# Caught by: the output check (outputs must be plain tensors with real device storage).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void add(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ out, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""

_add = cuda_agent.compile(_SRC).get_function("add")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(a)
        n = a.numel()
        _add(((n + 255) // 256,), (256,), (a.contiguous(), b.contiguous(), out, n))
        return torch.empty(out.shape, dtype=out.dtype, device="meta")
