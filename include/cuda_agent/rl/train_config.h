// The training config of `cuda-agent train`: every hyperparameter of the four-stage recipe
// (single-turn PPO warm-up, RFT, value pretraining, agentic PPO) and of the optional supervised
// warm-up on a teacher's episodes before it (stages.sft), as JSON.
//
// The defaults are the paper's values where the paper gives one (train_config.cpp says which
// are ours). A run resolves its config as defaults <- YAML file <- `--set key=value`, with the
// checks of core/config.h (unknown keys and wrong types are errors naming the dotted key and
// the file), then validate_train_config checks ranges, enums and the keys that must agree.
// The resolved config is saved with the run's output (config.resolved.yaml) and loads back to
// the same JSON.
//
// Sections: run, model, data, rollout, stages.{sft, warmup, rft, value_pretrain}, ppo (the agentic
// PPO stage; the warm-up's PPO uses the same hyperparameters), reward, checkpoint, distributed.
// Relative paths (model.actor, model.critic, data.split, run.output_dir) are relative to the
// working directory of the command.
//
// All functions are thread-safe (they share no state).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/rft_filter.h"

namespace cuda_agent::rl {

// The stop reasons an episode can end with (agent/agent_loop.h), the allowed entries of
// stages.rft.drop_stop_reasons.
inline const std::vector<std::string> kStopReasons = {"answered",           "max_turns", "policy_error",
                                                      "invalid_tool_calls", "looping",   "single_turn"};

// Every key with its default. model.actor is "" here, so the defaults alone do not validate:
// a run must name its actor.
nlohmann::json train_config_defaults();

// defaults <- `yaml` (skipped when empty) <- each "a.b=value" of `set_overrides`, in order,
// then validate_train_config. Throws Error naming the file or "--set" and the dotted key for
// an unknown key, a wrong type or malformed YAML, and the key, value and allowed range for a
// value validate_train_config rejects.
nlohmann::json load_train_config(const std::filesystem::path& yaml, const std::vector<std::string>& set_overrides);

// Checks ranges, enums and cross-key agreement (e.g. ppo.batch_size = data.tasks_per_step x
// rollout.episodes_per_task). Throws Error naming the first bad key, its value and what is
// allowed; a missing key or a wrong type is an error too, so a hand-built JSON is checked as
// thoroughly as a loaded one.
void validate_train_config(const nlohmann::json& config);

// The same config, typed: what the trainer reads, read once. The JSON it came from stays beside
// it (raw), for what is saved (config.resolved.yaml, checkpoints).
struct TrainConfig {
  nlohmann::json raw;

  struct Run {
    std::string output_dir;
    uint64_t seed = 0;
    int steps_per_log = 1;
  } run;
  struct Model {
    std::string actor, critic, dtype, device;
  } model;
  struct Data {
    std::string split;
    int tasks_per_step = 0;
  } data;
  struct Rollout {
    int episodes_per_task = 0, max_turns = 0;
    int64_t max_context_tokens = 0, max_new_tokens = 0;
    double temperature = 1, top_p = 1, sandbox_timeout_s = 0;
    int concurrent_episodes = 1;
    bool single_turn = false;
    bool batch_engine = false;  // lm::LmOptions::batch_engine for the actor
    int64_t kv_tokens = 131072;
    // 1: a PPO stage's next step is sampled from a snapshot of the actor while the learner takes
    // this step (one step stale, recorded as rollout_staleness); 0: every step on-policy.
    int off_policy_steps = 0;
    int max_invalid_turns = 0, max_repeated_calls = 0;
  } rollout;
  // What stages.sft and stages.rft share: which episodes they keep and how they fine-tune on them.
  struct FineTune {
    bool enabled = false;
    std::string teacher;
    size_t tasks = 0;
    RftFilterOptions filter;
    int epochs = 1;
    int64_t batch_size = 1;
    double lr = 0;
  };
  struct Sft : FineTune {
    int episodes_per_task = 1;
  };
  struct Rft : FineTune {
    int teacher_episodes_per_task = 0;
  };
  struct Warmup {
    bool enabled = false;
    int steps = 0;
    int64_t max_context_tokens = 0;
    bool single_turn = true;
  };
  struct ValuePretrain {
    bool enabled = false;
    int steps = 0;
    double gamma = 1, lambda = 1, lr = 0;
  };
  struct Stages {
    Sft sft;
    Warmup warmup;
    Rft rft;
    ValuePretrain value_pretrain;
  } stages;
  struct Ppo {
    bool enabled = false;
    int steps = 0;
    int64_t batch_size = 0;
    double gamma = 1, lambda = 1;
    bool whiten_advantages = true;
    lm::PpoOptions learner;  // the learner's share of the section (critic, seed and distributed unset)
  } ppo;
  struct Reward {
    std::string kind;
    double speedup_margin = 0;
  } reward;
  struct Checkpoint {
    int every_steps = 0, keep_last = 0;
  } checkpoint;
  std::string distributed_backend;

  // validate_train_config(config), then every field from it. Throws Error as that does.
  static TrainConfig from_json(nlohmann::json config);
};

// Writes `config` as YAML to run_dir/config.resolved.yaml atomically (creating run_dir), in a
// form that load_yaml_file and load_train_config read back to the same JSON: strings are
// quoted, floats always carry a decimal point or exponent. Throws Error when it cannot write.
void save_resolved_config(const nlohmann::json& config, const std::filesystem::path& run_dir);

// The YAML text save_resolved_config writes (a header comment, then the config).
std::string train_config_to_yaml(const nlohmann::json& config);

}  // namespace cuda_agent::rl
