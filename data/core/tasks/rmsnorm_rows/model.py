# eager ~5 ms: pow, mean, add, rsqrt, mul, mul = 6 kernels moving ~17 GB (x is 2.15 GB: pow r+w, mean r, two muls r+w each) at ~3.5 TB/s; one fused pass would move 4.3 GB (~1.2 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """RMSNorm written out in PyTorch ops: x * rsqrt(mean(x^2, -1) + eps) * weight."""

    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rms * self.weight


batch_size = 65536
features = 8192
eps = 1e-6


def get_inputs():
    scale = torch.rand(batch_size, 1) * 3.0 + 0.25
    x = torch.randn(batch_size, features) * scale
    return [x]


def get_init_inputs():
    return [features, eps]
