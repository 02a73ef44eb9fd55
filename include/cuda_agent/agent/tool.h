// A tool the agent calls: a name, an OpenAI function-tool schema, and run(arguments) that
// returns an observation. Tools follow the semantics of Claude Code's tools (Bash, Read, Edit,
// ...), bound to one episode's Workspace; ToolRegistry (tool_registry.h) builds all ten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::agent {

// What one call produced. `output` is the text the model sees (the observation), already
// truncated to ToolOptions::max_output_chars and valid UTF-8 when it comes from
// ToolRegistry::call. `ok` is false for errors: a bad argument, a refused path, a failed edit,
// a command that exited non-zero or timed out. An error is still an observation for the
// model, never an exception. `data` carries machine-readable details for the loop and the
// trajectory (exit_code, shell_id, replacements, ...); null when there are none.
struct ToolResult {
  bool ok = true;
  std::string output;
  nlohmann::json data;
};

// Limits shared by the tools of one registry.
// A quarter of this machine's memory, clamped to [8 GiB, 64 GiB] (ToolOptions::max_memory_bytes).
uint64_t default_command_memory_bytes();

struct ToolOptions {
  // Any observation longer than this keeps its head and tail around a
  // "[... N characters truncated ...]" notice. Must be >= 1000.
  size_t max_output_chars = 30000;
  // Bash's timeout when the call gives none, and the cap on the one it gives. Must be > 0,
  // with default_timeout_s <= max_timeout_s.
  double default_timeout_s = 120;
  double max_timeout_s = 600;
  // What a Bash command's processes may wait for a GPU's lock, in all, without it counting against
  // the command's timeout (a `verify.sh` queued behind other episodes' evaluations: the judge
  // moves its own deadline by the same wait, bounded by sandbox.gpu_wait_s, which episodes give
  // here). A process that waits so is named sandbox::kGpuWaitName; any command could name one so,
  // which gains it at most this much time. 0: every second counts.
  double gpu_wait_s = 0;
  // Lock files (the GPU's) with the longest any evaluation holds each: a background shell whose
  // process has held one longer than that is stopped at the next tool call, which says so. Held,
  // the GPU's quiet lock keeps every episode's generation waiting (bounded by sandbox.gpu_wait_s),
  // the holder's own included, and its background shells run until the episode is scored. Episodes
  // that take the GPU's lock give the gpu, quiet and turnstile files. Empty: never.
  std::vector<std::pair<std::string, double>> lock_hold_limits;
  // Bash's confinement (the file system read-only except the workspace, the evaluation cache and
  // a private /tmp; locked task files read-only even for root; no network): "bwrap" under
  // bubblewrap, "namespaces" through `cuda-agent confined-exec` (the binary's own namespaces),
  // each required (a command fails when it cannot run); "auto" the first of the two that works
  // on this machine, else unconfined; "off" never confines.
  std::string confine = "auto";
  // Existing files or folders a confined Bash may also write. (The GPU's lock files are not among
  // them: verify.sh's evaluations lock them through a read-only descriptor.)
  std::vector<std::string> writable_paths;
  // Existing folders a confined Bash must not see into (an empty read-only folder in their
  // place): the scoring cache's secret key (EpisodeSpec's sandbox cache).
  std::vector<std::string> hidden_paths;
  // Existing files or folders inside hidden ones that a confined Bash may still read (the task's
  // folder inside a hidden run folder). The workspace and the writable paths need no entry here.
  std::vector<std::string> read_only_paths;
  // When not empty, a confined Bash reads only these, the workspace, the writable and read-only
  // paths (ConfinementPlan::visible; sandbox.read_scope "system": the system's and Python's
  // folders, the task's, the GPU's lock files).
  std::vector<std::string> visible_paths;
  // A confined Bash's resources beside the workspace: the size of its private /tmp and /dev/shm
  // (memory: unbounded, each would take up to half the machine's RAM, and other episodes'
  // evaluations and the trainer with it), and the largest file it may write anywhere (the
  // workspace is on the run's disk). 0: no limit.
  uint64_t tmpfs_bytes = 4ULL << 30;
  uint64_t max_file_bytes = 4ULL << 30;
  // What the episode's folders on disk (the workspace and the tools' cache) may hold together
  // while a confined command runs (watched about every 250 ms): past it the command is stopped
  // and told so; one that starts over it may only shrink them. Many files of max_file_bytes
  // each would otherwise fill the run's disk, and the trainer's checkpoints with it. 0: none.
  uint64_t max_disk_bytes = 4ULL << 30;
  // The most resident memory a confined command and everything it starts (a `verify.sh`'s
  // evaluation included: its judge and candidate count in full) may hold together, watched about
  // every 250 ms: past it they are stopped and told so. Without it one command could take the
  // machine's memory, and the kernel's OOM killer then ends whichever process it picks: another
  // episode's evaluation, or the trainer. Default: a quarter of the machine's memory, at least
  // 8 GiB and at most 64 GiB. 0: none.
  uint64_t max_memory_bytes = default_command_memory_bytes();
  // The most GPU memory a confined command and everything it starts may hold together outside
  // the sandbox's evaluations (NVML's figures, about every second, past it for three checks in a
  // row): past it they are stopped and told so. A `verify.sh` evaluation's judge holds
  // `gpu_lock_file` while it uses the GPU and is not counted, nor its candidate. Without it, one
  // episode's command (a background shell that allocates and sleeps) leaves the GPU's other
  // episodes' evaluations short of memory. The trainer sets an equal share of the GPU when
  // episodes share one (ConfinementPlan::max_gpu_memory_bytes). 0: none.
  uint64_t max_gpu_memory_bytes = 0;
  std::string gpu_lock_file;
};

// One tool. Implementations hold references to the registry's workspace and scratch space;
// they are not thread-safe (an episode calls its tools one at a time).
class Tool {
 public:
  virtual ~Tool() = default;
  virtual std::string name() const = 0;
  // OpenAI function-tool schema:
  //   {"type": "function", "function": {"name", "description", "parameters": {JSON Schema}}}.
  // parameters is an object schema with "properties", "required" and
  // "additionalProperties": false.
  virtual nlohmann::json schema() const = 0;
  // Runs the tool on arguments that ToolRegistry::call has already checked against the
  // schema (required present, types and enums right, nulls dropped). Never throws: every
  // failure becomes an ok=false result whose output says what went wrong and what to do.
  virtual ToolResult run(const nlohmann::json& arguments) = 0;
};

}  // namespace cuda_agent::agent
