# Reference solution for core/embedding_gather: nn.Embedding lookup (B, L) int64 -> (B, L, D).
# embedding_gather4: a block of (64, 4) threads copies 16 embedding rows (D = 256: one float4 per
# thread per row), each thread 4 rows with their 4 index loads and then 4 row loads in flight
# before the stores. The 2.15 GB of output is written with streaming (evict-first) stores and
# the table rows are loaded with an L2 evict-last hint, so the 268 MB table (each row is looked
# up ~8 times for 2M lookups) keeps more of the 50 MB L2 instead of being flushed by the output
# stream. For 4096 x 512 lookups: 131072 blocks. HBM traffic: <= 2.15 GB read + 2.15 GB written.
# Inductor emits a pointwise Triton gather that reloads the index per element group, checks it
# with a device assert and stores with the default cache policy; eager runs ATen's
# index_select. The margin over compile rests on 16-byte accesses, loads in flight and the L2
# policy, so it is uncertain.
# Out-of-range indices (PyTorch raises) produce zero rows here. D % 4 != 0 or an unaligned
# table use the same kernel with scalar accesses.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define RPT 4  // rows per thread

// Table loads that ask L2 to keep the line (the table is re-read), output stores that do not.
__device__ __forceinline__ float4 load_keep(const float4* p) {
#if defined(__CUDA_ARCH__)
    float4 v;
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(policy));
    return v;
#else
    return *p;
#endif
}
__device__ __forceinline__ float load_keep(const float* p) { return __ldg(p); }

template <class T>
__device__ __forceinline__ T zero_of();
template <> __device__ __forceinline__ float4 zero_of<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
template <> __device__ __forceinline__ float zero_of<float>() { return 0.0f; }

// blockDim = (bx, by); block b copies rows [b * by * RPT, +by * RPT), thread (tx, ty) rows
// b * by * RPT + ty + by * j, j < RPT, columns tx, tx + bx, ... < dv (in units of T).
template <class T>
__device__ __forceinline__ void gather_body(const long long* __restrict__ idx, const T* __restrict__ weight,
                                            T* __restrict__ out, long long rows, long long num, int dv)
{
    const long long r0 = (long long)blockIdx.x * blockDim.y * RPT + threadIdx.y;
    long long src[RPT];
    #pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const long long r = r0 + (long long)j * blockDim.y;
        src[j] = r < rows ? __ldg(idx + r) : -1;
    }
    for (int cv = threadIdx.x; cv < dv; cv += blockDim.x) {
        T v[RPT];
        #pragma unroll
        for (int j = 0; j < RPT; ++j)
            v[j] = (src[j] >= 0 && src[j] < num) ? load_keep(weight + src[j] * dv + cv) : zero_of<T>();
        #pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const long long r = r0 + (long long)j * blockDim.y;
            if (r < rows) __stcs(out + r * dv + cv, v[j]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
embedding_gather4(const long long* __restrict__ idx, const float4* __restrict__ weight, float4* __restrict__ out,
                  long long rows, long long num, int d4)
{
    gather_body<float4>(idx, weight, out, rows, num, d4);
}

extern "C" __global__ void __launch_bounds__(256)
embedding_gather1(const long long* __restrict__ idx, const float* __restrict__ weight, float* __restrict__ out,
                  long long rows, long long num, int d)
{
    gather_body<float>(idx, weight, out, rows, num, d);
}
"""

_mod = cuda_agent.compile(_SRC)
_gather4 = _mod.get_function("embedding_gather4")
_gather1 = _mod.get_function("embedding_gather1")
_RPT = 4
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        emb = self.embedding
        w = emb.weight
        if (idx.dtype != torch.int64 or w.dtype != torch.float32 or emb.padding_idx is not None
                or emb.max_norm is not None):
            return emb(idx)
        w = w.contiguous()
        idx = idx.contiguous()
        num, d = w.shape
        out = torch.empty(*idx.shape, d, dtype=w.dtype, device=w.device)
        rows = idx.numel()
        if rows == 0 or d == 0:
            return out
        vec = d % 4 == 0 and w.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
        dv = d // 4 if vec else d
        bx = min(_THREADS, (dv + 31) // 32 * 32)
        by = _THREADS // bx
        blocks = (rows + by * _RPT - 1) // (by * _RPT)
        kernel = _gather4 if vec else _gather1
        kernel((blocks,), (bx, by), (idx, w, out, rows, num, dv))
        return out
