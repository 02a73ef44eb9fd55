#include "cuda_agent/core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/proc_stat.h"

namespace cuda_agent {
namespace {

namespace fs = std::filesystem;

// Sets or unsets an environment variable for the scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Forks a child that runs `in_child`, reports its value back and then waits to be killed; the
// child's pid and that value (-1 when none came).
std::pair<pid_t, pid_t> fork_waiting_child(const std::function<pid_t()>& in_child) {
  int ready[2];
  if (::pipe(ready) != 0) return {-1, -1};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    const pid_t value = in_child();
    (void)!::write(ready[1], &value, sizeof value);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  pid_t value = -1;
  if (child < 0 || ::read(ready[0], &value, sizeof value) != static_cast<ssize_t>(sizeof value)) value = -1;
  ::close(ready[0]);
  return {child, value};
}

TEST(Files, AtomicWriteThenReadBack) {
  TempDir dir;
  const fs::path file = dir.path() / "out.txt";
  std::string content = "hello\n";
  content.push_back('\0');
  content += "binary tail";
  write_file_atomic(file, content);
  EXPECT_EQ(read_file(file), content);

  write_file_atomic(file, "replaced");
  EXPECT_EQ(read_file(file), "replaced");
  // Only the target is left: no temporary files.
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Files, AtomicWriteCreatesParentDirectories) {
  TempDir dir;
  const fs::path file = dir.path() / "a" / "b" / "c" / "data.bin";
  write_file_atomic(file, "x");
  EXPECT_EQ(read_file(file), "x");
}

TEST(Files, AtomicWriteEmptyContentAndLargeContent) {
  TempDir dir;
  write_file_atomic(dir.path() / "empty", "");
  EXPECT_EQ(read_file(dir.path() / "empty"), "");
  const std::string big(3 * 1024 * 1024 + 17, 'z');
  write_file_atomic(dir.path() / "big", big);
  EXPECT_EQ(read_file(dir.path() / "big"), big);
}

TEST(Files, AtomicWriteIntoAFileAsDirectoryFails) {
  TempDir dir;
  write_file_atomic(dir.path() / "plain", "x");
  try {
    write_file_atomic(dir.path() / "plain" / "child", "y");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plain"), std::string::npos) << e.what();
  }
}

TEST(Files, ReadMissingFileNamesThePath) {
  TempDir dir;
  const fs::path missing = dir.path() / "does-not-exist.txt";
  try {
    read_file(missing);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(missing.string()), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
}

TEST(Files, ReadDirectoryFails) {
  TempDir dir;
  try {
    read_file(dir.path());
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
  }
}

TEST(Files, TempDirIsRemovedWithItsContents) {
  fs::path where;
  {
    TempDir dir("test-prefix-");
    where = dir.path();
    EXPECT_TRUE(fs::is_directory(where));
    EXPECT_EQ(where.filename().string().rfind("test-prefix-", 0), 0u) << where;
    write_file_atomic(where / "sub" / "file", "data");
  }
  EXPECT_FALSE(fs::exists(where));
}

TEST(Files, TempDirKeep) {
  TempDir base;
  fs::path where;
  {
    TempDir dir("kept-", base.path());
    where = dir.path();
    EXPECT_EQ(where.parent_path(), base.path());
    dir.keep();
  }
  EXPECT_TRUE(fs::is_directory(where));
}

TEST(Files, TempDirMoveTransfersOwnership) {
  fs::path where;
  {
    TempDir first;
    where = first.path();
    TempDir second(std::move(first));
    EXPECT_TRUE(first.path().empty());
    EXPECT_EQ(second.path(), where);
    TempDir third;
    const fs::path third_old = third.path();
    third = std::move(second);
    EXPECT_FALSE(fs::exists(third_old));  // the overwritten directory was removed
    EXPECT_TRUE(fs::is_directory(where));
  }
  EXPECT_FALSE(fs::exists(where));
}

TEST(Files, TempDirsAreUnique) {
  TempDir a;
  TempDir b;
  EXPECT_NE(a.path(), b.path());
}

TEST(Files, TempDirRejectsSlashInPrefix) { EXPECT_THROW(TempDir("a/b"), Error); }

TEST(Files, DefaultCacheDirPrecedence) {
  {
    ScopedEnv cache("CUDA_AGENT_CACHE_DIR", "/explicit/cache");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), fs::path("/explicit/cache"));
  }
  {
    ScopedEnv cache("CUDA_AGENT_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), fs::path("/xdg/cuda-agent"));
  }
  {
    ScopedEnv cache("CUDA_AGENT_CACHE_DIR", "");  // empty counts as unset
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), fs::path("/home/someone/.cache/cuda-agent"));
  }
  {
    ScopedEnv cache("CUDA_AGENT_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/ignored");
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), fs::path("/home/someone/.cache/cuda-agent"));
  }
  {
    ScopedEnv cache("CUDA_AGENT_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", nullptr);
    EXPECT_THROW(default_cache_dir(), Error);
  }
}

// flock locks belong to open file descriptions: a second open of the same file in this process
// contends like another process would.
TEST(FileLock, ExclusiveUntilTheHolderClosesIt) {
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.lock";
  const int held = lock_file(path, /*exclusive=*/true);
  ASSERT_GE(held, 0);
  const int other = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(other, 0);
  EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);
  EXPECT_EQ(errno, EWOULDBLOCK);
  ::close(held);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);
  ::close(other);
}

TEST(FileLock, SharedHoldersCoexistAndKeepExclusiveOut) {
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.quiet.lock";
  const int a = lock_file(path, /*exclusive=*/false);
  const int b = lock_file(path, /*exclusive=*/false);  // would block if shared locks excluded each other
  const int other = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(other, 0);
  EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);
  ::close(a);
  EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);  // b still holds it
  ::close(b);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0);
  ::close(other);
}

// A bounded wait gives up with -1 while another holds the lock, and takes it once it is free.
TEST(FileLock, ABoundedWaitGivesUpWhileAnotherHoldsIt) {
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.gpu.lock";
  const int held = lock_file(path, /*exclusive=*/true);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(lock_file(path, /*exclusive=*/true, /*max_wait_s=*/0.2), -1);
  EXPECT_EQ(lock_file(path, /*exclusive=*/false, /*max_wait_s=*/0), -1);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 5.0);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(held);
  });
  const int taken = lock_file(path, /*exclusive=*/true, /*max_wait_s=*/10);
  release.join();
  EXPECT_GE(taken, 0);
  ::close(taken);
}

// Waiters are served in the order they came, bounded waits (a thread of their own) and unbounded
// ones alike: the GPU's lock is an evaluation queue. Polled with LOCK_NB, as it was, the last to
// come was served first nearly every time (0 of 20 rounds in order on this machine).
// How many waiters /proc/locks shows blocked on `path` ("->" lines of its device and inode).
int lock_waiters(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  char id[64];
  std::snprintf(id, sizeof id, "%02x:%02x:%llu ", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  int n = 0;
  for (std::string line; std::getline(locks, line);)
    if (line.find("->") != std::string::npos && line.find(id) != std::string::npos) ++n;
  return n;
}

TEST(FileLock, WaitersAreServedInTheOrderTheyCame) {
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.gpu.lock";
  for (int round = 0; round < 3; ++round) {
    const int held = lock_file(path, /*exclusive=*/true);
    std::mutex mutex;
    std::vector<int> order;
    std::vector<std::thread> waiters;
    for (int i = 0; i < 6; ++i) {
      waiters.emplace_back([&, i] {
        const int fd = lock_file(path, /*exclusive=*/true, i % 2 == 0 ? 20.0 : -1.0);
        {
          std::lock_guard<std::mutex> lock(mutex);
          order.push_back(i);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ::close(fd);
      });
      // The next one comes once this one waits in the queue, however loaded the machine.
      for (int k = 0; k < 2000 && lock_waiters(path) < i + 1; ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ASSERT_EQ(lock_waiters(path), i + 1) << "waiter " << i << " never queued";
    }
    ::close(held);
    for (std::thread& t : waiters) t.join();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5})) << "round " << round;
  }
}

// A wait's check runs about every second; what it throws ends the wait and comes out of
// lock_file. The place it left in the queue lets the lock go at once when its turn comes: the
// next waiter gets it, and then nobody holds it.
TEST(FileLock, ACheckThatThrowsEndsTheWaitAndItsPlaceLetsTheLockGo) {
  struct Stop {};
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.gpu.lock";
  const int held = lock_file(path, /*exclusive=*/true);
  int checks = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(lock_file(path, /*exclusive=*/true, /*max_wait_s=*/30,
                         [&] {
                           if (++checks == 2) throw Stop{};
                         }),
               Stop);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(checks, 2);
  EXPECT_GE(waited, 1.5);
  EXPECT_LT(waited, 10.0);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(held);
  });
  const int next = lock_file(path, /*exclusive=*/true, /*max_wait_s=*/10);
  release.join();
  ASSERT_GE(next, 0) << "the abandoned place kept the lock";
  ::close(next);
  const int other = ::open(path.c_str(), O_RDONLY);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0) << "somebody still holds it";
  ::close(other);
}

// Who holds a lock file, as a judge that gave up waiting asks: the holder by its pid, which
// descends from this process; nobody once it is gone.
TEST(FileLock, LockHoldersNamesTheProcessThatHoldsIt) {
  TempDir dir("ca-lock-");
  const fs::path path = dir.path() / "gpu0.quiet.lock";
  const fs::path other = dir.path() / "gpu0.gpu.lock";
  const auto [child, fd] = fork_waiting_child([&] { return static_cast<pid_t>(lock_file(path, /*exclusive=*/false)); });
  ASSERT_GE(child, 0);
  ASSERT_GE(fd, 0) << "the child could not take the lock";
  const int mine = lock_file(other, /*exclusive=*/true);
  EXPECT_EQ(lock_holders(path), std::vector<pid_t>{child});
  EXPECT_EQ(lock_holders(other), std::vector<pid_t>{::getpid()});
  EXPECT_TRUE(descends_from(child, ::getpid()));
  EXPECT_FALSE(descends_from(::getpid(), child));
  EXPECT_FALSE(descends_from(::getpid(), ::getpid()));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(lock_holders(path).empty());
  EXPECT_FALSE(descends_from(child, ::getpid())) << "a process that is gone";
  EXPECT_TRUE(lock_holders(dir.path() / "missing.lock").empty());
  ::close(mine);
}

// The GPU memory a confined command's processes hold (NVML's figures by pid): its descendants'
// summed, itself, strangers and gone processes left out, and nothing below an evaluation's judge
// (a holder of the GPU's lock) counted.
TEST(ProcStat, DescendantsGpuBytesSumsTheTreeButWhatLiesBelowAnExemptProcess) {
  const auto [child, grandchild] = fork_waiting_child([] { return fork_waiting_child([] { return pid_t{0}; }).first; });
  ASSERT_GE(child, 0);
  ASSERT_GT(grandchild, 0);
  const uint64_t gib = 1ULL << 30;
  const std::map<pid_t, uint64_t> held = {
      {child, 1 * gib}, {grandchild, 2 * gib}, {::getpid(), 5 * gib}, {::getppid(), 7 * gib}};
  EXPECT_EQ(descendants_gpu_bytes(::getpid(), held, {}), 3 * gib) << "the child and the grandchild, not itself";
  EXPECT_EQ(descendants_gpu_bytes(child, held, {}), 2 * gib);
  EXPECT_EQ(descendants_gpu_bytes(::getpid(), held, {child}), 0u) << "the exempt process and all below it";
  EXPECT_EQ(descendants_gpu_bytes(::getpid(), held, {grandchild}), 1 * gib);
  EXPECT_EQ(descendants_gpu_bytes(::getpid(), {}, {}), 0u);
  ::kill(grandchild, SIGKILL);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The grandchild, adopted by init (or a subreaper) once gone, is no descendant any more.
  for (int i = 0; i < 100 && descendants_gpu_bytes(::getpid(), held, {}) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(descendants_gpu_bytes(::getpid(), held, {}), 0u);
}

// The processes a confined command leaves are killed in descendants_of's order: parents first,
// so that no shell sees its background job killed and goes on to its next command.
TEST(ProcStat, DescendantsComeParentsFirst) {
  std::function<pid_t(int)> chain = [&](int below) -> pid_t {
    return below == 0 ? pid_t{0} : fork_waiting_child([&] { return chain(below - 1); }).first;
  };
  const pid_t child = chain(5);
  ASSERT_GT(child, 0);
  const std::vector<pid_t> tree = descendants_of(child);
  EXPECT_EQ(tree.size(), 4u);
  const auto at = [&](pid_t pid) { return std::find(tree.begin(), tree.end(), pid) - tree.begin(); };
  for (const pid_t pid : tree)
    for (const auto& [below, stat] : children_of(pid)) EXPECT_LT(at(pid), at(below)) << pid << " before " << below;
  ::kill(child, SIGKILL);
  for (const pid_t pid : tree) ::kill(pid, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST(FileLock, AnUnopenableFileIsAnErrorNamingIt) {
  try {
    lock_file("/nonexistent-dir-for-ca/x.lock", true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-for-ca/x.lock"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cuda_agent
