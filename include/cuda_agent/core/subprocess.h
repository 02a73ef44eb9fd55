// Running a child program under a wall-clock limit and a resident-memory limit.
//
// The child runs in its own session and process group (setsid), so that the whole group,
// grandchildren included, can be stopped together: on a timeout or a memory excess the group
// gets SIGTERM, then SIGKILL after kill_grace_s. When the child exits on its own, whatever is
// left in its group (a background grandchild, say) is sent SIGKILL at once, and the call waits
// for it to die: nothing started by the call outlives it. A process that moves itself into
// another process group or session (setsid, setpgid) escapes this, as it escapes a shell's
// job control.
//
// Linux only: memory is measured by scanning /proc.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cuda_agent {

struct SubprocessOptions {
  // argv[0] is a path (it contains a '/'; relative paths are taken from `cwd` when that is
  // set) or a name looked up on PATH: the child's PATH (after env_set / env_unset), else the
  // parent's PATH, else "/usr/local/bin:/usr/bin:/bin". Must not be empty.
  std::vector<std::string> argv;
  // Added to / overriding the parent's environment.
  std::map<std::string, std::string> env_set;
  // Removed from the child's environment (applied before env_set).
  std::vector<std::string> env_unset;
  // Working directory of the child; empty: inherit. Must exist.
  std::string cwd;
  // File that receives the child's stdout (created or truncated, mode 0666 & ~umask; its
  // directory must exist; a relative path is taken from the parent's cwd); empty: /dev/null.
  std::string stdout_path;
  // Same for stderr. May name the same file as stdout_path: then both streams share one open
  // file description and go to the file in the order they were written.
  std::string stderr_path;
  // Wall-clock limit in seconds; 0 = none.
  double timeout_s = 0;
  // Limit on the summed resident memory of every process in the child's group; 0 = none.
  // Checked about every 100 ms, so a fast allocation may overshoot before it is caught.
  int64_t max_rss_bytes = 0;
  // Whether the group's memory is sampled (every 100 ms, a walk of /proc) for result.peak_rss_bytes
  // when there is no max_rss_bytes to enforce. A caller that reads neither (the agent's Bash, whose
  // confinement watches the command's memory itself) saves the walks: dozens of commands at once
  // each made ten a second. Without sampling, peak_rss_bytes is the child's own peak.
  bool sample_rss = true;
  // Folders whose files (their allocated blocks, disk_usage()) may grow by at most
  // max_watched_bytes together from what they held when the child started: past it the group
  // is stopped (result.disk_exceeded). Checked about every 500 ms. 0 or none: no limit.
  std::vector<std::string> watched_paths;
  uint64_t max_watched_bytes = 0;
  // After SIGTERM, wait this long for the group to go, then SIGKILL it.
  double kill_grace_s = 2.0;
  // A descriptor of the parent's that the child gets as its descriptor 3 (a pipe's write end
  // for a report, say); -1: none. The caller keeps owning it (close it after the call).
  int pass_fd = -1;
  // Close pass_fd once the child has it (the call takes it over): the caller's end of a socket
  // then sees the child's exit as end-of-file.
  bool close_pass_fd = false;
  // When set, the caller can stop the child from another thread: once *cancel is true the
  // group gets SIGTERM, then SIGKILL after kill_grace_s, as on a timeout (result.cancelled).
  const std::atomic<bool>* cancel = nullptr;
  // A child started before it has work (a pre-started worker): while *deferred_timeout_s is
  // negative nothing is timed; once the caller sets it (from another thread, when it hands the
  // child its work) the wall clock starts, with that value as timeout_s (0: none). The memory
  // limit applies from the start. nullptr: timeout_s from the start.
  const std::atomic<double>* deferred_timeout_s = nullptr;
  // When set, asked about every second with the child's pid while its clock runs: while it says
  // true, the child waits on something that is not its own doing (a GPU's lock that other
  // processes hold, say), and that time does not count against timeout_s, up to max_paused_s in
  // all (past it the clock runs again). Each true answer counts the time since the last question.
  std::function<bool(pid_t child)> clock_paused;
  double max_paused_s = 0;
};

struct SubprocessResult {
  int exit_code = -1;          // valid when the child exited normally (term_signal == 0)
  int term_signal = 0;         // signal that ended the child, 0 if it exited
  bool timed_out = false;      // we stopped it: timeout_s passed
  bool memory_exceeded = false;  // we stopped it: the group went over max_rss_bytes
  bool disk_exceeded = false;    // we stopped it: the watched folders grew past max_watched_bytes
  bool cancelled = false;        // we stopped it: the caller set *options.cancel
  double wall_s = 0;           // from start to the child's exit
  double paused_s = 0;         // of wall_s, what did not count against timeout_s (clock_paused)
  // Peak observed sum of RSS over the process group (sampled about every 100 ms; pages
  // shared between processes count once per process), raised to the child's own peak as the
  // kernel reports it at exit when that is larger.
  int64_t peak_rss_bytes = 0;
  // The limits the child ran under, copied from the options (used by describe()).
  double timeout_s = 0;
  int64_t max_rss_bytes = 0;
  uint64_t max_watched_bytes = 0;

  // True when the child exited with code 0 and was not stopped (timeout, memory, disk, cancel).
  bool ok() const;
  // Human text: "exited with code 3", "killed by signal 11 (Segmentation fault)",
  // "timed out after 5.0 s" (with " (not counting 3.0 s of waiting)" when the clock paused), "exceeded memory limit 1.0
  // GiB (peak 1.3 GiB)", "wrote more than 8.0 GiB into its folders", "stopped by the caller".
  std::string describe() const;
};

// Runs the child to completion and reports how it ended. The child's stdin is /dev/null;
// it inherits no file descriptors above 2 (3 when pass_fd is set) and starts with default
// signal dispositions and an empty signal mask.
//
// Throws Error when the options are unusable (empty argv, negative limits, a missing cwd, an
// output file that cannot be opened) or the program cannot be started; the message names the
// program and gives the system's reason, e.g. "cannot start 'foo': No such file or directory".
//
// Thread-safe: several threads may run children at once. Uses no global state (no SIGCHLD
// handler; it waits for its own child's pid only), but other code in the process must not
// reap children it did not start (waitpid(-1, ...)). It reads the parent's environment, so
// it must not race with setenv/unsetenv in other threads. Blocks the calling thread.
SubprocessResult run_subprocess(const SubprocessOptions& options);

// The program a child started as `name` runs: `name` itself when it holds a '/', else the first
// executable file of that name in this process's PATH (as run_subprocess looks it up); "" when
// there is none. Reads the environment: must not race with setenv/unsetenv in other threads.
std::string find_program(const std::string& name);

// run_subprocess in two steps, for a child that runs `body` in a copy of this process (fork,
// no exec): the child gets run_subprocess's set-up (its own session, stdin from /dev/null,
// stdout and stderr to the files, pass_fd as descriptor 3 and no other descriptor above 2,
// default signal dispositions, an empty mask, cwd, env_unset and env_set applied), then runs
// body and exits with what it returns (1 when it throws). argv[0] names the child in messages;
// the rest of argv is unused. Only the calling thread exists in the child: call it from the
// thread whose state body needs, with no other thread holding a lock body takes. Throws Error
// when the options are unusable or fork fails.
pid_t fork_subprocess(const SubprocessOptions& options, const std::function<int()>& body);

// Watches a child of fork_subprocess until it ends, under options' limits (counted from this
// call), then clears its group and reaps it, as run_subprocess does. Blocks the calling thread.
SubprocessResult watch_subprocess(pid_t pid, const SubprocessOptions& options);

// This program's own path, for starting workers of the same binary: $CUDA_AGENT_BIN when set
// (tests point it at the built cuda-agent), else /proc/self/exe. Throws Error if neither works.
std::string self_executable();

}  // namespace cuda_agent
