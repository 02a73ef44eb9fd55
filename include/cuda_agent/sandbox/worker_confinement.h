// The evaluation worker's OS confinement (sandbox.confine) and its start-up report.
//
// A confined worker (core/confinement.h) sees the file system read-only except:
//   - the folder of its result file (result.json, the phase file; the worker's log is opened
//     by the parent),
//   - the evaluation cache (SandboxOptions::resolved_cache_dir(): NVRTC cubins, baselines,
//     kernels/ builds, and torch.utils.cpp_extension builds, sent there with
//     TORCH_EXTENSIONS_DIR),
//   - this GPU's lock files when EvalRequest::gpu_lock is set,
//   - a private /tmp (and $TMPDIR when that is elsewhere) in memory, where the host's entries
//     are visible read-only: Python's tempfile and nvcc write there, and torch.compile's inductor
//     cache, Triton's, the CUDA JIT cache and ATen's kernel cache go to a fresh folder in it
//     (private_cache_env() in core/confinement.h), all lost at exit,
//   - a private /dev/shm.
// The task, the solution's own folder, the agent's workspace and its verify/profile scripts,
// $HOME and everything else are read-only; there is no network.
//
// The start-up report is how the parent tells a failure of the confinement itself (or of CUDA
// inside it) from anything the solution did: the worker writes one line on a descriptor only
// it and the parent hold, after Python, torch and CUDA started and before any task or solution
// code runs, and then closes it. Whatever the solution writes later can only follow that line.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cuda_agent/core/confinement.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::sandbox {

// The lock file `which` ("gpu" or "quiet") of GPU `gpu`, in the temporary directory (the host's,
// CUDA_AGENT_HOST_TMPDIR, in a confined process).
std::string gpu_lock_path(int gpu, const char* which);

// Both lock files of GPU `gpu`, created when missing (a confinement must find them to bind them
// writable); those that cannot be created (another user's file, say) are left out.
std::vector<std::string> gpu_lock_files(int gpu);

// One of GPU `gpu`'s locks (EvalRequest::gpu_lock says what each orders), held from construction
// until release() or destruction: exclusive, or shared with other shared holders. Blocks until it
// is taken. A lock that cannot be taken (another user's file, say) is skipped with a note on
// stderr: the locks order this user's GPU work, they are not a security boundary.
class GpuLock {
 public:
  GpuLock() = default;
  GpuLock(int gpu, const char* which, bool exclusive);
  ~GpuLock() { release(); }
  GpuLock(GpuLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  GpuLock& operator=(GpuLock&& other) noexcept {
    if (this != &other) {
      release();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }

  void release();
  // Keeps the lock until this process exits (the kernel drops it then).
  void hold_until_exit() { fd_ = -1; }

 private:
  int fd_ = -1;
};

// What the worker for `request`, writing its result to `result_path`, keeps writable. Creates
// the cache folder and, when they are used, the lock files (they must exist to be bound).
ConfinementPlan worker_confinement_plan(const EvalRequest& request, const std::string& result_path);

// Confines this worker process as worker_confinement_plan() says and points the tools' caches
// (above) at writable places. Call it first thing in the worker, before Python starts. Throws
// Error when a step fails.
void confine_worker(const EvalRequest& request, const std::string& result_path);

// The worker's side of the start-up report. Owns the descriptor (-1: none; every call is then a
// no-op); the first of ready() and failed() writes the line and closes it, later calls do
// nothing.
class StartupReport {
 public:
  explicit StartupReport(int fd) : fd_(fd) {}
  ~StartupReport();
  StartupReport(const StartupReport&) = delete;
  StartupReport& operator=(const StartupReport&) = delete;

  void ready();
  void failed(const std::string& phase, const std::string& message);

 private:
  void send(const std::string& line);
  int fd_;
};

// The parent's side: the first line the worker wrote.
struct StartupStatus {
  bool reported = false;  // a line arrived
  bool ready = false;     // the worker reached the solution's part
  std::string phase;      // failed: the worker's phase (confine, python_start, gpu_wait, cuda_init)
  std::string message;    // failed: what went wrong
};
StartupStatus parse_startup_status(const std::string& text);

}  // namespace cuda_agent::sandbox
