# LEGIT (must pass): a complex output written by a kernel of its own. The kernel writes each
# element's real and imaginary parts side by side into a float buffer of shape [rows, cols, 2],
# and the forward returns torch.view_as_complex of it (a view: no kernel). The sandbox must move
# a complex64 output between its processes, compare both parts with the reference's, and hold
# both to the strict policy against a complex128 reference.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void polar_parts(const float* __restrict__ magnitude, const float* __restrict__ angle,
                                       float2* __restrict__ out, long long count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s, c;
    sincosf(angle[i], &s, &c);
    out[i] = make_float2(magnitude[i] * c, magnitude[i] * s);
}
"""

_polar = cuda_agent.compile(_SRC).get_function("polar_parts")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, magnitude: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
        magnitude, angle = magnitude.contiguous(), angle.contiguous()
        parts = torch.empty(*magnitude.shape, 2, device=magnitude.device, dtype=torch.float32)
        count = magnitude.numel()
        _polar(((count + 255) // 256,), (256,), (magnitude, angle, parts, count))
        return torch.view_as_complex(parts)
