# eager ~3.7 ms: sub (4.3 GB r + 2.15 GB w), pow (r + w), mean (r) = ~13 GB moved at ~3.5 TB/s; fused: one 4.3 GB read (~1.2 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Per-row mean squared error: ((pred - target) ** 2).mean(dim=1): (N, D) -> (N,)."""

    def __init__(self):
        super().__init__()

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((pred - target) ** 2).mean(dim=1)


batch_size = 65536
dim = 8192


def get_inputs():
    # Per-row noise level: the row means differ (for equal noise they would all be ~2 +- 0.03).
    pred = torch.randn(batch_size, dim)
    target = pred + torch.randn(batch_size, dim) * (torch.rand(batch_size, 1) * 2.0)
    return [pred, target]


def get_init_inputs():
    return []
