# Reference solution for core/layernorm_residual_dropout: residual + dropout(layer_norm(x)) with
# p = 0 (dropout is the identity) in one kernel. One block per row; each thread keeps 4 float4s of
# x in registers (cols <= 4 * 4 * 1024) and prefetches the matching residual float4s before the
# reductions: exact mean and biased variance, then residual + ((x - mean) * rstd * w + b).
# x and residual are read once, the output written once (3.2 GB moved).
# Eager writes the normalised tensor and reads it back for the add; torch.compile fuses the add
# but its reduction reads each row of x twice.
# A dropout with p > 0 in training mode (random) or other shapes fall back to PyTorch.
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
ln_residual_cached(const float* __restrict__ x, const float* __restrict__ res,
                   const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
                   int rows, int cols, float eps)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    const float4* __restrict__ r4 = reinterpret_cast<const float4*>(res + base);
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
    const float rstd = rsqrtf(block_sum(q, red) / (float)cols + eps);
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            const float4 wv = w4[i], bv = b4[i];
            float4 o;
            o.x = r[k].x + ((v[k].x - mean) * rstd * wv.x + bv.x);
            o.y = r[k].y + ((v[k].y - mean) * rstd * wv.y + bv.y);
            o.z = r[k].z + ((v[k].z - mean) * rstd * wv.z + bv.z);
            o.w = r[k].w + ((v[k].w - mean) * rstd * wv.w + bv.w);
            y4[i] = o;
        }
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("ln_residual_cached")
_VPT = 4
_MAX_THREADS = 1024


class ModelNew(nn.Module):
    def __init__(self, features: int, dropout_p: float):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        self.dropout = nn.Dropout(p=dropout_p)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        w = self.ln.weight.contiguous()
        b = self.ln.bias.contiguous()
        cols = w.numel()
        dropout_is_identity = self.dropout.p == 0.0 or not self.training
        ok = (dropout_is_identity and x.shape == residual.shape and x.numel() > 0
              and cols % 4 == 0 and 0 < cols // 4 <= _VPT * _MAX_THREADS)
        if ok:
            x = x.contiguous()
            residual = residual.contiguous()
            y = torch.empty_like(x)
            ok = all(t.data_ptr() % 16 == 0 for t in (x, residual, w, b, y))
        if not ok:
            return residual + self.dropout(self.ln(x))
        rows = x.numel() // cols
        n4 = cols // 4
        threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
        _cached((rows,), (threads,), (x, residual, w, b, y, rows, cols, float(self.ln.eps)))
        return y
