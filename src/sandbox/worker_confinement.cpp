#include "cuda_agent/sandbox/worker_confinement.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/ranges.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"
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
  for (const char* which : {"gpu", kGpuTurn, "quiet", kQuietTurn}) {
    const std::string path = gpu_lock_path(gpu, which);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;  // another user's file, say: its holders run without that lock, as unconfined
    ::close(fd);
    files.push_back(path);
  }
  return files;
}

const char* turnstile_of(std::string_view which) {
  if (which == "quiet") return kQuietTurn;
  if (which == "gpu") return kGpuTurn;
  return nullptr;
}

GpuLock::GpuLock(int gpu, const char* which, bool exclusive, double max_wait_s, const std::function<void()>& check) {
  const auto start = std::chrono::steady_clock::now();
  // The lock's turnstile: every taker passes it (exclusive, briefly), and an exclusive taker
  // holds it while it waits for the shared holders to go. A shared taker that comes meanwhile
  // waits behind it, where it would otherwise join the holders: the file lock is taken by whoever
  // tries when it is free, so overlapping shared holders could keep an exclusive taker waiting
  // without end: on the quiet lock, generation and learner updates (several runs' of them) kept an
  // evaluation's timing out for 66 s on the H200 with five ablation variants; on the gpu lock,
  // judges compiling baselines (sandbox.compile_before_lock) or starting CUDA
  // (sandbox.init_before_lock) one after another. Without its file (another user's, say) the lock
  // goes alone.
  int turn = -1;
  if (const char* turn_file = turnstile_of(which)) {
    try {
      turn = lock_file(gpu_lock_path(gpu, turn_file), /*exclusive=*/true, max_wait_s, check);
      if (turn < 0) {
        timed_out_ = true;
        return;
      }
    } catch (const Error&) {
      turn = -1;
    }
    if (!exclusive && turn >= 0) ::close(std::exchange(turn, -1));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  try {
    fd_ = lock_file(gpu_lock_path(gpu, which), exclusive, max_wait_s < 0 ? -1.0 : std::max(0.0, max_wait_s - waited),
                    check);
    timed_out_ = fd_ < 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "cuda-agent: %s; running without it\n", e.what());
  } catch (...) {  // what `check` threw: the turnstile is let go with the wait
    if (turn >= 0) ::close(turn);
    throw;
  }
  if (turn >= 0) ::close(turn);
}

GpuLock quiet_for_untimed_work(int gpu, double max_wait_s, const char* what) {
  GpuLock lock(gpu, "quiet", /*exclusive=*/false, max_wait_s);
  if (!lock.timed_out()) return lock;
  std::vector<pid_t> holders;
  for (const char* file : {"quiet", kQuietTurn})
    for (const pid_t pid : lock_holders(gpu_lock_path(gpu, file))) holders.push_back(pid);
  CA_LOG_WARN("sandbox",
              "the GPU's quiet lock ({}) stayed held for {:g} s (by pid {}): {} goes on without it, beside whatever "
              "times on the GPU; look for a command that holds the lock file",
              gpu_lock_path(gpu, "quiet"), max_wait_s, fmt::join(holders, ", "), what);
  return GpuLock();
}

QuietSteps::QuietSteps(int gpu, double max_wait_s, const char* what)
    : gpu_(gpu), max_wait_s_(max_wait_s), what_(what), lock_(quiet_for_untimed_work(gpu, max_wait_s, what)) {
  if (lock_.held()) turn_fd_ = ::open(gpu_lock_path(gpu, kQuietTurn).c_str(), O_RDONLY | O_CLOEXEC);
}

QuietSteps::~QuietSteps() {
  if (turn_fd_ >= 0) ::close(turn_fd_);
}

void QuietSteps::pause_point() {
  if (!lock_.held() || turn_fd_ < 0) return;
  // Only an exclusive taker holds the turnstile for longer than a moment (a shared taker passes
  // it, and a pause for one that does costs a take of a free lock).
  if (::flock(turn_fd_, LOCK_SH | LOCK_NB) == 0) {
    ::flock(turn_fd_, LOCK_UN);
    return;
  }
  if (errno != EWOULDBLOCK) return;
  const auto start = std::chrono::steady_clock::now();
  lock_.release();
  lock_ = quiet_for_untimed_work(gpu_, max_wait_s_, what_);
  ++pauses_;
  paused_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::function<void(bool working)> quiet_gate(int gpu, double max_wait_s, const char* what) {
  struct Holds {
    std::mutex mutex;
    std::map<std::thread::id, std::unique_ptr<QuietSteps>> by_thread;  // only its thread uses an entry
  };
  auto holds = std::make_shared<Holds>();
  return [holds, gpu, max_wait_s, what](bool working) {
    const std::thread::id me = std::this_thread::get_id();
    QuietSteps* held = nullptr;
    std::unique_ptr<QuietSteps> ending;
    {
      std::lock_guard<std::mutex> lock(holds->mutex);
      const auto it = holds->by_thread.find(me);
      if (it != holds->by_thread.end()) {
        if (working)
          held = it->second.get();
        else {
          ending = std::move(it->second);
          holds->by_thread.erase(it);
        }
      }
    }
    if (!working) return;  // `ending` lets the lock go
    if (held) {
      held->pause_point();
      return;
    }
    auto taken = std::make_unique<QuietSteps>(gpu, max_wait_s, what);  // may wait: outside the mutex
    std::lock_guard<std::mutex> lock(holds->mutex);
    holds->by_thread[me] = std::move(taken);
  };
}

std::function<void(bool working)> batch_engine_gate(int gpu) {
  return quiet_gate(gpu, SandboxOptions{}.gpu_wait_s, "the batch engine's decoding");
}

GpuWaitName::GpuWaitName() {
  ::prctl(PR_GET_NAME, previous_);
  ::prctl(PR_SET_NAME, kGpuWaitName);
}

GpuWaitName::~GpuWaitName() {
  ::prctl(PR_SET_NAME, previous_);
}

bool waits_for_gpu_lock(pid_t ancestor) {
  return descendant_named(ancestor, kGpuWaitName);
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

namespace {

void add_resolved(std::vector<std::string>& dirs, const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  const std::string resolved = fs::canonical(dir, ec).string();
  if (!ec && std::find(dirs.begin(), dirs.end(), resolved) == dirs.end()) dirs.push_back(resolved);
}

// The git directories of every repository `path` lies in (each folder up to /): a `.git`
// folder, or for a `.git` file (a worktree, a submodule) the folder it names and that folder's
// common directory, where the objects are.
void add_git_directories(std::vector<std::string>& dirs, const fs::path& path) {
  std::error_code ec;
  for (fs::path dir = path; dir.has_relative_path(); dir = dir.parent_path()) {
    const fs::path dot_git = dir / ".git";
    if (fs::is_directory(dot_git, ec)) {
      add_resolved(dirs, dot_git);
    } else if (fs::is_regular_file(dot_git, ec)) {
      std::string text;
      try {
        text = read_file(dot_git);
      } catch (const Error&) {
        continue;
      }
      const size_t at = text.find("gitdir:");
      if (at == std::string::npos) continue;
      std::string named = text.substr(at + 7);
      named.erase(0, named.find_first_not_of(" \t"));
      named.erase(named.find_last_not_of(" \t\r\n") + 1);
      const fs::path git_dir = fs::path(named).is_absolute() ? fs::path(named) : dir / named;
      add_resolved(dirs, git_dir);
      std::string common;
      try {
        common = read_file(git_dir / "commondir");
      } catch (const Error&) {
        continue;
      }
      common.erase(common.find_last_not_of(" \t\r\n") + 1);
      add_resolved(dirs, fs::path(common).is_absolute() ? fs::path(common) : git_dir / common);
    }
  }
}

}  // namespace

std::vector<std::string> answer_directories(const std::string& task_path) {
  std::vector<std::string> dirs;
  std::error_code ec;
  const fs::path given = fs::absolute(task_path, ec).lexically_normal();
  for (const fs::path& task : {given, fs::weakly_canonical(given, ec)}) {
    // <split>/tasks/<id>/model.py: two and three folders up; <root>/level1/<file>.py: two up.
    fs::path dir = task.parent_path();
    for (int up = 1; up <= 3 && dir.has_relative_path(); ++up, dir = dir.parent_path())
      if (up >= 2) add_resolved(dirs, dir / "solutions");
  }
  // The history of the repositories holding the task and its answers holds the answers too
  // (`git show HEAD:data/core/solutions/<id>/model_new.py`), and answers removed since.
  const std::vector<std::string> answers = dirs;
  for (const fs::path& task : {given, fs::weakly_canonical(given, ec)}) add_git_directories(dirs, task.parent_path());
  for (const std::string& answer : answers) add_git_directories(dirs, answer);
  return dirs;
}

std::vector<std::string> read_scope_system_paths() {
  std::vector<std::string> paths = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/run"};
  auto add = [&](const fs::path& path) {
    std::error_code ec;
    if (path.empty() || !path.is_absolute() || !fs::exists(path, ec)) return;
    const std::string resolved = fs::canonical(path, ec).string();
    if (!ec && std::find(paths.begin(), paths.end(), resolved) == paths.end()) paths.push_back(resolved);
  };
  // The embedded Python: .../bin/python3 of a venv or an installation, the installation behind a
  // venv (pyvenv.cfg's home), the folders Python is told to search.
  const fs::path python = python_executable();
  if (python.is_absolute()) {
    for (const fs::path& exe : {python, fs::weakly_canonical(python)}) add(exe.parent_path().parent_path());
    std::ifstream cfg(python.parent_path().parent_path() / "pyvenv.cfg");
    for (std::string line; std::getline(cfg, line);) {
      const size_t eq = line.find('=');
      if (eq == std::string::npos || line.compare(0, 4, "home") != 0) continue;
      std::string home = line.substr(eq + 1);
      home.erase(0, home.find_first_not_of(" \t"));
      home.erase(home.find_last_not_of(" \t\r") + 1);
      add(fs::path(home).parent_path());
    }
  }
  for (const char* variable : {"PYTHONPATH", "PYTHONHOME"})
    if (const char* value = std::getenv(variable)) {
      std::string list = value;
      for (size_t start = 0; start <= list.size();) {
        const size_t end = std::min(list.find(':', start), list.size());
        add(list.substr(start, end - start));
        start = end + 1;
      }
    }
  if (const char* cuda = std::getenv("CUDA_HOME")) add(cuda);
  // The toolchain a solution's build runs (torch's cpp_extension takes CXX, else c++; nvcc's
  // host compiler is CC or CUDAHOSTCXX): a compiler installed outside /usr, such as
  // /opt/gcc/bin/g++, needs its whole installation (cc1plus, its headers and libraries).
  std::error_code ec;
  const char* home_env = std::getenv("HOME");
  const fs::path home = home_env && *home_env ? fs::weakly_canonical(home_env, ec) : fs::path();
  auto add_tool = [&](const std::string& tool) {
    const std::string exe = find_program(tool);
    if (exe.empty()) return;
    for (const fs::path& at : {fs::path(exe), fs::weakly_canonical(exe, ec)}) {
      const fs::path bin = at.parent_path();
      add(bin);
      // <prefix>/bin/<tool>: the prefix, unless it is the root or a home folder (~/bin/gcc
      // shows ~/bin alone: a home holds runs, clones and copies of answers).
      const fs::path prefix = bin.parent_path();
      const bool a_home = (!home.empty() && fs::weakly_canonical(prefix, ec) == home) || prefix.parent_path() == "/home";
      if (bin.filename() == "bin" && prefix.has_relative_path() && !a_home) add(prefix);
    }
  };
  for (const char* variable : {"CXX", "CC", "CUDAHOSTCXX"})
    if (const char* value = std::getenv(variable)) {
      std::istringstream words(value);  // "ccache g++", "g++ -m64": each program it names
      for (std::string word; words >> word;)
        if (word[0] != '-') add_tool(word);
    }
  for (const char* tool : {"c++", "g++", "gcc", "cc", "nvcc", "ninja"}) add_tool(tool);
  add(self_executable());
  // Libraries already mapped (libtorch's folders in a trainer, a venv's CUDA libraries).
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string file = line.substr(slash);
    if (const size_t deleted = file.find(" (deleted)"); deleted != std::string::npos) file.resize(deleted);
    add(fs::path(file).parent_path());
  }
  return paths;
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
