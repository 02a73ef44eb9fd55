# LEGIT (must pass): two kernels in sequence. A warp per row computes the mean and the reciprocal
# standard deviation (two passes over the row, the second one from L1/L2) into buffers made with
# torch.empty; a float4 elementwise kernel then normalises and applies ln.weight / ln.bias.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void row_stats(const float* __restrict__ x, float* __restrict__ mean,
                                     float* __restrict__ rstd, int rows, int cols, float eps)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += xr[c];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float mu = s / cols;
    float q = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float d = xr[c] - mu;
        q += d * d;
    }
    for (int off = 16; off > 0; off >>= 1) q += __shfl_xor_sync(0xffffffffu, q, off);
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rsqrtf(q / cols + eps);
    }
}

// cols % 4 == 0: each thread handles one float4 of one row.
extern "C" __global__ void normalize_vec4(const float4* __restrict__ x, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, const float4* __restrict__ w,
                                          const float4* __restrict__ b, float4* __restrict__ y,
                                          long long total4, int cols4)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total4) return;
    const long long row = i / cols4;
    const int c = (int)(i % cols4);
    const float mu = mean[row], rs = rstd[row];
    const float4 v = x[i], g = w[c], h = b[c];
    float4 o;
    o.x = (v.x - mu) * rs * g.x + h.x;
    o.y = (v.y - mu) * rs * g.y + h.y;
    o.z = (v.z - mu) * rs * g.z + h.z;
    o.w = (v.w - mu) * rs * g.w + h.w;
    y[i] = o;
}
"""

_mod = cuda_agent.compile(_SRC)
_row_stats = _mod.get_function("row_stats")
_normalize = _mod.get_function("normalize_vec4")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = x.shape[-1]
        if cols % 4:
            raise ValueError(f"normalize_vec4 needs a multiple of 4 columns, got {cols}")
        x2 = x.contiguous().view(-1, cols)
        rows = x2.shape[0]
        mean = torch.empty(rows, device=x.device, dtype=x.dtype)
        rstd = torch.empty(rows, device=x.device, dtype=x.dtype)
        _row_stats(((rows + 7) // 8,), (256,), (x2, mean, rstd, rows, cols, float(self.ln.eps)))
        y = torch.empty_like(x2)
        total4 = rows * cols // 4
        _normalize(((total4 + 255) // 256,), (256,),
                   (x2, mean, rstd, self.ln.weight, self.ln.bias, y, total4, cols // 4))
        return y.view(x.shape)
