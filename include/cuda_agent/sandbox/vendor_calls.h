// The vendor-library calls a solution may make by name (cuda_agent.gemm, cuda_agent.conv2d).
// Both run on the given stream of the current context and keep one library handle per process.
// Precision: fp32 runs in true FP32 (no TF32) unless allow_tf32 is set.
// Errors (bad shapes, library failures) throw Error with the library's message.
// Not thread-safe: call with the GIL held (the sandbox's single Python thread).
#pragma once

#include <cstdint>

#include <cuda.h>

namespace cuda_agent::sandbox {

enum class VendorDtype { kFloat32, kFloat16, kBFloat16 };

// Row-major C = alpha * op(A) @ op(B) + beta * C, op(A) m x k, op(B) k x n, C m x n.
// batch > 1: strided batches (a stride of 0 broadcasts that operand).
struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  VendorDtype dtype = VendorDtype::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
  bool allow_tf32 = false;
  CUstream stream = nullptr;
};
void cublas_gemm(const GemmArgs& args);

// NCHW convolution with the bias add and activation fused where cuDNN allows.
struct Conv2dArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // optional, shape (K,)
  void* y = nullptr;
  VendorDtype dtype = VendorDtype::kFloat32;
  int n = 0, c = 0, h = 0, w_in = 0;   // input
  int k = 0, r = 0, s = 0;             // filter: K x (C/groups) x R x S
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  bool relu = false;
  bool allow_tf32 = false;
  CUstream stream = nullptr;
};
// Output (N, K, P, Q) for the arguments; throws Error when the geometry is invalid.
void cudnn_conv2d_output_shape(const Conv2dArgs& args, int out[4]);
// Bytes of workspace cudnn_conv2d needs.
size_t cudnn_conv2d_workspace_size(const Conv2dArgs& args);
void cudnn_conv2d(const Conv2dArgs& args, void* workspace, size_t workspace_bytes);

}  // namespace cuda_agent::sandbox
