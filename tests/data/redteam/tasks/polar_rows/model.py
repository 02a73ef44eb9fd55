import torch
import torch.nn as nn


class Model(nn.Module):
    """A complex output: torch.polar of magnitudes in [0.5, 1.5) and angles drawn from a normal
    distribution, [2048, 1024] complex64 (16 MiB). Both parts of every element carry as much of
    the result as the other: an output right in its real part alone is half wrong."""

    def __init__(self):
        super().__init__()

    def forward(self, magnitude: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
        return torch.polar(magnitude, angle)


rows = 2048
cols = 1024


def get_inputs():
    return [torch.rand(rows, cols) + 0.5, torch.randn(rows, cols) * 2.0]


def get_init_inputs():
    return []
