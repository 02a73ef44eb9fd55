# eager ~7 ms: amax, sub, exp_, sum, log_, add_ = 6 kernels moving ~26 GB (x is 4.3 GB) at ~3.5 TB/s; one fused pass would read 4.3 GB (~1.2 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.logsumexp over the last dimension: (N, D) -> (N,)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=1)


batch_size = 131072
dim = 8192


def get_inputs():
    # Per-row scale in [0.5, 3.5]: the result depends on the whole row, not just on its mean
    # (for plain randn it would be ~log(D) + 0.5 for every row, within the tolerance).
    scale = torch.rand(batch_size, 1) * 3.0 + 0.5
    x = torch.randn(batch_size, dim) * scale
    return [x]


def get_init_inputs():
    return []
