#include "cuda_agent/sandbox/cuda_device.h"

#include <fmt/format.h>

#include "cuda_agent/sandbox/cuda_libs.h"

namespace cuda_agent::sandbox {

std::string DeviceInfo::arch() const { return fmt::format("sm_{}{}", cc_major, cc_minor); }

void to_json(nlohmann::json& j, const DeviceInfo& d) {
  j = {{"ordinal", d.ordinal},       {"name", d.name},
       {"arch", d.arch()},           {"sm_count", d.sm_count},
       {"total_memory_bytes", d.total_memory_bytes}, {"l2_cache_bytes", d.l2_cache_bytes},
       {"peak_dram_gbps", d.peak_dram_gbps()},
       {"driver_version", d.driver_version}};
}

void ensure_context() {
  const DriverApi& api = driver();
  CUcontext ctx = nullptr;
  CA_CU_CHECK(api.cuCtxGetCurrent(&ctx));
  if (ctx != nullptr) return;
  CUdevice dev = 0;
  CA_CU_CHECK(api.cuDeviceGet(&dev, 0));
  CA_CU_CHECK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
  CA_CU_CHECK(api.cuCtxSetCurrent(ctx));
}

DeviceInfo current_device_info() {
  const DriverApi& api = driver();
  ensure_context();
  CUdevice dev = 0;
  CA_CU_CHECK(api.cuCtxGetDevice(&dev));
  DeviceInfo info;
  info.ordinal = static_cast<int>(dev);
  char name[256] = {0};
  CA_CU_CHECK(api.cuDeviceGetName(name, sizeof(name), dev));
  info.name = name;
  CA_CU_CHECK(api.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CA_CU_CHECK(api.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CA_CU_CHECK(api.cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  CA_CU_CHECK(api.cuDeviceGetAttribute(&info.l2_cache_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev));
  api.cuDeviceGetAttribute(&info.memory_clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev);
  api.cuDeviceGetAttribute(&info.memory_bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev);
  size_t total = 0;
  CA_CU_CHECK(api.cuDeviceTotalMem(&total, dev));
  info.total_memory_bytes = static_cast<int64_t>(total);
  CA_CU_CHECK(api.cuDriverGetVersion(&info.driver_version));
  return info;
}

}  // namespace cuda_agent::sandbox
