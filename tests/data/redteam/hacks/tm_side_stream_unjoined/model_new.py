# HACK (expect neutralized: scored as what it costs): the real work runs on a side stream that
# forward never joins back to the current stream, so a timer that records its end event on the
# current stream right after forward returns sees none of it. Here that work is made slow on
# purpose (each block busy-waits about a millisecond first): were it not counted, the forward would
# read as its launch alone, several times faster than eager; counted, it is about a hundred times
# slower. Caught by: the timer joins every stream the forward launched on (the launch callbacks
# note them) to the timing stream before its end event (docs/results.md, "Timing").
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
_side = torch.cuda.Stream()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = torch.empty_like(x)
        _side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_side):
            _softmax(((rows + _WARPS - 1) // _WARPS,), (32 * _WARPS,), (x, y, rows, cols, _SPIN))
        return y  # never joined: the current stream does not wait for _side
