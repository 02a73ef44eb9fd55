# Tests: a correct solution whose kernel is a C++ template, reached through name_expressions=["add<float>"].
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
template <typename T>
__global__ void add(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = a[i] + b[i];
    }
}
"""

_mod = cuda_agent.compile(_SRC, name_expressions=["add<float>"])
_add = _mod.get_function("add<float>")

_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        if n == 0:
            return out
        blocks = min((n + _THREADS - 1) // _THREADS, 65535)
        _add((blocks,), (_THREADS,), (a, b, out, n))
        return out
