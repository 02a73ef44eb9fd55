# eager ~3.7 ms: mul, add, softmax = 3 kernels over 2.15 GB of scores, ~12.9 GB moved at ~3.5 TB/s; fused: 4.3 GB (~1.2 ms), less if masked scores are never read
import torch
import torch.nn as nn


class Model(nn.Module):
    """Attention-style softmax: softmax(x * scale + mask, dim=-1).

    x: (B, H, L, L) scores; mask: (L, L) additive float mask (0 or -inf), broadcast over B and H.
    """

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * self.scale + mask, dim=-1)


batch_size = 8
num_heads = 16
seq_len = 2048
scale = 0.125


def get_inputs():
    # Raw q.k scores of head dimension 64 have std ~8; after the 1/8 scale the logits are ~N(0, 1).
    x = torch.randn(batch_size, num_heads, seq_len, seq_len) * 8.0
    mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)  # causal
    return [x, mask]


def get_init_inputs():
    return [scale]
