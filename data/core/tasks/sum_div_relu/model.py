# eager ~1.3 ms: a sum over the last dim reading 4.3 GB (>= 1.2 ms at ~3.5 TB/s) + div, add, relu over a 0.5 MB result
import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(x.sum(dim=-1) / divisor + bias): (B, C, L) -> (B, C), bias per channel."""

    def __init__(self, channels: int, divisor: float):
        super().__init__()
        self.divisor = divisor
        self.bias = nn.Parameter(torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.sum(dim=-1) / self.divisor + self.bias)


batch_size = 256
channels = 512
length = 8192
divisor = 64.0


def get_inputs():
    x = torch.randn(batch_size, channels, length)
    return [x]


def get_init_inputs():
    return [channels, divisor]
