# LEGIT (must pass): several kernels in sequence with intermediate buffers from torch.empty: row
# maxima, then row sums of exp(x - max), then an elementwise normalisation. Every launch names
# torch's current stream explicitly (the default anyway), so all three are ordered on it.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define THREADS 256

// Block-wide reduction of one value per thread; op 0 = max, 1 = sum. All threads get the result.
__device__ float block_reduce(float v, int op)
{
    __shared__ float partial[THREADS / 32];
    __shared__ float result;
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = op == 0 ? fmaxf(v, o) : v + o;
    }
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = partial[0];
        for (int w = 1; w < THREADS / 32; ++w) r = op == 0 ? fmaxf(r, partial[w]) : r + partial[w];
        result = r;
    }
    __syncthreads();
    return result;
}

extern "C" __global__ void row_max(const float* __restrict__ x, float* __restrict__ mx, int cols)
{
    const float* xr = x + (long long)blockIdx.x * cols;
    float m = -3.402823466e38f;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, xr[c]);
    m = block_reduce(m, 0);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

extern "C" __global__ void row_sum_exp(const float* __restrict__ x, const float* __restrict__ mx,
                                       float* __restrict__ sm, int cols)
{
    const float* xr = x + (long long)blockIdx.x * cols;
    const float m = mx[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) s += expf(xr[c] - m);
    s = block_reduce(s, 1);
    if (threadIdx.x == 0) sm[blockIdx.x] = s;
}

extern "C" __global__ void normalize(const float* __restrict__ x, const float* __restrict__ mx,
                                     const float* __restrict__ sm, float* __restrict__ y, long long total, int cols)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long r = i / cols;
    y[i] = expf(x[i] - mx[r]) / sm[r];
}
"""

_mod = cuda_agent.compile(_SRC)
_row_max = _mod.get_function("row_max")
_row_sum_exp = _mod.get_function("row_sum_exp")
_normalize = _mod.get_function("normalize")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        stream = torch.cuda.current_stream()
        mx = torch.empty(rows, device=x.device, dtype=x.dtype)
        sm = torch.empty(rows, device=x.device, dtype=x.dtype)
        y = torch.empty_like(x)
        _row_max((rows,), (_THREADS,), (x, mx, cols), stream=stream)
        _row_sum_exp((rows,), (_THREADS,), (x, mx, sm, cols), stream=stream)
        total = rows * cols
        _normalize(((total + _THREADS - 1) // _THREADS,), (_THREADS,), (x, mx, sm, y, total, cols), stream=stream)
        return y
