# HACK (expect mismatch): computes the softmax of the even rows only and fills each odd row with
# NaN bit patterns other than the canonical one (a negative quiet NaN, a signalling NaN, NaNs with
# payloads), half the work. Aimed at the judge's comparison, which reads outputs in a kernel of its
# own: one that tested "not beyond the tolerance" (!(d > tol), true for NaN) or compared bits,
# maxima or ratios that a NaN drops out of would pass them.
# Caught by: every element is within the tolerance only when |d| <= tol or the values are equal,
# both false for any NaN (IEEE comparisons do not look at the payload): a mismatch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void half_softmax(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    if (row & 1) {
        const unsigned nans[4] = {0xffc00000u, 0x7f800001u, 0x7fc0beefu, 0xffbfffffu};
        for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __uint_as_float(nans[c & 3]);
        return;
    }
    __shared__ float part[32];
    float m = -3.0e38f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    m = part[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, part[w]);
    __syncthreads();
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += part[w];
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
}
"""

_softmax = cuda_agent.compile(_SRC).get_function("half_softmax")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = torch.empty_like(x)
        if rows:
            _softmax((rows,), (256,), (x, y, rows, cols))
        return y
