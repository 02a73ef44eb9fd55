# eager ~3 ms: patch-embed conv 14.8 GFLOP + block GEMMs 89 GFLOP (~2.3 ms at ~45 TFLOP/s) + fp32 SDPA 7.6 GFLOP (~0.4 ms) + layernorm/GELU/residual passes (~0.6 GB)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Tiny ViT front end: 16x16 patch embedding + class token + position embedding, one
    pre-norm transformer block (hand-written multi-head attention on
    F.scaled_dot_product_attention, GELU MLP), final LayerNorm. Returns all tokens."""

    def __init__(self, image_size: int, patch_size: int, in_channels: int, dim: int,
                 num_heads: int, mlp_ratio: int):
        super().__init__()
        self.num_heads = num_heads
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.5)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)
        self.ln_f = nn.LayerNorm(dim)
        with torch.no_grad():
            # Larger query/key projections so that the attention is far from uniform.
            self.qkv.weight[: 2 * dim].mul_(2.5)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(img).flatten(2).transpose(1, 2)          # (B, N, D)
        b, n, d = x.shape
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1) + self.pos_embed
        h = self.ln1(x)
        qkv = self.qkv(h).reshape(b, n + 1, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                 # each (B, H, N+1, hd)
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(b, n + 1, d)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.ln_f(x)


batch_size = 128
image_size = 224
patch_size = 16
in_channels = 3
dim = 384
num_heads = 6
mlp_ratio = 4


def get_inputs():
    img = torch.randn(batch_size, in_channels, image_size, image_size)
    return [img]


def get_init_inputs():
    return [image_size, patch_size, in_channels, dim, num_heads, mlp_ratio]
