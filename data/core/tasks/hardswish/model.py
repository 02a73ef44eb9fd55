# eager ~1.3 ms: one elementwise kernel, 2.15 GB read + 2.15 GB written = 4.3 GB, ~1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Hardswish activation, x * relu6(x + 3) / 6, elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(x)


batch_size = 32768
dim = 16384


def get_inputs():
    # std 3: all three pieces (0, the quadratic, the identity) are well populated.
    x = torch.randn(batch_size, dim) * 3.0
    return [x]


def get_init_inputs():
    return []
