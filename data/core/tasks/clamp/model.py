# eager ~1.3 ms: one elementwise kernel, 2.15 GB read + 2.15 GB written = 4.3 GB, ~1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """Clamp every element to [min_val, max_val]."""

    def __init__(self, min_val: float, max_val: float):
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=self.min_val, max=self.max_val)


batch_size = 32768
dim = 16384
min_val = -0.75
max_val = 1.25


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [min_val, max_val]
