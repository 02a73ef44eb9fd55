import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU of inputs drawn with torch.rand, as KernelBench level 1's 19_ReLU draws them: every
    input is in [0, 1), where ReLU is the identity. A degenerate task: returning the input passes."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


rows = 1024
cols = 4096


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
