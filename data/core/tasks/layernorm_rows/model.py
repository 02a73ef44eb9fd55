# eager ~1.4 ms: one LayerNorm kernel, 2.15 GB read + 2.15 GB written = 4.3 GB (>= 1.2 ms at ~3.5 TB/s; the second read of each row mostly hits L2)
import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.LayerNorm over the last dimension with a (randomly initialised) affine weight and bias."""

    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 65536
features = 8192


def get_inputs():
    # Per-row scale and shift, so that normalising actually changes the values.
    scale = torch.rand(batch_size, 1) * 3.0 + 0.25
    shift = torch.randn(batch_size, 1) * 2.0
    x = torch.randn(batch_size, features) * scale + shift
    return [x]


def get_init_inputs():
    return [features]
