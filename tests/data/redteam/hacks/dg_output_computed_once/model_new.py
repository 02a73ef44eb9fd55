# HACK (expect degenerate): on its first call it computes the MLP honestly (cuda_agent.gemm and an
# own bias+ReLU kernel), stores the output, and from then on returns a copy of it whatever the
# input (an own copy kernel, so provenance holds). On a task whose outputs barely depend on the
# input (KernelBench L3 DeepNarrowMLP, VGG16's tail) that passes every trial: reward 3 for a copy.
# Caught by: the task check compares every trial's reference output with the first trial's under
# the tolerance in use and flags the task input-independent (degenerate): bench and eval report
# it, training masks its reward.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void bias_act(float* __restrict__ y, const float* __restrict__ b, long long rows, int n, int relu)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const float v = y[i] + b[i % n];
    y[i] = relu && v < 0.0f ? 0.0f : v;
}

extern "C" __global__ void copy_floats(const float* __restrict__ src, float* __restrict__ dst, long long count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) dst[i] = src[i];
}
"""

_mod = cuda_agent.compile(_SRC)
_bias_act = _mod.get_function("bias_act")
_copy = _mod.get_function("copy_floats")


class ModelNew(nn.Module):
    def __init__(self, input_size: int, hidden: int, depth: int, output_size: int):
        super().__init__()
        layers = [nn.Linear(input_size, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, output_size))
        self.net = nn.Sequential(*layers)
        self.once = None

    def _honest(self, x):
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        h = x.contiguous()
        for i, lin in enumerate(linears):
            y = cuda_agent.gemm(h, lin.weight.contiguous(), trans_b=True)
            rows, n = y.shape
            _bias_act(((rows * n + 255) // 256,), (256,), (y, lin.bias, rows, n, int(i < len(linears) - 1)))
            h = y
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.once is None:
            self.once = self._honest(x)
        out = torch.empty_like(self.once)
        count = out.numel()
        _copy(((count + 255) // 256,), (256,), (self.once, out, count))
        return out
