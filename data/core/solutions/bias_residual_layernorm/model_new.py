# Reference solution for core/bias_residual_layernorm: layer_norm(x + bias + residual) in one
# kernel. One block per row; each thread loads 4 float4s of x and 4 of residual (cols <= 4 * 4 *
# 1024), keeps v = (x + bias) + residual in registers, and computes the exact mean and biased
# variance of v, then (v - mean) * rsqrt(var + eps) * weight + ln_bias: x and residual are read
# once and the output written once (3.2 GB moved).
# Eager materialises x + bias and the sum (two extra 1 GB tensors); torch.compile fuses all of it
# but its looped reduction reads x and residual twice (statistics, then output).
# Other shapes fall back to a kernel that recomputes v from global memory in each pass.
import torch
import torch.nn as nn

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

// Needs cols % 4 == 0, every pointer 16-byte aligned, cols / 4 <= VPT * blockDim.x.
extern "C" __global__ void __launch_bounds__(1024)
bias_res_ln_cached(const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ bias,
                   const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
                   int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    const float4* __restrict__ r4 = reinterpret_cast<const float4*>(res + base);
    const float4* __restrict__ c4 = reinterpret_cast<const float4*>(bias);
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(w);
    const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const int n4 = cols >> 2;

    float4 v[VPT], r[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        r[k] = (i < n4) ? r4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float4 c = c4[i];
            v[k].x = (v[k].x + c.x) + r[k].x;
            v[k].y = (v[k].y + c.y) + r[k].y;
            v[k].z = (v[k].z + c.z) + r[k].z;
            v[k].w = (v[k].w + c.w) + r[k].w;
            s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
        }
    }
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
    const float rstd = rsqrtf(block_sum(q, red) / (float)cols + eps);
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

// Any shape: three passes, v recomputed from x, bias and residual each time.
extern "C" __global__ void __launch_bounds__(1024)
bias_res_ln_generic(const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ bias,
                    const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
                    int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (x[base + i] + bias[i]) + res[base + i];
    const float mean = block_sum(s, red) / (float)cols;
    float q = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float d = ((x[base + i] + bias[i]) + res[base + i]) - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(block_sum(q, red) / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = (x[base + i] + bias[i]) + res[base + i];
        y[base + i] = (v - mean) * rstd * w[i] + b[i];
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("bias_res_ln_cached")
_generic = _mod.get_function("bias_res_ln_generic")
_VPT = 4
_MAX_THREADS = 1024


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.5)
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if x.shape != residual.shape:
            return self.ln(x + self.bias + residual)
        x = x.contiguous()
        residual = residual.contiguous()
        bias = self.bias.contiguous()
        w = self.ln.weight.contiguous()
        b = self.ln.bias.contiguous()
        cols = w.numel()
        y = torch.empty_like(x)
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        n4 = cols // 4
        vec = cols % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (x, residual, bias, w, b, y))
        args = (x, residual, bias, w, b, y, rows, cols, float(self.ln.eps))
        if vec and n4 <= _VPT * _MAX_THREADS:
            threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cached((rows,), (threads,), args)
        else:
            threads = min(1024, max(32, (cols + 31) // 32 * 32))
            _generic((rows,), (threads,), args)
        return y
