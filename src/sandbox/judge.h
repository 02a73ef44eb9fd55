// The judge: the trusted process of an evaluation. It loads the task, builds the reference,
// draws every input set right before the run that uses it, times the baselines, hands inputs to
// the candidate process through a shared block, compares every output the candidate produces
// under the precision policy, and writes the authenticated result. It never imports solution
// code. Internal to the sandbox library; judge_process.cpp runs the phases, judge_verify.cpp
// and judge_profile.cpp are two of them. Call with the GIL held.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "candidate_client.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/compare.h"
#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/kernel_provenance.h"
#include "cuda_agent/sandbox/memory_plan.h"
#include "cuda_agent/sandbox/shared_block.h"
#include "cuda_agent/sandbox/timing_stats.h"
#include "judge_bracket.h"

namespace cuda_agent::sandbox {

// What the judge makes of one run of the candidate's forward. Hidden visibility, as pybind11
// requires for types holding Python objects (and Judge below).
struct __attribute__((visibility("hidden"))) CandidateRun {
  double ms = 0;               // the candidate process's claim
  double host_ms = 0;          // its claim of the forward's host time
  bool joined = true;          // its claim that every stream was joined to the timing stream
  bool held = true;            // its claim that the host, not the timeout, released the hold (timer.h)
  double round_trip_ms = 0;    // the judge's own clock: inputs sent to outputs back
  // The judge's bracket of the run (judge_bracket.h): its span, go event to end event; 0 where the
  // run had none.
  double bracket_ms = 0;
  pybind11::object outputs;    // views into the output block: compare before the next run
  std::vector<KernelUse> kernels;  // what ran inside the forward, by origin (claims)
  nlohmann::json reply;
};

// The flags of one run: verify's runs are watched closer (guard, poisoned memory, every check).
struct RunFlags {
  bool guard = false;
  bool poison = false;
  bool full_checks = false;
  // The run's kernel records come later, with every deferred run's (report_deferred_runs()):
  // the candidate process flushes CUPTI's buffers once, after the timed runs, not after each.
  bool defer_report = false;
  // In the judge's bracket (judge_bracket.h), where the evaluation has one.
  bool bracket = false;
};

struct __attribute__((visibility("hidden"))) Judge {
  using Clock = std::chrono::steady_clock;

  Judge(const EvalRequest& request, const SandboxOptions& options, EvalResult& out)
      : req(request), opt(options), result(out) {}

  const EvalRequest& req;
  const SandboxOptions& opt;
  EvalResult& result;
  bool gpu = false;
  std::string device = "cpu";
  Clock::time_point deadline;
  // The seed of input set k: k < trials the verify trials, k = trials the warm-up, trials + 1 + r
  // timed round r (input_seed). Secret seeds (the default): each set's seed is drawn at random
  // when first used, 63 bits, independent of every other set's, so that a solution that finds one
  // set's seed from its inputs (torch's CPU generator and NumPy keep 32 bits of a seed; a 30-bit
  // base with consecutive seeds, as before 2026-12-06, could be searched on the GPU) learns
  // nothing of the sets to come. Otherwise opt.seed + k.
  int64_t input_seed(int64_t k);
  std::vector<int64_t> drawn_seeds;

  pybind11::module_ task;
  pybind11::object init_inputs, reference;
  // torch.compile's model of the reference, compiled before the GPU's exclusive lock
  // (judge_precompile_baseline); null when it was not.
  pybind11::object precompiled;
  pybind11::object reference64;  // strict: float64 copy of the reference, built on first use
  // Why no float64 reference could run (strict then compares as loose; recorded); "" if it ran.
  std::string reference64_unavailable;
  // The float64 reference has run to the end in this evaluation (the memory plan's, a trial's):
  // once the solution's code has started too, a failure of it is the solution's (runtime_error),
  // not a task without a float64 path: a solution that took the GPU's memory from under it would
  // otherwise turn strict into loose for the rest of the evaluation.
  bool reference64_ran = false;
  CandidateClient* candidate = nullptr;

  // The solution's code has started running (its load), and the reference has run to the end
  // in this evaluation (the memory plan's forward, a verify trial). Once both hold, a failure of
  // the reference or of staging its inputs is not the task's (task_error, which the trainer
  // masks): the task ran, and what changed since is the solution's process beside it (its GPU
  // memory, say). run_judge_process charges it to the solution (runtime_error).
  bool solution_started = false;
  bool reference_ran = false;

  // The baselines this evaluation timed beside the candidate (eager, torch.compile), for the
  // baseline cache: written by run_judge_process only once the evaluation has ended well, after
  // the candidate's last audits, so that a solution charged for disturbing its judge leaves no
  // timing of its making in the cache.
  std::optional<std::pair<BaselineKey, nlohmann::json>> baselines_to_cache;

  // The memory plan (judge_plan_memory), and the least device memory seen free since.
  std::optional<MemoryPlan> plan;
  int64_t min_free_bytes = -1;

  // Provenance over every run of the candidate (verify and timed), enforced per run.
  ProvenanceReport provenance;
  std::vector<KernelUse> timed_kernels;  // the candidate's, inside the timed runs
  // The candidate process's PyTorch settings after the solution loaded (its warm-up reply: a claim).
  nlohmann::json candidate_backends;

  // The bracket of the candidate's timed runs (sandbox.judge_bracket on the GPU): made and
  // calibrated before the solution loads (calibrate_bracket()); null without one.
  std::unique_ptr<JudgeBracket> bracket;
  BracketCalibration bracket_calibration;
  // Whether this evaluation's timed runs are bracketed: a candidate's, on the GPU, timed
  // (not verify), under sandbox.judge_bracket.
  bool wants_bracket() const {
    return candidate != nullptr && gpu && opt.judge_bracket && req.mode != EvalMode::kVerify;
  }
  // Empty bracketed runs of the candidate process, its harness alone, each copying the
  // reference's output bytes (the memory plan's): the calibration. Before the solution loads.
  void calibrate_bracket();

  double remaining() const;
  // One call of the candidate that runs `forwards` forwards of the loaded solution (plus
  // `extra_s`): bounded by sandbox.forward_timeout_s a forward as well as by the evaluation's
  // deadline, so that a hung kernel does not keep the GPU's exclusive lock to the deadline. A call
  // stopped by that bound is a `timeout` naming the option. Throws Failure.
  // `call` (given the call's timeout) in place of the candidate's call().
  nlohmann::json call_forwards(const std::string& where, const nlohmann::json& op, const std::string& expect,
                               int forwards, double extra_s = 0,
                               const std::function<nlohmann::json(double)>& call = nullptr);
  // One call of the candidate's harness that runs no solution code of its own (sharing blocks,
  // reporting kernel records, the integrity checks at the end): work of well under a second,
  // bounded by sandbox.forward_timeout_s as well as by the deadline, so that what the solution
  // left running (GPU work of a context of its own that CUPTI's flush waits on, a lock, a
  // thread) cannot keep the GPU's exclusive lock to the deadline. Throws Failure.
  nlohmann::json call_harness(const std::string& where, const nlohmann::json& op, const std::string& expect,
                              const std::vector<int>& fds = {});
  // The solution's load ("load": its import, ModelNew(...)): solution code in the GPU's exclusive
  // lock. Bounded by kLoadForwards times sandbox.forward_timeout_s, plus `extra_s` (twice what the
  // prebuild's import took, in case the candidate builds again), where no nvcc build is left to
  // make in it (`builds_left` false: none, or the prebuild made them), so that an import that
  // hangs (an endless kernel it waits for, a loop) does not hold the lock to the deadline; by the
  // deadline alone where builds of tens of seconds each may still run. Throws Failure.
  static constexpr int kLoadForwards = 2;
  nlohmann::json call_load(const nlohmann::json& op, bool builds_left, double extra_s);

  // The reference's output on a clone of `inputs` (synchronized; the cache released under a plan
  // that says so). `view_of_input` (may be null): the path of an output that is a view of the
  // inputs the reference ran on (task_check.h's view_of_input), "" when none is.
  void reference_outputs(pybind11::handle inputs, pybind11::object* out, std::string* view_of_input = nullptr);
  // Runs the candidate's forward on a staged copy of `inputs`; checks what the judge can check
  // without the reference (the reply, provenance, work outside forward, tampering, inputs left
  // as given). `where` prefixes failure messages. Throws Failure.
  CandidateRun run_candidate(pybind11::handle inputs, const RunFlags& flags, const std::string& where);
  // Compares the candidate's outputs with the reference's under the precision policy.
  CompareResult compare(pybind11::handle ref, pybind11::handle ref64, pybind11::handle outputs) const;
  // The kernel records of the runs since the last report, `wheres` naming them: provenance per
  // run, work outside the forwards, host copies. Adds the runs' kernels to timed_kernels. Returns
  // each run's GPU activity (the candidate's claims: busy and span).
  std::vector<GpuActivity> report_deferred_runs(const std::vector<std::string>& wheres);
  // Classifies one run's kernels into `provenance`; under provenance: enforce, a run that
  // violates it throws Failure (forbidden_fallback) naming `where`.
  void enforce_provenance(const std::vector<KernelUse>& uses, uint64_t host_copy_bytes, const std::string& where);
  // The audit of a reply's kernel records (under integrity checks or enforced provenance): dropped
  // records (infrastructure), a missing probe record or launches without a record (tampering:
  // the auditor blinded), and, under integrity checks, kernels of the candidate's in "outside"
  // (they ran `when`: while no forward was running, after the last one). Throws Failure naming
  // `where`.
  void audit_records(const nlohmann::json& reply, const std::string& where, const std::string& when) const;
  // What the candidate process did while it waited for the judge (the finish reply's "idle": its
  // CPU and wall seconds from the solution's load on): recorded (reports.candidate_idle); under
  // integrity checks, CPU beyond kIdleCpuShare of the wait (and kIdleCpuFloorS) is tampering:
  // threads of the solution's ran beside the judge's work, its timing of the baselines included.
  // Throws Failure.
  void audit_idle(const nlohmann::json& finished);
  static constexpr double kIdleCpuShare = 0.25, kIdleCpuFloorS = 0.05;
  // Untimed forwards of the candidate on a staged copy of `inputs` (the warm-up); checks for work
  // outside them. `keep`: the candidate keeps its own copy of the inputs for pre_run_candidate().
  // Throws Failure.
  void warm_up_candidate(pybind11::handle inputs, bool keep = false);
  // One untimed forward of the candidate on its copy of the warm-up inputs, right before a timed
  // run's inputs are staged (so that nothing of them exists while it runs). Throws Failure.
  void pre_run_candidate(const std::string& where);
  // Room for outputs `like` the reference's in the output block (grown when too small), sized
  // by the memory plan.
  void reserve_outputs(pybind11::handle like);
  // The float64 reference's outputs on `inputs`; None unless the precision is strict, and when the
  // task's model cannot run in float64 (recorded in reports.reference64; strict then compares as
  // loose).
  pybind11::object float64_outputs(pybind11::handle inputs);
  // Under a plan that says so: torch's cached memory handed back, so the other process has it.
  void release_cached();
  // Notes the device's free memory (the result's memory.peak.device_min_free_bytes);
  // judge_memory.cpp.
  void note_free();
  int64_t shared_block_bytes() const {
    return static_cast<int64_t>((in_block_ ? in_block_->bytes() : 0) + (out_block_ ? out_block_->bytes() : 0));
  }

 private:
  // Stages `inputs` into the input block, or, `deferred` (a bracketed run), only their spec and
  // padding: the bracket copies their bytes in once the run is queued (bracket_inputs_).
  nlohmann::json stage(pybind11::handle inputs, bool deferred = false);
  // call_forwards() for an op in the bracket: the judge's half queued when the candidate says its
  // run is queued (judge_bracket.h); *span_ms the bracket's span, *held (when given) whether the
  // message came before the hold's timeout. Throws Failure.
  nlohmann::json call_in_bracket(const std::string& where, nlohmann::json op, const std::string& expect, int forwards,
                                 size_t out_bytes, double* span_ms, bool* held);
  void send_blocks(bool input, bool output);
  std::unique_ptr<SharedBlock> in_block_, out_block_;
  pybind11::object in_tensor_, out_tensor_;
  // A bracketed run's inputs, copied into the input block by the bracket (before its flush and go
  // event) from where they lie (the judge's inputs themselves, or the copies held for those that
  // do not lie as staged: stage_tree_deferred); and the bracket's copy of the output block as the
  // done word found it.
  std::vector<InputCopy> bracket_inputs_;
  std::vector<pybind11::object> bracket_held_;
  pybind11::object snapshot_;
};

// The phases after the models are built. Each throws Failure.
// Measures the reference on one input set and makes judge.plan (before any solution code runs,
// so that what the candidate holds cannot make a task look too large); task_too_large when
// the plan cannot fit. judge_memory.cpp.
void judge_plan_memory(Judge& judge);
// The peaks of the evaluation (reports.memory.peak); `finished` is the candidate's last reply.
void record_memory_peaks(Judge& judge, const nlohmann::json& finished);
void judge_verify(Judge& judge);
void judge_profile(Judge& judge);
// sandbox.compile_before_lock: torch.compile's compilation of the reference (its first call, on
// the warm-up inputs, with at most an eighth of the GPU's memory) into judge.precompiled, unless
// the baseline cache has the task's baselines. A failure leaves the compilation to judge_profile,
// where it happens without the option.
void judge_precompile_baseline(Judge& judge);

// The candidate's share of the kernel table, warm-up excluded.
nlohmann::json candidate_kernel_table(const Judge& judge);

}  // namespace cuda_agent::sandbox
