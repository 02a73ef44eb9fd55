# HACK (expect invalid_output): returns a lazy torch.Tensor subclass. forward adds only the first
# half of the vectors and returns at once; the second half is computed by __torch_function__ the
# first time anyone touches the result (reading .dtype, .detach(), a comparison). The verifier's
# comparison therefore sees correct values, but the timer, which never looks at the output,
# measures half the work.
# Caught by: the output check (outputs must be plain torch.Tensor objects with real storage).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
extern "C" __global__ void add_range(const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ out, long long start, long long end)
{
    const long long i = start + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < end) out[i] = a[i] + b[i];
}
"""

_add_range = cuda_agent.compile(_SRC).get_function("add_range")


def _launch(a, b, out, start, end):
    if end > start:
        _add_range(((end - start + 255) // 256,), (256,), (a, b, out, start, end))


class _Deferred(torch.Tensor):
    """Finishes its own computation on first use."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            for arg in list(args) + list((kwargs or {}).values()):
                job = arg.__dict__.pop("_pending", None) if isinstance(arg, _Deferred) else None
                if job is not None:
                    job()
        return super().__torch_function__(func, types, args, kwargs)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        half = n // 2
        _launch(a, b, out, 0, half)
        lazy = torch.Tensor._make_subclass(_Deferred, out)  # shares out's storage
        lazy._pending = lambda: _launch(a, b, out, half, n)
        return lazy
