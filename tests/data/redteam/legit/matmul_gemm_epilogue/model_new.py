# LEGIT (must pass, also under precision=strict): cuda_agent.gemm (cuBLAS, true FP32) for x @ W^T,
# then an own epilogue kernel that adds the bias in place (float4 over the output rows).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// y (rows x n, n % 4 == 0) += bias, four columns per thread.
extern "C" __global__ void add_bias_vec4(float4* __restrict__ y, const float4* __restrict__ bias,
                                         long long total4, int n4)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total4) return;
    const float4 b = bias[i % n4];
    float4 v = y[i];
    v.x += b.x;
    v.y += b.y;
    v.z += b.z;
    v.w += b.w;
    y[i] = v;
}

extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, long long total, int n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += bias[i % n];
}
"""

_mod = cuda_agent.compile(_SRC)
_add_bias_vec4 = _mod.get_function("add_bias_vec4")
_add_bias = _mod.get_function("add_bias")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = cuda_agent.gemm(x.contiguous(), self.linear.weight.contiguous(), trans_b=True)
        rows, n = y.shape
        bias = self.linear.bias.contiguous()
        if n % 4 == 0:
            total4 = rows * n // 4
            _add_bias_vec4(((total4 + 255) // 256,), (256,), (y, bias, total4, n // 4))
        else:
            _add_bias(((rows * n + 255) // 256,), (256,), (y, bias, rows * n, n))
        return y
