#include "cuda_agent/core/proc_stat.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>

namespace cuda_agent {

// /proc/<pid>/stat: "pid (comm) state ppid ..." (comm may hold spaces and parentheses). One
// read() into a buffer on the stack: the watches read every process's, several times a second.
ProcStat read_proc_stat(const std::string& pid) {
  ProcStat s;
  char buffer[1024];  // the line is under 400 bytes, the command name at most 64
  const int fd = ::open(("/proc/" + pid + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (n <= 0) return s;
  buffer[n] = '\0';
  const char* open = std::strchr(buffer, '(');
  const char* close = std::strrchr(buffer, ')');
  if (open == nullptr || close == nullptr || close < open || close[1] != ' ') return s;
  s.comm.assign(open + 1, close);
  s.state = close[2];
  // After the state: ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
  // cutime cstime priority nice num_threads itrealvalue starttime vsize rss (fields 4 to 24).
  unsigned long long field[25] = {};
  const char* p = close + 3;
  for (int i = 4; i <= 24; ++i) {
    char* end = nullptr;
    field[i] = std::strtoull(p, &end, 10);  // negative fields (priority, nice) wrap; unused
    if (end == p) return s;
    p = end;
  }
  s.ppid = static_cast<pid_t>(field[4]);
  s.pgrp = static_cast<pid_t>(field[5]);
  s.child_ticks = field[16] + field[17];
  s.ticks = field[14] + field[15] + s.child_ticks;
  s.rss_pages = field[24];
  s.ok = true;
  return s;
}

std::vector<std::pair<pid_t, ProcStat>> all_processes() {
  std::vector<std::pair<pid_t, ProcStat>> out;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc"), ::closedir);
  if (!dir) return out;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    ProcStat s = read_proc_stat(name);
    if (s.ok) out.emplace_back(static_cast<pid_t>(std::atol(name.c_str())), std::move(s));
  }
  return out;
}

std::vector<std::pair<pid_t, ProcStat>> children_of(pid_t parent) {
  std::vector<std::pair<pid_t, ProcStat>> out;
  for (auto& [pid, s] : all_processes())
    if (pid != parent && s.ppid == parent) out.emplace_back(pid, std::move(s));
  return out;
}

namespace {

// Every process by pid, from one walk of /proc.
std::unordered_map<pid_t, ProcStat> process_table() {
  std::unordered_map<pid_t, ProcStat> all;
  for (auto& [pid, s] : all_processes()) all.emplace(pid, std::move(s));
  return all;
}

// How many generations below `ancestor` the process whose stat is `s` is (1: a child), by ppid in
// `all`; 0 where `ancestor` is not one of its ancestors.
int depth_below(const std::unordered_map<pid_t, ProcStat>& all, const ProcStat& s, pid_t ancestor) {
  pid_t up = s.ppid;
  int depth = 1;
  for (; depth < 4096 && up > 1 && up != ancestor; ++depth) {
    const auto it = all.find(up);
    up = it == all.end() ? 0 : it->second.ppid;
  }
  return up == ancestor ? depth : 0;
}

// Whether `ancestor` is an ancestor of the process whose stat is `s` (by ppid, in `all`).
bool descends_in(const std::unordered_map<pid_t, ProcStat>& all, const ProcStat& s, pid_t ancestor) {
  return depth_below(all, s, ancestor) > 0;
}

bool live(const ProcStat& s) {
  return s.state != 'Z' && s.state != 'X';
}

}  // namespace

std::vector<pid_t> descendants_of(pid_t ancestor) {
  const std::unordered_map<pid_t, ProcStat> all = process_table();
  std::vector<std::pair<int, pid_t>> by_depth;
  for (const auto& [pid, s] : all)
    if (const int depth = depth_below(all, s, ancestor); depth > 0) by_depth.emplace_back(depth, pid);
  std::sort(by_depth.begin(), by_depth.end());
  std::vector<pid_t> out;
  out.reserve(by_depth.size());
  for (const auto& [depth, pid] : by_depth) out.push_back(pid);
  return out;
}

unsigned long long descendants_rss_bytes(pid_t ancestor) {
  const std::unordered_map<pid_t, ProcStat> all = process_table();
  static const unsigned long long page = static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE));
  unsigned long long total = 0;
  for (const auto& [pid, s] : all)
    if (pid != ancestor && descends_in(all, s, ancestor)) total += s.rss_pages * page;
  return total;
}

uint64_t descendants_gpu_bytes(pid_t ancestor, const std::map<pid_t, uint64_t>& held,
                               const std::vector<pid_t>& exempt) {
  const std::unordered_map<pid_t, ProcStat> all = process_table();
  const auto exempted = [&](pid_t pid) { return std::find(exempt.begin(), exempt.end(), pid) != exempt.end(); };
  uint64_t total = 0;
  for (const auto& [pid, bytes] : held) {
    const auto it = all.find(pid);
    if (pid == ancestor || it == all.end() || !live(it->second) || !descends_in(all, it->second, ancestor)) continue;
    bool below_exempt = exempted(pid);
    for (pid_t up = it->second.ppid; !below_exempt && up > 1 && up != ancestor;) {
      below_exempt = exempted(up);
      const auto parent = all.find(up);
      up = parent == all.end() ? 0 : parent->second.ppid;
    }
    if (!below_exempt) total += bytes;
  }
  return total;
}

bool descendant_named(pid_t ancestor, std::string_view comm) {
  const std::unordered_map<pid_t, ProcStat> all = process_table();
  for (const auto& [pid, s] : all)
    if (pid != ancestor && s.comm == comm && live(s) && descends_in(all, s, ancestor)) return true;
  return false;
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
