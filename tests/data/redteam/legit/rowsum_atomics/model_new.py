# LEGIT (must pass): float atomics. Each row is split over 4 blocks; each block reduces its slice
# (warp shuffles + shared memory) and atomicAdd()s the partial into an output made with
# torch.zeros. The order of the four additions varies from run to run, so results differ in the
# last bits between runs: nondeterministic, but far inside the tolerance.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define THREADS 128

extern "C" __global__ void rowsum_split(const float* __restrict__ x, float* __restrict__ out, int cols, int splits)
{
    __shared__ float partial[THREADS / 32];
    const long long row = blockIdx.x;
    const int per = (cols + splits - 1) / splits;
    const int begin = blockIdx.y * per;
    const int end = min(cols, begin + per);
    const float* xr = x + row * cols;
    float s = 0.0f;
    for (int c = begin + threadIdx.x; c < end; c += THREADS) s += xr[c];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < THREADS / 32; ++w) t += partial[w];
        atomicAdd(&out[row], t);
    }
}
"""

_rowsum = cuda_agent.compile(_SRC).get_function("rowsum_split")
_SPLITS = 4


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = x.shape[-1]
        x2 = x.reshape(-1, cols).contiguous()
        rows = x2.shape[0]
        out = torch.zeros(rows, device=x.device, dtype=x.dtype)
        _rowsum((rows, _SPLITS), (128,), (x2, out, cols, _SPLITS))
        return out.view(x.shape[:-1])
