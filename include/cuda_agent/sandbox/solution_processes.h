// The processes a solution starts from the candidate process: work there is out of the
// auditor's sight (CUPTI records only the candidate process), so a forward's result must not
// come from one. The candidate process is the subreaper of everything it starts (an orphan of a
// double fork is reparented to it), and a seccomp filter keeps it so: prctl cannot switch the
// subreaper off, clone cannot make a child of the candidate's parent (CLONE_PARENT), and
// clone3, whose flags a filter cannot read, answers ENOSYS (the C library then uses clone).
// The same filter refuses changing another process's limits or scheduling (its judge's, other
// evaluations'): core/syscall_filter.h.
#pragma once

#include <sys/types.h>

#include <string>

namespace cuda_agent::sandbox {

class SolutionProcesses {
 public:
  // Becomes the subreaper and installs the filter (and no_new_privs, which an unprivileged
  // filter needs): for this process and everything it starts, for good. Call before any code
  // of the solution's runs. Throws Error.
  void start();
  bool started() const { return started_; }
  // The solution's processes alive now (zombies aside), named ("pid 12 (python3), ..."), or
  // that the watch was undone; "" if none.
  std::string alive() const;
  // CPU seconds used so far by the solution's processes that have ended (reaped or not).
  double ended_cpu_seconds() const;
  // Both at once, from one walk of /proc.
  struct Look {
    std::string alive;
    double ended_cpu_seconds = 0;
  };
  Look look() const;

 private:
  struct Scan {
    std::string alive;
    unsigned long long zombie_ticks = 0;
  };
  Scan scan() const;  // this process's children (orphans included)
  bool started_ = false;
  pid_t self_ = 0;
};

}  // namespace cuda_agent::sandbox
