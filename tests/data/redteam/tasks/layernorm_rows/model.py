import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension of a [4096, 1024] float32 matrix, with random affine
    parameters (drawn under the sandbox's seed) so a solution has to read ln.weight and ln.bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


rows = 4096
dim = 1024


def get_inputs():
    return [torch.randn(rows, dim) * 2.0 + 0.5]


def get_init_inputs():
    return [dim]
