# Reference solution for core/permute_nchw_to_nhwc: x.permute(0, 2, 3, 1).contiguous(), i.e. a
# per-image transpose of (C, H*W) into (H*W, C), through a swizzled shared-memory tile.
# nchw_to_nhwc_tiled: one block of 256 threads per 64-pixel x 64-channel tile. Each thread issues
# 4 float4 loads (a warp reads 4 channel rows x 128 contiguous bytes) and scatters the 16 values
# into a 16 KB shared tile stored pixel-major with an XOR swizzle on float4 slots
# (slot = channel/4 ^ pixel/4), which makes both the scalar transposing stores and the float4
# reads conflict-free; then 4 float4 stores per thread (a warp writes 2 pixel rows x 256
# contiguous bytes). For 32 x 256 x 256 x 256: 131072 blocks, the 4 channel tiles of a pixel
# range adjacent in launch order so that output rows are completed together. HBM traffic: 2.15 GB
# read + 2.15 GB written, all 16-byte accesses, one kernel.
# Inductor emits a 2-D tiled Triton copy whose layout conversion goes through shared memory
# without a conflict-free swizzle and with narrower accesses on one side; this is meant to run
# at copy bandwidth.
# C or H*W not a multiple of 64, or unaligned data, use a plain one-thread-per-element kernel;
# non-4-D input falls back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define TP 64  // pixels per tile
#define TC 64  // channels per tile

// Element (pixel p, channel c) of the tile lives at p * TC + 4 * ((c / 4) ^ (p / 4)) + c % 4.
__device__ __forceinline__ int swz(int p, int c) { return p * TC + 4 * ((c >> 2) ^ (p >> 2)) + (c & 3); }

// x: N x C x HW, y: N x HW x C, C % TC == 0, HW % TP == 0, 16-byte aligned. blockDim = 256.
// Block b: channel tile b % ctiles, pixel tile (b / ctiles) % ptiles, image b / (ctiles * ptiles).
extern "C" __global__ void __launch_bounds__(256)
nchw_to_nhwc_tiled(const float4* __restrict__ x, float4* __restrict__ y, int C, int HW, int ctiles, int ptiles)
{
    __shared__ __align__(16) float tile[TP * TC];
    const int t = threadIdx.x;
    const int ct = blockIdx.x % ctiles;
    const int rest = blockIdx.x / ctiles;
    const int pt = rest % ptiles;
    const long long n = rest / ptiles;
    const int c0 = ct * TC, p0 = pt * TP;

    // Load: f = t + 256 s -> pixel quad p4 = (f & 7) + 8 * (f >> 9), channel (f >> 3) & 63.
    float4 v[4];
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int f = t + 256 * s;
        const int p4 = (f & 7) + 8 * (f >> 9);
        const int c = (f >> 3) & 63;
        v[s] = x[((n * C + c0 + c) * HW + p0) / 4 + p4];
    }
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int f = t + 256 * s;
        const int p4 = (f & 7) + 8 * (f >> 9);
        const int c = (f >> 3) & 63;
        tile[swz(4 * p4 + 0, c)] = v[s].x;
        tile[swz(4 * p4 + 1, c)] = v[s].y;
        tile[swz(4 * p4 + 2, c)] = v[s].z;
        tile[swz(4 * p4 + 3, c)] = v[s].w;
    }
    __syncthreads();
    // Store: g = t + 256 s -> pixel g >> 4, channel quad g & 15.
    #pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int g = t + 256 * s;
        const int p = g >> 4, c4 = g & 15;
        const float4 o = *reinterpret_cast<const float4*>(&tile[swz(p, 4 * c4)]);
        y[((n * HW + p0 + p) * C + c0) / 4 + c4] = o;
    }
}

// Any shape: one thread per output element y[n][p][c] = x[n][c][p].
extern "C" __global__ void __launch_bounds__(256)
nchw_to_nhwc_generic(const float* __restrict__ x, float* __restrict__ y, long long total, int C, long long HW)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int c = (int)(i % C);
    const long long p = (i / C) % HW;
    const long long n = i / (C * HW);
    y[i] = x[(n * C + c) * HW + p];
}
"""

_mod = cuda_agent.compile(_SRC)
_tiled = _mod.get_function("nchw_to_nhwc_tiled")
_generic = _mod.get_function("nchw_to_nhwc_generic")
_TP, _TC = 64, 64


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.dtype != torch.float32:
            return x.permute(0, 2, 3, 1).contiguous()
        x = x.contiguous()
        n, c, h, w = x.shape
        hw = h * w
        y = torch.empty(n, h, w, c, dtype=x.dtype, device=x.device)
        total = x.numel()
        if total == 0:
            return y
        ctiles, ptiles = c // _TC, hw // _TP
        fast = (c % _TC == 0 and hw % _TP == 0 and n * ctiles * ptiles <= 2**31 - 1
                and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0)
        if fast:
            _tiled((n * ctiles * ptiles,), (256,), (x, y, c, hw, ctiles, ptiles))
        else:
            _generic(((total + 255) // 256,), (256,), (x, y, total, c, hw))
        return y
