# Reference solution for core/cumsum_rows: one block (8 warps) per row, the row kept in registers.
# Warp w owns a contiguous segment of the row; lane l holds float4 number c * 32 + l of it for
# chunk c = 0..chunks-1 (coalesced 512-byte loads, all issued before any arithmetic). Each chunk is
# scanned in registers (in-thread scan of the float4, warp shuffle scan of the lane totals, a
# running carry), then every warp adds the totals of the warps before it (shared memory), and the
# row is written once. Rows up to 4 * 32 * 8 * 8 = 8192 floats take this path.
# This reads the row once and writes it once, all loads issued up front. ATen's innermost-dim
# scan (eager) uses 16 threads per row and a barrier per 32 elements; torch.compile emits a Triton
# associative scan, so the margin over compile is uncertain.
# Other shapes use a tile-by-tile block scan that still reads and writes each element once.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define WARPS 8
#define CMAX 8

// Inclusive scan of v over the warp.
__device__ __forceinline__ float warp_incl_scan(float v, int lane) {
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// blockDim.x == 32 * WARPS. Needs cols % 4 == 0, 16-byte aligned pointers and
// cols / 4 <= WARPS * 32 * chunks with 1 <= chunks <= CMAX. One block per row.
extern "C" __global__ void __launch_bounds__(256)
cumsum_cached(const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int chunks)
{
    __shared__ float warp_tot[WARPS];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const int n4 = cols >> 2;
    const int seg = warp * chunks * 32;  // first float4 of this warp's segment

    float4 v[CMAX];
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        const int i = seg + c * 32 + lane;
        v[c] = (c < chunks && i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float carry = 0.0f;  // sum of this warp's earlier chunks (the same in every lane)
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        if (c < chunks) {
            v[c].y += v[c].x;
            v[c].z += v[c].y;
            v[c].w += v[c].z;
            const float incl = warp_incl_scan(v[c].w, lane);
            float excl = __shfl_up_sync(0xffffffffu, incl, 1);
            if (lane == 0) excl = 0.0f;
            const float add = carry + excl;
            v[c].x += add;
            v[c].y += add;
            v[c].z += add;
            v[c].w += add;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    if (lane == 0) warp_tot[warp] = carry;
    __syncthreads();
    float off = 0.0f;
    for (int w = 0; w < warp; ++w) off += warp_tot[w];
    #pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        const int i = seg + c * 32 + lane;
        if (c < chunks && i < n4) {
            float4 o = v[c];
            o.x += off;
            o.y += off;
            o.z += off;
            o.w += off;
            y4[i] = o;
        }
    }
}

// Any shape: the row in tiles of blockDim.x elements, each tile block-scanned and offset by the
// running total. blockDim.x == 32 * WARPS. One block per row.
extern "C" __global__ void __launch_bounds__(256)
cumsum_generic(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float warp_tot[WARPS];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* __restrict__ xr = x + (long long)row * cols;
    float* __restrict__ yr = y + (long long)row * cols;
    float carry = 0.0f;
    for (int start = 0; start < cols; start += blockDim.x) {
        const int i = start + threadIdx.x;
        const float incl = warp_incl_scan(i < cols ? xr[i] : 0.0f, lane);
        if (lane == 31) warp_tot[warp] = incl;
        __syncthreads();
        float off = carry, total = 0.0f;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float t = warp_tot[w];
            if (w < warp) off += t;
            total += t;
        }
        if (i < cols) yr[i] = incl + off;
        carry += total;
        __syncthreads();  // warp_tot is rewritten by the next tile
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("cumsum_cached")
_generic = _mod.get_function("cumsum_generic")
_WARPS = 8
_CMAX = 8


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or self.dim not in (-1, x.dim() - 1):
            return torch.cumsum(x, dim=self.dim)
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        n4 = cols // 4
        chunks = (n4 + _WARPS * 32 - 1) // (_WARPS * 32)
        vec = cols % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        if vec and 1 <= chunks <= _CMAX:
            _cached((rows,), (_WARPS * 32,), (x, y, rows, cols, chunks))
        else:
            _generic((rows,), (_WARPS * 32,), (x, y, rows, cols))
        return y
