# eager ~1.3 ms: one reduction kernel reading 4.3 GB (the output is 0.5 MB), >= 1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """Maximum over the last dimension: (N, D) -> (N,)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=-1)


batch_size = 131072
dim = 8192


def get_inputs():
    # Per-row shift so that the row maxima spread well beyond the tolerance.
    x = torch.randn(batch_size, dim) + torch.randn(batch_size, 1) * 2.0
    return [x]


def get_init_inputs():
    return []
