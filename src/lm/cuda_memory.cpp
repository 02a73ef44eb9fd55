#include "torch_fmt.h"  // first: see there

#include "cuda_memory.h"

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#define CA_LM_HAVE_CUDA_ALLOCATOR 1
#endif

namespace cuda_agent::lm {
namespace {

std::shared_mutex& capture_mutex() {
  static std::shared_mutex m;
  return m;
}

}  // namespace

std::shared_lock<std::shared_mutex> graph_capture_guard() {
  return std::shared_lock<std::shared_mutex>(capture_mutex());
}

int64_t release_cached_cuda_memory() {
#ifdef CA_LM_HAVE_CUDA_ALLOCATOR
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator = c10::cuda::CUDACachingAllocator::get();
  if (allocator == nullptr || !allocator->initialized()) return 0;
  const auto reserved = [&] {
    int64_t bytes = 0;
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    for (c10::DeviceIndex d = 0; d < c10::cuda::device_count(); ++d)
      bytes += allocator->getDeviceStats(d).reserved_bytes[aggregate].current;
    return bytes;
  };
  std::unique_lock<std::shared_mutex> no_capture(capture_mutex());
  const int64_t before = reserved();
  allocator->emptyCache();
  return before - reserved();
#else
  return 0;
#endif
}

}  // namespace cuda_agent::lm
