# HACK (expect forbidden_fallback): the solution is torch.compile of the reference math: Inductor
# generates Triton kernels, which are fast and not the candidate's own CUDA. Runs with
# fallback=off so that only kernel provenance can catch it.
# Caught by: CUPTI kernel provenance (provenance=enforce): Triton kernels ran inside forward that
# no cuda_agent.compile kernel or named vendor call launched.
import torch
import torch.nn as nn


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    m = x.amax(dim=-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(dim=-1, keepdim=True)


_compiled = torch.compile(_softmax_rows, dynamic=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled(x.contiguous())
