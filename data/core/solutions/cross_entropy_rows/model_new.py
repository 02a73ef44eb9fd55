# Reference solution for core/cross_entropy_rows: per-row cross-entropy in a single read of the
# logits. One block of 512 threads per row; each thread streams its float4s 8 at a time (all 8
# loads in flight) into a running (max, sum of exp(x - max)); the block merges the pairs with
# warp shuffles and shared memory; thread 0 reads the target's logit and writes
# -((x_t - max) - log(sum)), i.e. -log_softmax(x)[t] as ATen computes it.
# Eager writes the whole 4.3 GB log_softmax and reads it back for nll_loss. torch.compile (with
# Inductor's online-softmax rewrite, on by default) also reads the logits once, so against it this
# kernel only competes on efficiency: a clear win over eager, an uncertain one over compile.
import torch
import torch.nn as nn
import torch.nn.functional as F

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define VPT 8

__device__ __forceinline__ void combine(float& m, float& s, float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == NEG_INF) return;
    s = s * expf(m - nm) + os * expf(om - nm);
    m = nm;
}

// Every thread's (m, s) merged over the block; the result in every thread.
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

// One block per row. vec != 0: cols % 4 == 0 and logits is 16-byte aligned.
// Targets equal to ignore_index give 0 (as reduction='none' does); other out-of-range targets NaN.
extern "C" __global__ void __launch_bounds__(512)
cross_entropy_rows(const float* __restrict__ logits, const long long* __restrict__ target,
                   float* __restrict__ out, int rows, int cols, int vec, long long ignore_index)
{
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* __restrict__ xr = logits + (long long)row * cols;
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
        const long long t = target[row];
        float loss;
        if (t == ignore_index) loss = 0.0f;
        else if (t < 0 || t >= cols) loss = __int_as_float(0x7fc00000);  // NaN
        else loss = -((xr[t] - m) - logf(s));
        out[row] = loss;
    }
}
"""

_mod = cuda_agent.compile(_SRC)
_ce = _mod.get_function("cross_entropy_rows")
_THREADS = 512


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or target.dim() != 1 or target.dtype != torch.int64:
            return F.cross_entropy(logits, target, reduction="none")
        logits = logits.contiguous()
        target = target.contiguous()
        rows, cols = logits.shape
        out = torch.empty(rows, dtype=logits.dtype, device=logits.device)
        if rows == 0 or cols == 0:
            return F.cross_entropy(logits, target, reduction="none")
        vec = int(cols % 4 == 0 and logits.data_ptr() % 16 == 0)
        _ce((rows,), (_THREADS,), (logits, target, out, rows, cols, vec, -100))
        return out
