import torch
import torch.nn as nn


class Model(nn.Module):
    """Two outputs: ReLU of torch.rand inputs (the identity there, as in KernelBench level 1's
    19_ReLU) and y doubled. A degenerate task: the first output is its input, so a solution that
    returns the input there computes half of what the task asks."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return torch.relu(x), y * 2.0


rows = 1024
cols = 4096


def get_inputs():
    return [torch.rand(rows, cols), torch.randn(rows, cols)]


def get_init_inputs():
    return []
