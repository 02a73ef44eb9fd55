// The module's GPU memory given back to the driver between phases of work, so that other
// processes on the GPU (the sandbox's evaluations, the other runs of an ablation) can have it.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>

namespace cuda_agent::lm {

// Held (shared) around each CUDA graph capture of this module: emptying the caching allocator's
// cache waits for captures to end and keeps new ones from starting while it runs (torch frees
// cached blocks only when no capture is underway).
std::shared_lock<std::shared_mutex> graph_capture_guard();

// torch.cuda.empty_cache for this process: the caching allocator's unused blocks go back to the
// driver. Returns the bytes given back (the allocator's reserved bytes before less after), 0
// where CUDA was never used or this build has no CUDA allocator. Synchronizes the device.
int64_t release_cached_cuda_memory();

}  // namespace cuda_agent::lm
