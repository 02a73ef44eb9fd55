# Reference solution for demo/linear_bias_relu: cuBLAS FP32 GEMM through
# cuda_agent.gemm (x @ W^T), then one vectorized in-place bias-add + ReLU kernel.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// y: rows x (4 * n4) floats, updated in place; bias: 4 * n4 floats. 16-byte aligned.
extern "C" __global__ void bias_relu_vec(float4* __restrict__ y,
                                         const float4* __restrict__ bias,
                                         long long rows, int n4)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n4) return;
    const float4 b = bias[c];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long i = r * n4 + c;
        float4 v = y[i];
        v.x = fmaxf(v.x + b.x, 0.0f);
        v.y = fmaxf(v.y + b.y, 0.0f);
        v.z = fmaxf(v.z + b.z, 0.0f);
        v.w = fmaxf(v.w + b.w, 0.0f);
        y[i] = v;
    }
}

extern "C" __global__ void bias_relu_scalar(float* __restrict__ y,
                                            const float* __restrict__ bias,
                                            long long rows, int n)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const float b = bias[c];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long i = r * n + c;
        y[i] = fmaxf(y[i] + b, 0.0f);
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_vec = _mod.get_function("bias_relu_vec")
_scalar = _mod.get_function("bias_relu_scalar")

_THREADS = 256
_TARGET_BLOCKS = 132 * 8


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight.contiguous()
        b = self.linear.bias.contiguous()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = cuda_agent.gemm(x2, w, trans_b=True)  # (rows, out_features), FP32
        rows, n = y.shape
        if rows > 0 and n > 0:
            aligned = y.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
            if n % 4 == 0 and aligned:
                cols, kernel = n // 4, _vec
            else:
                cols, kernel = n, _scalar
            gx = (cols + _THREADS - 1) // _THREADS
            gy = max(1, min(rows, _TARGET_BLOCKS // gx, 65535))
            kernel((gx, gy), (_THREADS,), (y, b, rows, cols))
        return y.reshape(*lead, n)
