// What each process holds of the GPUs' memory, from NVML (the driver's management library,
// loaded at run time: nothing links against it, and machines without a GPU have none).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace cuda_agent {

// The GPU memory every compute process holds, summed over the machine's GPUs, by pid as NVML
// names it (the caller's PID namespace where the driver translates them). nullopt where NVML
// cannot be loaded or initialised, or will not list processes; a process whose figure NVML does
// not have (another container's) is left out. Thread-safe; never throws.
std::optional<std::map<pid_t, uint64_t>> gpu_memory_by_process();

// The compute capability the machine's GPUs share, "9.0" for an H100, from NVML: no CUDA context
// is made, so a process may ask before it forks one that will start CUDA. "" where NVML cannot
// say, or the GPUs differ (NVML's order of them need not be CUDA's). Thread-safe; never throws.
std::string gpu_compute_capability();

}  // namespace cuda_agent
