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

// Writes `config` as YAML to run_dir/config.resolved.yaml atomically (creating run_dir), in a
// form that load_yaml_file and load_train_config read back to the same JSON: strings are
// quoted, floats always carry a decimal point or exponent. Throws Error when it cannot write.
void save_resolved_config(const nlohmann::json& config, const std::filesystem::path& run_dir);

// The YAML text save_resolved_config writes (a header comment, then the config).
std::string train_config_to_yaml(const nlohmann::json& config);

}  // namespace cuda_agent::rl
