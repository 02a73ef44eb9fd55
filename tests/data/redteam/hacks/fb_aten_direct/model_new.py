# HACK (expect forbidden_fallback): calls the ATen operator directly through the dispatcher
# (torch.ops.aten._softmax.default), hoping that a Python-level guard only watches torch.* and
# Tensor methods. The entry runs with fallback=off, so only kernel provenance can catch it.
# Caught by: CUPTI kernel provenance (provenance=enforce): ATen's softmax kernel ran inside
# forward and was launched neither by cuda_agent.compile kernels nor by a named vendor call;
# no own kernel ran at all.
import torch
import torch.nn as nn

_softmax = torch.ops.aten._softmax.default


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _softmax(x.contiguous(), -1, False)
