// Background shells for Bash(run_in_background): `bash -c COMMAND` in its own session and
// process group, stdin /dev/null, stdout and stderr into one file in a scratch directory the
// registry owns (outside the workspace), read incrementally by BashOutput.
//
// A shell that has exited is left unreaped (a zombie) until kill() or the destructor, so that
// its process-group id cannot be reused while we may still signal the group. Not
// thread-safe. Uses waitid/waitpid on its own children only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cuda_agent::agent {

struct ShellStatus {
  enum class State { kRunning, kExited, kKilled };
  State state = State::kRunning;
  int exit_code = -1;  // kExited
  int signal = 0;      // kKilled: the signal that ended the shell
  // "running", "exited with code 0", "killed by signal 15 (Terminated)".
  std::string describe() const;
};

class BackgroundShells {
 public:
  static constexpr size_t kMaxRunning = 16;

  explicit BackgroundShells(std::filesystem::path scratch);
  ~BackgroundShells();  // stop_all()
  // Ends every shell still running (SIGTERM to its group, SIGKILL after a second) and reaps it:
  // before an episode is scored, nothing the policy started may still run.
  void stop_all();
  BackgroundShells(const BackgroundShells&) = delete;
  BackgroundShells& operator=(const BackgroundShells&) = delete;

  // Starts argv (bash -c COMMAND, or that under bwrap: tool_support.h's shell_argv), found on
  // PATH; returns its id ("bash_1", "bash_2", ...). `env` is the complete environment. Throws
  // Error when kMaxRunning shells are running or the program cannot start.
  std::string start(const std::vector<std::string>& argv, const std::filesystem::path& cwd,
                    const std::map<std::string, std::string>& env);

  bool has(const std::string& id) const;
  // Ids of all shells, in start order, with their status.
  std::vector<std::pair<std::string, ShellStatus>> list();
  // These throw Error for an unknown id.
  ShellStatus status(const std::string& id);
  const std::filesystem::path& output_path(const std::string& id) const;
  uint64_t read_offset(const std::string& id) const;
  void set_read_offset(const std::string& id, uint64_t offset);
  // Stops the shell's whole group (SIGTERM, SIGKILL after 1 s) and reaps it; for a shell that
  // already ended, kills what is left of its group. Returns the final status; `was_running`
  // tells whether it was still running.
  ShellStatus kill(const std::string& id, bool* was_running);
  // Stops every running shell one of whose processes has held a lock file of `limits` (path, most
  // seconds) for longer than its limit, counted from the first call that saw that process hold
  // it; returns what it stopped, one line each ("bash_2: held ... for 700 s").
  std::vector<std::string> stop_lock_holders(const std::vector<std::pair<std::string, double>>& limits);

 private:
  struct Shell {
    std::string id;
    pid_t pid = -1;
    std::filesystem::path output;
    uint64_t offset = 0;
    bool reaped = false;
    ShellStatus final_status;  // once reaped
  };
  Shell& find(const std::string& id);
  const Shell& find(const std::string& id) const;
  ShellStatus poll(Shell& shell);
  // SIGTERM to the group of a running shell, SIGKILL to what is left, then reaps the shell and
  // records how it ended; false when it outlived SIGKILL (left unreaped).
  bool end(Shell& shell, bool* was_running);

  std::filesystem::path scratch_;
  std::vector<Shell> shells_;
  // When a process was first seen holding a lock file (stop_lock_holders), by (pid, path).
  std::map<std::pair<pid_t, std::string>, std::chrono::steady_clock::time_point> holding_since_;
};

}  // namespace cuda_agent::agent
