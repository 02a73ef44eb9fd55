// Built as the module libca_torch_info.so; the only sandbox file that includes libtorch.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>

#include <cstdio>

#include "cuda_agent/sandbox/torch_info.h"

extern "C" int ca_libtorch_info(char* buf, unsigned long size) {
  int devices = 0;
  try {
    devices = static_cast<int>(c10::cuda::device_count());
  } catch (...) {
    devices = 0;
  }
  return std::snprintf(buf, size, "{\"version\": \"%s\", \"cuda_device_count\": %d}", TORCH_VERSION, devices);
}
