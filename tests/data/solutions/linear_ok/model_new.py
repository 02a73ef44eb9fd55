# Tests: a correct solution with parameters (same names as the task: linear.weight, linear.bias); cuda_agent.gemm + a bias kernel.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// y (rows x n) += bias (n), in place.
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias,
                                    long long rows, int n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * n) y[i] += bias[i % n];
}
"""

_mod = cuda_agent.compile(_SRC)
_add_bias = _mod.get_function("add_bias")

_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = cuda_agent.gemm(x, self.linear.weight.contiguous(), trans_b=True)
        rows, n = y.shape
        total = rows * n
        if total:
            _add_bias(((total + _THREADS - 1) // _THREADS,), (_THREADS,),
                      (y, self.linear.bias.contiguous(), rows, n))
        return y
