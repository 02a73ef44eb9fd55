import torch
import torch.nn as nn


class Model(nn.Module):
    """A small nn.Linear; has parameters (linear.weight, linear.bias) for state_dict checks."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


batch_size = 64
in_features = 256
out_features = 128


def get_inputs():
    x = torch.randn(batch_size, in_features)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
