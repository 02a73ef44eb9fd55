// The GPU this process works on, through the driver API.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int64_t total_memory_bytes = 0;
  int l2_cache_bytes = 0;
  int driver_version = 0;  // e.g. 13000
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;
  std::string arch() const;  // "sm_90"
  // DRAM bandwidth from the clock and bus width the driver reports (double data rate), GB/s.
  double peak_dram_gbps() const { return 2.0 * memory_clock_khz * 1e3 * (memory_bus_bits / 8.0) / 1e9; }
};
void to_json(nlohmann::json& j, const DeviceInfo& d);

// Makes sure a CUDA context is current on the calling thread: keeps the one there (torch's
// primary context once torch has touched the GPU), else retains device 0's primary context,
// which is the one torch uses too. Throws Error without a GPU.
void ensure_context();

// The device of the current context (ensure_context() first). Throws Error without a GPU.
DeviceInfo current_device_info();

}  // namespace cuda_agent::sandbox
