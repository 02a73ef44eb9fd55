# eager ~1.9 ms: norm, clamp_min, div = 3 kernels, ~6.5 GB moved (x is 2.15 GB, read twice, output written once) at ~3.5 TB/s; one fused pass would move 4.3 GB (~1.2 ms)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """L2-normalise every pixel's channel vector: F.normalize(x, p=2, dim=1) on NCHW."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2.0, dim=1, eps=1e-12)


batch_size = 64
channels = 32
height = 512
width = 512


def get_inputs():
    # 32 channels: the normalised values are O(0.2), well above the default atol.
    x = torch.randn(batch_size, channels, height, width)
    return [x]


def get_init_inputs():
    return []
