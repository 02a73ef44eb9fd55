# LEGIT (must pass): a tiled transpose through shared memory (32x33 tiles, no bank conflicts): the
# control for nm_copies_do_the_work, the same task done by the solution's own kernel.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define TILE 32
extern "C" __global__ void transpose(const float* __restrict__ x, float* __restrict__ y, int n)
{
    __shared__ float tile[TILE][TILE + 1];
    const int bx = blockIdx.x * TILE, by = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int r = by + j, c = bx + threadIdx.x;
        if (r < n && c < n) tile[j][threadIdx.x] = x[(long long)r * n + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int r = bx + j, c = by + threadIdx.x;
        if (r < n && c < n) y[(long long)r * n + c] = tile[threadIdx.x][j];
    }
}
"""

_transpose = cuda_agent.compile(_SRC).get_function("transpose")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = x.shape[0]
        y = torch.empty_like(x)
        _transpose(((n + 31) // 32, (n + 31) // 32), (32, 8), (x, y, n))
        return y
