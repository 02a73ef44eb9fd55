#include "cuda_agent/core/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/hash.h"

namespace cuda_agent {
namespace {

constexpr int kTempNameAttempts = 100;

// Closes a descriptor on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// A random suffix for temporary names; unique enough across threads and processes when
// combined with O_EXCL and a retry.
std::string random_suffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 engine = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), static_cast<unsigned>(::getpid()),
                       static_cast<unsigned>(
                           std::chrono::steady_clock::now().time_since_epoch().count())};
    return std::mt19937_64(seed);
  }();
  return fmt::format("{:016x}{:04x}", engine(), counter.fetch_add(1) & 0xffff);
}

// Writes all of `content` to `fd`; returns 0 or the errno of the failure.
int write_all(int fd, std::string_view content) {
  const char* data = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t written = ::write(fd, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
  return 0;
}

const char* non_empty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace

std::string read_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int err = errno;
  CA_CHECK(fd >= 0, "cannot read '{}': {}", path.string(), errno_text(err));
  FdCloser closer(fd);
  std::string content;
  struct stat st{};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    content.reserve(static_cast<size_t>(st.st_size));
  }
  std::vector<char> chunk(64 * 1024);
  while (true) {
    ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    err = errno;
    CA_CHECK(got >= 0, "cannot read '{}': {}", path.string(), errno_text(err));
    if (got == 0) break;
    content.append(chunk.data(), static_cast<size_t>(got));
  }
  return content;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  CA_CHECK(!path.empty() && path.has_filename(),
           "cannot write '{}': the path must name a file, not a directory", path.string());
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CA_CHECK(!ec, "cannot write '{}': cannot create its directory '{}': {}", path.string(),
           dir.string(), ec.message());

  std::filesystem::path temp;
  int fd = -1;
  int err = 0;
  for (int attempt = 0; attempt < kTempNameAttempts && fd < 0; ++attempt) {
    temp = dir / fmt::format(".{}.tmp-{}", path.filename().string(), random_suffix());
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    err = errno;
    if (fd < 0 && err != EEXIST) break;
  }
  CA_CHECK(fd >= 0, "cannot write '{}': cannot create a temporary file in '{}': {}",
           path.string(), dir.string(), errno_text(err));

  err = write_all(fd, content);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    CA_FAIL("cannot write '{}': {}", path.string(), errno_text(err));
  }
  // Make the rename itself durable; failure here loses no data already visible to readers.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

std::string tail_text(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return "...\n" + std::string(text.substr(text.size() - max_bytes));
}

TempDir::TempDir(const std::string& prefix, const std::filesystem::path& base) {
  CA_CHECK(prefix.find('/') == std::string::npos,
           "TempDir prefix '{}' contains '/'; give a plain name and pass the parent as base",
           prefix);
  std::filesystem::path parent = base;
  if (parent.empty()) {
    std::error_code ec;
    parent = std::filesystem::temp_directory_path(ec);
    CA_CHECK(!ec, "cannot find the temporary directory: {}; set TMPDIR to an existing directory",
             ec.message());
  }
  std::string pattern = (parent / (prefix + "XXXXXX")).string();
  const char* made = ::mkdtemp(pattern.data());
  int err = errno;
  CA_CHECK(made != nullptr, "cannot create a temporary directory '{}': {}", pattern,
           errno_text(err));
  path_ = pattern;
}

TempDir::TempDir(TempDir&& other) noexcept
    : path_(std::exchange(other.path_, {})), keep_(other.keep_) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::exchange(other.path_, {});
    keep_ = other.keep_;
  }
  return *this;
}

TempDir::~TempDir() { remove(); }

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
}  // namespace

void TempDir::remove() noexcept {
  if (path_.empty() || keep_) return;
  // nftw rather than std::filesystem::remove_all: a process that has libtorch loaded can see
  // libtorch's own (incompatible) copy of that libstdc++ function.
  ::nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  path_.clear();
}

std::filesystem::path default_cache_dir() {
  if (const char* explicit_dir = non_empty_env("CUDA_AGENT_CACHE_DIR")) {
    return std::filesystem::path(explicit_dir);
  }
  if (const char* xdg = non_empty_env("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::filesystem::path(xdg) / "cuda-agent";
  }
  const char* home = non_empty_env("HOME");
  CA_CHECK(home != nullptr,
           "cannot locate the cache directory: CUDA_AGENT_CACHE_DIR, XDG_CACHE_HOME and HOME "
           "are all unset; set CUDA_AGENT_CACHE_DIR");
  return std::filesystem::path(home) / ".cache" / "cuda-agent";
}

std::string file_sha256(const std::filesystem::path& path) noexcept {
  try {
    return sha256_hex(read_file(path));
  } catch (...) {
    return "";
  }
}

namespace {

// A blocked flock in a thread of its own (lock_file), and who owns the descriptor: the waiting
// call while it waits, the thread once the call has given up (it closes the descriptor, which
// lets the lock go, as soon as the flock returns).
struct LockWait {
  std::mutex mutex;
  std::condition_variable done_cv;
  int fd = -1;
  bool done = false, abandoned = false;
  int error = 0;
};

}  // namespace

int lock_file(const std::filesystem::path& path, bool exclusive, double max_wait_s,
              const std::function<void()>& check) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  // An existing file seen read-only (the agent's confined shell sees the GPU's lock files so, so
  // that it cannot write in them): flock needs no more than a read-only descriptor.
  if (fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CA_CHECK(fd >= 0, "cannot open the lock file {}: {}", path.string(), std::generic_category().message(errno));
  const int how = exclusive ? LOCK_EX : LOCK_SH;
  auto fail = [&](int err) {
    ::close(fd);
    CA_FAIL("cannot lock {}: {}", path.string(), std::generic_category().message(err));
  };
  int rc;
  while ((rc = ::flock(fd, how | LOCK_NB)) != 0 && errno == EINTR) continue;
  if (rc == 0) return fd;
  if (errno != EWOULDBLOCK) fail(errno);
  if (max_wait_s == 0) {
    ::close(fd);
    return -1;
  }
  if (max_wait_s < 0 && !check) {
    while ((rc = ::flock(fd, how)) != 0 && errno == EINTR) continue;
    if (rc != 0) fail(errno);
    return fd;
  }
  // Blocked in the kernel's queue, from a thread that this call can leave behind: a flock cannot
  // be interrupted from another thread without a signal handler of the process's.
  auto wait = std::make_shared<LockWait>();
  wait->fd = fd;
  std::thread([wait, how] {
    int r;
    while ((r = ::flock(wait->fd, how)) != 0 && errno == EINTR) continue;
    const int err = r == 0 ? 0 : errno;
    std::lock_guard<std::mutex> lock(wait->mutex);
    if (wait->abandoned) {
      ::close(wait->fd);
      return;
    }
    wait->done = true;
    wait->error = err;
    wait->done_cv.notify_all();
  }).detach();
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(std::max(max_wait_s, 0.0)));
  const auto give_up_or_abandon = [&](std::unique_lock<std::mutex>& lock) {
    if (wait->done) {
      ::close(fd);  // the lock came meanwhile: let it go here
    } else {
      wait->abandoned = true;
    }
    lock.unlock();
  };
  std::unique_lock<std::mutex> lock(wait->mutex);
  for (;;) {
    auto until = Clock::now() + std::chrono::seconds(1);
    if (max_wait_s >= 0) until = std::min(until, give_up);
    wait->done_cv.wait_until(lock, until, [&] { return wait->done; });
    if (wait->done) {
      if (wait->error != 0) {
        lock.unlock();
        fail(wait->error);
      }
      return fd;
    }
    if (max_wait_s >= 0 && Clock::now() >= give_up) {
      give_up_or_abandon(lock);
      return -1;
    }
    if (check) {
      lock.unlock();
      try {
        check();
      } catch (...) {
        lock.lock();
        give_up_or_abandon(lock);
        throw;
      }
      lock.lock();
    }
  }
}

std::vector<pid_t> lock_holders(const std::filesystem::path& path) {
  std::vector<pid_t> holders;
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return holders;
  // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:10953224 0 EOF"; a waiter's line has "->" after the
  // number. The device is major:minor in hex, the inode in decimal.
  char file_id[64];
  std::snprintf(file_id, sizeof file_id, "%02x:%02x:%llu", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string number, kind, advisory, mode, pid, id;
    if (!(fields >> number >> kind) || kind != "FLOCK") continue;  // a waiter's "->" too
    if (!(fields >> advisory >> mode >> pid >> id) || id != file_id) continue;
    char* end = nullptr;
    const long value = std::strtol(pid.c_str(), &end, 10);
    if (end && *end == '\0' && value > 0) holders.push_back(static_cast<pid_t>(value));
  }
  return holders;
}

}  // namespace cuda_agent
