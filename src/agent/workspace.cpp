#include "cuda_agent/agent/workspace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <system_error>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTaskName = "model.py";
constexpr const char* kSolutionName = "model_new.py";
constexpr const char* kVerifyName = "verify.sh";
constexpr const char* kProfileName = "profile.sh";
constexpr const char* kReadmeName = "README.md";
constexpr const char* kKernelsName = "kernels";

constexpr fs::perms kReadOnly = fs::perms::owner_read | fs::perms::group_read |
                                fs::perms::others_read;  // 0444
constexpr fs::perms kReadExec = kReadOnly | fs::perms::owner_exec | fs::perms::group_exec |
                                fs::perms::others_exec;  // 0555
constexpr fs::perms kReadWrite = kReadOnly | fs::perms::owner_write;  // 0644

void set_mode(const fs::path& path, fs::perms mode) {
  std::error_code ec;
  fs::permissions(path, mode, fs::perm_options::replace, ec);
  CA_CHECK(!ec, "cannot set the mode of '{}': {}", path.string(), ec.message());
}

void copy_task_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  CA_CHECK(fs::is_regular_file(from, ec), "task file '{}' does not exist or is not a regular "
           "file; give the path of the task's files", from.string());
  fs::copy_file(from, to, fs::copy_options::none, ec);
  CA_CHECK(!ec, "cannot copy task file '{}' to '{}': {}", from.string(), to.string(),
           ec.message());
  set_mode(to, kReadOnly);
}

// The script runs the command from the workspace root, so that "model.py" and
// "model_new.py" in it mean the workspace's files wherever the agent calls the script from.
std::string check_script(const std::string& command, const char* what) {
  if (command.empty()) {
    return fmt::format("#!/bin/sh\necho '{} is not available in this workspace' >&2\nexit 2\n",
                       what);
  }
  return fmt::format("#!/bin/sh\ncd \"$(dirname \"$0\")\" || exit 2\nexec {} \"$@\"\n",
                     command);
}

std::string readme_text(const WorkspaceOptions& options,
                        const std::vector<std::string>& extra_names) {
  std::string text =
      "# Workspace\n\n"
      "Write a faster implementation of the task in `model.py` as `class ModelNew` in\n"
      "`model_new.py` (same constructor arguments and parameter names as `Model`), with\n"
      "custom CUDA kernels.\n\n"
      "| file | what it is |\n|---|---|\n"
      "| `model.py` | the task (read-only) |\n"
      "| `model_new.py` | your solution: edit this file |\n"
      "| `verify.sh` | checks your solution against the task over five seeded trials "
      "(read-only; run `./verify.sh`) |\n"
      "| `profile.sh` | times your solution against eager PyTorch and torch.compile "
      "(read-only; run `./profile.sh`) |\n";
  for (const auto& name : extra_names) {
    text += fmt::format("| `{}` | a task file (read-only) |\n", name);
  }
  if (options.kernels_dir) text += "| `kernels/` | writable: put CUDA sources (`*.cu`) here |\n";
  text +=
      "\nThe task files, this README and the two scripts cannot be changed. Run verify first; "
      "profile only a solution that verifies.\n";
  return text;
}

}  // namespace

Workspace Workspace::create(const WorkspaceOptions& options) {
  CA_CHECK(!options.root.empty(), "workspace root is empty; give a directory to create");
  std::error_code ec;
  const fs::path root = fs::absolute(options.root, ec);
  CA_CHECK(!ec, "cannot make '{}' absolute: {}", options.root.string(), ec.message());
  if (fs::exists(root, ec)) {
    CA_CHECK(fs::is_directory(root, ec), "workspace root '{}' exists and is not a directory",
             root.string());
    CA_CHECK(fs::is_empty(root, ec) && !ec, "workspace root '{}' is not empty; give an empty "
             "or absent directory", root.string());
  } else {
    fs::create_directories(root, ec);
    CA_CHECK(!ec, "cannot create workspace root '{}': {}", root.string(), ec.message());
  }

  Workspace workspace;
  workspace.root_ = fs::canonical(root, ec);
  CA_CHECK(!ec, "cannot resolve workspace root '{}': {}", root.string(), ec.message());
  const fs::path& dir = workspace.root_;

  std::vector<std::string> extra_names;
  std::set<std::string> names = {kTaskName, kSolutionName, kVerifyName, kProfileName,
                                 kReadmeName, kKernelsName};
  for (const auto& extra : options.extra_task_files) {
    const std::string name = extra.filename().string();
    CA_CHECK(!name.empty() && name != "." && name != "..",
             "extra task file '{}' has no file name", extra.string());
    CA_CHECK(names.insert(name).second, "extra task file '{}' would be copied in as '{}', "
             "which the workspace already has; rename it", extra.string(), name);
    extra_names.push_back(name);
  }

  copy_task_file(options.task_file, dir / kTaskName);
  workspace.locked_.insert(dir / kTaskName);
  for (size_t i = 0; i < options.extra_task_files.size(); ++i) {
    copy_task_file(options.extra_task_files[i], dir / extra_names[i]);
    workspace.locked_.insert(dir / extra_names[i]);
  }

  write_file_atomic(dir / kSolutionName, options.initial_solution);
  set_mode(dir / kSolutionName, kReadWrite);

  write_file_atomic(dir / kVerifyName, check_script(options.verify_command, "verify"));
  set_mode(dir / kVerifyName, kReadExec);
  write_file_atomic(dir / kProfileName, check_script(options.profile_command, "profile"));
  set_mode(dir / kProfileName, kReadExec);
  workspace.locked_.insert(dir / kVerifyName);
  workspace.locked_.insert(dir / kProfileName);

  if (options.kernels_dir) {
    fs::create_directory(dir / kKernelsName, ec);
    CA_CHECK(!ec, "cannot create '{}': {}", (dir / kKernelsName).string(), ec.message());
  }

  write_file_atomic(dir / kReadmeName, readme_text(options, extra_names));
  set_mode(dir / kReadmeName, kReadOnly);
  workspace.locked_.insert(dir / kReadmeName);
  return workspace;
}

bool Workspace::inside(const fs::path& normalized) const {
  auto [root_end, path_it] =
      std::mismatch(root_.begin(), root_.end(), normalized.begin(), normalized.end());
  return root_end == root_.end();
}

fs::path Workspace::resolve(const std::string& path) const {
  CA_CHECK(!path.empty(), "empty path; give a path inside the workspace (relative to {})",
           root_.string());
  CA_CHECK(path.find('\0') == std::string::npos, "path '{}' contains a NUL character", path);
  const fs::path given(path);
  // Normalizing before resolving leaves no ".." in the part that does not exist yet, so the
  // only symlinks left unresolved are in components that do not exist.
  const fs::path absolute = (given.is_absolute() ? given : root_ / given).lexically_normal();
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(absolute, ec);
  CA_CHECK(!ec, "cannot resolve path '{}': {}", path, ec.message());
  if (!resolved.has_filename() && resolved.has_relative_path()) {
    resolved = resolved.parent_path();  // "dir/" -> "dir"
  }
  CA_CHECK(inside(resolved), "path escapes the workspace: '{}' resolves to '{}', outside {}; "
           "use paths inside the workspace", path, resolved.string(), root_.string());
  return resolved;
}

std::pair<int, std::string> Workspace::parent_inside(const fs::path& resolved, bool make) const {
  CA_CHECK(inside(resolved) && resolved != root_, "'{}' is not a file inside the workspace {}", resolved.string(),
           root_.string());
  const fs::path relative = resolved.lexically_relative(root_);
  std::vector<std::string> parts;
  for (const fs::path& part : relative) parts.push_back(part.string());
  CA_CHECK(!parts.empty() && parts.back() != "." && parts.back() != "..", "'{}' names no file", resolved.string());
  UniqueFd dir(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  CA_CHECK(dir.get() >= 0, "cannot open the workspace {}: {}", root_.string(), errno_text(errno));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    CA_CHECK(parts[i] != "..", "'{}' leaves the workspace", resolved.string());
    // O_NOFOLLOW with O_DIRECTORY: a symlink here is ENOTDIR, never followed.
    int next = ::openat(dir.get(), parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && make) {
      if (::mkdirat(dir.get(), parts[i].c_str(), 0777) != 0 && errno != EEXIST)
        CA_FAIL("cannot create the folder {}: {}", (root_ / relative).parent_path().string(), errno_text(errno));
      next = ::openat(dir.get(), parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    CA_CHECK(next >= 0,
             "cannot reach {}: '{}' on its way is {} (it changed since the path was checked, or is "
             "no folder)",
             resolved.string(), parts[i],
             errno == ENOTDIR || errno == ELOOP ? "not a folder but a link or a file" : errno_text(errno));
    dir = UniqueFd(next);
  }
  return {dir.release(), parts.back()};
}

int Workspace::open_inside(const fs::path& resolved) const {
  auto [parent, name] = parent_inside(resolved, /*make=*/false);
  const UniqueFd dir(parent);
  // O_NONBLOCK: a FIFO put in the file's place does not hang the tool.
  UniqueFd fd(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  CA_CHECK(fd.get() >= 0, "cannot read {}: {}", resolved.string(),
           errno == ELOOP ? "it is a symbolic link now (it changed since the path was checked)" : errno_text(errno));
  struct stat st {};
  CA_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode), "cannot read {}: not a regular file", resolved.string());
  return fd.release();
}

std::string Workspace::read_inside(const fs::path& resolved, uint64_t max_bytes) const {
  const UniqueFd fd(open_inside(resolved));
  struct stat st {};
  CA_CHECK(::fstat(fd.get(), &st) == 0, "cannot read {}: {}", resolved.string(), errno_text(errno));
  CA_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes, "cannot read {}: {} bytes, over the {} this reads",
           resolved.string(), st.st_size, max_bytes);
  std::string content;
  char buffer[65536];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    CA_CHECK(n >= 0, "cannot read {}: {}", resolved.string(), errno_text(errno));
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
    CA_CHECK(content.size() <= max_bytes, "cannot read {}: over the {} bytes this reads", resolved.string(), max_bytes);
  }
  return content;
}

void Workspace::write_inside(const fs::path& resolved, std::string_view content) const {
  auto [parent, name] = parent_inside(resolved, /*make=*/true);
  const UniqueFd dir(parent);
  struct stat st {};
  mode_t mode = 0;
  if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    CA_CHECK(!S_ISDIR(st.st_mode), "cannot write {}: it is a folder", resolved.string());
    if (S_ISREG(st.st_mode)) mode = st.st_mode & 07777;
  }
  std::random_device random;
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    temp = fmt::format(".{}.tmp-{:08x}", name, random());
    fd = ::openat(dir.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  CA_CHECK(fd >= 0, "cannot write {}: cannot create a temporary file beside it: {}", resolved.string(),
           errno_text(errno));
  int err = 0;
  for (size_t done = 0; done < content.size() && err == 0;) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      err = errno;
    else
      done += static_cast<size_t>(n);
  }
  if (err == 0 && mode != 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  // renameat replaces whatever holds the name now, a symlink included, without following it.
  if (err == 0 && ::renameat(dir.get(), temp.c_str(), dir.get(), name.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlinkat(dir.get(), temp.c_str(), 0);
    CA_FAIL("cannot write {}: {}", resolved.string(), errno_text(err));
  }
}

bool Workspace::is_locked(const fs::path& absolute) const {
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(absolute.lexically_normal(), ec);
  if (ec) resolved = absolute.lexically_normal();
  if (locked_.count(resolved) > 0) return true;
  return locked_.count(absolute.lexically_normal()) > 0;
}

namespace {
// More than any solution (the agent's Write turns are a few thousand tokens): a file past it is
// no solution the trainer records.
constexpr uint64_t kMaxSolutionBytes = uint64_t{64} << 20;
}  // namespace

std::string Workspace::read_solution() const {
  const fs::path path = root_ / kSolutionName;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  // resolve refuses a symlink that leaves the workspace; read_inside, one put there since.
  return read_inside(resolve(kSolutionName), kMaxSolutionBytes);
}

}  // namespace cuda_agent::agent
