# LEGIT (must pass, also under precision=strict): an own shared-memory tiled FP32 GEMM with the
# bias fused, for the small nn.Linear task (64 x 256 @ 256 x 128). 16 x 16 output tiles, K in
# steps of 16 through padded shared-memory tiles of x and W, FMA accumulation in float32.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define TILE 16

// y[m][n] = sum_k x[m][k] * w[n][k] + b[n]; block (TILE, TILE), grid (ceil(N/TILE), ceil(M/TILE)).
extern "C" __global__ void linear_tiled(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ b, float* __restrict__ y, int M, int N, int K)
{
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int m = blockIdx.y * TILE + ty;
    const int n = blockIdx.x * TILE + tx;
    const int wn = blockIdx.x * TILE + ty;  // the W row this thread loads
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int k = k0 + tx;
        xs[ty][tx] = (m < M && k < K) ? x[(long long)m * K + k] : 0.0f;
        ws[ty][tx] = (wn < N && k < K) ? w[(long long)wn * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc = fmaf(xs[ty][kk], ws[tx][kk], acc);
        __syncthreads();
    }
    if (m < M && n < N) y[(long long)m * N + n] = acc + b[n];
}
"""

_linear = cuda_agent.compile(_SRC).get_function("linear_tiled")
_TILE = 16


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        M, K = x.shape
        N = self.linear.out_features
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = ((N + _TILE - 1) // _TILE, (M + _TILE - 1) // _TILE)
        _linear(grid, (_TILE, _TILE), (x, self.linear.weight, self.linear.bias, y, M, N, K))
        return y
