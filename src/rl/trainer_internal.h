// Internal to the trainer (trainer.h), not part of the public API: the run's state and stages,
// shared by the entry point with its checkpointing and resume handling (trainer.cpp) and the
// per-step work of each stage (trainer_stages.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/rl/trainer.h"
#include "cuda_agent/serve/chat_session.h"

namespace cuda_agent::rl::detail {

// SplitMix64's mixing function: episode_seed (trainer.cpp) and value pretraining's shuffle
// (trainer_stages.cpp) derive from it, so reruns sample and split alike.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum class StageKind { kPpo, kSft, kRft, kValuePretrain };

struct Stage {
  std::string name;  // sft | warmup | rft | value_pretrain | ppo: the name in state.json and metrics.jsonl
  StageKind kind = StageKind::kPpo;
  int steps = 0;  // global steps it takes: its PPO steps; sft, rft and value_pretrain take one each
  bool single_turn = false;
  int64_t max_context_tokens = 0;
};

struct PrefetchedStep;  // trainer_stages.cpp

// The state of one training run, made by run_training and passed to every step. Not thread-safe
// (a step's prefetched episodes, rollout.off_policy_steps, run beside the update and touch only
// log and baselines_timed meanwhile).
struct RunContext {
  const TrainConfig& config;  // typed; config.raw is what checkpoints save
  const TrainRunOptions& options;
  std::ostream& log;
  std::filesystem::path run_dir;
  std::filesystem::path actor;  // model.actor: the tokenizer and template of every rollout session
  bench::Split split;
  TaskCursor cursor;
  lm::PpoLearner* learner = nullptr;
  MetricsLog metrics;
  int rank = 0;   // this process in a data-parallel job (torchrun's RANK); rank 0 writes the run's files
  int world = 1;  // processes in the job
  int gpu = 0;    // the GPU of this process's model and episodes
  // The actor's tokenizer and chat template over the learner's model, read once: each episode's
  // session shares them (ChatSession::share_with_model) instead of reading the tokenizer again.
  std::unique_ptr<serve::ChatSession> chat{};
  // The split's tasks (indices) whose baselines this process has timed in this run.
  std::set<size_t> baselines_timed{};
  // rollout.off_policy_steps: the next PPO step's episodes, sampled while the learner took the
  // last step; and the task cursor as it was before they were drawn, which a checkpoint saves (a
  // resumed run samples that step again, from the checkpoint's weights).
  std::shared_ptr<PrefetchedStep> prefetched{};
  nlohmann::json cursor_before_prefetch{};

  bool writer() const { return rank == 0; }
  // The sum over the job's processes (every process must call it alike).
  std::vector<double> sum(const std::vector<double>& values) const { return learner->sum_over_processes(values); }
  // The largest value over the processes (each puts its own in its slot of a vector summed).
  double max(double value) const {
    std::vector<double> slots(world, 0.0);
    slots[rank] = value;
    const std::vector<double> all = sum(slots);
    return *std::max_element(all.begin(), all.end());
  }
  double min(double value) const { return -max(-value); }
  void barrier() const { sum({0.0}); }
};

// One global step `step` of `stage`, its step_in_stage-th: a PPO step (warm-up or agentic PPO),
// or the one step of RFT or of value pretraining. Returns the step's metrics record (trainer.h
// lists what each stage's holds). In a data-parallel job every process must call it alike.
nlohmann::json run_stage_step(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage);

// The log line of the k-th step of `stage`, from its metrics record `r`.
std::string step_summary(const Stage& stage, int k, const nlohmann::json& r);

}  // namespace cuda_agent::rl::detail
