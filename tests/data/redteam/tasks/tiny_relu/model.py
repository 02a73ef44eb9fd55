import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU of 8,192 float32 values (32 KiB): one launch-bound kernel of a few microseconds, shorter
    than the judge's bracket can resolve (its calibrated hand-overs vary by about as much)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


size = 8192


def get_inputs():
    return [torch.randn(size) * 2.0]


def get_init_inputs():
    return []
