#!/usr/bin/env python3
"""Per-call cost of masked scaled_dot_product_attention on the GPU when its key length changes
at every call (as a decode step that attends over one more key each time) against a fixed key
length, under each SDPA backend that accepts the call. Used to find the batch engine's per-step
cost (docs/benchmarks.md, section 13).

  python3 scripts/bench/sdpa_shapes.py [rows ...]
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KV, GROUP, DIM = 3, 3, 64  # SmolLM2-135M: 9 query heads over 3 key/value heads of 64


def run(rows, growing, backend, calls=40, start=512):
    dev = torch.device("cuda")
    total = start + calls + 1
    q = torch.randn(rows, KV, GROUP, DIM, device=dev, dtype=torch.bfloat16)
    k = torch.randn(rows, KV, total, DIM, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ctx = sdpa_kernel([backend]) if backend is not None else torch.no_grad()
    with ctx, torch.no_grad():
        # warm-up at the first shape
        keys = start
        mask = torch.ones(rows, 1, GROUP, keys, device=dev, dtype=torch.bool)
        F.scaled_dot_product_attention(q, k[:, :, :keys], v[:, :, :keys], attn_mask=mask)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(calls):
            keys = start + (i if growing else 0)
            mask = torch.ones(rows, 1, GROUP, keys, device=dev, dtype=torch.bool)
            F.scaled_dot_product_attention(q, k[:, :, :keys], v[:, :, :keys], attn_mask=mask)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / calls * 1e3


def main():
    rows_list = [int(a) for a in sys.argv[1:]] or [1, 64]
    print(f"torch {torch.__version__}; cudnn sdp enabled {torch.backends.cuda.cudnn_sdp_enabled()}, "
          f"flash {torch.backends.cuda.flash_sdp_enabled()}, mem-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}")
    backends = [("default", None), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
    for rows in rows_list:
        for name, b in backends:
            try:
                fixed = run(rows, False, b)
                growing = run(rows, True, b)
                print(f"rows {rows:4d} {name:10s} fixed keys {fixed:8.3f} ms/call, keys +1 per call {growing:8.3f} ms/call")
            except RuntimeError as e:
                print(f"rows {rows:4d} {name:10s} refused: {str(e).splitlines()[0][:120]}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
