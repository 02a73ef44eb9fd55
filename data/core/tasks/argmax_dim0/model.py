# eager ~1.4 ms: one column-wise (strided) argmax kernel reading 4.3 GB (the output is 0.5 MB), >= 1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """Index of the maximum along dim 0 (down the columns): (R, C) float32 -> (C,) int64."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=0)


rows = 16384
cols = 65536


def get_inputs():
    x = torch.randn(rows, cols)
    return [x]


def get_init_inputs():
    return []
