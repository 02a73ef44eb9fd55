// The caller's side of the judge processes (`cuda-agent worker --judge`, run_judge_worker in
// evaluation.h) and the job each one reads. A judge takes one job and exits, so isolation stays
// one process per evaluation; but it can be started before its job exists ("warm": Python and
// torch imported, CUDA untouched), so that an evaluation does not wait for the interpreter, and
// its candidate process is a copy of it made before it reads its key (CandidateClient::Launch).
// Internal to the sandbox library.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent::sandbox {

// A judge's job: file paths, and when the caller sent it (CLOCK_MONOTONIC, nanoseconds).
struct JudgeJob {
  std::string request, result, log;
  int64_t sent_ns = 0;
  std::string line() const;  // one line of JSON, with its newline
};

// Judges started alike serve one another's jobs.
struct JudgeKind {
  std::string executable;
  int gpu = -1;               // its CUDA_VISIBLE_DEVICES; -1: none (device cpu)
  bool quiet_start = false;   // holds the GPU's quiet lock shared while its Python starts
  int64_t max_rss_bytes = 0;  // the resident-memory limit of its process group
  std::string environment;    // a digest of the environment it was started with
  auto operator<=>(const JudgeKind&) const = default;
};

// A digest of this process's environment (a judge started under another one is stale).
std::string environment_digest();

// One judge process, started at construction; a thread watches it.
class JudgeProcess {
 public:
  explicit JudgeProcess(const JudgeKind& kind);
  // Stops it if it still runs (a warm judge nobody took) and waits for it.
  ~JudgeProcess();
  JudgeProcess(const JudgeProcess&) = delete;
  JudgeProcess& operator=(const JudgeProcess&) = delete;

  const JudgeKind& kind() const { return kind_; }
  bool running() const { return !done_; }
  // Hands it the job and the result key, and starts its clock (timeout_s). False when it has
  // ended or cannot be reached (then wait() and start_error() say why).
  bool give(const JudgeJob& job, const std::string& key, double timeout_s);
  // Waits for it to end and reports how it ended.
  SubprocessResult wait();
  // Why it could not be started; "" when it was.
  std::string start_error() const;

 private:
  JudgeKind kind_;
  UniqueFd job_fd_;
  std::atomic<double> deferred_timeout_s_{-1};
  std::atomic<bool> cancel_{false};
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::string start_error_;
  SubprocessResult result_;
  std::thread monitor_;
};

// This process's judges started ahead of their jobs.
class JudgePool {
 public:
  static JudgePool& instance();
  // A judge of `kind`: one started earlier when there is one, else a new one. From the second
  // time a kind is asked for, `warm` judges of it are kept started for the next calls (0: none).
  // Judges started under another environment are dropped.
  std::unique_ptr<JudgeProcess> take(const JudgeKind& kind, int warm);
  // Stops the judges still waiting.
  ~JudgePool();

 private:
  JudgePool() = default;
  std::mutex mutex_;
  std::map<JudgeKind, std::deque<std::unique_ptr<JudgeProcess>>> ready_;
  std::map<JudgeKind, int> asked_;
};

// The time now on CLOCK_MONOTONIC, in nanoseconds (the same clock in every process).
int64_t monotonic_ns();
// One line read from `fd` a byte at a time (nothing after its newline is consumed), without the
// newline; "" at end of file. Throws Error when the read fails.
std::string read_line(int fd);
// Sends this process's stdout and stderr to `path` (created or truncated). Throws Error.
void redirect_output(const std::string& path);

}  // namespace cuda_agent::sandbox
