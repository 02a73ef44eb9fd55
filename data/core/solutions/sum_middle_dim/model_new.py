# Reference solution for core/sum_middle_dim: torch.sum(x, dim) for a reduced dim that is not the
# innermost one, x viewed as (outer, R, inner) -> (outer, inner), split over columns AND rows so
# that the GPU streams x once at full bandwidth.
#   1. sum_partial4: block (64, 4) owns 256 adjacent inner columns of one outer index (one float4
#      per thread, a warp reads 512 contiguous bytes) and one slice of the R rows; its 4 row
#      phases walk the slice 8 rows at a time (8 independent float4 loads per thread), then add
#      up in shared memory. For (64, 4096, 4096): 64 x 16 column tiles x 4 row slices = 4096
#      blocks (~31 per SM), 256 rows per thread.
#   2. sum_final: adds the 4 slice partials (4 MB, from L2) in slice order. With a single
#      slice the partial kernel writes the output directly.
# x (4.3 GB) is read once with 16-byte coalesced loads. Inductor's outer reduction is a Triton
# kernel of [XBLOCK, RBLOCK] tiles with one program per column tile looping over all 4096 rows
# (1024-4096 programs, fewer loads in flight); the row split is meant to keep enough bytes in
# flight to stay at HBM bandwidth. fp32 accumulation, as in ATen and Inductor.
# Reducing the innermost dim, an unaligned x or inner % 4 != 0 use the same kernels with
# scalar loads; non-fp32 inputs fall back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define TX 64
#define TY 4
#define UNROLL 8

template <int V> struct Vec;
template <> struct Vec<4> {
    typedef float4 T;
    static __device__ __forceinline__ float get(const float4& v, int k) {
        return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
    }
};
template <> struct Vec<1> {
    typedef float T;
    static __device__ __forceinline__ float get(float v, int) { return v; }
};

// x: outer x rows x (inner_v * V) floats. grid = (tiles * outer, splits), blockDim = (TX, TY).
// Block (t + tiles * o, s) sums rows [s * rows_per_split, +rows_per_split) of columns
// [t * TX * V, +TX * V) of outer index o into part[s][o][col] (part: splits x outer x inner).
template <int V>
__device__ __forceinline__ void partial_body(const typename Vec<V>::T* __restrict__ x, float* __restrict__ part,
                                             int outer, int rows, int inner_v, int tiles, int rows_per_split)
{
    __shared__ float s_sum[TY - 1][TX * V];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int o = blockIdx.x / tiles;
    const int cv = (blockIdx.x - o * tiles) * TX + tx;
    const int r0 = blockIdx.y * rows_per_split;
    const int r1 = min(rows, r0 + rows_per_split);
    float acc[V];
    #pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    if (cv < inner_v) {
        const typename Vec<V>::T* __restrict__ xc = x + (long long)o * rows * inner_v + cv;
        int r = r0 + ty;
        for (; r + (UNROLL - 1) * TY < r1; r += UNROLL * TY) {
            typename Vec<V>::T v[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = xc[(long long)(r + u * TY) * inner_v];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                #pragma unroll
                for (int k = 0; k < V; ++k) acc[k] += Vec<V>::get(v[u], k);
            }
        }
        for (; r < r1; r += TY) {
            const typename Vec<V>::T v = xc[(long long)r * inner_v];
            #pragma unroll
            for (int k = 0; k < V; ++k) acc[k] += Vec<V>::get(v, k);
        }
    }
    if (ty > 0) {
        #pragma unroll
        for (int k = 0; k < V; ++k) s_sum[ty - 1][tx * V + k] = acc[k];
    }
    __syncthreads();
    if (ty == 0 && cv < inner_v) {
        const long long base = ((long long)blockIdx.y * outer + o) * inner_v * V + (long long)cv * V;
        #pragma unroll
        for (int k = 0; k < V; ++k) {
            float s = acc[k];
            #pragma unroll
            for (int p = 0; p < TY - 1; ++p) s += s_sum[p][tx * V + k];
            part[base + k] = s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
sum_partial4(const float4* __restrict__ x, float* __restrict__ part, int outer, int rows, int inner4,
             int tiles, int rows_per_split)
{
    partial_body<4>(x, part, outer, rows, inner4, tiles, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(256)
sum_partial1(const float* __restrict__ x, float* __restrict__ part, int outer, int rows, int inner,
             int tiles, int rows_per_split)
{
    partial_body<1>(x, part, outer, rows, inner, tiles, rows_per_split);
}

// out[i] = sum over s of part[s][i], in split order. n = outer * inner.
extern "C" __global__ void __launch_bounds__(256)
sum_final(const float* __restrict__ part, float* __restrict__ out, long long n, int splits)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = part[i];
    for (int k = 1; k < splits; ++k) s += part[(long long)k * n + i];
    out[i] = s;
}
"""

_mod = cuda_agent.compile(_SRC)
_partial4 = _mod.get_function("sum_partial4")
_partial1 = _mod.get_function("sum_partial1")
_final = _mod.get_function("sum_final")
_TX, _TY, _UNROLL = 64, 4, 8
_TARGET_BLOCKS = 4096  # ~31 blocks of 256 threads per SM on 132 SMs: enough loads in flight


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.dtype != torch.float32 or not -x.dim() <= self.dim < x.dim():
            return torch.sum(x, dim=self.dim)
        d = self.dim % x.dim()
        x = x.contiguous()
        out_shape = x.shape[:d] + x.shape[d + 1:]
        rows = x.shape[d]
        outer = 1
        for s in x.shape[:d]:
            outer *= s
        inner = 1
        for s in x.shape[d + 1:]:
            inner *= s
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        n = outer * inner
        if n == 0:
            return out
        if rows == 0:
            return out.zero_()
        vec = inner % 4 == 0 and x.data_ptr() % 16 == 0
        v = 4 if vec else 1
        inner_v = inner // v
        tiles = (inner_v + _TX - 1) // _TX
        blocks_x = tiles * outer
        if blocks_x > 2**31 - 1 or inner_v * v * outer >= 2**31 or rows >= 2**31:
            return torch.sum(x, dim=self.dim)
        min_rows = _TY * _UNROLL * 4
        splits = max(1, min((rows + min_rows - 1) // min_rows, (_TARGET_BLOCKS + blocks_x - 1) // blocks_x, 65535))
        rows_per_split = (rows + splits - 1) // splits
        splits = (rows + rows_per_split - 1) // rows_per_split
        part = out if splits == 1 else torch.empty(splits, n, dtype=torch.float32, device=x.device)
        kernel = _partial4 if vec else _partial1
        kernel((blocks_x, splits), (_TX, _TY), (x, part, outer, rows, inner_v, tiles, rows_per_split))
        if splits > 1:
            _final(((n + 255) // 256,), (256,), (part, out, n, splits))
        return out
