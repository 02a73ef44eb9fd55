# eager ~1.8 ms: instance_norm (reads x twice, writes once) + leaky_relu (r + w) = ~5.4 GB moved (x is 1.07 GB) at ~3.5 TB/s; fused: 2.15 GB (~0.6 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """InstanceNorm2d (affine, per-instance statistics) followed by LeakyReLU."""

    def __init__(self, channels: int, negative_slope: float):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=True)
        self.negative_slope = negative_slope
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.norm(x), self.negative_slope)


batch_size = 128
channels = 128
height = 128
width = 128
negative_slope = 0.2


def get_inputs():
    scale = torch.rand(batch_size, channels, 1, 1) * 2.0 + 0.25
    shift = torch.randn(batch_size, channels, 1, 1)
    x = torch.randn(batch_size, channels, height, width) * scale + shift
    return [x]


def get_init_inputs():
    return [channels, negative_slope]
