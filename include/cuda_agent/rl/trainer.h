// `cuda-agent train`: the single-process trainer that runs the recipe's PPO stages end to end.
//
// For each enabled stage in order (stages.warmup, then ppo; stages.rft and
// stages.value_pretrain are not implemented yet: when enabled they are logged as skipped, never
// faked), each step:
//   1. draws data.tasks_per_step tasks from the run's TaskCursor (run_state.h);
//   2. runs rollout.episodes_per_task agent episodes per task (agent::run_task_episode) with a
//      LocalPolicy over the learner's own model, each in run_dir/rollouts/step-NNNNNN/<task>-eE/,
//      sampled with a seed derived from (run.seed, step, task index, episode), so a rerun
//      samples the same episodes. The warm-up's episodes are single-turn (stages.warmup.single_turn)
//      with its context budget (stages.warmup.max_context_tokens); the agentic stage uses rollout.*.
//      An episode that throws is counted (episodes_failed) and the step goes on; one whose
//      trajectory has no usable token records (e.g. the prompt did not fit) is counted
//      (episodes_unusable) and left out of the update;
//   3. turns the trajectories into PPO samples (rollout.h: episode_sequence, the critic's values
//      from forward_for_training, ppo_samples with ppo.gamma / ppo.lambda / ppo.whiten_advantages)
//      and runs PpoLearner::update;
//   4. appends the step's metrics to run_dir/metrics.jsonl (step, stage, tasks, reward_mean,
//      pass_rate, faster_than_compile_rate, the learner's losses and statistics, token counts,
//      episode and update wall seconds) and rewrites run_dir/plots/*.svg;
//   5. writes a checkpoint (run_state.h: write_checkpoint) every checkpoint.every_steps steps and
//      at the end of each stage: payload actor/ is the policy saved with save_hf (the value head
//      included) plus the actor's tokenizer files; state.json holds {stage, step_in_stage, step,
//      cursor, config}.
// Steps are numbered globally across stages (warm-up steps 1..W, PPO steps W+1..W+P).
//
// v1 limits, stated in the log: the critic is the value head on the actor's trunk (model.critic
// other than "shared" is not honoured yet); the AdamW moments are not checkpointed, so a resumed
// run restarts them from zero.
//
// Resume (options.resume): reads checkpoints/latest, requires the new config to equal the saved
// one except run.output_dir and the stages' step counts (ppo.steps, stages.*.steps), loads the
// actor (and value head) from the checkpoint, restores the cursor, truncates metrics.jsonl after
// the checkpoint's step, removes rollout folders of later steps, and continues with the next step.
//
// Errors: a bad config (validate_train_config), a missing model.actor or split, a fresh run into a
// folder that already holds one, or --resume without a checkpoint or with a changed config throw
// cuda_agent::Error naming the key or file. Not thread-safe; one run per output folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::rl {

struct TrainRunOptions {
  bool resume = false;
  std::string device = "cuda";       // cuda | cpu: where the model runs and how episodes are scored
                                     // (cpu: verify-only scoring, docs/results.md)
  int gpu = 0;                       // the GPU of the model and the sandbox when device is cuda
  std::filesystem::path skill_file;  // SKILL.md for the agent's system prompt; empty: none
};

struct TrainRunSummary {
  std::filesystem::path run_dir;
  int64_t first_step = 0;  // the first step this call ran (0 when it ran none)
  int64_t last_step = 0;   // the run's last step after this call
  int64_t steps_run = 0;
};

// Runs (or resumes) the training run of `config` (a train config, validated here) and returns
// what it did. Progress goes to `log`, one line per event.
TrainRunSummary run_training(const nlohmann::json& config, const TrainRunOptions& options, std::ostream& log);

// The sampling seed of one episode: a mix of the run seed, the global step, the task's index in
// the split and the episode number (stable across versions: reruns sample the same episodes).
uint64_t episode_seed(uint64_t run_seed, int64_t step, size_t task_index, int episode);

}  // namespace cuda_agent::rl
