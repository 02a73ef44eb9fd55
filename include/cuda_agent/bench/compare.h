// `cuda-agent bench compare A B`: two bench runs side by side, per task and per level.
//
// A run is a folder written by `cuda-agent bench` (its --output): results/<id>.json, one result
// per task. Tasks are matched by task_id (the file name without .json when a result has no
// task_id). Each task gets one change, judged from A to B:
//
//   only_a   the task has a result in A only        only_b  in B only
//   fixed    not passing in A, passing in B         broke   passing in A, not passing in B
//   faster   passing in both, both have speedup_vs_eager, and B / A > 1.05
//   slower   passing in both, both have speedup_vs_eager, and B / A < 0.95
//   same     anything else: both fail (whatever the categories), or both pass within 5%, or a
//            speedup is missing on one side
//
// "passing" is bench/metrics.h's: ok == true and correct == true. Each run's metrics are over
// its own results, so a task present in one run only counts in that run's denominators.
//
// Thread-safe (reads files only).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::bench {

// Ratio of speedups beyond which a passing task counts as faster or slower (5%).
inline constexpr double kCompareSpeedupTolerance = 0.05;

// Reads every results/*.json of a run folder, sorted by file name; a result without a string
// task_id gets the file name without .json as its task_id. Throws Error naming the folder when
// it has no results/ folder, and naming the file when one is not valid JSON, not a JSON object,
// or shares its task_id with another file.
nlohmann::json load_run_results(const std::filesystem::path& run_dir);

// Compares two run folders. Returns
//   {"run_a": path, "run_b": path,
//    "tasks": [{"id", "level", "a": side or null, "b": side or null, "change"}, ...] (by id),
//    "metrics": {"a": compute_metrics(A), "b": compute_metrics(B)},
//    "changes": {"fixed": n, "broke": n, "faster": n, "slower": n, "same": n, "only_a": n, "only_b": n}}
// where side = {"result": "pass" or category, "reward", "speedup_vs_eager", "speedup_vs_compile"}
// (null where absent) and level is A's level key, else B's (see level_key in metrics.h).
// Throws Error as load_run_results.
nlohmann::json compare_runs(const std::filesystem::path& run_a, const std::filesystem::path& run_b);

// The comparison as Markdown: the change counts, then one table per level and overall with
// rows pass rate, faster-than rates, geomeans (both conventions), fast_1.0 and mean reward, and
// columns A, B and delta (B - A; rates in percentage points), then the per-task table.
std::string render_compare_md(const nlohmann::json& comparison);

}  // namespace cuda_agent::bench
