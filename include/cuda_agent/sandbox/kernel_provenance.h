// Kernel provenance: which kernels ran while ModelNew.forward ran, and who launched them.
//
// The runtime's own launches (cuda_agent.compile kernels) and its named vendor calls
// (cuda_agent.gemm / conv2d) push a CUPTI external correlation id (CUSTOM0) around the CUDA API
// calls they make; CUPTI joins it to every kernel those calls launch. Every other kernel came
// from somewhere else (ATen, Triton, cuBLAS called by PyTorch) and is compute the candidate did
// not write, unless its name matches the allow-list (fills and copies: allocation-like work).
// Kernels of the nvcc path (load_inline, kernels/) are launched by the candidate's extension,
// not the runtime, and are recognised by the __global__ names in its sources.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/cupti_kernel_recorder.h"

namespace cuda_agent::sandbox {

enum class LaunchOrigin : uint64_t { kOwnKernel = 1, kVendorCall = 2 };

// Tags the CUDA API calls made in this scope (on this thread) while provenance recording is
// on; does nothing (and loads nothing) otherwise.
class ProvenanceScope {
 public:
  explicit ProvenanceScope(LaunchOrigin origin);
  ~ProvenanceScope();
  ProvenanceScope(const ProvenanceScope&) = delete;
  ProvenanceScope& operator=(const ProvenanceScope&) = delete;

 private:
  bool pushed_ = false;
};

// The identifier a kernel is declared with: "void ns::k<float>(float*, int)" -> "k".
std::string kernel_base_name(const std::string& demangled);
// The names of the __global__ functions declared in CUDA source text (any file type: a
// load_inline string inside model_new.py counts).
std::set<std::string> global_kernel_names(const std::string& source);

struct ProvenanceReport {
  int64_t own = 0;      // launches of the candidate's kernels (runtime-tagged or by source name)
  int64_t vendor = 0;   // kernels launched inside cuda_agent.gemm / conv2d
  int64_t allowed = 0;  // allow-listed (fills, copies)
  std::map<std::string, int64_t> own_names, forbidden;
  uint64_t host_copy_bytes = 0;  // device-to-host copies inside forward (host compute)
  static constexpr uint64_t kHostCopyLimit = 4096;
  std::string attribution = "external_correlation";  // or "names" when CUPTI gave no correlations
  bool violates() const { return !forbidden.empty() || own + vendor == 0 || host_copy_bytes > kHostCopyLimit; }
  std::string message() const;  // what was wrong, naming the kernels
  void merge(const ProvenanceReport& other);
  nlohmann::json to_json() const;
};

// Sorts records into the report. `source_names`: __global__ names of the candidate's nvcc-path
// sources; `runtime_names`: symbols the runtime launched (used only when `have_external` is
// false, i.e. CUPTI produced no external correlations at all).
ProvenanceReport classify_kernels(const std::vector<KernelRecord>& records, const std::vector<std::string>& allow,
                                  const std::set<std::string>& source_names, const std::set<std::string>& runtime_names,
                                  bool have_external);

// Starts/stops CUPTI recording with attribution around a region. Synchronize before end().
class ProvenanceRecorder {
 public:
  void begin();
  // have_external: CUPTI produced external correlations; host_copy_bytes: device-to-host bytes.
  std::vector<KernelRecord> end(bool* have_external, uint64_t* host_copy_bytes = nullptr);
};

}  // namespace cuda_agent::sandbox
