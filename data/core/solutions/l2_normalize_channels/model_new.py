# Reference solution for core/l2_normalize_channels: F.normalize(x, p=2, dim=1, eps) on NCHW,
# i.e. every pixel's channel vector divided by max(||x||_2, eps), in one pass.
# l2norm_channels4: a thread owns 4 adjacent pixels (one float4) of one image and keeps all their
# channels in registers: it issues all C <= 32 float4 loads (512 bytes in flight per thread; a
# warp reads 512 contiguous bytes of each channel plane), accumulates the 4 sums of squares,
# and writes x / max(sqrt(sum), eps) with float4 stores. For 64 x 32 x 512 x 512: 32768 blocks
# of 128 threads. HBM traffic: 2.15 GB read + 2.15 GB written, one kernel, no re-read.
# Eager runs norm, clamp_min and div (x read twice, plus the norm tensor); torch.compile fuses
# them into one reduction kernel over the strided channel dim. That kernel also moves the
# minimum 4.3 GB, so the margin over compile rests on access width and loads in flight and is
# uncertain.
# More than 32 channels, H*W % 4 != 0 or unaligned data use a scalar two-pass-over-channels
# kernel of our own; non-fp32 input falls back to PyTorch.
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuda_agent

_SRC = r"""
#define CMAX 32

// x, y: N x C x hw4 float4s, C <= CMAX. One thread per (image, float4 of pixels).
extern "C" __global__ void __launch_bounds__(128, 3)
l2norm_channels4(const float4* __restrict__ x, float4* __restrict__ y, long long total, int C, long long hw4, float eps)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long n = i / hw4;
    const long long p = i - n * hw4;
    const float4* __restrict__ xp = x + n * C * hw4 + p;
    float4* __restrict__ yp = y + n * C * hw4 + p;
    float4 v[CMAX];
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) v[c] = c < C ? xp[c * hw4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float sx = 0.0f, sy = 0.0f, sz = 0.0f, sw = 0.0f;
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        sx = fmaf(v[c].x, v[c].x, sx);
        sy = fmaf(v[c].y, v[c].y, sy);
        sz = fmaf(v[c].z, v[c].z, sz);
        sw = fmaf(v[c].w, v[c].w, sw);
    }
    const float dx = fmaxf(sqrtf(sx), eps), dy = fmaxf(sqrtf(sy), eps);
    const float dz = fmaxf(sqrtf(sz), eps), dw = fmaxf(sqrtf(sw), eps);
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        if (c < C) yp[c * hw4] = make_float4(v[c].x / dx, v[c].y / dy, v[c].z / dz, v[c].w / dw);
    }
}

// Any C and H*W: one thread per (image, pixel), channels walked twice (the second pass hits cache).
extern "C" __global__ void __launch_bounds__(256)
l2norm_channels1(const float* __restrict__ x, float* __restrict__ y, long long total, int C, long long hw, float eps)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long n = i / hw;
    const long long p = i - n * hw;
    const float* __restrict__ xp = x + n * C * hw + p;
    float* __restrict__ yp = y + n * C * hw + p;
    float s = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float v = xp[c * hw];
        s = fmaf(v, v, s);
    }
    const float d = fmaxf(sqrtf(s), eps);
    for (int c = 0; c < C; ++c) yp[c * hw] = xp[c * hw] / d;
}
"""

_mod = cuda_agent.compile(_SRC)
_norm4 = _mod.get_function("l2norm_channels4")
_norm1 = _mod.get_function("l2norm_channels1")
_CMAX = 32
_EPS = 1e-12


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.dtype != torch.float32:
            return F.normalize(x, p=2.0, dim=1, eps=_EPS)
        x = x.contiguous()
        y = torch.empty_like(x)
        n, c = x.shape[0], x.shape[1]
        if x.numel() == 0:
            return y
        hw = x.numel() // (n * c)
        if c <= _CMAX and hw % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0:
            hw4 = hw // 4
            total = n * hw4
            _norm4(((total + 127) // 128,), (128,), (x, y, total, c, hw4, _EPS))
        else:
            total = n * hw
            _norm1(((total + 255) // 256,), (256,), (x, y, total, c, hw, _EPS))
        return y
