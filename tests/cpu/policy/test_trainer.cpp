// The trainer end to end on the CPU (rl/trainer.h): a tiny random Qwen2 model with a byte-level
// ChatML tokenizer, a split of two tiny tasks, single-turn episodes scored verify-only, two PPO
// steps of 2 tasks x 2 episodes; then --resume with ppo.steps 3 runs exactly one more step and
// draws the tasks an uninterrupted cursor would have drawn. The RFT and value-pretraining stages:
// their order and metrics, what each moves (RFT the actor, value pretraining the critic only),
// RFT alone, a resume between them that ends where an uninterrupted run does, RFT keeping nothing,
// and value pretraining sampling its own trajectories when there are no RFT ones.
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chatml_test_util.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/rl/ablation.h"
#include "cuda_agent/rl/rollout.h"
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
         "\"\"\"\n\n    def __init__(self):\n        super().__init__()\n\n    def forward(self, a, b):\n        "
         "return " +
         expr +
         "\n\n\ndef get_inputs():\n    return [torch.randn(64), torch.randn(64)]\n\n\ndef get_init_inputs():\n"
         "    return []\n";
}

// Two tasks in the project's own split format; with `oversized`, a third ("long") whose docstring
// alone outgrows the tiny model's 4096-token context (one token a byte): its prompt does not fit,
// the policy refuses it and the episode ends with stop reason context_full and no assistant turn.
void write_split(const fs::path& dir, bool oversized = false) {
  write_file_atomic(dir / "tasks" / "add" / "model.py", tiny_task("a + b", "a + b"));
  write_file_atomic(dir / "tasks" / "mul" / "model.py", tiny_task("a * b", "a * b"));
  std::string yaml = "name: tiny\ndescription: tiny tasks\ntasks:\n"
                     "  - id: add\n    path: tasks/add/model.py\n    level: 1\n"
                     "  - id: mul\n    path: tasks/mul/model.py\n    level: 1\n";
  if (oversized) {
    write_file_atomic(dir / "tasks" / "long" / "model.py", tiny_task("a - b. " + std::string(6000, 'x'), "a - b"));
    yaml += "  - id: long\n    path: tasks/long/model.py\n    level: 1\n";
  }
  write_file_atomic(dir / "split.yaml", yaml);
}

// The tiny chat model with room for the single-turn system prompt and task (one token a byte).
void write_model(const fs::path& dir) {
  cuda_agent::testing::write_tiny_chatml_model(dir);
  json cfg = json::parse(read_file(dir / "config.json"));
  cfg["max_position_embeddings"] = 4096;
  write_file_atomic(dir / "config.json", cfg.dump());
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

// RFT and value pretraining on every task of the split, one episode each; PPO (when enabled) on
// 2 tasks x 1 episode. The random model scores -1, so RFT keeps reward > -10: every run the stop
// reasons allow. Learning rates large enough that one step shows in the weights.
json stage_config(const fs::path& root, const std::string& run) {
  json c = tiny_config(root, 1);
  c["run"]["output_dir"] = (root / run).string();
  c["rollout"]["episodes_per_task"] = 1;
  c["ppo"]["batch_size"] = 2;
  c["ppo"]["enabled"] = false;
  c["stages"]["rft"]["enabled"] = true;
  c["stages"]["rft"]["keep_reward_above"] = -10.0;
  c["stages"]["rft"]["tasks"] = 0;
  c["stages"]["rft"]["batch_size"] = 1;
  c["stages"]["rft"]["lr"] = 1e-3;
  c["stages"]["value_pretrain"]["enabled"] = false;
  c["stages"]["value_pretrain"]["steps"] = 3;
  c["stages"]["value_pretrain"]["lr"] = 1e-2;
  return c;
}

// The log-probs and values of a fixed sequence under a saved actor (value head included).
lm::TrainForward probe(const fs::path& actor) {
  lm::LmOptions o;
  o.value_head = true;
  o.seed = 5;
  auto model = lm::load_language_model(actor, o);
  return model->forward_for_training({cuda_agent::testing::test_tokens(48, 258)}, {})[0];
}

fs::path checkpoint_dir(const fs::path& run, int step) {
  return run / "checkpoints" / fmt::format("step-{:06d}", step);
}

std::vector<std::string> stages_of(const std::vector<json>& records) {
  std::vector<std::string> out;
  for (const json& r : records) out.push_back(r["stage"].get<std::string>());
  return out;
}

// A metrics record without its wall times (they differ between any two runs).
json without_timings(json r) {
  for (const char* key :
       {"episode_seconds", "update_seconds", "step_seconds", "tokens_per_second", "generation_seconds", "tool_seconds",
        "tool_gpu_wait_seconds", "generation_quiet_wait_seconds", "scoring_seconds", "generation_tokens_per_s",
        "training_tokens_per_s"})
    r.erase(key);
  return r;
}

bool finite_number(const json& r, const char* key) {
  return r.contains(key) && r[key].is_number() && std::isfinite(r[key].get<double>());
}

}  // namespace

TEST(Trainer, RunsPpoStepsWritesMetricsPlotsCheckpointAndResumesOneStep) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-");
  write_model(dir.path() / "m");
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
    for (const char* key : {"policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "reward_mean", "reward_std",
                            "pass_rate", "faster_than_compile_rate", "response_length_mean"}) {
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
  EXPECT_TRUE(fs::is_regular_file(ckpt.dir / "optimizer.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ckpt.dir / "learner_state.json"));
  EXPECT_FALSE(fs::exists(ckpt.dir / "critic"));  // the shared critic lives in actor/
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

// A task the split flags degenerate (a trivial kernel passes it) is left out of training: it is
// never drawn, and the log says how many were dropped. Episodes whose own evaluation flags the
// task are masked (trainer_stages.cpp, counted as episodes_degenerate).
TEST(Trainer, TasksFlaggedDegenerateAreLeftOut) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-degenerate-");
  write_model(dir.path() / "m");
  const fs::path split = dir.path() / "split";
  write_split(split);
  write_file_atomic(split / "tasks" / "flat" / "model.py", tiny_task("a * 0", "a * 0"));
  write_file_atomic(split / "split.yaml", read_file(split / "split.yaml") +
                                              "  - id: flat\n    path: tasks/flat/model.py\n    level: 1\n"
                                              "    degenerate: true\n");
  std::ostringstream log;
  const rl::TrainRunSummary run = rl::run_training(tiny_config(dir.path(), 2), cpu_options(false), log);
  EXPECT_EQ(run.steps_run, 2) << log.str();
  EXPECT_NE(log.str().find("1 of 3 tasks in tiny are flagged degenerate and left out"), std::string::npos) << log.str();
  for (const json& r : rl::MetricsLog::read(dir.path() / "run" / "metrics.jsonl")) {
    for (const json& id : r["tasks"]) EXPECT_NE(id, "flat") << r.dump();
    EXPECT_EQ(r["episodes_degenerate"], 0) << r.dump();
  }
}

// A run stopped before its first checkpoint leaves metrics and rollouts but nothing to resume
// from: a fresh start and --resume both start over (and say so) instead of refusing each other.
TEST(Trainer, ARunStoppedBeforeItsFirstCheckpointStartsOverEitherWay) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-dead-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  const fs::path run = dir.path() / "run";
  auto leave_a_dead_run = [&] {
    write_file_atomic(run / "metrics.jsonl", "{\"step\": 1}\n");
    write_file_atomic(run / "rollouts" / "step-000001" / "add-e0" / "trajectory.jsonl", "{}\n");
  };
  for (const bool resume : {false, true}) {
    SCOPED_TRACE(resume ? "--resume" : "fresh start");
    leave_a_dead_run();
    std::ostringstream log;
    const rl::TrainRunSummary summary = rl::run_training(tiny_config(dir.path(), 1), cpu_options(resume), log);
    EXPECT_EQ(summary.steps_run, 1) << log.str();
    EXPECT_NE(log.str().find("stopped before its first checkpoint: starting over"), std::string::npos) << log.str();
    EXPECT_EQ(rl::MetricsLog::read(run / "metrics.jsonl").size(), 1u);
    EXPECT_EQ(rl::latest_checkpoint(run).step, 1);
    fs::remove_all(run / "checkpoints");  // dead again for the next round
  }
  // With a checkpoint there, a fresh start still refuses and names --resume.
  std::ostringstream log;
  rl::run_training(tiny_config(dir.path(), 1), cpu_options(false), log);
  try {
    rl::run_training(tiny_config(dir.path(), 1), cpu_options(false), log);
    ADD_FAILURE() << "a fresh start over a checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
}

// SIGTERM (or Ctrl-C) stops training after the episode under way, with a message that says
// where it stopped and how to go on, and the exit status 128 + the signal.
TEST(Trainer, ASignalStopsTheRunWithAMessage) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-signal-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  json config = tiny_config(dir.path(), 3);
  config["model"]["dtype"] = "bfloat16";  // the CPU picks float32 itself, and says so
  write_file_atomic(dir.path() / "train.yaml", config.dump(2));
  SubprocessOptions sp;
  sp.argv = {CUDA_AGENT_BINARY, "train", "--config", (dir.path() / "train.yaml").string(), "--device", "cpu"};
  sp.stdout_path = (dir.path() / "out.txt").string();
  sp.stderr_path = (dir.path() / "err.txt").string();
  sp.timeout_s = 600;
  std::thread stopper([&] {
    // Once the first episode has started (its folder exists), ask the run to stop.
    const fs::path episode = dir.path() / "run" / "rollouts" / "step-000001";
    for (int i = 0; i < 1200 && !fs::exists(episode); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string cmdline;
      try {
        cmdline = read_file(e.path() / "cmdline");
      } catch (...) {
        continue;
      }
      if (cmdline.find((dir.path() / "train.yaml").string()) != std::string::npos) ::kill(std::stoi(name), SIGTERM);
    }
  });
  const SubprocessResult r = run_subprocess(sp);
  stopper.join();
  const std::string err = read_file(sp.stderr_path);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.describe() << "\n" << err;
  EXPECT_NE(err.find("model.dtype bfloat16 is slow on the CPU: the model runs in float32"), std::string::npos) << err;
  EXPECT_NE(err.find("SIGTERM received"), std::string::npos) << err;
  EXPECT_NE(err.find("[train] stopped by SIGTERM during step 1"), std::string::npos) << err;
  EXPECT_NE(err.find("No checkpoint was written yet"), std::string::npos) << err;
  EXPECT_NE(err.find("episode/min"), std::string::npos) << "progress inside the step: " << err;
  EXPECT_NE(err.find("step 1, "), std::string::npos) << "progress inside the step: " << err;
}

// The paper's separate critic (model.critic from_actor, the default) and an exact resume: one PPO
// step, then --resume for the second, ends with the same actor, critic and step-2 metrics as two
// uninterrupted steps (the optimizer moments, the shuffle generator, the cursor and the episode
// seeds all come back).
TEST(Trainer, SeparateCriticAndResumeReproducesTheNextStepExactly) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-exact-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  auto config = [&](const std::string& run, int steps) {
    json c = tiny_config(dir.path(), steps);
    c["run"]["output_dir"] = (dir.path() / run).string();
    c["model"]["critic"] = "from_actor";
    c["data"]["tasks_per_step"] = 1;
    c["ppo"]["batch_size"] = 2;
    c["checkpoint"]["every_steps"] = 1;
    return c;
  };
  std::ostringstream log;
  rl::run_training(config("straight", 2), cpu_options(false), log);
  rl::run_training(config("resumed", 1), cpu_options(false), log);
  const rl::TrainRunSummary resumed = rl::run_training(config("resumed", 2), cpu_options(true), log);
  ASSERT_EQ(resumed.first_step, 2) << log.str();

  const fs::path a = checkpoint_dir(dir.path() / "straight", 2), b = checkpoint_dir(dir.path() / "resumed", 2);
  for (const char* file : {"actor/model.safetensors", "critic/model.safetensors", "critic/value_head.safetensors",
                           "optimizer.safetensors"}) {
    ASSERT_TRUE(fs::is_regular_file(a / file)) << file;
    EXPECT_TRUE(read_file(a / file) == read_file(b / file)) << file << " differs after the resume";
  }
  EXPECT_FALSE(fs::exists(a / "actor" / "value_head.safetensors"));  // the actor carries no critic
  // The step-1 checkpoint's optimizer state differs from step 2's: the test compares moved state.
  EXPECT_FALSE(read_file(checkpoint_dir(dir.path() / "straight", 1) / "optimizer.safetensors") ==
               read_file(a / "optimizer.safetensors"));
  const json x = without_timings(rl::MetricsLog::read(dir.path() / "straight" / "metrics.jsonl").at(1));
  const json y = without_timings(rl::MetricsLog::read(dir.path() / "resumed" / "metrics.jsonl").at(1));
  EXPECT_EQ(x, y);
  EXPECT_TRUE(finite_number(x, "value_loss") && finite_number(x, "policy_loss")) << x.dump();
}

// rollout.concurrent_episodes: a step's episodes run in threads sampling from one model at once;
// each is seeded as before and the batch keeps their order, so the run is the run of one episode
// at a time: same trajectories, metrics and weights.
TEST(Trainer, ConcurrentEpisodesTrainLikeOneAtATime) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-concurrent-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  std::ostringstream log;
  for (int concurrent : {1, 3}) {
    json c = tiny_config(dir.path(), 2);
    c["run"]["output_dir"] = (dir.path() / fmt::format("c{}", concurrent)).string();
    c["rollout"]["max_new_tokens"] = 24;
    c["rollout"]["concurrent_episodes"] = concurrent;
    c["checkpoint"]["every_steps"] = 2;
    rl::run_training(c, cpu_options(false), log);
  }
  // The same three at once through the batched decoder, whose KV pool holds what three episodes
  // can fill (each turn within the context and max_new_tokens), not rollout.kv_tokens' default.
  {
    json c = tiny_config(dir.path(), 2);
    c["run"]["output_dir"] = (dir.path() / "engine").string();
    c["rollout"]["max_new_tokens"] = 24;
    c["rollout"]["concurrent_episodes"] = 3;
    c["rollout"]["batch_engine"] = true;
    std::ostringstream engine_log;
    EXPECT_EQ(rl::run_training(c, cpu_options(false), engine_log).steps_run, 2) << engine_log.str();
    EXPECT_NE(engine_log.str().find("[train] the batch engine's KV pool: 12360 positions (3 episode(s) at once, each "
                                    "within 4096 + 24 tokens; rollout.kv_tokens 131072)"),
              std::string::npos)
        << engine_log.str();
  }
  const fs::path one = dir.path() / "c1", three = dir.path() / "c3";
  const std::vector<json> a = rl::MetricsLog::read(one / "metrics.jsonl"), b = rl::MetricsLog::read(three / "metrics.jsonl");
  ASSERT_EQ(a.size(), 2u) << log.str();
  ASSERT_EQ(b.size(), 2u) << log.str();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["episodes"], 4) << a[i].dump();
    EXPECT_EQ(without_timings(a[i]), without_timings(b[i])) << "step " << i + 1;
  }
  size_t trajectories = 0;
  for (const auto& entry : fs::recursive_directory_iterator(one / "rollouts")) {
    if (entry.path().filename() != "trajectory.jsonl") continue;
    ++trajectories;
    const fs::path other = three / fs::relative(entry.path(), one);
    ASSERT_TRUE(fs::is_regular_file(other)) << other;
    auto replies = [](const fs::path& file) {  // the sampled tokens and log-probs of each reply
      std::vector<json> out;
      for (const json& e : rl::read_trajectory(file))
        if (e.value("type", "") == "assistant") out.push_back({e.at("completion_token_ids"), e.at("completion_logprobs")});
      return out;
    };
    const std::vector<json> x = replies(entry.path());
    ASSERT_FALSE(x.empty()) << entry.path();
    EXPECT_EQ(x, replies(other)) << entry.path();
    // (the decoder's tokens; its log-probs come from batched matrix products)
    const std::vector<json> batched = replies(dir.path() / "engine" / fs::relative(entry.path(), one));
    ASSERT_EQ(batched.size(), x.size()) << entry.path();
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(batched[i][0], x[i][0]) << entry.path() << " reply " << i;
  }
  EXPECT_EQ(trajectories, 8u);
  for (const char* file : {"actor/model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(checkpoint_dir(one, 2) / file) == read_file(checkpoint_dir(three, 2) / file)) << file;
}

// rollout.off_policy_steps = 1: step 2's episodes are sampled while the learner takes step 1,
// from the weights step 1 sampled with; step 3's from those after step 1's update. The metrics
// say how stale each step was. A checkpoint taken while a step's episodes were sampled ahead
// keeps the cursor from before them: a run resumed there draws the tasks of the uninterrupted one.
TEST(Trainer, OffPolicyStepsSampleTheNextStepBesideTheUpdate) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-offpolicy-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  auto config = [&](const std::string& run, int steps) {
    json c = tiny_config(dir.path(), steps);
    c["run"]["output_dir"] = (dir.path() / run).string();
    c["rollout"]["off_policy_steps"] = 1;
    c["rollout"]["max_new_tokens"] = 16;
    c["data"]["tasks_per_step"] = 1;  // one task a step: the cursor's order shows in each step's task
    c["ppo"]["batch_size"] = 2;
    c["ppo"]["actor_lr"] = 3e-3;  // one update moves the log-probs visibly
    c["checkpoint"]["every_steps"] = 1;
    c["checkpoint"]["keep_last"] = 0;
    return c;
  };
  std::ostringstream log;
  rl::run_training(config("off", 3), cpu_options(false), log);
  const fs::path run = dir.path() / "off";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(records.size(), 3u) << log.str();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(records[i]["rollout_staleness"], i == 0 ? 0 : 1) << records[i].dump();
    EXPECT_EQ(records[i]["episodes"], 2) << records[i].dump();
    EXPECT_EQ(records[i]["update_skipped"], false) << records[i].dump();
    EXPECT_EQ(records[i].contains("rollout_wait_seconds"), i < 2) << records[i].dump();  // the last has no next
    EXPECT_EQ(records[i].contains("rollout_overlapped_seconds"), i > 0) << records[i].dump();
  }

  // Each reply's recorded log-probs against those of a model: the largest difference.
  auto difference = [](const fs::path& step_dir, const fs::path& actor) {
    lm::LmOptions o;
    o.seed = 5;
    auto model = lm::load_language_model(actor, o);
    double worst = 0;
    int replies = 0;
    for (const auto& entry : fs::recursive_directory_iterator(step_dir)) {
      if (entry.path().filename() != "trajectory.jsonl") continue;
      for (const json& e : rl::read_trajectory(entry.path())) {
        if (e.value("type", "") != "assistant") continue;
        std::vector<int64_t> seq = e.at("prompt_token_ids").get<std::vector<int64_t>>();
        const size_t prompt = seq.size();
        const auto completion = e.at("completion_token_ids").get<std::vector<int64_t>>();
        const auto recorded = e.at("completion_logprobs").get<std::vector<double>>();
        seq.insert(seq.end(), completion.begin(), completion.end());
        const lm::TrainForward f = model->forward_for_training({seq}, {})[0];
        for (size_t i = 0; i < completion.size(); ++i)
          worst = std::max(worst, std::abs(f.logprobs[prompt + i] - recorded[i]));
        ++replies;
      }
    }
    EXPECT_GT(replies, 0) << step_dir;
    return worst;
  };
  const fs::path initial = dir.path() / "m", after_one = checkpoint_dir(run, 1) / "actor";
  EXPECT_LT(difference(run / "rollouts" / "step-000002", initial), 1e-3);
  EXPECT_GT(difference(run / "rollouts" / "step-000002", after_one), 1e-2) << "the update did not move the log-probs";
  EXPECT_LT(difference(run / "rollouts" / "step-000003", after_one), 1e-3);

  // Resumed after step 1 (while step 2 had been sampled ahead): step 2 is sampled again, on-policy,
  // from the same tasks.
  for (const char* later : {"step-000002", "step-000003"}) fs::remove_all(run / "checkpoints" / later);
  write_file_atomic(run / "checkpoints" / "latest", "step-000001\n");
  rl::run_training(config("off", 3), cpu_options(true), log);
  const std::vector<json> resumed = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(resumed.size(), 3u) << log.str();
  EXPECT_EQ(resumed[1]["rollout_staleness"], 0) << resumed[1].dump();
  EXPECT_EQ(resumed[2]["rollout_staleness"], 1) << resumed[2].dump();
  for (int i = 1; i < 3; ++i) EXPECT_EQ(resumed[i]["tasks"], records[i]["tasks"]) << "step " << i + 1;

  json bad = config("bad", 1);
  bad["rollout"]["off_policy_steps"] = 2;
  EXPECT_NE(cuda_agent::testing::error_of([&] {
              rl::run_training(bad, cpu_options(false), log);
            }).find("rollout.off_policy_steps = 2"),
            std::string::npos);
}

// Data parallelism end to end: `cuda-agent train` started twice with torchrun's variables (two
// CPU processes) runs one job: each process samples its share of each step's tasks, the update
// is one step over both shares, and rank 0 alone writes the metrics (the job's episodes) and the
// checkpoints.
TEST(Trainer, TwoProcessesRunOneJob) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-dp-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  json c = tiny_config(dir.path(), 2);  // 2 tasks x 2 episodes a step: one task per process
  c["model"]["critic"] = "from_actor";
  write_file_atomic(dir.path() / "train.yaml", c.dump(2));  // JSON is YAML
  const int port = cuda_agent::testing::free_local_port();
  std::vector<SubprocessResult> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      SubprocessOptions p;
      // No SKILL.md: the tiny model's context holds the single-turn prompt only (as in the tests above).
      p.argv = {CUDA_AGENT_BINARY, "train", "--config", (dir.path() / "train.yaml").string(), "--device", "cpu",
                "--skill", ""};
      p.env_set = cuda_agent::testing::torchrun_env(rank, 2, port);
      p.stdout_path = p.stderr_path = (dir.path() / fmt::format("rank{}.log", rank)).string();
      p.timeout_s = 600;
      results[rank] = run_subprocess(p);
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ":\n" << read_file(dir.path() / fmt::format("rank{}.log", rank));
  EXPECT_NE(read_file(dir.path() / "rank1.log").find("process 1 of 2"), std::string::npos);

  const fs::path run = dir.path() / "run";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);  // one line a step, from rank 0 only
  for (const json& r : records) {
    EXPECT_EQ(r["episodes"], 4) << r.dump();  // both processes' episodes
    EXPECT_EQ(r["tasks"].size(), 2u) << r.dump();
    EXPECT_EQ(r["update_skipped"], false) << r.dump();
    EXPECT_TRUE(finite_number(r, "policy_loss") && finite_number(r, "value_loss")) << r.dump();
  }
  // Each step's four episodes: two tasks, each sampled by its own process.
  size_t episodes = 0;
  for (const auto& entry : fs::directory_iterator(run / "rollouts" / "step-000001"))
    episodes += fs::is_regular_file(entry.path() / "trajectory.jsonl");
  EXPECT_EQ(episodes, 4u);
  const rl::CheckpointInfo ckpt = rl::latest_checkpoint(run);
  EXPECT_EQ(ckpt.step, 2);
  for (const char* file : {"actor/model.safetensors", "critic/model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(ckpt.dir / file)) << file;
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

// The recipe's stages 2 to 4 in order on a split of three tasks, one of which cannot be prompted
// (context_full with no reply: RFT drops it as no_reply, value pretraining cannot use it). Then the same run with RFT
// alone, resumed with value pretraining enabled, ends where the uninterrupted run did.
TEST(Trainer, RftThenValuePretrainThenPpoAndResumeBetweenThem) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-rft-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split", /*oversized=*/true);

  json full = stage_config(dir.path(), "run");
  full["stages"]["value_pretrain"]["enabled"] = true;
  full["ppo"]["enabled"] = true;
  std::ostringstream log;
  const rl::TrainRunSummary summary = rl::run_training(full, cpu_options(false), log);
  EXPECT_EQ(summary.steps_run, 3) << log.str();
  EXPECT_EQ(summary.last_step, 3);
  const fs::path run = dir.path() / "run";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), (std::vector<std::string>{"rft", "value_pretrain", "ppo"})) << log.str();
  EXPECT_EQ(log.str().find("not implemented"), std::string::npos) << log.str();

  // RFT: every task of the split, the oversized one dropped (no reply), the rest kept.
  const json& rft = records[0];
  EXPECT_EQ(rft["step"], 1);
  EXPECT_EQ(rft["tasks"], json({"add", "mul", "long"})) << rft.dump();
  EXPECT_EQ(rft["episodes"], 3) << rft.dump();
  EXPECT_EQ(rft["kept"], 2) << rft.dump();
  EXPECT_EQ(rft["dropped"], 1) << rft.dump();
  EXPECT_EQ(rft["dropped_by_reason"], json({{"no_reply", 1}})) << rft.dump();
  EXPECT_EQ(rft["update_skipped"], false) << rft.dump() << "\n" << log.str();
  EXPECT_EQ(rft["optimizer_steps"], 2) << rft.dump();  // ceil(2 kept / batch_size 1) x 1 epoch
  for (const char* key : {"loss", "entropy", "grad_norm_actor", "reward_mean", "pass_rate", "step_seconds"})
    EXPECT_TRUE(finite_number(rft, key)) << key << " in " << rft.dump();
  EXPECT_GT(rft["loss"].get<double>(), 0) << rft.dump();
  EXPECT_GT(rft["grad_norm_actor"].get<double>(), 0) << rft.dump();
  EXPECT_GT(rft["policy_tokens"].get<int64_t>(), 0) << rft.dump();
  EXPECT_GT(rft["tokens"].get<int64_t>(), rft["policy_tokens"].get<int64_t>()) << rft.dump();
  for (const char* task : {"add", "mul", "long"})
    EXPECT_TRUE(fs::is_regular_file(run / "rollouts" / "rft" / fmt::format("{}-e0", task) / "trajectory.jsonl"))
        << task;
  EXPECT_NE(log.str().find("no_reply 1"), std::string::npos) << log.str();
  const std::string long_episode = read_file(run / "rollouts" / "rft" / "long-e0" / "trajectory.jsonl");
  EXPECT_NE(long_episode.find("\"stop_reason\":\"context_full\""), std::string::npos) << long_episode.substr(0, 2000);

  // Value pretraining on RFT's trajectories, kept or not: 3 steps over 2 usable sequences (two
  // passes: 2 mini-batches, then 1).
  const json& vp = records[1];
  EXPECT_EQ(vp["step"], 2);
  EXPECT_EQ(vp["source"], "rft") << vp.dump();
  EXPECT_EQ(vp["trajectories"], 3) << vp.dump();
  EXPECT_EQ(vp["episodes_unusable"], 1) << vp.dump();
  EXPECT_EQ(vp["sequences"], 2) << vp.dump();
  EXPECT_EQ(vp["update_skipped"], false) << vp.dump();
  EXPECT_EQ(vp["optimizer_steps"], 3) << vp.dump();
  EXPECT_EQ(vp["passes"], 2) << vp.dump();
  for (const char* key : {"value_loss", "value_loss_first_pass", "value_loss_last_pass", "value_clip_fraction",
                          "grad_norm_critic"})
    EXPECT_TRUE(finite_number(vp, key)) << key << " in " << vp.dump();
  EXPECT_GT(vp["grad_norm_critic"].get<double>(), 0) << vp.dump();
  EXPECT_FALSE(fs::exists(run / "rollouts" / "value_pretrain"));

  const json& ppo = records[2];
  EXPECT_EQ(ppo["step"], 3);
  EXPECT_EQ(ppo["step_in_stage"], 1);
  EXPECT_EQ(ppo["update_skipped"], false) << ppo.dump();
  EXPECT_TRUE(fs::is_directory(run / "rollouts" / "step-000003"));

  // A checkpoint per stage; RFT moved the actor, value pretraining only the critic.
  const char* stage_names[] = {"rft", "value_pretrain", "ppo"};
  for (int step = 1; step <= 3; ++step) {
    const json state = json::parse(read_file(checkpoint_dir(run, step) / "state.json"));
    EXPECT_EQ(state["stage"], stage_names[step - 1]);
  }
  const lm::TrainForward initial = probe(dir.path() / "m");
  const lm::TrainForward after_rft = probe(checkpoint_dir(run, 1) / "actor");
  const lm::TrainForward after_vp = probe(checkpoint_dir(run, 2) / "actor");
  EXPECT_GT(cuda_agent::testing::max_abs_diff(initial.logprobs, after_rft.logprobs), 1e-4);
  EXPECT_EQ(after_rft.logprobs, after_vp.logprobs);
  EXPECT_GT(cuda_agent::testing::max_abs_diff(after_rft.values, after_vp.values), 1e-3);
  EXPECT_TRUE(read_file(checkpoint_dir(run, 1) / "actor" / "model.safetensors") ==
              read_file(checkpoint_dir(run, 2) / "actor" / "model.safetensors"))
      << "value pretraining changed the actor's weights";
  EXPECT_FALSE(read_file(checkpoint_dir(run, 1) / "actor" / "value_head.safetensors") ==
               read_file(checkpoint_dir(run, 2) / "actor" / "value_head.safetensors"))
      << "value pretraining left the value head as it was";

  // RFT alone runs RFT only.
  const fs::path run_b = dir.path() / "run-b";
  const rl::TrainRunSummary only_rft = rl::run_training(stage_config(dir.path(), "run-b"), cpu_options(false), log);
  EXPECT_EQ(only_rft.steps_run, 1) << log.str();
  std::vector<json> records_b = rl::MetricsLog::read(run_b / "metrics.jsonl");
  ASSERT_EQ(stages_of(records_b), std::vector<std::string>{"rft"});
  EXPECT_EQ(rl::latest_checkpoint(run_b).state["stage"], "rft");
  EXPECT_EQ(records_b[0]["loss"], records[0]["loss"]) << "the same seeds sample the same episodes";

  // An interrupted value pretraining left a metrics line and a rollout folder behind; resuming
  // with it enabled drops both, redoes it from its start and reaches the uninterrupted state.
  rl::MetricsLog(run_b / "metrics.jsonl").append({{"step", 2}, {"stage", "value_pretrain"}});
  write_file_atomic(run_b / "rollouts" / "value_pretrain" / "add-e0" / "trajectory.jsonl", "{}\n");
  json resumed = stage_config(dir.path(), "run-b");
  resumed["stages"]["value_pretrain"]["enabled"] = true;
  const rl::TrainRunSummary rest = rl::run_training(resumed, cpu_options(true), log);
  EXPECT_EQ(rest.steps_run, 1) << log.str();
  EXPECT_EQ(rest.first_step, 2);
  records_b = rl::MetricsLog::read(run_b / "metrics.jsonl");
  ASSERT_EQ(stages_of(records_b), (std::vector<std::string>{"rft", "value_pretrain"})) << log.str();
  EXPECT_FALSE(fs::exists(run_b / "rollouts" / "value_pretrain"));
  EXPECT_EQ(records_b[1]["sequences"], vp["sequences"]);
  EXPECT_NEAR(records_b[1]["value_loss"].get<double>(), vp["value_loss"].get<double>(), 1e-5);
  const lm::TrainForward resumed_vp = probe(checkpoint_dir(run_b, 2) / "actor");
  EXPECT_EQ(resumed_vp.logprobs, after_vp.logprobs);
  EXPECT_LT(cuda_agent::testing::max_abs_diff(resumed_vp.values, after_vp.values), 1e-5);
  if (std::getenv("CA_TEST_VERBOSE")) std::cerr << log.str() << records[0].dump(2) << "\n" << vp.dump(2) << "\n";
}

// RFT that keeps nothing says so and leaves the actor as it was; value pretraining, resumed after
// it, still learns from those dropped trajectories (the critic must see failures too).
TEST(Trainer, RftKeepingNothingChangesNothingAndValuePretrainUsesTheDropped) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-rft-none-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  json c = stage_config(dir.path(), "run");
  c["stages"]["rft"]["keep_reward_above"] = 10.0;  // no reward is above 10
  c["stages"]["rft"]["tasks"] = 1;                 // one task, drawn from the cursor
  c["rollout"]["episodes_per_task"] = 2;
  c["ppo"]["batch_size"] = 4;
  std::ostringstream log;
  EXPECT_EQ(rl::run_training(c, cpu_options(false), log).steps_run, 1) << log.str();
  const fs::path run = dir.path() / "run";
  std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), std::vector<std::string>{"rft"});
  const json& rft = records[0];
  EXPECT_EQ(rft["tasks"].size(), 1u) << rft.dump();
  EXPECT_EQ(rft["episodes"], 2) << rft.dump();
  EXPECT_EQ(rft["kept"], 0) << rft.dump();
  EXPECT_EQ(rft["dropped_by_reason"], json({{"low_reward", 2}})) << rft.dump();
  EXPECT_EQ(rft["update_skipped"], true) << rft.dump();
  EXPECT_FALSE(rft.contains("loss")) << rft.dump();
  EXPECT_NE(log.str().find("the actor is not fine-tuned"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("low_reward 2"), std::string::npos) << log.str();
  const rl::CheckpointInfo ckpt = rl::latest_checkpoint(run);
  EXPECT_EQ(ckpt.state["stage"], "rft");
  EXPECT_EQ(ckpt.state["cursor"]["position"], 1) << ckpt.state["cursor"].dump();
  const lm::TrainForward after_rft = probe(ckpt.dir / "actor");
  EXPECT_EQ(probe(dir.path() / "m").logprobs, after_rft.logprobs);

  c["stages"]["value_pretrain"]["enabled"] = true;
  EXPECT_EQ(rl::run_training(c, cpu_options(true), log).steps_run, 1) << log.str();
  records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), (std::vector<std::string>{"rft", "value_pretrain"}));
  EXPECT_EQ(records[1]["source"], "rft");
  EXPECT_EQ(records[1]["sequences"], 2) << records[1].dump();
  EXPECT_EQ(records[1]["update_skipped"], false) << records[1].dump();
  const lm::TrainForward after_vp = probe(rl::latest_checkpoint(run).dir / "actor");
  EXPECT_EQ(after_rft.logprobs, after_vp.logprobs);
  EXPECT_GT(cuda_agent::testing::max_abs_diff(after_rft.values, after_vp.values), 1e-3);
}

// Value pretraining without RFT samples its own trajectories into rollouts/value_pretrain/.
TEST(Trainer, ValuePretrainAloneSamplesItsOwnTrajectories) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-vp-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  json c = stage_config(dir.path(), "run");
  c["stages"]["rft"]["enabled"] = false;
  c["stages"]["rft"]["tasks"] = 1;
  c["stages"]["value_pretrain"]["enabled"] = true;
  std::ostringstream log;
  EXPECT_EQ(rl::run_training(c, cpu_options(false), log).steps_run, 1) << log.str();
  const fs::path run = dir.path() / "run";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), std::vector<std::string>{"value_pretrain"});
  const json& vp = records[0];
  EXPECT_EQ(vp["source"], "sampled") << vp.dump();
  EXPECT_EQ(vp["episodes"], 1) << vp.dump();
  EXPECT_EQ(vp["update_skipped"], false) << vp.dump();
  EXPECT_EQ(vp["optimizer_steps"], 3) << vp.dump();
  EXPECT_EQ(vp["passes"], 3) << vp.dump();  // one sequence: one step a pass
  ASSERT_EQ(vp["tasks"].size(), 1u);
  EXPECT_TRUE(fs::is_regular_file(run / "rollouts" / "value_pretrain" /
                                  (vp["tasks"][0].get<std::string>() + "-e0") / "trajectory.jsonl"));
  EXPECT_FALSE(fs::exists(run / "rollouts" / "rft"));
}

namespace {

// Torch-only reference solutions of the tiny split (what --device cpu can verify) in split/solutions/,
// as data/core keeps its own.
void write_solutions(const fs::path& split) {
  for (const auto& [id, expr] : std::vector<std::pair<std::string, std::string>>{{"add", "torch.add(a, b)"},
                                                                                  {"mul", "torch.mul(a, b)"}})
    write_file_atomic(split / "solutions" / id / "model_new.py",
                      "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n\n    def forward(self, a, b):\n        return " + expr + "\n");
}

// Agentic (multi-turn) episodes with room for a whole demonstration (one token a byte; the tool
// schemas alone take some 10k): the tiny model's context widened to 32768 tokens, replies of up
// to 1024.
json teacher_config(const fs::path& root, const std::string& run) {
  json c = stage_config(root, run);
  c["rollout"]["single_turn"] = false;
  c["rollout"]["max_turns"] = 6;
  c["rollout"]["max_context_tokens"] = 32768;
  c["rollout"]["max_new_tokens"] = 1024;
  json cfg = json::parse(read_file(root / "m" / "config.json"));
  cfg["max_position_embeddings"] = 32768;
  write_file_atomic(root / "m" / "config.json", cfg.dump());
  return c;
}

// A tiny model, split and reference solutions under `root`, and the supervised warm-up from them
// (stages.sft with the reference:split teacher, batch 1, lr 3e-3; RFT off).
json sft_config(const fs::path& root, const std::string& run) {
  write_model(root / "m");
  const fs::path split = root / "split";
  write_split(split);
  write_solutions(split);
  json c = teacher_config(root, run);
  c["stages"]["rft"]["enabled"] = false;
  c["stages"]["sft"]["enabled"] = true;
  c["stages"]["sft"]["teacher"] = "reference:" + split.string();
  c["stages"]["sft"]["batch_size"] = 1;
  c["stages"]["sft"]["lr"] = 3e-3;
  return c;
}

// The summed log-probability the model at `actor` gives the policy tokens of `s`.
double masked_logprob(const fs::path& actor, const rl::TokenSequence& s) {
  lm::LmOptions o;
  o.value_head = true;
  o.seed = 5;
  const lm::TrainForward f = lm::load_language_model(actor, o)->forward_for_training({s.tokens}, {})[0];
  double sum = 0;
  for (size_t t = 0; t < s.tokens.size(); ++t)
    if (s.loss_mask[t]) sum += f.logprobs[t];
  return sum;
}

}  // namespace

// The supervised warm-up (stages.sft) with the reference teacher: each task's solution played as an
// agent episode through the real tools and the real (CPU, verify-only) sandbox, recorded in the
// actor's tokens with its chat template, loss-masked to the assistant's turns; the actor fine-tuned
// on them raises the log-probability of the demonstrations; PPO refuses them.
TEST(Trainer, SftLearnsFromReferenceDemonstrationsPlayedThroughTheRealTools) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-sft-");
  const fs::path split = dir.path() / "split";
  json c = sft_config(dir.path(), "run");
  c["stages"]["sft"]["epochs"] = 3;
  std::ostringstream log;
  const rl::TrainRunSummary summary = rl::run_training(c, cpu_options(false), log);
  ASSERT_EQ(summary.steps_run, 1) << log.str();
  const fs::path run = dir.path() / "run";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), std::vector<std::string>{"sft"}) << log.str();
  const json& r = records[0];
  EXPECT_EQ(r["teacher_episodes"], 2) << r.dump();
  EXPECT_EQ(r["teacher_kept"], 2) << r.dump() << "\n" << log.str();
  EXPECT_EQ(r["teacher_reward_mean"], 1.0) << r.dump();  // correct, verify-only scoring
  EXPECT_EQ(r["teacher_pass_rate"], 1.0) << r.dump();
  EXPECT_EQ(r["update_skipped"], false) << r.dump();
  EXPECT_EQ(r["optimizer_steps"], 6) << r.dump();  // 3 epochs x ceil(2 kept / batch 1)
  EXPECT_TRUE(finite_number(r, "loss")) << r.dump();
  EXPECT_EQ(r.value("episodes", -1), -1) << "no own episodes in the warm-up: " << r.dump();
  EXPECT_EQ(rl::latest_checkpoint(run).state["stage"], "sft");

  const fs::path episode = run / "rollouts" / "sft" / "add-t0";
  const json events = rl::read_trajectory(episode / "trajectory.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["type"], "episode");
  EXPECT_EQ(events[0]["policy"], "teacher:reference:" + (split / "solutions" / "add" / "model_new.py").string());
  std::vector<std::string> tools;
  int assistant_turns = 0;
  for (const json& e : events) {
    if (e["type"] == "assistant") {
      ++assistant_turns;
      EXPECT_EQ(e.value("teacher_forced", false), true) << e.dump();
      EXPECT_FALSE(e["completion_token_ids"].empty()) << e.dump();
      EXPECT_EQ(e["completion_logprobs"].size(), e["completion_token_ids"].size());
    }
    if (e["type"] == "observation") {
      tools.push_back(e["tool"].get<std::string>() + (e.contains("sandbox_check") ? ":" + e["sandbox_check"].get<std::string>() : ""));
      if (e["tool"] != "Bash" || e.value("sandbox_check", "") == "verify") {
        EXPECT_EQ(e["ok"], true) << e.dump();
      }
    }
    if (e["type"] == "score") {
      EXPECT_EQ(e["stop_reason"], "answered") << e.dump();
      EXPECT_EQ(e["reward"], 1.0) << e.dump();
    }
  }
  EXPECT_EQ(assistant_turns, 5);
  EXPECT_EQ(tools, (std::vector<std::string>{"Read", "Write", "Bash:verify", "Bash:profile"}));
  EXPECT_EQ(read_file(episode / "workspace" / "model_new.py"),
            read_file(split / "solutions" / "add" / "model_new.py"));

  // One chained sequence; the loss on exactly the assistant's tokens (the solution among them).
  const rl::EpisodeSequence seq = rl::episode_sequence(events);
  EXPECT_TRUE(seq.teacher_forced);
  EXPECT_TRUE(seq.chained) << "the template renders the demonstration's turns as recorded";
  ASSERT_EQ(seq.sequences.size(), 1u);
  int64_t completion_tokens = 0;
  for (const json& e : events)
    if (e["type"] == "assistant") completion_tokens += static_cast<int64_t>(e["completion_token_ids"].size());
  EXPECT_EQ(seq.policy_tokens(), completion_tokens);
  EXPECT_GT(seq.policy_tokens(), static_cast<int64_t>(read_file(split / "solutions" / "add" / "model_new.py").size()));
  EXPECT_LT(seq.policy_tokens(), static_cast<int64_t>(seq.sequences[0].tokens.size()) / 2)
      << "the prompt, the task and the tools' output carry no loss";

  // The fine-tuned actor finds the demonstration likelier than the initial one did.
  const double before = masked_logprob(dir.path() / "m", seq.sequences[0]);
  const double after = masked_logprob(checkpoint_dir(run, 1) / "actor", seq.sequences[0]);
  EXPECT_GT(after, before + 1.0) << "before " << before << ", after " << after;

  // Teacher tokens are not the policy's samples: PPO refuses them.
  try {
    rl::ppo_samples({seq}, {std::vector<float>(seq.sequences[0].tokens.size(), 0.0f)}, 1.0, 0.95, false);
    ADD_FAILURE() << "ppo_samples took a teacher-forced episode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("teacher"), std::string::npos) << e.what();
  }
}

// RFT on a mix: the actor's own episodes and the teacher's, each filtered, both fine-tuned on, the
// metrics keeping them apart; value pretraining learns on the actor's own only. A task the teacher
// has no demonstration for is skipped and counted; a teacher folder that does not exist fails
// before anything runs, naming the key.
TEST(Trainer, RftMixesTeacherAndOwnEpisodesAndValuePretrainKeepsToTheOwn) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-mix-");
  if (std::getenv("CA_TEST_KEEP")) dir.keep();
  write_model(dir.path() / "m");
  const fs::path split = dir.path() / "split";
  write_split(split);
  write_solutions(split);
  fs::remove_all(split / "solutions" / "mul");
  json c = teacher_config(dir.path(), "run");
  c["stages"]["rft"]["teacher"] = "reference:" + (split / "solutions").string();
  c["stages"]["rft"]["teacher_episodes_per_task"] = 1;
  c["stages"]["value_pretrain"]["enabled"] = true;
  std::ostringstream log;
  const rl::TrainRunSummary summary = rl::run_training(c, cpu_options(false), log);
  ASSERT_EQ(summary.steps_run, 2) << log.str();
  const fs::path run = dir.path() / "run";
  const std::vector<json> records = rl::MetricsLog::read(run / "metrics.jsonl");
  ASSERT_EQ(stages_of(records), (std::vector<std::string>{"rft", "value_pretrain"})) << log.str();
  const json& rft = records[0];
  EXPECT_EQ(rft["episodes"], 2) << rft.dump();  // the actor's own: both tasks
  EXPECT_EQ(rft["kept"], 2) << rft.dump();      // keep_reward_above -10
  EXPECT_EQ(rft["teacher_episodes"], 1) << rft.dump();
  EXPECT_EQ(rft["teacher_episodes_without_demonstration"], 1) << rft.dump();
  EXPECT_EQ(rft["teacher_kept"], 1) << rft.dump();
  EXPECT_EQ(rft["teacher_reward_mean"], 1.0) << rft.dump();
  EXPECT_EQ(rft["optimizer_steps"], 3) << rft.dump();  // ceil(3 kept / batch 1) x 1 epoch
  EXPECT_NE(log.str().find("no teacher episode for task mul"), std::string::npos) << log.str();
  EXPECT_TRUE(fs::is_regular_file(run / "rollouts" / "rft-teacher" / "add-t0" / "trajectory.jsonl"));
  EXPECT_FALSE(fs::exists(run / "rollouts" / "rft" / "add-t0"));
  EXPECT_EQ(records[1]["source"], "rft");
  EXPECT_EQ(records[1]["trajectories"], 2) << "value pretraining reads the actor's own only: " << records[1].dump();

  json missing = teacher_config(dir.path(), "run-missing");
  missing["stages"]["rft"]["teacher"] = "reference:" + (dir.path() / "nowhere").string();
  missing["stages"]["rft"]["teacher_episodes_per_task"] = 1;
  try {
    rl::run_training(missing, cpu_options(false), log);
    ADD_FAILURE() << "a missing teacher folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stages.rft.teacher"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path() / "run-missing" / "metrics.jsonl"));
}

// `ablate` end to end on the tiny model: the base and two ablations, one of which fails at run
// time (its split does not exist) without stopping the others; the comparison names all three;
// a second call continues the finished runs (nothing to do) instead of starting them over.
namespace {

// `cuda-agent ablate` over DIR/base.yaml and DIR/ablations/ into DIR/out, on the CPU.
rl::AblationOptions ablation_options(const fs::path& dir) {
  rl::AblationOptions o;
  o.base_config = dir / "base.yaml";
  o.ablations_dir = dir / "ablations";
  o.output_dir = dir / "out";
  o.train = cpu_options(false);
  return o;
}

}  // namespace

TEST(Trainer, AblateRunsEveryVariantAndComparesThem) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-ablate-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  write_file_atomic(dir.path() / "base.yaml", tiny_config(dir.path(), 2).dump(2));  // JSON is YAML
  write_file_atomic(dir.path() / "ablations" / "raw_speedup_reward.yaml",
                    "model:\n  actor: models/base-model\nreward:\n  kind: raw_speedup\n");
  write_file_atomic(dir.path() / "ablations" / "lost_split.yaml",
                    "data:\n  split: " + (dir.path() / "no-such-split").string() + "\n");
  const rl::AblationOptions o = ablation_options(dir.path());
  std::ostringstream log;
  const std::vector<rl::AblationVariant> v = rl::run_ablations(o, log);
  ASSERT_EQ(v.size(), 3u) << log.str();
  EXPECT_EQ(v[0].name, "base");
  EXPECT_TRUE(v[0].ok) << v[0].error;
  EXPECT_EQ(v[1].name, "lost_split");
  EXPECT_FALSE(v[1].ok);
  EXPECT_NE(v[1].error.find("data.split"), std::string::npos) << v[1].error;
  EXPECT_EQ(v[2].name, "raw_speedup_reward");
  EXPECT_TRUE(v[2].ok) << v[2].error;
  EXPECT_EQ(v[0].summary["ppo_steps"], 2) << v[0].summary.dump();
  EXPECT_EQ(v[2].summary["ppo_steps"], 2) << v[2].summary.dump();
  EXPECT_TRUE(v[0].summary.contains("reward_last")) << v[0].summary.dump();
  EXPECT_EQ(v[2].config["reward"]["kind"], "raw_speedup");
  const std::string md = read_file(dir.path() / "out" / "comparison.md");
  for (const char* name : {"| base |", "| lost_split |", "| raw_speedup_reward |", "failed:"})
    EXPECT_NE(md.find(name), std::string::npos) << name << " in\n" << md;
  EXPECT_EQ(json::parse(read_file(dir.path() / "out" / "comparison.json")).size(), 3u);
  EXPECT_TRUE(fs::is_regular_file(dir.path() / "out" / "plots" / "reward.svg"));
  EXPECT_TRUE(fs::is_regular_file(dir.path() / "out" / "base" / "metrics.jsonl"));

  std::ostringstream again;
  const std::vector<rl::AblationVariant> w = rl::run_ablations(o, again);
  EXPECT_TRUE(w[0].ok) << w[0].error;
  EXPECT_EQ(rl::MetricsLog::read(dir.path() / "out" / "base" / "metrics.jsonl").size(), 2u) << again.str();
  EXPECT_NE(again.str().find("stage ppo: all 2 steps done"), std::string::npos) << again.str();
}

// --parallel: the shared warm-up runs once here, then each variant in a process of its own
// (the built cuda-agent's `ablate --variants NAME --train-only`), two at a time; every variant's
// records are those of one at a time (stages, steps, rewards, pass rates, warm-up losses), each
// process logs to OUTPUT/logs/NAME.log, a variant that fails in its process is reported with its reason and the
// others go on, and the comparison names them all.
TEST(Trainer, AblateInParallelTrainsLikeOneAtATime) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-ablate-parallel-");
  json c = sft_config(dir.path(), "unused");
  c["ppo"]["enabled"] = true;
  c["ppo"]["steps"] = 1;
  write_file_atomic(dir.path() / "base.yaml", c.dump(2));
  write_file_atomic(dir.path() / "ablations" / "no_ppo.yaml", "ppo:\n  enabled: false\n");
  write_file_atomic(dir.path() / "ablations" / "raw_speedup_reward.yaml", "reward:\n  kind: raw_speedup\n");
  write_file_atomic(dir.path() / "ablations" / "lost_split.yaml",
                    "data:\n  split: " + (dir.path() / "no-such-split").string() + "\n");
  rl::AblationOptions one = ablation_options(dir.path());
  one.output_dir = dir.path() / "one";
  std::ostringstream one_log;
  const std::vector<rl::AblationVariant> want = rl::run_ablations(one, one_log);

  rl::AblationOptions two = ablation_options(dir.path());
  two.output_dir = dir.path() / "two";
  two.parallel = 2;
  std::ostringstream log;
  const std::vector<rl::AblationVariant> got = rl::run_ablations(two, log);
  const std::string text = log.str();
  ASSERT_EQ(got.size(), 4u) << text;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].ok, want[i].ok) << got[i].name << ": " << got[i].error << "\n" << text;
    if (!got[i].ok) continue;
    EXPECT_NE(text.find("[ablate] " + got[i].name + " finished after"), std::string::npos) << text;
    const std::vector<json> a = rl::MetricsLog::read(dir.path() / "one" / got[i].name / "metrics.jsonl");
    const std::vector<json> b = rl::MetricsLog::read(dir.path() / "two" / got[i].name / "metrics.jsonl");
    ASSERT_EQ(a.size(), b.size()) << got[i].name;
    int numbers = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      for (const char* key : {"stage", "step", "reward_mean", "pass_rate"})
        EXPECT_EQ(a[k].value(key, json()), b[k].value(key, json())) << got[i].name << " record " << k << " " << key;
      // The warm-up's loss alike, not equal: the demonstrations' tool outputs hold wall times, a
      // few tokens that differ from run to run. (The PPO step's losses are not compared: the
      // random model's episodes end where the machine's load lets its tools end them.)
      if (a[k].value("stage", "") != "sft") continue;
      const json x = a[k].value("loss", json()), y = b[k].value("loss", json());
      ASSERT_TRUE(x.is_number() && y.is_number()) << got[i].name << " record " << k;
      ++numbers;
      EXPECT_NEAR(x.get<double>(), y.get<double>(), 1e-3 + 0.02 * std::abs(x.get<double>()))
          << got[i].name << " record " << k << " loss";
    }
    EXPECT_GE(numbers, 1) << got[i].name << ": no warm-up loss to compare";
    EXPECT_TRUE(fs::is_regular_file(dir.path() / "two" / "logs" / (got[i].name + ".log"))) << got[i].name;
  }
  ASSERT_EQ(got[1].name, "lost_split");
  EXPECT_FALSE(got[1].ok);
  EXPECT_NE(got[1].error.find("data.split"), std::string::npos) << got[1].error;
  EXPECT_NE(text.find("[ablate] the supervised warm-up, once"), std::string::npos) << text;
  EXPECT_NE(text.find("up to 2 at once in processes of their own"), std::string::npos) << text;
  // Two processes share the config's two episodes at once (rollout.concurrent_episodes), and a
  // variant resumed from the shared warm-up runs so: the records above are those of two at once.
  EXPECT_NE(text.find("(its log: " + (dir.path() / "two" / "logs" / "no_ppo.log").string() + "), 1 episode(s) at once"),
            std::string::npos)
      << text;
  EXPECT_NE(read_file(dir.path() / "two" / "no_ppo" / "config.resolved.yaml").find("concurrent_episodes: 1"),
            std::string::npos);
  EXPECT_EQ(text.find("(sft 1/1)"), text.rfind("(sft 1/1)")) << "the warm-up once, here\n" << text;
  EXPECT_NE(read_file(dir.path() / "two" / "logs" / "no_ppo.log").find("starts from the shared supervised warm-up"),
            std::string::npos);
  const std::string md = read_file(dir.path() / "two" / "comparison.md");
  for (const char* name : {"| base |", "| no_ppo |", "| raw_speedup_reward |", "| lost_split |"})
    EXPECT_NE(md.find(name), std::string::npos) << name << " in\n" << md;
  rl::AblationOptions none = two;
  none.parallel = 0;
  EXPECT_THROW((void)rl::ablation_variants(none), Error);
}

// A stop (SIGTERM to `ablate --parallel`) reaches the variants' processes: they stop at a safe
// point, the command ends with the signal's code and says how to go on, and nothing it started
// is left running.
TEST(Trainer, AblateInParallelPassesAStopOnToItsVariants) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-ablate-stop-");
  json c = sft_config(dir.path(), "unused");
  c["ppo"]["enabled"] = true;
  c["ppo"]["steps"] = 3;
  write_file_atomic(dir.path() / "base.yaml", c.dump(2));
  write_file_atomic(dir.path() / "ablations" / "raw_speedup_reward.yaml", "reward:\n  kind: raw_speedup\n");
  const fs::path out = dir.path() / "out";
  std::atomic<bool> stop{false};
  SubprocessOptions sp;
  sp.argv = {CUDA_AGENT_BINARY, "ablate",
             "--config",        (dir.path() / "base.yaml").string(),
             "--ablations",     (dir.path() / "ablations").string(),
             "--output",        out.string(),
             "--parallel",      "2",
             "--device",        "cpu",
             "--skill",         ""};
  sp.stdout_path = sp.stderr_path = (dir.path() / "ablate.log").string();
  sp.timeout_s = 600;
  sp.kill_grace_s = 120;  // SIGTERM (a stop request) to the command alone: it passes it on
  sp.cancel = &stop;
  SubprocessResult r;
  std::thread call([&] { r = run_subprocess(sp); });
  // Once both variants' processes have started: their logs exist and have lines.
  const auto started = [&](const char* name) {
    std::error_code ec;
    return fs::file_size(out / "logs" / (std::string(name) + ".log"), ec) > 0 && !ec;
  };
  for (int i = 0; i < 3000 && !(started("base") && started("raw_speedup_reward")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  call.join();
  const std::string log = read_file(sp.stdout_path);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.describe() << "\n" << log;
  EXPECT_NE(log.find("Running the same command again continues each variant"), std::string::npos) << log;
  for (const char* name : {"base", "raw_speedup_reward"}) {
    const std::string variant = read_file(out / "logs" / (std::string(name) + ".log"));
    EXPECT_NE(variant.find("SIGTERM received"), std::string::npos) << name << ":\n" << variant;
  }
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline;
    try {
      cmdline = read_file(e.path() / "cmdline");
    } catch (...) {
      continue;
    }
    EXPECT_EQ(cmdline.find(out.string()), std::string::npos) << "process " << pid << " outlived the command";
  }
}

// --variants: a comparison made in two calls into one folder (as on two machines, the first
// call's folder carried without its checkpoints): each call trains its variants only, and the
// comparison reads the other's metrics. A name that is no variant is refused before anything runs.
TEST(Trainer, AblateInPartsComparesWhatEachPartTrained) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-ablate-parts-");
  write_model(dir.path() / "m");
  write_split(dir.path() / "split");
  write_file_atomic(dir.path() / "base.yaml", tiny_config(dir.path(), 1).dump(2));
  write_file_atomic(dir.path() / "ablations" / "raw_speedup_reward.yaml", "reward:\n  kind: raw_speedup\n");
  rl::AblationOptions o = ablation_options(dir.path());
  o.only = {"no_such_variant"};
  try {
    (void)rl::ablation_variants(o);
    ADD_FAILURE() << "an unknown variant was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_variant"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("base, raw_speedup_reward"), std::string::npos) << e.what();
  }

  o.only = {"raw_speedup_reward"};
  std::ostringstream first;
  std::vector<rl::AblationVariant> v = rl::run_ablations(o, first);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FALSE(v[0].ok) << "base was not trained and has no earlier run";
  EXPECT_NE(v[0].error.find("not trained in this call"), std::string::npos) << v[0].error;
  EXPECT_TRUE(v[1].ok) << v[1].error << "\n" << first.str();
  EXPECT_FALSE(fs::exists(dir.path() / "out" / "base")) << first.str();

  // The second part, on "another machine": the first part's checkpoints are not there.
  for (const auto& e : fs::directory_iterator(dir.path() / "out" / "raw_speedup_reward"))
    if (e.path().filename().string().rfind("checkpoint", 0) == 0) fs::remove_all(e.path());
  o.only = {"base"};
  std::ostringstream second;
  v = rl::run_ablations(o, second);
  EXPECT_TRUE(v[0].ok) << v[0].error << "\n" << second.str();
  EXPECT_TRUE(v[1].ok) << v[1].error;
  EXPECT_EQ(v[0].summary["ppo_steps"], 1) << v[0].summary.dump();
  EXPECT_EQ(v[1].summary["ppo_steps"], 1) << "read from the first part's metrics: " << v[1].summary.dump();
  EXPECT_EQ(second.str().find("(ppo 1/1)"), second.str().rfind("(ppo 1/1)")) << "one PPO run only\n" << second.str();
  const std::string md = read_file(dir.path() / "out" / "comparison.md");
  EXPECT_EQ(md.find("failed:"), std::string::npos) << md;
  EXPECT_NE(md.find("| raw_speedup_reward |"), std::string::npos) << md;
}

// The supervised warm-up runs once for the variants that differ only in later stages (here the
// base and no_ppo); a variant that changes it (the reward decides which demonstrations are kept)
// runs its own. A second call does not run it again.
// The stages variants share run once: the supervised warm-up for every variant that changes only
// what comes after it (the reward's kind included: the warm-up kept every correct
// demonstration), the warm-up and RFT for those that change only what comes after RFT; a
// variant that changes the warm-up runs its own. A second call has nothing to do.
TEST(Trainer, AblateRunsTheSharedWarmUpOnce) {
  cuda_agent::testing::use_built_lm_module();
  TempDir dir("ca-trainer-ablate-sft-");
  json c = sft_config(dir.path(), "unused");
  c["stages"]["rft"]["enabled"] = true;
  c["ppo"]["enabled"] = true;
  c["ppo"]["steps"] = 1;
  write_file_atomic(dir.path() / "base.yaml", c.dump(2));
  write_file_atomic(dir.path() / "ablations" / "no_ppo.yaml", "ppo:\n  enabled: false\n");
  write_file_atomic(dir.path() / "ablations" / "raw_speedup_reward.yaml", "reward:\n  kind: raw_speedup\n");
  write_file_atomic(dir.path() / "ablations" / "sft_lr.yaml", "stages:\n  sft:\n    lr: 1.0e-3\n");
  const rl::AblationOptions o = ablation_options(dir.path());
  std::ostringstream log;
  const std::vector<rl::AblationVariant> v = rl::run_ablations(o, log);
  ASSERT_EQ(v.size(), 4u) << log.str();
  for (const rl::AblationVariant& x : v) {
    EXPECT_TRUE(x.ok) << x.name << ": " << x.error << "\n" << log.str();
    const std::vector<json> records = rl::MetricsLog::read(dir.path() / "out" / x.name / "metrics.jsonl");
    ASSERT_GE(records.size(), 2u) << x.name;
    EXPECT_EQ(records[0]["stage"], "sft") << x.name;
    EXPECT_EQ(records[1]["stage"], "rft") << x.name;
  }
  ASSERT_EQ(v[1].name, "no_ppo");
  EXPECT_TRUE(rl::shares_prefix(v[0].config, v[1].config, "rft"));
  EXPECT_TRUE(rl::shares_sft_prefix(v[0].config, v[2].config));
  EXPECT_FALSE(rl::shares_prefix(v[0].config, v[2].config, "rft")) << "RFT keeps by the reward";
  EXPECT_FALSE(rl::shares_sft_prefix(v[0].config, v[3].config));
  json keeps_by_reward = v[2].config;
  keeps_by_reward["stages"]["sft"]["keep_reward_above"] = 1.5;
  json base_keeps = v[0].config;
  base_keeps["stages"]["sft"]["keep_reward_above"] = 1.5;
  EXPECT_FALSE(rl::shares_sft_prefix(base_keeps, keeps_by_reward)) << "a threshold the reward's scale decides";
  const std::string text = log.str();
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("[ablate] the supervised warm-up, once"), 1u) << text;
  EXPECT_EQ(count("[ablate] the warm-up and RFT, once"), 1u) << text;
  EXPECT_EQ(count("(sft 1/1)"), 2u) << "the shared warm-up and sft_lr's own\n" << text;
  EXPECT_EQ(count("(rft 1/1)"), 3u) << "the shared RFT, raw_speedup_reward's and sft_lr's own\n" << text;
  EXPECT_NE(text.find("[ablate] base starts from the shared warm-up and RFT"), std::string::npos) << text;
  EXPECT_NE(text.find("[ablate] no_ppo starts from the shared warm-up and RFT"), std::string::npos) << text;
  EXPECT_NE(text.find("[ablate] raw_speedup_reward starts from the shared supervised warm-up"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("[ablate] sft_lr starts from"), std::string::npos) << text;
  EXPECT_EQ(rl::MetricsLog::read(dir.path() / "out" / "base" / "metrics.jsonl").back()["stage"], "ppo");
  EXPECT_EQ(rl::MetricsLog::read(dir.path() / "out" / "no_ppo" / "metrics.jsonl").size(), 2u);
  EXPECT_EQ(rl::MetricsLog::read(dir.path() / "out" / "raw_speedup_reward" / "metrics.jsonl").back()["stage"], "ppo");

  std::ostringstream again;
  const std::vector<rl::AblationVariant> w = rl::run_ablations(o, again);
  for (const rl::AblationVariant& x : w) EXPECT_TRUE(x.ok) << x.name << ": " << x.error;
  EXPECT_EQ(again.str().find(", once"), std::string::npos) << again.str();
  EXPECT_EQ(again.str().find("(sft 1/1)"), std::string::npos) << again.str();
  EXPECT_EQ(again.str().find("(rft 1/1)"), std::string::npos) << again.str();
}
