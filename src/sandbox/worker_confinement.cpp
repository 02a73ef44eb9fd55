#include "cuda_agent/sandbox/worker_confinement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {

fs::path gpu_lock_directory() {
  const fs::path dir = host_temp_directory() / "cuda-agent-locks";
  // Sticky and open to all, as the temporary directory itself: every user's evaluations lock
  // their GPUs here (each file 0666).
  if (::mkdir(dir.c_str(), 0777) == 0) (void)::chmod(dir.c_str(), 01777);
  return dir;
}

std::string gpu_lock_path(int gpu, const char* which) {
  return (gpu_lock_directory() / fmt::format("cuda-agent-gpu{}.{}.lock", gpu, which)).string();
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

bool path_within(const fs::path& path, const fs::path& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  const std::string ps = p.string(), ds = d.string();
  return ps == ds || (ps.size() > ds.size() && ps.compare(0, ds.size(), ds) == 0 &&
                      (ds.back() == '/' || ps[ds.size()] == '/'));
}

std::vector<std::string> answer_directories(const std::string& task_path) {
  std::vector<std::string> dirs;
  std::error_code ec;
  const fs::path given = fs::absolute(task_path, ec).lexically_normal();
  for (const fs::path& task : {given, fs::weakly_canonical(given, ec)}) {
    // <split>/tasks/<id>/model.py: two and three folders up; <root>/level1/<file>.py: two up.
    fs::path dir = task.parent_path();
    for (int up = 1; up <= 3 && dir.has_relative_path(); ++up, dir = dir.parent_path()) {
      if (up < 2) continue;
      const fs::path answers = dir / "solutions";
      if (!fs::is_directory(answers, ec)) continue;
      const std::string resolved = fs::canonical(answers, ec).string();
      if (!ec && std::find(dirs.begin(), dirs.end(), resolved) == dirs.end()) dirs.push_back(resolved);
    }
  }
  return dirs;
}

bool may_hide(const fs::path& dir) {
  const fs::path python_bin = fs::path(python_executable()).parent_path();
  return !path_within(self_executable(), dir) && !(python_bin.is_absolute() && path_within(python_bin, dir));
}

ConfinementPlan candidate_confinement_plan(const std::vector<std::string>& writable,
                                           const std::vector<std::string>& hidden, uint64_t tmpfs_bytes,
                                           const std::vector<std::string>& shown) {
  ConfinementPlan plan;
  plan.writable = writable;
  plan.hidden = hidden;
  plan.read_only = shown;
  plan.private_dirs.push_back("/tmp");
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (!ec && fs::is_directory(tmp, ec)) {
    const fs::path resolved = fs::canonical(tmp, ec);
    if (!ec && resolved != "/" && resolved != fs::canonical("/tmp", ec)) plan.private_dirs.push_back(resolved.string());
  }
  // The GPUs' lock files: a solution that could open one could hold it (flock needs no more than
  // a read-only descriptor) and keep its own judge, or its siblings', from taking the GPU. Those
  // of this process's host temporary directory, and those of other processes' whose temporary
  // directory is one of the private ones (the private /tmp shows the host's entries).
  std::vector<fs::path> lock_dirs = {gpu_lock_directory()};
  for (const std::string& dir : plan.private_dirs) lock_dirs.push_back(fs::path(dir) / "cuda-agent-locks");
  for (const fs::path& dir : lock_dirs) {
    const fs::path resolved = fs::canonical(dir, ec);
    if (ec || !fs::is_directory(resolved, ec)) continue;
    if (std::find(plan.hidden.begin(), plan.hidden.end(), resolved.string()) == plan.hidden.end())
      plan.hidden.push_back(resolved.string());
  }
  plan.tmpfs_bytes = tmpfs_bytes;
  return plan;
}

}  // namespace cuda_agent::sandbox
