# eager ~2.7 ms: FP32 GEMMs 69 GFLOP (qkv, q@k^T, p@v, out-proj; ~1.5 ms) + scale, masked_fill, softmax passes over 537 MB of scores (~3.8 GB, ~1.1 ms) + layernorm
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Hand-written causal multi-head self-attention with a post-norm residual:
    layer_norm(x + out_proj(softmax(mask(q k^T / sqrt(hd))) v))."""

    def __init__(self, d_model: int, num_heads: int, max_seq_len: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        causal = torch.triu(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", causal, persistent=False)  # not in the state_dict
        with torch.no_grad():
            for fc in (self.qkv, self.out_proj):
                fc.weight.normal_(0.0, 1.0 / math.sqrt(fc.in_features))
                fc.bias.uniform_(-0.1, 0.1)
            # Larger query/key projections so that the attention is far from uniform.
            self.qkv.weight[: 2 * d_model].mul_(1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                  # (B, H, N, hd)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(self.causal_mask[:n, :n], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, d)
        return self.norm(x + self.out_proj(out))


batch_size = 16
seq_len = 1024
d_model = 512
num_heads = 8


def get_inputs():
    x = torch.randn(batch_size, seq_len, d_model)
    return [x]


def get_init_inputs():
    return [d_model, num_heads, seq_len]
