# eager ~1.3 ms: cuBLAS GEMV reading the 4.3 GB matrix once (2.1 GFLOP, memory-bound), >= 1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product: (M, K) @ (K, 1) -> (M, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, v)


M = 65536
K = 16384


def get_inputs():
    a = torch.randn(M, K)
    v = torch.randn(K, 1)
    return [a, v]


def get_init_inputs():
    return []
