import torch
import torch.nn as nn


class Model(nn.Module):
    """Row softmax of a [4096, 1024] float32 matrix (16 MiB). The inputs are scaled by 3 so that
    the largest probabilities (~0.1-0.9) lie far above atol: zeros or constants cannot pass."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


rows = 4096
cols = 1024


def get_inputs():
    return [torch.randn(rows, cols) * 3.0]


def get_init_inputs():
    return []
