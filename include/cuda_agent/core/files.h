// Small file-system helpers: whole-file reads, atomic writes, scratch directories, and the
// location of the on-disk cache.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_agent {

// Returns the whole content of `path`. Throws Error naming the path and the system's reason
// when it cannot be opened or read (missing, a directory, no permission). Thread-safe.
std::string read_file(const std::filesystem::path& path);

// Replaces `path` with `content` atomically: readers see either the old file or the complete
// new one, never a partial write. Creates missing parent directories, writes a uniquely named
// temporary file in the same directory (mode 0666 & ~umask), fsyncs it, renames it over
// `path`, then fsyncs the directory. A symlink at `path` is replaced, not followed; the old
// file's permissions are not kept. Throws Error naming the path and the system's reason on
// failure, after removing the temporary file. Thread-safe; concurrent writers to one path
// leave exactly one writer's complete content.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// The last `max_bytes` bytes of `text` after "...\n" when it is longer (the end of a log).
std::string tail_text(std::string_view text, size_t max_bytes);

// A scratch directory removed when this object dies.
//
// The constructor creates a new, uniquely named directory (mode 0700) `base`/`prefix`XXXXXX,
// base defaulting to std::filesystem::temp_directory_path() ($TMPDIR or /tmp). It throws
// Error if `prefix` contains '/' or the directory cannot be created. The destructor removes
// the directory and everything in it, ignoring errors, unless keep() was called. Move-only:
// a moved-from TempDir has an empty path and removes nothing. Not thread-safe per object.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "cuda-agent-",
                   const std::filesystem::path& base = {});
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::filesystem::path& path() const { return path_; }
  // Leaves the directory in place when this object dies (e.g. to inspect a failure).
  void keep() { keep_ = true; }

 private:
  void remove() noexcept;

  std::filesystem::path path_;
  bool keep_ = false;
};

// Directory for cached artifacts: $CUDA_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/cuda-agent,
// else $HOME/.cache/cuda-agent. Empty variables count as unset, and so does a relative
// XDG_CACHE_HOME (as the XDG spec asks). Does not create the directory. Throws Error when
// none of the three variables is usable. Reads the environment: must not race with
// setenv/unsetenv in other threads.
std::filesystem::path default_cache_dir();

// Blocks until this process holds a flock(2) on `path` (created 0666 if missing; opened read-only
// where it exists but cannot be written): exclusive, or shared with other shared holders. Returns
// the descriptor that holds it: the lock lasts until that descriptor is closed, which the kernel
// does at exit, so a crashed holder never leaves it locked. Waiters are served in the order they
// came (the kernel queues a blocked flock behind the earlier waiter it conflicts with, Linux 5.0
// and later); a wait that polled instead went nearly last-come-first-served. With max_wait_s >= 0
// it gives up after that long and returns -1; `check`, when set, is called about every second of
// the wait, and what it throws ends the wait and is thrown on. A bounded or checked wait blocks in
// a thread of its own; one given up on keeps its place until the lock comes, then lets it go at
// once. Throws Error naming the file when it cannot be opened or locked.
int lock_file(const std::filesystem::path& path, bool exclusive, double max_wait_s = -1,
              const std::function<void()>& check = {});

// The processes that hold a flock() lock on `path`, as /proc/locks names them (in this process's
// PID namespace; waiters left out): for saying who keeps a lock file that a wait gave up on, and
// whose GPU memory is an evaluation's. POSIX and OFD locks (fcntl) are left out: they do not
// exclude flock(), which every lock of the project takes, so holding one keeps nobody waiting, and
// a command of the agent's that took one on a GPU's lock file was counted as an evaluation (its
// GPU memory exempt from its bound) without holding anyone up. A lock taken by a process that has since ended, its
// descriptor inherited, names the ended one. Empty when the file or /proc/locks cannot be read. Never throws.
std::vector<pid_t> lock_holders(const std::filesystem::path& path);

// SHA-256 (hex) of a file's content, or "" when it cannot be read. Never throws.
std::string file_sha256(const std::filesystem::path& path) noexcept;

}  // namespace cuda_agent
