// `cuda-agent synth` on the GPU: the filters that need it (torch.compile, the eager time window)
// are measured, and each drops the task built to fail it; sampled candidates get through.
#include <iostream>
#include <sstream>

#include <gtest/gtest.h>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/bench/synth.h"
#include "cuda_agent/core/files.h"
#include "gpu_test_util.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

std::string task(const std::string& forward, const std::string& n) {
  return "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
         "        super().__init__()\n\n    def forward(self, x, y):\n" +
         forward + "\n\n\nn = " + n + "\n\n\ndef get_inputs():\n    return [torch.randn(n, n), torch.randn(n, n)]\n\n\n"
         "def get_init_inputs():\n    return []\n";
}

const nlohmann::json& record(const nlohmann::json& records, const std::string& id) {
  for (const auto& r : records)
    if (r["id"] == id) return r;
  static const nlohmann::json none;
  ADD_FAILURE() << "no record of " << id;
  return none;
}

TEST(SynthGpu, TheGpuFiltersAreMeasuredAndDropWhatFailsThem) {
  CA_REQUIRE_GPU();
  testing::prepare_environment();
  TempDir dir("synth-gpu-");
  const fs::path in = dir.path() / "in";
  std::string yaml = "name: synth-gpu-in\ntasks:\n";
  const std::vector<std::pair<std::string, std::string>> tasks = {
      // Matrix products of 8192^2 floats: milliseconds.
      {"in_window", task("        return torch.relu(x @ y) + torch.tanh(y @ x)", "8192")},
      // One small add: microseconds, below the window.
      {"too_fast", task("        return torch.sigmoid(x) * torch.cos(y)", "256")},
  };
  for (const auto& [id, code] : tasks) {
    fs::create_directories(in / "tasks" / id);
    write_file_atomic(in / "tasks" / id / "model.py", code);
    yaml += "  - id: " + id + "\n    path: tasks/" + id + "/model.py\n";
  }
  write_file_atomic(in / "split.yaml", yaml);
  SynthOptions o;
  o.output = dir.path() / "out";
  o.from_split = in;
  o.bench.device = "cuda";
  o.bench.gpus = {0};
  o.bench.workers_per_gpu = 1;
  o.bench.sandbox = testing::fast_options();
  o.bench.sandbox.profile_compile = true;
  std::ostringstream progress;
  const nlohmann::json funnel = run_synth(o, progress);
  const nlohmann::json records = nlohmann::json::parse(read_file(o.output / "work" / "candidates.json"));
  const nlohmann::json& good = record(records, "in_window");
  EXPECT_EQ(good["accepted"], true) << good.dump(1);
  EXPECT_EQ(good["filters"]["torch_compile"]["passed"], true) << good.dump(1);
  EXPECT_EQ(good["filters"]["eager_time"]["passed"], true) << good.dump(1);
  const nlohmann::json& fast = record(records, "too_fast");
  EXPECT_EQ(fast["dropped_by"], "eager_time") << fast.dump(1);
  // The evaluations share the GPU by default: the window reads eager's kernel time.
  EXPECT_NE(fast["filters"]["eager_time"]["detail"].get<std::string>().find("GPU kernel time"), std::string::npos)
      << fast.dump(1);
  EXPECT_EQ(funnel["accepted"], 1);

  // Sampled candidates: every GPU filter measured for each that ran, none degenerate accepted.
  SynthOptions s;
  s.output = dir.path() / "sampled";
  s.catalogue = testing::source_path("data/synth/catalogue.json");
  s.count = 3;
  s.seed = 11;
  s.bench = o.bench;
  s.bench.workers_per_gpu = 3;  // three evaluations on the GPU at once
  const nlohmann::json f2 = run_synth(s, progress);
  const nlohmann::json sampled = nlohmann::json::parse(read_file(s.output / "work" / "candidates.json"));
  ASSERT_EQ(sampled.size(), 3u);
  for (const auto& r : sampled) {
    if (r["filters"].contains("eager_time")) {
      EXPECT_FALSE(r["filters"]["eager_time"]["passed"].is_null()) << r.dump(1);
    }
    if (r["accepted"] == true) {
      EXPECT_EQ(r["filters"]["not_degenerate"]["passed"], true) << r.dump(1);
    }
  }
  EXPECT_EQ(load_split(s.output).tasks.size(), f2["accepted"].get<size_t>());
  std::cout << read_file(s.output / "funnel.md");
}

}  // namespace
}  // namespace cuda_agent::bench
