# Reference solution for core/bmm_small: torch.bmm of 131072 tiny (32x64) @ (64x32) fp32 products.
# bmm_32x64x32: one block of 64 threads per product. It loads A (8 KB) and B (8 KB) with 16
# float4 loads per thread, all in flight at once, into shared memory (A rows padded to 68 floats
# so that the compute reads are conflict-free), then each thread computes a 4x4 tile of C (rows
# ty + 8i, columns 4tx..4tx+3) with FP32 FMAs, reading float4s of A and B from shared memory
# (2 shared loads per 16 FMAs, every read one 128-byte wavefront), and writes it with float4
# stores. 17 KB of shared memory per block: ~12 blocks per SM overlap their loads with other
# blocks' FMAs, so the kernel is bound by the 2.7 GB it must move (A, B read once, C written
# once), not by the 17 GFLOP (~0.26 ms of FP32 FMA issue on 132 SMs).
# torch.compile (default mode) calls cuBLAS's batched SGEMM (TF32 off): kernels tuned for large
# tiles that run a 32x32x64 product with partly idle tiles and fewer bytes in flight per SM.
# Each output is the plain fp32 FMA chain over k = 0..63 (true FP32, no TF32).
# Other shapes use a generic tiled kernel (16x16 tiles, any M, N, K); non-fp32 falls back.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define BM 32
#define BN 32
#define BK 64
#define AS 68  // padded row stride of A in shared memory (floats; a multiple of 4 for float4)

// One block of 64 threads per batch entry: C[b] = A[b] (32 x 64) @ B[b] (64 x 32), row-major.
extern "C" __global__ void __launch_bounds__(64)
bmm_32x64x32(const float4* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ c)
{
    __shared__ __align__(16) float sa[BM * AS];
    __shared__ __align__(16) float sb[BK * BN];
    const int t = threadIdx.x;
    const long long bi = blockIdx.x;
    const float4* __restrict__ ab = a + bi * (BM * BK / 4);
    const float4* __restrict__ bb = b + bi * (BK * BN / 4);

    // 512 float4 of A and 512 of B: 8 + 8 per thread, all loads issued before any store.
    float4 ra[8], rb[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) ra[i] = ab[t + 64 * i];
    #pragma unroll
    for (int i = 0; i < 8; ++i) rb[i] = bb[t + 64 * i];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int f = t + 64 * i;            // float4 index in A: row f / 16, float4 column f % 16
        *reinterpret_cast<float4*>(&sa[(f >> 4) * AS + 4 * (f & 15)]) = ra[i];
        *reinterpret_cast<float4*>(&sb[4 * f]) = rb[i];
    }
    __syncthreads();

    const int tx = t & 7;   // output columns 4tx .. 4tx+3
    const int ty = t >> 3;  // output rows ty + 8i, i = 0..3
    float acc[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    #pragma unroll 4
    for (int k4 = 0; k4 < BK / 4; ++k4) {
        float4 av[4], bv[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = *reinterpret_cast<const float4*>(&sa[(ty + 8 * i) * AS + 4 * k4]);
        #pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = *reinterpret_cast<const float4*>(&sb[(4 * k4 + j) * BN + 4 * tx]);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float a0 = av[i].x, a1 = av[i].y, a2 = av[i].z, a3 = av[i].w;
            // k order 4k4, 4k4+1, 4k4+2, 4k4+3: one FMA chain per output, k ascending.
            acc[i][0] = fmaf(a0, bv[0].x, acc[i][0]); acc[i][1] = fmaf(a0, bv[0].y, acc[i][1]);
            acc[i][2] = fmaf(a0, bv[0].z, acc[i][2]); acc[i][3] = fmaf(a0, bv[0].w, acc[i][3]);
            acc[i][0] = fmaf(a1, bv[1].x, acc[i][0]); acc[i][1] = fmaf(a1, bv[1].y, acc[i][1]);
            acc[i][2] = fmaf(a1, bv[1].z, acc[i][2]); acc[i][3] = fmaf(a1, bv[1].w, acc[i][3]);
            acc[i][0] = fmaf(a2, bv[2].x, acc[i][0]); acc[i][1] = fmaf(a2, bv[2].y, acc[i][1]);
            acc[i][2] = fmaf(a2, bv[2].z, acc[i][2]); acc[i][3] = fmaf(a2, bv[2].w, acc[i][3]);
            acc[i][0] = fmaf(a3, bv[3].x, acc[i][0]); acc[i][1] = fmaf(a3, bv[3].y, acc[i][1]);
            acc[i][2] = fmaf(a3, bv[3].z, acc[i][2]); acc[i][3] = fmaf(a3, bv[3].w, acc[i][3]);
        }
    }
    float4* __restrict__ cb = c + bi * (BM * BN / 4);
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        cb[(ty + 8 * i) * (BN / 4) + tx] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

// Any shape: 16x16 output tile per block (blockDim (16, 16)), K in steps of 16 through shared memory.
// grid = (ceil(N / 16), ceil(M / 16), batch).
extern "C" __global__ void __launch_bounds__(256)
bmm_generic(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
            int M, int N, int K)
{
    __shared__ float ta[16][17];
    __shared__ float tb[16][17];
    const long long bi = blockIdx.z;
    const int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    const float* __restrict__ ab = a + bi * M * K;
    const float* __restrict__ bb = b + bi * K * N;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? ab[(long long)row * K + ka] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? bb[(long long)kb * N + col] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < 16; ++k) acc = fmaf(ta[threadIdx.y][k], tb[k][threadIdx.x], acc);
        __syncthreads();
    }
    if (row < M && col < N) c[bi * M * N + (long long)row * N + col] = acc;
}
"""

_mod = cuda_agent.compile(_SRC)
_bmm32 = _mod.get_function("bmm_32x64x32")
_generic = _mod.get_function("bmm_generic")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if (a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]
                or a.dtype != torch.float32 or b.dtype != torch.float32):
            return torch.bmm(a, b)
        a = a.contiguous()
        b = b.contiguous()
        batch, m, k = a.shape
        n = b.shape[2]
        c = torch.empty(batch, m, n, dtype=a.dtype, device=a.device)
        if c.numel() == 0:
            return c
        if k == 0:
            return c.zero_()
        fast = (m == 32 and k == 64 and n == 32 and batch <= 2**31 - 1
                and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0 and c.data_ptr() % 16 == 0)
        if fast:
            _bmm32((batch,), (64,), (a, b, c))
        elif batch <= 65535:
            _generic(((n + 15) // 16, (m + 15) // 16, batch), (16, 16), (a, b, c, m, n, k))
        else:
            return torch.bmm(a, b)
        return c
