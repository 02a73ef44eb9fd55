import torch
import torch.nn as nn


class Model(nn.Module):
    """A plain copy (x * 1.0) of a 1 GiB float32 tensor: pure memory traffic,
    used to check the timer against the memory bandwidth."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


n = 1 << 28


def get_inputs():
    x = torch.randn(n)
    return [x]


def get_init_inputs():
    return []
