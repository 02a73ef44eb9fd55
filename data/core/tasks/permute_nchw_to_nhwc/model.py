# eager ~1.5 ms: one strided copy kernel, 2.15 GB read + 2.15 GB written = 4.3 GB (>= 1.2 ms at ~3.5 TB/s; a naive transpose loses some bandwidth)
import torch
import torch.nn as nn


class Model(nn.Module):
    """NCHW -> NHWC layout change: x.permute(0, 2, 3, 1).contiguous()."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1).contiguous()


batch_size = 32
channels = 256
height = 256
width = 256


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return []
