// The directory one agent episode works in.
//
// Layout (Workspace::create):
//   model.py        the task, copied in, mode 0444            (locked)
//   <extra files>   other task files, copied in, mode 0444    (locked)
//   model_new.py    the solution the agent writes, mode 0644
//   verify.sh       runs the locked correctness check, 0555   (locked)
//   profile.sh      runs the locked timing check, 0555        (locked)
//   README.md       tells the agent what is where, 0444       (locked)
//   kernels/        writable, only when WorkspaceOptions::kernels_dir
//
// Confinement. The file tools (Read, Write, Edit, Glob, Grep, NotebookEdit, ...) pass every
// path through resolve(), which refuses anything outside the root ("..", absolute paths
// elsewhere, symlinks that point outside), and refuse writes to locked files. Bash cannot be
// confined by path checks: a shell command can read or write anything the process can. What
// protects the task from Bash is the process-level lock: the task files and README are
// chmod 0444 and the scripts 0555, so a command that writes to them fails unless it chmods
// them first. File modes do not bind root: an agent whose commands run as root can rewrite
// the task, so run episodes as an unprivileged user, and give verify/profile commands the
// original task path (outside the workspace) rather than model.py where that matters.
// OS-level confinement of Bash (namespaces, a read-only bind mount of the task) is a later
// issue.
// resolve() alone is not proof against a race with a background shell that swaps a folder for
// a symlink between the check and the use: the file tools read and write through read_inside
// and write_inside, which walk from the root to the resolved path without following any
// symlink, so a link put on the way after resolve() makes the call fail instead of leaving
// the workspace.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_agent::agent {

struct WorkspaceOptions {
  // Created if missing; must be an empty directory or absent.
  std::filesystem::path root;
  // The task's model.py: copied in as model.py and made read-only (0444). Must exist.
  std::filesystem::path task_file;
  // Copied in under their file names, read-only too. Names must not collide with each other
  // or with the files above.
  std::vector<std::filesystem::path> extra_task_files;
  // Shell commands run by verify.sh / profile.sh from the workspace root, e.g.
  // "/path/cuda-agent verify --task model.py --solution model_new.py". The scripts pass their
  // own arguments on. Empty: the script prints that the check is not available here and
  // exits with status 2.
  std::string verify_command;
  std::string profile_command;
  // Create a writable kernels/ (the CUDA-Agent layout with kernels/*.cu).
  bool kernels_dir = false;
  // Content of model_new.py (may be empty).
  std::string initial_solution;
};

// A value type: copies refer to the same directory. The directory is not removed when the
// object dies (the caller owns it; use a TempDir for scratch episodes). All methods are
// const after create() and safe to call from several threads; the files themselves are not
// protected against concurrent writers.
class Workspace {
 public:
  // Creates the layout above. Throws Error when the root exists and is not an empty
  // directory, a task file is missing or not a regular file, two files would share a name,
  // or the file system refuses (the message names the path and the system's reason).
  static Workspace create(const WorkspaceOptions& options);

  // The absolute, canonical root (symlinks in the given root are resolved).
  const std::filesystem::path& root() const { return root_; }

  // Resolves a tool path — relative to the root, or absolute inside it — to an absolute,
  // normalized path with every symlink of its existing part resolved. The path need not
  // exist. Throws Error "path escapes the workspace: ..." when the result is outside the
  // root, and Error when the path is empty or cannot be resolved (a symlink loop).
  std::filesystem::path resolve(const std::string& path) const;

  // True for files the agent may not change: model.py, verify.sh, profile.sh, README.md and
  // the extra task files. `absolute` is resolved the same way as resolve() does (a symlink to
  // model.py counts as model.py); never throws.
  bool is_locked(const std::filesystem::path& absolute) const;
  const std::set<std::filesystem::path>& locked_files() const { return locked_; }

  // The content of `resolved` (what resolve() returned, inside the root), opened through the
  // folders from the root without following a symlink anywhere on the way (resolve() resolved
  // the links there were): one that appeared since fails the call (Error naming the path)
  // rather than lead out of the workspace. Throws Error too for what is not a regular file and
  // for a file over `max_bytes`.
  std::string read_inside(const std::filesystem::path& resolved, uint64_t max_bytes) const;
  // The same, opened for reading: a descriptor of the regular file (the caller closes it).
  int open_inside(const std::filesystem::path& resolved) const;
  // Replaces (or creates) `resolved` with `content` atomically (a temporary file in its folder,
  // then a rename), its missing folders made, keeping an existing file's mode; every folder on
  // the way is reached as read_inside reaches them, so neither the file nor the temporary can
  // land outside the workspace. Throws Error naming the path.
  void write_inside(const std::filesystem::path& resolved, std::string_view content) const;

  // model_new.py's current content; "" when the agent deleted it. Throws Error when it
  // exists but cannot be read (replaced by a directory, say) or is a symlink that leaves the
  // workspace.
  std::string read_solution() const;

 private:
  Workspace() = default;
  bool inside(const std::filesystem::path& normalized) const;
  // The folder holding `resolved`, reached from the root without following a symlink (made on
  // the way when `make` is set), and the file's name in it.
  std::pair<int, std::string> parent_inside(const std::filesystem::path& resolved, bool make) const;

  std::filesystem::path root_;
  std::set<std::filesystem::path> locked_;
};

}  // namespace cuda_agent::agent
