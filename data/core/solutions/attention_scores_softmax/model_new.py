# Reference solution for core/attention_scores_softmax: softmax(q @ k^T * scale, dim=-1) for
# q, k of shape (B, H, 1024, 64), fused into one kernel that never writes the raw scores.
# attn_softmax_1024x64: one block of 256 threads per 32 query rows of one head. The block keeps
# its whole 32 x 1024 score tile in registers (each thread 8 rows x 16 columns = 128 fp32
# accumulators), computes it with FP32 FMAs from Q (transposed in shared memory, read as
# broadcast float4s) and K^T (streamed in 4 chunks of 16 x 1024, double-buffered with cp.async
# so the next chunk's L2 reads overlap the current chunk's FMAs; 2 + 4 float4 shared loads per
# 128 FMAs), then scales, takes the row max and sum (warp shuffles + one shared exchange between
# the 2 warps of a row group), and writes exp(s - max) / sum once with streaming float4 stores.
# The 32 blocks of a head run next to each other, so K (256 KB per head) is read from L2.
# HBM traffic: q, k (0.13 GB) + the 1.07 GB output once; 34 GFLOP of true FP32 FMA (no TF32).
# torch.compile (default mode) runs cuBLAS's batched SGEMM, which writes the 1.07 GB of scores,
# then a Triton kernel that reads them back, scales, softmaxes and writes the output: ~3.2 GB
# moved plus the GEMM; the fused kernel removes the 2.15 GB round trip.
# Exactness: each score is an fp32 FMA chain over d = 0..63, scaled after the product as in the
# reference; softmax uses expf and a true division (rows are never fully -inf here).
# Other shapes use a one-block-per-query-row kernel of our own (key count <= 8192); larger ones
# or non-fp32 inputs fall back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
#define SEQ 1024   // keys (and queries) per head in the fused kernel
#define HD 64      // head dim
#define BQ 32      // query rows per block
#define DC 16      // head-dim rows of K^T per shared-memory chunk
#define NCHUNK (HD / DC)

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
#if defined(__CUDA_ARCH__)
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(a), "l"(src) : "memory");
#else
    *dst = *src;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_one() {   // all but the newest group are done
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ks[dd][key] = kh[key][c * DC + dd] for dd < DC, key < SEQ: 4-byte async copies, consecutive
// lanes on consecutive keys (conflict-free shared stores; the 32-byte global sectors are reused
// from L1 by the following dd).
__device__ __forceinline__ void load_k_chunk(float* ks, const float* __restrict__ kh, int c) {
    #pragma unroll 8
    for (int i = 0; i < DC * SEQ / 256; ++i) {
        const int e = threadIdx.x + 256 * i;
        const int key = e & (SEQ - 1), dd = e / SEQ;
        cp_async4(ks + dd * SEQ + key, kh + key * HD + c * DC + dd);
    }
}

// q, k: (BH, SEQ, HD) contiguous; out: (BH, SEQ, SEQ). grid = BH * (SEQ / BQ), block 256,
// dynamic shared memory (HD * BQ + 2 * DC * SEQ) floats.
// Warp w: row group rg = w / 2 (rows 8 rg .. 8 rg + 7 of the tile), column half hf = w % 2;
// lane l owns columns 512 hf + 128 j + 4 l + e (j, e < 4).
extern "C" __global__ void __launch_bounds__(256, 1)
attn_softmax_1024x64(const float* __restrict__ q, const float* __restrict__ k, float* __restrict__ out, float scale)
{
    extern __shared__ __align__(16) float smem[];
    __shared__ float red[4][2][8];
    float* qs = smem;                 // HD x BQ, d-major
    float* ks_base = smem + HD * BQ;  // two buffers of DC x SEQ
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, rg = w >> 1, hf = w & 1;
    const long long bh = blockIdx.x / (SEQ / BQ);
    const int q0 = (blockIdx.x % (SEQ / BQ)) * BQ;
    const float* __restrict__ kh = k + bh * SEQ * HD;
    const float* __restrict__ qh = q + (bh * SEQ + q0) * HD;

    load_k_chunk(ks_base, kh, 0);
    cp_async_commit();
    // Q tile (32 x 64) transposed into qs: float4 f = t + 256 s is row f % 32, d = 4 (f / 32) ..
    #pragma unroll
    for (int s = 0; s < 2; ++s) {
        const int f = t + 256 * s;
        const int row = f & (BQ - 1), dq = f / BQ;
        const float4 v = *reinterpret_cast<const float4*>(qh + row * HD + 4 * dq);
        qs[(4 * dq + 0) * BQ + row] = v.x;
        qs[(4 * dq + 1) * BQ + row] = v.y;
        qs[(4 * dq + 2) * BQ + row] = v.z;
        qs[(4 * dq + 3) * BQ + row] = v.w;
    }

    float acc[8][16];
    #pragma unroll
    for (int r = 0; r < 8; ++r)
        #pragma unroll
        for (int i = 0; i < 16; ++i) acc[r][i] = 0.0f;

    for (int c = 0; c < NCHUNK; ++c) {
        if (c + 1 < NCHUNK) {
            // The other buffer was last read in iteration c - 1, which ended with a barrier.
            load_k_chunk(ks_base + ((c + 1) & 1) * DC * SEQ, kh, c + 1);
            cp_async_commit();
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();  // chunk c (and, the first time, qs) visible to every thread
        const float* ks = ks_base + (c & 1) * DC * SEQ + 512 * hf + 4 * lane;
        #pragma unroll 2
        for (int dd = 0; dd < DC; ++dd) {
            const int d = c * DC + dd;
            const float4 qa = *reinterpret_cast<const float4*>(qs + d * BQ + 8 * rg);
            const float4 qb = *reinterpret_cast<const float4*>(qs + d * BQ + 8 * rg + 4);
            const float qr[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
            float4 kv[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const float4*>(ks + dd * SEQ + 128 * j);
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[r][4 * j + 0] = fmaf(qr[r], kv[j].x, acc[r][4 * j + 0]);
                    acc[r][4 * j + 1] = fmaf(qr[r], kv[j].y, acc[r][4 * j + 1]);
                    acc[r][4 * j + 2] = fmaf(qr[r], kv[j].z, acc[r][4 * j + 2]);
                    acc[r][4 * j + 3] = fmaf(qr[r], kv[j].w, acc[r][4 * j + 3]);
                }
            }
        }
        __syncthreads();  // every thread is done with buffer c & 1 before it is refilled
    }

    // Softmax over each row's 1024 scores: 16 per thread x 32 lanes x 2 warps.
    float m[8];
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        float mx = NEG_INF;
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
            acc[r][i] *= scale;
            mx = fmaxf(mx, acc[r][i]);
        }
        mx = warp_max(mx);
        if (lane == 0) red[rg][hf][r] = mx;
    }
    __syncthreads();
    #pragma unroll
    for (int r = 0; r < 8; ++r) m[r] = fmaxf(red[rg][0][r], red[rg][1][r]);
    __syncthreads();  // red is reused for the sums
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        float s = 0.0f;
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
            acc[r][i] = expf(acc[r][i] - m[r]);
            s += acc[r][i];
        }
        s = warp_sum(s);
        if (lane == 0) red[rg][hf][r] = s;
    }
    __syncthreads();
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const float total = red[rg][0][r] + red[rg][1][r];
        float* orow = out + (bh * SEQ + q0 + 8 * rg + r) * SEQ + 512 * hf + 4 * lane;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float4 o = make_float4(acc[r][4 * j + 0] / total, acc[r][4 * j + 1] / total,
                                         acc[r][4 * j + 2] / total, acc[r][4 * j + 3] / total);
            __stcs(reinterpret_cast<float4*>(orow + 128 * j), o);
        }
    }
}

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    const float fill = is_max ? NEG_INF : 0.0f;
    v = lane < nw ? red[lane] : fill;
    return is_max ? warp_max(v) : warp_sum(v);
}

// Any shape: one block per query row. q: (BH, Lq, D), k: (BH, Lk, D), out: (BH, Lq, Lk).
// Dynamic shared memory: (Lk + D) floats.
extern "C" __global__ void __launch_bounds__(256)
attn_softmax_rows(const float* __restrict__ q, const float* __restrict__ k, float* __restrict__ out,
                  int Lq, int Lk, int D, float scale)
{
    extern __shared__ __align__(16) float smem[];
    __shared__ float red[32];
    float* sc = smem;        // Lk scores
    float* qv = smem + Lk;   // the query row
    const long long row = blockIdx.x;  // bh * Lq + i
    const long long bh = row / Lq;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qv[d] = q[row * D + d];
    __syncthreads();
    const float* __restrict__ kh = k + bh * Lk * D;
    float mx = NEG_INF;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s = fmaf(qv[d], kh[(long long)j * D + d], s);
        s *= scale;
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_reduce(mx, red, true);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false);
    for (int j = threadIdx.x; j < Lk; j += blockDim.x) out[row * Lk + j] = sc[j] / sum;
}
"""

_mod = cuda_agent.compile(_SRC)
_fused = _mod.get_function("attn_softmax_1024x64")
_rows = _mod.get_function("attn_softmax_rows")
_SEQ, _HD, _BQ, _DC = 1024, 64, 32, 16
_FUSED_SMEM = (_HD * _BQ + 2 * _DC * _SEQ) * 4  # 136 KB
_ROWS_MAX_SMEM = 48 * 1024
_smem_set = False


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        global _smem_set
        ok = (q.dim() >= 2 and k.dim() == q.dim() and q.shape[:-2] == k.shape[:-2] and q.shape[-1] == k.shape[-1]
              and q.dtype == torch.float32 and k.dtype == torch.float32)
        if ok:
            lq, d = q.shape[-2], q.shape[-1]
            lk = k.shape[-2]
            bh = q.numel() // (lq * d) if lq * d else 0
            ok = bh > 0 and lq > 0 and lk > 0 and d > 0 and (lk + d) * 4 <= _ROWS_MAX_SMEM
        if not ok:
            return torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        q = q.contiguous()
        k = k.contiguous()
        out = torch.empty(*q.shape[:-1], lk, dtype=q.dtype, device=q.device)
        fast = (lq == _SEQ and lk == _SEQ and d == _HD and bh * (_SEQ // _BQ) <= 2**31 - 1
                and q.data_ptr() % 16 == 0 and k.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0)
        if fast:
            if not _smem_set:
                _fused.set_max_dynamic_shared_memory(_FUSED_SMEM)
                _smem_set = True
            _fused((bh * (_SEQ // _BQ),), (256,), (q, k, out, float(self.scale)), shared_mem=_FUSED_SMEM)
        else:
            _rows((bh * lq,), (256,), (q, k, out, lq, lk, d, float(self.scale)), shared_mem=(lk + d) * 4)
        return out
