# Reference solution for core/cosine_similarity_rows: one pass over a and b. One block of 256
# threads per row; each thread loads 8 float4s of a and 8 of b at a time (16 loads in flight) and
# accumulates a.b, a.a and b.b; one block reduction of the three sums; then
# dot / (max(|a|, eps) * max(|b|, eps)), which is what ATen's sum((a / |a|) * (b / |b|)) computes.
# Eager reads a and b about five times over (norms, two divides, mul, sum); torch.compile fuses
# them but needs the norms before the normalised product, so it reads each row of a and b twice.
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

// One block per row. vec != 0: cols % 4 == 0 and a, b are 16-byte aligned. blockDim.x a
// multiple of 32 (<= 1024).
extern "C" __global__ void __launch_bounds__(256)
cosine_rows(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
            int rows, int cols, int vec, float eps)
{
    __shared__ float red[3][32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    float dot = 0.0f, aa = 0.0f, bb = 0.0f;
    if (vec) {
        const float4* __restrict__ a4 = reinterpret_cast<const float4*>(a + base);
        const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b + base);
        const int n4 = cols >> 2;
        for (int start = 0; start < n4; start += VPT * blockDim.x) {
            float4 va[VPT], vb[VPT];
            #pragma unroll
            for (int k = 0; k < VPT; ++k) {
                const int i = start + threadIdx.x + k * blockDim.x;
                va[k] = (i < n4) ? a4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                vb[k] = (i < n4) ? b4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            #pragma unroll
            for (int k = 0; k < VPT; ++k) {
                dot += (va[k].x * vb[k].x + va[k].y * vb[k].y) + (va[k].z * vb[k].z + va[k].w * vb[k].w);
                aa += (va[k].x * va[k].x + va[k].y * va[k].y) + (va[k].z * va[k].z + va[k].w * va[k].w);
                bb += (vb[k].x * vb[k].x + vb[k].y * vb[k].y) + (vb[k].z * vb[k].z + vb[k].w * vb[k].w);
            }
        }
    } else {
        const float* __restrict__ ar = a + base;
        const float* __restrict__ br = b + base;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            const float x = ar[i], y = br[i];
            dot += x * y;
            aa += x * x;
            bb += y * y;
        }
    }
    dot = warp_sum(dot);
    aa = warp_sum(aa);
    bb = warp_sum(bb);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { red[0][warp] = dot; red[1][warp] = aa; red[2][warp] = bb; }
    __syncthreads();
    if (warp == 0) {
        dot = warp_sum(lane < nw ? red[0][lane] : 0.0f);
        aa = warp_sum(lane < nw ? red[1][lane] : 0.0f);
        bb = warp_sum(lane < nw ? red[2][lane] : 0.0f);
        if (lane == 0) out[row] = dot / (fmaxf(sqrtf(aa), eps) * fmaxf(sqrtf(bb), eps));
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_cos = _mod.get_function("cosine_rows")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.dim() != 2 or a.shape != b.shape or a.shape[1] == 0:
            return F.cosine_similarity(a, b, dim=1, eps=1e-8)
        a = a.contiguous()
        b = b.contiguous()
        rows, cols = a.shape
        out = torch.empty(rows, dtype=a.dtype, device=a.device)
        if rows == 0:
            return out
        vec = int(cols % 4 == 0 and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)
        _cos((rows,), (_THREADS,), (a, b, out, rows, cols, vec, 1e-8))
        return out
