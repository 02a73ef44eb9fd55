#include "judge_pool.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/hash.h"

extern char** environ;

namespace cuda_agent::sandbox {

std::string JudgeJob::line() const {
  return nlohmann::json{{"request", request}, {"result", result}, {"log", log}, {"sent_ns", sent_ns}}.dump() + "\n";
}

std::string environment_digest() {
  std::vector<std::string> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) entries.emplace_back(*e);
  std::sort(entries.begin(), entries.end());
  std::string all;
  for (const std::string& e : entries) all.append(e).push_back('\0');
  return sha256_hex(all);
}

JudgeProcess::JudgeProcess(const JudgeKind& kind) : kind_(kind) {
  int fds[2];
  CA_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "cannot make the judge's job socket: {}",
           errno_text(errno));
  job_fd_ = UniqueFd(fds[0]);
  SubprocessOptions sp;
  sp.argv = {kind.executable, "worker", "--judge"};
  if (kind.quiet_start && kind.gpu >= 0) {
    sp.argv.push_back("--quiet-gpu");
    sp.argv.push_back(std::to_string(kind.gpu));
  }
  sp.env_set["CUDA_VISIBLE_DEVICES"] = kind.gpu >= 0 ? std::to_string(kind.gpu) : "";
  sp.env_set["PYTHONUNBUFFERED"] = "1";
  sp.env_set["PYTHONDONTWRITEBYTECODE"] = "1";
  sp.max_rss_bytes = kind.max_rss_bytes;
  sp.deferred_timeout_s = &deferred_timeout_s_;
  sp.cancel = &cancel_;
  sp.pass_fd = fds[1];
  sp.close_pass_fd = true;
  // Started from the thread that watches it: the judge's parent-death signal follows the thread
  // that started it, and this one lives exactly as long as the judge.
  monitor_ = std::thread([this, sp] {
    try {
      result_ = run_subprocess(sp);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      start_error_ = e.what();
      result_ = SubprocessResult{};
      result_.exit_code = 127;
    }
    done_ = true;
  });
}

JudgeProcess::~JudgeProcess() {
  if (!done_) cancel_ = true;
  if (monitor_.joinable()) monitor_.join();
}

bool JudgeProcess::give(const JudgeJob& job, const std::string& key, double timeout_s) {
  if (done_ || job_fd_.get() < 0) return false;
  deferred_timeout_s_ = std::max(timeout_s, 0.0);
  const std::string message = job.line() + key + "\n";
  size_t sent = 0;
  while (sent < message.size()) {
    const ssize_t n = ::send(job_fd_.get(), message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

SubprocessResult JudgeProcess::wait() {
  if (monitor_.joinable()) monitor_.join();
  return result_;
}

std::string JudgeProcess::start_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return start_error_;
}

JudgePool& JudgePool::instance() {
  static JudgePool pool;
  return pool;
}

std::unique_ptr<JudgeProcess> JudgePool::take(const JudgeKind& kind, int warm) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = ready_.begin(); it != ready_.end();) {
    if (it->first.environment != kind.environment) it = ready_.erase(it);  // stopped as they go
    else ++it;
  }
  std::deque<std::unique_ptr<JudgeProcess>>& ready = ready_[kind];
  std::unique_ptr<JudgeProcess> taken;
  while (!ready.empty() && !taken) {
    std::unique_ptr<JudgeProcess> front = std::move(ready.front());
    ready.pop_front();
    if (front->running()) taken = std::move(front);
  }
  if (warm > 0 && ++asked_[kind] >= 2) {
    while (static_cast<int>(ready.size()) < warm) ready.push_back(std::make_unique<JudgeProcess>(kind));
  }
  return taken ? std::move(taken) : std::make_unique<JudgeProcess>(kind);
}

JudgePool::~JudgePool() {
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.clear();
}

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

std::string read_line(int fd) {
  std::string line;
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    CA_CHECK(n >= 0, "cannot read descriptor {}: {}", fd, errno_text(errno));
    if (n == 0 || c == '\n') return line;
    line.push_back(c);
  }
}

void redirect_output(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  CA_CHECK(fd >= 0, "cannot open the log {}: {}", path, errno_text(errno));
  const bool moved = ::dup2(fd, 1) == 1 && ::dup2(fd, 2) == 2;
  const int err = errno;
  ::close(fd);
  CA_CHECK(moved, "cannot send the output to {}: {}", path, errno_text(err));
}

}  // namespace cuda_agent::sandbox
