// Tests for the whole evaluation path on CPU: evaluate() spawns the built binary as a worker,
// which starts the embedded Python, loads the task and the solution, and verifies on CPU. Each
// failure a solution can cause must come back as a result with the right category.
//
// Every evaluate() costs a couple of seconds (Python and torch start), so the cases are few and
// the ad-hoc tasks are small.
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/python_runtime.h"

namespace cuda_agent::sandbox {
namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = CUDA_AGENT_SOURCE_DIR;

// A small elementwise task: the ad-hoc solutions below are checked against it.
constexpr const char* kSmallAddTask = R"(import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(1000), torch.randn(1000)]


def get_init_inputs():
    return []
)";

// A ModelNew for the small task whose forward body is `body` (indented by the caller's text).
std::string model_new_with_forward(const std::string& body, const std::string& prelude = "") {
  return "import torch\nimport torch.nn as nn\n" + prelude +
         "\n\nclass ModelNew(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n\n"
         "    def forward(self, a, b):\n" +
         body + "\n";
}

class PythonCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    set_env("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, old_bin_);
    set_env("CUDA_AGENT_CACHE_DIR", cache_.path().c_str(), old_cache_);
    small_task_ = write("small_add/model.py", kSmallAddTask);
  }
  void TearDown() override {
    restore_env("CUDA_AGENT_BIN", old_bin_);
    restore_env("CUDA_AGENT_CACHE_DIR", old_cache_);
  }

  fs::path write(const std::string& relative, const std::string& content) {
    const fs::path p = work_.path() / relative;
    write_file_atomic(p, content);
    return p;
  }

  // Runs a CPU verify of `solution` against `task`.
  nlohmann::json verify(const fs::path& task, const fs::path& solution, double timeout_s = 120) {
    EvalRequest req;
    req.task_path = task.string();
    req.solution_path = solution.string();
    req.task_id = task.parent_path().filename().string();
    req.mode = EvalMode::kVerify;
    req.device = "cpu";
    req.options.timeout_s = timeout_s;
    nlohmann::json r = evaluate(req).to_json();
    EXPECT_TRUE(r.is_object());
    return r;
  }

  // A CPU verify of a solution that hangs, with a deadline of 300 s and sandbox.forward_timeout_s
  // 3 s (what the bounds in the GPU's exclusive lock must stop long before the deadline);
  // *elapsed: its wall time.
  nlohmann::json verify_hanging(const fs::path& solution, double* elapsed) {
    EvalRequest req;
    req.task_path = small_task_.string();
    req.solution_path = solution.string();
    req.mode = EvalMode::kVerify;
    req.device = "cpu";
    req.options.timeout_s = 300;
    req.options.forward_timeout_s = 3;
    const auto start = std::chrono::steady_clock::now();
    nlohmann::json r = evaluate(req).to_json();
    *elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }

  static std::string dump(const nlohmann::json& r) { return r.dump(2); }

  static fs::path data_task(const char* name) { return kSourceDir / "tests/data/tasks" / name / "model.py"; }
  static fs::path data_solution(const char* name) {
    return kSourceDir / "tests/data/solutions" / name / "model_new.py";
  }

  TempDir cache_{"ca-pycpu-cache-"};
  TempDir work_{"ca-pycpu-"};
  fs::path small_task_;

 private:
  static void set_env(const char* name, const char* value, std::optional<std::string>& old) {
    if (const char* v = std::getenv(name)) old = v;
    ::setenv(name, value, 1);
  }
  static void restore_env(const char* name, const std::optional<std::string>& old) {
    if (old) ::setenv(name, old->c_str(), 1);
    else ::unsetenv(name);
  }
  std::optional<std::string> old_bin_, old_cache_;
};

std::string message(const nlohmann::json& r) { return r.value("message", std::string()); }

TEST_F(PythonCpu, CorrectSolutionPassesFiveSeededTrials) {
  nlohmann::json r = verify(data_task("add"), data_solution("add_torch_cpu"));
  ASSERT_EQ(r.value("ok", false), true) << dump(r);
  EXPECT_TRUE(r["category"].is_null()) << dump(r);
  EXPECT_EQ(r["correct"], true);
  EXPECT_EQ(r["mode"], "verify");
  EXPECT_EQ(r["task_id"], "add");
  EXPECT_EQ(r["build_path"], "python");
  EXPECT_EQ(r["precision"], "strict");
  EXPECT_EQ(r["task_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(r["versions"]["torch"].get<std::string>().rfind("2.11", 0), 0u) << dump(r["versions"]);
  EXPECT_EQ(r["worker"]["exit_code"], 0);
  EXPECT_EQ(r["worker"]["signal"], 0);
  for (const char* phase :
       {"python_start", "load_task", "load_solution", "build_models", "verify", "candidate_exit", "judge_exit"})
    EXPECT_TRUE(r["phase_seconds"].contains(phase)) << phase << " " << dump(r["phase_seconds"]);
  // What follows the phases, each process's end, is counted too, and it fits the wall time.
  EXPECT_GE(r["phase_seconds"]["judge_exit"].get<double>(), 0.0);
  EXPECT_LT(r["phase_seconds"]["candidate_exit"].get<double>() + r["phase_seconds"]["judge_exit"].get<double>(),
            r["wall_seconds"].get<double>());
  // The candidate's account of the load, part by part (no GPU parts on the CPU); together no more
  // than the judge saw the load take.
  double load_parts = 0;
  for (const char* part : {"checks_setup", "import_task", "import_solution", "build_reference", "build_model",
                           "load_state_dict", "gc_collect", "checks_after"}) {
    ASSERT_TRUE(r["load_seconds"].contains(part)) << part << " " << dump(r["load_seconds"]);
    load_parts += r["load_seconds"][part].get<double>();
  }
  EXPECT_FALSE(r["load_seconds"].contains("recorder_start"));
  EXPECT_LE(load_parts, r["phase_seconds"]["load_solution"].get<double>());
  EXPECT_FALSE(r.contains("timings"));  // verify only
  // The verify phase part by part (the integrity checks' second run included); together no more
  // than the phase.
  double verify_parts = 0;
  for (const char* part : {"inputs", "reference", "reference64", "task_check", "candidate", "compare", "second_run"}) {
    ASSERT_TRUE(r["verify_seconds"].contains(part)) << part << " " << dump(r["verify_seconds"]);
    verify_parts += r["verify_seconds"][part].get<double>();
  }
  EXPECT_EQ(r["verify_seconds"].size(), 7u) << dump(r["verify_seconds"]);
  EXPECT_LE(verify_parts, r["phase_seconds"]["verify"].get<double>());

  const nlohmann::json& trials = r["verify"]["trials"];
  ASSERT_EQ(trials.size(), 5u) << dump(r["verify"]);
  // Secret seeds: trial 0's is input_seed, and every trial's is drawn apart.
  EXPECT_EQ(trials[0]["seed"], r["input_seed"]);
  std::set<int64_t> seeds;
  for (int i = 0; i < 5; ++i) {
    seeds.insert(trials[i]["seed"].get<int64_t>());
    EXPECT_EQ(trials[i]["ok"], true);
    EXPECT_EQ(trials[i]["mismatched"], 0);
    EXPECT_EQ(trials[i]["compared"], 1 << 22);
    EXPECT_EQ(trials[i]["max_abs_diff"], 0.0);
  }
  EXPECT_EQ(seeds.size(), 5u) << dump(trials);
  EXPECT_DOUBLE_EQ(r["verify"]["atol"].get<double>(), 1e-2);
}

TEST_F(PythonCpu, WrongValuesAreAMismatchWithTheCount) {
  nlohmann::json r = verify(data_task("add"), data_solution("add_torch_cpu_wrong"));
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["category"], "mismatch") << dump(r);
  EXPECT_EQ(r["correct"], false);
  EXPECT_EQ(r["reward"], -1.0);
  const std::string msg = message(r);
  EXPECT_NE(msg.find(fmt::format("trial 0 (seed {})", r["input_seed"].get<int64_t>())), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 of 4194304 elements differ"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max abs diff 1"), std::string::npos) << msg;
  ASSERT_EQ(r["verify"]["trials"].size(), 1u) << "verify stops at the first failed trial";
  EXPECT_EQ(r["verify"]["trials"][0]["mismatched"], 3);
  EXPECT_EQ(r["verify"]["trials"][0]["path"], "output");
  EXPECT_TRUE(r.contains("log"));
}

TEST_F(PythonCpu, PythonSyntaxErrorIsALoadError) {
  const fs::path sol = write("syntax/model_new.py", "import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n");
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["category"], "load_error") << dump(r);
  const std::string msg = message(r);
  EXPECT_NE(msg.find("SyntaxError"), std::string::npos) << msg;
  EXPECT_NE(msg.find(sol.string()), std::string::npos) << msg;
  EXPECT_TRUE(r["correct"].is_null());
}

TEST_F(PythonCpu, NoModelNewIsALoadError) {
  const fs::path sol = write("no_model_new/model_new.py",
                             "import torch\n\n\nclass AddModel(torch.nn.Module):\n"
                             "    def forward(self, a, b):\n        return a + b\n");
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["category"], "load_error") << dump(r);
  EXPECT_NE(message(r).find("defines no class ModelNew"), std::string::npos) << message(r);
}

TEST_F(PythonCpu, RenamedParametersAreAnInterfaceError) {
  // This solution compiles a kernel at import (NVRTC works without a GPU) and launches only in
  // forward; the strict load_state_dict fails before any launch.
  nlohmann::json r = verify(data_task("linear_small"), data_solution("linear_renamed_param"));
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["category"], "interface_error") << dump(r);
  const std::string msg = message(r);
  EXPECT_NE(msg.find("load_state_dict"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear.weight"), std::string::npos) << msg;
  ASSERT_TRUE(r.contains("runtime")) << dump(r);
  EXPECT_EQ(r["runtime"]["compiled_kernels"], nlohmann::json::array({"add_bias"})) << dump(r["runtime"]);
  EXPECT_TRUE(r["runtime"]["launches"].empty());
  EXPECT_FALSE(r.contains("verify"));
}

// A task that needs a package this environment lacks says which, and how to add it.
TEST_F(PythonCpu, ATaskImportingAMissingPackageSaysWhich) {
  const fs::path task = write("needs_pkg/model.py", "import torch\nimport cuda_agent_no_such_package\n");
  const fs::path sol = write("fine2/model_new.py", model_new_with_forward("        return a + b"));
  nlohmann::json r = verify(task, sol);
  EXPECT_EQ(r["category"], "task_dependency_missing") << dump(r);
  EXPECT_NE(message(r).find("imports 'cuda_agent_no_such_package'"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("pip install cuda_agent_no_such_package"), std::string::npos) << message(r);
}

TEST_F(PythonCpu, TaskThatRaisesIsATaskError) {
  const fs::path task = write("broken_task/model.py",
                              "import torch\nraise RuntimeError('this task is broken on purpose')\n");
  const fs::path sol = write("fine/model_new.py", model_new_with_forward("        return a + b"));
  nlohmann::json r = verify(task, sol);
  EXPECT_EQ(r["category"], "task_error") << dump(r);
  EXPECT_NE(message(r).find("this task is broken on purpose"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find(task.string()), std::string::npos) << message(r);
}

// A reference that ran in this evaluation and fails later, with the solution's code running beside
// it, is charged to the solution (runtime_error), not masked as the task's fault: a failing
// solution that disturbed its judge (its GPU memory, say) would otherwise escape its -1. Here the
// task's reference fails from its second forward on; one that fails from its first stays a
// task_error.
TEST_F(PythonCpu, AReferenceThatFailsAfterItRanIsChargedToTheSolution) {
  const std::string reference =
      "import torch\nimport torch.nn as nn\n\ncalls = [0]\n\n\nclass Model(nn.Module):\n"
      "    def forward(self, a, b):\n"
      "        calls[0] += 1\n"
      "        if calls[0] > FIRST_FAILING - 1:\n"
      "            raise RuntimeError('the reference gave up')\n"
      "        return a + b\n\n\n"
      "def get_inputs():\n    return [torch.randn(64), torch.randn(64)]\n\n\n"
      "def get_init_inputs():\n    return []\n";
  auto with_first_failing = [&](int call) {
    std::string text = reference;
    text.replace(text.find("FIRST_FAILING"), 13, std::to_string(call));
    return text;
  };
  const fs::path sol = write("fine3/model_new.py", model_new_with_forward("        return a + b"));
  const nlohmann::json later = verify(write("flaky_later/model.py", with_first_failing(2)), sol);
  EXPECT_EQ(later["category"], "runtime_error") << dump(later);
  EXPECT_NE(message(later).find("the reference had run in this evaluation"), std::string::npos) << message(later);
  EXPECT_NE(message(later).find("the reference gave up"), std::string::npos) << message(later);
  const nlohmann::json first = verify(write("flaky_first/model.py", with_first_failing(1)), sol);
  EXPECT_EQ(first["category"], "task_error") << dump(first);
}

TEST_F(PythonCpu, ExceptionInForwardIsARuntimeError) {
  const fs::path sol =
      write("raises/model_new.py", model_new_with_forward("        raise ValueError('widths must be positive')"));
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["category"], "runtime_error") << dump(r);
  const std::string msg = message(r);
  EXPECT_NE(msg.find("ValueError"), std::string::npos) << msg;
  EXPECT_NE(msg.find("widths must be positive"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("trial 0 (seed {}): ModelNew.forward", r["input_seed"].get<int64_t>())),
            std::string::npos)
      << msg;
}

TEST_F(PythonCpu, WorkerExitingWithoutResultIsStructured) {
  const fs::path sol = write("exits/model_new.py", model_new_with_forward("        import os\n        os._exit(3)"));
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["ok"], false);
  const std::string cat = r.value("category", std::string());
  EXPECT_TRUE(cat == "infrastructure_error" || cat == "crash") << dump(r);
  EXPECT_NE(message(r).find("'verify'"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("code 3"), std::string::npos) << message(r);
  EXPECT_EQ(r["worker"]["exit_code"], 3);
  EXPECT_EQ(r["reward"], -1.0);
  EXPECT_EQ(r["mode"], "verify");
}

TEST_F(PythonCpu, SegfaultIsACrash) {
  const fs::path sol = write("segv/model_new.py",
                             model_new_with_forward("        import os, signal\n"
                                                    "        os.kill(os.getpid(), signal.SIGSEGV)\n"
                                                    "        return a + b"));
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["category"], "crash") << dump(r);
  EXPECT_EQ(r["worker"]["signal"], 11);
  EXPECT_NE(message(r).find("'verify'"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("signal 11"), std::string::npos) << message(r);
}

TEST_F(PythonCpu, HangIsATimeout) {
  const fs::path sol =
      write("sleeps/model_new.py", model_new_with_forward("        import time\n        time.sleep(60)\n        return a + b"));
  const auto start = std::chrono::steady_clock::now();
  // 10 s: the budget covers both processes' Python start, several seconds on a loaded 2-core
  // machine (at 5 s the candidate sometimes had not started yet: infrastructure_error).
  nlohmann::json r = verify(small_task_, sol, /*timeout_s=*/10);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r["category"], "timeout") << dump(r);
  EXPECT_EQ(r["worker"]["timed_out"], true);
  EXPECT_NE(message(r).find("within 10 s"), std::string::npos) << message(r);
  EXPECT_GE(elapsed, 9.5);
  // The 10 s count from the judge's start of work; before that it starts Python and torch (3-10 s
  // on a loaded 2-core machine): the bound says the hang was cut, not how fast the machine is.
  EXPECT_LT(elapsed, 45.0);
}

TEST_F(PythonCpu, ASolutionsExtensionBuildRunsBeforeTheGpusLockInAProcessOfItsOwn) {
  // sandbox.prebuild: under a runner's GPU locks a solution whose import builds with torch's
  // extension builder is first imported by a confined process of its own, before the judge waits
  // for the GPU's lock; the candidate's import in the lock then finds the build done. Here a C++
  // extension (g++, no GPU needed), on the CPU, with the request marked as a runner's.
  const fs::path sol =
      write("prebuilt/model_new.py",
            model_new_with_forward("        return _ext.add(a, b)",
                                   "from torch.utils.cpp_extension import load_inline\n"
                                   "_ext = load_inline(name='prebuild_add', functions=['add'], cpp_sources="
                                   "'torch::Tensor add(torch::Tensor a, torch::Tensor b) { return a + b; }')\n"));
  EvalRequest req;
  req.task_path = small_task_.string();
  req.solution_path = sol.string();
  req.mode = EvalMode::kVerify;
  req.device = "cpu";
  req.gpu_lock = true;
  req.options.timeout_s = 500;
  const nlohmann::json first = evaluate(req).to_json();
  ASSERT_TRUE(first.value("ok", false)) << dump(first);
  EXPECT_EQ(first["build_path"], "nvcc") << dump(first);
  if (!first["worker"].value("confined", false)) GTEST_SKIP() << "no confinement on this machine: no prebuild";
  ASSERT_TRUE(first.contains("prebuild")) << dump(first);
  EXPECT_TRUE(first["prebuild"].value("ok", false)) << dump(first);
  const double built_s = first["prebuild"].value("import_seconds", 0.0);
  const double loaded_s = first["phase_seconds"].value("load_solution", 1e9);
  EXPECT_GT(first["phase_seconds"].value("prebuild", 0.0), built_s) << dump(first);
  // The build (tens of seconds of g++) happened in the prebuild; the candidate's load reused it.
  EXPECT_GT(built_s, 2.0) << dump(first);
  EXPECT_LT(loaded_s, built_s / 2) << dump(first);
  // Its builds are made: the next evaluation of the same solution has no prebuild.
  const nlohmann::json second = evaluate(req).to_json();
  ASSERT_TRUE(second.value("ok", false)) << dump(second);
  EXPECT_FALSE(second.contains("prebuild")) << dump(second);
  EXPECT_FALSE(second["phase_seconds"].contains("prebuild")) << dump(second);
  EXPECT_LT(second["phase_seconds"].value("load_solution", 1e9), built_s / 2) << dump(second);
  // Without the option the build is the candidate's, as before.
  req.options.prebuild = false;
  req.solution_path = write("not_prebuilt/model_new.py", read_file(sol)).string();
  const nlohmann::json off = evaluate(req).to_json();
  ASSERT_TRUE(off.value("ok", false)) << dump(off);
  EXPECT_FALSE(off.contains("prebuild")) << dump(off);
}

TEST_F(PythonCpu, AHungForwardIsStoppedAtTheForwardBoundLongBeforeTheEvaluationsTimeout) {
  // The forward's calls run in the GPU's exclusive lock on a GPU: a hung one must not hold it to
  // timeout_s (here 300 s), only to sandbox.forward_timeout_s.
  const fs::path sol =
      write("sleeps_long/model_new.py",
            model_new_with_forward("        import time\n        time.sleep(600)\n        return a + b"));
  double elapsed = 0;
  const nlohmann::json r = verify_hanging(sol, &elapsed);
  EXPECT_EQ(r["category"], "timeout") << dump(r);
  EXPECT_EQ(r["worker"]["timed_out"], true);
  EXPECT_NE(message(r).find("sandbox.forward_timeout_s (3 s a forward"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("trial 0"), std::string::npos) << message(r);
  EXPECT_EQ(r["reward"], -1.0);
  // Python's and torch's start on a loaded 2-core machine come first (up to ~10 s each process).
  EXPECT_LT(elapsed, 60.0);
}

TEST_F(PythonCpu, AnImportThatHangsIsStoppedAtTheLoadBoundLongBeforeTheEvaluationsTimeout) {
  // The load runs in the GPU's exclusive lock on a GPU: an import that hangs (here a sleep; on a
  // GPU, say, a wait on an endless kernel it launched) must not hold it to timeout_s (300 s), only
  // to twice sandbox.forward_timeout_s where no nvcc build is left to make (Judge::call_load).
  const fs::path sol = write("sleeps_at_import/model_new.py",
                             model_new_with_forward("        return a + b", "import time\ntime.sleep(600)\n"));
  double elapsed = 0;
  const nlohmann::json r = verify_hanging(sol, &elapsed);
  EXPECT_EQ(r["category"], "timeout") << dump(r);
  EXPECT_NE(message(r).find("the solution's load"), std::string::npos) << message(r);
  EXPECT_NE(message(r).find("did not end within 6 s"), std::string::npos) << message(r);
  EXPECT_EQ(r["reward"], -1.0);
  EXPECT_LT(elapsed, 60.0);
}

TEST_F(PythonCpu, CudaCompileErrorAtImportIsACompileError) {
  const fs::path sol = write("nvrtc_error/model_new.py",
                             "import torch\nimport torch.nn as nn\nimport cuda_agent\n\n"
                             "_SRC = r'''\n"
                             "extern \"C\" __global__ void add_kernel(const float* a, const float* b, float* out, int n)\n"
                             "{\n"
                             "    int i = blockIdx.x * blockDim.x + threadIdx.x\n"
                             "    if (i < n) out[i] = a[i] + b[i];\n"
                             "}\n"
                             "'''\n"
                             "_mod = cuda_agent.compile(_SRC)\n\n\n"
                             "class ModelNew(nn.Module):\n"
                             "    def forward(self, a, b):\n"
                             "        return a + b\n");
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["category"], "compile_error") << dump(r);
  const std::string msg = message(r);
  EXPECT_NE(msg.find("NVRTC compilation failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("error: expected a \";\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("   5 |     if (i < n) out[i] = a[i] + b[i];"), std::string::npos) << msg;
}

TEST_F(PythonCpu, KernelCompiledAtImportWorksAndIsCachedAcrossWorkers) {
  const std::string prelude =
      "import cuda_agent\n\n"
      "_SRC = r'''\n"
      "extern \"C\" __global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,\n"
      "                                      float* __restrict__ out, long long n)\n"
      "{\n"
      "    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
      "    if (i < n) out[i] = a[i] + b[i];\n"
      "}\n"
      "'''\n"
      "_mod = cuda_agent.compile(_SRC)\n"
      "assert _mod.kernel_names == ['add_kernel'], _mod.kernel_names\n"
      "assert _mod.cubin_size > 0\n"
      "assert cuda_agent.target_arch() == 'sm_90', cuda_agent.target_arch()\n"
      "_add = _mod.get_function('add_kernel')\n"
      "assert 'add_kernel(const float* a' in repr(_add), repr(_add)\n";
  const fs::path sol = write("nvrtc_ok/model_new.py", model_new_with_forward(
                                                          "        if a.is_cuda:\n"
                                                          "            out = torch.empty_like(a)\n"
                                                          "            _add((a.numel() + 255) // 256, 256, (a, b, out, a.numel()))\n"
                                                          "            return out\n"
                                                          "        return a + b",
                                                          prelude));
  nlohmann::json r = verify(small_task_, sol);
  ASSERT_EQ(r["ok"], true) << dump(r);
  EXPECT_EQ(r["correct"], true);
  EXPECT_EQ(r["build_path"], "nvrtc");
  EXPECT_EQ(r["runtime"]["nvrtc_compiles"], 1) << dump(r["runtime"]);
  EXPECT_EQ(r["runtime"]["nvrtc_cache_hits"], 0) << dump(r["runtime"]);
  EXPECT_EQ(r["runtime"]["compiled_kernels"], nlohmann::json::array({"add_kernel"}));
  EXPECT_EQ(r["verify"]["trials"].size(), 5u);
  // The CUBIN landed in the solution's own cache folder ($CUDA_AGENT_CACHE_DIR/nvrtc/solutions/
  // <the first 16 digits of its fingerprint>): one solution cannot plant cubins for another.
  const fs::path own = cache_.path() / "nvrtc" / "solutions" / r["solution_sha256"].get<std::string>().substr(0, 16);
  int cubins = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache_.path() / "nvrtc"))
    if (e.path().extension() == ".cubin") {
      ++cubins;
      EXPECT_EQ(e.path().parent_path(), own);
    }
  EXPECT_EQ(cubins, 1);

  // A second worker finds the CUBIN on disk.
  nlohmann::json again = verify(small_task_, sol);
  ASSERT_EQ(again["ok"], true) << dump(again);
  EXPECT_EQ(again["runtime"]["nvrtc_compiles"], 0) << dump(again["runtime"]);
  EXPECT_EQ(again["runtime"]["nvrtc_cache_hits"], 1) << dump(again["runtime"]);

  // The folder is the solution's to write: a cubin planted under its source's key (another
  // kernel's, launched as its own) is not read; the judge's record of what it compiled decides.
  fs::path cubin;
  for (const auto& e : fs::directory_iterator(own))
    if (e.path().extension() == ".cubin") cubin = e.path();
  const std::string honest = read_file(cubin);
  write_file_atomic(cubin, honest.substr(0, honest.size() / 2) + "planted");
  nlohmann::json planted = verify(small_task_, sol);
  ASSERT_EQ(planted["ok"], true) << dump(planted);
  EXPECT_EQ(planted["runtime"]["nvrtc_compiles"], 1) << dump(planted["runtime"]);
  EXPECT_EQ(planted["runtime"]["nvrtc_cache_hits"], 0) << dump(planted["runtime"]);
  EXPECT_EQ(read_file(cubin), honest);
  // A cache folder from before the record (or a record lost): compiled again, then trusted.
  fs::remove_all(cache_.path() / "secret" / "nvrtc");
  EXPECT_EQ(verify(small_task_, sol)["runtime"]["nvrtc_compiles"], 1);
  EXPECT_EQ(verify(small_task_, sol)["runtime"]["nvrtc_cache_hits"], 1);
}

// Byte code planted in the solution's __pycache__ (unchecked-hash .pyc files, which Python runs
// without looking at the source) for model_new.py and a helper it imports: the program that runs
// must be the sources the fingerprint hashes, so the candidate compiles the folder from source.
TEST_F(PythonCpu, PlantedByteCodeDoesNotRunInPlaceOfTheSolutionsSources) {
  const fs::path sol = write("planted_pyc/model_new.py",
                             model_new_with_forward("        return combine(a, b)", "from helpers import combine\n"));
  write("planted_pyc/helpers.py", "def combine(a, b):\n    return a + b\n");
  // The wrong programs, compiled to the cache files the sources' own byte code would use.
  const fs::path planter = write("planter.py", R"(
import importlib.util, py_compile, sys, os
folder = sys.argv[1]
wrong = {'helpers': 'def combine(a, b):\n    return a - b\n',
         'model_new': 'import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return a * b\n'}
for name, text in wrong.items():
    decoy = os.path.join(folder, '.' + name + '.py')
    with open(decoy, 'w') as f:
        f.write(text)
    py_compile.compile(decoy, cfile=importlib.util.cache_from_source(os.path.join(folder, name + '.py')),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    os.remove(decoy)
)");
  SubprocessOptions o;
  o.argv = {python_executable(), planter.string(), sol.parent_path().string()};
  o.stdout_path = o.stderr_path = (work_.path() / "planter.log").string();
  o.timeout_s = 120;
  ASSERT_EQ(run_subprocess(o).exit_code, 0) << read_file(work_.path() / "planter.log");
  int planted = 0;
  for (const auto& e : fs::directory_iterator(sol.parent_path() / "__pycache__"))
    planted += e.path().extension() == ".pyc";
  ASSERT_EQ(planted, 2);
  const auto before = fs::last_write_time(sol.parent_path() / "__pycache__");
  nlohmann::json r = verify(small_task_, sol);
  ASSERT_EQ(r["ok"], true) << dump(r);
  EXPECT_EQ(r["correct"], true) << dump(r);
  // Nothing written there either.
  EXPECT_EQ(fs::last_write_time(sol.parent_path() / "__pycache__"), before);
}

// Regression test (was a bug in src/sandbox/python_module.cpp, compile(), the parse_extern_c_kernels call): a kernel whose
// parameters cannot be typed is meant to be "a compile error too, reported before NVRTC", but the
// cuda_agent.Error it raises is not a CompileError, so the result's category is load_error.
// Raise CompileError (or map cuda_agent.Error from compile() to compile_error).
TEST_F(PythonCpu, KernelWithUntypableParameterIsACompileError) {
  const fs::path sol = write("struct_param/model_new.py",
                             model_new_with_forward("        return a + b",
                                                    "import cuda_agent\n"
                                                    "_SRC = r\'\'\'\n"
                                                    "struct P { float a; };\n"
                                                    "extern \"C\" __global__ void k(P p, float* y) { y[0] = p.a; }\n"
                                                    "\'\'\'\n"
                                                    "_mod = cuda_agent.compile(_SRC)\n"));
  nlohmann::json r = verify(small_task_, sol);
  EXPECT_EQ(r["category"], "compile_error") << dump(r);
  EXPECT_NE(message(r).find("structs and classes cannot be passed by value"), std::string::npos) << message(r);
}

// The candidate process shares its channel to the judge with the solution. Bytes the harness did
// not write (junk, a flood, a frame forged without the channel's key) end the evaluation as
// tampering; the judge neither hangs nor takes them for a reply.
TEST_F(PythonCpu, SolutionCodeOnTheJudgesChannelIsTampering) {
  const std::string junk = model_new_with_forward("        return a + b",
                                                  "import os\n"
                                                  "for fd in range(3, 64):\n"
                                                  "    try:\n"
                                                  "        os.write(fd, b'not a frame' * 100000)\n"
                                                  "    except OSError:\n"
                                                  "        pass\n");
  nlohmann::json r = verify(small_task_, write("junk/model_new.py", junk));
  EXPECT_EQ(r["category"], "tampering") << dump(r);
  EXPECT_NE(message(r).find("channel"), std::string::npos) << message(r);

  // A well-formed "ran" reply with a flattering time, written from forward before the real one.
  const std::string forged = model_new_with_forward(
      "        import json, struct\n"
      "        body = json.dumps({'op': 'ran', 'ms': 0.001, 'outputs': {'t': 'value', 'value': None}}).encode()\n"
      "        os.write(3, struct.pack('<4sQI32s', b'CAF1', 4, len(body), bytes(32)) + body)\n"
      "        return a + b",
      "import os\n");
  r = verify(small_task_, write("forged/model_new.py", forged));
  EXPECT_EQ(r["category"], "tampering") << dump(r);
  EXPECT_NE(message(r).find("MAC"), std::string::npos) << message(r);
}

// A solution run unconfined can write anywhere the user can, the judge's result file included;
// a result is taken only when its MAC verifies under the key the caller gave the judge.
TEST_F(PythonCpu, AResultFileTheSolutionWroteIsNotAResult) {
  const std::string prelude =
      "import json, os, signal\n"
      "folder = os.path.dirname(os.path.dirname(os.environ['TMPDIR']))  # unconfined: the judge's scratch\n"
      "assert os.path.exists(os.path.join(folder, 'request.json')), folder\n"
      "result = os.path.join(folder, 'result.json')\n"
      "with open(result, 'w') as f:\n"
      "    json.dump({'ok': True, 'correct': True, 'reward': 3.0, 'category': None, 'mode': 'verify'}, f)\n"
      "with open(result + '.mac', 'w') as f:\n"
      "    f.write('0' * 64)\n"
      "os.kill(os.getppid(), signal.SIGKILL)\n";
  EvalRequest req;
  req.task_path = small_task_.string();
  req.solution_path = write("forger/model_new.py", model_new_with_forward("        return a + b", prelude)).string();
  req.mode = EvalMode::kVerify;
  req.device = "cpu";
  req.options.confine = "off";
  req.options.timeout_s = 120;
  nlohmann::json r = evaluate(req).to_json();
  EXPECT_EQ(r["ok"], false) << dump(r);
  EXPECT_EQ(r["category"], "tampering") << dump(r);
  EXPECT_EQ(r["reward"], -1.0);
  EXPECT_NE(message(r).find("not written by the evaluation's judge"), std::string::npos) << message(r);
}

}  // namespace
}  // namespace cuda_agent::sandbox
