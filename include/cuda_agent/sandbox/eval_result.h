// The result of one evaluation, typed: what evaluate() returns to its caller and what the judge
// process writes. JSON only at the edges (the judge's result file, --json, bench's results/):
// to_json() writes the fields docs/results.md documents, from_json() reads them back.
//
// The fields the callers decide on (ok, category, correct, reward, speedups, timings, the task
// check) are typed; the reports meant for people (verify trials, provenance, kernel tables,
// runtime counters, versions, device) stay JSON objects, null when absent.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/timing_stats.h"

namespace cuda_agent {
struct SubprocessResult;
}

namespace cuda_agent::sandbox {

// Failure categories (result["category"]); docs/results.md, "Failure categories".
enum class Category {
  kNone,                 // ok
  kCompileError,         // NVRTC or nvcc rejected the source
  kLoadError,            // model_new.py failed to import / no ModelNew
  kInterfaceError,       // constructor or state_dict mismatch
  kRuntimeError,         // an exception in forward or a bad launch
  kIllegalMemoryAccess,  // the candidate's CUDA context died on a bad access
  kOutOfMemory,          // GPU or host memory
  kTimeout,              // the evaluation did not finish in time
  kCrash,                // a process died (signal)
  kMismatch,             // wrong values, shape, dtype, structure
  kForbiddenFallback,    // PyTorch or other foreign compute in forward (enforce)
  kPrecision,            // within atol/rtol but less precise than float32 (strict)
  kInputModified,        // forward wrote into its inputs
  kInvalidOutput,        // a tensor subclass, meta or storage-less output
  kNondeterministic,     // two runs on the same inputs disagree
  kTimingMismatch,       // an output produced while timed is wrong
  kTampering,            // the sandbox's state, channel, timing or result was interfered with
  kTaskError,            // the reference itself failed
  kTaskDependencyMissing,  // the task imports a Python package this environment lacks
  kTaskTooLarge,         // the task's tensors do not fit in the GPU's memory (the memory plan)
  kInfrastructure,       // no GPU, no torch, a broken set-up
  kGpuBusy,              // the GPU's lock stayed held by others (sandbox.gpu_wait_s): not scored
};

const char* to_string(Category category);                 // "mismatch"; "" for kNone
Category category_from_string(const std::string& name);  // "" or null -> kNone; throws Error on unknown
// The categories that mean the solution's answer or behaviour was wrong (correct = false).
bool is_wrong_answer(Category category);
// The categories that mean the task could not be evaluated, whatever the solution
// (task_error, task_dependency_missing, task_too_large; gpu_busy: the GPU stayed locked by other
// processes, another episode's commands say): the trainer masks such episodes.
bool is_task_fault(Category category);
// The same for a result's "category" field (a string, or null); an unknown name is not one.
bool is_task_fault(const nlohmann::json& category);

// How one process of an evaluation ended (the candidate's, or the judge's).
struct ProcessReport {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  bool memory_exceeded = false;
  int64_t peak_rss_bytes = 0;
  nlohmann::json to_json() const;
  static ProcessReport from_json(const nlohmann::json& j);
  // How a process run_subprocess ran ended.
  static ProcessReport of(const SubprocessResult& run);
};

struct TimingSummary {
  std::optional<TimingStats> eager, compile, candidate;
  bool baselines_cached = false;
  std::optional<std::string> compile_error;
  nlohmann::json to_json() const;
  static TimingSummary from_json(const nlohmann::json& j);
};

struct EvalResult {
  static constexpr int kSchemaVersion = 2;

  std::string task_id, task_path, task_sha256, solution_path, solution_sha256, mode;
  bool ok = false;
  Category category = Category::kNone;
  std::string message;
  std::optional<bool> correct;
  std::optional<double> reward;  // evaluate: the reward; any failure: -1; ok verify/profile: null
  std::string reward_kind;
  std::optional<double> speedup_vs_eager, speedup_vs_compile;
  std::string precision;
  nlohmann::json options;  // every resolved sandbox option
  std::map<std::string, double> phase_seconds;
  std::optional<int64_t> input_seed;
  std::optional<TimingSummary> timings;  // present when profiled
  std::string build_path;                // nvcc, nvrtc, vendor, python; empty before Python started

  // Reports (null when absent): verify, task_check, fallback, provenance, kernels, roofline,
  // timing_inputs, timing_check, versions, device, runtime, memory.
  nlohmann::json reports = nlohmann::json::object();

  // The process that ran the solution (the candidate's; the judge's when none was started).
  ProcessReport worker;
  int gpu = 0;
  std::string confine;  // sandbox.confine as requested
  bool confined = false;
  std::string unconfined_reason;
  // The candidate could not start confined and did unconfined: the machine cannot confine, and
  // later evaluations of the calling process skip the attempt (sandbox.confine: auto).
  bool confinement_unavailable = false;
  // The candidate process could not signal (kill) any process outside itself and what it
  // started: its judge, other evaluations' (Landlock's signal scope); else why not.
  bool signals_scoped = false;
  std::string signals_unscoped_reason;
  std::optional<ProcessReport> judge;  // the judge's own process
  std::string log;                     // failures: the tail of the processes' output
  double worker_seconds = 0;           // inside the judge
  double wall_seconds = 0;             // the whole evaluation

  // The task check judged the task degenerate (a trivial kernel could pass it).
  bool degenerate() const;
  // Fails the result: ok false, reward -1, correct false for wrong answers.
  void fail(Category category, std::string message);

  nlohmann::json to_json() const;
  // Throws Error when `j` is not a result object.
  static EvalResult from_json(const nlohmann::json& j);
};

}  // namespace cuda_agent::sandbox
