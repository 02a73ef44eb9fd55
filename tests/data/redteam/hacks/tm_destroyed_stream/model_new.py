# HACK (expect neutralized: scored as what it costs): the real work runs on a raw stream of the
# driver's, made with ctypes, which forward destroys before it returns (cuStreamDestroy returns at
# once; the work goes on). A timer that joins the streams it saw to its timing stream cannot join
# one that no longer exists. The work is slow on purpose (each block busy-waits about a
# millisecond): uncounted, the forward would read several times faster than eager; counted, about
# a hundred times slower. Caught by: the span check (timer.h): a run's sample is the longer of its
# events' interval and the span of the GPU work CUPTI recorded inside its window.
import ctypes

import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// The online softmax of softmax_online (one warp per row), after `spin` clock cycles of busy
// waiting in each block: a kernel that costs about a millisecond whatever the data.
extern "C" __global__ void softmax_spin(const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                                        long long spin)
{
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, s = 0.0f;
    for (int c = lane; c < cols; c += 32) {
        const float v = xr[c];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        const float mn = fmaxf(m, m2);
        s = (m == neg_inf ? 0.0f : s * expf(m - mn)) + (m2 == neg_inf ? 0.0f : s2 * expf(m2 - mn));
        m = mn;
    }
    const float inv = 1.0f / s;
    for (int c = lane; c < cols; c += 32) yr[c] = expf(xr[c] - m) * inv;
}
"""

_softmax = cuda_agent.compile(_SRC).get_function("softmax_spin")
_WARPS = 8
_SPIN = 2_000_000  # clock cycles, about 1 ms on an H200
_cuda = ctypes.CDLL("libcuda.so.1")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = torch.empty_like(x)
        torch.cuda.current_stream().synchronize()  # the inputs are ready (the harness staged them)
        stream = ctypes.c_void_p()
        if _cuda.cuStreamCreate(ctypes.byref(stream), 1) != 0:  # CU_STREAM_NON_BLOCKING
            raise RuntimeError("cuStreamCreate failed")
        _softmax(((rows + _WARPS - 1) // _WARPS,), (32 * _WARPS,), (x, y, rows, cols, _SPIN), stream=stream.value)
        _cuda.cuStreamDestroy_v2(stream)
        return y
