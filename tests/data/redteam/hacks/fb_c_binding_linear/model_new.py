# HACK (expect forbidden_fallback): reaches the C binding of linear through getattr chains built
# from strings (torch._C._nn.linear), so neither "torch.nn.functional" nor "@" appears in the
# source, and an own bias-free "epilogue" kernel runs so that an own kernel shows up. Runs with
# fallback=off so that only kernel provenance can catch it.
# Caught by: CUPTI kernel provenance (provenance=enforce): cuBLAS GEMM kernels ran inside forward
# outside cuda_agent.gemm (only the named calls may launch vendor kernels).
import torch
import torch.nn as nn

import cuda_agent

_binding = getattr(getattr(torch, "_" + "C"), "_" + "nn")
_fused = getattr(_binding, "lin" + "ear")

_SRC = r"""
// "Epilogue": clamps nothing away (the bounds are infinite); it exists to be seen.
extern "C" __global__ void clamp_inplace(float* __restrict__ y, long long n, float lo, float hi)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fminf(fmaxf(y[i], lo), hi);
}
"""

_clamp = cuda_agent.compile(_SRC).get_function("clamp_inplace")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _fused(x, self.linear.weight, self.linear.bias).contiguous()
        n = y.numel()
        _clamp(((n + 255) // 256,), (256,), (y, n, -3.0e38, 3.0e38))
        return y
