# LEGIT (must pass, also under precision=strict): a C++ template kernel reached through
# name_expressions ("layernorm_rows<256, 4>"), one block per row, the row held in registers,
# CUB's BlockReduce for the mean and then for the variance of the centred values (two-pass, as
# accurate as PyTorch's), then the affine transform with ln.weight and ln.bias.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#include <cub/block/block_reduce.cuh>

template <int THREADS, int PER_THREAD>
__global__ void __launch_bounds__(THREADS) layernorm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                          const float* __restrict__ b, float* __restrict__ y,
                                                          int cols, float eps)
{
    using BlockReduce = cub::BlockReduce<float, THREADS>;
    __shared__ typename BlockReduce::TempStorage temp;
    __shared__ float mean_s, rstd_s;
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;

    float v[PER_THREAD];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int c = threadIdx.x + j * THREADS;
        v[j] = c < cols ? xr[c] : 0.0f;
        sum += v[j];
    }
    sum = BlockReduce(temp).Sum(sum);
    if (threadIdx.x == 0) mean_s = sum / cols;
    __syncthreads();
    const float mean = mean_s;

    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int c = threadIdx.x + j * THREADS;
        const float d = c < cols ? v[j] - mean : 0.0f;
        sq += d * d;
    }
    sq = BlockReduce(temp).Sum(sq);  // temp reuse is safe: the __syncthreads above separates the two
    if (threadIdx.x == 0) rstd_s = rsqrtf(sq / cols + eps);
    __syncthreads();
    const float rstd = rstd_s;

#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int c = threadIdx.x + j * THREADS;
        if (c < cols) yr[c] = (v[j] - mean) * rstd * w[c] + b[c];
    }
}
"""

_THREADS = 256
_PER_THREAD = 4
_NAME = f"layernorm_rows<{_THREADS}, {_PER_THREAD}>"
_kernel = cuda_agent.compile(_SRC, name_expressions=[_NAME]).get_function(_NAME)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = x.shape[-1]
        if cols > _THREADS * _PER_THREAD:
            raise ValueError(f"rows of {cols} do not fit {_THREADS} x {_PER_THREAD} registers")
        x2 = x.reshape(-1, cols).contiguous()
        y = torch.empty_like(x2)
        _kernel((x2.shape[0],), (_THREADS,), (x2, self.ln.weight, self.ln.bias, y, cols, float(self.ln.eps)))
        return y.view(x.shape)
