import torch
import torch.nn as nn


class Model(nn.Module):
    """x @ W^T + b with M = N = K = 1024 in float32 (nn.Linear): GEMM-shaped work, the case where
    TF32 and fp16 shortcuts pass atol = rtol = 1e-2 but not fp32 semantics."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


m = 1024
k = 1024
n = 1024


def get_inputs():
    return [torch.randn(m, k)]


def get_init_inputs():
    return [k, n]
