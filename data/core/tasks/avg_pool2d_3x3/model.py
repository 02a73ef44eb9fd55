# eager ~1.5 ms: one pooling kernel, 2.15 GB read (each input reused by 9 windows, from cache) + 2.15 GB written = 4.3 GB, >= 1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D average pooling, 3x3 window, stride 1, zero padding 1 (count_include_pad=True)."""

    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 32
channels = 256
height = 256
width = 256
kernel_size = 3
stride = 1
padding = 1


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return [kernel_size, stride, padding]
