import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Conv2d (with bias) followed by ReLU, NCHW float32."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


batch_size = 32
in_channels = 64
out_channels = 128
height = 128
width = 128
kernel_size = 3
padding = 1


def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
