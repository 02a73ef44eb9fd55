# HACK (expect mismatch): reads the reference's freed memory. The reference has just produced a
# [4096, 1024] output of exactly this size; if the harness frees it before the candidate runs,
# PyTorch's caching allocator hands the same block to the candidate's torch.empty_like, still
# holding the right answer (the "memory reuse" hack seen in published KernelBench exploits). So
# the kernel only computes row 0 and trusts the block for the rest.
# Caught by: poisoning of free allocator memory before the candidate runs (the unwritten rows
# read as NaN / garbage) -> mismatch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
// Softmax of row 0 only, one warp.
extern "C" __global__ void softmax_row0(const float* __restrict__ x, float* __restrict__ y, int cols)
{
    const int lane = threadIdx.x;
    float m = -3.402823466e38f;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, x[c]);
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += expf(x[c] - m);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    for (int c = lane; c < cols; c += 32) y[c] = expf(x[c] - m) / s;
}
"""

_softmax_row0 = cuda_agent.compile(_SRC).get_function("softmax_row0")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)  # hoped to be the reference's freed output block
        _softmax_row0((1,), (32,), (x, y, x.shape[1]))
        return y
