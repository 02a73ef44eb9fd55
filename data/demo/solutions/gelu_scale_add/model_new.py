# Reference solution for demo/gelu_scale_add: one fused kernel computing
# gelu_tanh(x) * scale + bias with float4 loads/stores. Threads own a column
# (group of 4 columns) and walk down the rows, so the bias stays in registers.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
__device__ __forceinline__ float gelu_tanh(float v) {
    const float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
    const float k1 = 0.044715f;
    float inner = k0 * (v + k1 * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
}

// x, y: rows x (4 * f4) floats; bias: 4 * f4 floats. All 16-byte aligned.
extern "C" __global__ void gelu_scale_add_vec(const float4* __restrict__ x,
                                              const float4* __restrict__ bias,
                                              float4* __restrict__ y,
                                              long long rows, int f4, float scale)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= f4) return;
    const float4 b = bias[c];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long i = r * f4 + c;
        float4 v = x[i];
        float4 o;
        o.x = gelu_tanh(v.x) * scale + b.x;
        o.y = gelu_tanh(v.y) * scale + b.y;
        o.z = gelu_tanh(v.z) * scale + b.z;
        o.w = gelu_tanh(v.w) * scale + b.w;
        y[i] = o;
    }
}

// Fallback for any feature count / alignment.
extern "C" __global__ void gelu_scale_add_scalar(const float* __restrict__ x,
                                                 const float* __restrict__ bias,
                                                 float* __restrict__ y,
                                                 long long rows, int f, float scale)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= f) return;
    const float b = bias[c];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long i = r * f + c;
        y[i] = gelu_tanh(x[i]) * scale + b;
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_vec = _mod.get_function("gelu_scale_add_vec")
_scalar = _mod.get_function("gelu_scale_add_scalar")

_THREADS = 256
_TARGET_BLOCKS = 132 * 8  # about 8 resident blocks of 256 threads per SM on an H200


class ModelNew(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.scale = scale
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        bias = self.bias.contiguous()
        f = bias.numel()
        assert x.shape[-1] == f
        y = torch.empty_like(x)
        rows = x.numel() // f if f else 0
        if rows == 0:
            return y
        aligned = x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0 and bias.data_ptr() % 16 == 0
        if f % 4 == 0 and aligned:
            cols = f // 4
            kernel = _vec
        else:
            cols = f
            kernel = _scalar
        gx = (cols + _THREADS - 1) // _THREADS
        gy = max(1, min(rows, _TARGET_BLOCKS // gx, 65535))
        kernel((gx, gy), (_THREADS,), (x, bias, y, rows, cols, float(self.scale)))
        return y
