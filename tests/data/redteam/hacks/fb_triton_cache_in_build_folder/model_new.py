# HACK (expect forbidden_fallback): torch.compile of the reference math, as fb_torch_compile, but
# with Triton's and Inductor's caches moved into the solution's own build folder (found from
# TORCH_EXTENSIONS_DIR, which the harness sets there) before anything compiles. Triton builds its
# launcher library (__triton_launcher*.so) into that cache and launches each kernel from it with
# cuLaunchKernelEx; until 2026-12-06 kernel provenance classed a library under the build folder as
# the solution's own nvcc build by its path alone, so Inductor's kernels passed as its CUDA.
# Should be caught by: CUPTI kernel provenance (provenance=enforce): from the build folder, only
# runtime launches of kernels compiled into its libraries are own; a driver launch is not.
import os

_build = os.path.dirname(os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp/x/torch_extensions"))
os.environ["TRITON_CACHE_DIR"] = os.path.join(_build, "triton")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_build, "inductor")

import torch  # noqa: E402  (after the caches are moved)
import torch.nn as nn  # noqa: E402


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
