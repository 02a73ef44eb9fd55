#include "cuda_agent/sandbox/worker_confinement.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {

std::string gpu_lock_path(int gpu, const char* which) {
  return (host_temp_directory() / fmt::format("cuda-agent-gpu{}.{}.lock", gpu, which)).string();
}

std::vector<std::string> gpu_lock_files(int gpu) {
  std::vector<std::string> files;
  for (const char* which : {"gpu", "quiet"}) {
    const std::string path = gpu_lock_path(gpu, which);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;  // another user's file, say: its holders run without that lock, as unconfined
    ::close(fd);
    files.push_back(path);
  }
  return files;
}

GpuLock::GpuLock(int gpu, const char* which, bool exclusive, double max_wait_s) {
  try {
    fd_ = lock_file(gpu_lock_path(gpu, which), exclusive, max_wait_s);
    timed_out_ = fd_ < 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "cuda-agent: %s; running without it\n", e.what());
  }
}

void GpuLock::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ConfinementPlan candidate_confinement_plan(const std::vector<std::string>& writable,
                                           const std::vector<std::string>& hidden, uint64_t tmpfs_bytes) {
  ConfinementPlan plan;
  plan.writable = writable;
  plan.hidden = hidden;
  plan.private_dirs.push_back("/tmp");
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (!ec && fs::is_directory(tmp, ec)) {
    const fs::path resolved = fs::canonical(tmp, ec);
    if (!ec && resolved != "/" && resolved != fs::canonical("/tmp", ec)) plan.private_dirs.push_back(resolved.string());
  }
  plan.tmpfs_bytes = tmpfs_bytes;
  return plan;
}

}  // namespace cuda_agent::sandbox
