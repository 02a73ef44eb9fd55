#include "cuda_agent/rl/trainer.h"

#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cuda_agent/agent/episode.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/policy/chat_session.h"
#include "cuda_agent/policy/local_policy.h"
#include "cuda_agent/policy/ppo_learner.h"
#include "cuda_agent/rl/rollout.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cuda_agent::rl {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Stage {
  std::string name;  // "warmup" or "ppo": the name in state.json and metrics.jsonl
  int steps = 0;
  bool single_turn = false;
  int64_t max_context_tokens = 0;
};

// The keys a resumed run may change: where it writes and how long each stage runs.
const std::vector<std::string> kResumeMayChange = {"run.output_dir", "ppo.steps", "stages.warmup.steps",
                                                   "stages.value_pretrain.steps"};

std::string rollout_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// The files beside a Hugging Face actor that make a checkpoint's actor/ folder loadable on its own.
void copy_tokenizer_files(const fs::path& actor, const fs::path& to) {
  if (!fs::is_directory(actor)) return;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                           "vocab.json", "merges.txt"}) {
    if (fs::is_regular_file(actor / name)) fs::copy_file(actor / name, to / name, fs::copy_options::overwrite_existing);
  }
}

struct RunContext {
  const json& config;
  const TrainRunOptions& options;
  std::ostream& log;
  fs::path run_dir;
  fs::path actor;  // model.actor: the tokenizer and template of every rollout session
  bench::Split split;
  TaskCursor cursor;
  policy::PpoLearner* learner = nullptr;
  MetricsLog metrics;
};

// One episode; returns false (after logging) when it threw.
bool run_one_episode(RunContext& ctx, const Stage& stage, int64_t step, size_t task_index, int episode,
                     agent::EpisodeResult* out) {
  const json& rollout = ctx.config["rollout"];
  const bench::TaskEntry& task = ctx.split.tasks[task_index];
  try {
    policy::LocalPolicyOptions lp;
    lp.temperature = rollout["temperature"].get<double>();
    lp.top_p = rollout["top_p"].get<double>();
    lp.max_new_tokens = rollout["max_new_tokens"].get<int64_t>();
    lp.seed = episode_seed(ctx.config["run"]["seed"].get<uint64_t>(), step, task_index, episode);
    policy::LocalPolicy policy(policy::ChatSession::open_with_model(ctx.actor, ctx.learner->policy()), lp);

    agent::EpisodeSpec spec;
    spec.task = task.path;
    spec.policy_instance = &policy;
    spec.output_dir = ctx.run_dir / "rollouts" / rollout_dir_name(step) / fmt::format("{}-e{}", task.id, episode);
    spec.skill_file = ctx.options.skill_file;
    spec.device = ctx.options.device;
    spec.gpu = ctx.options.gpu;
    spec.agent.single_turn = stage.single_turn;
    spec.agent.max_turns = stage.single_turn ? 1 : rollout["max_turns"].get<int>();
    spec.agent.max_invalid_turns = rollout["max_invalid_turns"].get<int>();
    spec.agent.max_repeated_calls = rollout["max_repeated_calls"].get<int>();
    // AgentOptions budgets characters; ~4 characters a token, as its default (400k ~ 100k tokens).
    spec.agent.context_budget_chars = static_cast<size_t>(stage.max_context_tokens) * 4;
    spec.sandbox.timeout_s = rollout["sandbox_timeout_s"].get<double>();
    spec.sandbox.reward = ctx.config["reward"]["kind"].get<std::string>();
    spec.sandbox.speedup_margin = ctx.config["reward"]["speedup_margin"].get<double>();
    *out = agent::run_task_episode(spec);
    return true;
  } catch (const std::exception& e) {
    ctx.log << fmt::format("[train] step {}: episode {} of task {} failed: {}\n", step, episode, task.id, e.what());
    return false;
  }
}

json run_step(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  const json& c = ctx.config;
  const auto t_step = Clock::now();
  const std::vector<size_t> picks = ctx.cursor.next(c["data"]["tasks_per_step"].get<size_t>());
  const int per_task = c["rollout"]["episodes_per_task"].get<int>();
  const bool milestone = c["reward"]["kind"].get<std::string>() == "milestone";

  std::vector<EpisodeSequence> episodes;
  int64_t completed = 0, failed = 0, unusable = 0, passed = 0, faster = 0;
  double reward_sum = 0, episode_seconds = 0;
  json task_ids = json::array();
  for (size_t index : picks) {
    task_ids.push_back(ctx.split.tasks[index].id);
    for (int e = 0; e < per_task; ++e) {
      agent::EpisodeResult result;
      const auto t0 = Clock::now();
      const bool ok = run_one_episode(ctx, stage, step, index, e, &result);
      episode_seconds += seconds_since(t0);
      if (!ok) {
        ++failed;
        continue;
      }
      ++completed;
      reward_sum += result.reward;
      if (result.score.is_object() && result.score.value("correct", json()) == json(true)) ++passed;
      if (milestone && result.reward >= 3.0) ++faster;
      try {
        episodes.push_back(episode_sequence(result.trajectory));
      } catch (const std::exception& err) {
        ++unusable;
        ctx.log << fmt::format("[train] step {}: episode {} of task {} has no usable token records: {}\n", step, e,
                               ctx.split.tasks[index].id, err.what());
      }
    }
  }

  json record = {{"step", step}, {"stage", stage.name}, {"step_in_stage", step_in_stage}, {"tasks", task_ids},
                 {"episodes", completed}, {"episodes_failed", failed}, {"episodes_unusable", unusable},
                 {"episode_seconds", episode_seconds}};
  if (completed > 0) {
    record["reward_mean"] = reward_sum / static_cast<double>(completed);
    record["pass_rate"] = static_cast<double>(passed) / static_cast<double>(completed);
    if (milestone) record["faster_than_compile_rate"] = static_cast<double>(faster) / static_cast<double>(completed);
  }
  const RolloutStats stats = rollout_stats(episodes);
  record["sequences"] = stats.sequences;
  record["chained_episodes"] = stats.chained_episodes;
  record["response_length_mean"] = stats.response_length_mean;
  record["response_length_max"] = stats.response_length_max;
  record["tokens"] = stats.tokens;

  const int mini_batches = c["ppo"]["mini_batches"].get<int>();
  if (stats.sequences < mini_batches) {
    ctx.log << fmt::format("[train] step {}: {} usable sequences, fewer than ppo.mini_batches = {}: no update\n", step,
                           stats.sequences, mini_batches);
    record["update_skipped"] = true;
  } else {
    const auto t_update = Clock::now();
    const std::vector<policy::TrainForward> forward =
        ctx.learner->policy().forward_for_training(sequence_tokens(episodes), {});
    std::vector<std::vector<float>> values;
    values.reserve(forward.size());
    for (const auto& f : forward) values.push_back(f.values);
    const std::vector<policy::PpoSample> samples =
        ppo_samples(episodes, values, c["ppo"]["gamma"].get<double>(), c["ppo"]["lambda"].get<double>(),
                    c["ppo"]["whiten_advantages"].get<bool>());
    const policy::PpoStats s = ctx.learner->update(samples);
    record["update_skipped"] = false;
    record["loss"] = s.loss;
    record["policy_loss"] = s.policy_loss;
    record["value_loss"] = s.value_loss;
    record["entropy"] = s.entropy;
    record["kl"] = s.kl;
    record["clip_fraction"] = s.clip_fraction;
    record["value_clip_fraction"] = s.value_clip_fraction;
    record["grad_norm_actor"] = s.grad_norm_actor;
    record["grad_norm_critic"] = s.grad_norm_critic;
    record["policy_tokens"] = s.tokens;
    record["update_seconds"] = seconds_since(t_update);
  }
  record["step_seconds"] = seconds_since(t_step);
  return record;
}

void checkpoint(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  const json state = {{"stage", stage.name}, {"step_in_stage", step_in_stage}, {"global_step", step},
                      {"cursor", ctx.cursor.state()}, {"config", ctx.config}};
  const CheckpointInfo info = write_checkpoint(
      ctx.run_dir, step, state,
      [&](const fs::path& dir) {
        ctx.learner->policy().save_hf(dir / "actor");
        copy_tokenizer_files(ctx.actor, dir / "actor");
      },
      ctx.config["checkpoint"]["keep_last"].get<int>());
  ctx.log << fmt::format("[train] checkpoint {}\n", info.dir.string());
}

}  // namespace

uint64_t episode_seed(uint64_t run_seed, int64_t step, size_t task_index, int episode) {
  uint64_t h = splitmix64(run_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  h = splitmix64(h ^ static_cast<uint64_t>(task_index));
  return splitmix64(h ^ static_cast<uint64_t>(episode));
}

TrainRunSummary run_training(const json& config, const TrainRunOptions& options, std::ostream& log) {
  validate_train_config(config);
  CA_CHECK(options.device == "cuda" || options.device == "cpu", "train: device must be cuda or cpu, got '{}'",
           options.device);
  const fs::path run_dir = config["run"]["output_dir"].get<std::string>();
  const fs::path actor = config["model"]["actor"].get<std::string>();
  CA_CHECK(fs::exists(actor), "train config: model.actor = '{}': no such file or folder", actor.string());
  const fs::path split_path = config["data"]["split"].get<std::string>();
  CA_CHECK(fs::exists(split_path), "train config: data.split = '{}': no such file or folder", split_path.string());
  bench::Split split = bench::load_any_split(split_path, run_dir / "split");
  CA_CHECK(!split.tasks.empty(), "train config: data.split = '{}' holds no tasks", split_path.string());

  // The stages in the recipe's order; the two not built yet are named, not faked.
  std::vector<Stage> stages;
  const json& st = config["stages"];
  if (st["warmup"]["enabled"].get<bool>())
    stages.push_back({"warmup", st["warmup"]["steps"].get<int>(), st["warmup"]["single_turn"].get<bool>(),
                      st["warmup"]["max_context_tokens"].get<int64_t>()});
  if (st["rft"]["enabled"].get<bool>())
    log << "[train] stages.rft is enabled but RFT is not implemented in the trainer yet: skipped\n";
  if (st["value_pretrain"]["enabled"].get<bool>())
    log << "[train] stages.value_pretrain is enabled but value pretraining is not implemented in the trainer yet: "
           "skipped\n";
  if (config["ppo"]["enabled"].get<bool>())
    stages.push_back({"ppo", config["ppo"]["steps"].get<int>(), config["rollout"]["single_turn"].get<bool>(),
                      config["rollout"]["max_context_tokens"].get<int64_t>()});
  CA_CHECK(!stages.empty(), "train config: neither stages.warmup nor ppo is enabled, and they are the only stages "
                            "the trainer runs so far");

  // Where to start: a fresh run, or the step after the latest checkpoint.
  fs::path actor_weights = actor;
  size_t first_stage = 0;
  int first_step_in_stage = 0;  // steps of first_stage already done
  int64_t step = 0;
  json cursor_state;
  if (options.resume) {
    const CheckpointInfo ckpt = latest_checkpoint(run_dir);
    CA_CHECK(ckpt.step >= 0, "--resume: {} has no checkpoint (checkpoints/latest); start without --resume",
             run_dir.string());
    const std::vector<std::string> diffs = config_differences(ckpt.state.at("config"), config, kResumeMayChange);
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      CA_FAIL("--resume: the config differs from the run's saved config in keys that may not change:{}", list);
    }
    const std::string stage_name = ckpt.state.at("stage").get<std::string>();
    first_stage = stages.size();
    for (size_t i = 0; i < stages.size(); ++i)
      if (stages[i].name == stage_name) first_stage = i;
    CA_CHECK(first_stage < stages.size(), "--resume: checkpoint {} is of stage '{}', which this config does not run",
             ckpt.dir.string(), stage_name);
    first_step_in_stage = ckpt.state.at("step_in_stage").get<int>();
    step = ckpt.step;
    cursor_state = ckpt.state.at("cursor");
    actor_weights = ckpt.dir / "actor";
    MetricsLog::truncate_after(run_dir / "metrics.jsonl", step);
    // Rollouts of steps after the checkpoint belong to the interrupted run; they are redone.
    if (fs::is_directory(run_dir / "rollouts"))
      for (const auto& entry : fs::directory_iterator(run_dir / "rollouts")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("step-", 0) == 0 && std::stoll(name.substr(5)) > step) fs::remove_all(entry.path());
      }
    log << fmt::format("[train] resuming {} after step {} (stage {}, step {} of it) from {}\n", run_dir.string(), step,
                       stage_name, first_step_in_stage, ckpt.dir.string());
    log << "[train] note: the optimizer's AdamW moments are not checkpointed; they restart from zero\n";
  } else {
    CA_CHECK(!fs::exists(run_dir / "metrics.jsonl") && !fs::exists(run_dir / "checkpoints") &&
                 !fs::exists(run_dir / "rollouts"),
             "run.output_dir = '{}' already holds a training run: pass --resume to continue it, or choose another "
             "run.output_dir",
             run_dir.string());
  }
  save_resolved_config(config, run_dir);

  const std::string critic = config["model"]["critic"].get<std::string>();
  if (critic != "shared")
    log << fmt::format("[train] model.critic = '{}': a separate critic model is not supported yet; the critic is the "
                       "value head on the actor's trunk (shared)\n",
                       critic);
  policy::LmOptions lm;
  lm.value_head = true;
  lm.dtype = config["model"]["dtype"].get<std::string>();
  const bool on_cpu = options.device == "cpu" || config["model"]["device"].get<std::string>() == "cpu";
  lm.device = on_cpu ? "cpu" : fmt::format("cuda:{}", options.gpu);
  lm.seed = config["run"]["seed"].get<uint64_t>();
  policy::PpoOptions ppo = policy::PpoOptions::from_config(config["ppo"]);
  ppo.seed = lm.seed;
  CA_CHECK(fs::exists(actor_weights), "--resume: the checkpoint's actor folder {} is missing", actor_weights.string());
  std::unique_ptr<policy::PpoLearner> learner = policy::create_ppo_learner(actor_weights, lm, ppo);
  log << fmt::format("[train] actor {} on {} ({}); {} tasks in {}\n", actor_weights.string(), lm.device, lm.dtype,
                     split.tasks.size(), split.name);

  const size_t task_count = split.tasks.size();
  RunContext ctx{config, options, log, run_dir, actor, std::move(split),
                 TaskCursor(task_count, config["run"]["seed"].get<uint64_t>()), learner.get(),
                 MetricsLog(run_dir / "metrics.jsonl")};
  if (!cursor_state.is_null()) ctx.cursor.restore(cursor_state);

  TrainRunSummary summary;
  summary.run_dir = run_dir;
  const int every = config["checkpoint"]["every_steps"].get<int>();
  for (size_t si = first_stage; si < stages.size(); ++si) {
    const Stage& stage = stages[si];
    const int start = si == first_stage ? first_step_in_stage : 0;
    if (start >= stage.steps) {
      log << fmt::format("[train] stage {}: all {} steps done\n", stage.name, stage.steps);
      continue;
    }
    log << fmt::format("[train] stage {}: steps {}..{} of {}{}\n", stage.name, start + 1, stage.steps, stage.steps,
                       stage.single_turn ? " (single-turn)" : "");
    for (int k = start + 1; k <= stage.steps; ++k) {
      ++step;
      if (summary.first_step == 0) summary.first_step = step;
      const json record = run_step(ctx, stage, step, k);
      ctx.metrics.append(record);
      write_training_plots(MetricsLog::read(ctx.metrics.path()), run_dir / "plots");
      log << fmt::format("[train] step {} ({} {}/{}): reward_mean {} pass_rate {} policy_loss {} value_loss {} ({:.1f} s)\n",
                         step, stage.name, k, stage.steps, record.value("reward_mean", json()).dump(),
                         record.value("pass_rate", json()).dump(), record.value("policy_loss", json()).dump(),
                         record.value("value_loss", json()).dump(), record["step_seconds"].get<double>());
      ++summary.steps_run;
      if ((every > 0 && step % every == 0) || k == stage.steps) checkpoint(ctx, stage, step, k);
    }
  }
  summary.last_step = step;
  log << fmt::format("[train] done: {} steps run, last step {}\n", summary.steps_run, step);
  return summary;
}

}  // namespace cuda_agent::rl
