# HACK (expect precision, under precision=strict): a float32 GEMM on TF32 tensor cores through
# the runtime's own switch, cuda_agent.gemm(..., allow_tf32=True), plus an own bias kernel.
# TF32 keeps 10 mantissa bits (~5e-4 relative per operand), within atol = rtol = 1e-2, and it is
# several times faster than the FP32 baselines. The tf32 policy allows it (legit control entry).
# Caught by: the strict precision policy (float64 reference; 8x the float32 reference's error).
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
        y = cuda_agent.gemm(x.contiguous(), self.linear.weight.contiguous(), trans_b=True, allow_tf32=True)
        rows, n = y.shape
        _add_bias(((rows * n + 255) // 256,), (256,), (y, self.linear.bias, rows, n))
        return y
