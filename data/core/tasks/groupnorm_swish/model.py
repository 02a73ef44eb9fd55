# eager ~2.8 ms: group_norm (reads x twice, writes once), sigmoid, mul = ~9.7 GB moved (x is 1.07 GB) at ~3.5 TB/s; fused: 2.15 GB (~0.6 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """GroupNorm (affine) followed by swish: y = gn(x); y * sigmoid(y)."""

    def __init__(self, num_groups: int, channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, channels)
        with torch.no_grad():
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gn(x)
        return y * torch.sigmoid(y)


batch_size = 64
channels = 256
num_groups = 32
height = 128
width = 128


def get_inputs():
    # Per-(sample, channel) scale and shift, so that each group has its own statistics.
    scale = torch.rand(batch_size, channels, 1, 1) * 2.0 + 0.25
    shift = torch.randn(batch_size, channels, 1, 1)
    x = torch.randn(batch_size, channels, height, width) * scale + shift
    return [x]


def get_init_inputs():
    return [num_groups, channels]
