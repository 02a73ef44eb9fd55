// Who launched each kernel, decided when it is launched and joined to CUPTI's kernel records by
// correlation id; never by the kernel's name.
//
//   own       the runtime's launch path (cuda_agent.compile kernels), marked by a LaunchScope
//   vendor    inside a named vendor call (cuda_agent.gemm / conv2d), marked by a LaunchScope
//   harness   the sandbox's own work in the candidate process (poison, output copies)
//   own_nvcc  a launch through the CUDA runtime API whose caller is a library built from the
//             solution's sources (the nvcc path: load_inline, kernels/)
//   torch     a launch through the CUDA runtime API from torch's own libraries (ATen)
//   other     anything else: Triton's launchers, a driver launch from ctypes, cuBLAS/cuDNN
//             called by torch, CUDA graph replays
//
// A CUPTI callback on every kernel-launch entry point of the driver and runtime APIs records,
// per correlation id, the calling thread's LaunchScope or, outside one, the library of the first
// stack frame that is not CUDA's, CUPTI's or this binary's (found once per kernel handle and
// cached). Installed once per process (CUPTI allows one subscriber).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cuda_agent::sandbox {

enum class LaunchOrigin : uint8_t { kUnknown, kOwn, kVendor, kHarness, kOwnNvcc, kTorch, kOther };
const char* to_string(LaunchOrigin origin);
LaunchOrigin launch_origin_from_string(const std::string& name);  // unknown names -> kUnknown

// Marks the CUDA calls the calling thread makes in this scope as `origin`'s. Cheap (a
// thread-local); nests.
class LaunchScope {
 public:
  explicit LaunchScope(LaunchOrigin origin);
  ~LaunchScope();
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  LaunchOrigin previous_;
};

struct LaunchAttribution {
  LaunchOrigin origin = LaunchOrigin::kUnknown;
  std::string library;  // the caller's file name, for launches outside a scope
};

// Subscribes the launch callbacks. `own_dirs`: folders whose libraries hold the solution's nvcc
// builds; `torch_lib_dir`: torch's lib folder. A second call only replaces the folders. Throws
// Error when CUPTI refuses (another subscriber, say).
void install_launch_origins(const std::vector<std::string>& own_dirs, const std::string& torch_lib_dir);
bool launch_origins_installed();

// The attribution recorded for `correlation_id`, forgotten once read (kUnknown: none recorded).
// Thread-safe.
LaunchAttribution take_launch_origin(uint32_t correlation_id);

}  // namespace cuda_agent::sandbox
