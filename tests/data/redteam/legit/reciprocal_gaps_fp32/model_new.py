# LEGIT (must pass, also under precision=strict): reciprocals in float32 (IEEE division) and the
# infinities of the zeroed entries written as the reference makes them (1/+-0, signed as x). An
# output that holds infinities must not fail the strict check, nor flag the task degenerate.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void reciprocal_gaps(const float* __restrict__ x, float* __restrict__ y, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    y[i] = fabsf(v) > 0.05f ? 1.0f / v : copysignf(__int_as_float(0x7f800000), v);
}
"""

_reciprocal = cuda_agent.compile(_SRC).get_function("reciprocal_gaps")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _reciprocal(((n + 255) // 256,), (256,), (x, y, n))
        return y
