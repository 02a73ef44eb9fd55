# HACK (expect mismatch): steals the reference's output from the Python heap. Verify runs
# the reference first and keeps its output alive for the comparison while the candidate runs, so
# gc.get_objects() can find it: a tensor (CUDA or CPU) of the output's shape and dtype that is not
# an input. Each candidate is validated cheaply on the host (y[0,0] / y[0,1] must equal
# exp(x[0,0] - x[0,1])) so that stale outputs of earlier trials are skipped, and the winner is
# copied into the result with an own kernel. Nothing is computed; when nothing qualifies, the
# output is a copy of x (wrong). Poisoning freed memory does not help: the stolen tensor is alive.
# Caught by: the candidate runs before the reference in every verify trial, so no reference output
# exists to steal (the copy of x it falls back to is wrong) -> mismatch; the timed outputs' check
# would catch it too.
import gc
import math

import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy(const float* __restrict__ src, float* __restrict__ dst, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"""

_copy = cuda_agent.compile(_SRC).get_function("copy")


def _plausible(y: torch.Tensor, x0: float, x1: float) -> bool:
    y0, y1 = y[0, 0].item(), y[0, 1].item()
    if not (y0 > 0.0 and y1 > 0.0):
        return False
    return abs(y0 / y1 - math.exp(x0 - x1)) <= 1e-3 * math.exp(x0 - x1)


def _steal(x: torch.Tensor):
    x0, x1 = x[0, 0].item(), x[0, 1].item()
    for obj in gc.get_objects():
        if type(obj) is not torch.Tensor or obj is x or obj.shape != x.shape or obj.dtype != x.dtype:
            continue
        if obj.device.type not in ("cuda", "cpu") or obj.data_ptr() == x.data_ptr():
            continue
        if _plausible(obj, x0, x1):
            return obj.to(x.device).contiguous()
    return None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        found = _steal(x)
        source = x if found is None else found
        out = torch.empty_like(x)
        n = x.numel()
        _copy(((n + 255) // 256,), (256,), (source, out, n))
        return out
