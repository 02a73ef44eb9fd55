#include "cuda_agent/core/gpu_memory.h"

#include <dlfcn.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace cuda_agent {
namespace {

// The few NVML declarations used, as nvml.h (not part of the CUDA Toolkit here) has them.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_t, what the _v3 queries fill
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInsufficientSize = 7;
constexpr unsigned long long kValueNotAvailable = ~0ULL;

struct Nvml {
  bool ok = false;
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*device_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*capability)(nvmlDevice_t, int*, int*) = nullptr;  // optional
};

const Nvml& nvml() {
  static Nvml api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(::dlsym(lib, "nvmlInit_v2"));
    api.device_count = reinterpret_cast<decltype(api.device_count)>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
    api.device_by_index =
        reinterpret_cast<decltype(api.device_by_index)>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    api.compute_processes =
        reinterpret_cast<decltype(api.compute_processes)>(::dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
    api.capability = reinterpret_cast<decltype(api.capability)>(::dlsym(lib, "nvmlDeviceGetCudaComputeCapability"));
    api.ok = init != nullptr && api.device_count != nullptr && api.device_by_index != nullptr &&
             api.compute_processes != nullptr && init() == kSuccess;
  });
  return api;
}

}  // namespace

std::optional<std::map<pid_t, uint64_t>> gpu_memory_by_process() {
  const Nvml& api = nvml();
  if (!api.ok) return std::nullopt;
  unsigned int devices = 0;
  if (api.device_count(&devices) != kSuccess) return std::nullopt;
  std::map<pid_t, uint64_t> held;
  for (unsigned int d = 0; d < devices; ++d) {
    nvmlDevice_t device = nullptr;
    if (api.device_by_index(d, &device) != kSuccess) return std::nullopt;
    std::vector<nvmlProcessInfo_t> infos(64);
    unsigned int count = static_cast<unsigned int>(infos.size());
    nvmlReturn_t rc = api.compute_processes(device, &count, infos.data());
    for (int tries = 0; rc == kInsufficientSize && tries < 4; ++tries) {  // more processes came
      infos.resize(static_cast<size_t>(count) + 16);
      count = static_cast<unsigned int>(infos.size());
      rc = api.compute_processes(device, &count, infos.data());
    }
    if (rc != kSuccess) return std::nullopt;
    for (unsigned int i = 0; i < count && i < infos.size(); ++i)
      if (infos[i].pid > 0 && infos[i].usedGpuMemory != kValueNotAvailable)
        held[static_cast<pid_t>(infos[i].pid)] += infos[i].usedGpuMemory;
  }
  return held;
}

std::string gpu_compute_capability() {
  const Nvml& api = nvml();
  unsigned int devices = 0;
  if (!api.ok || api.capability == nullptr || api.device_count(&devices) != kSuccess || devices == 0) return "";
  std::set<std::string> seen;
  for (unsigned int d = 0; d < devices; ++d) {
    nvmlDevice_t device = nullptr;
    int major = 0, minor = 0;
    if (api.device_by_index(d, &device) != kSuccess || api.capability(device, &major, &minor) != kSuccess ||
        major <= 0 || minor < 0 || minor > 9)
      return "";
    seen.insert(std::to_string(major) + "." + std::to_string(minor));
  }
  return seen.size() == 1 ? *seen.begin() : "";
}

}  // namespace cuda_agent
