# Reference solution for core/masked_scaled_softmax: softmax(x * scale + mask) in one kernel that
# never reads scores whose mask entry is -inf (they cannot contribute: exp(-inf) = 0).
#   1. mask_row_range: for each mask row, the first and last column whose mask is not -inf
#      (16 MB read, once per call; any mask works, the causal one gives [0, r]).
#   2. masked_softmax: one block per score row, the row kept in registers (4 float4s per thread).
#      A float4 of scores is loaded only if it overlaps that range and not all of its 4 mask
#      entries are -inf, so for a causal mask about half of x is never read. Then block max, block
#      sum of exp(z - max), and exp(z - max) / sum written once (exact zeros where masked).
# Eager runs mul, add and softmax (three full passes); torch.compile fuses them into one kernel
# that reads all of x and the mask twice (online max/sum pass, then the output pass); this reads
# about half of x, once, and writes the output once.
# A mask that is not 2-D with the shape of x's last two dims, a row longer than 16384, or
# unaligned data falls back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define VPT 4

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? red[lane] : NEG_INF);
}
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}

// lo[r] / hi[r]: first / last column of mask row r that is not -inf (cols / -1 if none).
// One block per mask row, blockDim.x a multiple of 32.
extern "C" __global__ void __launch_bounds__(256)
mask_row_range(const float* __restrict__ mask, int mrows, int cols, int* __restrict__ lo, int* __restrict__ hi)
{
    __shared__ int s_lo[32];
    __shared__ int s_hi[32];
    const int r = blockIdx.x;
    if (r >= mrows) return;
    const float* __restrict__ mr = mask + (long long)r * cols;
    int l = cols, h = -1;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        if (mr[i] != NEG_INF) { l = min(l, i); h = max(h, i); }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        l = min(l, __shfl_xor_sync(0xffffffffu, l, o));
        h = max(h, __shfl_xor_sync(0xffffffffu, h, o));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { s_lo[warp] = l; s_hi[warp] = h; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; ++w) { l = min(l, s_lo[w]); h = max(h, s_hi[w]); }
        lo[r] = l;
        hi[r] = h;
    }
}

// x, y: rows x cols (rows = B * H * mrows); mask: mrows x cols, row (row % mrows) applies.
// Needs cols % 4 == 0, 16-byte aligned x / mask / y, cols / 4 <= VPT * blockDim.x.
extern "C" __global__ void __launch_bounds__(1024)
masked_softmax(const float* __restrict__ x, const float* __restrict__ mask,
               const int* __restrict__ lo, const int* __restrict__ hi, float* __restrict__ y,
               long long rows, int cols, int mrows, float scale)
{
    __shared__ float red[32];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const int mr = (int)(row % mrows);
    const int l = lo[mr], h = hi[mr];
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + row * cols);
    const float4* __restrict__ m4 = reinterpret_cast<const float4*>(mask + (long long)mr * cols);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + row * cols);
    const int n4 = cols >> 2;

    float4 z[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        z[k] = make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
        // Columns 4i .. 4i+3; outside [l, h] the mask is -inf by construction.
        if (i < n4 && 4 * i + 3 >= l && 4 * i <= h) {
            const float4 mk = m4[i];
            if (mk.x != NEG_INF || mk.y != NEG_INF || mk.z != NEG_INF || mk.w != NEG_INF) {
                const float4 xv = x4[i];
                z[k].x = xv.x * scale + mk.x;
                z[k].y = xv.y * scale + mk.y;
                z[k].z = xv.z * scale + mk.z;
                z[k].w = xv.w * scale + mk.w;
            }
        }
    }
    float m = NEG_INF;
    #pragma unroll
    for (int k = 0; k < VPT; ++k)
        m = fmaxf(m, fmaxf(fmaxf(z[k].x, z[k].y), fmaxf(z[k].z, z[k].w)));
    m = block_max(m, red);
    // A fully masked row has m = -inf: exp(-inf - -inf) = NaN everywhere, as in PyTorch.
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        z[k].x = expf(z[k].x - m);
        z[k].y = expf(z[k].y - m);
        z[k].z = expf(z[k].z - m);
        z[k].w = expf(z[k].w - m);
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) s += (z[k].x + z[k].y) + (z[k].z + z[k].w);
    }
    s = block_sum(s, red);
    const float inv = 1.0f / s;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 o;
            o.x = z[k].x * inv;
            o.y = z[k].y * inv;
            o.z = z[k].z * inv;
            o.w = z[k].w * inv;
            y4[i] = o;
        }
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_range = _mod.get_function("mask_row_range")
_softmax = _mod.get_function("masked_softmax")
_VPT = 4
_MAX_THREADS = 1024


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cols = x.shape[-1] if x.dim() >= 2 else 0
        ok = (x.dim() >= 2 and mask.dim() == 2 and tuple(mask.shape) == tuple(x.shape[-2:])
              and x.dtype == torch.float32 and mask.dtype == torch.float32
              and cols % 4 == 0 and 0 < cols // 4 <= _VPT * _MAX_THREADS and x.numel() > 0)
        if ok:
            x = x.contiguous()
            mask = mask.contiguous()
            y = torch.empty_like(x)
            ok = all(t.data_ptr() % 16 == 0 for t in (x, mask, y))
        if not ok:
            return torch.softmax(x * self.scale + mask, dim=-1)
        mrows = mask.shape[0]
        rows = x.numel() // cols
        lo = torch.empty(mrows, dtype=torch.int32, device=x.device)
        hi = torch.empty(mrows, dtype=torch.int32, device=x.device)
        _range((mrows,), (256,), (mask, mrows, cols, lo, hi))
        n4 = cols // 4
        threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
        _softmax((rows,), (threads,), (x, mask, lo, hi, y, rows, cols, mrows, float(self.scale)))
        return y
