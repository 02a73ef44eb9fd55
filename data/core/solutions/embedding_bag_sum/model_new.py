# Reference solution for core/embedding_bag_sum: embedding(idx).sum(dim=1) without materialising
# the (B, bag, D) gather. Each bag is summed by D / 4 threads (one float4 column each; 64 threads
# for D = 256), several bags per block; the bag's indices are walked 8 at a time so that 8
# row loads (1 KB each, coalesced) are in flight per thread. The table rows are read once
# (2.15 GB) and only the (B, D) result is written.
# Eager writes the 2.15 GB gather and reads it back for the sum. torch.compile fuses the gather
# into the sum (indirect loads), so the margin over compile is uncertain.
# Indices outside [0, num_embeddings) are skipped (PyTorch raises); D % 4 != 0, D > 4096 or
# unaligned tables fall back to PyTorch.
import torch
import torch.nn as nn

import cuda_agent

_SRC = r"""
#define UNROLL 8

// blockDim = (D / 4, bags per block). idx: bags x bag_size int64; weight: num x D; out: bags x D.
extern "C" __global__ void __launch_bounds__(1024)
embedding_bag_sum(const long long* __restrict__ idx, const float4* __restrict__ weight,
                  float4* __restrict__ out, int bags, int bag_size, long long num, int d4)
{
    const int bag = blockIdx.x * blockDim.y + threadIdx.y;
    const int c = threadIdx.x;
    if (bag >= bags || c >= d4) return;
    const long long* __restrict__ ib = idx + (long long)bag * bag_size;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int j = 0;
    for (; j + UNROLL <= bag_size; j += UNROLL) {
        // Unconditional loads (an invalid index reads row 0 and is then skipped), so that all
        // UNROLL loads can be issued before the first add.
        long long r[UNROLL];
        float4 v[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) r[u] = ib[j + u];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = weight[((r[u] >= 0 && r[u] < num) ? r[u] : 0) * d4 + c];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (r[u] >= 0 && r[u] < num) {
                acc.x += v[u].x;
                acc.y += v[u].y;
                acc.z += v[u].z;
                acc.w += v[u].w;
            }
        }
    }
    for (; j < bag_size; ++j) {
        const long long r = ib[j];
        if (r >= 0 && r < num) {
            const float4 v = weight[r * d4 + c];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
    }
    out[(long long)bag * d4 + c] = acc;
}
"""

_mod = cuda_agent.compile(_SRC)
_bag_sum = _mod.get_function("embedding_bag_sum")
_THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        w = self.embedding.weight.contiguous()
        num, d = w.shape
        ok = idx.dim() == 2 and idx.dtype == torch.int64 and d % 4 == 0 and 0 < d // 4 <= 1024
        if ok:
            idx = idx.contiguous()
            bags, bag_size = idx.shape
            out = torch.empty(bags, d, dtype=w.dtype, device=w.device)
            ok = w.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
        if not ok:
            return self.embedding(idx).sum(dim=1)
        if bags == 0:
            return out
        if bag_size == 0:
            return out.zero_()
        d4 = d // 4
        # Round the block's x size up to whole warps so that blocks are multiples of 32 threads.
        bx = (d4 + 31) // 32 * 32
        by = max(1, _THREADS // bx)
        grid = (bags + by - 1) // by
        _bag_sum((grid,), (bx, by), (idx, w, out, bags, bag_size, num, d4))
        return out
