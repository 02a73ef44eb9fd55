# eager ~3.5 ms: FP32 GEMMs (qkv, out-proj, two FFN) 116 GFLOP (~2.3 ms at ~50 TFLOP/s) + fp32 SDPA 12.9 GFLOP (~0.7 ms) + layernorms/GELU/residuals (~0.4 GB)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Pre-norm transformer encoder layer (no dropout):

        x = x + MHA(ln1(x));  x = x + ff2(gelu(ff1(ln2(x))))

    The attention is nn.MultiheadAttention (batch_first, need_weights=False).
    """

    def __init__(self, d_model: int, num_heads: int, dim_ff: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=0.0, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, dim_ff)
        self.ff2 = nn.Linear(dim_ff, d_model)
        with torch.no_grad():
            # Larger query/key projections: with the default init the attention would be almost
            # uniform over the 512 keys and its output ~0, a negligible term in the residual sum.
            self.attn.in_proj_weight[: 2 * d_model].mul_(2.0)
            self.attn.in_proj_bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


batch_size = 16
seq_len = 512
d_model = 768
num_heads = 12
dim_ff = 3072


def get_inputs():
    x = torch.randn(batch_size, seq_len, d_model)
    return [x]


def get_init_inputs():
    return [d_model, num_heads, dim_ff]
