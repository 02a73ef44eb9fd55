#include "cuda_agent/sandbox/solution_processes.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/core/syscall_filter.h"

namespace cuda_agent::sandbox {

void SolutionProcesses::start() {
  CA_CHECK(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "prctl(PR_SET_CHILD_SUBREAPER) failed: errno {}", errno);
  install_syscall_filter({.own_process_only = true, .keep_descendants = true});
  self_ = ::getpid();
  started_ = true;
}

SolutionProcesses::Scan SolutionProcesses::scan() const {
  Scan out;
  for (const auto& [pid, s] : children_of(self_)) {
    if (s.state == 'Z' || s.state == 'X') out.zombie_ticks += s.ticks;  // ended, not yet reaped
    else out.alive += fmt::format("{}pid {} ({})", out.alive.empty() ? "" : ", ", pid, s.comm);
  }
  return out;
}

SolutionProcesses::Look SolutionProcesses::look() const {
  Look out;
  if (!started_) return out;
  int on = 0;
  const bool subreaper = ::prctl(PR_GET_CHILD_SUBREAPER, &on) == 0 && on != 0;
  const Scan s = scan();
  out.alive = subreaper ? s.alive : "the candidate process's subreaper flag was switched off";
  const unsigned long long ticks = read_proc_stat("self").child_ticks + s.zombie_ticks;
  out.ended_cpu_seconds = static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return out;
}

std::string SolutionProcesses::alive() const { return look().alive; }

double SolutionProcesses::ended_cpu_seconds() const { return look().ended_cpu_seconds; }

}  // namespace cuda_agent::sandbox
