# Tests: the forward grows host memory to ~64 GiB in 1 GiB chunks; the sandbox's memory limit must trip first.
import torch
import torch.nn as nn

_CHUNK = 1 << 30  # 1 GiB
_CHUNKS = 64


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        hoard = []
        for _ in range(_CHUNKS):
            # A one-byte pattern repeated is written out with memset, so every page
            # is touched and really committed (a zeroed bytearray(n) may not be).
            hoard.append(bytearray(b"\xa5") * _CHUNK)
        return a + b + float(len(hoard) - _CHUNKS)
