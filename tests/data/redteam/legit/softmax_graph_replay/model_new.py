# LEGIT (must pass): the softmax kernel of softmax_online, captured once into a CUDA graph
# (torch.cuda.graph) on the first forward and replayed on every one: the launches made while
# capturing create graph nodes and run nothing, so they must not count as launches without a
# kernel record; the replay's kernels are recorded under the graph launch. Replays are not the
# solution's own launches, so provenance only reports here.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void softmax_online(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
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
            s = s * expf(m - v) + 1.0f;  // exp(-inf) = 0 on the first element
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

_softmax = cuda_agent.compile(_SRC).get_function("softmax_online")
_WARPS = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._graph = None

    def _capture(self, x):
        self._x = torch.empty_like(x)
        self._y = torch.empty_like(x)
        rows, cols = x.shape
        grid = ((rows + _WARPS - 1) // _WARPS,)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # one launch outside capture first (loads the module)
            _softmax(grid, (32 * _WARPS,), (self._x, self._y, rows, cols))
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            _softmax(grid, (32 * _WARPS,), (self._x, self._y, rows, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if self._graph is None or self._x.shape != x.shape:
            self._capture(x)
        self._x.copy_(x)
        self._graph.replay()
        return self._y.clone()
