# Reference solution for core/argmax_dim0: torch.argmax(x, dim=0) for x of shape (R, C), as a
# column-wise reduction split over both columns and rows so that the whole GPU streams x once.
#   1. argmax_partial4: block (64, 4) owns 256 adjacent columns (one float4 per thread, a warp
#      reads 512 contiguous bytes of a row) and one slice of the rows; its 4 row phases walk the
#      slice 8 rows at a time (8 float4 loads in flight per thread), keep a running (max, first
#      index) per column, and merge in shared memory. For 16384 x 65536 that is 256 column tiles
#      x 16 row slices = 4096 blocks (about 31 per SM), each writing one (value, index) per column.
#   2. argmax_final: one thread per column merges the 16 slice results (6 MB, from L2).
# x (4.3 GB) is read exactly once with 16-byte coalesced loads; nothing else touches HBM.
# Inductor emits an outer (non-innermost) argmax as a Triton reduction that tracks value and
# index tiles and finishes with a tl.argmax-style cross-lane reduction per column tile, with
# fewer loads in flight; the row split here is meant to keep enough bytes in flight to run at
# HBM bandwidth.
# Semantics as torch.argmax: NaN counts as the largest value (the first NaN wins), ties and
# all -inf columns resolve to the FIRST index. C % 4 != 0 or an unaligned x uses the same
# kernels with scalar loads; an empty dim 0 falls back to PyTorch (which raises).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define TX 64
#define TY 4
#define UNROLL 8
#define NO_INDEX 0x7fffffff

// (v, i) beats (bv, bi) in torch.argmax order: NaN above everything, then value, then lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    if (v != v) return bv == bv || i < bi;
    if (bv != bv) return false;
    return v > bv || (v == bv && i < bi);
}

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

// Rows visited in increasing order, so a strict '>' keeps the first index of equal maxima.
__device__ __forceinline__ void scan_value(float v, int r, float& best, int& idx) {
    if (v > best || (v != v && best == best)) { best = v; idx = r; }
}

// blockDim = (TX, TY). x: rows x (cols_v * V) floats, row-major. Block (blockIdx.x, blockIdx.y)
// handles columns [blockIdx.x * TX * V, +TX * V) of rows [blockIdx.y * rows_per_split, +rows_per_split)
// and writes its per-column result to pval / pidx row blockIdx.y (splits x cols).
template <int V>
__device__ __forceinline__ void partial_body(const typename Vec<V>::T* __restrict__ x, float* __restrict__ pval,
                                             int* __restrict__ pidx, int rows, int cols_v, int rows_per_split)
{
    __shared__ float s_val[TY - 1][TX * V];
    __shared__ int s_idx[TY - 1][TX * V];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int cv = blockIdx.x * TX + tx;
    const int r0 = blockIdx.y * rows_per_split;
    const int r1 = min(rows, r0 + rows_per_split);
    float best[V];
    int idx[V];
    #pragma unroll
    for (int k = 0; k < V; ++k) { best[k] = NEG_INF; idx[k] = (r0 + ty < r1) ? r0 + ty : NO_INDEX; }
    if (cv < cols_v) {
        const typename Vec<V>::T* __restrict__ xc = x + cv;
        int r = r0 + ty;
        for (; r + (UNROLL - 1) * TY < r1; r += UNROLL * TY) {
            typename Vec<V>::T v[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = xc[(long long)(r + u * TY) * cols_v];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                #pragma unroll
                for (int k = 0; k < V; ++k) scan_value(Vec<V>::get(v[u], k), r + u * TY, best[k], idx[k]);
            }
        }
        for (; r < r1; r += TY) {
            const typename Vec<V>::T v = xc[(long long)r * cols_v];
            #pragma unroll
            for (int k = 0; k < V; ++k) scan_value(Vec<V>::get(v, k), r, best[k], idx[k]);
        }
    }
    if (ty > 0) {
        #pragma unroll
        for (int k = 0; k < V; ++k) { s_val[ty - 1][tx * V + k] = best[k]; s_idx[ty - 1][tx * V + k] = idx[k]; }
    }
    __syncthreads();
    if (ty == 0 && cv < cols_v) {
        const long long o = (long long)blockIdx.y * cols_v * V + (long long)cv * V;
        #pragma unroll
        for (int k = 0; k < V; ++k) {
            #pragma unroll
            for (int p = 0; p < TY - 1; ++p) {
                const float v = s_val[p][tx * V + k];
                const int i = s_idx[p][tx * V + k];
                if (better(v, i, best[k], idx[k])) { best[k] = v; idx[k] = i; }
            }
            pval[o + k] = best[k];
            pidx[o + k] = idx[k];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
argmax_partial4(const float4* __restrict__ x, float* __restrict__ pval, int* __restrict__ pidx,
                int rows, int cols4, int rows_per_split)
{
    partial_body<4>(x, pval, pidx, rows, cols4, rows_per_split);
}

extern "C" __global__ void __launch_bounds__(256)
argmax_partial1(const float* __restrict__ x, float* __restrict__ pval, int* __restrict__ pidx,
                int rows, int cols, int rows_per_split)
{
    partial_body<1>(x, pval, pidx, rows, cols, rows_per_split);
}

// One thread per column: merge the splits' (value, index) pairs, write the int64 index.
extern "C" __global__ void __launch_bounds__(256)
argmax_final(const float* __restrict__ pval, const int* __restrict__ pidx, long long* __restrict__ out,
             int cols, int splits)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float bv = pval[c];
    int bi = pidx[c];
    for (int s = 1; s < splits; ++s) {
        const float v = pval[(long long)s * cols + c];
        const int i = pidx[(long long)s * cols + c];
        if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    out[c] = bi;
}
"""

_mod = cuda_agent.compile(_SRC)
_partial4 = _mod.get_function("argmax_partial4")
_partial1 = _mod.get_function("argmax_partial1")
_final = _mod.get_function("argmax_final")
_TX, _TY, _UNROLL = 64, 4, 8
_TARGET_BLOCKS = 4096  # ~31 blocks of 256 threads per SM on 132 SMs: enough loads in flight


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[0] == 0 or x.dtype != torch.float32 or x.numel() >= 2**31:
            return torch.argmax(x, dim=0)
        x = x.contiguous()
        rows = x.shape[0]
        cols = x.numel() // rows
        out = torch.empty(x.shape[1:], dtype=torch.int64, device=x.device)
        if cols == 0:
            return out
        vec = cols % 4 == 0 and x.data_ptr() % 16 == 0
        v = 4 if vec else 1
        cols_v = cols // v
        tiles = (cols_v + _TX - 1) // _TX
        # Split the rows so that the grid has ~_TARGET_BLOCKS blocks, keeping >= 4 unrolled
        # iterations per thread; then make every split non-empty.
        min_rows = _TY * _UNROLL * 4
        splits = max(1, min((rows + min_rows - 1) // min_rows, (_TARGET_BLOCKS + tiles - 1) // tiles, 65535))
        rows_per_split = (rows + splits - 1) // splits
        splits = (rows + rows_per_split - 1) // rows_per_split
        pval = torch.empty(splits, cols, dtype=torch.float32, device=x.device)
        pidx = torch.empty(splits, cols, dtype=torch.int32, device=x.device)
        kernel = _partial4 if vec else _partial1
        kernel((tiles, splits), (_TX, _TY), (x, pval, pidx, rows, cols_v, rows_per_split))
        _final(((cols + 255) // 256,), (256,), (pval, pidx, out, cols, splits))
        return out
