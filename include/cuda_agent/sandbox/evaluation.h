// One evaluation of a solution against a task: verify (five seeded trials), profile (eager,
// torch.compile and the candidate, timed the same way) and the reward.
//
// evaluate() runs it in a fresh worker process of this binary (isolation: a crash, hang or
// poisoned CUDA context ends that worker only) and always returns a result JSON; it never
// throws for anything the solution does. run_evaluation_in_process() is the worker's side.
// docs/results.md documents every field of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct SandboxOptions {
  // verify
  int trials = 5;
  int64_t seed = 42;                 // trial i uses seed + i; the model weights use seed
  double atol = 1e-2;
  double rtol = 1e-2;
  // Precision policy, recorded in every result (docs/results.md, "Precision"):
  //   strict (default) atol/rtol, and the candidate's error against a float64 reference within strict_factor x the
  //          float32 reference's own error (at least strict_floor): TF32/fp16 shortcuts fail;
  //   loose  atol/rtol only (KernelBench's and the CUDA Agent paper's setting);
  //   tf32   baselines run with TF32 enabled too, compared with atol/rtol.
  std::string precision = "strict";
  double strict_factor = 8.0;
  double strict_floor = 1e-5;
  // The Python-level fallback guard around ModelNew.forward during verify: off, warn (record
  // PyTorch compute calls in the result) or enforce (fail with forbidden_fallback).
  std::string fallback = "warn";
  // Kernel provenance from CUPTI during verify (the authoritative check): off, warn (recorded in
  // result["provenance"]) or enforce (kernels the solution did not compile, or none of its own,
  // fail with forbidden_fallback). provenance_allow: kernel-name substrings that are allowed
  // (fills and copies by default).
  std::string provenance = "enforce";
  std::vector<std::string> provenance_allow = {"FillFunctor", "direct_copy_kernel", "copy_kernel",
                                               "CatArrayBatchedCopy_contig"};
  // Inputs unchanged, plain-tensor outputs, poisoned free memory, a second run that must agree,
  // no patched timing/comparison functions, threads or persisting-L2 settings left behind.
  bool integrity_checks = true;
  // Verify's trial seeds and the profiling inputs' seed are drawn at random per evaluation (and
  // recorded as result["input_seed"]), so a solution cannot precompute outputs; false uses seed.
  bool secret_seeds = true;
  // profile
  int warmup_runs = 3;
  double warmup_ms = 100;            // keep warming up until this much time has passed
  int timed_runs = 20;
  bool flush_l2 = true;
  std::string compile_mode = "default";  // torch.compile mode: default, reduce-overhead, max-autotune, ...
  bool profile_compile = true;       // time torch.compile as a baseline
  bool record_kernels = true;        // CUPTI kernel table
  bool use_baseline_cache = true;
  // reward
  std::string reward = "milestone";  // milestone: {-1,1,2,3}; raw_speedup: speedup vs torch.compile
  double speedup_margin = 0.05;      // "faster" means more than 5% faster
  // isolation
  double timeout_s = 600;            // wall time of one worker, torch.compile included
  double host_memory_gb = 32;        // resident memory of one worker's process group
  double gpu_memory_fraction = 0.9;  // torch.cuda.set_per_process_memory_fraction
  std::string cache_dir;             // empty: default_cache_dir() ($CUDA_AGENT_CACHE_DIR, $XDG_CACHE_HOME/cuda-agent or ~/.cache/cuda-agent)
  // OS confinement of the worker (sandbox/worker_confinement.h): user, mount, network and IPC
  // namespaces; the file system read-only except the worker's result folder, the cache, the GPU
  // lock files and a private /tmp; no network. "auto" confines where namespaces work on this
  // machine and runs unconfined (recording why) where they do not, or where CUDA does not start
  // inside them; "namespaces" requires it (an infrastructure_error otherwise); "off" never
  // confines. Every result records the outcome in result["worker"]["confined"].
  std::string confine = "auto";

  static nlohmann::json defaults();  // the fields above as JSON, for config merging
  static SandboxOptions from_json(const nlohmann::json& j);  // j already merged onto defaults()
  nlohmann::json to_json() const;
  std::string resolved_cache_dir() const;
};

// kBaselines: time eager and torch.compile only (into the baseline cache); no solution.
enum class EvalMode { kVerify, kProfile, kEvaluate, kBaselines };
const char* to_string(EvalMode mode);
EvalMode eval_mode_from_string(const std::string& s);

struct EvalRequest {
  std::string task_path;      // model.py (KernelBench format)
  std::string solution_path;  // model_new.py (its folder may hold kernels/)
  std::string task_id;        // for reports; defaults to the task folder's name
  EvalMode mode = EvalMode::kEvaluate;
  std::string device = "cuda";  // "cpu": verify only, for machines without a GPU
  int gpu = 0;                  // physical GPU index the worker is pinned to
  // Take this GPU's locks (files in the temporary directory, shared by every run of this user
  // on the host): the GPU lock after Python and torch are imported and before CUDA is touched,
  // held until the worker exits, so GPU phases run one at a time; and the quiet lock, shared
  // while torch is imported and exclusive while timing, so no worker starts up beside another's
  // timed runs. Lets a runner start the next worker while the current one runs. Other work on
  // the GPU that must not run beside timed runs holds the quiet lock shared (GpuLock in
  // worker_confinement.h): the RL trainer while it generates beside its episodes' evaluations.
  bool gpu_lock = false;
  SandboxOptions options;
  // Set by evaluate() for its worker, not by other callers: confine the worker process first
  // thing, and report the end of its start-up on this descriptor (worker_confinement.h).
  bool confine_worker = false;
  int status_fd = -1;

  nlohmann::json to_json() const;
  static EvalRequest from_json(const nlohmann::json& j);
};

// Failure categories of a result (result["category"]).
namespace category {
inline constexpr const char* kCompileError = "compile_error";      // NVRTC or nvcc rejected the source
inline constexpr const char* kLoadError = "load_error";            // model_new.py failed to import / no ModelNew
inline constexpr const char* kInterfaceError = "interface_error";  // constructor or state_dict mismatch
inline constexpr const char* kRuntimeError = "runtime_error";      // an exception in forward or a bad launch
inline constexpr const char* kIllegalMemoryAccess = "illegal_memory_access";
inline constexpr const char* kOutOfMemory = "out_of_memory";
inline constexpr const char* kTimeout = "timeout";
inline constexpr const char* kCrash = "crash";                     // the worker died (signal)
inline constexpr const char* kMismatch = "mismatch";               // wrong values, shape, dtype, structure
inline constexpr const char* kForbiddenFallback = "forbidden_fallback";  // PyTorch compute in forward (enforce)
inline constexpr const char* kPrecision = "precision";             // within atol/rtol but less precise than fp32 (strict)
inline constexpr const char* kInputModified = "input_modified";    // forward wrote into its inputs
inline constexpr const char* kInvalidOutput = "invalid_output";    // a tensor subclass, meta or storage-less output
inline constexpr const char* kNondeterministic = "nondeterministic";  // two runs on the same inputs disagree
inline constexpr const char* kTimingMismatch = "timing_mismatch";  // an output produced while timed is wrong
inline constexpr const char* kTampering = "tampering";             // patched timers/comparisons, threads, persisting L2
inline constexpr const char* kTaskError = "task_error";            // the reference itself failed
inline constexpr const char* kInfrastructure = "infrastructure_error";  // no GPU, no torch, ...
}  // namespace category

// SHA-256 over what a solution's result depends on: model_new.py and, when present, every file
// of its kernels/ folder (names and contents, in name order). Empty when unreadable.
std::string solution_fingerprint(const std::string& solution_path);

// Runs the request in a worker process and returns its result. Thread-safe; never throws for
// anything the solution or task does. Under options.confine "auto", the first worker that cannot
// be confined for a reason of this machine's (the namespaces cannot be set up, or CUDA, Python
// or torch fails inside them while it works outside) makes this and every later evaluation of
// the process run unconfined, with the reason in result["worker"]["unconfined_reason"].
nlohmann::json evaluate(const EvalRequest& request);

// The worker's body: runs the request in this process, writing progress beside result_path.
// Returns the result (also written to result_path).
nlohmann::json run_evaluation_in_process(const EvalRequest& request, const std::string& result_path);

}  // namespace cuda_agent::sandbox
