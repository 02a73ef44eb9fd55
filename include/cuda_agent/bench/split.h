// Benchmark splits: a named list of KernelBench-format tasks.
//
// The project's own format is a folder with split.yaml:
//
//   name: demo
//   description: ...
//   tasks:
//     - id: softmax_rows
//       path: tasks/softmax_rows/model.py   # relative to the folder
//       level: 1
//       atol: 1e-2                          # optional tolerance overrides
//       rtol: 1e-2
//
// A task's folder may also hold task.yaml (level, atol, rtol); split.yaml wins where both
// say something.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cuda_agent::bench {

struct TaskEntry {
  std::string id;
  std::filesystem::path path;  // absolute path of model.py
  int level = 1;
  std::optional<double> atol;
  std::optional<double> rtol;
};

struct Split {
  std::string name;
  std::string description;
  std::filesystem::path root;
  std::vector<TaskEntry> tasks;
};

// Reads the optional task.yaml beside a task's model.py into `entry` (level, atol, rtol).
// Throws Error naming the file and the field for bad values.
void read_task_sidecar(const std::filesystem::path& model_py, TaskEntry& entry);

// Loads a split from its folder or its split.yaml. Throws Error naming the file and the field
// for malformed entries, duplicate ids and task files that do not exist.
Split load_split(const std::filesystem::path& path);

// The solution file for a task in a solutions folder: DIR/<id>/model_new.py or DIR/<id>.py.
// nullopt when neither exists.
std::optional<std::filesystem::path> find_solution(const std::filesystem::path& solutions_dir,
                                                   const std::string& task_id);

}  // namespace cuda_agent::bench
