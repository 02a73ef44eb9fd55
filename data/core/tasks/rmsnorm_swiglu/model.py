# eager ~3.7 ms: pow, mean, add, rsqrt, mul, mul, silu, mul = 8 kernels moving ~13 GB (x and gate are 1.07 GB each) at ~3.5 TB/s; fused: 3.2 GB (~0.9 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """SwiGLU-style gating of an RMS-normalised input: silu(gate) * (rmsnorm(x) * weight)."""

    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
        return F.silu(gate) * normed


batch_size = 65536
features = 4096
eps = 1e-6


def get_inputs():
    scale = torch.rand(batch_size, 1) * 3.0 + 0.25
    x = torch.randn(batch_size, features) * scale
    gate = torch.randn(batch_size, features) * 2.0
    return [x, gate]


def get_init_inputs():
    return [features, eps]
