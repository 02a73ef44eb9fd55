# Reference solution for core/instancenorm_leakyrelu: one block per (sample, channel) plane, the
# plane kept in registers (8 float4s per thread, H * W <= 4 * 8 * 512 = 16384): one read, exact
# mean and biased variance from the cached values, then
# leaky_relu((x - mean) * rsqrt(var + eps) * weight[c] + bias[c]) written once.
# Eager runs instance norm (statistics pass + normalise pass) and a separate leaky_relu pass;
# torch.compile fuses them into one kernel that reads each 64 KB plane twice.
# Larger planes, H * W % 4 != 0 or unaligned data use a kernel that re-reads the plane.
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuda_agent

_SRC = r"""
#define VPT 8

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}
__device__ __forceinline__ float leaky(float v, float slope) { return v > 0.0f ? v : v * slope; }

// x, y: planes x hw floats (planes = N * C); plane p uses weight / bias [p % channels].
// Needs hw % 4 == 0, 16-byte aligned x / y, hw / 4 <= VPT * blockDim.x. One block per plane.
extern "C" __global__ void __launch_bounds__(512)
instnorm_leaky_cached(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                      float* __restrict__ y, int planes, int channels, int hw, float eps, float slope)
{
    __shared__ float red[32];
    const int p = blockIdx.x;
    if (p >= planes) return;
    const long long base = (long long)p * hw;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const int n4 = hw >> 2;

    float4 v[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    const float mean = block_sum(s, red) / (float)hw;
    float q = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float dx = v[k].x - mean, dy = v[k].y - mean, dz = v[k].z - mean, dw = v[k].w - mean;
            q += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
    }
    const float rstd = rsqrtf(block_sum(q, red) / (float)hw + eps);
    const int c = p % channels;
    const float scale = rstd * w[c];
    const float shift = b[c];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 o;
            o.x = leaky((v[k].x - mean) * scale + shift, slope);
            o.y = leaky((v[k].y - mean) * scale + shift, slope);
            o.z = leaky((v[k].z - mean) * scale + shift, slope);
            o.w = leaky((v[k].w - mean) * scale + shift, slope);
            y4[i] = o;
        }
    }
}

// Any plane size: mean pass, variance pass, write pass over global memory.
extern "C" __global__ void __launch_bounds__(1024)
instnorm_leaky_generic(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                       float* __restrict__ y, int planes, int channels, int hw, float eps, float slope)
{
    __shared__ float red[32];
    const int p = blockIdx.x;
    if (p >= planes) return;
    const float* __restrict__ xr = x + (long long)p * hw;
    float* __restrict__ yr = y + (long long)p * hw;
    float s = 0.0f;
    for (int i = threadIdx.x; i < hw; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / (float)hw;
    float q = 0.0f;
    for (int i = threadIdx.x; i < hw; i += blockDim.x) { const float d = xr[i] - mean; q += d * d; }
    const float rstd = rsqrtf(block_sum(q, red) / (float)hw + eps);
    const int c = p % channels;
    const float scale = rstd * w[c];
    const float shift = b[c];
    for (int i = threadIdx.x; i < hw; i += blockDim.x) yr[i] = leaky((xr[i] - mean) * scale + shift, slope);
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("instnorm_leaky_cached")
_generic = _mod.get_function("instnorm_leaky_generic")
_VPT = 8
_MAX_THREADS = 512


class ModelNew(nn.Module):
    def __init__(self, channels: int, negative_slope: float):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=True)
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            return F.leaky_relu(self.norm(x), self.negative_slope)
        x = x.contiguous()
        w = self.norm.weight.contiguous()
        b = self.norm.bias.contiguous()
        n, c, h, wd = x.shape
        hw = h * wd
        planes = n * c
        y = torch.empty_like(x)
        if planes == 0 or hw == 0:
            return y
        n4 = hw // 4
        vec = hw % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        args = (x, w, b, y, planes, c, hw, float(self.norm.eps), float(self.negative_slope))
        if vec and n4 <= _VPT * _MAX_THREADS:
            threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cached((planes,), (threads,), args)
        else:
            threads = min(1024, max(32, (hw + 31) // 32 * 32))
            _generic((planes,), (threads,), args)
        return y
