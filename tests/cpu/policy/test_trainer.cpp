// The trainer end to end on the CPU (rl/trainer.h): a tiny random Qwen2 model with a byte-level
// ChatML tokenizer, a split of two tiny tasks, single-turn episodes scored verify-only, two PPO
// steps of 2 tasks x 2 episodes; then --resume with ppo.steps 3 runs exactly one more step and
// draws the tasks an uninterrupted cursor would have drawn.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chatml_test_util.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/rl/trainer.h"
#include "lm_test_util.h"

using namespace cuda_agent;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string tiny_task(const std::string& doc, const std::string& expr) {
  return "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    \"\"\"" + doc +
         "\"\"\"\n\n    def __init__(self):\n        super().__init__()\n\n    def forward(self, a, b):\n        return " +
         expr + "\n\n\ndef get_inputs():\n    return [torch.randn(64), torch.randn(64)]\n\n\ndef get_init_inputs():\n"
         "    return []\n";
}

// Two tasks in the project's own split format.
void write_split(const fs::path& dir) {
  write_file_atomic(dir / "tasks" / "add" / "model.py", tiny_task("a + b", "a + b"));
  write_file_atomic(dir / "tasks" / "mul" / "model.py", tiny_task("a * b", "a * b"));
  write_file_atomic(dir / "split.yaml",
                    "name: tiny\ndescription: two tiny tasks\ntasks:\n"
                    "  - id: add\n    path: tasks/add/model.py\n    level: 1\n"
                    "  - id: mul\n    path: tasks/mul/model.py\n    level: 1\n");
}

json tiny_config(const fs::path& root, int ppo_steps) {
  json c = rl::train_config_defaults();
  c["run"]["output_dir"] = (root / "run").string();
  c["run"]["seed"] = 5;
  c["model"]["actor"] = (root / "m").string();
  c["model"]["critic"] = "shared";
  c["model"]["dtype"] = "float32";
  c["model"]["device"] = "cpu";
  c["data"]["split"] = (root / "split").string();
  c["data"]["tasks_per_step"] = 2;
  c["rollout"]["episodes_per_task"] = 2;
  c["rollout"]["max_turns"] = 1;
  c["rollout"]["single_turn"] = true;
  c["rollout"]["max_new_tokens"] = 6;
  c["rollout"]["max_context_tokens"] = 4096;
  c["rollout"]["sandbox_timeout_s"] = 120;
  c["stages"]["warmup"]["enabled"] = false;
  c["stages"]["rft"]["enabled"] = false;
  c["stages"]["value_pretrain"]["enabled"] = false;
  c["ppo"]["steps"] = ppo_steps;
  c["ppo"]["batch_size"] = 4;
  c["ppo"]["mini_batches"] = 1;
  c["ppo"]["actor_lr"] = 1e-4;
  c["ppo"]["critic_lr"] = 1e-4;
  c["checkpoint"]["every_steps"] = 0;
  c["checkpoint"]["keep_last"] = 0;
  return c;
}

rl::TrainRunOptions cpu_options(bool resume) {
  rl::TrainRunOptions o;
  o.resume = resume;
  o.device = "cpu";
  return o;
}

}  // namespace

TEST(Trainer, RunsPpoStepsWritesMetricsPlotsCheckpointAndResumesOneStep) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-");
  // The tiny chat model with room for the single-turn system prompt and task (one token a byte).
  cuda_agent::testing::write_tiny_chatml_model(dir.path() / "m");
  {
    json cfg = json::parse(read_file(dir.path() / "m" / "config.json"));
    cfg["max_position_embeddings"] = 4096;
    write_file_atomic(dir.path() / "m" / "config.json", cfg.dump());
  }
  write_split(dir.path() / "split");
  const fs::path run = dir.path() / "run";

  std::ostringstream log;
  const rl::TrainRunSummary first = rl::run_training(tiny_config(dir.path(), 2), cpu_options(false), log);
  EXPECT_EQ(first.steps_run, 2) << log.str();
  EXPECT_EQ(first.last_step, 2);
  EXPECT_TRUE(fs::is_regular_file(run / "config.resolved.yaml"));
  std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(records.size(), 2u) << log.str();
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    EXPECT_EQ(r["step"], static_cast<int>(i + 1));
    EXPECT_EQ(r["stage"], "ppo");
    EXPECT_EQ(r["episodes"], 4) << r.dump();
    EXPECT_EQ(r["episodes_failed"], 0) << r.dump();
    EXPECT_EQ(r["update_skipped"], false) << r.dump() << "\n" << log.str();
    for (const char* key : {"policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "reward_mean", "pass_rate",
                            "faster_than_compile_rate", "response_length_mean"}) {
      ASSERT_TRUE(r.contains(key) && r[key].is_number()) << key << " in " << r.dump();
      EXPECT_TRUE(std::isfinite(r[key].get<double>())) << key << " in " << r.dump();
    }
    EXPECT_GT(r["tokens"].get<int64_t>(), 0);
  }
  EXPECT_TRUE(fs::is_regular_file(run / "plots" / "reward_mean.svg") || !fs::is_empty(run / "plots"));
  EXPECT_TRUE(fs::is_regular_file(run / "rollouts" / "step-000001" / "add-e0" / "trajectory.jsonl") ||
              fs::is_regular_file(run / "rollouts" / "step-000001" / "mul-e0" / "trajectory.jsonl"));
  const rl::CheckpointInfo ckpt = rl::latest_checkpoint(run);
  ASSERT_EQ(ckpt.step, 2);
  EXPECT_EQ(ckpt.state["stage"], "ppo");
  EXPECT_EQ(ckpt.state["step_in_stage"], 2);
  EXPECT_TRUE(fs::is_regular_file(ckpt.dir / "actor" / "model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ckpt.dir / "actor" / "value_head.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ckpt.dir / "actor" / "tokenizer.json"));

  // A fresh run into the same folder is refused; a resume with a changed learning rate is too.
  EXPECT_THROW(rl::run_training(tiny_config(dir.path(), 3), cpu_options(false), log), Error);
  json changed = tiny_config(dir.path(), 3);
  changed["ppo"]["actor_lr"] = 1e-3;
  EXPECT_THROW(rl::run_training(changed, cpu_options(true), log), Error);

  // Resume with one more step.
  const rl::TrainRunSummary second = rl::run_training(tiny_config(dir.path(), 3), cpu_options(true), log);
  EXPECT_EQ(second.steps_run, 1) << log.str();
  EXPECT_EQ(second.first_step, 3);
  EXPECT_EQ(second.last_step, 3);
  EXPECT_NE(log.str().find("not checkpointed"), std::string::npos);
  records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2]["step"], 3);
  EXPECT_TRUE(std::isfinite(records[2]["policy_loss"].get<double>())) << records[2].dump();
  EXPECT_EQ(rl::latest_checkpoint(run).step, 3);
  if (std::getenv("CA_TEST_VERBOSE")) std::cerr << log.str() << records[2].dump(2) << "\n";

  // The tasks of every step are the ones an uninterrupted cursor draws.
  const bench::Split split = bench::load_split(dir.path() / "split");
  rl::TaskCursor cursor(split.tasks.size(), 5);
  for (int step = 1; step <= 3; ++step) {
    json expected = json::array();
    for (size_t i : cursor.next(2)) expected.push_back(split.tasks[i].id);
    EXPECT_EQ(records[step - 1]["tasks"], expected) << "step " << step;
  }
}

TEST(Trainer, MissingActorIsAnErrorNamingTheKey) {
  TempDir dir("ca-trainer-bad-");
  write_split(dir.path() / "split");
  try {
    rl::run_training(tiny_config(dir.path(), 1), cpu_options(false), std::cerr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.actor"), std::string::npos) << e.what();
  }
}
