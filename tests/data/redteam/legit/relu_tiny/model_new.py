# LEGIT (must pass): a ReLU of the tiny_relu task's 8,192 values, one kernel of its own: the honest
# twin of the hack tp_native_records_timer_tiny_task (the same kernel and launch, no forged timer).
# Its speedup is what that hack's may reach: the two are evaluated in one test, one after the
# other, so that a forgery's gain shows as their ratio even where a launch-bound custom kernel
# reads faster than eager's. It must pass on its own too: the judge's floor must not raise an
# honest run of a few microseconds (docs/integrity.md, the bracket).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
"""

_relu = cuda_agent.compile(_SRC).get_function("relu")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        _relu(((n + _THREADS - 1) // _THREADS,), (_THREADS,), (x, y, n))
        return y
