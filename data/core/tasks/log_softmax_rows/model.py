# eager ~1.3-2 ms: one log_softmax kernel, 2.15 GB read + 2.15 GB written = 4.3 GB (>= 1.2 ms at ~3.5 TB/s; rows of 64 KB are too long for its shared-memory path, so it re-reads each row, partly from L2)
import torch
import torch.nn as nn


class Model(nn.Module):
    """log_softmax over the last dimension (dim=1) of a 2-D float32 tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=1)


batch_size = 32768
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim) * 2.0
    return [x]


def get_init_inputs():
    return []
