# eager ~1.3 ms: one gather kernel, 2.15 GB of table rows read (random rows of a 268 MB table) + 2.15 GB written = 4.3 GB, ~1.2 ms at ~3.5 TB/s
import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Embedding lookup: (B, L) int64 indices -> (B, L, D) float32."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embedding(idx)


num_embeddings = 262144
embedding_dim = 256
batch_size = 4096
seq_len = 512


def get_inputs():
    idx = torch.randint(0, num_embeddings, (batch_size, seq_len))
    return [idx]


def get_init_inputs():
    return [num_embeddings, embedding_dim]
