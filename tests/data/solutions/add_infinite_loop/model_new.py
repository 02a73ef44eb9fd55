# Tests: a kernel that never finishes (spins on a volatile flag nobody sets); the sandbox must time it out.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void add_after_flag(const float* __restrict__ a, const float* __restrict__ b,
                                          float* __restrict__ out, long long n, int* flag)
{
    volatile int* f = flag;
    while (*f == 0) {
        // the flag is zero and nothing ever sets it
    }
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""

_mod = cuda_agent.compile(_SRC)
_add = _mod.get_function("add_after_flag")

_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        flag = torch.zeros(1, dtype=torch.int32, device=a.device)  # not a buffer: keeps state_dict empty
        _add(((n + _THREADS - 1) // _THREADS,), (_THREADS,), (a, b, out, n, flag))
        return out
