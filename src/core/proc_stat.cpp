#include "cuda_agent/core/proc_stat.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

namespace cuda_agent {

// /proc/<pid>/stat: "pid (comm) state ppid ..." (comm may hold spaces and parentheses).
ProcStat read_proc_stat(const std::string& pid) {
  ProcStat s;
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return s;
  const size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return s;
  s.comm = line.substr(open + 1, close - open - 1);
  std::istringstream rest(line.substr(close + 1));
  std::string field[15];
  for (auto& f : field) rest >> f;  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
  if (!rest) return s;
  s.state = field[0].empty() ? '?' : field[0][0];
  s.ppid = static_cast<pid_t>(std::atol(field[1].c_str()));
  const auto n = [&](int i) { return std::strtoull(field[i].c_str(), nullptr, 10); };
  s.child_ticks = n(13) + n(14);
  s.ticks = n(11) + n(12) + s.child_ticks;
  s.ok = true;
  return s;
}

std::vector<std::pair<pid_t, ProcStat>> children_of(pid_t parent) {
  std::vector<std::pair<pid_t, ProcStat>> out;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc"), ::closedir);
  if (!dir) return out;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    if (pid == parent) continue;
    ProcStat s = read_proc_stat(name);
    if (s.ok && s.ppid == parent) out.emplace_back(pid, std::move(s));
  }
  return out;
}

bool descends_from(pid_t pid, pid_t ancestor) {
  if (pid <= 0 || pid == ancestor) return false;
  for (int depth = 0; depth < 4096 && pid > 1; ++depth) {
    const ProcStat s = read_proc_stat(std::to_string(pid));
    if (!s.ok) return false;
    if (s.ppid == ancestor) return true;
    pid = s.ppid;
  }
  return false;
}

}  // namespace cuda_agent
