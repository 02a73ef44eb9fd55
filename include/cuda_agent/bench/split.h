// Benchmark splits: a named list of KernelBench-format tasks, from three kinds of source.
//
// 1. The project's own format (source "own") is a folder with split.yaml:
//
//   name: demo
//   description: ...
//   tasks:
//     - id: softmax_rows
//       path: tasks/softmax_rows/model.py   # relative to the folder
//       level: 1
//       atol: 1e-2                          # optional tolerance overrides
//       rtol: 1e-2
//       precision: loose                    # optional: loose, strict or tf32; unset = the run's policy
//       degenerate: false                   # optional: the task's outputs are (near) constant
//       source: own                         # optional: own (default), kernelbench or ops
//       extra: {ops: [torch.relu]}          # optional: free-form provenance (a mapping)
//
//    A task's folder may also hold task.yaml (level, atol, rtol, precision, degenerate; other
//    keys are ignored); split.yaml wins where both say something.
//
// 2. The KernelBench repository layout (source "kernelbench"): ROOT/level1/19_ReLU.py, ...;
//    see load_kernelbench_dir.
//
// 3. Rows of a CUDA-Agent-Ops-6K style table (source "ops"), JSONL, a JSON array or parquet,
//    each with a `code` column holding a whole KernelBench module; import_ops_rows writes them
//    out as a split of format 1.
//
// Every loader fills each task's sha256 (of model.py as read at load time). No loader imports
// or runs Python; a task file that is not a valid KernelBench module is still listed, and fails
// when it is evaluated.
//
// Thread safety: the functions here keep no state; they may run concurrently as long as
// nothing writes the files they read (import_ops_rows writes: one import per out_dir at a time).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::bench {

struct TaskEntry {
  std::string id;              // unique in the split; safe as a file name
  std::filesystem::path path;  // absolute path of model.py
  int level = 1;
  std::optional<double> atol;
  std::optional<double> rtol;
  std::string source = "own";  // "own", "kernelbench" or "ops"
  std::string sha256;          // SHA-256 of the task file, 64 lowercase hex digits
  std::string precision;       // empty: the run's policy; else "loose", "strict" or "tf32"
  bool degenerate = false;     // outputs (near) constant: a constant-output solution must not pass
  nlohmann::json extra = nlohmann::json::object();  // provenance, e.g. {ops, data_source, row}
};

struct Split {
  std::string name;
  std::string description;
  std::filesystem::path root;  // absolute folder the split was loaded from
  std::vector<TaskEntry> tasks;
};

// Reads the optional task.yaml beside a task's model.py into `entry` (level, atol, rtol,
// precision, degenerate; other keys are ignored). Throws Error naming the file and the field
// for bad values.
void read_task_sidecar(const std::filesystem::path& model_py, TaskEntry& entry);

// The one resolution of a task's tolerance and precision, used by every caller (verify, profile,
// evaluate, bench, eval, solve, train and the agent's verify.sh/profile.sh): the task's own
// atol, rtol and precision (its task.yaml, overridden by its split entry: `task` as load_split
// or read_task_sidecar made it) replace the run's, except keys the run pinned (set explicitly);
// the keys applied are pinned in turn, so a source read later (the task.yaml again, inside an
// episode) cannot undo them.
void apply_task_options(sandbox::SandboxOptions& options, const TaskEntry& task);
// The same for a task known only by its model.py (its task.yaml, if any).
void apply_task_options(sandbox::SandboxOptions& options, const std::filesystem::path& model_py);
// --set arguments that pin `options`' tolerance and precision in another process (the agent's
// check scripts): " --set sandbox.atol=... --set sandbox.rtol=... --set sandbox.precision=...".
std::string pinned_task_option_flags(const sandbox::SandboxOptions& options);

// The name a default run folder takes from a --split argument: its last component, whether the
// path ends in a slash or names split.yaml itself ("data/core/" and "data/core/split.yaml" are
// both "core"; "my_split.yaml" is "my_split").
std::string split_name(const std::string& split);

// Loads a split from its folder or its split.yaml. Throws Error naming the file and the field
// for malformed entries, unknown keys, duplicate ids and task files that do not exist or cannot
// be read.
Split load_split(const std::filesystem::path& path);

// The solution file for a task in a solutions folder: DIR/<id>/model_new.py or DIR/<id>.py.
// nullopt when neither exists.
std::optional<std::filesystem::path> find_solution(const std::filesystem::path& solutions_dir,
                                                   const std::string& task_id);

// A split as JSON, for run records and `--list` output:
//   {"name", "description", "root", "tasks": [{"id", "level", "path", "sha256", "source",
//    "precision", "atol", "rtol", "degenerate", "extra"}]}
// Unset optionals (atol, rtol, an empty precision) are null; paths are absolute strings.
nlohmann::json split_manifest(const Split& split);

// ---- kernelbench_loader.cpp ------------------------------------------------------------------

// Loads the KernelBench layout: `root` holds levelN/ folders (level1, level2, level3, any N >= 1)
// with task files named <number>_<Name>.py, e.g. level1/19_ReLU.py. Task ids are
// "L<level>_<number>_<Name>" with characters outside [A-Za-z0-9_.-] replaced by '_' (and a
// numeric suffix should two ids still collide); tasks are sorted by level, then by number. The
// split is named after the folder; extra holds {"file", "problem_id", "name"}. Other files and
// folders inside a levelN/ folder are skipped with a warning (logger "bench"); hidden entries
// and __pycache__ silently. task.yaml sidecars are not read (one folder holds many tasks).
// Throws Error naming `root` when it is not a folder, has no levelN/ folder, or has no task file.
Split load_kernelbench_dir(const std::filesystem::path& root);

// Loads whatever `path` is:
//   a folder with split.yaml, or a split.yaml / *.yaml / *.yml file  -> load_split
//   a folder with levelN/ subfolders                                  -> load_kernelbench_dir
//   a .jsonl, .json or .parquet file                                  -> import_ops_rows(path, import_dir)
// `import_dir` is used for the last form only (and must then be non-empty). Throws Error naming
// `path` and listing the accepted forms for anything else, including a path that does not exist.
Split load_any_split(const std::filesystem::path& path, const std::filesystem::path& import_dir);

// ---- ops_import.cpp --------------------------------------------------------------------------

// Imports CUDA-Agent-Ops-6K style rows into the project's own format and loads the result.
//
// `rows_file` is JSONL (one JSON object per line; blank lines are skipped), a .json file holding
// a JSON array of objects (a .json file whose first character is not '[' is read as JSONL), or
// .parquet (converted by a Python child process, $CUDA_AGENT_PYTHON or python3, with pyarrow or
// else pandas). Each row needs `code`: a string holding a whole KernelBench module, which must
// mention `class Model`, `get_inputs` and `get_init_inputs`. Optional columns: `ops` (a list or
// a string), `data_source` (a string), `level` (integer >= 1, default 1), `id` or else `name`
// (a string or an integer; default "row_<index>", index counted from 0 over the rows). Ids are
// made safe as file names (characters outside [A-Za-z0-9_.-] become '_', at most 100
// characters) and unique (a suffix _2, _3, ... in row order). Other columns are ignored.
//
// Writes out_dir/tasks/<id>/model.py (the code, byte for byte; files already equal are left
// untouched) and out_dir/split.yaml (name: the file's stem; every task with source "ops" and
// extra {ops, data_source, row}, null where a column is absent), then returns load_split(out_dir).
// Re-importing the same rows into the same out_dir is idempotent. For a task listed by an
// earlier import into out_dir and absent from this one, model.py is removed, and its folder
// when nothing else is left in it; nothing else in out_dir is touched.
//
// Throws Error, writing nothing, when the file cannot be read, a line is not valid JSON (naming
// the file and the line number), a row lacks what it needs (naming the row and, for JSONL, the
// line), parquet support is missing ("pip install pyarrow"), the file has no rows, or out_dir
// already holds a split.yaml that was not written by this function.
Split import_ops_rows(const std::filesystem::path& rows_file, const std::filesystem::path& out_dir);

}  // namespace cuda_agent::bench
