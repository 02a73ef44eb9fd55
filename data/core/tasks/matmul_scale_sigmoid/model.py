# eager ~5.6 ms: cuBLAS FP32 GEMM 4096x8192x4096 = 275 GFLOP (~5.5 ms at ~50 TFLOP/s) + mul and sigmoid passes over 67 MB
import torch
import torch.nn as nn


class Model(nn.Module):
    """sigmoid((a @ b) * scale)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.matmul(a, b) * self.scale)


M = 4096
K = 8192
N = 4096
scale = 0.01  # ~1/sqrt(K): the products are ~N(0, 0.8), so the sigmoid does not saturate


def get_inputs():
    a = torch.randn(M, K)
    b = torch.randn(K, N)
    return [a, b]


def get_init_inputs():
    return [scale]
