// Records every kernel the GPU runs while recording is on, through CUPTI's activity API
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL): name, start/end timestamps, stream, launch shape.
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

namespace cuda_agent::sandbox {

struct KernelRecord {
  std::string name;        // demangled where possible
  uint64_t start_ns = 0;   // CUPTI timestamps (cuptiGetTimestamp's clock)
  uint64_t end_ns = 0;
  uint32_t stream_id = 0;
  uint32_t device_id = 0;
  uint32_t correlation_id = 0;
  // The external correlation id pushed (CUSTOM0) around the API call that launched it: set by
  // the runtime's own launches and named vendor calls (kernel_provenance.h); 0 otherwise.
  uint64_t external_id = 0;
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
};

class CuptiKernelRecorder {
 public:
  static CuptiKernelRecorder& instance();

  // Starts recording (registers CUPTI's buffer callbacks on first use). Throws Error if CUPTI
  // cannot be loaded or enabled. With `attribute`, the driver/runtime API records and their
  // external correlations are collected too, so stop() can fill KernelRecord::external_id.
  void start(bool attribute = false);
  // Whether the last start() asked for attribution and CUPTI produced external correlations.
  size_t external_correlations() const { return external_count_; }
  // Bytes copied device-to-host since start(attribute = true).
  uint64_t host_copy_bytes() const { return host_copy_bytes_; }
  void add_host_copy(uint64_t bytes) { host_copy_bytes_ += bytes; }
  // Flushes CUPTI's buffers (synchronize the GPU first) and returns the records since start().
  std::vector<KernelRecord> stop();
  // CUPTI's clock, for bracketing a region.
  static uint64_t timestamp();
  // Records CUPTI reported as dropped since the last start().
  size_t dropped() const { return dropped_; }

  // Used by CUPTI's callbacks.
  void append(std::vector<KernelRecord>&& records);
  void append_external(const std::vector<std::pair<uint32_t, uint64_t>>& correlations);

 private:
  CuptiKernelRecorder() = default;
  bool registered_ = false;
  bool attribute_ = false;
  size_t external_count_ = 0;
  std::atomic<uint64_t> host_copy_bytes_{0};
  std::vector<std::pair<uint32_t, uint64_t>> external_;  // correlation id -> external id
  size_t dropped_ = 0;
  std::vector<KernelRecord> records_;
};

// Per-kernel summary of records from `runs` forwards: calls per forward, mean and total time,
// streams. Sorted by total time, largest first.
nlohmann::json kernel_table(const std::vector<KernelRecord>& records, int runs);

}  // namespace cuda_agent::sandbox
