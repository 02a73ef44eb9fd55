#include "cuda_agent/rl/train_config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::rl {

using nlohmann::json;

// "paper" marks the CUDA Agent paper's value; "ours" a value the paper does not give.
json train_config_defaults() {
  return json{
      {"run",
       {
           {"output_dir", "runs/train"},  // ours: config.resolved.yaml, logs, checkpoints, trajectories
           {"seed", 42},                  // ours: task order, sampling, initialization of new heads
           {"steps_per_log", 1},          // ours: log metrics every this many optimizer steps
       }},
      {"model",
       {
           {"actor", ""},             // required: the policy's weights (.gguf or a Hugging Face folder)
           {"critic", "from_actor"},  // from_actor: its own weights, copied from the actor (our reading of
                                      // the paper's critic initialization); shared: a value head on
                                      // the actor's trunk; anything else: the critic's weights
           {"dtype", "bfloat16"},     // ours: bfloat16 parameters and activations
           {"device", "cuda"},        // cuda or cpu (cpu: tests and tiny models only)
       }},
      {"data",
       {
           {"split", "data/core"},   // ours: the training split (a folder with split.yaml)
           {"tasks_per_step", 128},  // ours: tasks per PPO step; x episodes_per_task = ppo.batch_size
       }},
      {"rollout",
       {
           {"episodes_per_task", 8},        // ours: episodes sampled per task (the paper's group size is not given)
           {"max_turns", 150},              // paper: 150 turns in training (200 at evaluation)
           {"max_context_tokens", 131072},  // paper: 128k-token context in agentic PPO
           {"max_new_tokens", 8192},        // ours: tokens of one policy reply
           {"temperature", 1.0},            // ours: sample the policy as it is (on-policy)
           {"top_p", 1.0},                  // ours: no nucleus truncation, for the same reason
           {"sandbox_timeout_s", 600},      // ours: wall time of one sandbox evaluation
           {"concurrent_episodes", 2},      // ours: episodes a process runs at once on its GPU (as bench's 2 workers)
           {"batch_engine", false},         // ours: the episodes' turns decoded together (continuous batching)
           {"kv_tokens", 131072},           // ours: that engine's KV pool, in token positions
           {"off_policy_steps", 0},         // ours: 1 samples step n+1 while the learner takes step n (veRL async)
           {"single_turn", false},          // true: no tools, one answer (the no-agent-loop ablation)
           {"max_invalid_turns", 5},        // as agent::AgentOptions: replies whose calls all failed, in a row
           {"max_repeated_calls", 6},       // as agent::AgentOptions: the same call this many times: looping
       }},
      {"stages",
       {
           {"sft",
            {
                {"enabled", false},  // ours: a supervised warm-up on a teacher's episodes, before stage 1
                {"teacher", ""},     // ours: reference:DIR (a split's solutions), openai:MODEL@URL, replay:,
                                     // local:; required when enabled
                {"tasks", 0},                 // ours: tasks of the teacher's episodes; 0: every task of the split
                {"episodes_per_task", 1},     // ours: teacher episodes per task
                {"keep_reward_above", 0.0},   // ours: keep the demonstrations that scored above this
                {"drop_stop_reasons", json::array({"looping", "invalid_tool_calls", "policy_error"})},
                {"max_invalid_tool_calls", -1},
                {"epochs", 3},                // ours: passes over the kept demonstrations
                {"batch_size", 8},            // ours: demonstrations per optimizer step
                {"lr", 1.0e-5},               // ours: actor learning rate of the warm-up
            }},
           {"warmup",
            {
                {"enabled", true},               // paper: stage 1, single-turn PPO warm-up
                {"steps", 50},                   // ours: PPO steps of the warm-up
                {"max_context_tokens", 32768},   // paper: 32k context in the warm-up
                {"single_turn", true},           // paper: the warm-up is single-turn
            }},
           {"rft",
            {
                {"enabled", true},           // paper: stage 2, rejection fine-tuning of the actor
                {"keep_reward_above", 0.0},  // paper: keep trajectories with reward > this (positive reward)
                {"drop_stop_reasons",
                 json::array({"looping", "invalid_tool_calls", "policy_error"})},  // paper: drop looping and
                                                                                   // invalid-tool-call runs
                {"max_invalid_tool_calls", -1},  // ours: drop runs with more failed tool calls; -1: no limit
                                                 // (the count includes calls that ran and failed)
                {"tasks", 0},                    // ours: tasks sampled for RFT rollouts; 0: every task of the split
                {"epochs", 1},                   // ours: passes over the kept trajectories
                {"batch_size", 64},              // ours: trajectories per optimizer step
                {"lr", 1.0e-6},                  // ours: actor learning rate of the fine-tuning
                {"teacher", ""},                 // ours: a teacher whose episodes join the actor's (as stages.sft.teacher)
                {"teacher_episodes_per_task", 0},  // ours: its episodes per task, beside rollout.episodes_per_task
                                                   // of the actor's own; 0: the actor's own samples only
            }},
           {"value_pretrain",
            {
                {"enabled", true},  // paper: stage 3, the critic learns before the actor moves
                {"steps", 50},      // ours: critic optimizer steps
                {"gamma", 1.0},     // paper
                {"lambda", 0.95},   // paper
                {"lr", 6.0e-6},     // ours: the agentic stage's critic learning rate
            }},
       }},
      {"ppo",
       {
           {"enabled", true},        // paper: stage 4, agentic PPO
           {"steps", 150},           // paper: 150 training steps
           {"batch_size", 1024},     // paper: 1024 (trajectories per step here)
           {"mini_batches", 4},      // ours: optimizer steps per epoch over one batch
           {"epochs", 1},            // ours: passes over one batch
           {"actor_lr", 3.0e-6},     // paper
           {"critic_lr", 6.0e-6},    // paper
           {"clip_low", 0.2},        // paper: ratio clipped below at 1 - clip_low
           {"clip_high", 0.28},      // paper: ... and above at 1 + clip_high (clip-higher)
           {"value_clip", 0.2},      // ours: new values stay within old +- value_clip in the clipped loss
           {"gamma", 1.0},           // paper's value-pretraining gamma; no discount over a sparse final reward
           {"lambda", 0.95},         // paper's value-pretraining lambda, kept so the critic's targets do not
                                     // change between stages 3 and 4 (1.0: Monte-Carlo advantages)
           {"whiten_advantages", true},  // ours: advantages normalized over the batch's policy tokens
           {"kl",
            {
                {"coef", 0.0},          // ours: no KL to the reference policy (clip-higher PPO)
                {"estimator", "k1"},    // k1: logp - logp_ref; k2: half its square; k3: Schulman's unbiased
                {"mode", "reward"},     // reward: a per-token penalty in the rewards; loss: a loss term
            }},
           {"entropy_coef", 0.0},                // ours: no entropy bonus
           {"loss_aggregation", "token_mean"},   // ours: token_mean, seq_mean_token_sum, seq_mean_token_mean
           {"grad_clip", 1.0},                   // ours: global gradient-norm clip; 0 turns it off
           {"shard_optimizer_state", false},     // ours: ZeRO stage 1 across data-parallel processes
           {"activation_checkpointing", false},  // ours: recompute each layer in backward (long contexts)
           {"micro_batch_tokens", 0},            // ours: most padded tokens a forward (0: a mini-batch)
       }},
      {"reward",
       {
           {"kind", "milestone"},     // paper: milestone (-1/1/2/3); raw_speedup is the ablation
           {"speedup_margin", 0.05},  // as sandbox.speedup_margin: "faster" means more than 5% faster
       }},
      {"checkpoint",
       {
           {"every_steps", 10},  // ours: checkpoint every this many steps; 0: only at the end of a stage
           {"keep_last", 3},     // ours: checkpoints kept; 0 keeps all
       }},
      {"distributed",
       {
           {"backend", "nccl"},  // nccl (GPUs) or gloo (CPU tests)
       }},
  };
}

namespace {

// The value at a dotted key; a missing key is an error naming it.
const json& at(const json& config, const std::string& dotted) {
  const json* node = &config;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    CA_CHECK(node->is_object() && node->contains(part), "train config: missing key '{}'", dotted);
    node = &(*node)[part];
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

double number(const json& c, const std::string& key) {
  const json& v = at(c, key);
  CA_CHECK(v.is_number(), "train config: '{}' must be a number, got {}", key, v.dump());
  return v.get<double>();
}

long long integer(const json& c, const std::string& key) {
  const json& v = at(c, key);
  CA_CHECK(v.is_number_integer(), "train config: '{}' must be an integer, got {}", key, v.dump());
  return v.get<long long>();
}

std::string string(const json& c, const std::string& key) {
  const json& v = at(c, key);
  CA_CHECK(v.is_string(), "train config: '{}' must be a string, got {}", key, v.dump());
  return v.get<std::string>();
}

bool boolean(const json& c, const std::string& key) {
  const json& v = at(c, key);
  CA_CHECK(v.is_boolean(), "train config: '{}' must be true or false, got {}", key, v.dump());
  return v.get<bool>();
}

// Interval notation in messages: [lo, hi] closed, (lo, hi) open.
void check_range(const json& c, const std::string& key, double lo, bool lo_open, double hi, bool hi_open) {
  const double v = number(c, key);
  const bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  CA_CHECK(ok, "train config: {} = {} is out of range: allowed {}{:g}, {}{}", key, at(c, key).dump(),
           lo_open ? "(" : "[", lo, std::isinf(hi) ? "inf" : fmt::format("{:g}", hi), hi_open ? ")" : "]");
}

void check_at_least(const json& c, const std::string& key, long long lo) {
  const long long v = integer(c, key);
  CA_CHECK(v >= lo, "train config: {} = {} is out of range: must be an integer >= {}", key, v, lo);
}

void check_enum_value(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  CA_FAIL("train config: {} = '{}' is not allowed: use one of {}", key, value, list);
}

void check_enum(const json& c, const std::string& key, const std::vector<std::string>& allowed) {
  check_enum_value(key, string(c, key), allowed);
}

void check_non_empty(const json& c, const std::string& key, const std::string& what) {
  CA_CHECK(!string(c, key).empty(), "train config: {} is empty: set it to {}", key, what);
}

void check_stop_reasons(const json& c, const std::string& key) {
  const json& drop = at(c, key);
  CA_CHECK(drop.is_array(), "train config: '{}' must be a list, got {}", key, drop.dump());
  for (const auto& reason : drop) {
    CA_CHECK(reason.is_string(), "train config: {} holds {}, not a stop reason", key, reason.dump());
    check_enum_value(key, reason.get<std::string>(), kStopReasons);
  }
}

// A teacher is a policy spec (agent::make_policy) or reference:DIR; "" is none. Only the form is
// checked here (the run checks the files and the server's address when it starts the stage).
void check_teacher_form(const std::string& key, const std::string& spec) {
  if (spec.empty()) return;
  for (const char* prefix : {"reference:", "openai:", "replay:", "local:"})
    if (spec.rfind(prefix, 0) == 0 && spec.size() > std::string(prefix).size()) return;
  CA_FAIL("train config: {} = '{}' is not a teacher: use reference:SPLIT (a split folder with solutions/, or a "
          "solutions folder), openai:MODEL@URL, replay:FILE.jsonl or local:MODEL",
          key, spec);
}

constexpr double kInf = INFINITY;

}  // namespace

void validate_train_config(const json& c) {
  CA_CHECK(c.is_object(), "train config: expected a mapping, got {}", c.dump());

  check_non_empty(c, "run.output_dir", "the run's output folder");
  check_at_least(c, "run.seed", 0);
  check_at_least(c, "run.steps_per_log", 1);

  check_non_empty(c, "model.actor",
                  "the actor's weights (a .gguf file or a Hugging Face folder), e.g. --set model.actor=PATH");
  check_non_empty(c, "model.critic", "from_actor, shared, or the critic's weights");
  check_enum(c, "model.dtype", {"bfloat16", "float16", "float32"});
  check_enum(c, "model.device", {"cuda", "cpu"});

  check_non_empty(c, "data.split", "the training split's folder");
  check_at_least(c, "data.tasks_per_step", 1);

  check_at_least(c, "rollout.episodes_per_task", 1);
  check_at_least(c, "rollout.max_turns", 1);
  check_at_least(c, "rollout.max_context_tokens", 1);
  check_at_least(c, "rollout.max_new_tokens", 1);
  CA_CHECK(integer(c, "rollout.max_new_tokens") <= integer(c, "rollout.max_context_tokens"),
           "train config: rollout.max_new_tokens = {} is out of range: must be <= rollout.max_context_tokens ({})",
           integer(c, "rollout.max_new_tokens"), integer(c, "rollout.max_context_tokens"));
  check_range(c, "rollout.temperature", 0, true, 10, false);
  check_range(c, "rollout.top_p", 0, true, 1, false);
  check_range(c, "rollout.sandbox_timeout_s", 0, true, kInf, true);
  check_at_least(c, "rollout.concurrent_episodes", 1);
  check_range(c, "rollout.concurrent_episodes", 1, false, 64, false);
  boolean(c, "rollout.single_turn");
  boolean(c, "rollout.batch_engine");
  check_at_least(c, "rollout.kv_tokens", 256);
  CA_CHECK(integer(c, "rollout.off_policy_steps") == 0 || integer(c, "rollout.off_policy_steps") == 1,
           "train config: rollout.off_policy_steps = {} is out of range: 0 (on-policy) or 1 (the next step's rollouts "
           "sampled while the learner takes this one)",
           at(c, "rollout.off_policy_steps").dump());
  check_at_least(c, "rollout.max_invalid_turns", 1);
  check_at_least(c, "rollout.max_repeated_calls", 2);

  boolean(c, "stages.warmup.enabled");
  check_at_least(c, "stages.warmup.steps", 1);
  check_at_least(c, "stages.warmup.max_context_tokens", 1);
  boolean(c, "stages.warmup.single_turn");
  CA_CHECK(!boolean(c, "stages.warmup.enabled") ||
               integer(c, "rollout.max_new_tokens") <= integer(c, "stages.warmup.max_context_tokens"),
           "train config: stages.warmup.max_context_tokens = {} is out of range: "
           "must be >= rollout.max_new_tokens ({})",
           integer(c, "stages.warmup.max_context_tokens"), integer(c, "rollout.max_new_tokens"));

  boolean(c, "stages.sft.enabled");
  const std::string sft_teacher = string(c, "stages.sft.teacher");
  CA_CHECK(!boolean(c, "stages.sft.enabled") || !sft_teacher.empty(),
           "train config: stages.sft.teacher is empty: the supervised warm-up learns from a teacher's episodes; set it "
           "to reference:SPLIT (the split's reference solutions, e.g. reference:data/core), openai:MODEL@URL, "
           "replay:FILE.jsonl or local:MODEL, or set stages.sft.enabled to false");
  check_teacher_form("stages.sft.teacher", sft_teacher);
  check_at_least(c, "stages.sft.tasks", 0);
  check_at_least(c, "stages.sft.episodes_per_task", 1);
  number(c, "stages.sft.keep_reward_above");
  check_stop_reasons(c, "stages.sft.drop_stop_reasons");
  check_at_least(c, "stages.sft.max_invalid_tool_calls", -1);
  check_at_least(c, "stages.sft.epochs", 1);
  check_at_least(c, "stages.sft.batch_size", 1);
  check_range(c, "stages.sft.lr", 0, true, 1, false);

  boolean(c, "stages.rft.enabled");
  number(c, "stages.rft.keep_reward_above");
  check_stop_reasons(c, "stages.rft.drop_stop_reasons");
  check_at_least(c, "stages.rft.max_invalid_tool_calls", -1);
  check_at_least(c, "stages.rft.tasks", 0);
  check_at_least(c, "stages.rft.epochs", 1);
  check_at_least(c, "stages.rft.batch_size", 1);
  check_range(c, "stages.rft.lr", 0, true, 1, false);
  check_teacher_form("stages.rft.teacher", string(c, "stages.rft.teacher"));
  check_at_least(c, "stages.rft.teacher_episodes_per_task", 0);
  CA_CHECK(integer(c, "stages.rft.teacher_episodes_per_task") == 0 || !string(c, "stages.rft.teacher").empty(),
           "train config: stages.rft.teacher_episodes_per_task = {} but stages.rft.teacher is empty: name the teacher "
           "(e.g. reference:data/core) or set teacher_episodes_per_task to 0",
           integer(c, "stages.rft.teacher_episodes_per_task"));

  boolean(c, "stages.value_pretrain.enabled");
  check_at_least(c, "stages.value_pretrain.steps", 1);
  check_range(c, "stages.value_pretrain.gamma", 0, false, 1, false);
  check_range(c, "stages.value_pretrain.lambda", 0, false, 1, false);
  check_range(c, "stages.value_pretrain.lr", 0, true, 1, false);

  boolean(c, "ppo.enabled");
  check_at_least(c, "ppo.steps", 1);
  check_at_least(c, "ppo.batch_size", 1);
  check_at_least(c, "ppo.mini_batches", 1);
  check_at_least(c, "ppo.epochs", 1);
  check_range(c, "ppo.actor_lr", 0, true, 1, false);
  check_range(c, "ppo.critic_lr", 0, true, 1, false);
  check_range(c, "ppo.clip_low", 0, true, 1, true);
  check_range(c, "ppo.clip_high", 0, true, 10, false);
  check_range(c, "ppo.value_clip", 0, true, kInf, true);
  check_range(c, "ppo.gamma", 0, false, 1, false);
  check_range(c, "ppo.lambda", 0, false, 1, false);
  boolean(c, "ppo.whiten_advantages");
  boolean(c, "ppo.activation_checkpointing");
  check_at_least(c, "ppo.micro_batch_tokens", 0);
  check_range(c, "ppo.kl.coef", 0, false, kInf, true);
  check_enum(c, "ppo.kl.estimator", {"k1", "k2", "k3"});
  check_enum(c, "ppo.kl.mode", {"reward", "loss"});
  check_range(c, "ppo.entropy_coef", 0, false, kInf, true);
  check_enum(c, "ppo.loss_aggregation", {"token_mean", "seq_mean_token_sum", "seq_mean_token_mean"});
  check_range(c, "ppo.grad_clip", 0, false, kInf, true);

  check_enum(c, "reward.kind", {"milestone", "raw_speedup"});
  check_range(c, "reward.speedup_margin", 0, false, 1, false);

  check_at_least(c, "checkpoint.every_steps", 0);
  check_at_least(c, "checkpoint.keep_last", 0);

  check_enum(c, "distributed.backend", {"nccl", "gloo"});

  // Keys that must agree with each other.
  const long long batch = integer(c, "ppo.batch_size");
  const long long tasks = integer(c, "data.tasks_per_step");
  const long long episodes = integer(c, "rollout.episodes_per_task");
  CA_CHECK(batch == tasks * episodes,
           "train config: ppo.batch_size = {} must equal "
           "data.tasks_per_step x rollout.episodes_per_task = {} x {} = {}",
           batch, tasks, episodes, tasks * episodes);
  const long long minis = integer(c, "ppo.mini_batches");
  CA_CHECK(minis <= batch && batch % minis == 0,
           "train config: ppo.mini_batches = {} is out of range: must divide ppo.batch_size ({})", minis, batch);
  CA_CHECK(boolean(c, "stages.sft.enabled") || boolean(c, "stages.warmup.enabled") || boolean(c, "stages.rft.enabled") ||
               boolean(c, "stages.value_pretrain.enabled") || boolean(c, "ppo.enabled"),
           "train config: every stage is disabled (stages.sft.enabled, stages.warmup.enabled, stages.rft.enabled, "
           "stages.value_pretrain.enabled, ppo.enabled): enable at least one");
}

json load_train_config(const std::filesystem::path& yaml, const std::vector<std::string>& set_overrides) {
  json config = train_config_defaults();
  if (!yaml.empty()) merge_checked(config, load_yaml_file(yaml), yaml.string());
  for (const auto& assignment : set_overrides) apply_override(config, assignment);
  validate_train_config(config);
  return config;
}

namespace {

// Shortest text that reads back as the same double, always with a decimal point ("1.0", not
// "1"; "3.0e-06", not "3e-06"), so a float key never comes back as an integer and YAML 1.1
// readers (PyYAML) see a float, not a string.
std::string float_text(double d) {
  std::string s = fmt::format("{}", d);
  if (s.find('.') == std::string::npos) {
    const size_t e = s.find_first_of("eE");
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  }
  return s;
}

void emit(YAML::Emitter& out, const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, value] : v.items()) {
        out << YAML::Key << key << YAML::Value;
        emit(out, value);
      }
      out << YAML::EndMap;
      break;
    case json::value_t::array:
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : v) emit(out, item);
      out << YAML::EndSeq;
      break;
    case json::value_t::string:
      out << YAML::DoubleQuoted << v.get<std::string>();
      break;
    case json::value_t::boolean:
      out << YAML::TrueFalseBool << v.get<bool>();
      break;
    case json::value_t::number_integer:
      out << v.get<long long>();
      break;
    case json::value_t::number_unsigned:
      out << v.get<unsigned long long>();
      break;
    case json::value_t::number_float:
      out << float_text(v.get<double>());
      break;
    default:
      out << YAML::Null;
      break;
  }
}

}  // namespace

std::string train_config_to_yaml(const json& config) {
  YAML::Emitter out;
  emit(out, config);
  CA_ASSERT(out.good(), "YAML emitter failed: {}", out.GetLastError());
  return std::string("# The resolved training config of this run (defaults <- YAML <- --set).\n") + out.c_str() + "\n";
}

void save_resolved_config(const json& config, const std::filesystem::path& run_dir) {
  write_file_atomic(run_dir / "config.resolved.yaml", train_config_to_yaml(config));
}

TrainConfig TrainConfig::from_json(json config) {
  validate_train_config(config);
  TrainConfig t;
  const json& c = config;
  const json &run = c["run"], &model = c["model"], &rollout = c["rollout"], &stages = c["stages"], &ppo = c["ppo"];
  t.run.output_dir = run["output_dir"].get<std::string>();
  t.run.seed = run["seed"].get<uint64_t>();
  t.run.steps_per_log = run["steps_per_log"].get<int>();
  t.model.actor = model["actor"].get<std::string>();
  t.model.critic = model["critic"].get<std::string>();
  t.model.dtype = model["dtype"].get<std::string>();
  t.model.device = model["device"].get<std::string>();
  t.data.split = c["data"]["split"].get<std::string>();
  t.data.tasks_per_step = c["data"]["tasks_per_step"].get<int>();
  TrainConfig::Rollout& r = t.rollout;
  r.episodes_per_task = rollout["episodes_per_task"].get<int>();
  r.max_turns = rollout["max_turns"].get<int>();
  r.max_context_tokens = rollout["max_context_tokens"].get<int64_t>();
  r.max_new_tokens = rollout["max_new_tokens"].get<int64_t>();
  r.temperature = rollout["temperature"].get<double>();
  r.top_p = rollout["top_p"].get<double>();
  r.sandbox_timeout_s = rollout["sandbox_timeout_s"].get<double>();
  r.concurrent_episodes = rollout["concurrent_episodes"].get<int>();
  r.single_turn = rollout["single_turn"].get<bool>();
  r.batch_engine = rollout["batch_engine"].get<bool>();
  r.kv_tokens = rollout["kv_tokens"].get<int64_t>();
  r.off_policy_steps = rollout["off_policy_steps"].get<int>();
  r.max_invalid_turns = rollout["max_invalid_turns"].get<int>();
  r.max_repeated_calls = rollout["max_repeated_calls"].get<int>();
  auto fine_tune = [](const json& s, TrainConfig::FineTune& f) {
    f.enabled = s["enabled"].get<bool>();
    f.teacher = s["teacher"].get<std::string>();
    f.tasks = s["tasks"].get<size_t>();
    f.filter = RftFilterOptions::from_config(s);
    f.epochs = s["epochs"].get<int>();
    f.batch_size = s["batch_size"].get<int64_t>();
    f.lr = s["lr"].get<double>();
  };
  fine_tune(stages["sft"], t.stages.sft);
  t.stages.sft.episodes_per_task = stages["sft"]["episodes_per_task"].get<int>();
  fine_tune(stages["rft"], t.stages.rft);
  t.stages.rft.teacher_episodes_per_task = stages["rft"]["teacher_episodes_per_task"].get<int>();
  const json& warmup = stages["warmup"];
  t.stages.warmup.enabled = warmup["enabled"].get<bool>();
  t.stages.warmup.steps = warmup["steps"].get<int>();
  t.stages.warmup.max_context_tokens = warmup["max_context_tokens"].get<int64_t>();
  t.stages.warmup.single_turn = warmup["single_turn"].get<bool>();
  const json& vp = stages["value_pretrain"];
  t.stages.value_pretrain.enabled = vp["enabled"].get<bool>();
  t.stages.value_pretrain.steps = vp["steps"].get<int>();
  t.stages.value_pretrain.gamma = vp["gamma"].get<double>();
  t.stages.value_pretrain.lambda = vp["lambda"].get<double>();
  t.stages.value_pretrain.lr = vp["lr"].get<double>();
  t.ppo.enabled = ppo["enabled"].get<bool>();
  t.ppo.steps = ppo["steps"].get<int>();
  t.ppo.batch_size = ppo["batch_size"].get<int64_t>();
  t.ppo.gamma = ppo["gamma"].get<double>();
  t.ppo.lambda = ppo["lambda"].get<double>();
  t.ppo.whiten_advantages = ppo["whiten_advantages"].get<bool>();
  t.ppo.learner = lm::PpoOptions::from_config(ppo);
  t.reward.kind = c["reward"]["kind"].get<std::string>();
  t.reward.speedup_margin = c["reward"]["speedup_margin"].get<double>();
  t.checkpoint.every_steps = c["checkpoint"]["every_steps"].get<int>();
  t.checkpoint.keep_last = c["checkpoint"]["keep_last"].get<int>();
  t.distributed_backend = c["distributed"]["backend"].get<std::string>();
  t.raw = std::move(config);
  return t;
}

}  // namespace cuda_agent::rl
