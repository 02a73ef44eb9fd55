# Reference solution for core/layernorm_rows: one block per row, the row kept in registers
# (8 float4s per thread, cols <= 4 * 8 * 512), so it is read from memory once and written once.
# Exact two-step statistics on the cached values: mean, then the mean of (x - mean)^2 (biased,
# as nn.LayerNorm), then (x - mean) * rsqrt(var + eps) * weight + bias.
# torch.compile and ATen's LayerNorm both read each 32 KB row twice (statistics, then output);
# here the second read comes from registers.
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
// Block-wide sum, the result in every thread. blockDim.x is a multiple of 32 (<= 1024); red is
// 32 floats of shared memory. The first __syncthreads makes back-to-back calls safe.
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
layernorm_cached(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                 float* __restrict__ y, int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(w);
    const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b);
    const int n4 = cols >> 2;

    float4 v[VPT];
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    #pragma unroll
    for (int k = 0; k < VPT; ++k) s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    const float mean = block_sum(s, red) / (float)cols;
    float q = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float dx = v[k].x - mean, dy = v[k].y - mean, dz = v[k].z - mean, dw = v[k].w - mean;
            q += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
    }
    const float var = block_sum(q, red) / (float)cols;
    const float rstd = rsqrtf(var + eps);
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float4 wv = w4[i], bv = b4[i];
            float4 o;
            o.x = (v[k].x - mean) * rstd * wv.x + bv.x;
            o.y = (v[k].y - mean) * rstd * wv.y + bv.y;
            o.z = (v[k].z - mean) * rstd * wv.z + bv.z;
            o.w = (v[k].w - mean) * rstd * wv.w + bv.w;
            y4[i] = o;
        }
    }
}

// Any shape: mean pass, variance pass, write pass over global memory. One block per row.
extern "C" __global__ void __launch_bounds__(1024)
layernorm_generic(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                  float* __restrict__ y, int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = x + (long long)row * cols;
    float* __restrict__ yr = y + (long long)row * cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / (float)cols;
    float q = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) { const float d = xr[i] - mean; q += d * d; }
    const float rstd = rsqrtf(block_sum(q, red) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("layernorm_cached")
_generic = _mod.get_function("layernorm_generic")
_VPT = 8
_MAX_THREADS = 512


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.ln.weight.contiguous()
        b = self.ln.bias.contiguous()
        cols = w.numel()
        x = x.contiguous()
        y = torch.empty_like(x)
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        n4 = cols // 4
        vec = (cols % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (x, y, w, b)))
        if vec and n4 <= _VPT * _MAX_THREADS:
            threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cached((rows,), (threads,), (x, w, b, y, rows, cols, float(self.ln.eps)))
        else:
            threads = min(1024, max(32, (cols + 31) // 32 * 32))
            _generic((rows,), (threads,), (x, w, b, y, rows, cols, float(self.ln.eps)))
        return y
