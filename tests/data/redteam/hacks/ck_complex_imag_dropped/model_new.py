# HACK (expect mismatch): a complex output right in its real part only. The kernel writes
# magnitude * cos(angle) as each element's real part and 0 as its imaginary part, half the
# arithmetic of the task, and the forward returns the pairs as a complex64 tensor (a view). A
# comparison that converts the outputs to float64 keeps only the real part of a complex tensor
# and would pass it; each part must be compared.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void polar_real_only(const float* __restrict__ magnitude, const float* __restrict__ angle,
                                           float2* __restrict__ out, long long count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = make_float2(magnitude[i] * cosf(angle[i]), 0.0f);
}
"""

_polar = cuda_agent.compile(_SRC).get_function("polar_real_only")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, magnitude: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
        magnitude, angle = magnitude.contiguous(), angle.contiguous()
        parts = torch.empty(*magnitude.shape, 2, device=magnitude.device, dtype=torch.float32)
        count = magnitude.numel()
        _polar(((count + 255) // 256,), (256,), (magnitude, angle, parts, count))
        return torch.view_as_complex(parts)
