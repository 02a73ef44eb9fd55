#include "cuda_agent/rl/trainer.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cuda_agent/agent/reference_policy.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/stop_request.h"
#include "cuda_agent/lm/distributed.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "trainer_internal.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cuda_agent::rl {
namespace {

using detail::run_stage_step;
using detail::RunContext;
using detail::splitmix64;
using detail::Stage;
using detail::StageKind;
using detail::step_summary;

// The stages in the recipe's order.
const std::vector<std::string> kRecipe = {"sft", "warmup", "rft", "value_pretrain", "ppo"};

size_t recipe_rank(const std::string& stage) {
  return static_cast<size_t>(std::find(kRecipe.begin(), kRecipe.end(), stage) - kRecipe.begin());
}

// Every process calls it (a sharded optimizer state is gathered on rank 0); rank 0 writes.
void checkpoint(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  if (!ctx.writer()) {
    ctx.learner->save_state({});  // takes part in the gathering, writes nothing
    return;
  }
  const json state = {{"stage", stage.name},
                      {"step_in_stage", step_in_stage},
                      {"global_step", step},
                      {"cursor", ctx.prefetched ? ctx.cursor_before_prefetch : ctx.cursor.state()},
                      {"config", ctx.config.raw}};
  const CheckpointInfo info = write_checkpoint(
      ctx.run_dir, step, state,
      [&](const fs::path& dir) {
        ctx.learner->policy().save_hf(dir / "actor");
        write_actor_tokenizer_files(ctx.actor, dir / "actor");
        ctx.learner->save_state(dir);  // critic/ (when separate), optimizer moments, shuffle generator
      },
      ctx.config.checkpoint.keep_last);
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
  const TrainConfig cfg = TrainConfig::from_json(config);
  CA_CHECK(options.device == "cuda" || options.device == "cpu", "train: device must be cuda or cpu, got '{}'",
           options.device);
  // One process per GPU under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
  // without them a world of one. Rank 0 writes the run's files; every process samples its share.
  const lm::DistributedOptions dist = lm::DistributedOptions::from_environment();
  const bool writer = dist.rank == 0;
  CA_CHECK(cfg.data.tasks_per_step >= dist.world_size,
           "train config: data.tasks_per_step = {} is smaller than WORLD_SIZE = {}: every process needs a task per "
           "step",
           cfg.data.tasks_per_step, dist.world_size);
  const fs::path run_dir = cfg.run.output_dir;
  const fs::path actor = cfg.model.actor;
  CA_CHECK(fs::exists(actor), "train config: model.actor = '{}': no such file or folder", actor.string());
  const fs::path split_path = cfg.data.split;
  CA_CHECK(fs::exists(split_path), "train config: data.split = '{}': no such file or folder", split_path.string());
  bench::Split split = bench::load_any_split(split_path, run_dir / "split");
  // A degenerate task (a trivial kernel passes it) teaches nothing but the trivial kernel: tasks
  // the split flags are left out here, and episodes whose evaluation flags their task are masked
  // (sample_episodes, trainer_stages.cpp).
  const size_t listed = split.tasks.size();
  std::erase_if(split.tasks, [](const bench::TaskEntry& t) { return t.degenerate; });
  CA_CHECK(!split.tasks.empty(), "train config: data.split = '{}' holds no tasks{}", split_path.string(),
           listed > 0 ? fmt::format(" that are not flagged degenerate ({} are)", listed) : "");

  // The teachers, checked before any model loads: reference:DIR's folder, or the policy spec as
  // make_policy takes it (a replay file read, a local model's file found).
  const TrainConfig::Stages& st = cfg.stages;
  auto check_teacher = [](const char* key, const std::string& teacher, bool used) {
    if (!used) return;
    try {
      agent::validate_teacher_spec(teacher);
    } catch (const std::exception& e) {
      CA_FAIL("train config: stages.{}.teacher = '{}': {}", key, teacher, e.what());
    }
  };
  check_teacher("sft", st.sft.teacher, st.sft.enabled);
  check_teacher("rft", st.rft.teacher, st.rft.enabled && st.rft.teacher_episodes_per_task > 0);

  // The enabled stages in the recipe's order (validate_train_config requires at least one).
  std::vector<Stage> stages;
  const bool rollout_single_turn = cfg.rollout.single_turn;
  const int64_t rollout_context = cfg.rollout.max_context_tokens;
  if (st.sft.enabled)
    stages.push_back({"sft", StageKind::kSft, 1, rollout_single_turn, rollout_context});
  if (st.warmup.enabled)
    stages.push_back(
        {"warmup", StageKind::kPpo, st.warmup.steps, st.warmup.single_turn, st.warmup.max_context_tokens});
  if (st.rft.enabled)
    stages.push_back({"rft", StageKind::kRft, 1, rollout_single_turn, rollout_context});
  if (st.value_pretrain.enabled)
    stages.push_back({"value_pretrain", StageKind::kValuePretrain, 1, rollout_single_turn, rollout_context});
  if (cfg.ppo.enabled)
    stages.push_back({"ppo", StageKind::kPpo, cfg.ppo.steps, rollout_single_turn, rollout_context});

  // Where to start: a fresh run, or after the latest checkpoint.
  fs::path actor_weights = actor;
  fs::path learner_state;  // a resumed run: the checkpoint whose optimizer and critic state to load
  size_t first_stage = 0;
  int first_step_in_stage = 0;  // steps of first_stage already done
  int64_t step = 0;
  json cursor_state;
  const CheckpointInfo latest = latest_checkpoint(run_dir);
  const bool leftovers = fs::exists(run_dir / "metrics.jsonl") || fs::exists(run_dir / "rollouts");
  if (latest.step < 0 && leftovers && writer) {
    // A run stopped before its first checkpoint: nothing to resume from, so either way it starts
    // over; what it left is cleared first.
    log << fmt::format("[train] {} holds a run stopped before its first checkpoint: starting over{}\n",
                       run_dir.string(), options.resume ? " (--resume has nothing to resume from)" : "");
    for (const char* part : {"metrics.jsonl", "rollouts", "plots", "checkpoints"}) fs::remove_all(run_dir / part);
  } else if (options.resume && latest.step < 0) {
    log << fmt::format("[train] --resume: {} has no checkpoint yet: starting from the beginning\n", run_dir.string());
  }
  if (options.resume && latest.step >= 0) {
    const CheckpointInfo& ckpt = latest;
    const std::vector<std::string> diffs = config_differences(
        ckpt.state.at("config"), config, resume_may_change(ckpt.state.at("config"), ckpt.state.at("stage")));
    if (!diffs.empty()) {
      std::string list;
      for (const auto& d : diffs) list += "\n  " + d;
      CA_FAIL("--resume: the config differs from the run's saved config in keys that may not change:{}", list);
    }
    const std::string stage_name = ckpt.state.at("stage").get<std::string>();
    const size_t rank = recipe_rank(stage_name);
    CA_CHECK(rank < kRecipe.size(), "--resume: checkpoint {} is of stage '{}', not one of sft, warmup, rft, "
             "value_pretrain, ppo", ckpt.dir.string(), stage_name);
    // The checkpoint's stage when this config runs it, else the first enabled stage after it.
    first_stage = stages.size();
    for (size_t i = 0; i < stages.size() && first_stage == stages.size(); ++i)
      if (recipe_rank(stages[i].name) >= rank) first_stage = i;
    std::string before;
    for (size_t i = 0; i < first_stage; ++i) before += (before.empty() ? "" : ", ") + stages[i].name;
    if (!before.empty())
      log << fmt::format("[train] not run again (before the checkpoint's stage {}): {}\n", stage_name, before);
    if (first_stage < stages.size() && stages[first_stage].name == stage_name)
      first_step_in_stage = ckpt.state.at("step_in_stage").get<int>();
    step = ckpt.step;
    cursor_state = ckpt.state.at("cursor");
    actor_weights = ckpt.dir / "actor";
    if (writer) MetricsLog::truncate_after(run_dir / "metrics.jsonl", step);
    // Rollouts written after the checkpoint belong to the interrupted run; they are redone: later
    // steps' folders, and those of the one-step stages after the checkpoint's stage. (The other
    // processes start sampling only after the learner's rendezvous, which comes after this.)
    if (writer && fs::is_directory(run_dir / "rollouts"))
      for (const auto& entry : fs::directory_iterator(run_dir / "rollouts")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("step-", 0) == 0 && std::stoll(name.substr(5)) > step) fs::remove_all(entry.path());
      }
    for (const auto& [folder, stage] : std::vector<std::pair<std::string, std::string>>{
             {"sft", "sft"}, {"rft", "rft"}, {"rft-teacher", "rft"}, {"value_pretrain", "value_pretrain"}})
      if (writer && rank < recipe_rank(stage)) fs::remove_all(run_dir / "rollouts" / folder);
    log << fmt::format("[train] resuming {} after step {} (stage {}, step {} of it) from {}\n", run_dir.string(), step,
                       stage_name, ckpt.state.at("step_in_stage").get<int>(), ckpt.dir.string());
    learner_state = ckpt.dir;
  } else if (!options.resume) {
    CA_CHECK(latest.step < 0,
             "run.output_dir = '{}' already holds a training run (checkpoint at step {}): pass --resume to continue "
             "it, or choose another run.output_dir",
             run_dir.string(), latest.step);
  }

  lm::PpoOptions ppo = cfg.ppo.learner;
  ppo.critic = cfg.model.critic;
  ppo.temperature = cfg.rollout.temperature;  // the policy the rollouts sampled (PpoOptions::temperature)
  // A resumed separate critic starts from the checkpoint's critic/ (load_state sets its weights
  // and moments either way; this only spares copying or loading the configured one first).
  if (!learner_state.empty() && ppo.critic != "shared" && fs::is_directory(learner_state / "critic"))
    ppo.critic = (learner_state / "critic").string();
  lm::LmOptions lm;
  lm.value_head = ppo.critic == "shared";
  lm.dtype = cfg.model.dtype;
  const bool on_cpu = options.device == "cpu" || cfg.model.device == "cpu";
  if (on_cpu && lm.dtype != "float32") {
    // PyTorch runs half-precision matrix work on the CPU through a slow generic path (a cut-down
    // quickstart sat in its first update for over 17 minutes): float32 there.
    log << fmt::format("[train] model.dtype {} is slow on the CPU: the model runs in float32 there\n", lm.dtype);
    lm.dtype = "float32";
  }
  const int gpu = dist.distributed() ? dist.local_rank : options.gpu;  // torchrun: LOCAL_RANK's GPU
  lm.device = on_cpu ? "cpu" : fmt::format("cuda:{}", gpu);
  lm.seed = cfg.run.seed;
  lm.batch_engine = cfg.rollout.batch_engine;
  lm.kv_tokens = cfg.rollout.kv_tokens;
  if (lm.batch_engine) {
    // The engine's pool holds no more than the episodes in flight can fill: each turn's prompt
    // is within its stage's context and its reply within max_new_tokens. The rest would stay
    // reserved in this process (the default 131072 positions: 2.8 GiB of SmolLM2-135M's bfloat16
    // keys and values) while the sandbox's evaluations on the GPU may need it.
    int64_t context = 0;
    for (const Stage& s : stages) context = std::max(context, s.max_context_tokens);
    const int64_t in_flight =
        static_cast<int64_t>(cfg.rollout.concurrent_episodes) * (context + cfg.rollout.max_new_tokens);
    if (in_flight < lm.kv_tokens) {
      lm.kv_tokens = in_flight;
      log << fmt::format(
          "[train] the batch engine's KV pool: {} positions ({} episode(s) at once, each within {} + {} "
          "tokens; rollout.kv_tokens {})\n",
          in_flight, cfg.rollout.concurrent_episodes, context, cfg.rollout.max_new_tokens, cfg.rollout.kv_tokens);
    }
  }
  // The engine's thread decodes every episode's turns: it holds the GPU's quiet lock while it works
  // and steps aside between two steps for a timed run that waits (the episodes' replies, which
  // QuietGpuPolicy holds the lock around without the engine, then hold nothing).
  if (!on_cpu && lm.batch_engine) lm.engine_gate = sandbox::batch_engine_gate(gpu);
  ppo.seed = lm.seed;
  ppo.distributed = dist;
  CA_CHECK(fs::exists(actor_weights), "--resume: the checkpoint's actor folder {} is missing", actor_weights.string());
  std::unique_ptr<lm::PpoLearner> learner = lm::create_ppo_learner(actor_weights, lm, ppo);
  if (!learner_state.empty()) learner->load_state(learner_state);  // the optimizer continues where it was
  if (listed != split.tasks.size())
    log << fmt::format("[train] {} of {} tasks in {} are flagged degenerate and left out\n", listed - split.tasks.size(),
                       listed, split.name);
  log << fmt::format("[train] actor {} on {} ({}), critic {}; {} tasks in {}{}\n", actor_weights.string(), lm.device,
                     lm.dtype, ppo.critic, split.tasks.size(), split.name,
                     dist.distributed() ? fmt::format("; process {} of {}", dist.rank, dist.world_size) : "");
  if (writer) save_resolved_config(config, run_dir);
  // Before any episode's commands run beside another's scoring (sandbox.confine auto): the
  // episodes are scored with scoring_options(), whose confine is the default.
  const std::string confinement =
      sandbox::settle_confinement(sandbox::SandboxOptions{}, options.device, gpu, /*gpu_lock=*/true);
  if (!confinement.empty()) log << "[train] " << confinement << "\n";

  const size_t task_count = split.tasks.size();
  RunContext ctx{cfg, options, log, run_dir, actor, std::move(split),
                 TaskCursor(task_count, cfg.run.seed), learner.get(),
                 MetricsLog(run_dir / "metrics.jsonl")};
  if (!cursor_state.is_null()) ctx.cursor.restore(cursor_state);
  ctx.rank = dist.rank;
  ctx.world = dist.world_size;
  ctx.gpu = gpu;
  ctx.chat = serve::ChatSession::open_with_model(actor, learner->policy());

  TrainRunSummary summary;
  summary.run_dir = run_dir;
  const int every = cfg.checkpoint.every_steps;
  if (first_stage == stages.size()) log << "[train] no enabled stage comes after the checkpoint: nothing to run\n";
  for (size_t si = first_stage; si < stages.size(); ++si) {
    const Stage& stage = stages[si];
    const int start = si == first_stage ? first_step_in_stage : 0;
    if (start >= stage.steps) {
      log << fmt::format("[train] stage {}: all {} steps done\n", stage.name, stage.steps);
      continue;
    }
    // Value pretraining samples only when there are no RFT trajectories to reuse.
    const bool samples = stage.kind != StageKind::kValuePretrain;
    log << fmt::format("[train] stage {}: steps {}..{} of {}{}\n", stage.name, start + 1, stage.steps, stage.steps,
                       samples && stage.single_turn ? " (single-turn)" : "");
    for (int k = start + 1; k <= stage.steps; ++k) {
      throw_if_stop_requested(fmt::format("before step {}", step + 1));
      ++step;
      if (summary.first_step == 0) summary.first_step = step;
      const json record = run_stage_step(ctx, stage, step, k);
      if (writer) {
        ctx.metrics.append(record);
        write_training_plots(MetricsLog::read(ctx.metrics.path()), run_dir / "plots");
      }
      log << step_summary(stage, k, record);
      ++summary.steps_run;
      if ((every > 0 && step % every == 0) || k == stage.steps) checkpoint(ctx, stage, step, k);
    }
  }
  summary.last_step = step;
  log << fmt::format("[train] done: {} steps run, last step {}\n", summary.steps_run, step);
  return summary;
}

uint64_t episode_gpu_share(uint64_t gpu_bytes, int concurrent, int processes) {
  return gpu_bytes /
         (static_cast<uint64_t>(std::max(processes, 1)) * static_cast<uint64_t>(std::max(concurrent, 1) + 1));
}

}  // namespace cuda_agent::rl
