#include "cuda_agent/agent/workspace.h"

#include <algorithm>
#include <system_error>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

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

bool Workspace::is_locked(const fs::path& absolute) const {
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(absolute.lexically_normal(), ec);
  if (ec) resolved = absolute.lexically_normal();
  if (locked_.count(resolved) > 0) return true;
  return locked_.count(absolute.lexically_normal()) > 0;
}

std::string Workspace::read_solution() const {
  const fs::path path = root_ / kSolutionName;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "";
  return read_file(resolve(kSolutionName));  // refuses a symlink that leaves the workspace
}

}  // namespace cuda_agent::agent
