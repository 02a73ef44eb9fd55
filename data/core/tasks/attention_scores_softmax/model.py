# eager ~2.2 ms: batched GEMM 256 x (1024x64 @ 64x1024) = 34 GFLOP (~0.7 ms) writing 1.07 GB of scores, then mul and softmax (each r + w) = ~5.4 GB (~1.5 ms at ~3.5 TB/s)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Attention probabilities: softmax(q @ k^T * scale, dim=-1), q and k of shape (B, H, L, d)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)


batch_size = 16
num_heads = 16
seq_len = 1024
head_dim = 64
scale = 0.25  # twice 1/sqrt(head_dim): logits ~N(0, 4), so the rows are far from uniform


def get_inputs():
    q = torch.randn(batch_size, num_heads, seq_len, head_dim)
    k = torch.randn(batch_size, num_heads, seq_len, head_dim)
    return [q, k]


def get_init_inputs():
    return [scale]
