#include "cuda_agent/core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/core/unique_fd.h"

extern char** environ;

namespace cuda_agent {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr auto kRssInterval = std::chrono::milliseconds(100);
constexpr auto kDiskInterval = std::chrono::milliseconds(500);
constexpr auto kPauseInterval = std::chrono::milliseconds(1000);  // clock_paused's questions
constexpr auto kKillWaitPoll = std::chrono::milliseconds(5);
// How long to wait for SIGKILLed processes to disappear (one in uninterruptible sleep, e.g.
// inside a driver, can take a while); past this we stop waiting rather than hang.
constexpr Seconds kKillWaitLimit{5.0};
constexpr const char* kDefaultPath = "/usr/local/bin:/usr/bin:/bin";

// Owns a posix_spawn attribute object (file actions or attributes) for its lifetime.
template <typename T, int (*kInit)(T*), int (*kDestroy)(T*)>
class SpawnObject {
 public:
  SpawnObject() { CA_ASSERT(kInit(&object_) == 0, "posix_spawn object init failed"); }
  ~SpawnObject() { kDestroy(&object_); }
  SpawnObject(const SpawnObject&) = delete;
  SpawnObject& operator=(const SpawnObject&) = delete;
  T* get() { return &object_; }

 private:
  T object_;
};
using SpawnFileActions = SpawnObject<posix_spawn_file_actions_t, posix_spawn_file_actions_init,
                                     posix_spawn_file_actions_destroy>;
using SpawnAttr = SpawnObject<posix_spawnattr_t, posix_spawnattr_init, posix_spawnattr_destroy>;

// Opens an output file for the child, at a descriptor above 2 so that the dup2 actions
// onto 1 and 2 cannot clobber each other.
UniqueFd open_output(const std::string& path, const char* stream) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  int err = errno;
  CA_CHECK(fd >= 0, "cannot open '{}' for the child's {}: {}; check that its directory exists "
           "and is writable", path, stream, errno_text(err));
  UniqueFd owned(fd);
  if (fd < 3) {
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    err = errno;
    CA_CHECK(high >= 0, "cannot duplicate the descriptor of '{}': {}", path, errno_text(err));
    owned = UniqueFd(high);
  }
  return owned;
}

// A null-terminated array of pointers into `strings`, as exec wants.
std::vector<char*> to_pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

bool same_file(int a, int b) {
  struct stat sa{};
  struct stat sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::map<std::string, std::string> build_environment(const SubprocessOptions& options) {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    auto eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  for (const auto& name : options.env_unset) env.erase(name);
  for (const auto& [name, value] : options.env_set) {
    CA_CHECK(!name.empty() && name.find('=') == std::string::npos,
             "env_set has an invalid variable name '{}': names must be non-empty and contain "
             "no '='", name);
    env[name] = value;
  }
  return env;
}

// The first executable `name` in the folders of `search` (a PATH value), as execvp would take
// it; "" when none. A relative entry is taken from `cwd` (the child's working directory).
std::string search_program(const std::string& name, const std::string& search, const std::string& cwd) {
  for (size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = search.find(':', begin);
    const std::string dir = search.substr(begin, end == std::string::npos ? end : end - begin);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    const std::string check =
        candidate[0] == '/' || cwd.empty() ? candidate : cwd + "/" + candidate;
    struct stat st{};
    if (::stat(check.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(check.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

// Returns the path to exec for `name`, searching PATH as execvp would.
std::string resolve_program(const std::string& name, const std::map<std::string, std::string>& env,
                            const std::string& cwd) {
  if (name.find('/') != std::string::npos) return name;  // exec reports any failure
  const char* parent_path = std::getenv("PATH");
  auto it = env.find("PATH");
  const std::string search = it != env.end()       ? it->second
                             : parent_path != nullptr ? parent_path
                                                      : kDefaultPath;
  const std::string found = search_program(name, search, cwd);
  if (!found.empty()) return found;
  CA_FAIL("cannot start '{}': {} (not found on PATH={}); give a full path or fix PATH", name,
          errno_text(ENOENT), search);
}

struct GroupSample {
  int64_t rss_bytes = 0;
  int live = 0;  // processes in the group that are not zombies
};

// Sums the RSS of the live processes (not zombies) whose process group is `pgid`.
GroupSample sample_group(pid_t pgid) {
  GroupSample sample;
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  for (const auto& [pid, s] : all_processes()) {
    if (s.pgrp != pgid || s.state == 'Z' || s.state == 'X') continue;
    ++sample.live;
    sample.rss_bytes += static_cast<int64_t>(s.rss_pages) * page;
  }
  return sample;
}

// True once the child has terminated; leaves it unreaped (a zombie), so that its pid, and
// with it the process group id, cannot be reused while we still signal the group.
bool has_exited(pid_t pid) {
  siginfo_t info{};
  const int rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  const int err = errno;  // WNOHANG: never blocks, so never EINTR
  CA_ASSERT(rc == 0, "waitid on child {} failed: {} (was it reaped elsewhere?)", pid,
            errno_text(err));
  return info.si_pid == pid;
}

// Waits until no live process is left in the group, or `limit` has passed since `since`.
void wait_group_gone(pid_t pgid, Clock::time_point since, Seconds limit) {
  while (sample_group(pgid).live > 0 && Clock::now() - since < limit) {
    std::this_thread::sleep_for(kKillWaitPoll);
  }
}

std::string format_bytes(int64_t bytes) {
  double value = static_cast<double>(bytes);
  const char* unit = "B";
  for (const char* bigger : {"KiB", "MiB", "GiB", "TiB"}) {
    if (value < 1024.0) break;
    value /= 1024.0;
    unit = bigger;
  }
  return unit[0] == 'B' ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, unit);
}

void validate(const SubprocessOptions& options) {
  CA_CHECK(!options.argv.empty() && !options.argv[0].empty(),
           "run_subprocess: argv is empty; give at least the program to run");
  CA_CHECK(options.timeout_s >= 0, "run_subprocess: timeout_s is {}; use 0 for no limit",
           options.timeout_s);
  CA_CHECK(options.max_rss_bytes >= 0, "run_subprocess: max_rss_bytes is {}; use 0 for no limit",
           options.max_rss_bytes);
  CA_CHECK(options.kill_grace_s >= 0, "run_subprocess: kill_grace_s is {}; it must be >= 0",
           options.kill_grace_s);
  CA_CHECK(options.pass_fd < 0 || ::fcntl(options.pass_fd, F_GETFD) >= 0,
           "run_subprocess: pass_fd {} is not an open descriptor", options.pass_fd);
  if (!options.cwd.empty()) {
    struct stat st{};
    CA_CHECK(::stat(options.cwd.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
             "cannot start '{}': working directory '{}' does not exist or is not a directory",
             options.argv[0], options.cwd);
  }
}

// The child's stdout and stderr files, opened by the parent (unset: /dev/null, fd -1).
struct ChildOutputs {
  UniqueFd out, err;
  bool err_shares_out = false;  // stderr goes to out's open description
};

ChildOutputs open_outputs(const SubprocessOptions& options) {
  const std::string& out_path = options.stdout_path;
  const std::string& err_path = options.stderr_path;
  ChildOutputs o;
  if (!out_path.empty()) o.out = open_output(out_path, "stdout");
  if (!err_path.empty() && err_path != out_path) o.err = open_output(err_path, "stderr");
  // Two names for one file must share one open description, or the streams overwrite each
  // other.
  o.err_shares_out = (!err_path.empty() && err_path == out_path) ||
                     (o.out.get() >= 0 && o.err.get() >= 0 && same_file(o.out.get(), o.err.get()));
  return o;
}

// Starts the child in a new session; returns its pid. Throws Error if it cannot start.
pid_t spawn_child(const SubprocessOptions& options) {
  const std::map<std::string, std::string> env = build_environment(options);
  const std::string program = resolve_program(options.argv[0], env, options.cwd);
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> envp = to_pointers(env_strings);
  std::vector<char*> argv = to_pointers(argv_strings);

  const ChildOutputs outputs = open_outputs(options);
  const UniqueFd& out_fd = outputs.out;
  const UniqueFd& err_fd = outputs.err;
  const bool err_shares_out = outputs.err_shares_out;

  SpawnFileActions actions;
  auto redirect = [&](int source, int target) {  // source < 0: /dev/null
    return source >= 0 ? posix_spawn_file_actions_adddup2(actions.get(), source, target) == 0
                       : posix_spawn_file_actions_addopen(actions.get(), target, "/dev/null",
                                                          target == 0 ? O_RDONLY : O_WRONLY,
                                                          0) == 0;
  };
  bool built = redirect(-1, 0) && redirect(out_fd.get(), 1) &&
               redirect(err_shares_out ? out_fd.get() : err_fd.get(), 2);
  // A copy above 3, so that dup2 onto 3 really copies (and clears close-on-exec).
  UniqueFd pass_fd(options.pass_fd < 0 ? -1 : ::fcntl(options.pass_fd, F_DUPFD_CLOEXEC, 4));
  const int pass_err = errno;
  CA_CHECK(options.pass_fd < 0 || pass_fd.get() >= 0, "cannot duplicate descriptor {} for the child: {}",
           options.pass_fd, errno_text(pass_err));
  if (pass_fd.get() >= 0) built = built && redirect(pass_fd.get(), 3);
  if (!options.cwd.empty()) {
    built = built && posix_spawn_file_actions_addchdir_np(actions.get(), options.cwd.c_str()) == 0;
  }
  built = built && posix_spawn_file_actions_addclosefrom_np(actions.get(), pass_fd.get() >= 0 ? 4 : 3) == 0;

  SpawnAttr attr;
  sigset_t no_signals;
  sigset_t all_signals;
  sigemptyset(&no_signals);
  sigfillset(&all_signals);
  built = built && posix_spawnattr_setsigmask(attr.get(), &no_signals) == 0 &&
          posix_spawnattr_setsigdefault(attr.get(), &all_signals) == 0 &&
          posix_spawnattr_setflags(attr.get(), POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                                   POSIX_SPAWN_SETSIGDEF) == 0;
  CA_ASSERT(built, "could not prepare posix_spawn for '{}'", options.argv[0]);

  pid_t pid = -1;
  const int error =
      ::posix_spawn(&pid, program.c_str(), actions.get(), attr.get(), argv.data(), envp.data());
  CA_CHECK(error == 0, "cannot start '{}': {}", options.argv[0], errno_text(error));
  return pid;
}

// Starts a child that runs `body` in a copy of this process; returns its pid. Throws Error if
// it cannot start.
pid_t fork_child(const SubprocessOptions& options, const std::function<int()>& body) {
  const ChildOutputs outputs = open_outputs(options);
  const UniqueFd& out_fd = outputs.out;
  const UniqueFd& err_fd = outputs.err;
  const bool err_shares_out = outputs.err_shares_out;
  // Every descriptor the child moves into place sits above 3, so that no dup2 clobbers another.
  UniqueFd opened(::open("/dev/null", O_RDWR | O_CLOEXEC));
  UniqueFd null_fd(opened.get() < 0 ? -1 : ::fcntl(opened.get(), F_DUPFD_CLOEXEC, 4));
  CA_CHECK(null_fd.get() >= 0, "cannot open /dev/null for '{}': {}", options.argv[0], errno_text(errno));
  opened = UniqueFd();
  UniqueFd pass_fd(options.pass_fd < 0 ? -1 : ::fcntl(options.pass_fd, F_DUPFD_CLOEXEC, 4));
  CA_CHECK(options.pass_fd < 0 || pass_fd.get() >= 0, "cannot duplicate descriptor {} for the child: {}",
           options.pass_fd, errno_text(errno));
  std::fflush(nullptr);  // what this process buffered is written once, by this process
  const pid_t pid = ::fork();
  const int fork_error = errno;
  CA_CHECK(pid >= 0, "cannot start '{}': fork failed: {}", options.argv[0], errno_text(fork_error));
  if (pid > 0) return pid;
  // The child. Nothing here returns into the caller's stack.
  int code = 1;
  try {
    ::setsid();
    for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);  // SIGKILL, SIGSTOP and libc's own fail: fine
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int out = out_fd.get() >= 0 ? out_fd.get() : null_fd.get();
    const int err = err_shares_out ? out : err_fd.get() >= 0 ? err_fd.get() : null_fd.get();
    bool set_up = ::dup2(null_fd.get(), 0) == 0 && ::dup2(out, 1) == 1 && ::dup2(err, 2) == 2 &&
                  (pass_fd.get() < 0 || ::dup2(pass_fd.get(), 3) == 3) &&
                  ::close_range(pass_fd.get() >= 0 ? 4 : 3, ~0U, 0) == 0 &&
                  (options.cwd.empty() || ::chdir(options.cwd.c_str()) == 0);
    for (const auto& name : options.env_unset) set_up = set_up && ::unsetenv(name.c_str()) == 0;
    for (const auto& [name, value] : options.env_set) set_up = set_up && ::setenv(name.c_str(), value.c_str(), 1) == 0;
    if (!set_up) {
      std::fprintf(stderr, "cuda-agent: cannot set up the child '%s': %s\n", options.argv[0].c_str(),
                   errno_text(errno).c_str());
      code = 127;
    } else {
      code = body();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-agent: the child '%s' failed: %s\n", options.argv[0].c_str(), e.what());
  } catch (...) {
  }
  std::fflush(nullptr);
  ::_exit(code);
}

// Watches the child until it exits, enforcing the limits, then clears its group and reaps it.
void monitor_child(pid_t pid, const SubprocessOptions& options, Clock::time_point start,
                   SubprocessResult& result) {
  enum class Phase { kRunning, kTerminating, kKilled };
  // A pre-started child's clock starts when the caller gives it its work.
  bool clock_running = options.deferred_timeout_s == nullptr;
  double timeout_s = options.timeout_s;
  Phase phase = Phase::kRunning;
  Clock::time_point term_sent;
  const Seconds grace(options.kill_grace_s);
  auto next_sample = start;
  const bool sample_rss = options.sample_rss || options.max_rss_bytes > 0;
  // The watched folders' bound: what they held at the start plus what they may gain.
  const bool watch_disk = options.max_watched_bytes > 0 && !options.watched_paths.empty();
  const uint64_t disk_bound = watch_disk ? disk_usage(options.watched_paths) + options.max_watched_bytes : 0;
  auto next_disk = start;
  // What did not count against the timeout (clock_paused), and when it was last asked.
  const Seconds max_paused(options.clock_paused ? std::max(0.0, options.max_paused_s) : 0.0);
  Seconds paused{0};
  auto last_asked = start;
  auto stop_group = [&](bool& reason) {
    reason = true;
    ::kill(-pid, SIGTERM);
    phase = Phase::kTerminating;
    term_sent = Clock::now();
  };

  while (!has_exited(pid)) {
    auto now = Clock::now();
    if (!clock_running) {
      const double deferred = options.deferred_timeout_s->load();
      if (deferred >= 0) {
        clock_running = true;
        start = last_asked = now;
        timeout_s = deferred;
        result.timeout_s = deferred;
      }
    }
    if (sample_rss && now >= next_sample) {
      const GroupSample sample = sample_group(pid);
      result.peak_rss_bytes = std::max(result.peak_rss_bytes, sample.rss_bytes);
      next_sample = now + kRssInterval;
      if (phase == Phase::kRunning && options.max_rss_bytes > 0 &&
          sample.rss_bytes > options.max_rss_bytes) {
        stop_group(result.memory_exceeded);
      }
    }
    if (phase == Phase::kRunning && watch_disk && now >= next_disk) {
      next_disk = now + kDiskInterval;
      if (disk_usage(options.watched_paths, disk_bound) > disk_bound) stop_group(result.disk_exceeded);
    }
    if (phase == Phase::kRunning && clock_running && paused < max_paused && now - last_asked >= kPauseInterval) {
      if (options.clock_paused(pid)) paused = std::min<Seconds>(max_paused, paused + (now - last_asked));
      last_asked = now;
    }
    if (phase == Phase::kRunning && clock_running && timeout_s > 0 && now - start >= Seconds(timeout_s) + paused) {
      stop_group(result.timed_out);
    }
    if (phase == Phase::kRunning && options.cancel != nullptr && options.cancel->load()) {
      stop_group(result.cancelled);
    }
    if (phase == Phase::kTerminating && Clock::now() - term_sent >= grace) {
      ::kill(-pid, SIGKILL);
      phase = Phase::kKilled;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  result.wall_s = Seconds(Clock::now() - start).count();
  result.paused_s = paused.count();

  // The child is gone but its group may not be: give the rest of the group what is left of
  // the grace period if we were stopping it, then kill whatever remains and wait for it.
  if (phase == Phase::kTerminating) wait_group_gone(pid, term_sent, grace);
  ::kill(-pid, SIGKILL);
  wait_group_gone(pid, Clock::now(), kKillWaitLimit);

  int status = 0;
  struct rusage usage{};
  pid_t reaped;
  while ((reaped = ::wait4(pid, &status, 0, &usage)) < 0 && errno == EINTR) continue;
  const int wait_error = errno;
  CA_ASSERT(reaped == pid, "wait4 on child {} failed: {}", pid, errno_text(wait_error));
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  result.peak_rss_bytes =
      std::max(result.peak_rss_bytes, static_cast<int64_t>(usage.ru_maxrss) * 1024);
}

}  // namespace

bool SubprocessResult::ok() const {
  return term_signal == 0 && exit_code == 0 && !timed_out && !memory_exceeded && !disk_exceeded && !cancelled;
}

std::string SubprocessResult::describe() const {
  if (memory_exceeded) {
    return fmt::format("exceeded memory limit {} (peak {})", format_bytes(max_rss_bytes),
                       format_bytes(peak_rss_bytes));
  }
  if (disk_exceeded)
    return fmt::format("wrote more than {} into its folders", format_bytes(static_cast<int64_t>(max_watched_bytes)));
  if (timed_out && paused_s > 0)
    return fmt::format("timed out after {:.1f} s (not counting {:.1f} s of waiting)", timeout_s, paused_s);
  if (timed_out) return fmt::format("timed out after {:.1f} s", timeout_s);
  if (cancelled) return "stopped by the caller";
  if (term_signal != 0) {
    const char* text = ::sigdescr_np(term_signal);
    return fmt::format("killed by signal {} ({})", term_signal,
                       text != nullptr ? text : "unknown signal");
  }
  return fmt::format("exited with code {}", exit_code);
}

namespace {

// Validates the options and starts the child with `start`, closing pass_fd afterwards when the
// options hand it over, whether the start worked or not.
template <typename Start>
pid_t start_child(const SubprocessOptions& options, Start&& start) {
  auto close_passed = [&] {
    if (options.close_pass_fd && options.pass_fd >= 0) ::close(options.pass_fd);
  };
  pid_t pid = -1;
  try {
    validate(options);
    pid = start();
  } catch (...) {
    close_passed();
    throw;
  }
  close_passed();
  return pid;
}

}  // namespace

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  return search_program(name, path != nullptr ? path : kDefaultPath, "");
}

SubprocessResult run_subprocess(const SubprocessOptions& options) {
  return watch_subprocess(start_child(options, [&] { return spawn_child(options); }), options);
}

pid_t fork_subprocess(const SubprocessOptions& options, const std::function<int()>& body) {
  return start_child(options, [&] { return fork_child(options, body); });
}

SubprocessResult watch_subprocess(pid_t pid, const SubprocessOptions& options) {
  SubprocessResult result;
  result.timeout_s = options.timeout_s;
  result.max_rss_bytes = options.max_rss_bytes;
  result.max_watched_bytes = options.max_watched_bytes;
  try {
    monitor_child(pid, options, Clock::now(), result);
  } catch (...) {
    ::kill(-pid, SIGKILL);  // never leave the group running behind an exception
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) continue;
    throw;
  }
  return result;
}

std::string self_executable() {
  if (const char* env = std::getenv("CUDA_AGENT_BIN"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  CA_CHECK(!ec, "cannot find this program's path (/proc/self/exe): {}", ec.message());
  return p.string();
}

}  // namespace cuda_agent
