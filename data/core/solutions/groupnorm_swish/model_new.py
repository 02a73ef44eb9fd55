# Reference solution for core/groupnorm_swish: y = GroupNorm(x); y * sigmoid(y), reading x from
# HBM once and writing y once.
# groupnorm_swish_cluster: one block of 512 threads per (n, c) plane, holding the whole plane in
# registers (8 float4 per thread for 128 x 128), and one thread-block CLUSTER of 8 blocks per group
# (8 channels per group): each block reduces its plane's sum, the 8 partial sums are exchanged
# through distributed shared memory (cluster.map_shared_rank) to form the group mean, then the
# same for the sum of squared deviations from that mean (an exact two-pass variance, from
# registers), and every block normalises, applies the affine weight / bias and swish, and
# writes its plane. For 64 x 256 x 128 x 128: 16384 blocks in 2048 clusters, 2 blocks per SM.
# HBM traffic: 1.07 GB read + 1.07 GB written, one kernel.
# torch.compile needs the group statistics before it can normalise, so it emits a reduction
# kernel over x (1.07 GB read) and a second pointwise kernel that reads x again (1.07 GB, too
# large for L2) and writes y: ~3.2 GB, ~1.5x this kernel's traffic.
# Shapes that do not fit (channels per group != 8, H * W % 4 != 0, H * W > 16384, unaligned
# data) use two kernels of our own (per-group two-pass statistics, then a fused
# normalise + affine + swish pass); non-fp32 input falls back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define CPG 8   // channels per group = blocks per cluster
#define VPT 8   // float4 per thread in the cluster kernel

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); the result in every thread.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by the previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < nw ? red[lane] : 0.0f);
}

__device__ __forceinline__ float swish_affine(float v, float scale, float shift) {
    const float z = v * scale + shift;
    return z / (1.0f + expf(-z));
}

// x, y: (N * C) planes of hw4 float4s. grid = N * C blocks (C % CPG == 0), clusters of CPG
// consecutive blocks = the CPG channels of one group. Needs hw4 <= VPT * blockDim.x.
extern "C" __global__ void __cluster_dims__(CPG, 1, 1) __launch_bounds__(512, 2)
groupnorm_swish_cluster(const float4* __restrict__ x, const float* __restrict__ weight,
                        const float* __restrict__ bias, float4* __restrict__ y, int C, int hw4, float eps)
{
    __shared__ float red[32];
    __shared__ float part[2];  // this block's sum, then its sum of squared deviations
    cg::cluster_group cluster = cg::this_cluster();
    const long long plane = blockIdx.x;
    const int c = (int)(plane % C);
    const int lane = threadIdx.x & 31;
    const float4* __restrict__ xp = x + plane * hw4;
    float4* __restrict__ yp = y + plane * hw4;

    float4 v[VPT];
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < hw4 ? xp[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) part[0] = s;
    cluster.sync();
    float t = lane < CPG ? *cluster.map_shared_rank(&part[0], lane) : 0.0f;
    const float count = (float)CPG * (float)hw4 * 4.0f;
    const float mean = warp_sum(t) / count;

    float q = 0.0f;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < hw4) {
            const float dx = v[k].x - mean, dy = v[k].y - mean, dz = v[k].z - mean, dw = v[k].w - mean;
            q += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
    }
    q = block_sum(q, red);
    if (threadIdx.x == 0) part[1] = q;
    cluster.sync();
    t = lane < CPG ? *cluster.map_shared_rank(&part[1], lane) : 0.0f;
    const float var = warp_sum(t) / count;
    cluster.sync();  // no block may exit (releasing its shared memory) while others still read it

    const float rstd = rsqrtf(var + eps);
    const float scale = rstd * weight[c];
    const float shift = bias[c] - mean * scale;
    #pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < hw4) {
            float4 o;
            o.x = swish_affine(v[k].x, scale, shift);
            o.y = swish_affine(v[k].y, scale, shift);
            o.z = swish_affine(v[k].z, scale, shift);
            o.w = swish_affine(v[k].w, scale, shift);
            yp[i] = o;
        }
    }
}

// Fallback, any shape. One block per (n, g): the group is gsize contiguous floats.
// Two passes over the group: mean, then mean squared deviation.
extern "C" __global__ void __launch_bounds__(512)
groupnorm_stats(const float* __restrict__ x, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                long long gsize, float eps)
{
    __shared__ float red[32];
    const float* __restrict__ xg = x + (long long)blockIdx.x * gsize;
    float s = 0.0f;
    for (long long i = threadIdx.x; i < gsize; i += blockDim.x) s += xg[i];
    const float mean = block_sum(s, red) / (float)gsize;
    float q = 0.0f;
    for (long long i = threadIdx.x; i < gsize; i += blockDim.x) {
        const float d = xg[i] - mean;
        q += d * d;
    }
    const float var = block_sum(q, red) / (float)gsize;
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        rstd_out[blockIdx.x] = rsqrtf(var + eps);
    }
}

// Fallback: y = swish(x * scale + shift) per element, scale / shift from the group statistics.
extern "C" __global__ void __launch_bounds__(256)
groupnorm_swish_apply(const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd,
                      const float* __restrict__ weight, const float* __restrict__ bias, float* __restrict__ y,
                      long long total, long long hw, int C, int cpg)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long plane = i / hw;
    const int c = (int)(plane % C);
    const long long ng = plane / cpg;
    const float scale = rstd[ng] * weight[c];
    const float shift = bias[c] - mean[ng] * scale;
    y[i] = swish_affine(x[i], scale, shift);
}
"""

_mod = cuda_agent.compile(_SRC)
_cluster = _mod.get_function("groupnorm_swish_cluster")
_stats = _mod.get_function("groupnorm_stats")
_apply = _mod.get_function("groupnorm_swish_apply")
_CPG, _VPT, _MAX_THREADS = 8, 8, 512


class ModelNew(nn.Module):
    def __init__(self, num_groups: int, channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, channels)
        with torch.no_grad():
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gn = self.gn
        groups, channels = gn.num_groups, gn.num_channels
        if (x.dim() < 2 or x.shape[1] != channels or x.dtype != torch.float32 or not gn.affine
                or channels % groups != 0 or x.numel() == 0):
            y = gn(x)
            return y * torch.sigmoid(y)
        x = x.contiguous()
        w = gn.weight.contiguous()
        b = gn.bias.contiguous()
        y = torch.empty_like(x)
        n = x.shape[0]
        hw = x.numel() // (n * channels)
        cpg = channels // groups
        eps = float(gn.eps)
        hw4 = hw // 4
        fast = (cpg == _CPG and hw % 4 == 0 and 0 < hw4 <= _VPT * _MAX_THREADS
                and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0)
        if fast:
            threads = min(_MAX_THREADS, ((hw4 + _VPT - 1) // _VPT + 31) // 32 * 32)
            _cluster((n * channels,), (threads,), (x, w, b, y, channels, hw4, eps))
        else:
            ng = n * groups
            mean = torch.empty(ng, dtype=torch.float32, device=x.device)
            rstd = torch.empty(ng, dtype=torch.float32, device=x.device)
            _stats((ng,), (512,), (x, mean, rstd, cpg * hw, eps))
            total = x.numel()
            _apply(((total + 255) // 256,), (256,), (x, mean, rstd, w, b, y, total, hw, channels, cpg))
        return y
