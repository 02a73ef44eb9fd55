# eager ~1.3 ms: one elementwise kernel, 2.15 GB read + 2.15 GB written = 4.3 GB, ~1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Exact (erf) GELU, elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


batch_size = 32768
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim) * 2.0
    return [x]


def get_init_inputs():
    return []
