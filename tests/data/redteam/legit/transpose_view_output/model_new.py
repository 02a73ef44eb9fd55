# LEGIT (must pass): returns a non-contiguous view. Its kernel writes x itself (a copy) into a fresh
# buffer and it returns that buffer's .t() view, whose strides are (1, n): the values are the
# transpose, and the sandbox must read them through the view's strides.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void copy_floats(const float* __restrict__ src, float* __restrict__ dst, long long count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) dst[i] = src[i];
}
"""

_copy = cuda_agent.compile(_SRC).get_function("copy_floats")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        buf = torch.empty_like(x)
        count = x.numel()
        _copy(((count + 255) // 256,), (256,), (x, buf, count))
        return buf.t()
