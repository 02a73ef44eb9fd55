// `cuda-agent bench`: score the solutions of a split, one worker process per evaluation,
// the tasks spread over the chosen GPUs (one evaluation at a time per GPU).
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::bench {

struct BenchOptions {
  std::filesystem::path split;          // folder with split.yaml, or the file
  std::filesystem::path solutions;      // DIR/<task id>/model_new.py or DIR/<task id>.py
  std::filesystem::path output_dir;     // results/<id>.json, summary.json, results.md
  std::vector<int> gpus = {0};
  // "cpu": verify-only evaluations without a GPU (tests, `synth` on a machine without one); each
  // entry of `gpus` is then one more worker slot.
  std::string device = "cuda";
  // Worker processes in flight per GPU. With 2, the next worker imports torch while the current
  // one compiles and verifies; the workers' GPU locks (EvalRequest::gpu_lock) keep GPU phases one
  // at a time and keep a starting worker from running beside timed runs. 2 is the default: an
  // A/B run on one H200 gave the same candidate timings as 1 (geomean ratio 0.99) at 1.35x the
  // evaluations per minute (docs/benchmarks.md, section 5).
  int workers_per_gpu = 2;
  // The workers' GPU locks (above). Off, evaluations share the GPU whole, timed runs included:
  // their timings are then loads, not benchmarks (`synth`'s eager-time window takes that).
  bool gpu_lock = true;
  bool resume = true;                   // skip tasks whose result for the same files exists
  bool interactive_progress = false;    // redraw the progress bar in place (a terminal)
  // kEvaluate scores solutions; kBaselines only times eager and torch.compile per task into
  // the shared baseline cache (`cuda-agent baselines`), so later benches reuse them.
  sandbox::EvalMode mode = sandbox::EvalMode::kEvaluate;
  // On a GPU, when scoring solutions: every task's baselines timed into the scoring cache first,
  // by judges without a candidate (time_baselines_first), so that no eager or torch.compile
  // timing (Inductor's autotuning included) runs beside a solution's process; false (`bench
  // --baselines lazy`): each evaluation times the baselines it does not find, beside its candidate.
  bool baselines_first = true;
  // Not empty: the split's tasks of these ids alone (time_baselines_first's run of the tasks the
  // scoring cache lacks).
  std::vector<std::string> only_tasks;
  sandbox::SandboxOptions sandbox;
};

// On a GPU, the baselines (eager, torch.compile) of those tasks of `split` (the tasks of
// `options.split` that the caller will evaluate) that the scoring cache lacks, timed into it by a
// `baselines` run of them alone (options.mode and options.only_tasks set so) into
// `options.output_dir`; nothing where the cache holds them all or is off
// (sandbox.use_baseline_cache). One line of what it did goes to `progress`, after `tag`
// ("[bench]", "[eval]").
void time_baselines_first(BenchOptions options, const Split& split, std::ostream& progress, const std::string& tag);

// Runs the split and returns {"split", "results": [...], "summary": {...}}. Progress lines
// go to `progress`. Tasks without a solution are reported as missing and score -1. Throws
// Error only for bad options (missing split, unreadable folders).
nlohmann::json run_bench(const BenchOptions& options, std::ostream& progress);

// Pass rate, mean reward, faster-than-eager/compile counts and geometric-mean speedups over
// the correct results (failed tasks listed by category).
nlohmann::json summarize(const nlohmann::json& results);

// The table of a baselines run: eager and torch.compile medians per task, cached or measured.
std::string format_baselines_table(const nlohmann::json& results);

// The result table as Markdown: one row per task, then the summary.
std::string format_table(const nlohmann::json& results, const nlohmann::json& summary);

}  // namespace cuda_agent::bench
