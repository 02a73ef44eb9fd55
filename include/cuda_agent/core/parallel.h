// Work spread over a few threads of this process.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace cuda_agent {

// Calls work(i) for every i in [0, count) from up to `threads` threads (this one among them), each
// taking the next index when it is done with one; returns once every call has returned. With
// `stop`, no index is handed out after it returns true (the calls under way finish).
inline void parallel_for(size_t count, size_t threads, const std::function<void(size_t)>& work,
                         const std::function<bool()>& stop = {}) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count && !(stop && stop()); i = next++) work(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(std::max<size_t>(threads, 1), count); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace cuda_agent
