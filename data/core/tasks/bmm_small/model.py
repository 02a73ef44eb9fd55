# eager ~1-2 ms: batched GEMM of 131072 tiny (32x64)@(64x32) products: 17 GFLOP (0.35 ms at 50 TFLOP/s) but 2.7 GB moved (0.8 ms at ~3.5 TB/s); cuBLAS is inefficient at this size
import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix multiply of many small matrices: (B, M, K) @ (B, K, N) -> (B, M, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


batch_size = 131072
M = 32
K = 64
N = 32


def get_inputs():
    a = torch.randn(batch_size, M, K)
    b = torch.randn(batch_size, K, N)
    return [a, b]


def get_init_inputs():
    return []
