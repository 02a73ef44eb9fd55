# HACK (expect precision, under precision=strict): reciprocals in half precision on a task whose
# output holds infinities. The infinities are written exactly (they must match), the finite
# reciprocals go through hrcp on a half (~5e-4 relative error, inside atol = rtol = 1e-2): it
# rides on the strict check leaving the infinite elements out, hoping the rest is left out too.
# Caught by: the strict precision policy, measured over the elements finite in both outputs.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#include <cuda_fp16.h>

extern "C" __global__ void reciprocal_half(const float* __restrict__ x, float* __restrict__ y, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    y[i] = fabsf(v) > 0.05f ? __half2float(hrcp(__float2half(v))) : copysignf(__int_as_float(0x7f800000), v);
}
"""

_reciprocal = cuda_agent.compile(_SRC).get_function("reciprocal_half")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _reciprocal(((n + 255) // 256,), (256,), (x, y, n))
        return y
