import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax of rows scaled by 1e-3: every output is below 1e-3, so within atol = 1e-2 of zero. A
    degenerate task: a kernel that writes zeros passes it."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1) * 1e-3


rows = 1024
cols = 1024


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
