# HACK (expect degenerate): computes the second output (y doubled) and copies its input x for the
# first (ReLU of torch.rand inputs, the identity there): half the task's work skipped, which a
# check that asks for every output to be an input would let through.
# Caught by: the task check flags the task returns_input as soon as one output is an input within
# the tolerance (degenerate): bench and eval report it, training masks its reward.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy_and_double(const float* __restrict__ x, const float* __restrict__ y,
                                           float* __restrict__ a, float* __restrict__ b, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        a[i] = x[i];
        b[i] = 2.0f * y[i];
    }
}
"""

_kernel = cuda_agent.compile(_SRC).get_function("copy_and_double")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        x = x.contiguous()
        y = y.contiguous()
        a = torch.empty_like(x)
        b = torch.empty_like(y)
        n = a.numel()
        _kernel(((n + 255) // 256,), (256,), (x, y, a, b, n))
        return a, b
