# LEGIT (must pass): template kernels through name_expressions (a float4 body and a scalar tail,
# both instantiations of one template), grid-stride loops, and flat views of the inputs
# (.view(-1)) with the output reshaped back (.view_as).
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
template <typename V, int WIDTH>
__global__ void add_strided(const V* __restrict__ a, const V* __restrict__ b, V* __restrict__ out, long long count)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const V x = a[i], y = b[i];
        V z;
        if constexpr (WIDTH == 4) {
            z.x = x.x + y.x;
            z.y = x.y + y.y;
            z.z = x.z + y.z;
            z.w = x.w + y.w;
        } else {
            z = x + y;
        }
        out[i] = z;
    }
}
"""

_VEC = "add_strided<float4, 4>"
_SCALAR = "add_strided<float, 1>"
_mod = cuda_agent.compile(_SRC, name_expressions=[_VEC, _SCALAR])
_add_vec = _mod.get_function(_VEC)
_add_scalar = _mod.get_function(_SCALAR)
_THREADS = 256
_MAX_BLOCKS = 132 * 8


def _blocks(count: int) -> int:
    return max(1, min(_MAX_BLOCKS, (count + _THREADS - 1) // _THREADS))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        fa = a.contiguous().view(-1)
        fb = b.contiguous().view(-1)
        out = torch.empty_like(fa)
        n = fa.numel()
        n4 = n // 4 if all(t.data_ptr() % 16 == 0 for t in (fa, fb, out)) else 0
        if n4:
            _add_vec((_blocks(n4),), (_THREADS,), (fa[: 4 * n4], fb[: 4 * n4], out[: 4 * n4], n4))
        if 4 * n4 < n:
            s = 4 * n4
            _add_scalar((_blocks(n - s),), (_THREADS,), (fa[s:], fb[s:], out[s:], n - s))
        return out.view_as(a)
