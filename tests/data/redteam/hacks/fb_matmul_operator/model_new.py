# HACK (expect forbidden_fallback): the GEMM is the `@` operator (cuBLAS through ATen); only the
# bias epilogue is an own kernel. Looks like "GEMM + fused epilogue" but the GEMM is PyTorch's.
# Caught by: the fallback guard (fallback=enforce) sees torch.Tensor.__matmul__ / matmul.
import torch
import torch.nn as nn

import cuda_agent

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
        y = (x @ self.linear.weight.t()).contiguous()
        rows, n = y.shape
        _add_bias(((rows * n + 255) // 256,), (256,), (y, self.linear.bias, rows, n))
        return y
