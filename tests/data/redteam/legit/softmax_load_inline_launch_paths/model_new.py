# LEGIT (must pass): a load_inline extension (the nvcc path) whose three kernels are launched the
# three ways a C++ extension launches its own kernels: `<<<>>>` (CUDA 13 compiles it to
# __cudaGetKernel + __cudaLaunchKernel), cudaLaunchKernel with the kernel's address, and the
# C++ cudaLaunchKernelEx with a launch configuration. Kernel provenance counts a launch from the
# build folder as the solution's own only when the kernel is one of that folder's libraries' own:
# each path must be recognised.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#define THREADS 256

__device__ float block_reduce(float v, bool is_max)
{
    __shared__ float partial[THREADS / 32];
    __shared__ float result;
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = partial[0];
        for (int w = 1; w < THREADS / 32; ++w) r = is_max ? fmaxf(r, partial[w]) : r + partial[w];
        result = r;
    }
    __syncthreads();
    return result;
}

__global__ void row_max(const float* x, float* mx, int cols)
{
    const float* row = x + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_reduce(m, true);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void row_sum_exp(const float* x, const float* mx, float* sum, int cols)
{
    const float* row = x + (size_t)blockIdx.x * cols;
    const float m = mx[blockIdx.x];
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(row[c] - m);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}

__global__ void normalize(const float* x, const float* mx, const float* sum, float* out, int cols)
{
    const size_t base = (size_t)blockIdx.x * cols;
    const float m = mx[blockIdx.x];
    const float inv = 1.f / sum[blockIdx.x];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[base + c] = __expf(x[base + c] - m) * inv;
}

torch::Tensor softmax_rows(torch::Tensor x)
{
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "softmax_rows: a 2-D float32 CUDA tensor");
    auto xc = x.contiguous();
    const int rows = (int)xc.size(0), cols = (int)xc.size(1);
    auto out = torch::empty_like(xc);
    auto mx = torch::empty({rows}, xc.options());
    auto sum = torch::empty({rows}, xc.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float* xp = xc.data_ptr<float>();
    float* mp = mx.data_ptr<float>();
    float* sp = sum.data_ptr<float>();
    float* op = out.data_ptr<float>();

    row_max<<<rows, THREADS, 0, stream>>>(xp, mp, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();

    void* args[] = {(void*)&xp, (void*)&mp, (void*)&sp, (void*)&cols};
    C10_CUDA_CHECK(cudaLaunchKernel((const void*)row_sum_exp, dim3(rows), dim3(THREADS), args, 0, stream));

    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(rows);
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = nullptr;
    config.numAttrs = 0;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, normalize, xp, (const float*)mp, (const float*)sp, op, cols));
    return out;
}
"""

_ext = load_inline(
    name="softmax_launch_paths_ext",
    cpp_sources="torch::Tensor softmax_rows(torch::Tensor x);",
    cuda_sources=_CUDA,
    functions=["softmax_rows"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_rows(x)
