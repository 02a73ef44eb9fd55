# Tests: a solution that runs fine but computes a - b must be reported as an output mismatch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void sub(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ out, long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] - b[i];  // deliberately wrong: the task asks for a + b
}
"""

_mod = cuda_agent.compile(_SRC)
_sub = _mod.get_function("sub")

_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        _sub(((n + _THREADS - 1) // _THREADS,), (_THREADS,), (a, b, out, n))
        return out
