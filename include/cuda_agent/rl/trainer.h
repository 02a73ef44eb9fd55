// `cuda-agent train`: the single-process trainer that runs the recipe's four stages end to end.
//
// The enabled stages run in the recipe's order, each on its own or chained by the config:
// stages.sft (a supervised warm-up on a teacher's episodes; off by default), stages.warmup
// (single-turn PPO), stages.rft, stages.value_pretrain, then ppo (agentic PPO).
//
// Teachers (stages.sft.teacher, stages.rft.teacher): a make_policy spec or reference:DIR (each
// task's reference solution played as an episode, agent/reference_policy.h). Their episodes run
// through the same tools and sandbox, teacher-forced in the actor's tokens (LocalPolicy's teacher
// constructor), into rollouts/sft/<task>-tE/ (SFT) or rollouts/rft-teacher/<task>-tE/ (RFT's mix:
// stages.rft.teacher_episodes_per_task a task beside the actor's own); they feed sft_update only.
// SFT (one global step): the teacher's episodes, filtered with stages.sft's keep_reward_above,
// drop_stop_reasons and max_invalid_tool_calls, fine-tune the actor (stages.sft.lr, .epochs,
// .batch_size). Metrics keys of a teacher's episodes carry the prefix "teacher_".
//
// A PPO step (warm-up and agentic PPO):
//   1. draws data.tasks_per_step tasks from the run's TaskCursor (run_state.h);
//   2. runs rollout.episodes_per_task agent episodes per task (agent::run_task_episode) with a
//      LocalPolicy over the learner's own model, each in run_dir/rollouts/step-NNNNNN/<task>-eE/,
//      sampled with a seed derived from (run.seed, step, task index, episode), so a rerun
//      samples the same episodes. The warm-up's episodes are single-turn (stages.warmup.single_turn)
//      with its context budget (stages.warmup.max_context_tokens); the other stages use rollout.*.
//      An episode that throws is counted (episodes_failed) and the step goes on; one whose
//      trajectory has no usable token records (e.g. the prompt did not fit) is counted
//      (episodes_unusable) and left out of the update;
//   3. turns the trajectories into PPO samples (rollout.h: episode_sequence, the critic's values,
//      ppo_samples with ppo.gamma / ppo.lambda / ppo.whiten_advantages) and runs
//      PpoLearner::update;
//   4. appends the step's metrics to run_dir/metrics.jsonl (step, stage, tasks, reward_mean,
//      pass_rate, faster_than_compile_rate, the learner's losses and statistics, token counts,
//      episode and update wall seconds) and rewrites run_dir/plots/*.svg;
//   5. writes a checkpoint (run_state.h: write_checkpoint) every checkpoint.every_steps steps and
//      at the end of each stage: payload actor/ is the policy saved with save_hf (the value head
//      included) plus the actor's tokenizer files; state.json holds {stage, step_in_stage, step,
//      cursor, config}.
//
// RFT (stage 2, one global step): episodes as above (rollout.*, seeds from the stage's step) for
// stages.rft.tasks tasks (0: every task of the split in split order, the cursor untouched; else
// the cursor's next ones) x rollout.episodes_per_task, into run_dir/rollouts/rft/<task>-eE/; the
// trajectory files go through filter_trajectories (rft_filter.h, stages.rft.*); the kept ones
// become samples with the loss on the policy's own tokens, and PpoLearner::sft_update fine-tunes
// the actor (stages.rft.lr and .epochs, ceil(kept / stages.rft.batch_size) mini-batches). When
// nothing usable is kept the update is skipped and the log and the metrics say why (drops by
// reason). One metrics line: stage "rft", kept, dropped, dropped_by_reason, loss (the NLL),
// entropy, grad_norm_actor, ...
//
// Value pretraining (stage 3, one global step): the critic learns with the actor frozen on every
// usable trajectory under run_dir/rollouts/rft/ (RFT's, kept or not), or, when there are none
// (RFT disabled, or its folder gone), on fresh ones sampled as RFT samples into
// run_dir/rollouts/value_pretrain/. Returns come once, from GAE (stages.value_pretrain.gamma /
// .lambda) over the critic's values before the stage; then stages.value_pretrain.steps
// PpoLearner::value_update steps at stages.value_pretrain.lr, in passes over the sequences of
// min(steps left, sequences) mini-batches each (the split seeded by run.seed and the step), the
// old values refreshed before each pass. One metrics line: stage "value_pretrain", value_loss,
// its first- and last-pass means, value_clip_fraction, grad_norm_critic, ...
//
// Steps are numbered globally across stages: SFT (when enabled) first, warm-up steps 1..W after it, RFT W+1, value pretraining the
// next, PPO the P after (a disabled stage takes none). Every stage ends with a checkpoint.
//
// The critic is model.critic (PpoOptions::critic: from_actor, shared or a path); the critic's
// values always come from PpoLearner::forward. A checkpoint holds actor/ (policy().save_hf plus
// the tokenizer files) and what PpoLearner::save_state writes (critic/ when separate, the AdamW
// moments and steps, the shuffle generator), so a resumed run's next step equals the
// uninterrupted run's bit for bit on the CPU in float32.
//
// Resume (options.resume): reads checkpoints/latest, requires the new config to equal the saved
// one except run.output_dir, the stages' step counts (ppo.steps, stages.warmup.steps,
// stages.value_pretrain.steps) and which stages are enabled; loads the actor from the checkpoint
// and the learner's state (PpoLearner::load_state), restores the cursor, truncates metrics.jsonl after the checkpoint's step,
// removes the rollout folders written after it (later steps, and rollouts/rft and
// rollouts/value_pretrain of a stage after the checkpoint's), and continues: within the
// checkpoint's stage when this config runs it, else with the first enabled stage after it in the
// recipe's order (enabled stages before it are not run again). RFT and value pretraining are
// checkpointed only at their end, so one that was interrupted is redone from its start.
//
// Data parallelism: started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
// policy/distributed.h), each process runs this same function on GPU LOCAL_RANK, samples the
// tasks at the positions i of each step's draw with i mod WORLD_SIZE = RANK, and passes its share
// to the learner, which steps on the union (PpoOptions::distributed). Update decisions and
// metrics use the job's numbers (PpoLearner::sum_over_processes); rank 0 alone writes
// config.resolved.yaml, metrics.jsonl, the plots and the checkpoints. docs/training.md has the
// details and what differs from one process.
//
// Errors: a bad config (validate_train_config), a missing model.actor or split, a fresh run into a
// folder that already holds one, or --resume without a checkpoint or with a changed config throw
// cuda_agent::Error naming the key or file. An episode that throws or leaves no usable token
// records is counted and left out; it does not end the run. Not thread-safe; one run per output
// folder.
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
  // Other processes use this GPU (another run, the variants of `ablate --parallel`): the episodes
  // take the GPU's locks even one at a time, and the learner's GPU work holds its quiet lock
  // (shared), so that no other process's evaluation times beside it.
  bool shared_gpu = false;
  // Training processes on this GPU, this one included (ablate --parallel's variants): the GPU
  // memory an episode's commands may hold outside evaluations is shared out among all of their
  // episodes (episode_gpu_share).
  int gpu_processes = 1;
};

// What one episode's commands may hold of a GPU of `gpu_bytes` outside evaluations while
// `processes` training processes each run `concurrent` episodes on it: an equal share, each
// process's own work (the learner, the decoder) counted as one more episode. 0 when gpu_bytes is.
uint64_t episode_gpu_share(uint64_t gpu_bytes, int concurrent, int processes);

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
