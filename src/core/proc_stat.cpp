#include "cuda_agent/core/proc_stat.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <unordered_map>

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
  // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
  // priority nice num_threads itrealvalue starttime vsize rss
  std::string field[22];
  for (auto& f : field) rest >> f;
  if (!rest) return s;
  s.state = field[0].empty() ? '?' : field[0][0];
  s.ppid = static_cast<pid_t>(std::atol(field[1].c_str()));
  const auto n = [&](int i) { return std::strtoull(field[i].c_str(), nullptr, 10); };
  s.child_ticks = n(13) + n(14);
  s.ticks = n(11) + n(12) + s.child_ticks;
  s.rss_pages = n(21);
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

unsigned long long descendants_rss_bytes(pid_t ancestor) {
  std::unordered_map<pid_t, ProcStat> all;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc"), ::closedir);
  if (!dir) return 0;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    ProcStat s = read_proc_stat(name);
    if (s.ok) all.emplace(static_cast<pid_t>(std::atol(name.c_str())), std::move(s));
  }
  static const unsigned long long page = static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE));
  unsigned long long total = 0;
  for (const auto& [pid, s] : all) {
    pid_t up = s.ppid;
    for (int depth = 0; depth < 4096 && up > 1 && up != ancestor; ++depth) {
      const auto it = all.find(up);
      up = it == all.end() ? 0 : it->second.ppid;
    }
    if (pid != ancestor && up == ancestor) total += s.rss_pages * page;
  }
  return total;
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
