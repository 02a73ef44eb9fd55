// The one progress reporter for user-facing progress (bench, eval): a bar with the count, the
// rate and the ETA, redrawn in place on a terminal and printed as one line per step otherwise
// (logs, CI). stderr_is_terminal() tells callers which. Thread-safe: workers on several GPUs report through one instance.
#pragma once

#include <chrono>
#include <mutex>
#include <ostream>
#include <string>

namespace cuda_agent {

bool stderr_is_terminal();

class ProgressReporter {
 public:
  // `out` is not owned; `total` steps are expected; `unit` names one step ("eval").
  // interactive: redraw the bar in place (a terminal); else one line per step.
  ProgressReporter(std::ostream& out, size_t total, std::string unit, bool interactive);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // One step finished; `what` describes it ("softmax_rows: pass, reward 3").
  void step(const std::string& what);
  // Formats the status line for `done` of `total` after `elapsed_s` (exposed for tests).
  static std::string status_line(size_t done, size_t total, double elapsed_s, const std::string& unit);

 private:
  std::ostream& out_;
  size_t total_;
  std::string unit_;
  bool tty_;
  size_t done_ = 0;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cuda_agent
