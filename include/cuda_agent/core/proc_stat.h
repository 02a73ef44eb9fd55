// What /proc/<pid>/stat says about a process (Linux): the fields the sandbox and the agent's
// confined commands watch their descendants by.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cuda_agent {

struct ProcStat {
  bool ok = false;  // false: the process is gone, or its stat could not be parsed
  std::string comm;
  char state = '?';
  pid_t ppid = 0;
  pid_t pgrp = 0;                      // process group
  unsigned long long ticks = 0;        // utime + stime + cutime + cstime
  unsigned long long child_ticks = 0;  // cutime + cstime
  unsigned long long rss_pages = 0;    // resident set (0 for a zombie)
};

// `pid` is a number or "self". Never throws.
ProcStat read_proc_stat(const std::string& pid);

// Every process, each with its stat, from one walk of /proc in its order (those gone before
// their stat was read left out), zombies included. Never throws.
std::vector<std::pair<pid_t, ProcStat>> all_processes();

// The processes whose parent is `parent` (for a subreaper, the orphans it adopted too), zombies
// included, each with its stat, in /proc's order. Never throws.
std::vector<std::pair<pid_t, ProcStat>> children_of(pid_t parent);

// Whether `ancestor` is `pid`'s parent, or its parent's, and so on up to init (following
// /proc/<pid>/stat's ppid). false for a process that is gone, and for pid == ancestor. Never
// throws.
bool descends_from(pid_t pid, pid_t ancestor);

// The resident memory (in bytes) of every live process that descends from `ancestor` (itself
// left out), from one walk of /proc. Pages two processes share (a fork's, a library's) count in
// each. Never throws.
unsigned long long descendants_rss_bytes(pid_t ancestor);

// Every descendant of `ancestor` (children, theirs, ... by ppid; zombies too), from one walk of
// /proc, parents before their children: a process killed in this order cannot see a child of its
// own die first and go on (a shell's `wait; echo done` after its background job is killed).
std::vector<pid_t> descendants_of(pid_t ancestor);

// The GPU memory `held` (by pid, as gpu_memory_by_process gives it) of the live processes that
// descend from `ancestor` (itself left out), from one walk of /proc; a process of `exempt`, and
// every process below one, left out (an evaluation's judge, which holds the GPU's lock, and its
// candidate). Never throws.
uint64_t descendants_gpu_bytes(pid_t ancestor, const std::map<pid_t, uint64_t>& held, const std::vector<pid_t>& exempt);

// Whether a live process that descends from `ancestor` (itself left out) has the command name
// `comm` (/proc/<pid>/stat's, as prctl(PR_SET_NAME) sets it for a process's main thread), from one
// walk of /proc. Never throws.
bool descendant_named(pid_t ancestor, std::string_view comm);

}  // namespace cuda_agent
