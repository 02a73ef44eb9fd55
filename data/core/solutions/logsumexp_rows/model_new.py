# Reference solution for core/logsumexp_rows: a single pass over the input. One block of 256
# threads per row; each thread loads 8 float4s at a time (for 8192 columns: the whole row in one
# step), folds them into a running (max, sum of exp(x - max)), and the block merges those pairs
# with warp shuffles and shared memory. The result is max + log(sum).
# Eager logsumexp runs amax, sub, exp, sum, log, add (about six passes over 4.3 GB).
# torch.compile fuses them; because the decomposition masks infinite maxima before subtracting,
# Inductor's online-softmax rewrite probably does not apply, leaving a max loop and an exp-sum
# loop over each 32 KB row (the second read partly from L2).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define VPT 8

// Merge the running state (m, s) with (om, os); s is the sum of exp(x - m).
__device__ __forceinline__ void combine(float& m, float& s, float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == NEG_INF) return;  // both sides still empty
    s = s * expf(m - nm) + os * expf(om - nm);
    m = nm;
}

// Every thread's (m, s) merged over the block; the result in every thread.
// blockDim.x is a multiple of 32 (<= 1024).
__device__ __forceinline__ void block_combine(float& m, float& s) {
    __shared__ float sm[32];
    __shared__ float ss[32];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o);
        const float os = __shfl_xor_sync(0xffffffffu, s, o);
        combine(m, s, om, os);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    m = lane < nw ? sm[lane] : NEG_INF;
    s = lane < nw ? ss[lane] : 0.0f;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o);
        const float os = __shfl_xor_sync(0xffffffffu, s, o);
        combine(m, s, om, os);
    }
}

// One block per row. vec != 0: cols % 4 == 0 and x is 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256)
logsumexp_rows(const float* __restrict__ x, float* __restrict__ out, int rows, int cols, int vec)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = x + (long long)row * cols;
    float m = NEG_INF, s = 0.0f;
    if (vec) {
        const float4* __restrict__ x4 = reinterpret_cast<const float4*>(xr);
        const int n4 = cols >> 2;
        for (int base = 0; base < n4; base += VPT * blockDim.x) {
            float4 v[VPT];
            #pragma unroll
            for (int k = 0; k < VPT; ++k) {
                const int i = base + threadIdx.x + k * blockDim.x;
                v[k] = (i < n4) ? x4[i] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            }
            float cm = NEG_INF;
            #pragma unroll
            for (int k = 0; k < VPT; ++k)
                cm = fmaxf(cm, fmaxf(fmaxf(v[k].x, v[k].y), fmaxf(v[k].z, v[k].w)));
            const float nm = fmaxf(m, cm);
            if (nm != NEG_INF) {
                float cs = 0.0f;
                #pragma unroll
                for (int k = 0; k < VPT; ++k)
                    cs += (expf(v[k].x - nm) + expf(v[k].y - nm)) + (expf(v[k].z - nm) + expf(v[k].w - nm));
                s = s * expf(m - nm) + cs;
                m = nm;
            }
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            const float v = xr[i];
            const float nm = fmaxf(m, v);
            if (nm != NEG_INF) {
                s = s * expf(m - nm) + expf(v - nm);
                m = nm;
            }
        }
    }
    block_combine(m, s);
    if (threadIdx.x == 0) {
        // All -inf: -inf (as torch); a +inf in the row: +inf.
        out[row] = (m == NEG_INF || m == -NEG_INF) ? m : m + logf(s);
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_lse = _mod.get_function("logsumexp_rows")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return torch.logsumexp(x, dim=1)
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, dtype=x.dtype, device=x.device)
        if rows == 0:
            return out
        if cols == 0:
            return out.fill_(float("-inf"))
        vec = int(cols % 4 == 0 and x.data_ptr() % 16 == 0)
        _lse((rows,), (_THREADS,), (x, out, rows, cols, vec))
        return out
