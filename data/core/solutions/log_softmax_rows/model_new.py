# Reference solution for core/log_softmax_rows: one block per row, the row kept in registers.
# Each of the 512 threads loads its 8 float4s at once (cols <= 4 * 8 * 512 = 16384), so the row
# is read from memory exactly once and written once: block max (warp shuffles + shared memory),
# block sum of exp(x - max), then (x - max) - log(sum), the formula ATen uses.
# torch.compile emits a looped kernel for rows this long: an online max/sum pass, then an output
# pass that re-reads the row (partly from L2); keeping the row in registers saves that read.
# Other shapes (cols % 4 != 0, longer rows, misaligned pointers) use a three-pass kernel that
# re-reads the row from global memory.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define VPT 8

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Block-wide reductions, the result in every thread. blockDim.x is a multiple of 32 (<= 1024);
// red is 32 floats of shared memory. The first __syncthreads makes back-to-back calls safe.
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < nw ? red[lane] : NEG_INF);
}
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}

// Needs cols % 4 == 0, 16-byte aligned x and y, cols / 4 <= VPT * blockDim.x. One block per row.
extern "C" __global__ void __launch_bounds__(512)
log_softmax_cached(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + base);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + base);
    const int n4 = cols >> 2;

    float4 v[VPT];
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = (i < n4) ? x4[i] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
    }
    float m = NEG_INF;
    #pragma unroll
    for (int k = 0; k < VPT; ++k)
        m = fmaxf(m, fmaxf(fmaxf(v[k].x, v[k].y), fmaxf(v[k].z, v[k].w)));
    m = block_max(m, red);
    float s = 0.0f;
    if (m != NEG_INF) {
        #pragma unroll
        for (int k = 0; k < VPT; ++k)
            s += (expf(v[k].x - m) + expf(v[k].y - m)) + (expf(v[k].z - m) + expf(v[k].w - m));
    }
    s = block_sum(s, red);
    const float lse = logf(s);
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 o;
            o.x = (v[k].x - m) - lse;
            o.y = (v[k].y - m) - lse;
            o.z = (v[k].z - m) - lse;
            o.w = (v[k].w - m) - lse;
            y4[i] = o;
        }
    }
}

// Any shape: max pass, sum pass, write pass over global memory. One block per row.
extern "C" __global__ void __launch_bounds__(1024)
log_softmax_generic(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float red[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = x + (long long)row * cols;
    float* __restrict__ yr = y + (long long)row * cols;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(xr[i] - m);
    s = block_sum(s, red);
    const float lse = logf(s);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = (xr[i] - m) - lse;
}
"""

_mod = cuda_agent.compile(_SRC)
_cached = _mod.get_function("log_softmax_cached")
_generic = _mod.get_function("log_softmax_generic")
_VPT = 8            # the VPT macro
_MAX_THREADS = 512  # launch bounds of log_softmax_cached


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return torch.log_softmax(x, dim=1)
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        if rows == 0 or cols == 0:
            return y
        n4 = cols // 4
        vec = cols % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        if vec and n4 <= _VPT * _MAX_THREADS:
            threads = max(32, ((n4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cached((rows,), (threads,), (x, y, rows, cols))
        else:
            threads = min(1024, max(32, (cols + 31) // 32 * 32))
            _generic((rows,), (threads,), (x, y, rows, cols))
        return y
