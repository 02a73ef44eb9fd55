import torch
import torch.nn as nn


class Model(nn.Module):
    """The transpose of a [4096, 4096] float32 matrix, materialised: a task whose whole work is a
    copy (64 MiB read, 64 MiB written)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous()


n = 4096


def get_inputs():
    return [torch.randn(n, n)]


def get_init_inputs():
    return []
