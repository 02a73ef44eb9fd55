import torch
import torch.nn as nn


class Model(nn.Module):
    """Reciprocals of a [4096, 4096] float32 matrix, with the entries near zero (|x| <= 0.05,
    about 4% of them) zeroed first, so those outputs are infinities (1/+-0, signed as x). An
    output that holds infinities: equal ones match, and the strict precision check measures the
    finite elements."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.0 / (x * (x.abs() > 0.05))


rows = 4096
cols = 4096


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
