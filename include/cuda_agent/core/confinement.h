// OS confinement of the calling process with unprivileged Linux namespaces: what the sandbox's
// evaluation worker does first, before it runs any code it did not write.
//
// After confine_this_process() the process (and everything it starts) sees the same file tree,
// read-only, except the paths it was told to keep writable; it has no network; and it holds no
// capability, so neither it nor a program it runs can undo any of this. No privilege is needed:
// only that the kernel lets unprivileged users create user namespaces
// (`unshare --user --map-current-user --net --mount true` works).
//
// Linux only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace cuda_agent {

struct ConfinementPlan {
  // Directories and files that stay writable (each bound onto itself). Each must exist.
  std::vector<std::string> writable;
  // Directories that get a private, empty tmpfs, on which every entry the directory held is
  // bound back read-only ("/tmp": files other programs keep there stay readable, new files
  // land in memory and vanish with the process). Writable paths inside them are bound writable
  // on top. Each must exist.
  std::vector<std::string> private_dirs;
  // Files and directories inside writable paths that are bound read-only on top of them (the
  // agent's locked task files inside its writable workspace). Each must exist.
  std::vector<std::string> read_only;
  // Directories covered by an empty read-only tmpfs: their contents cannot be read at all (the
  // evaluation cache's secret key). Each must exist.
  std::vector<std::string> hidden;
  // When not empty, the read scope: only these files and folders, the writable and read-only
  // ones, /dev, /proc and /sys, and what lies on the way to them can be read; everything else the
  // file system holds when the process is confined (read_scope_cover() of them) is hidden, a
  // folder shown empty and a file as /dev/null: the host's entries of a private directory too
  // (what the process writes there stays its own). Paths that do not exist are left out.
  std::vector<std::string> visible;
  // Size limit of each tmpfs (the private directories and /dev/shm); 0: the kernel's default
  // (half the RAM).
  uint64_t tmpfs_bytes = 0;
  // The GPUs' device nodes (/dev/nvidia*) in the private /dev; false: none, so that CUDA and NVML
  // find no GPU whatever the process's environment says (a solution's nvcc builds, run outside
  // the GPU's lock: sandbox.prebuild).
  bool gpu_devices = true;
  // exec_confined only: no namespaces, mounts or capability changes (the caller, bubblewrap
  // say, made them); the command's signals are scoped all the same.
  bool signals_only = false;
  // exec_confined only: the largest file the command and what it starts may write (RLIMIT_FSIZE;
  // a write past it fails with EFBIG); 0: no limit.
  uint64_t max_file_bytes = 0;
  // exec_confined only: the most the folders of `watched` may hold together (their files'
  // allocated blocks, about every 250 ms) while the command runs; past it the command and all it
  // started are stopped (exit code kResourceLimitExitCode, a line on stderr). A command that starts
  // with them fuller than that may not add to them (removing files is how an agent goes on).
  // 0: no limit.
  uint64_t max_watched_bytes = 0;
  std::vector<std::string> watched;
  // exec_confined only: the most resident memory the command and everything it started may hold
  // together (their RSS summed about every 250 ms, shared pages counted in each process): past
  // it they are all stopped (exit code kResourceLimitExitCode, a line on stderr), before the
  // machine runs out and the kernel's OOM killer picks a process of its own choosing (the
  // trainer, whose oom_score_adj any process of the user may raise). 0: no limit.
  uint64_t max_memory_bytes = 0;
  // exec_confined only: the most GPU memory the command and everything it started may hold
  // together outside the sandbox's evaluations (NVML's figures, about every second), for
  // kGpuMemoryGraceChecks checks in a row: past it they are all stopped (kResourceLimitExitCode, a
  // line on stderr). A process that holds one of `gpu_lock_files` (an evaluation's judge, which
  // holds the GPU's lock while it uses the GPU), and what it started, is not counted. Where NVML is
  // missing or names no process of the command, nothing is stopped. When episodes share a GPU, one
  // command holding its memory would otherwise leave the other episodes' evaluations short of it
  // (masked task_too_large, or failing). 0: no limit.
  uint64_t max_gpu_memory_bytes = 0;
  std::vector<std::string> gpu_lock_files;
};

// Checks (about a second apart) a command's GPU memory must stay past
// ConfinementPlan::max_gpu_memory_bytes before it is stopped: an evaluation's judge lets go of the
// GPU's lock a moment before its memory goes.
constexpr int kGpuMemoryGraceChecks = 3;

// A read scope: the paths of `visible` resolved (those that do not exist left out), and /dev,
// /proc and /sys, which every confined process needs.
std::vector<std::string> resolve_read_scope(const std::vector<std::string>& visible);

// What the read scope `scope` (resolve_read_scope's) hides: every folder and file, as the file
// system holds them now, that lies outside every path of it and is not on the way to one; a
// folder on the way is walked, one inside a scope path left alone. Symbolic links are left as
// they are (what one points to is hidden or not by where it lies), and so are sockets, pipes and
// devices. `private_dirs` (a private /tmp) are the process's own: neither they nor their entries
// are covered; their host entries are to be left out where the scope does not show them
// (read_scope_shows), so that nothing of the processes coming and going there needs covering.
struct ReadScopeCover {
  std::vector<std::string> dirs;   // to be shown empty
  std::vector<std::string> files;  // to be shown as /dev/null
};
ReadScopeCover read_scope_cover(const std::vector<std::string>& scope, const std::vector<std::string>& private_dirs = {});
// Whether `path` is `dir` or inside it, both resolved already (compared as strings, no system
// call).
bool path_under(const std::string& path, const std::string& dir);
// Whether `path` (resolved) is a path of `scope`, inside one or on the way to one.
bool read_scope_shows(const std::vector<std::string>& scope, const std::string& path);

// exec_confined's exit code for a command stopped by ConfinementPlan::max_watched_bytes,
// max_memory_bytes or max_gpu_memory_bytes.
constexpr int kResourceLimitExitCode = 125;

// What the files under `paths` occupy on disk (allocated blocks, or a file's size where that is
// more; links not followed); counting stops once past `stop_after` (0: never), returning what it
// had then.
uint64_t disk_usage(const std::vector<std::string>& paths, uint64_t stop_after = 0);

// Moves the calling process into new namespaces and confines it:
//   user    this uid and gid mapped onto themselves. Afterwards the process holds no
//           capability, its bounding and ambient sets are empty and no_new_privs is set, so
//           neither it nor a program it runs (setuid or root) can mount, unmount or remount.
//           Processes outside are out of reach of ptrace and /proc/<pid>/root (they live in
//           the parent user namespace); they can still be sent signals (there is no PID
//           namespace): scope_signals() below closes that.
//   network a fresh namespace holding only a loopback interface that is down: no TCP, UDP or
//           abstract unix socket reaches anything outside.
//   IPC     private System V IPC objects and POSIX message queues.
//   mount   every mount read-only (the flags the kernel locks, nosuid, nodev, noexec and the
//           atime flags, are kept; mounts this process cannot reach are left alone, as they
//           are unreachable from it too) except /proc, which the CUDA driver needs writable:
//           there /proc/sys, sysrq-trigger, irq, bus and fs are bound read-only; /dev replaced by a read-only tmpfs holding null,
//           zero, full, random, urandom, tty, every /dev/nvidia* entry (bound from the host),
//           a private writable /dev/shm and the fd/stdin/stdout/stderr links; private_dirs,
//           writable, read_only and hidden as ConfinementPlan says. The working directory is entered again by its
//           path.
// Unix sockets that exist as files (a daemon's socket under /run, say) stay reachable:
// connecting to one is not a write.
//
// Must be called while the process has a single thread (unshare(CLONE_NEWUSER) requires it):
// first thing in a fresh process. Throws Error naming the step that failed and the system's
// reason; the process is then partly confined (in new namespaces, perhaps with some mounts
// changed) and should report and exit rather than go on. Not thread-safe.
void confine_this_process(const ConfinementPlan& plan);

// Puts the calling thread, and every thread and process it starts from then on, in a Landlock
// domain that scopes signals: kill(2), tgkill(2), pidfd_send_signal(2) and the like fail with
// EPERM for any process outside the domain (the parent, other evaluations' judges, anything of
// this user's), while the process's own children stay reachable. Landlock also keeps such a
// process from ptrace-ing or reading the memory of a process outside its domain. Signals the
// kernel sends (SIGCHLD to the parent, a parent-death signal) are not affected. Sets
// no_new_privs. Call while the process has one thread (threads started before are not
// covered). Returns "" when done, else why it could not be done (a kernel before 6.12, or one
// without Landlock enabled): the process is then unchanged but for no_new_privs.
std::string scope_signals();

// Whether scope_signals() works here, tried in a child process: "" when it does, else why not.
std::string signal_scope_unavailable();

// confine_this_process(plan) (unless plan.signals_only), then set_environment(env) and
// scope_signals() (where the kernel can), and runs `command` (searched in PATH) as its child,
// staying as the subreaper of everything the command starts: when the command ends, or this
// process gets SIGTERM, SIGINT or SIGHUP, every process left of it (a daemon that setsid()ed
// included) is killed. Returns the command's exit status (128 + the signal that ended it), or
// 126 when the process could not be confined, 127 when the command could not be run, each
// after a line on stderr saying why. For a fresh process (the agent's Bash runs
// `cuda-agent confined-exec`). It sets kInsideConfinementVariable in the command's environment
// (not with signals_only).
inline constexpr const char* kInsideConfinementVariable = "CUDA_AGENT_INSIDE_CONFINEMENT";
int exec_confined(const ConfinementPlan& plan, const std::vector<std::string>& command,
                  const std::vector<std::pair<std::string, std::string>>& env = {});

// The environment that points the caches of what a confined process runs (torch.compile's
// inductor, Triton, the CUDA JIT, ATen's kernel cache) and its TMPDIR into a fresh folder of its
// private /tmp, /tmp/cuda-agent-caches-<random>/. Their defaults are under $HOME or in /tmp
// itself (/tmp/torchinductor_<user>, from Python's tempfile.gettempdir()), which the
// confinement shows read-only wherever the host already has them: one torch.compile run on the
// host would otherwise break torch.compile in every confined process after it. The TMPDIR
// folder must exist (tempfile skips one that does not): exec_confined creates it; other
// callers create it once confined (set_environment). CUDA_AGENT_HOST_TMPDIR keeps the temporary
// directory the process had before (host_temp_directory()).
std::vector<std::pair<std::string, std::string>> private_cache_env();
// The same variables under `root` instead (an unconfined process, whose /tmp is the host's: a
// folder its parent removes afterwards, so nothing outlives the process there).
std::vector<std::pair<std::string, std::string>> private_cache_env(const std::filesystem::path& root);

// Sets each variable of `env` (private_cache_env()'s, say) in this process and creates the folder
// its TMPDIR names, if it names one. Throws Error naming the folder when it cannot be created.
// Reads and writes the environment: call it while the process has one thread.
void set_environment(const std::vector<std::pair<std::string, std::string>>& env);

// The host's temporary directory, where files shared across confined processes live (the GPU
// lock files): CUDA_AGENT_HOST_TMPDIR in a process private_cache_env() set up, else the usual
// one (TMPDIR, else /tmp).
std::filesystem::path host_temp_directory();

}  // namespace cuda_agent
