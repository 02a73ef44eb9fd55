# HACK (expect invalid_output): the task's whole work is to materialise a transpose; this returns
# x.t(), a view of its input, so nothing is copied inside the forward (the harness reads the view
# through its strides afterwards, outside the timed interval). A decoy kernel of its own writes
# one element of a scratch buffer so that "an own kernel ran" holds for provenance.
# Caught by: an output whose data lies in the forward's inputs is not an output (the candidate's
# export of its outputs) -> invalid_output.
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
        return x.t()
