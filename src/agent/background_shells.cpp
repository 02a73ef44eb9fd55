#include "background_shells.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/proc_stat.h"

namespace cuda_agent::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(10);
constexpr auto kTermGrace = std::chrono::seconds(1);
constexpr auto kKillWait = std::chrono::seconds(5);

// Status of a child without reaping it; nullopt-like kRunning when it still runs.
ShellStatus peek(pid_t pid) {
  siginfo_t info{};
  ShellStatus status;
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid) {
    return status;
  }
  if (info.si_code == CLD_EXITED) {
    status.state = ShellStatus::State::kExited;
    status.exit_code = info.si_status;
  } else {
    status.state = ShellStatus::State::kKilled;
    status.signal = info.si_status;
  }
  return status;
}

// Polls until the child has ended (unreaped) or `limit` passes; true when it ended.
bool wait_ended(pid_t pid, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  while (peek(pid).state == ShellStatus::State::kRunning) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

std::string find_bash() {
  for (const char* candidate : {"/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"}) {
    if (::access(candidate, X_OK) == 0) return candidate;
  }
  CA_FAIL("cannot start a background shell: bash not found in /bin, /usr/bin or "
          "/usr/local/bin");
}

}  // namespace

std::string ShellStatus::describe() const {
  switch (state) {
    case State::kRunning: return "running";
    case State::kExited: return fmt::format("exited with code {}", exit_code);
    case State::kKilled: {
      const char* text = ::sigdescr_np(signal);
      return fmt::format("killed by signal {} ({})", signal, text != nullptr ? text : "unknown");
    }
  }
  return "unknown";
}

BackgroundShells::BackgroundShells(std::filesystem::path scratch) : scratch_(std::move(scratch)) {}

BackgroundShells::~BackgroundShells() { stop_all(); }

void BackgroundShells::stop_all() {
  for (auto& shell : shells_) {
    bool was_running = false;
    if (!shell.reaped) (void)end(shell, &was_running);  // one that outlives SIGKILL stays unreaped
  }
}

std::string BackgroundShells::start(const std::vector<std::string>& command, const std::filesystem::path& cwd,
                                    const std::map<std::string, std::string>& env) {
  size_t running = 0;
  for (auto& shell : shells_) running += poll(shell).state == ShellStatus::State::kRunning;
  CA_CHECK(running < kMaxRunning, "{} background shells are already running; stop one with "
           "KillBash first", running);

  Shell shell;
  shell.id = fmt::format("bash_{}", shells_.size() + 1);
  shell.output = scratch_ / (shell.id + ".out");

  int fd = ::open(shell.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int err = errno;
  CA_CHECK(fd >= 0, "cannot create the output file of a background shell '{}': {}",
           shell.output.string(), errno_text(err));
  if (fd < 3) {  // keep the dup2 actions onto 1 and 2 from clobbering it
    const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    ::close(fd);
    fd = high;
    CA_CHECK(fd >= 0, "cannot duplicate a descriptor: {}", errno_text(errno));
  }

  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& text : env_strings) envp.push_back(text.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  CA_CHECK(!args.empty(), "cannot start a background shell: empty command");
  // bash is looked up in the usual places (the shells' PATH may be the workspace's own).
  const std::string program = args[0] == "bash" ? find_bash() : args[0];
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  sigset_t no_signals;
  sigset_t all_signals;
  sigemptyset(&no_signals);
  sigfillset(&all_signals);
  bool built =
      posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0) == 0 &&
      posix_spawn_file_actions_adddup2(&actions, fd, 1) == 0 &&
      posix_spawn_file_actions_adddup2(&actions, fd, 2) == 0 &&
      posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str()) == 0 &&
      posix_spawn_file_actions_addclosefrom_np(&actions, 3) == 0 &&
      posix_spawnattr_setsigmask(&attr, &no_signals) == 0 &&
      posix_spawnattr_setsigdefault(&attr, &all_signals) == 0 &&
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                          POSIX_SPAWN_SETSIGDEF) == 0;
  pid_t pid = -1;
  const int error = built ? ::posix_spawnp(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data())
                          : EINVAL;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fd);
  CA_CHECK(error == 0, "cannot start a background shell ({}): {}", program, errno_text(error));
  shell.pid = pid;
  shells_.push_back(std::move(shell));
  return shells_.back().id;
}

bool BackgroundShells::has(const std::string& id) const {
  for (const auto& shell : shells_) {
    if (shell.id == id) return true;
  }
  return false;
}

BackgroundShells::Shell& BackgroundShells::find(const std::string& id) {
  return const_cast<Shell&>(static_cast<const BackgroundShells*>(this)->find(id));
}

const BackgroundShells::Shell& BackgroundShells::find(const std::string& id) const {
  for (const auto& shell : shells_) {
    if (shell.id == id) return shell;
  }
  std::string known;
  for (const auto& shell : shells_) known += (known.empty() ? "" : ", ") + shell.id;
  CA_FAIL("no background shell '{}'; {}", id,
          known.empty() ? "none was started (Bash with run_in_background starts one)"
                        : "the shells are: " + known);
}

ShellStatus BackgroundShells::poll(Shell& shell) {
  return shell.reaped ? shell.final_status : peek(shell.pid);
}

std::vector<std::pair<std::string, ShellStatus>> BackgroundShells::list() {
  std::vector<std::pair<std::string, ShellStatus>> out;
  for (auto& shell : shells_) out.emplace_back(shell.id, poll(shell));
  return out;
}

ShellStatus BackgroundShells::status(const std::string& id) { return poll(find(id)); }

const std::filesystem::path& BackgroundShells::output_path(const std::string& id) const {
  return find(id).output;
}

uint64_t BackgroundShells::read_offset(const std::string& id) const { return find(id).offset; }

void BackgroundShells::set_read_offset(const std::string& id, uint64_t offset) {
  find(id).offset = offset;
}

bool BackgroundShells::end(Shell& shell, bool* was_running) {
  *was_running = false;
  if (peek(shell.pid).state == ShellStatus::State::kRunning) {
    *was_running = true;
    // SIGTERM first: a confined shell's wrapper (`confined-exec`) then clears the processes
    // that left the group (setsid) before it goes.
    ::kill(-shell.pid, SIGTERM);
    wait_ended(shell.pid, kTermGrace);
  }
  // The leader is unreaped, so its pid still names only this group: clear what is left of
  // it (a grandchild that ignored SIGTERM, or one that outlived a shell that had exited).
  ::kill(-shell.pid, SIGKILL);
  if (!wait_ended(shell.pid, kKillWait)) return false;
  int status = 0;
  while (::waitpid(shell.pid, &status, 0) < 0 && errno == EINTR) continue;
  shell.reaped = true;
  if (WIFEXITED(status)) {
    shell.final_status = {ShellStatus::State::kExited, WEXITSTATUS(status), 0};
  } else {
    shell.final_status = {ShellStatus::State::kKilled, -1, WTERMSIG(status)};
  }
  return true;
}

ShellStatus BackgroundShells::kill(const std::string& id, bool* was_running) {
  Shell& shell = find(id);
  *was_running = false;
  if (shell.reaped) return shell.final_status;
  if (!end(shell, was_running)) {
    CA_FAIL("background shell {} (pid {}) did not die after SIGKILL; try again", id, shell.pid);
  }
  return shell.final_status;
}

std::vector<std::string> BackgroundShells::stop_lock_holders(
    const std::vector<std::pair<std::string, double>>& limits) {
  std::vector<std::string> stopped;
  const auto now = Clock::now();
  std::map<std::pair<pid_t, std::string>, Clock::time_point> still;
  for (const auto& [path, limit] : limits) {
    for (const pid_t holder : lock_holders(path)) {
      const auto key = std::make_pair(holder, path);
      const auto seen = holding_since_.find(key);
      const Clock::time_point since = seen == holding_since_.end() ? now : seen->second;
      still[key] = since;
      const double held = std::chrono::duration<double>(now - since).count();
      if (held <= limit) continue;
      for (Shell& shell : shells_) {
        if (poll(shell).state != ShellStatus::State::kRunning || !descends_from(holder, shell.pid))
          continue;
        bool was_running = false;
        (void)end(shell, &was_running);
        stopped.push_back(
            fmt::format("{}: its process {} held the lock file {} for {:.0f} s, longer than any "
                        "evaluation holds it ({:g} s)",
                        shell.id, holder, path, held, limit));
      }
    }
  }
  holding_since_ = std::move(still);
  return stopped;
}

}  // namespace cuda_agent::agent
