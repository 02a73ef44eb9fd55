// Records every kernel the GPU runs while recording is on, through CUPTI's activity API
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL): name, start/end timestamps, stream, launch shape, and
// who launched it (launch_origins.h, when installed); plus every copy and fill (MEMCPY, MEMSET)
// as a span of GPU time, and the bytes copied device-to-host.
//
// CUPTI's activity callbacks are process-global, so there is one recorder per process.
// Buffers are handed back by CUPTI on its own thread; records are appended under a mutex that
// is never held while calling into CUPTI (a flush calls back into us).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/launch_origins.h"

namespace cuda_agent::sandbox {

struct KernelRecord {
  std::string name;        // demangled where possible
  uint64_t start_ns = 0;   // CUPTI timestamps (cuptiGetTimestamp's clock)
  uint64_t end_ns = 0;
  uint32_t stream_id = 0;
  uint32_t device_id = 0;
  uint32_t correlation_id = 0;
  // Who launched it (launch_origins.h); kUnknown when the launch callbacks are not installed.
  LaunchOrigin origin = LaunchOrigin::kUnknown;
  std::string library;
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
};

// A copy or fill the GPU ran (CUPTI's MEMCPY and MEMSET records): when, on which stream, how
// many bytes, and who issued it (launch_origins.h; kUnknown when the callbacks are not installed).
struct GpuSpan {
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream_id = 0;
  uint32_t correlation_id = 0;
  uint64_t bytes = 0;
  CopyOrigin origin = CopyOrigin::kUnknown;
};

class CuptiKernelRecorder {
 public:
  static CuptiKernelRecorder& instance();

  // Starts recording (registers CUPTI's buffer callbacks on first use), dropping earlier
  // records. Throws Error if CUPTI cannot be loaded or enabled.
  void start();
  // Flushes CUPTI's buffers (synchronize the GPU first) and returns the records since start()
  // or the last take(), recording on; *host_copy_bytes gets the device-to-host bytes copied in
  // that stretch, *transfers its copies and fills.
  std::vector<KernelRecord> take(uint64_t* host_copy_bytes = nullptr, std::vector<GpuSpan>* transfers = nullptr);
  // take(), then stops recording.
  std::vector<KernelRecord> stop(uint64_t* host_copy_bytes = nullptr, std::vector<GpuSpan>* transfers = nullptr);
  bool recording() const { return recording_; }
  // CUPTI's clock, for bracketing a region.
  static uint64_t timestamp();
  // Records CUPTI reported as dropped since start().
  size_t dropped() const { return dropped_; }

  // Launches the sandbox's probe: an empty kernel of its own (loaded once from PTX), on the
  // harness's account, into the legacy stream of the current context. Its record, attributed to
  // the harness, shows that CUPTI still records kernels and still calls the launch callbacks;
  // synchronize before take(). Throws Error.
  static void launch_probe();
  static bool is_probe(const KernelRecord& r);

  // Used by CUPTI's callbacks.
  void append(std::vector<KernelRecord>&& records, std::vector<GpuSpan>&& transfers);
  void add_host_copy(uint64_t bytes) { host_copy_bytes_ += bytes; }

 private:
  CuptiKernelRecorder() = default;
  bool registered_ = false;
  bool recording_ = false;
  std::atomic<uint64_t> host_copy_bytes_{0};
  size_t dropped_ = 0;
  std::vector<KernelRecord> records_;
  std::vector<GpuSpan> transfers_;
};

}  // namespace cuda_agent::sandbox
