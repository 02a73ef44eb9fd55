"""Times torch.utils.cpp_extension.load_inline on the benchmark's candidate kernel.

Usage: python3 load_inline_compile.py KERNEL.cu   (prints seconds; builds in a fresh folder)
"""
import json
import os
import sys
import tempfile
import time

from torch.utils.cpp_extension import load_inline

kernel = open(sys.argv[1]).read()
wrapper = r"""
#include <torch/extension.h>
torch::Tensor fused_row(torch::Tensor x, torch::Tensor bias, torch::Tensor residual, double scale) {
  auto out = torch::empty_like(x);
  const int rows = x.size(0), cols = x.size(1);
  fused_row_kernel<<<rows, 256>>>(x.data_ptr<float>(), bias.data_ptr<float>(), residual.data_ptr<float>(),
                                  out.data_ptr<float>(), (float)scale, rows, cols);
  return out;
}
"""
cpp = "torch::Tensor fused_row(torch::Tensor x, torch::Tensor bias, torch::Tensor residual, double scale);"
with tempfile.TemporaryDirectory() as build_dir:
    start = time.perf_counter()
    load_inline(name="bench_candidate", cpp_sources=cpp, cuda_sources=kernel + wrapper,
                functions=["fused_row"], build_directory=build_dir, verbose=False,
                extra_cuda_cflags=["-O3"])
    print(json.dumps({"load_inline_seconds": time.perf_counter() - start}))
