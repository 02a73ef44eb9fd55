// One evaluation of a solution against a task: verify (five seeded trials), profile (eager,
// torch.compile and the candidate, timed the same way) and the reward.
//
// evaluate() runs it in two fresh processes of this binary (docs/integrity.md, "Trust"):
//   the judge      loads the task, builds the reference, draws every input set right before the
//                  run that uses it, times the baselines, compares every output under the
//                  precision policy and writes the result, authenticated with a key only the
//                  caller and the judge hold. It never imports solution code.
//   the candidate  the only process that imports the solution: confined (sandbox.confine), it
//                  runs ModelNew.forward on inputs the judge hands it through shared memory and
//                  hands the outputs back. Its timings and kernel records are claims.
// A crash, hang or poisoned CUDA context ends those processes only; evaluate() always returns a
// result and never throws for anything the solution does. docs/results.md documents the result.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/sandbox/eval_result.h"

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
  // Kernel provenance from CUPTI in every run of the candidate's forward, verify and timed
  // (the authoritative check): off, warn (recorded in result["provenance"]) or enforce (kernels
  // the solution did not launch, or none of its own, fail with forbidden_fallback). Who launched
  // a kernel is decided by correlation (launch_origins.h), never by its name. provenance_allow:
  // identifiers of PyTorch's own fills and copies, allowed when torch's library launched them
  // and the identifier occurs in the kernel's name as a whole token.
  std::string provenance = "enforce";
  std::vector<std::string> provenance_allow = {"FillFunctor", "direct_copy_kernel_cuda", "CatArrayBatchedCopy",
                                               "CatArrayBatchedCopy_contig", "CatArrayBatchedCopy_alignedK_contig",
                                               "CatArrayBatchedCopy_vectorized"};
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
  bool record_kernels = true;        // CUPTI kernel table, GPU time per run, the span check
  bool use_baseline_cache = true;
  // Eager, torch.compile and the candidate are timed in interleaved rounds (docs/results.md,
  // "Timing"). The torch.compile baseline: "cached" times it in the rounds of the first
  // evaluation of a task and keeps it (with that evaluation's eager timing) in the baseline cache;
  // later evaluations time eager in their rounds and carry the cached torch.compile timing over by
  // eager's drift, and re-time it (and the cache entry) when that drift is beyond baseline_drift.
  // "fresh" times torch.compile in every evaluation's rounds (its compilation every time).
  std::string compile_baseline = "cached";
  double baseline_drift = 0.10;
  // Under a runner's GPU locks (EvalRequest::gpu_lock): whether a worker's Python and torch
  // start-up holds the GPU's quiet lock shared, so that no other worker's timed runs share the
  // host's CPUs with it. Off by default: on a host with cores to spare the timed runs do not
  // notice (docs/benchmarks.md), and the lock costs the bench a fifth of its rate.
  bool quiet_start = false;
  // Under a runner's GPU locks, a baselines judge (EvalMode::kBaselines, with profile_compile):
  // torch.compile compiles the reference (its first call, on the warm-up inputs, with at most an
  // eighth of the GPU's memory) while the judge holds the GPU's lock shared, beside other judges
  // compiling, and only the timing holds it exclusive. Compilation is CPU work, and most of a
  // baseline's 13-16 s in the exclusive lock (its `profile` phase on an H100, 2026-12-05; the
  // compilation was not timed apart). On since measured (H100, 2026-12-05, ten tasks' baselines,
  // four judges: the `profile` phase in the exclusive lock 2.53 -> 0.58 s median, the same wall).
  // A judge waiting for the exclusive lock holds a CUDA context and its reference's weights,
  // which other evaluations' memory plans see as used.
  bool compile_before_lock = true;
  // Under a runner's GPU locks, any GPU evaluation: the judge and the candidate process initialise
  // CUDA (both contexts, torch's CUDA state: the `cuda_init` phase, about 0.5 s on an H100) while
  // the judge holds the GPU's lock shared, beside other evaluations doing the same, and take it
  // exclusive only for the task, the memory plan, the solution and the runs. No solution code has
  // run by then. Off: measured on an H100 (2026-12-06, docs/benchmarks.md section 11) it raised
  // four evaluations in flight from 21.0 to 22.4 a minute, within the runs' noise (the shared
  // starts keep the exclusive taker waiting meanwhile), and each evaluation waiting for the
  // exclusive lock holds two CUDA contexts, which the memory plan of the one holding it sees as
  // used. (Shared holders arriving one after another cannot keep an exclusive taker waiting
  // without end: the GPU's lock has a turnstile, GpuLock.)
  bool init_before_lock = false;
  // Under a runner's GPU locks, a solution whose import builds with nvcc (load_inline, load, a
  // kernels/ folder: tens of seconds each) is first imported by a process of its own, confined
  // as the candidate but without the GPUs' device nodes, before the judge waits for the GPU's
  // lock; the candidate's import in the exclusive lock then finds the builds done. Without it the
  // builds run in the exclusive lock, and every evaluation of the GPU waits for them. Unconfined
  // candidates build in the lock as before (nothing would keep that process off the GPU).
  bool prebuild = true;
  // The judge's bracket of the candidate's timed runs (judge_bracket.h): each run's sample is at
  // least the GPU time the judge's own CUDA context saw it take, less the calibrated cost of the
  // hand-overs (docs/integrity.md, "Trust"). On the GPU, for evaluations that time.
  bool judge_bracket = true;
  // The slice watch beside the judge's timed runs of eager and torch.compile (timer.h): the
  // stretches in which the GPU ran another process's context instead of the judge's (a kernel the
  // candidate process keeps running, say) are taken off each baseline sample (reports.timing.
  // slice_watch). On the GPU.
  bool slice_watch = true;
  // Judge processes a process keeps started ahead of its evaluations, per GPU (judge_pool.h):
  // Python and torch imported, CUDA untouched, each taking one evaluation and exiting. From a
  // process's second evaluation on; 0: each evaluation starts its own judge.
  int warm_workers = 2;
  // reward
  std::string reward = "milestone";  // milestone: {-1,1,2,3}; raw_speedup: speedup vs torch.compile
  double speedup_margin = 0.05;      // "faster" means more than 5% faster
  // How the milestone reward decides "faster": "interval" (the lower end of the speedup's 95%
  // interval above 1 + margin: faster with confidence), "point" (the point estimate above it: the
  // CUDA Agent paper's rule).
  std::string reward_rule = "interval";
  // isolation
  double timeout_s = 600;            // wall time of one worker, torch.compile included
  // The longest one forward of the loaded solution may take, the harness's work around it
  // included: each call of verify's trials, the pre-runs and the timed runs (the warm-up:
  // warmup_runs of them, plus warmup_ms). Those calls run in the GPU's exclusive lock, so an
  // endless kernel would otherwise hold every other evaluation of the GPU for up to timeout_s.
  // Past it the candidate is stopped and the evaluation ends as `timeout`. 0: timeout_s alone.
  // The solution's load (its nvcc builds) is not a forward: timeout_s bounds it.
  double forward_timeout_s = 60;
  // At most this long, in all, an evaluation waits for the GPU's locks (EvalRequest::gpu_lock),
  // not counted in timeout_s; past it the evaluation ends as gpu_busy (not scored).
  double gpu_wait_s = 1800;
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
  // What a confined candidate, and an agent episode's confined Bash, may read: "all" (the whole
  // file system, read-only, but for the hidden answers, the run's folder and the cache's key) or
  // "system" (only the system's folders, the embedded Python's, the task's and the solution's
  // folders and their own: sandbox::read_scope_system_paths; a copy of an answer anywhere else,
  // an earlier run's folder, a clone of the repository, cannot be read). The default.
  std::string read_scope = "system";
  // Keys the run set explicitly (its --config file's sandbox section, --set sandbox.KEY=...):
  // a task's own tolerance and precision (bench::apply_task_options) do not override them.
  // Not part of to_json.
  std::set<std::string> pinned;

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
  // held until the worker exits, so GPU phases run one at a time; and the quiet lock, exclusive
  // while timing (and, with options.quiet_start, shared while torch is imported, so that no
  // worker starts up beside another's timed runs). Lets a runner start the next worker while the current one runs. Other work on
  // the GPU that must not run beside timed runs holds the quiet lock shared (GpuLock in
  // worker_confinement.h): the RL trainer while it generates beside its episodes' evaluations.
  bool gpu_lock = false;
  // Folders the candidate must not read (an agent episode's run folder: the other episodes'
  // solutions, the teacher's demonstrations), but for the solution's and the task's own folders
  // inside them. The task's answers (answer_directories()) are hidden without being named here.
  std::vector<std::string> hidden_paths;
  SandboxOptions options;
  // Set by evaluate() for its judge, not by other callers: whether the judge starts the
  // candidate process confined (false when sandbox.confine is off, or this process already
  // found that confinement does not work here), and why not.
  bool confine_candidate = true;
  std::string unconfined_reason;
  // Set by evaluate() under confine: auto once a candidate of this process ran confined: a
  // confined start that fails now is not taken for the machine's inability (a GPU full for a
  // moment, something a policy's command used up), so the judge does not start it again
  // unconfined; the evaluation ends as infrastructure_error.
  bool confine_required = false;

  nlohmann::json to_json() const;
  static EvalRequest from_json(const nlohmann::json& j);
};

// SHA-256 over what a solution's result depends on: model_new.py and every other file of its
// folder, recursively (relative paths and contents in path order, a link by its target; hidden
// entries and __pycache__ included: the program may read them): helpers it imports and kernels/
// alike. A folder of more than
// 4096 files or 64 MiB gets a fingerprint of its own each time (nothing cached is shared with
// it). It names the solution's cache folders and lets a bench's --resume reuse a result. Empty
// when model_new.py is unreadable.
std::string solution_fingerprint(const std::string& solution_path);

// A result that names the request (task, solution and their digests, mode, options, GPU) with
// reward -1 and nothing measured: where the judge's result starts, and the caller's when no
// judge result comes back.
EvalResult result_header(const EvalRequest& request);

// Runs the request in a judge process and its candidate process and returns the result.
// Thread-safe; never throws for anything the solution or task does. Under options.confine
// "auto", the first candidate that cannot be confined for a reason of this machine's (the
// namespaces cannot be set up, or CUDA, Python or torch fails inside them while it works
// outside) makes this and every later evaluation of the process run candidates unconfined, with
// the reason in the result (worker.unconfined_reason); unless a candidate of the process ran
// confined before: then the failed start is an infrastructure_error (settle_confinement).
EvalResult evaluate(const EvalRequest& request);

// Under options.confine "auto", settles whether this process's candidates run confined before
// anything untrusted runs beside its evaluations (a trainer's episodes, a bench's solutions): one
// evaluation of a built-in one-line task whose candidate only has to start. Once a candidate ran
// confined, a later confined start that fails is an infrastructure_error, never retried
// unconfined (evaluate()): a failure someone else's code caused for a moment cannot take the
// confinement off. Returns what it found, for the caller's log (empty when there was nothing to
// settle: confine is not auto, it is settled already, or the process runs inside the agent's
// confined shell). Never throws.
std::string settle_confinement(const SandboxOptions& options, const std::string& device, int gpu, bool gpu_lock);

// How a judge process came by its request (run_judge_worker).
struct JudgeStart {
  // Where the result's key is read, a line of hex, after the candidate process is forked (the
  // copy must never hold it); -1: none (a result nobody can verify).
  int key_fd = -1;
  // Python's start-up after the request was sent (the rest was done before: a warm worker),
  // counted in phase_seconds.python_start.
  double python_start_s = 0;
  // It was started before the request was sent (a warm judge, judge_pool.h).
  bool warm = false;
};

// The judge's body: runs the request, writing progress beside result_path and the result to
// result_path with its MAC (keyed by the key, see JudgeStart) to result_path + ".mac". Returns
// the result.
EvalResult run_judge_process(const EvalRequest& request, const std::string& result_path, const JudgeStart& start = {});

// The judge process (`cuda-agent worker --judge`, judge_pool.h): starts Python and imports
// torch (holding GPU `quiet_gpu`'s quiet lock shared meanwhile when >= 0), then reads its job
// from descriptor 3, one line of JSON (request, result, log: file paths; sent_ns: when the
// caller sent it, CLOCK_MONOTONIC), followed by the result key's line, and runs it. Ends with
// exit code 0 without running anything when descriptor 3 closes first. Returns the exit code.
int run_judge_worker(int quiet_gpu);

// The candidate process's body (`cuda-agent worker --candidate REQUEST`, the judge's channel as
// descriptor 3). Returns the process's exit code.
int run_candidate_process(const std::string& request_path);

}  // namespace cuda_agent::sandbox
