// End-to-end evaluations on a GPU: correct and incorrect kernels, every fault kind the worker
// isolates, the timer against memory bandwidth, the baseline cache.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "gpu_test_util.h"

using namespace cuda_agent;
using namespace cuda_agent::testing;
using sandbox::EvalMode;

namespace {

constexpr const char* kAdd = "tests/data/tasks/add/model.py";

std::string solution(const std::string& name) { return "tests/data/solutions/" + name + "/model_new.py"; }

void expect_failure(const nlohmann::json& r, const std::string& category, const std::string& fragment = "") {
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(category_of(r), category) << r.dump(2);
  EXPECT_EQ(r["reward"].get<double>(), -1.0);
  if (!fragment.empty()) {
    EXPECT_NE(r["message"].get<std::string>().find(fragment), std::string::npos) << r.dump(2);
  }
}

// After a fault, a fresh worker on the same GPU must work.
void expect_next_evaluation_works() {
  auto r = run_eval(kAdd, solution("add_ok"), EvalMode::kVerify);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

}  // namespace

TEST(SandboxGpu, CorrectKernelPassesAndIsScored) {
  CA_REQUIRE_GPU();
  auto r = run_eval(kAdd, solution("add_ok"));
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["correct"].get<bool>());
  EXPECT_EQ(r["verify"]["trials"].size(), 5u);
  // Secret seeds: drawn per input set (trial 0's recorded as input_seed), none the next of another.
  EXPECT_EQ(r["verify"]["trials"][0]["seed"], r["input_seed"]);
  for (size_t i = 1; i < 5; ++i)
    EXPECT_NE(r["verify"]["trials"][i]["seed"].get<int64_t>(), r["verify"]["trials"][i - 1]["seed"].get<int64_t>() + 1);
  // Provenance: the runtime's launch was attributed by its CUPTI correlation id.
  EXPECT_EQ(r["provenance"]["attribution"], "correlation") << r["provenance"].dump(2);
  EXPECT_GE(r["provenance"]["own_launches"].get<int>(), 5) << r["provenance"].dump(2);
  EXPECT_TRUE(r["provenance"]["forbidden_kernels"].empty()) << r["provenance"].dump(2);
  // Fresh inputs per timed run, every output checked; the roofline is computed, not crossed.
  EXPECT_GE(r["timing_inputs"].get<int>(), 2);
  EXPECT_GT(r["roofline"]["peak_dram_gbps"].get<double>(), 1000.0) << r["roofline"].dump(2);
  EXPECT_FALSE(r["roofline"]["flag"].get<bool>()) << r["roofline"].dump(2);
  const double reward = r["reward"];
  EXPECT_TRUE(reward == 1.0 || reward == 2.0 || reward == 3.0) << reward;
  EXPECT_EQ(r["build_path"], "nvrtc");
  EXPECT_GT(r["timings"]["candidate"]["median_ms"].get<double>(), 0.0);
  EXPECT_GE(r["timings"]["candidate"]["runs"].get<int>(), 10);
  EXPECT_GT(r["speedup_vs_eager"].get<double>(), 0.0);
  // CUPTI saw the candidate's own kernel, once per forward.
  bool found = false;
  for (const auto& k : r["kernels"]["candidate"])
    if (k["name"] == "add_vec4") {
      found = true;
      EXPECT_DOUBLE_EQ(k["calls_per_forward"].get<double>(), 1.0);
    }
  EXPECT_TRUE(found) << r["kernels"].dump(2);
  EXPECT_EQ(r["runtime"]["launches"]["add_vec4"].get<int>() > 0, true);
}

// A process that holds the GPU's lock (another evaluation, or a command of an agent that opened
// the lock file) delays an evaluation but cannot fail it: the wait is not in timeout_s, and held
// past sandbox.gpu_wait_s the evaluation ends as gpu_busy, which the trainer masks, not as a
// timeout charged to the solution. The lock files live in a folder of this test's own.
TEST(SandboxGpu, AHeldGpuLockDelaysAnEvaluationButDoesNotFailIt) {
  CA_REQUIRE_GPU();
  TempDir locks("ca-gpu-locks-");
  ::setenv("CUDA_AGENT_HOST_TMPDIR", locks.path().c_str(), 1);
  sandbox::EvalRequest req;
  req.task_path = source_path(kAdd);
  req.solution_path = source_path(solution("add_ok"));
  req.task_id = "add";
  req.mode = EvalMode::kEvaluate;
  req.gpu_lock = true;
  req.options = fast_options();
  req.options.timeout_s = 15;
  req.options.gpu_wait_s = 120;
  prepare_environment();
  int held = lock_file(sandbox::gpu_lock_path(0, "gpu"), /*exclusive=*/true);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(25));
    ::close(held);
  });
  const nlohmann::json waited = sandbox::evaluate(req).to_json();
  release.join();
  EXPECT_TRUE(waited["ok"].get<bool>()) << waited.dump(2);
  // Longer than timeout_s (the lock was taken before the evaluation began; Python's start is part of the hold).
  EXPECT_GT(waited["phase_seconds"]["gpu_wait"].get<double>(), req.options.timeout_s) << waited["phase_seconds"].dump();

  held = lock_file(sandbox::gpu_lock_path(0, "gpu"), /*exclusive=*/true);
  req.options.gpu_wait_s = 3;
  const nlohmann::json busy = sandbox::evaluate(req).to_json();
  ::close(held);
  ::unsetenv("CUDA_AGENT_HOST_TMPDIR");
  expect_failure(busy, "gpu_busy", "gpu_wait_s");
  EXPECT_TRUE(sandbox::is_task_fault(busy["category"]));
}

// The red team's lock holder unconfined (confine: off, as where no user namespace can be made): it
// reaches the lock files and holds the quiet lock its judge needs for the timed runs. The judge
// finds its own candidate among the holders and ends the evaluation as tampering within seconds,
// not as gpu_busy (masked) after gpu_wait_s.
TEST(SandboxGpu, ASolutionThatHoldsItsJudgesLockIsTampering) {
  CA_REQUIRE_GPU();
  TempDir locks("ca-gpu-locks-");
  ::setenv("CUDA_AGENT_HOST_TMPDIR", locks.path().c_str(), 1);
  // The lock files exist (gpu, quiet and their turnstiles), as on any machine that has evaluated
  // before (the judge makes the quiet one only when it first takes it, after the solution's import).
  ASSERT_EQ(sandbox::gpu_lock_files(0).size(), 4u);
  sandbox::SandboxOptions options = fast_options();
  options.confine = "off";
  options.fallback = "warn";
  options.gpu_wait_s = 120;
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json r = run_eval(kAdd, "tests/data/redteam/hacks/gl_hold_gpu_lock_escape_penalty/model_new.py",
                                    EvalMode::kEvaluate, options, /*gpu_lock=*/true);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::unsetenv("CUDA_AGENT_HOST_TMPDIR");
  expect_failure(r, "tampering", "holds the GPU's quiet lock");
  EXPECT_LT(wall, 60.0) << "the judge should name the holder long before gpu_wait_s";
}

TEST(SandboxGpu, TemplateKernelThroughNameExpression) {
  CA_REQUIRE_GPU();
  auto r = run_eval(kAdd, solution("add_template"), EvalMode::kVerify);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

TEST(SandboxGpu, WrongValuesAreAMismatch) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_wrong")), "mismatch", "differ beyond");
}

TEST(SandboxGpu, WrongShapeIsAMismatch) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_wrong_shape")), "mismatch", "shape");
}

TEST(SandboxGpu, CompileErrorCarriesLogAndNumberedSource) {
  CA_REQUIRE_GPU();
  auto r = run_eval(kAdd, solution("add_compile_error"));
  expect_failure(r, "compile_error", "error");
  EXPECT_NE(r["message"].get<std::string>().find("   1 | "), std::string::npos) << r["message"];
}

TEST(SandboxGpu, ArgumentTypeMismatchIsAClearError) {
  CA_REQUIRE_GPU();
  auto r = run_eval(kAdd, solution("add_bad_args"));
  expect_failure(r, "runtime_error", "expected a Python int");
}

TEST(SandboxGpu, IllegalMemoryAccessIsContained) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_illegal_address")), "illegal_memory_access");
  expect_next_evaluation_works();
}

TEST(SandboxGpu, EndlessKernelTimesOutAtTheForwardBound) {
  CA_REQUIRE_GPU();
  // In the GPU's exclusive lock: stopped at sandbox.forward_timeout_s, not at timeout_s.
  auto options = fast_options();
  options.timeout_s = 300;
  options.forward_timeout_s = 5;
  auto r = run_eval(kAdd, solution("add_infinite_loop"), EvalMode::kEvaluate, options);
  expect_failure(r, "timeout", "sandbox.forward_timeout_s (5 s a forward");
  EXPECT_TRUE(r["worker"]["timed_out"].get<bool>()) << r.dump(2);
  EXPECT_LT(r["wall_seconds"].get<double>(), 60.0);
  expect_next_evaluation_works();
}

TEST(SandboxGpu, SegfaultIsACrash) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_segfault")), "crash", "signal 11");
  expect_next_evaluation_works();
}

TEST(SandboxGpu, GpuOutOfMemoryIsReported) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_gpu_oom")), "out_of_memory");
}

TEST(SandboxGpu, HostMemoryLimitStopsTheWorker) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.host_memory_gb = 12;
  auto r = run_eval(kAdd, solution("add_host_oom"), EvalMode::kEvaluate, options);
  expect_failure(r, "out_of_memory");
  expect_next_evaluation_works();
}

TEST(SandboxGpu, HangingPythonTimesOut) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.timeout_s = 20;
  expect_failure(run_eval(kAdd, solution("add_hang_python"), EvalMode::kEvaluate, options), "timeout");
}

TEST(SandboxGpu, MissingModelNewIsALoadError) {
  CA_REQUIRE_GPU();
  expect_failure(run_eval(kAdd, solution("add_no_modelnew")), "load_error", "ModelNew");
}

TEST(SandboxGpu, StrictStateDictCatchesRenamedParameters) {
  CA_REQUIRE_GPU();
  auto ok = run_eval("tests/data/tasks/linear_small/model.py", solution("linear_ok"));
  EXPECT_TRUE(ok["ok"].get<bool>()) << ok.dump(2);
  EXPECT_EQ(ok["runtime"]["vendor_calls"]["cublas_gemm"].get<int>() > 0, true);
  expect_failure(run_eval("tests/data/tasks/linear_small/model.py", solution("linear_renamed_param")),
                 "interface_error", "load_state_dict");
}

// Under the GPU's locks, as a runner evaluates: a confined candidate's nvcc build is the
// prebuild's, made before the judge waits for the lock, and the candidate's load in the lock
// finds it done (sandbox.prebuild).
namespace {
void expect_built_before_the_lock(const nlohmann::json& r) {
  if (!r["worker"].value("confined", false)) return;  // no prebuild for an unconfined candidate
  ASSERT_TRUE(r.contains("prebuild")) << r.dump(2);
  EXPECT_TRUE(r["prebuild"].value("ok", false)) << r.dump(2);
  EXPECT_LT(r["phase_seconds"].value("load_solution", 1e9), r["prebuild"].value("import_seconds", 0.0) / 2)
      << r.dump(2);
}
}  // namespace

TEST(SandboxGpu, LoadInlineSolutionsTakeTheNvccPath) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.timeout_s = 400;
  auto r = run_eval(kAdd, solution("add_load_inline"), EvalMode::kVerify, options, /*gpu_lock=*/true);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["build_path"], "nvcc");
  expect_built_before_the_lock(r);
}

TEST(SandboxGpu, KernelsDirectoryLayoutBuildsWithNvcc) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.timeout_s = 400;
  auto r = run_eval(kAdd, solution("add_kernels_dir"), EvalMode::kVerify, options, /*gpu_lock=*/true);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["build_path"], "nvcc");
  expect_built_before_the_lock(r);
}

// sandbox.read_scope "system" on the GPU: the candidate reads only the system's and Python's
// folders, the task's and its own, and CUDA still starts, NVRTC and nvcc still build, cuBLAS still
// runs, the timer and CUPTI still work.
TEST(SandboxGpu, TheSystemReadScopeRunsEveryBuildPath) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.read_scope = "system";
  options.timeout_s = 400;
  const auto timed = run_eval(kAdd, solution("add_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(timed["ok"].get<bool>()) << timed.dump(2);
  EXPECT_TRUE(timed["worker"]["confined"].get<bool>()) << timed["worker"].dump(2);
  EXPECT_GT(timed["timings"]["candidate"]["median_ms"].get<double>(), 0.0) << timed.dump(2);
  const auto gemm = run_eval("tests/data/tasks/linear_small/model.py", solution("linear_ok"), EvalMode::kVerify, options);
  EXPECT_TRUE(gemm["ok"].get<bool>()) << gemm.dump(2);
  const auto nvcc = run_eval(kAdd, solution("add_load_inline"), EvalMode::kVerify, options);
  EXPECT_TRUE(nvcc["ok"].get<bool>()) << nvcc.dump(2);
  EXPECT_EQ(nvcc["build_path"], "nvcc");
}

// The timer must see a bandwidth-bound kernel at >= 70% of the copy bandwidth measured here.
TEST(SandboxGpu, TimerAgreesWithMemoryBandwidth) {
  CA_REQUIRE_GPU();
  const auto& api = sandbox::driver();
  double copy_gbps = 0;
  {
    sandbox::ensure_context();
    const size_t bytes = size_t{1} << 30;
    CUdeviceptr src = 0, dst = 0;
    ASSERT_EQ(api.cuMemAlloc(&src, bytes), CUDA_SUCCESS);
    ASSERT_EQ(api.cuMemAlloc(&dst, bytes), CUDA_SUCCESS);
    CUevent start, end;
    api.cuEventCreate(&start, 0);
    api.cuEventCreate(&end, 0);
    float best = 1e30f;
    for (int i = 0; i < 10; ++i) {
      api.cuEventRecord(start, nullptr);
      api.cuMemcpyDtoDAsync(dst, src, bytes, nullptr);
      api.cuEventRecord(end, nullptr);
      api.cuEventSynchronize(end);
      float ms = 0;
      api.cuEventElapsedTime(&ms, start, end);
      if (i > 0) best = std::min(best, ms);
    }
    copy_gbps = 2.0 * bytes / (best * 1e-3) / 1e9;
    api.cuMemFree(src);
    api.cuMemFree(dst);
  }
  auto r = run_eval("tests/data/tasks/copy_large/model.py", solution("copy_ok"), EvalMode::kProfile);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  const double ms = r["timings"]["candidate"]["median_ms"];
  const double kernel_gbps = 2.0 * (size_t{1} << 30) / (ms * 1e-3) / 1e9;
  std::cout << "copy bandwidth " << copy_gbps << " GB/s; copy_ok through the sandbox timer " << kernel_gbps
            << " GB/s (" << ms << " ms)\n";
  // Nothing but the forward in the interval (issue 17's target: 90% of the copy engine's bandwidth).
  EXPECT_GE(kernel_gbps, 0.9 * copy_gbps);
  // The CUPTI kernel time per forward is reported beside it, and is no longer than the interval.
  const double gpu_ms = r["timings"]["candidate"]["gpu_kernel_ms"];
  EXPECT_GT(gpu_ms, 0.0);
  EXPECT_LE(gpu_ms, ms * 1.001);
}

// The same code timed in the judge (eager) and in the candidate process (ModelNew = Model): the
// interleaved rounds read it as the same, within the noise the reward rule allows for. With the
// timer's hold, 11 of 12 readings on the H200 (2026-12-02) lay within 4% (0.96-1.00x), one at
// 0.93x (linear_small, GPU time 8 us); before it, 0.47-0.59x and 1.48x.
TEST(SandboxGpu, TimerReadsIdenticalCodeAlikeInBothProcesses) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.timed_runs = 20;
  options.provenance = "warn";
  options.fallback = "off";
  for (const char* task : {"tests/data/tasks/add/model.py", "tests/data/tasks/linear_small/model.py"}) {
    TempDir dir("ca-same-code-");
    const std::string solution = (dir.path() / "model_new.py").string();
    write_file_atomic(solution, read_file(source_path(task)) + "\n\nModelNew = Model\n");
    auto r = run_eval(task, solution, EvalMode::kEvaluate, options);
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
    const double speedup = r["speedup_vs_eager"];
    std::cout << task << ": ModelNew = Model reads " << speedup << "x eager, interval "
              << r["speedup_interval"]["vs_eager"].dump() << "\n";
    EXPECT_NEAR(speedup, 1.0, 0.08) << r["timing"].dump(2) << r["timings"].dump(2);
    EXPECT_EQ(r["reward"].get<double>(), 1.0);  // identical code is never "faster"
  }
}

TEST(SandboxGpu, BaselinesAreCachedAcrossEvaluations) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.profile_compile = true;
  // A microsecond-scale task's eager timing moves by tens of percent between processes; the test
  // is about the cache, so no drift re-times it here (the drift rule has its CPU test).
  options.baseline_drift = 1.0;
  auto first = run_eval("tests/data/tasks/linear_small/model.py", solution("linear_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(first["ok"].get<bool>()) << first.dump(2);
  auto second = run_eval("tests/data/tasks/linear_small/model.py", solution("linear_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(second["ok"].get<bool>()) << second.dump(2);
  EXPECT_FALSE(first["timings"]["baselines_cached"].get<bool>());
  // torch.compile ran in the (confined) worker: it failed there once the host had its default cache.
  EXPECT_TRUE(first["timings"]["compile"].is_object()) << first["timings"].dump(2);
  EXPECT_TRUE(second["timings"]["baselines_cached"].get<bool>());
  // Eager is timed in every evaluation's rounds; torch.compile's cached timing is carried over by
  // eager's drift against the cached eager timing.
  const nlohmann::json check = second["timing"]["baseline_check"];
  ASSERT_TRUE(check.is_object()) << second["timing"].dump(2);
  EXPECT_EQ(check["cached_eager_median_ms"], first["timings"]["eager"]["median_ms"]);
  EXPECT_NE(second["timing"]["compile_source"].get<std::string>().find("carried over"), std::string::npos)
      << second["timing"].dump(2);
  EXPECT_TRUE(second["timings"]["compile"].is_object()) << second["timings"].dump(2);
  EXPECT_TRUE(second["speedup_interval"]["vs_compile"].is_object()) << second["speedup_interval"].dump(2);
  // A cached baseline makes the second evaluation much shorter: no torch.compile.
  EXPECT_LT(second["worker_seconds"].get<double>(), first["worker_seconds"].get<double>());
}

// What an evaluation leaves in the cache for later ones is written once it has ended well: a
// solution charged for disturbing its judge (here a native thread beside the judge's timing)
// leaves no baseline timing; an honest one leaves its baselines, and its NVRTC cubins, which the
// next evaluation reads because the judge recorded them (the folder is the candidate's to write).
TEST(SandboxGpu, OnlyAnEvaluationThatEndedWellLeavesTimingsAndCubinsForTheNext) {
  CA_REQUIRE_GPU();
  TempDir cache("ca-gpu-cache-");
  auto options = fast_options();
  options.cache_dir = cache.path().string();
  auto entries = [&] {
    int n = 0;
    std::error_code ec;
    for (std::filesystem::recursive_directory_iterator it(cache.path() / "baselines", ec), end; !ec && it != end;
         it.increment(ec))
      n += it->is_regular_file();
    return n;
  };
  const auto hack = run_eval(kAdd, "tests/data/redteam/hacks/tp_native_thread_beside_judge/model_new.py",
                             EvalMode::kEvaluate, options);
  EXPECT_EQ(category_of(hack), "tampering") << hack.dump(2);
  EXPECT_TRUE(hack["timings"].is_object() && hack["timings"]["eager"].is_object())
      << "the hack was meant to be charged after its timing: " << hack.dump(2);
  EXPECT_EQ(entries(), 0);
  const auto first = run_eval(kAdd, solution("add_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(first["ok"].get<bool>()) << first.dump(2);
  EXPECT_GE(entries(), 1);
  EXPECT_EQ(first["runtime"]["nvrtc_compiles"], 1) << first["runtime"].dump();
  const auto second = run_eval(kAdd, solution("add_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(second["ok"].get<bool>()) << second.dump(2);
  EXPECT_EQ(second["runtime"]["nvrtc_compiles"], 0) << second["runtime"].dump();
  EXPECT_EQ(second["runtime"]["nvrtc_cache_hits"], 1) << second["runtime"].dump();
}

TEST(SandboxGpu, BaselinesModeFillsTheCacheWithoutASolution) {
  CA_REQUIRE_GPU();
  auto options = fast_options();
  options.seed = 7;  // a key no other test uses, so the first run measures
  auto first = run_eval("tests/data/tasks/linear_small/model.py", "", EvalMode::kBaselines, options);
  ASSERT_TRUE(first["ok"].get<bool>()) << first.dump(2);
  EXPECT_FALSE(first["timings"]["baselines_cached"].get<bool>());
  EXPECT_GT(first["timings"]["eager"]["median_ms"].get<double>(), 0.0);
  EXPECT_TRUE(first["reward"].is_null());
  auto scored = run_eval("tests/data/tasks/linear_small/model.py", solution("linear_ok"), EvalMode::kEvaluate, options);
  ASSERT_TRUE(scored["ok"].get<bool>()) << scored.dump(2);
  // No torch.compile here (fast options): the cached eager timing is the cross-check of the
  // evaluation's own.
  EXPECT_FALSE(scored["timings"]["baselines_cached"].get<bool>());
  ASSERT_TRUE(scored["timing"]["baseline_check"].is_object()) << scored["timing"].dump(2);
  EXPECT_EQ(scored["timing"]["baseline_check"]["cached_eager_median_ms"], first["timings"]["eager"]["median_ms"]);
}

// sandbox.compile_before_lock: a baselines judge under the GPU's locks compiles torch.compile's
// model with the lock held shared, then times both baselines in the exclusive lock as before.
TEST(SandboxGpu, ABaselineCompiledBeforeTheExclusiveLockIsTimedAsBefore) {
  CA_REQUIRE_GPU();
  auto o = fast_options();
  o.profile_compile = true;
  o.compile_before_lock = true;
  o.use_baseline_cache = false;  // measured every time
  auto r = run_eval("tests/data/tasks/linear_small/model.py", "", EvalMode::kBaselines, o, /*gpu_lock=*/true);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["timings"]["compile"].is_object()) << r["timings"].dump(2);
  EXPECT_GT(r["timings"]["eager"]["median_ms"].get<double>(), 0.0);
  const nlohmann::json& phases = r["phase_seconds"];
  ASSERT_TRUE(phases.contains("precompile") && phases.contains("compile_wait") && phases.contains("gpu_wait"))
      << phases.dump();
  // The compilation happened before the exclusive lock: the profile in it is the short part.
  EXPECT_LT(phases["profile"].get<double>(), phases["precompile"].get<double>()) << phases.dump();
}

// sandbox.init_before_lock: CUDA comes up in both processes while the GPU's lock is held shared
// (here by the test, shared too, for 10 s: the evaluation's initialisation goes ahead beside it and
// only its exclusive take waits), and the evaluation then verifies and times as before.
TEST(SandboxGpu, AnEvaluationInitialisedBeforeTheExclusiveLockPassesAsBefore) {
  CA_REQUIRE_GPU();
  TempDir locks("ca-gpu-locks-");
  ::setenv("CUDA_AGENT_HOST_TMPDIR", locks.path().c_str(), 1);
  auto o = fast_options();
  o.init_before_lock = true;
  prepare_environment();
  const int held = lock_file(sandbox::gpu_lock_path(0, "gpu"), /*exclusive=*/false);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::close(held);
  });
  auto r = run_eval(kAdd, solution("add_ok"), EvalMode::kEvaluate, o, /*gpu_lock=*/true);
  release.join();
  ::unsetenv("CUDA_AGENT_HOST_TMPDIR");
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["correct"].get<bool>());
  EXPECT_GT(r["timings"]["candidate"]["median_ms"].get<double>(), 0.0);
  const nlohmann::json& phases = r["phase_seconds"];
  ASSERT_TRUE(phases.contains("init_wait") && phases.contains("cuda_init") && phases.contains("gpu_wait"))
      << phases.dump();
  EXPECT_LT(phases["init_wait"].get<double>(), 1.0) << phases.dump();  // shared beside the test's hold
  EXPECT_GT(phases["gpu_wait"].get<double>(), 1.0) << phases.dump();   // the exclusive take waited for it
}

// The judge's bracket (judge_bracket.h): calibrated before the solution loads, each timed run of
// an honest softmax gets a span in the judge's context; the floor under its sample (span less the
// calibration) stays at or under what the honest run takes, so few of its runs are raised.
TEST(SandboxGpu, TheJudgesBracketFloorsEachTimedRunAndLeavesAnHonestOneAsItWas) {
  CA_REQUIRE_GPU();
  sandbox::SandboxOptions o = fast_options();
  o.judge_bracket = true;
  auto r = run_eval("tests/data/redteam/tasks/softmax_rows/model.py",
                    "tests/data/redteam/legit/softmax_smem_row/model_new.py", EvalMode::kEvaluate, o);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  const nlohmann::json& b = r["timing"]["bracket"];
  ASSERT_TRUE(b.is_object()) << r["timing"].dump(2);
  const int calibration_runs = b["calibration"]["runs"].get<int>();
  EXPECT_TRUE(calibration_runs == 16 || calibration_runs == 32) << b.dump();  // 32: calibrated twice (noisy)
  const double hand_over = b["calibration"]["median_ms"].get<double>();
  EXPECT_GT(hand_over, 0.0) << b.dump();
  EXPECT_LT(hand_over, 5.0) << b.dump();
  const double candidate = r["timings"]["candidate"]["median_ms"].get<double>();
  EXPECT_GT(b["span_median_ms"].get<double>(), candidate) << b.dump();
  EXPECT_LE(b["floor_median_ms"].get<double>(), candidate * 1.25 + 0.005) << b.dump() << " candidate " << candidate;
  EXPECT_LE(b["runs_raised_to_floor"].get<int>(), o.timed_runs / 2) << b.dump();
  EXPECT_TRUE(r["phase_seconds"].contains("bracket_calibration")) << r["phase_seconds"].dump();
  // Without it: no bracket, no calibration.
  o.judge_bracket = false;
  auto off = run_eval("tests/data/redteam/tasks/softmax_rows/model.py",
                      "tests/data/redteam/legit/softmax_smem_row/model_new.py", EvalMode::kEvaluate, o);
  ASSERT_TRUE(off["ok"].get<bool>()) << off.dump(2);
  EXPECT_TRUE(off["timing"]["bracket"].is_null()) << off["timing"].dump(2);
}

namespace {

// A process of its own that keeps a kernel of its CUDA context on the GPU (torch.cuda._sleep, 50 ms
// each) until killed: without MPS the GPU time-slices its context with every other.
class ForeignGpuWork {
 public:
  explicit ForeignGpuWork(const TempDir& dir) {
    const std::string ready = (dir.path() / "hog.ready").string();
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string code = "import os, torch\n"
                               "torch.cuda._sleep(1000)\n"
                               "torch.cuda.synchronize()\n"
                               "open('" + ready + "', 'w').write(str(os.getpid()))\n"
                               "while True:\n"
                               "    for _ in range(4): torch.cuda._sleep(100_000_000)\n"
                               "    torch.cuda.synchronize()\n";
      const std::string python = sandbox::python_executable();
      ::execl(python.c_str(), python.c_str(), "-c", code.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 600 && !std::filesystem::exists(ready); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    started_ = std::filesystem::exists(ready);
  }
  ~ForeignGpuWork() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  bool started() const { return started_; }

 private:
  pid_t pid_ = -1;
  bool started_ = false;
};

double eager_median(const nlohmann::json& r) { return r["timings"]["eager"]["median_ms"].get<double>(); }

// DIR/model.py: a task of one 4096-float input whose Model.forward(self, x) is `forward` (its
// body, indented by eight spaces, lines separated by newlines). Returns its path.
std::string write_one_input_task(const TempDir& dir, const std::string& forward) {
  const std::string task = (dir.path() / "model.py").string();
  const std::string head =
      "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n";
  const std::string tail =
      "\ndef get_inputs():\n    return [torch.rand(4096)]\n\ndef get_init_inputs():\n    return []\n";
  write_file_atomic(task, head + forward + tail);
  return task;
}

}  // namespace

// The slice watch (timer.h): another process's kernel on the GPU time-slices with the judge's
// context and stretches the eager baseline's events (a slower baseline is a larger speedup for the
// solution beside it); under the watch, the stretches the GPU gave the other context come off each
// sample, so the baseline reads about what it reads alone. The task's forward is about 5 ms of matmuls,
// longer than a time slice. Named Baselines: it runs alone (scripts/gpu_check.sh).
TEST(SandboxGpu, BaselinesUnderTheSliceWatchLeaveOutTheTimeOtherContextsTook) {
  CA_REQUIRE_GPU();
  TempDir dir("slice-watch-");
  // Work, not torch.cuda._sleep: a sleep counts the SM's clock, which runs on while another
  // context has the GPU, so a sleeping forward ends on time however it is sliced.
  const std::string task = write_one_input_task(
      dir, "        a = x.view(64, 64).repeat(64, 64)\n        return (a @ a @ a).sum(0)\n");
  sandbox::SandboxOptions o = fast_options();
  o.use_baseline_cache = false;
  o.slice_watch = true;
  auto alone = run_eval(task, "", EvalMode::kBaselines, o);
  ASSERT_TRUE(alone["ok"].get<bool>()) << alone.dump(2);
  const nlohmann::json& quiet = alone["timing"]["slice_watch"]["eager"];
  ASSERT_TRUE(quiet.is_object()) << alone["timing"].dump(2);
  EXPECT_GE(quiet["runs_watched"].get<int>(), 3) << quiet.dump();
  EXPECT_EQ(quiet["runs_sliced"].get<int>(), 0) << quiet.dump() << ": another process used the GPU meanwhile?";
  EXPECT_FALSE(alone["timing"]["slice_watch"]["every_run_watched"].get<bool>());

  ForeignGpuWork hog(dir);
  ASSERT_TRUE(hog.started());
  o.slice_watch = false;
  auto stretched = run_eval(task, "", EvalMode::kBaselines, o);
  o.slice_watch = true;
  auto watched = run_eval(task, "", EvalMode::kBaselines, o);
  ASSERT_TRUE(stretched["ok"].get<bool>()) << stretched.dump(2);
  ASSERT_TRUE(watched["ok"].get<bool>()) << watched.dump(2);
  EXPECT_TRUE(stretched["timing"]["slice_watch"].is_null()) << stretched["timing"].dump(2);
  // A few rounds watched saw the other context; every round was then timed again, watched.
  ASSERT_TRUE(watched["timing"]["slice_watch"]["every_run_watched"].get<bool>()) << watched["timing"].dump(2);
  const nlohmann::json& seen = watched["timing"]["slice_watch"]["eager"];
  std::fprintf(stderr, "eager median alone %.3f ms, beside another context %.3f ms, watched %.3f ms; %s\n",
               eager_median(alone), eager_median(stretched), eager_median(watched), seen.dump().c_str());
  EXPECT_GT(eager_median(stretched), eager_median(alone) * 1.3) << "the other context did not stretch the baseline";
  EXPECT_EQ(seen["runs_watched"].get<int>(), o.timed_runs) << seen.dump();
  EXPECT_GE(seen["runs_sliced"].get<int>(), o.timed_runs / 2) << seen.dump();
  EXPECT_GT(seen["sliced_ms_total"].get<double>(), 0.0) << seen.dump();
  EXPECT_LT(eager_median(watched), eager_median(alone) * 1.15) << seen.dump();
  EXPECT_GT(eager_median(watched), eager_median(alone) * 0.85) << seen.dump();
}

// A reference whose forward waits for the whole device (torch.cuda.synchronize inside it) would
// wait for the slice watch beside it, which waits for a stop word queued after that forward: the
// hold's timeout ends the watch (the run is then unwatched), so the run waits the hold's 10 ms, as
// without the watch, and not the watch's own limit of 10 s.
TEST(SandboxGpu, AForwardThatSynchronizesTheDeviceIsNotHeldUpByTheSliceWatch) {
  CA_REQUIRE_GPU();
  TempDir dir("slice-watch-sync-");
  const std::string task = write_one_input_task(
      dir, "        y = x * 2.0\n        torch.cuda.synchronize()\n        return y + 1.0\n");
  sandbox::SandboxOptions o = fast_options();
  o.use_baseline_cache = false;
  o.slice_watch = true;
  auto r = run_eval(task, "", EvalMode::kBaselines, o);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_LT(eager_median(r), 100.0) << r["timings"].dump(2);
  const nlohmann::json& w = r["timing"]["slice_watch"]["eager"];
  EXPECT_EQ(w["runs_watched"].get<int>(), 0) << w.dump() << ": each watched run ended by the hold's timeout";
  EXPECT_LT(r["phase_seconds"]["profile"].get<double>(), 30.0) << r["phase_seconds"].dump();
}

// strict on a model whose float64 copy needs its tensor attributes converted (KernelBench L3 35's
// LSTM shape of the problem): verified against a float64 reference, not a task_error.
TEST(SandboxGpu, StrictReferenceForAnLstmWithItsStateAsAttributes) {
  CA_REQUIRE_GPU();
  sandbox::SandboxOptions o = fast_options();
  o.precision = "strict";
  o.provenance = "off";
  o.fallback = "off";
  auto r = run_eval("tests/data/tasks/lstm_hidden_attr/model.py", solution("lstm_torch"), EvalMode::kVerify, o);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["reference64"]["route"].get<std::string>().rfind("float64 copy", 0), 0u) << r["reference64"];
  EXPECT_LT(r["verify"]["trials"][0]["candidate_rel_error_vs_fp64"].get<double>(), 1e-4) << r["verify"];
}

namespace {

// A copy task (x * 1.0) over n float32 elements, written into `dir`; copy_ok solves it. The
// LargeTask tests need most of the GPU's memory: they run alone, as the timing tests do
// (scripts/gpu_check.sh), and a runner's GPU lock keeps evaluations apart the same way.
std::string copy_task(const TempDir& dir, const std::string& name, const std::string& n) {
  const std::string path = (dir.path() / name / "model.py").string();
  write_file_atomic(path, "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                          "    def forward(self, x):\n        return x * 1.0\n\n"
                          "def get_inputs():\n    return [torch.rand(" + n + ")]\n\n"
                          "def get_init_inputs():\n    return []\n");
  return path;
}

// The LargeTask sizes are the H200's (150,109,880,320 bytes); on a GPU with less memory they
// shrink in proportion, so that the memory plan meets the same fractions of the GPU (on an H100,
// 2^31 elements' float64 reference does not fit where it does on the H200). Element counts.
// The driver answers without a context here: one in this process would take memory that the
// judge's plan then sees as used.
int64_t scaled_to_gpu(int64_t h200_elements) {
  const auto& api = sandbox::driver();
  CUdevice dev = 0;
  size_t total = 0;
  if (api.cuDeviceGet(&dev, 0) != CUDA_SUCCESS || api.cuDeviceTotalMem(&total, dev) != CUDA_SUCCESS)
    return h200_elements;
  const double scale = std::min(1.0, static_cast<double>(total) / 150109880320.0);
  // Whole mebi-elements: copy_ok copies 4-wide vectors (2^32 scaled to an H100, 2432533777
  // elements, was refused as not a whole number of them).
  return (static_cast<int64_t>(static_cast<double>(h200_elements) * scale) >> 20) << 20;
}

sandbox::SandboxOptions large_task_options() {
  sandbox::SandboxOptions o = fast_options();
  o.trials = 2;
  o.timed_runs = 3;
  o.warmup_runs = 1;
  o.warmup_ms = 0;
  o.use_baseline_cache = false;
  return o;
}

}  // namespace

// A 2^31-element float32 input (8 GiB on the H200, scaled_to_gpu; the out-of-memory of KernelBench
// L1 19/23/31 at 6 GiB):
// evaluated under strict with its float64 reference, and the result records the plan and peaks.
TEST(SandboxGpu, LargeTaskOfEightGibEvaluatesUnderStrict) {
  CA_REQUIRE_GPU();
  TempDir dir("large-task-");
  const int64_t n = scaled_to_gpu(int64_t{1} << 31);
  auto r = run_eval(copy_task(dir, "copy_8g", std::to_string(n)), solution("copy_ok"), EvalMode::kEvaluate,
                    large_task_options());
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  const auto& m = r["memory"];
  EXPECT_TRUE(m["fits"].get<bool>()) << m;
  EXPECT_TRUE(m["float64_reference"].get<bool>()) << m;
  EXPECT_GE(m["input_bytes"].get<int64_t>(), 4 * n) << m;
  EXPECT_LT(m["input_bytes"].get<int64_t>(), 4 * n + (int64_t{1} << 20)) << m;
  EXPECT_EQ(r["reference64"]["route"].get<std::string>().rfind("float64 copy", 0), 0u) << r["reference64"];
  ASSERT_TRUE(m["peak"].is_object()) << m;
  // The judge stayed within its estimate, and the comparison did not hold float64 copies of the whole output.
  EXPECT_LE(m["peak"]["judge_allocated_bytes"].get<int64_t>(), m["judge_peak_bytes"].get<int64_t>()) << m;
  EXPECT_GT(m["peak"]["device_min_free_bytes"].get<int64_t>(), 0) << m;
  std::cout << "memory plan and peaks: " << m.dump() << "\n";
}

// 2^32 elements (16 GiB in, 16 GiB out on the H200; scaled_to_gpu) under strict: evaluated, without the float64
// reference, which does not fit beside the rest (the result says so).
TEST(SandboxGpu, LargeTaskOfSixteenGibEvaluatesWithoutItsFloat64Reference) {
  CA_REQUIRE_GPU();
  TempDir dir("large-task-");
  auto r = run_eval(copy_task(dir, "copy_16g", std::to_string(scaled_to_gpu(int64_t{1} << 32))), solution("copy_ok"),
                    EvalMode::kEvaluate, large_task_options());
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_FALSE(r["memory"]["float64_reference"].get<bool>()) << r["memory"];
  EXPECT_EQ(r["reference64"]["route"], "none: compared as loose") << r["reference64"];
  std::cout << "memory plan and peaks: " << r["memory"].dump() << "\n";
}

// A reference with a 48 GiB temporary on an 8 GiB input (the H200's sizes, scaled_to_gpu): holding both processes'
// peaks would not fit, so both hand their cached memory back after each run, and the task evaluates.
TEST(SandboxGpu, LargeTaskReleasesTheCachesWhenBothPeaksWouldNotFit) {
  CA_REQUIRE_GPU();
  TempDir dir("large-task-");
  const std::string task = (dir.path() / "heavy" / "model.py").string();
  write_file_atomic(task,
                    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        t = x.repeat(6)\n"
                    "        return x * 1.0 + t[:x.numel()] * 0.0\n\n"
                    "def get_inputs():\n    return [torch.rand(" +
                        std::to_string(scaled_to_gpu(int64_t{1} << 31)) +
                        ")]\n\n"
                        "def get_init_inputs():\n    return []\n");
  sandbox::SandboxOptions o = large_task_options();
  o.precision = "loose";
  auto r = run_eval(task, solution("copy_ok"), EvalMode::kEvaluate, o);
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["memory"]["release_cached"].get<bool>()) << r["memory"];
  std::cout << "memory plan and peaks: " << r["memory"].dump() << "\n";
}

// Too large for the GPU at all: its own category, naming the sizes, before any solution code ran.
TEST(SandboxGpu, LargeTaskTooLargeForTheGpuIsItsOwnCategory) {
  CA_REQUIRE_GPU();
  TempDir dir("large-task-");
  // 32 GiB: the plan says no; 128 GiB: drawing the inputs fails.
  for (const auto& [name, n] : {std::pair<std::string, std::string>{"copy_32g", "2**33"}, {"copy_128g", "2**35"}}) {
    auto r = run_eval(copy_task(dir, name, n), solution("copy_ok"), EvalMode::kEvaluate, large_task_options());
    expect_failure(r, "task_too_large");
    const std::string message = r["message"].get<std::string>();
    EXPECT_TRUE(message.find("GiB") != std::string::npos && message.find("free") != std::string::npos) << message;
    EXPECT_TRUE(r["correct"].is_null()) << r.dump(2);  // the solution is not at fault
  }
  expect_next_evaluation_works();
}
