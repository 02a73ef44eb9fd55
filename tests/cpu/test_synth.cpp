// `cuda-agent synth` without a GPU: the AST similarity on known pairs, the sampler's output
// loading and running at small sizes, each filter dropping a task built to fail it (CPU
// evaluations; the GPU-only filters through their decision on a result), and an LLM's bad replies
// dropped with their reasons, never fatal.
#include "cuda_agent/bench/synth.h"

#include <cstdlib>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/python_runtime.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

const std::string kCatalogue = std::string(CUDA_AGENT_SOURCE_DIR) + "/data/synth/catalogue.json";

std::string module(const std::string& init, const std::string& forward, const std::string& sizes = "n = 64") {
  return "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    \"\"\"A test task.\"\"\"\n\n"
         "    def __init__(self):\n        super().__init__()\n" +
         init + "\n    def forward(self, x, y):\n" + forward + "\n\n" + sizes +
         "\n\n\ndef get_inputs():\n    return [torch.randn(n, n), torch.randn(n, n)]\n\n\n"
         "def get_init_inputs():\n    return []\n";
}

const std::string kBase =
    module("        self.norm = nn.LayerNorm(64)\n",
           "        a = torch.relu(x)\n        b = torch.sigmoid(y)\n        return self.norm(a + b) * 2.0");

TEST(Synth, AstSimilarityOnKnownPairs) {
  EXPECT_DOUBLE_EQ(ast_similarity(kBase, kBase), 1.0);
  // Renamed variables, arguments and attributes, other sizes and constants, another docstring.
  const std::string renamed = module("        self.layer_norm = nn.LayerNorm(128)\n",
                                     "        first = torch.relu(x)\n        second = torch.sigmoid(y)\n        return "
                                     "self.layer_norm(first + second) * 3.0",
                                     "n = 4096");
  EXPECT_DOUBLE_EQ(ast_similarity(kBase, renamed), 1.0);
  // Independent lines in another order.
  const std::string reordered =
      module("        self.norm = nn.LayerNorm(64)\n",
             "        b = torch.sigmoid(y)\n        a = torch.relu(x)\n        return self.norm(a + b) * 2.0");
  EXPECT_GT(ast_similarity(kBase, reordered), 0.9);
  // Other ops: not similar.
  const std::string other =
      module("        self.norm = nn.BatchNorm1d(64)\n",
             "        a = torch.tanh(x)\n        b = torch.exp(y)\n        return self.norm(a * b) - 2.0");
  EXPECT_LT(ast_similarity(kBase, other), 0.9);
  EXPECT_GT(ast_similarity(kBase, other), 0.0);
  const std::string why = testing::error_message([&] { ast_similarity(kBase, "def broken(:\n"); });
  EXPECT_NE(why.find("does not parse"), std::string::npos) << why;
}

TEST(Synth, SampledTasksLoadAndRunAtSmallSizesOnTheCpu) {
  const nlohmann::json s = sample_tasks(kCatalogue, 12, 7, 5);
  ASSERT_EQ(s["candidates"].size(), 12u) << s.dump(1);
  TempDir dir("ca-synth-sample-");
  // Checked here independently of the sampler's own check: each file imports as a module, its
  // size variables set to 8 at most, and its Model runs on get_inputs() to a finite tensor.
  const char* kCheck = R"PY(
import importlib.util, math, sys, torch
ok = 0
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("t", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    for k in [k for k in vars(m) if k.startswith("d") and k[1:].isdigit()]:
        setattr(m, k, min(getattr(m, k), 8))
    model = m.Model(*m.get_init_inputs()).eval()
    with torch.no_grad():
        y = model(*m.get_inputs())
    assert isinstance(y, torch.Tensor) and bool(torch.isfinite(y).all()), path
    ok += 1
print(ok)
)PY";
  SubprocessOptions opts;
  opts.argv = {sandbox::python_executable(), "-c", kCheck};
  int ops_total = 0;
  for (const auto& c : s["candidates"]) {
    const fs::path p = dir.path() / fmt::format("t{}.py", c["index"].get<int>());
    write_file_atomic(p, c["code"].get<std::string>());
    opts.argv.push_back(p.string());
    EXPECT_GE(c["ops"].size(), 1u);
    EXPECT_LE(c["ops"].size(), 5u);
    ops_total += static_cast<int>(c["ops"].size());
    // KernelBench format.
    for (const char* part : {"class Model(nn.Module)", "def get_inputs()", "def get_init_inputs()"})
      EXPECT_NE(c["code"].get<std::string>().find(part), std::string::npos) << c["code"];
  }
  EXPECT_GT(ops_total, 12) << "compositions, not single ops";
  // Sized for the eager window on the roofline estimate (the filter measures on a GPU).
  int in_window = 0;
  for (const auto& c : s["candidates"]) {
    ASSERT_TRUE(c["estimated_eager_ms"].is_number()) << c.dump(1);
    in_window += c["estimated_eager_ms"].get<double>() >= 1 && c["estimated_eager_ms"].get<double>() <= 100;
  }
  EXPECT_GE(in_window, 6) << s.dump(1);
  opts.stdout_path = (dir.path() / "out.txt").string();
  opts.stderr_path = (dir.path() / "err.txt").string();
  opts.timeout_s = 300;
  const SubprocessResult r = run_subprocess(opts);
  EXPECT_TRUE(r.ok()) << r.describe() << "\n" << read_file(dir.path() / "err.txt");
  EXPECT_EQ(read_file(dir.path() / "out.txt"), "12\n");
  // The same seed composes the same tasks.
  EXPECT_EQ(sample_tasks(kCatalogue, 2, 7, 5)["candidates"][1]["code"], s["candidates"][1]["code"]);
}

// Seed 7's 40 compositions hold two that the similarity filter drops as repeats of earlier ones
// (Conv2d + Hardtanh after Conv2d + SELU, 0.91); with max_similarity the sampler draws those
// again, so every candidate it returns passes the filter among the others.
TEST(Synth, TheSamplerDrawsRepeatsAgain) {
  TempDir dir("synth-repeats-");
  auto dropped_as_repeats = [&](const nlohmann::json& s, const std::string& tag) {
    std::vector<std::pair<std::string, fs::path>> files;
    for (const auto& c : s.at("candidates")) {
      const fs::path p = dir.path() / tag / (std::to_string(c.at("index").get<int>()) + ".py");
      fs::create_directories(p.parent_path());
      write_file_atomic(p, c.at("code").get<std::string>());
      files.emplace_back(p.stem().string(), p);
    }
    int dropped = 0;
    const nlohmann::json out = similarity_filter({}, files, 0.9);  // held: the loop reads into it
    for (const auto& r : out.at("results")) dropped += r.value("accepted", false) ? 0 : 1;
    return dropped;
  };
  const nlohmann::json plain = sample_tasks(kCatalogue, 40, 7, 5);
  ASSERT_EQ(plain["candidates"].size(), 40u);
  EXPECT_GE(dropped_as_repeats(plain, "plain"), 1) << "the seed no longer draws a repeat: pick another";
  const nlohmann::json fresh = sample_tasks(kCatalogue, 40, 7, 5, 0.9);
  ASSERT_EQ(fresh["candidates"].size(), 40u) << fresh["rejected"];
  EXPECT_EQ(dropped_as_repeats(fresh, "fresh"), 0);
  int repeats = 0;
  for (const auto& [reason, n] : fresh["rejected"].items())
    if (reason.find("repeat of an earlier candidate") != std::string::npos) repeats += n.get<int>();
  EXPECT_GE(repeats, 1) << fresh["rejected"];
}

// The GPU-only filters decide from a result: torch.compile's failure, eager outside the window.
TEST(Synth, FiltersDecideFromTheEvaluationResult) {
  nlohmann::json gpu = {
      {"mode", "evaluate"},
      {"category", nullptr},
      {"message", ""},
      {"task_check", {{"degenerate", false}}},
      {"timings", {{"eager", {{"median_ms", 5.0}}}, {"compile", {{"median_ms", 2.0}}}, {"compile_error", nullptr}}}};
  nlohmann::json f = synth_filters(gpu, 1, 100);
  for (const char* k : {"runs_eager", "deterministic", "torch_compile", "not_degenerate", "eager_time"})
    EXPECT_EQ(f[k]["passed"], true) << k << " " << f.dump(1);
  gpu["timings"]["eager"]["median_ms"] = 0.2;
  EXPECT_EQ(synth_filters(gpu, 1, 100)["eager_time"]["passed"], false);
  gpu["timings"]["eager"]["median_ms"] = 250.0;
  EXPECT_EQ(synth_filters(gpu, 1, 100)["eager_time"]["passed"], false);
  // The GPU shared with other evaluations: the kernel time decides, not the stretched interval.
  gpu["timings"]["eager"]["gpu_kernel_ms"] = 40.0;
  EXPECT_EQ(synth_filters(gpu, 1, 100, /*shared_gpu=*/true)["eager_time"]["passed"], true);
  EXPECT_EQ(synth_filters(gpu, 1, 100)["eager_time"]["passed"], false);
  gpu["timings"]["eager"]["median_ms"] = 3.0;
  gpu["timings"]["eager"]["gpu_kernel_ms"] = 0.4;
  EXPECT_EQ(synth_filters(gpu, 1, 100, true)["eager_time"]["passed"], false);
  EXPECT_NE(synth_filters(gpu, 1, 100, true)["eager_time"]["detail"].get<std::string>().find("GPU kernel time"),
            std::string::npos);
  gpu["timings"]["compile"] = nullptr;
  gpu["timings"]["compile_error"] = "BackendCompilerFailed: inductor";
  f = synth_filters(gpu, 1, 100);
  EXPECT_EQ(f["torch_compile"]["passed"], false);
  EXPECT_NE(f["torch_compile"]["detail"].get<std::string>().find("BackendCompilerFailed"), std::string::npos);
  EXPECT_FALSE(f.contains("eager_time")) << "later filters do not run once one fails";
  // A verify-only (CPU) result: the GPU filters are not measured, not failed.
  const nlohmann::json cpu = {{"mode", "verify"}, {"category", nullptr}, {"task_check", {{"degenerate", false}}}};
  f = synth_filters(cpu, 1, 100);
  EXPECT_TRUE(f["torch_compile"]["passed"].is_null());
  EXPECT_TRUE(f["eager_time"]["passed"].is_null());
  EXPECT_EQ(f["not_degenerate"]["passed"], true);
  // A reference that gives NaN fails its own comparison: dropped as a degenerate task, not as a
  // nondeterministic one.
  const nlohmann::json nan = {{"mode", "evaluate"},
                              {"category", "mismatch"},
                              {"message", "3 of 64 elements differ"},
                              {"task_check", {{"degenerate", true}, {"nan_output", true}}}};
  f = synth_filters(nan, 1, 100);
  EXPECT_TRUE(f["deterministic"]["passed"].is_null()) << f.dump(1);
  EXPECT_TRUE(f["torch_compile"]["passed"].is_null());
  EXPECT_EQ(f["not_degenerate"]["passed"], false);
  nlohmann::json racy = nan;
  racy["task_check"] = {{"degenerate", false}, {"nan_output", false}};
  EXPECT_EQ(synth_filters(racy, 1, 100)["deterministic"]["passed"], false);
}

class SynthRun : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* k : {"CUDA_AGENT_BIN", "CUDA_AGENT_CACHE_DIR"})
      if (const char* v = std::getenv(k)) saved_.emplace_back(k, v);
    ::setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
    ::setenv("CUDA_AGENT_CACHE_DIR", (dir_.path() / "cache").c_str(), 1);
    opts_.output = dir_.path() / "out";
    opts_.catalogue = kCatalogue;
    opts_.bench.device = "cpu";
    opts_.bench.gpus = {0};
    opts_.bench.workers_per_gpu = 2;
    opts_.bench.sandbox.confine = "off";
    opts_.bench.sandbox.timeout_s = 120;
  }
  void TearDown() override {
    ::unsetenv("CUDA_AGENT_BIN");
    ::unsetenv("CUDA_AGENT_CACHE_DIR");
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  // A split of tasks given by code, under dir_/in.
  fs::path write_split(const std::vector<std::pair<std::string, std::string>>& tasks) {
    const fs::path root = dir_.path() / "in";
    std::string yaml = "name: synth-in\ntasks:\n";
    for (const auto& [id, code] : tasks) {
      fs::create_directories(root / "tasks" / id);
      write_file_atomic(root / "tasks" / id / "model.py", code);
      yaml += fmt::format("  - id: {}\n    path: tasks/{}/model.py\n", id, id);
    }
    write_file_atomic(root / "split.yaml", yaml);
    return root;
  }
  static const nlohmann::json& record(const nlohmann::json& records, const std::string& id) {
    for (const auto& r : records)
      if (r["id"] == id) return r;
    static const nlohmann::json none;
    ADD_FAILURE() << "no record of " << id;
    return none;
  }
  TempDir dir_{"ca-synth-"};
  SynthOptions opts_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(SynthRun, EachFilterDropsTheTaskBuiltToFailIt) {
  const fs::path kb = dir_.path() / "kb" / "level1";
  fs::create_directories(kb);
  // KernelBench's copy of "near_kb", renamed: dropped by similarity to KernelBench.
  write_file_atomic(kb / "1_Near.py",
                    module("", "        s = torch.tanh(x) + torch.cos(y)\n        return s * torch.sinh(y)"));
  opts_.kernelbench = dir_.path() / "kb";
  opts_.from_split = write_split({
      {"good", kBase},
      {"raises", module("", "        return torch.mm(x, y[:3])")},
      {"random", module("", "        return x + torch.rand_like(x)")},
      {"zeros", module("", "        return (x + y) * 1e-9")},
      {"constant", module("", "        return torch.sigmoid(x * 0 + 3.0) + y * 0")},
      {"near_kb", module("", "        t = torch.tanh(x) + torch.cos(y)\n        return t * torch.sinh(y)")},
      {"copy_of_good",
       module("        self.n2 = nn.LayerNorm(64)\n",
              "        p = torch.relu(x)\n        q = torch.sigmoid(y)\n        return self.n2(p + q) * 5.0")},
  });
  std::ostringstream progress;
  const nlohmann::json funnel = run_synth(opts_, progress);
  const nlohmann::json records = nlohmann::json::parse(read_file(opts_.output / "work" / "candidates.json"));
  EXPECT_EQ(record(records, "good")["accepted"], true) << records.dump(1);
  EXPECT_EQ(record(records, "raises")["dropped_by"], "runs_eager");
  EXPECT_NE(record(records, "raises")["filters"]["runs_eager"]["detail"].get<std::string>().find("task_error"),
            std::string::npos)
      << record(records, "raises").dump(1);
  EXPECT_EQ(record(records, "random")["dropped_by"], "deterministic") << record(records, "random").dump(1);
  EXPECT_EQ(record(records, "zeros")["dropped_by"], "not_degenerate") << record(records, "zeros").dump(1);
  EXPECT_EQ(record(records, "constant")["dropped_by"], "not_degenerate") << record(records, "constant").dump(1);
  EXPECT_EQ(record(records, "near_kb")["dropped_by"], "similarity") << record(records, "near_kb").dump(1);
  EXPECT_NE(record(records, "near_kb")["filters"]["similarity"]["detail"].get<std::string>().find("1_Near.py"),
            std::string::npos);
  EXPECT_EQ(record(records, "copy_of_good")["dropped_by"], "similarity") << "a copy of an accepted task";
  // The funnel and the split: the accepted task alone, with its filters' results beside it.
  EXPECT_EQ(funnel["candidates"], 7);
  EXPECT_EQ(funnel["accepted"], 1);
  EXPECT_EQ(funnel["dropped"]["runs_eager"], 1);
  EXPECT_EQ(funnel["dropped"]["deterministic"], 1);
  EXPECT_EQ(funnel["dropped"]["not_degenerate"], 2);
  EXPECT_EQ(funnel["dropped"]["similarity"], 2);
  const Split split = load_split(opts_.output);
  ASSERT_EQ(split.tasks.size(), 1u);
  EXPECT_EQ(split.tasks[0].id, "good");
  const std::string sidecar = read_file(opts_.output / "tasks" / "good" / "task.yaml");
  EXPECT_NE(sidecar.find("not_degenerate"), std::string::npos) << sidecar;
  EXPECT_NE(read_file(opts_.output / "funnel.md").find("| similarity | 2 | 1 |"), std::string::npos)
      << read_file(opts_.output / "funnel.md");
}

TEST_F(SynthRun, BadLlmRepliesAreDroppedWithTheirReasons) {
  int call = 0;
  const std::string runs_not = module("", "        return torch.mm(x, y[:5])");
  opts_.count = 5;
  opts_.llm_name = "test-llm";
  opts_.llm_prompt = "Fuse {ops} (at most {max_ops}).";
  std::vector<std::string> prompts;
  opts_.llm = [&](const std::string& prompt) -> std::string {
    prompts.push_back(prompt);
    switch (call++) {
      case 0:
        return "I cannot help with that.";
      case 1:
        return "```python\ndef broken(:\n    pass\n```";
      case 2:
        return "```python\n" + runs_not + "```";
      case 3:
        throw Error("the server went away");
      default:
        return "Here it is:\n```python\n" + kBase + "```\nDone.";
    }
  };
  std::ostringstream progress;
  const nlohmann::json funnel = run_synth(opts_, progress);
  const nlohmann::json records = nlohmann::json::parse(read_file(opts_.output / "work" / "candidates.json"));
  ASSERT_EQ(records.size(), 5u);
  auto detail = [&](int i, const char* filter) { return records[i]["filters"][filter]["detail"].get<std::string>(); };
  EXPECT_EQ(records[0]["dropped_by"], "composed");
  EXPECT_NE(detail(0, "composed").find("no code"), std::string::npos) << detail(0, "composed");
  EXPECT_EQ(records[1]["dropped_by"], "composed");
  EXPECT_NE(detail(1, "composed").find("does not parse"), std::string::npos) << detail(1, "composed");
  EXPECT_EQ(records[2]["dropped_by"], "runs_eager") << records[2].dump(1);
  EXPECT_EQ(records[3]["dropped_by"], "composed");
  EXPECT_NE(detail(3, "composed").find("the server went away"), std::string::npos) << detail(3, "composed");
  EXPECT_EQ(records[4]["accepted"], true) << records[4].dump(1);
  EXPECT_EQ(funnel["accepted"], 1);
  EXPECT_EQ(funnel["composer"], "test-llm");
  // The prompts name catalogue ops and the limit.
  ASSERT_EQ(prompts.size(), 5u);
  EXPECT_NE(prompts[0].find("torch."), std::string::npos) << prompts[0];
  EXPECT_NE(prompts[0].find("(at most 5)"), std::string::npos) << prompts[0];
}

}  // namespace
}  // namespace cuda_agent::bench
