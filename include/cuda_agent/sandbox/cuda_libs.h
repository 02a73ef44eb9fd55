// Run-time loading of the CUDA libraries the sandbox uses: driver, NVRTC, CUPTI, cuBLAS, cuDNN.
//
// Nothing links against them at build time, so the binary builds and its CPU paths run on
// machines without a GPU (the approach of PyTorch's LazyNVRTC). Each library is found in this
// order: a copy already mapped into the process (torch loaded it: we must share it, since two
// CUPTI or runtime instances in one process fight), the nvidia-* wheels next to the torch we
// were built against, the CUDA Toolkit, then the loader's default search.
//
// Each accessor loads on first use and is thread-safe; a library that cannot be found throws
// cuda_agent::Error naming the file and where it was looked for. The returned tables live for
// the whole process.
#pragma once

#include <string>
#include <vector>

#include <cuda.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <cupti.h>
#include <nvrtc.h>

namespace cuda_agent::sandbox {

#define CA_DRIVER_FUNCTIONS(X)                                                          \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)  \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)               \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuCtxGetDevice)           \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)    \
  X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuEventCreate) X(cuEventRecord)             \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) X(cuMemAlloc)           \
  X(cuMemFree) X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuMemcpyDtoDAsync)              \
  X(cuGetErrorName) X(cuGetErrorString) X(cuStreamSynchronize) X(cuPointerGetAttribute) \
  X(cuCtxGetLimit) X(cuMemGetInfo) X(cuCtxResetPersistingL2Cache) X(cuStreamGetAttribute)   \
  X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)     \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity)                          \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuMemcpyDtoH)      \
  X(cuStreamWaitEvent) X(cuMemHostAlloc) X(cuMemHostGetDevicePointer) X(cuMemFreeHost) \
  X(cuKernelGetName) X(cuStreamWaitValue32) X(cuStreamWriteValue32) X(cuStreamCreate)      \
  X(cuStreamDestroy) X(cuEventQuery)

#define CA_NVRTC_FUNCTIONS(X)                                                            \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram)    \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog)                 \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize) X(nvrtcGetPTX)                \
  X(nvrtcAddNameExpression) X(nvrtcGetLoweredName) X(nvrtcGetNumSupportedArchs)          \
  X(nvrtcGetSupportedArchs)

#define CA_CUPTI_FUNCTIONS(X)                                                         \
  X(cuptiGetVersion) X(cuptiGetResultString) X(cuptiActivityEnable)                   \
  X(cuptiActivityDisable) X(cuptiActivityRegisterCallbacks) X(cuptiActivityFlushAll)  \
  X(cuptiActivityGetNextRecord) X(cuptiActivityGetNumDroppedRecords) X(cuptiGetTimestamp) \
  X(cuptiActivityPushExternalCorrelationId) X(cuptiActivityPopExternalCorrelationId)   \
  X(cuptiSubscribe) X(cuptiUnsubscribe) X(cuptiEnableCallback) X(cuptiGetCallbackName)

#define CA_CUBLAS_FUNCTIONS(X)                                                     \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSetMathMode) \
  X(cublasGetStatusString) X(cublasGetVersion_v2)

#define CA_CUDNN_FUNCTIONS(X)                                                              \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream) \
  X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) \
  X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) \
  X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor)                   \
  X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType)                           \
  X(cudnnDestroyConvolutionDescriptor) X(cudnnCreateActivationDescriptor)                   \
  X(cudnnSetActivationDescriptor) X(cudnnDestroyActivationDescriptor)                       \
  X(cudnnGetConvolution2dForwardOutputDim) X(cudnnGetConvolutionForwardAlgorithm_v7)        \
  X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionBiasActivationForward)       \
  X(cudnnConvolutionForward) X(cudnnAddTensor) X(cudnnActivationForward)

#define CA_DECLARE_FN(name) decltype(&::name) name = nullptr;

struct DriverApi { CA_DRIVER_FUNCTIONS(CA_DECLARE_FN) std::string path; };
struct NvrtcApi { CA_NVRTC_FUNCTIONS(CA_DECLARE_FN) std::string path; };
struct CuptiApi { CA_CUPTI_FUNCTIONS(CA_DECLARE_FN) std::string path; };
// cublasGemmEx and its batched form have C++ overloads for old code; name the C functions' types.
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                                          int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                                          cublasGemmAlgo_t);
using CublasGemmStridedBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                                        int, int, const void*, const void*, cudaDataType, int,
                                                        long long, const void*, cudaDataType, int, long long,
                                                        const void*, void*, cudaDataType, int, long long, int,
                                                        cublasComputeType_t, cublasGemmAlgo_t);
struct CublasApi {
  CA_CUBLAS_FUNCTIONS(CA_DECLARE_FN)
  CublasGemmExFn cublasGemmEx = nullptr;
  CublasGemmStridedBatchedExFn cublasGemmStridedBatchedEx = nullptr;
  std::string path;
};
struct CudnnApi { CA_CUDNN_FUNCTIONS(CA_DECLARE_FN) std::string path; };

// The driver table also calls cuInit(0) once. Throws Error when no driver is installed.
const DriverApi& driver();
const NvrtcApi& nvrtc();
const CuptiApi& cupti();
const CublasApi& cublas();
const CudnnApi& cudnn();

// True when libcuda can be loaded and cuInit succeeds with at least one device. Never throws.
bool gpu_available(std::string* why_not = nullptr);

// Paths of the CUDA libraries mapped into this process now (libcuda, libcudart, libnvrtc,
// libcupti, libcublas, libcudnn, ...), one entry per mapped file, for `doctor` and for tests
// that prove one copy of each is loaded.
std::vector<std::string> loaded_cuda_library_files();

// Directories searched for the CUDA libraries after the already-mapped ones, in order.
std::vector<std::string> cuda_library_search_dirs();

namespace detail {
[[noreturn]] void throw_cuda_error(const char* library, const char* call, int code,
                                   const std::string& text, const char* file, int line);
std::string driver_error_text(CUresult code);
}  // namespace detail

}  // namespace cuda_agent::sandbox

// One check macro per library: the call text, file, line and the library's own error string.
#define CA_CU_CHECK(call)                                                                    \
  do {                                                                                       \
    CUresult ca_status_ = (call);                                                            \
    if (ca_status_ != CUDA_SUCCESS)                                                          \
      ::cuda_agent::sandbox::detail::throw_cuda_error(                                       \
          "CUDA driver", #call, static_cast<int>(ca_status_),                                \
          ::cuda_agent::sandbox::detail::driver_error_text(ca_status_), __FILE__, __LINE__); \
  } while (0)

#define CA_NVRTC_CHECK(call)                                                                   \
  do {                                                                                         \
    nvrtcResult ca_status_ = (call);                                                           \
    if (ca_status_ != NVRTC_SUCCESS)                                                           \
      ::cuda_agent::sandbox::detail::throw_cuda_error(                                         \
          "NVRTC", #call, static_cast<int>(ca_status_),                                        \
          ::cuda_agent::sandbox::nvrtc().nvrtcGetErrorString(ca_status_), __FILE__, __LINE__); \
  } while (0)

#define CA_CUPTI_CHECK(call)                                                              \
  do {                                                                                    \
    CUptiResult ca_status_ = (call);                                                      \
    if (ca_status_ != CUPTI_SUCCESS) {                                                    \
      const char* ca_text_ = "unknown";                                                   \
      ::cuda_agent::sandbox::cupti().cuptiGetResultString(ca_status_, &ca_text_);         \
      ::cuda_agent::sandbox::detail::throw_cuda_error("CUPTI", #call,                     \
                                                      static_cast<int>(ca_status_),       \
                                                      ca_text_, __FILE__, __LINE__);      \
    }                                                                                     \
  } while (0)

#define CA_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                          \
    cublasStatus_t ca_status_ = (call);                                                         \
    if (ca_status_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::cuda_agent::sandbox::detail::throw_cuda_error(                                          \
          "cuBLAS", #call, static_cast<int>(ca_status_),                                        \
          ::cuda_agent::sandbox::cublas().cublasGetStatusString(ca_status_), __FILE__, __LINE__); \
  } while (0)

#define CA_CUDNN_CHECK(call)                                                                  \
  do {                                                                                        \
    cudnnStatus_t ca_status_ = (call);                                                        \
    if (ca_status_ != CUDNN_STATUS_SUCCESS)                                                   \
      ::cuda_agent::sandbox::detail::throw_cuda_error(                                        \
          "cuDNN", #call, static_cast<int>(ca_status_),                                       \
          ::cuda_agent::sandbox::cudnn().cudnnGetErrorString(ca_status_), __FILE__, __LINE__); \
  } while (0)
