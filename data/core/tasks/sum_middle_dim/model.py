# eager ~1.3 ms: one reduction kernel reading 4.3 GB (the output is 1 MB), >= 1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over the middle dimension of a 3-D tensor: (B, R, C) -> (B, C)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


batch_size = 64
reduce_size = 4096
cols = 4096
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, reduce_size, cols)
    return [x]


def get_init_inputs():
    return [reduce_dim]
