# eager ~6 ms: two norms, two divides, mul, sum = ~21 GB moved (a and b are 2.15 GB each) at ~3.5 TB/s; fused: one 4.3 GB read (~1.2 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Row-wise cosine similarity: F.cosine_similarity(a, b, dim=1): (N, D), (N, D) -> (N,)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(a, b, dim=1, eps=1e-8)


batch_size = 65536
dim = 8192


def get_inputs():
    # b = c * a + noise with a per-row c: similarities spread over (-1, 1) instead of all being
    # ~0 +- 0.01 (as for independent rows), which a kernel writing zeros would match.
    a = torch.randn(batch_size, dim)
    b = a * torch.randn(batch_size, 1) + torch.randn(batch_size, dim)
    return [a, b]


def get_init_inputs():
    return []
