# eager ~1.5-2.5 ms: one scan kernel, 2.15 GB read + 2.15 GB written = 4.3 GB (>= 1.2 ms at ~3.5 TB/s; ATen's row scan is not bandwidth-bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Inclusive prefix sum along the last dimension."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


batch_size = 65536
length = 8192
scan_dim = 1


def get_inputs():
    x = torch.randn(batch_size, length)
    return [x]


def get_init_inputs():
    return [scan_dim]
