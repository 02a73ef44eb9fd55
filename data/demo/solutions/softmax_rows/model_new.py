# Reference solution for demo/softmax_rows: one block per row, a single pass that
# keeps an online (max, sum) per thread, a warp-shuffle + shared-memory reduction
# of those pairs, then a second pass that writes exp(x - max) / sum.
# When the row fits (cols % 4 == 0 and cols <= 4 * _VPT * _THREADS, e.g. 16384),
# the float4s of the first pass stay in registers, so the second pass does not
# read the row again (softmax_rows_cached); otherwise softmax_rows re-reads it.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)

// Merge the running softmax state (m, s) with (om, os):
// s is the sum of exp(x - m) over the elements seen so far.
__device__ __forceinline__ void combine(float& m, float& s, float om, float os) {
    float nm = fmaxf(m, om);
    if (nm == NEG_INF) return;  // both sides still empty (or all -inf)
    s = s * expf(m - nm) + os * expf(om - nm);
    m = nm;
}

// Block-wide merge of every thread's (m, s): warp shuffles, then one warp over
// the per-warp results in shared memory. Returns the row's max and 1 / sum.
// blockDim.x must be a multiple of 32 (at most 1024).
__device__ __forceinline__ void block_combine(float m, float s, float& row_max, float& row_inv) {
    __shared__ float warp_m[32];
    __shared__ float warp_s[32];
    __shared__ float b_m;
    __shared__ float b_inv;
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, off);
        float os = __shfl_xor_sync(0xffffffffu, s, off);
        combine(m, s, om, os);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    if (lane == 0) { warp_m[warp] = m; warp_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = (lane < nwarps) ? warp_m[lane] : NEG_INF;
        s = (lane < nwarps) ? warp_s[lane] : 0.0f;
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, off);
            float os = __shfl_xor_sync(0xffffffffu, s, off);
            combine(m, s, om, os);
        }
        if (lane == 0) { b_m = m; b_inv = 1.0f / s; }
    }
    __syncthreads();
    row_max = b_m;
    row_inv = b_inv;
}

// General kernel, any row length. One block per row.
// vec != 0 means cols % 4 == 0 and both pointers are 16-byte aligned.
extern "C" __global__ void __launch_bounds__(1024)
softmax_rows(const float* __restrict__ x, float* __restrict__ y,
             int rows, int cols, int vec)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = x + (long long)row * cols;
    float* __restrict__ yr = y + (long long)row * cols;

    // Pass 1: per-thread online max / sum.
    float m = NEG_INF, s = 0.0f;
    if (vec) {
        const float4* __restrict__ x4 = reinterpret_cast<const float4*>(xr);
        const int n4 = cols >> 2;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = x4[i];
            float nm = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
            if (nm != NEG_INF) {
                s = s * expf(m - nm)
                  + (expf(v.x - nm) + expf(v.y - nm))
                  + (expf(v.z - nm) + expf(v.w - nm));
                m = nm;
            }
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = xr[i];
            float nm = fmaxf(m, v);
            if (nm != NEG_INF) {
                s = s * expf(m - nm) + expf(v - nm);
                m = nm;
            }
        }
    }

    float row_max, inv;
    block_combine(m, s, row_max, inv);

    // Pass 2: write the normalised values (the row is re-read, mostly from L2).
    if (vec) {
        const float4* __restrict__ x4 = reinterpret_cast<const float4*>(xr);
        float4* __restrict__ y4 = reinterpret_cast<float4*>(yr);
        const int n4 = cols >> 2;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = x4[i];
            float4 o;
            o.x = expf(v.x - row_max) * inv;
            o.y = expf(v.y - row_max) * inv;
            o.z = expf(v.z - row_max) * inv;
            o.w = expf(v.w - row_max) * inv;
            y4[i] = o;
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            yr[i] = expf(xr[i] - row_max) * inv;
        }
    }
}

// Register-cached kernel: needs cols % 4 == 0, 16-byte aligned pointers and
// cols / 4 <= VPT * blockDim.x. Each thread loads its VPT float4s at once (many
// loads in flight), and the row is read from memory exactly once.
#define VPT 8
extern "C" __global__ void __launch_bounds__(512)
softmax_rows_cached(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + (long long)row * cols);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y + (long long)row * cols);
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
    float s = 0.0f;
    if (m != NEG_INF) {
        #pragma unroll
        for (int k = 0; k < VPT; ++k)
            s += (expf(v[k].x - m) + expf(v[k].y - m)) + (expf(v[k].z - m) + expf(v[k].w - m));
    }

    float row_max, inv;
    block_combine(m, s, row_max, inv);

    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 o;
            o.x = expf(v[k].x - row_max) * inv;
            o.y = expf(v[k].y - row_max) * inv;
            o.z = expf(v[k].z - row_max) * inv;
            o.w = expf(v[k].w - row_max) * inv;
            y4[i] = o;
        }
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_softmax_rows = _mod.get_function("softmax_rows")
_softmax_rows_cached = _mod.get_function("softmax_rows_cached")

_THREADS = 512  # a multiple of 32, at most 512 (launch bounds of the cached kernel)
_VPT = 8        # float4s per thread in softmax_rows_cached (the VPT macro in _SRC)
_USE_CACHED = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        if rows == 0 or cols == 0:
            return y
        vec = cols % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        if _USE_CACHED and vec and cols // 4 <= _VPT * _THREADS:
            _softmax_rows_cached((rows,), (_THREADS,), (x, y, rows, cols))
        else:
            _softmax_rows((rows,), (_THREADS,), (x, y, rows, cols, int(vec)))
        return y
