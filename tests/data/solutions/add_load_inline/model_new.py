# Tests: a correct KernelBench-style solution built with torch.utils.cpp_extension.load_inline.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ out, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_forward(torch::Tensor a, torch::Tensor b)
{
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "add_forward: inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
                "add_forward: inputs must be float32");
    TORCH_CHECK(a.numel() == b.numel(), "add_forward: size mismatch");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto out = torch::empty_like(ac);
    const int64_t n = ac.numel();
    if (n == 0) return out;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    add_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

add_cpp_source = "torch::Tensor add_forward(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(
    name="add_load_inline_ext",
    cpp_sources=add_cpp_source,
    cuda_sources=add_cuda_source,
    functions=["add_forward"],
    verbose=False,
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.add = add_ext

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.add.add_forward(a, b)
