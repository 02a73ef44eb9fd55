# Tests: a correct solution (extern "C" float4-vectorized kernel with a scalar tail) passes.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// Thread i adds float4 number i (i < n / 4); threads i < n % 4 also add
// element 4 * (n / 4) + i of the scalar tail. Pointers must be 16-byte aligned.
extern "C" __global__ void add_vec4(const float* __restrict__ a,
                                    const float* __restrict__ b,
                                    float* __restrict__ out,
                                    long long n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n4 = n >> 2;
    if (i < n4) {
        float4 x = reinterpret_cast<const float4*>(a)[i];
        float4 y = reinterpret_cast<const float4*>(b)[i];
        float4 z;
        z.x = x.x + y.x;
        z.y = x.y + y.y;
        z.z = x.z + y.z;
        z.w = x.w + y.w;
        reinterpret_cast<float4*>(out)[i] = z;
    }
    const long long t = (n4 << 2) + i;
    if (i < (n & 3) && t < n) {
        out[t] = a[t] + b[t];
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_add = _mod.get_function("add_vec4")

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
        work = max(n // 4, n % 4)  # threads needed: one per float4, at least one per tail element
        blocks = (work + _THREADS - 1) // _THREADS
        _add((blocks,), (_THREADS,), (a, b, out, n))
        return out
