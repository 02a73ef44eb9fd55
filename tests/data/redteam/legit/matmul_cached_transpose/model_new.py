# LEGIT (must pass, also under precision=strict): caches weights-derived data only. The first
# forward after the weights change (keyed on the weight's storage address and version counter, so
# load_state_dict's in-place copy invalidates it) makes W^T with an own tiled transpose kernel;
# every call then runs cuda_agent.gemm(x, W^T) without a transpose flag and an own bias kernel.
# Nothing derived from the inputs is kept between calls.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define TILE 32

// dst (cols x rows) = src (rows x cols)^T through a padded shared-memory tile; block (32, 8).
extern "C" __global__ void transpose(const float* __restrict__ src, float* __restrict__ dst, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];
    const int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = src[(long long)r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int c = c0 + j, r = r0 + threadIdx.x;
        if (c < cols && r < rows) dst[(long long)c * rows + r] = tile[threadIdx.x][j];
    }
}

extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias, long long total, int n)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += bias[i % n];
}
"""

_mod = cuda_agent.compile(_SRC)
_transpose = _mod.get_function("transpose")
_add_bias = _mod.get_function("add_bias")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._wt = None      # plain attribute: not a parameter or buffer, so state_dict is unchanged
        self._wt_key = None

    def _weight_t(self) -> torch.Tensor:
        w = self.linear.weight
        key = (w.data_ptr(), w._version, tuple(w.shape))
        if key != self._wt_key:
            rows, cols = w.shape
            wt = torch.empty((cols, rows), device=w.device, dtype=w.dtype)
            _transpose(((cols + 31) // 32, (rows + 31) // 32), (32, 8), (w.contiguous(), wt, rows, cols))
            self._wt, self._wt_key = wt, key
        return self._wt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = cuda_agent.gemm(x.contiguous(), self._weight_t())
        rows, n = y.shape
        _add_bias(((rows * n + 255) // 256,), (256,), (y, self.linear.bias, rows * n, n))
        return y
