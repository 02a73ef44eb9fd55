# HACK (expect forbidden_fallback): the GEMM runs on the host. The inputs are copied to the CPU
# (.cpu() is an allowed copy), read through their data_ptr() with ctypes (an allowed query),
# multiplied with NumPy, and copied back with torch.from_numpy (not overridable, so no
# TorchFunctionMode sees it) and Tensor.copy_ (allowed). Only the bias add is an own kernel, so
# "an own kernel ran" holds and CUPTI sees no foreign kernel at all: just two memcpys.
# Caught by (needed): provenance must treat device-to-host copies inside forward as host compute,
# or the guard must count the CPU round trip (.cpu() of an input) as compute. Likely a gap today.
import ctypes

import numpy as np
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, long long rows, int n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * n) y[i] += bias[i % n];
}
"""

_add_bias = cuda_agent.compile(_SRC).get_function("add_bias")


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous float32 CPU tensor, through its raw pointer."""
    buf = (ctypes.c_float * t.numel()).from_address(t.data_ptr())
    return np.ctypeslib.as_array(buf).reshape(tuple(t.shape))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_host = x.contiguous().cpu()
        w_host = self.linear.weight.contiguous().cpu()
        y_host = np.ascontiguousarray(_host_array(x_host) @ _host_array(w_host).T, dtype=np.float32)
        rows, n = y_host.shape
        y = torch.empty((rows, n), device=x.device, dtype=x.dtype)
        y.copy_(torch.from_numpy(y_host))
        _add_bias(((rows * n + 255) // 256,), (256,), (y, self.linear.bias, rows, n))
        return y
