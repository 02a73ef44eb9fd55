// Kernel provenance: which kernels ran while ModelNew.forward ran, who launched them
// (launch_origins.h: by correlation id, never by name), and whether that is allowed.
//
// A forward must run at least one kernel of the solution's own (the runtime's launch path, the
// nvcc path's libraries, or the named vendor calls); PyTorch's own fills and copies are allowed
// when torch's library launched them and their name carries one of the allowed identifiers as a
// whole token; everything else (ATen compute, Triton, cuBLAS through torch, ctypes launches) is
// foreign compute. Allowed fills and copies that take more GPU time than kAllowedTimeFactor
// times the solution's own kernels did the work themselves, with a decoy beside them.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/launch_origins.h"

namespace cuda_agent::sandbox {

// One kernel (by name and origin) over a stretch of records: what the candidate process reports
// for each run, and what kernel tables are made of.
struct KernelUse {
  std::string name;  // demangled where possible
  LaunchOrigin origin = LaunchOrigin::kUnknown;
  std::string library;  // the launching library, for launches outside the runtime's scopes
  int64_t calls = 0;
  double total_us = 0;
  std::set<uint32_t> streams;
  std::string grid, block;  // of the last call, e.g. "4096x1x1"
  nlohmann::json to_json() const;
  static KernelUse from_json(const nlohmann::json& j);  // throws on a malformed entry
};

// Groups records by (name, origin, library).
std::vector<KernelUse> summarize_kernels(const std::vector<KernelRecord>& records);
void merge_kernel_uses(std::vector<KernelUse>& into, const std::vector<KernelUse>& more);

// Per-kernel table over `runs` forwards: calls per forward, mean and total time, streams, origin.
// Sorted by total time, largest first.
nlohmann::json kernel_table(const std::vector<KernelUse>& uses, int runs);

// True when `identifier` occurs in `name` as a whole identifier (not inside a longer one).
bool has_identifier(const std::string& name, const std::string& identifier);

struct ProvenanceReport {
  static constexpr uint64_t kHostCopyLimit = 4096;
  static constexpr double kAllowedTimeFactor = 2.0;

  int64_t own = 0;      // launches of the solution's kernels (runtime path and nvcc path)
  int64_t vendor = 0;   // kernels launched inside cuda_agent.gemm / conv2d
  int64_t allowed = 0;  // PyTorch's allowed fills and copies
  double own_us = 0, vendor_us = 0, allowed_us = 0;
  std::map<std::string, int64_t> own_names, forbidden;  // forbidden: "name [origin: library]" -> launches
  uint64_t host_copy_bytes = 0;  // device-to-host copies inside forward (host compute)

  bool violates() const;
  std::string message() const;  // what was wrong, naming the kernels
  void merge(const ProvenanceReport& other);
  nlohmann::json to_json() const;
};

// Sorts one forward's kernels into the report. `allow`: identifiers of PyTorch's own fills and
// copies (SandboxOptions::provenance_allow).
ProvenanceReport classify_kernels(const std::vector<KernelUse>& uses, const std::vector<std::string>& allow);

}  // namespace cuda_agent::sandbox
