# LEGIT (must pass): one block per row with the row staged in dynamic shared memory, so global
# memory is read once: load, block max, exp in place in shared memory, block sum, scale and store.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define THREADS 256

__device__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

extern "C" __global__ void softmax_smem(const float* __restrict__ x, float* __restrict__ y, int cols)
{
    extern __shared__ float row[];
    __shared__ float partial[THREADS / 32];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;

    float m = -3.402823466e38f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        row[c] = xr[c];
        m = fmaxf(m, row[c]);
    }
    m = warp_max(m);
    if (lane == 0) partial[warp] = m;
    __syncthreads();
    m = partial[0];
    for (int w = 1; w < THREADS / 32; ++w) m = fmaxf(m, partial[w]);
    __syncthreads();  // everyone has read partial[] before it is reused

    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
        const float e = expf(row[c] - m);
        row[c] = e;
        s += e;
    }
    s = warp_sum(s);
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < THREADS / 32; ++w) s += partial[w];
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += THREADS) yr[c] = row[c] * inv;
}
"""

_softmax = cuda_agent.compile(_SRC).get_function("softmax_smem")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        smem = cols * 4
        if smem > 48 * 1024:
            _softmax.set_max_dynamic_shared_memory(smem)
        _softmax((rows,), (_THREADS,), (x, y, cols), shared_mem=smem)
        return y
