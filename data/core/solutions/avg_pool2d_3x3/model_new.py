# Reference solution for core/avg_pool2d_3x3: AvgPool2d(3, stride=1, padding=1,
# count_include_pad=True) on NCHW as a sliding window that reads every input element from HBM once.
# avgpool3_s1p1: a warp covers 128 adjacent columns of one image row (one float4 per thread), a
# thread owns 4 columns x 8 output rows of one (n, c) plane. It loads its 10 input rows (the 8
# plus one halo row above and below, all 10 float4 loads in flight), builds each row's 3-wide
# horizontal sums with warp shuffles (the neighbouring columns come from lanes -1 / +1; lanes 0
# and 31 read the one column across the warp edge from cache), then adds 3 consecutive row sums
# and divides by 9 per output. For 32 x 256 x 256 x 256: blocks of (64, 4) threads = 32 rows of a
# plane, 65536 blocks. HBM traffic: 2.15 GB read (halo rows are re-read from L2 by the block
# itself) + 2.15 GB written with 16-byte accesses, one kernel.
# Inductor lowers a 3x3 avg_pool2d to a pointwise Triton kernel doing 9 masked loads per output
# (served from L1/L2), which spends its issue slots on address math and predication; this one
# does 1 float4 load per 4 outputs.
# Other kernel sizes / strides / paddings, W % 128 != 0, W > 4096 or unaligned data use a plain
# one-thread-per-output kernel with PyTorch's pool-size rule; tuple parameters, ceil_mode,
# count_include_pad=False or divisor_override fall back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define SH 8

// blockDim = (W4, BY) with W4 = W / 4 a multiple of 32 (so a warp never straddles two rows of
// threads) and W4 * BY <= 1024. grid.x = planes * row_blocks, row_blocks = ceil(H / (BY * SH)).
// Thread (c4, ty) of block (plane, rb) writes output rows [rs, rs + SH), rs = (rb * BY + ty) * SH.
extern "C" __global__ void __launch_bounds__(256, 4)
avgpool3_s1p1(const float* __restrict__ x, float* __restrict__ y, int H, int W4, int row_blocks)
{
    const int c4 = threadIdx.x;
    const int lane = c4 & 31;
    const int plane = blockIdx.x / row_blocks;
    const int rb = blockIdx.x - plane * row_blocks;
    const int rs = (rb * blockDim.y + threadIdx.y) * SH;
    if (rs >= H) return;  // uniform over the warp: the warp shares threadIdx.y
    const int W = W4 * 4;
    const float* __restrict__ xp = x + (long long)plane * H * W;
    float* __restrict__ yp = y + (long long)plane * H * W;
    const float4* __restrict__ xp4 = reinterpret_cast<const float4*>(xp);
    float4* __restrict__ yp4 = reinterpret_cast<float4*>(yp);

    // Input rows rs - 1 .. rs + SH; rows outside [0, H) are the zero padding.
    // e[j]: the column just across the warp edge (left of lane 0, right of lane 31; 0 at the
    // image border); other lanes take their neighbours' columns by shuffle.
    const int ecol = lane == 0 ? 4 * c4 - 1 : 4 * c4 + 4;
    const bool eok = (lane == 0 && c4 > 0) || (lane == 31 && c4 + 1 < W4);
    float4 v[SH + 2];
    float e[SH + 2];
    #pragma unroll
    for (int j = 0; j < SH + 2; ++j) {
        const int r = rs - 1 + j;
        const bool ok = r >= 0 && r < H;
        v[j] = ok ? xp4[(long long)r * W4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        e[j] = (ok && eok) ? xp[(long long)r * W + ecol] : 0.0f;
    }
    // Horizontal 3-sums of each input row, for this thread's 4 columns.
    float4 h[SH + 2];
    #pragma unroll
    for (int j = 0; j < SH + 2; ++j) {
        float left = __shfl_up_sync(0xffffffffu, v[j].w, 1);
        float right = __shfl_down_sync(0xffffffffu, v[j].x, 1);
        if (lane == 0) left = e[j];
        if (lane == 31) right = e[j];
        h[j].x = left + v[j].x + v[j].y;
        h[j].y = v[j].x + v[j].y + v[j].z;
        h[j].z = v[j].y + v[j].z + v[j].w;
        h[j].w = v[j].z + v[j].w + right;
    }
    #pragma unroll
    for (int i = 0; i < SH; ++i) {
        const int r = rs + i;
        if (r < H) {
            float4 o;
            o.x = (h[i].x + h[i + 1].x + h[i + 2].x) / 9.0f;
            o.y = (h[i].y + h[i + 1].y + h[i + 2].y) / 9.0f;
            o.z = (h[i].z + h[i + 1].z + h[i + 2].z) / 9.0f;
            o.w = (h[i].w + h[i + 1].w + h[i + 2].w) / 9.0f;
            yp4[(long long)r * W4 + c4] = o;
        }
    }
}

// Any kernel size / stride / padding, count_include_pad=True, ceil_mode=False: one thread per
// output, the divisor as PyTorch computes it.
extern "C" __global__ void __launch_bounds__(256)
avgpool_generic(const float* __restrict__ x, float* __restrict__ y, long long total, int H, int W,
                int OH, int OW, int k, int s, int p)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const long long plane = i / ((long long)OW * OH);
    int hs = oh * s - p, ws = ow * s - p;
    int he = min(hs + k, H + p), we = min(ws + k, W + p);
    const int pool = (he - hs) * (we - ws);
    hs = max(hs, 0); ws = max(ws, 0);
    he = min(he, H); we = min(we, W);
    const float* __restrict__ xp = x + plane * H * W;
    float acc = 0.0f;
    for (int r = hs; r < he; ++r)
        for (int c = ws; c < we; ++c) acc += xp[(long long)r * W + c];
    y[i] = acc / (float)pool;
}
"""

_mod = cuda_agent.compile(_SRC)
_pool3 = _mod.get_function("avgpool3_s1p1")
_generic = _mod.get_function("avgpool_generic")
_SH = 8


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.pool
        k, s, p = pool.kernel_size, pool.stride, pool.padding
        ints = all(isinstance(v, int) for v in (k, s, p))
        if (not ints or x.dim() != 4 or x.dtype != torch.float32 or pool.ceil_mode
                or not pool.count_include_pad or pool.divisor_override is not None or 2 * p > k):
            return pool(x)
        x = x.contiguous()
        n, c, h, w = x.shape
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        if oh <= 0 or ow <= 0:
            return pool(x)
        y = torch.empty(n, c, oh, ow, dtype=x.dtype, device=x.device)
        planes = n * c
        if y.numel() == 0:
            return y
        fast = (k == 3 and s == 1 and p == 1 and w % 128 == 0 and w <= 4096
                and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0)
        if fast:
            w4 = w // 4
            by = max(1, 256 // w4)
            row_blocks = (h + by * _SH - 1) // (by * _SH)
            _pool3((planes * row_blocks,), (w4, by), (x, y, h, w4, row_blocks))
        else:
            total = y.numel()
            _generic(((total + 255) // 256,), (256,), (x, y, total, h, w, oh, ow, k, s, p))
        return y
