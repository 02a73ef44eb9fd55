# eager ~1.9 ms: embedding gather (2.15 GB of rows read + 2.15 GB written) then sum over the bag (2.15 GB read) = 6.4 GB at ~3.5 TB/s; fused: 2.15 GB (~0.6 ms)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum-pooled embedding bags: embedding(idx).sum(dim=1): (B, bag) int64 -> (B, D)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embedding(idx).sum(dim=1)


num_embeddings = 262144
embedding_dim = 256
batch_size = 32768
bag_size = 64


def get_inputs():
    idx = torch.randint(0, num_embeddings, (batch_size, bag_size))
    return [idx]


def get_init_inputs():
    return [num_embeddings, embedding_dim]
