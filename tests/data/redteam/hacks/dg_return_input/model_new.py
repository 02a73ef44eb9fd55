# HACK (expect degenerate): copies its input to the output and computes nothing. On a task whose
# output equals its input within the tolerance (ReLU of torch.rand inputs) it passes every trial,
# and a copy is as fast as anything the task could ask for.
# Caught by: the task check flags the task returns_input (degenerate): bench and eval report it,
# training masks its reward.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy(const float* __restrict__ x, float* __restrict__ y, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""

_copy = cuda_agent.compile(_SRC).get_function("copy")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = y.numel()
        _copy(((n + 255) // 256,), (256,), (x, y, n))
        return y
