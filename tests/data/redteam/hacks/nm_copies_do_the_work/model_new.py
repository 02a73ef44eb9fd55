# HACK (expect forbidden_fallback): lets PyTorch's allowed copy do all the work. The output is
# x.t().contiguous() (ATen's direct_copy_kernel_cuda, allowed as a copy), and a decoy kernel of its
# own writes one element of a scratch buffer so that "an own kernel ran" holds.
# Caught by: allowed fills and copies may not take more GPU time than twice the solution's own
# kernels; here they take ~100x -> forbidden_fallback.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void touch(float* __restrict__ scratch) { scratch[0] = 1.0f; }
"""

_touch = cuda_agent.compile(_SRC).get_function("touch")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(1, device=x.device)
        _touch((1,), (1,), (scratch,))
        return x.t().contiguous()
