// The candidate process's OS confinement (sandbox.confine) and the GPU locks that order an
// evaluation's GPU phases against other work of this user's.
//
// A confined candidate process (core/confinement.h) sees the file system read-only except:
//   - its solution's own NVRTC cache folder and nvcc build folder (kernels/ builds and
//     torch.utils.cpp_extension's, TORCH_EXTENSIONS_DIR), named by the solution's fingerprint,
//     so a poisoned entry can only mislead that solution's own later evaluations,
//   - a private /tmp (and $TMPDIR when that is elsewhere) in memory, where the host's entries
//     are visible read-only: Python's tempfile and nvcc write there, and torch.compile's inductor
//     cache, Triton's, the CUDA JIT cache and ATen's kernel cache go to a fresh folder in it
//     (private_cache_env() in core/confinement.h), all lost at exit,
//   - a private /dev/shm;
// and the evaluation cache's secret folder (the key of the baseline cache) and the GPUs' lock
// files (gpu_lock_directory()) are hidden. The task, the solution's folder, the baselines, the
// agent's workspace, the judge's result, $HOME and everything else are read-only; there is no
// network. The candidate writes nothing the caller reads: its outputs go to the judge through
// shared memory, its reports over the channel.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda_agent/core/confinement.h"

namespace cuda_agent::sandbox {

// The folder of the GPUs' lock files, cuda-agent-locks in the temporary directory (the host's,
// CUDA_AGENT_HOST_TMPDIR, in a confined process), made (mode 1777) when missing. A confined
// candidate process sees it empty.
std::filesystem::path gpu_lock_directory();

// The turnstiles of the gpu and quiet locks (GpuLock): lock files of their own.
inline constexpr const char* kGpuTurn = "gpu-turn";
inline constexpr const char* kQuietTurn = "quiet-turn";

// The turnstile of lock `which` (kGpuTurn, kQuietTurn), or nullptr for a lock without one.
const char* turnstile_of(std::string_view which);

// The lock file `which` ("gpu", "quiet", kGpuTurn or kQuietTurn) of GPU `gpu`, in gpu_lock_directory().
std::string gpu_lock_path(int gpu, const char* which);

// The lock files of GPU `gpu` (gpu, quiet and their turnstiles), created when missing (a
// confinement must find them to bind them); those that cannot be created (another user's file,
// say) are left out.
std::vector<std::string> gpu_lock_files(int gpu);

// One of GPU `gpu`'s locks (EvalRequest::gpu_lock says what each orders), held from construction
// until release() or destruction: exclusive, or shared with other shared holders. Blocks until it
// is taken, first come first served, or with max_wait_s >= 0 at most that long (then timed_out()
// is true and nothing is held); `check` is called about every second of a wait, and what it
// throws ends the wait (lock_file). The gpu and quiet locks go through turnstiles (turnstile_of): once an exclusive
// taker waits, shared takers that come after it wait for it, so shared holders that overlap cannot keep it waiting for
// ever.
// A lock that cannot be taken (another user's file, say) is skipped with a note on stderr: the locks order this user's
// GPU work, they are not a security boundary.
class GpuLock {
 public:
  GpuLock() = default;
  GpuLock(int gpu, const char* which, bool exclusive, double max_wait_s = -1, const std::function<void()>& check = {});
  ~GpuLock() { release(); }
  GpuLock(GpuLock&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), timed_out_(std::exchange(other.timed_out_, false)) {}
  GpuLock& operator=(GpuLock&& other) noexcept {
    if (this != &other) {
      release();
      fd_ = std::exchange(other.fd_, -1);
      timed_out_ = std::exchange(other.timed_out_, false);
    }
    return *this;
  }
  bool timed_out() const { return timed_out_; }
  bool held() const { return fd_ >= 0; }

  void release();
  // Keeps the lock until this process exits (the kernel drops it then).
  void hold_until_exit() { fd_ = -1; }

 private:
  int fd_ = -1;
  bool timed_out_ = false;
};

// GPU `gpu`'s quiet lock, shared, around GPU work that is not timed (the policy's generation, a
// learner's update), waited for at most max_wait_s (< 0: without end). Past it the work goes on
// without the lock and a warning names `what` and the lock's holders: a command of an agent's can
// hold the lock file (a read-only descriptor is enough for flock), and every episode's generation,
// its own included, would otherwise wait for good.
GpuLock quiet_for_untimed_work(int gpu, double max_wait_s, const char* what);

// GPU `gpu`'s quiet lock, shared, around untimed GPU work that goes in steps (a policy's decoding,
// a token a step), taken as quiet_for_untimed_work takes it. At pause_point(), called between two
// steps with none of the work's GPU work in flight, the hold lets a timed run in: when an exclusive
// taker waits for the quiet lock (it holds the lock's turnstile), the hold lets the lock go and takes
// it again, which waits (bounded as the first take) until that run is done. So an evaluation's
// timing waits for one step of the work, not for the whole of it (a reply of thousands of tokens).
class QuietSteps {
 public:
  QuietSteps(int gpu, double max_wait_s, const char* what);
  ~QuietSteps();
  QuietSteps(const QuietSteps&) = delete;
  QuietSteps& operator=(const QuietSteps&) = delete;

  void pause_point();
  int pauses() const { return pauses_; }         // times it let a timed run in
  double paused_s() const { return paused_s_; }  // seconds it waited for those runs

 private:
  int gpu_;
  double max_wait_s_;
  const char* what_;
  GpuLock lock_;
  int turn_fd_ = -1;  // the turnstile, opened once: pause_point() tries it shared, without waiting
  int pauses_ = 0;
  double paused_s_ = 0;
};

// A gate for work that goes in rounds on a thread of its own and idles between bursts (the batch
// engine's, lm::LmOptions::engine_gate): called with true before each round, it takes GPU `gpu`'s
// quiet lock shared as QuietSteps does on the first round after idling and is its pause point on
// the next ones; called with false, it lets the lock go. Each calling thread holds its own.
std::function<void(bool working)> quiet_gate(int gpu, double max_wait_s, const char* what);
// The batch engine's gate on GPU `gpu` (the trainer's, and a local: policy's with batch_engine=1):
// quiet_gate with the sandbox's default gpu_wait_s as its longest wait.
std::function<void(bool working)> batch_engine_gate(int gpu);

// While one lives, this process is named kGpuWaitName (its main thread's name, prctl PR_SET_NAME;
// call it on the main thread): it waits for a GPU's lock that other processes hold. The agent's
// Bash does not count such waits of a command's processes against the command's timeout
// (waits_for_gpu_lock). Restores the name it found.
class GpuWaitName {
 public:
  GpuWaitName();
  ~GpuWaitName();
  GpuWaitName(const GpuWaitName&) = delete;
  GpuWaitName& operator=(const GpuWaitName&) = delete;

 private:
  char previous_[16] = {};
};
inline constexpr const char* kGpuWaitName = "ca-gpu-wait";

// Whether a process that descends from `ancestor` waits for a GPU's lock now (it is named
// kGpuWaitName). Any process can take that name: what believes it must bound what it grants.
bool waits_for_gpu_lock(pid_t ancestor);

// The confinement of a candidate process that may write `writable` (its own cache folders) and
// must not see `hidden`, but for `shown` inside them (read-only: its solution's folder inside a
// hidden run folder): those, the private /tmp (and $TMPDIR), gpu_lock_directory() hidden too,
// and tmpfs_bytes per tmpfs.
ConfinementPlan candidate_confinement_plan(const std::vector<std::string>& writable,
                                           const std::vector<std::string>& hidden, uint64_t tmpfs_bytes,
                                           const std::vector<std::string>& shown = {});

// The folders that hold the answers to the task `task_path`: a `solutions` folder of its split
// (data/<split>/solutions beside data/<split>/tasks/<id>/model.py; kb/solutions beside
// kb/level1/<file>.py), found from the path as given and as resolved, those that exist; and the
// git directories of every repository the task or those folders lie in (a `.git` folder; for a
// worktree's `.git` file, its git folder and their common one), whose objects hold the answers
// as committed. A solution must not read them (a model_new.py that execs the reference solution
// is not one), nor an agent's shell: a confined candidate and Bash see them empty.
std::vector<std::string> answer_directories(const std::string& task_path);

// sandbox.read_scope "system": what any confined process of the sandbox may read besides its own
// folders: the system's (/usr, /bin, /sbin, /lib*, /etc, /run), the embedded Python's (its
// venv, the installation behind it, PYTHONPATH and PYTHONHOME), CUDA_HOME, the build
// toolchain's installations (CXX, CC, CUDAHOSTCXX and c++, g++, gcc, cc, nvcc, ninja on PATH:
// <prefix> of <prefix>/bin/<tool>), this binary and the folders of every library mapped into
// this process. Everything else (the repository, other
// runs, users' homes) is hidden from a process confined with these as ConfinementPlan::visible.
std::vector<std::string> read_scope_system_paths();

// Whether a confined Bash or candidate can run with `dir` hidden: false when it holds this
// binary or the embedded Python's folder (a run folder given as the repository itself, say).
bool may_hide(const std::filesystem::path& dir);

// Whether `path` is `dir` or inside it, both resolved as far as they exist.
bool path_within(const std::filesystem::path& path, const std::filesystem::path& dir);

}  // namespace cuda_agent::sandbox
