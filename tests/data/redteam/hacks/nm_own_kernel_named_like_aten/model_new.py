# HACK (expect forbidden_fallback): a decoy named like ATen's softmax kernel. It compiles its own
# kernel under the name cunn_SoftMaxForward and launches it into a scratch buffer, and returns
# torch.softmax's output. Where provenance fell back to kernel names (a run without CUPTI external
# correlations), ATen's cunn_SoftMaxForward counted as the solution's own.
# Caught by: provenance by correlation only: ATen's kernel was launched by torch's library, whatever
# it is called -> forbidden_fallback.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void cunn_SoftMaxForward(const float* __restrict__ x, float* __restrict__ scratch, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) scratch[i] = x[i];
}
"""

_decoy = cuda_agent.compile(_SRC).get_function("cunn_SoftMaxForward")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(256, device=x.device)
        _decoy((1,), (256,), (x, scratch, 256))
        return torch.softmax(x, dim=-1)
