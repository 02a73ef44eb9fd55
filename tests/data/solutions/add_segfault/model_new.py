# Tests: the Python forward crashes the whole process with SIGSEGV (reads address 0 through ctypes).
import ctypes

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)  # dereferences a null pointer -> SIGSEGV
        return a + b
