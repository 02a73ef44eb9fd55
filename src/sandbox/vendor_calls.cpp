#include "cuda_agent/sandbox/vendor_calls.h"

#include <memory>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/launch_origins.h"

namespace cuda_agent::sandbox {
namespace {

cudaDataType cublas_type(VendorDtype d) {
  switch (d) {
    case VendorDtype::kFloat32: return CUDA_R_32F;
    case VendorDtype::kFloat16: return CUDA_R_16F;
    case VendorDtype::kBFloat16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    CA_CUBLAS_CHECK(cublas().cublasCreate_v2(&h));
    return h;
  }();
  return handle;
}

cudnnHandle_t cudnn_handle() {
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    CA_CUDNN_CHECK(cudnn().cudnnCreate(&h));
    return h;
  }();
  return handle;
}

// RAII descriptors for one convolution call.
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int out[4] = {0, 0, 0, 0};

  explicit ConvDescriptors(const Conv2dArgs& a) {
    const CudnnApi& api = cudnn();
    type = a.dtype == VendorDtype::kFloat16 ? CUDNN_DATA_HALF
           : a.dtype == VendorDtype::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    CA_CHECK(a.groups >= 1 && a.c % a.groups == 0 && a.k % a.groups == 0,
             "conv2d: groups={} must divide in_channels={} and out_channels={}", a.groups, a.c, a.k);
    CA_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&x));
    CA_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&y));
    CA_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&bias));
    CA_CUDNN_CHECK(api.cudnnCreateFilterDescriptor(&w));
    CA_CUDNN_CHECK(api.cudnnCreateConvolutionDescriptor(&conv));
    CA_CUDNN_CHECK(api.cudnnCreateActivationDescriptor(&act));
    CA_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, type, a.n, a.c, a.h, a.w_in));
    CA_CUDNN_CHECK(api.cudnnSetFilter4dDescriptor(w, type, CUDNN_TENSOR_NCHW, a.k, a.c / a.groups, a.r, a.s));
    // Accumulate in fp32 for every input type, as PyTorch does.
    CA_CUDNN_CHECK(api.cudnnSetConvolution2dDescriptor(conv, a.pad_h, a.pad_w, a.stride_h, a.stride_w,
                                                      a.dil_h, a.dil_w, CUDNN_CROSS_CORRELATION,
                                                      CUDNN_DATA_FLOAT));
    CA_CUDNN_CHECK(api.cudnnSetConvolutionGroupCount(conv, a.groups));
    const bool fp32 = a.dtype == VendorDtype::kFloat32;
    CA_CUDNN_CHECK(api.cudnnSetConvolutionMathType(
        conv, fp32 && !a.allow_tf32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    CA_CUDNN_CHECK(api.cudnnGetConvolution2dForwardOutputDim(conv, x, w, &out[0], &out[1], &out[2], &out[3]));
    CA_CHECK(out[2] > 0 && out[3] > 0, "conv2d: the output would be empty ({}x{}); check padding, stride and kernel size",
             out[2], out[3]);
    CA_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, type, out[0], out[1], out[2], out[3]));
    CA_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, type, 1, a.k, 1, 1));
    CA_CUDNN_CHECK(api.cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  }
  ~ConvDescriptors() {
    const CudnnApi& api = cudnn();
    if (x) api.cudnnDestroyTensorDescriptor(x);
    if (y) api.cudnnDestroyTensorDescriptor(y);
    if (bias) api.cudnnDestroyTensorDescriptor(bias);
    if (w) api.cudnnDestroyFilterDescriptor(w);
    if (conv) api.cudnnDestroyConvolutionDescriptor(conv);
    if (act) api.cudnnDestroyActivationDescriptor(act);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  cudnnConvolutionFwdAlgo_t algorithm(bool fused_bias_relu) const {
    // cudnnConvolutionBiasActivationForward documents IMPLICIT_PRECOMP_GEMM as the algorithm
    // that works for every configuration; the heuristic's choice for plain convolutions.
    if (fused_bias_relu) return CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int returned = 0;
    CA_CUDNN_CHECK(cudnn().cudnnGetConvolutionForwardAlgorithm_v7(cudnn_handle(), x, w, conv, y, 8,
                                                                  &returned, perf));
    for (int i = 0; i < returned; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS) return perf[i].algo;
    return CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  }
};

bool fused(const Conv2dArgs& a) { return a.relu && a.bias != nullptr; }

}  // namespace

void cublas_gemm(const GemmArgs& g) {
  CA_CHECK(g.m > 0 && g.n > 0 && g.k > 0, "gemm: empty or negative sizes m={} n={} k={}", g.m, g.n, g.k);
  const CublasApi& api = cublas();
  cublasHandle_t handle = cublas_handle();
  LaunchScope tag(LaunchOrigin::kVendor);
  CA_CUBLAS_CHECK(api.cublasSetStream_v2(handle, g.stream));
  const bool tf32 = g.dtype == VendorDtype::kFloat32 && g.allow_tf32;
  // With CUBLAS_COMPUTE_32F and the default math mode cuBLAS keeps fp32 arithmetic, as PyTorch
  // does when allow_tf32 is off.
  CA_CUBLAS_CHECK(api.cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType type = cublas_type(g.dtype);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t ldb = g.trans_b ? g.k : g.n;
  const int64_t lda = g.trans_a ? g.m : g.k;
  const int64_t ldc = g.n;
  CA_CHECK(g.m < (1LL << 31) && g.n < (1LL << 31) && g.k < (1LL << 31),
           "gemm: sizes past 2^31 are not supported (m={} n={} k={})", g.m, g.n, g.k);
  if (g.batch == 1) {
    CA_CUBLAS_CHECK(api.cublasGemmEx(handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m),
                                     static_cast<int>(g.k), &g.alpha, g.b, type, static_cast<int>(ldb),
                                     g.a, type, static_cast<int>(lda), &g.beta, g.c, type,
                                     static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
  } else {
    CA_CUBLAS_CHECK(api.cublasGemmStridedBatchedEx(
        handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
        &g.alpha, g.b, type, static_cast<int>(ldb), g.stride_b, g.a, type, static_cast<int>(lda),
        g.stride_a, &g.beta, g.c, type, static_cast<int>(ldc), g.stride_c,
        static_cast<int>(g.batch), compute, CUBLAS_GEMM_DEFAULT));
  }
}

void cudnn_conv2d_output_shape(const Conv2dArgs& args, int out[4]) {
  ConvDescriptors d(args);
  for (int i = 0; i < 4; ++i) out[i] = d.out[i];
}

size_t cudnn_conv2d_workspace_size(const Conv2dArgs& args) {
  ConvDescriptors d(args);
  size_t bytes = 0;
  CA_CUDNN_CHECK(cudnn().cudnnGetConvolutionForwardWorkspaceSize(cudnn_handle(), d.x, d.w, d.conv, d.y,
                                                                  d.algorithm(fused(args)), &bytes));
  return bytes;
}

void cudnn_conv2d(const Conv2dArgs& a, void* workspace, size_t workspace_bytes) {
  const CudnnApi& api = cudnn();
  cudnnHandle_t handle = cudnn_handle();
  LaunchScope tag(LaunchOrigin::kVendor);
  CA_CUDNN_CHECK(api.cudnnSetStream(handle, reinterpret_cast<cudaStream_t>(a.stream)));
  ConvDescriptors d(a);
  const float one = 1.0f, zero = 0.0f;
  const auto algo = d.algorithm(fused(a));
  if (fused(a)) {
    // y = relu(conv(x, w) + 0 * y + bias), one cuDNN call.
    CA_CUDNN_CHECK(api.cudnnConvolutionBiasActivationForward(handle, &one, d.x, a.x, d.w, a.w, d.conv, algo,
                                                             workspace, workspace_bytes, &zero, d.y, a.y,
                                                             d.bias, a.bias, d.act, d.y, a.y));
    return;
  }
  CA_CUDNN_CHECK(api.cudnnConvolutionForward(handle, &one, d.x, a.x, d.w, a.w, d.conv, algo, workspace,
                                             workspace_bytes, &zero, d.y, a.y));
  if (a.bias) CA_CUDNN_CHECK(api.cudnnAddTensor(handle, &one, d.bias, a.bias, &one, d.y, a.y));
  if (a.relu) CA_CUDNN_CHECK(api.cudnnActivationForward(handle, d.act, &one, d.y, a.y, &zero, d.y, a.y));
}

}  // namespace cuda_agent::sandbox
