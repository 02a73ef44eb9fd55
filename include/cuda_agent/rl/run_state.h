// What a training run keeps on disk besides the model weights: the per-step metrics (JSONL and
// plots), the order in which tasks are drawn (a resumable cursor), and checkpoints (a folder per
// step, written whole or not at all, with a pointer to the latest).
//
// Layout of a run folder:
//   config.resolved.yaml          (train_config.h)
//   metrics.jsonl                 one JSON object per step
//   plots/*.svg                   reward, pass and faster-than-compile rates, KL, entropy, losses
//   checkpoints/step-000010/      state.json + whatever the trainer saves there (actor/, critic/,
//                                 optimizer/), moved into place by one rename
//   checkpoints/latest            the name of the newest complete checkpoint folder
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::rl {

// Appends one line per record to a JSONL file, flushed per line, so a crash loses at most the
// line being written. Thread-compatible (one writer).
class MetricsLog {
 public:
  explicit MetricsLog(std::filesystem::path path);
  // Writes `record` (an object) as one line. Throws Error naming the file when it cannot.
  void append(const nlohmann::json& record);
  const std::filesystem::path& path() const { return path_; }

  // Every record of a metrics file, in order. A last line without its newline (a crash while it
  // was written) is ignored; any other malformed line is an Error naming the file and line.
  static std::vector<nlohmann::json> read(const std::filesystem::path& path);
  // Keeps the records whose "step" is at most `step` (the rest were written after the checkpoint
  // a resumed run starts from), rewriting the file atomically.
  static void truncate_after(const std::filesystem::path& path, int64_t step);

 private:
  std::filesystem::path path_;
};

// The training curves as SVG files in `dir`, one per metric found in the records (x = "step"):
// reward_mean, pass_rate and faster_than_compile_rate, kl, entropy, value_loss and policy_loss,
// clip_fraction, response_length_mean. Metrics absent from every record are skipped. Returns the
// files written.
std::vector<std::filesystem::path> write_training_plots(const std::vector<nlohmann::json>& records,
                                                        const std::filesystem::path& dir);

// Draws tasks in epochs: each epoch is a permutation of [0, n) from (seed, epoch); next(k) returns
// the next k indices, crossing into the next epoch as needed. Its state is three integers, so a
// resumed run draws exactly the batches the interrupted one would have.
class TaskCursor {
 public:
  TaskCursor(size_t tasks, uint64_t seed);
  std::vector<size_t> next(size_t count);
  nlohmann::json state() const;  // {"tasks", "seed", "epoch", "position"}
  // Throws Error when the state does not belong to a cursor over the same number of tasks.
  void restore(const nlohmann::json& state);

 private:
  void shuffle();
  size_t tasks_;
  uint64_t seed_;
  uint64_t epoch_ = 0;
  size_t position_ = 0;
  std::vector<size_t> order_;
};

struct CheckpointInfo {
  std::filesystem::path dir;  // checkpoints/step-NNNNNN
  int64_t step = 0;
  nlohmann::json state;  // state.json
};

// Writes a checkpoint for `step`: creates a temporary folder beside the final one, calls
// write_payload(folder) for the trainer's files, writes state.json (the given state plus "step"),
// renames the folder into place, then updates checkpoints/latest atomically and deletes all but
// the newest `keep_last` checkpoints (0 keeps all). A failure anywhere leaves the previous
// checkpoints and `latest` untouched and throws Error.
CheckpointInfo write_checkpoint(const std::filesystem::path& run_dir, int64_t step, const nlohmann::json& state,
                                const std::function<void(const std::filesystem::path&)>& write_payload,
                                int keep_last);

// The checkpoint `latest` names, or none (step -1) when the run has none. Throws Error when
// `latest` names a folder that is missing or has no readable state.json.
CheckpointInfo latest_checkpoint(const std::filesystem::path& run_dir);

// A checkpoint folder (one holding state.json) as it is, or a run folder's latest checkpoint.
// Throws Error naming the path when it is neither.
CheckpointInfo find_checkpoint(const std::filesystem::path& path);

// Writes into `to` (a checkpoint's actor/ folder, beside the saved weights) what makes it a
// model folder of its own: the tokenizer files beside a Hugging Face `actor` (tokenizer.json,
// tokenizer_config.json, chat_template.jinja, ...), or for a GGUF `actor` its tokenizer and chat
// template as tokenizer.json and tokenizer_config.json (policy::Tokenizer::save_hf).
void write_actor_tokenizer_files(const std::filesystem::path& actor, const std::filesystem::path& to);

// `cuda-agent eval --checkpoint`: the local policy spec (serve/local_policy.h) over the actor of
// the checkpoint find_checkpoint(path) names, sampling as the run's rollouts did (rollout.temperature,
// rollout.top_p, rollout.max_new_tokens, rollout.batch_engine and model.dtype of its saved config; float16 loads as
// bfloat16) on `device` (cpu, cuda, cuda:N). `overrides` ("key=value&...", the local policy's
// keys, e.g. "temperature=0") come last and win. Throws Error when the checkpoint has no actor/.
std::string checkpoint_policy_spec(const std::filesystem::path& path, const std::string& device,
                                   const std::string& overrides);

// The keys a resumed run may change: where it writes, how long each stage runs, which stages
// run (a stage before the checkpoint's is not run again), and how many episodes run at once
// (each episode's seed does not depend on it).
extern const std::vector<std::string> kResumeMayChange;

// What a run resumed from a checkpoint of `stage` (saved with `saved_config`) may change:
// kResumeMayChange, and after the supervised warm-up alone ("sft") the reward too when
// stages.sft.keep_reward_above <= 0: then the warm-up kept every correct demonstration under
// either reward kind (a correct solution's reward is positive under both), so nothing it did
// depends on the reward.
std::vector<std::string> resume_may_change(const nlohmann::json& saved_config, const std::string& stage);

// For --resume: the keys whose values differ between the run's saved config and the new one
// ("ppo.actor_lr: 3e-06 -> 1e-05"), ignoring the keys in `may_change` (dotted, e.g.
// "run.output_dir", "ppo.steps"). Empty when they agree.
std::vector<std::string> config_differences(const nlohmann::json& saved, const nlohmann::json& now,
                                            const std::vector<std::string>& may_change);

}  // namespace cuda_agent::rl
