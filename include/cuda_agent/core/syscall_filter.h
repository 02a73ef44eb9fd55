// Seccomp filters that keep untrusted code's hands on its own processes: the solution's
// candidate process and the agent's confined commands, and everything they start.
//
// Signals are scoped by Landlock and ptrace is refused across its domains, but the kernel lets a
// process change another process of the same user by other means: its resource limits
// (`prlimit`: an RLIMIT_CPU of one second ends it with SIGKILL, which no signal scope sees), its
// priority and scheduling (`setpriority`, `sched_setscheduler` to SCHED_IDLE,
// `sched_setaffinity`), its I/O priority. Those calls naming any process but the caller fail
// with EPERM under the filter.
#pragma once

namespace cuda_agent {

struct SyscallFilter {
  // prlimit64 with a pid and a new limit (a pid's limits may still be read), setpriority
  // (anything but PRIO_PROCESS of the caller), sched_setaffinity, sched_setscheduler,
  // sched_setparam and sched_setattr with a pid, ioprio_set of anything but the caller.
  // Threads are named by pid too: a thread's own affinity or priority is set through pid 0.
  bool own_process_only = true;
  // The process stays the subreaper of whatever it starts: PR_SET_CHILD_SUBREAPER fails (EPERM),
  // clone cannot make a child of the caller's parent (CLONE_PARENT, EPERM), and clone3, whose
  // flags a filter cannot read, answers ENOSYS (the C library then uses clone).
  bool keep_descendants = false;
};

// Installs `filter` (and no_new_privs, which an unprivileged filter needs) for this process and
// everything it starts, for good. Another ABI's system calls (i386 or x32 on x86_64) answer
// ENOSYS. Throws Error where seccomp cannot be used.
void install_syscall_filter(const SyscallFilter& filter);

}  // namespace cuda_agent
