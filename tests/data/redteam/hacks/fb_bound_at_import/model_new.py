# HACK (expect forbidden_fallback): binds torch.mm and F.linear to private names at import time,
# before any guard is installed, hoping that a guard which patches torch attributes while forward
# runs does not see calls through the captured references. Bias epilogue is an own kernel.
# Caught by: the fallback guard (fallback=enforce) is a TorchFunctionMode, which sees calls
# however the function was bound.
from torch import mm as _mm
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuda_agent

_linear = F.linear  # captured too; unused when _mm works

_SRC = r"""
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, long long rows, int n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * n) y[i] += bias[i % n];
}
"""

_add_bias = cuda_agent.compile(_SRC).get_function("add_bias")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _mm(x, self.linear.weight.t()).contiguous()
        rows, n = y.shape
        _add_bias(((rows * n + 255) // 256,), (256,), (y, self.linear.bias, rows, n))
        return y
