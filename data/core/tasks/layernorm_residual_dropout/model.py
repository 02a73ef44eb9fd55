# eager ~1.6 ms: LayerNorm (1.07 GB read + 1.07 GB written), dropout(p=0) is a no-op, add (2.15 GB read + 1.07 GB written) = 5.4 GB at ~3.5 TB/s; fused: 3.2 GB (~0.9 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """out = residual + dropout(layer_norm(x)), dropout with p=0 (the identity in any mode)."""

    def __init__(self, features: int, dropout_p: float):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        self.dropout = nn.Dropout(p=dropout_p)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self.dropout(self.ln(x))


batch_size = 65536
features = 4096
dropout_p = 0.0


def get_inputs():
    scale = torch.rand(batch_size, 1) * 3.0 + 0.25
    shift = torch.randn(batch_size, 1) * 2.0
    x = torch.randn(batch_size, features) * scale + shift
    residual = torch.randn(batch_size, features)
    return [x, residual]


def get_init_inputs():
    return [features, dropout_p]
