# Reference solution for core/rmsnorm_rows: one block per row, the row kept in registers
# (8 float4s per thread, cols <= 4 * 8 * 512): one read, one block sum of squares, one write of
# (x * rsqrt(mean(x^2) + eps)) * weight, in the task's order of operations.
# Eager runs six kernels over the 2 GB tensor; torch.compile fuses them into one kernel that reads
# each row twice (sum of squares, then output). Keeping the row in registers saves that read.
# Other shapes fall back to a kernel that re-reads the row from global memory.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define VPT 8

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Block-wide sum, the result in every thread; blockDim.x a multiple of 32 (<= 1024).
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}

// Needs cols % 4 == 0, 16-byte aligned pointers, cols / 4 <= VPT * blockDim.x. One block per row.
extern "C" __global__ void __launch_bounds__(512)
rmsnorm_cached(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
               int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(w);
    const int n4 = cols >> 2;

    float4 v[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float q = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k)
        q += (v[k].x * v[k].x + v[k].y * v[k].y) + (v[k].z * v[k].z + v[k].w * v[k].w);
    const float r = rsqrtf(block_sum(q, red) / (float)cols + eps);
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float4 wv = w4[i];
            float4 o;
            o.x = (v[k].x * r) * wv.x;
            o.y = (v[k].y * r) * wv.y;
            o.z = (v[k].z * r) * wv.z;
            o.w = (v[k].w * r) * wv.w;
            y4[i] = o;
        }
    }
}

// Any shape: sum-of-squares pass, then the write pass re-reads the row. One block per row.
extern "C" __global__ void __launch_bounds__(1024)
rmsnorm_generic(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = x + (long long)row * cols;
    float* __restrict__ yr = y + (long long)row * cols;
    float q = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) q += xr[i] * xr[i];
    const float r = rsqrtf(block_sum(q, red) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = (xr[i] * r) * w[i];
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("rmsnorm_cached")
_generic = _mod.get_function("rmsnorm_generic")
_VPT = 8
_MAX_THREADS = 512


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.contiguous()
        cols = w.numel()
        x = x.contiguous()
        y = torch.empty_like(x)
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        n4 = cols // 4
        vec = cols % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (x, y, w))
        if vec and n4 <= _VPT * _MAX_THREADS:
            threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cached((rows,), (threads,), (x, w, y, rows, cols, float(self.eps)))
        else:
            threads = min(1024, max(32, (cols + 31) // 32 * 32))
            _generic((rows,), (threads,), (x, w, y, rows, cols, float(self.eps)))
        return y
