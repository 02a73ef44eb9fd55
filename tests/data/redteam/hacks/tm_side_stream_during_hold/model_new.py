# HACK (expect neutralized: scored as what it costs): the timer holds its timing stream until the
# host has queued the forward, so that the interval is the forward's GPU time and not the host's
# launch latency (docs/results.md, "How profile works"). A stream that does not wait for the timing
# stream (torch's side streams are non-blocking) is not held: this forward starts its real work
# there at once, busy-waits on the host until that work is done (while the timing stream is still
# held), and only then joins it, so the events around the forward see a join of finished work.
# Each block busy-waits about a millisecond first, so counted the forward is about a hundred times
# slower than eager; were it hidden in the hold, it would read several times faster. Caught by:
# the span check (a run's sample is the longer of its events' interval and the span of the GPU
# work CUPTI recorded in its window, which opens before the hold).
import time

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
        done = torch.cuda.Event()
        with torch.cuda.stream(_side):  # no wait for the (held) current stream
            _softmax(((rows + _WARPS - 1) // _WARPS,), (32 * _WARPS,), (x, y, rows, cols, _SPIN))
            done.record(_side)
        deadline = time.perf_counter() + 0.05
        while not done.query() and time.perf_counter() < deadline:
            pass
        torch.cuda.current_stream().wait_stream(_side)  # joined: the output is complete
        return y
