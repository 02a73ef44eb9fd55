# Reference solution for core/rmsnorm_swiglu: silu(gate) * (x * rsqrt(mean(x^2) + eps) * weight)
# in one kernel. One block per row; each thread loads 4 float4s of x and 4 of gate up front
# (cols <= 4 * 4 * 1024), one block sum of squares, then the gated output written once:
# x and gate are read once (3.2 GB moved in all).
# Eager runs eight kernels (~13 GB moved); torch.compile fuses them into one kernel whose looped
# reduction reads each row of x twice.
# Other shapes fall back to PyTorch.
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuda_agent

_SRC = r"""
#define VPT 4

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
// ATen's silu: x / (1 + exp(-x)).
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Needs cols % 4 == 0, every pointer 16-byte aligned, cols / 4 <= VPT * blockDim.x.
extern "C" __global__ void __launch_bounds__(1024)
rmsnorm_swiglu_cached(const float* __restrict__ x, const float* __restrict__ gate, const float* __restrict__ w,
                      float* __restrict__ y, int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    const float4* __restrict__ g4 = reinterpret_cast<const float4*>(gate + base);
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(w);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const int n4 = cols >> 2;

    float4 v[VPT], g[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        g[k] = (i < n4) ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
            o.x = silu(g[k].x) * ((v[k].x * r) * wv.x);
            o.y = silu(g[k].y) * ((v[k].y * r) * wv.y);
            o.z = silu(g[k].z) * ((v[k].z * r) * wv.z);
            o.w = silu(g[k].w) * ((v[k].w * r) * wv.w);
            y4[i] = o;
        }
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("rmsnorm_swiglu_cached")
_VPT = 4
_MAX_THREADS = 1024


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def _reference(self, x, gate):
        normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
        return F.silu(gate) * normed

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        w = self.weight.contiguous()
        cols = w.numel()
        ok = (x.shape == gate.shape and x.numel() > 0 and x.shape[-1] == cols
              and cols % 4 == 0 and 0 < cols // 4 <= _VPT * _MAX_THREADS)
        if ok:
            x = x.contiguous()
            gate = gate.contiguous()
            y = torch.empty_like(x)
            ok = all(t.data_ptr() % 16 == 0 for t in (x, gate, w, y))
        if not ok:
            return self._reference(x, gate)
        rows = x.numel() // cols
        n4 = cols // 4
        threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
        _cached((rows,), (threads,), (x, gate, w, y, rows, cols, float(self.eps)))
        return y
