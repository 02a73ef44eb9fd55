# eager ~2.5 ms: add bias (r+w), add residual (2 r + w), LayerNorm (r + w) = ~8.6 GB moved (each tensor is 1.07 GB) at ~3.5 TB/s; fused: 3.2 GB (~0.9 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Post-norm residual: layer_norm(x + bias + residual)."""

    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.5)
        self.ln = nn.LayerNorm(features)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.ln(x + self.bias + residual)


batch_size = 65536
features = 4096


def get_inputs():
    scale = torch.rand(batch_size, 1) * 3.0 + 0.25
    x = torch.randn(batch_size, features) * scale
    residual = torch.randn(batch_size, features) + torch.randn(batch_size, 1)
    return [x, residual]


def get_init_inputs():
    return [features]
