// `cuda-agent ablate`: the base recipe and each ablation config trained at the same scale with
// the same seeds, then one comparison (issue 18; the paper's ablation table, at toy scale).
//
// Variants: "base" is the base config (e.g. configs/learning.yaml); each *.yaml of the ablations
// folder (configs/ablations/) is one more, named by its file stem, made as defaults <- base <-
// the ablation file without its `model` and `run` sections (they name a placeholder actor and an
// output folder of the paper's scale) <- each --set. Every variant writes its run to
// output/<name>/ with the base's run.seed. A run that throws is recorded as failed (its error in
// the comparison) and the next one goes on; a stop request (SIGINT, SIGTERM) ends the whole
// command. Running the command again continues each variant from its latest checkpoint (the
// runs are resumed), so an interrupted comparison is not redone from the start.
//
// `only` trains some variants and reads the others as they are: their folders' metrics.jsonl
// from an earlier call, on this machine or carried from another (their checkpoints are not
// needed). So a comparison too long for one sitting is made in parts: say the variants that share
// the base's warm-up in one call, the others in the next, into the same output folder.
//
// The comparison (output/comparison.md and comparison.json, output/plots/*.svg): per variant its
// PPO steps' mean reward, pass rate, faster-than-compile rate and response length, first and
// last, and the collapse flags of summarize_variant; the charts draw each of those four per PPO
// step (x: the step within the stage, so variants whose earlier stages differ line up).
//
// `parallel` > 1 trains that many variants at once, each in a process of its own (this binary's
// `ablate --variants NAME`, its log in output/logs/NAME.log), once this process has run the
// stages they share: on one GPU their generation, learners and tool calls overlap, while the
// sandbox's GPU lock keeps each evaluation's timing to itself. The variants' numbers are those
// of one at a time (same seeds, same stages).
//
// Not thread-safe (runs one training at a time in this process; parallel variants in others).
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/rl/trainer.h"

namespace cuda_agent::rl {

struct AblationOptions {
  std::filesystem::path base_config;      // the recipe at the scale to compare
  std::filesystem::path ablations_dir;    // each *.yaml in it is one variant
  std::filesystem::path output_dir;       // <variant>/ runs, comparison.md, comparison.json, plots/
  std::vector<std::string> set_overrides; // "a.b=value", applied to every variant
  std::vector<std::string> only;          // train these variants alone (empty: all); the others' runs are read
  TrainRunOptions train;                  // device, gpu, skill file (resume is always on)
  int parallel = 1;                       // variants trained at once, each in a process of its own
  bool write_comparison = true;           // false: train only (a variant's process in a parallel call)
};

struct AblationVariant {
  std::string name;                  // "base" or the ablation file's stem
  std::filesystem::path config_file; // the base config or the ablation file
  nlohmann::json config;             // the resolved config it trained with
  bool ok = false;
  std::string error;                 // why the run failed (when !ok)
  nlohmann::json summary;            // summarize_variant of its metrics
};

// The variants' resolved configs, every one validated before any trains (so a typo in the
// fifth file does not surface an hour in). Throws Error naming the file and key of the first
// bad one, a missing base config or ablations folder, or a name in options.only that is no
// variant (listing the variants).
std::vector<AblationVariant> ablation_variants(const AblationOptions& options);

// Whether `variant` can start from the base's first stages, `level` "sft" (the supervised
// warm-up) or "rft" (the warm-up and RFT): both run those stages, and the configs of those
// stages differ only in what a run resumed from their checkpoint may change
// (resume_may_change: which later stages run, how long; after the warm-up alone, the reward when
// stages.sft.keep_reward_above <= 0). Throws Error on another level.
bool shares_prefix(const nlohmann::json& base, const nlohmann::json& variant, const std::string& level);
bool shares_sft_prefix(const nlohmann::json& base, const nlohmann::json& variant);  // level "sft"

// Trains every variant in turn (those of options.only, when given) and writes the comparison of
// all of them; a variant not trained in this call counts as ok when its folder has metrics (what
// an earlier call wrote).
// Progress goes to `log`. Stages that several variants trained in this call share run once:
// the supervised warm-up into OUTPUT/.sft-prefix/ (with configs/learning.yaml: the base, no_rft,
// no_value_pretraining, raw_speedup_reward), the warm-up and RFT into OUTPUT/.rft-prefix/ (the
// base, no_value_pretraining), started from a copy of the first; each variant starts from a copy
// of the deepest prefix it shares with another, or with an earlier call (a prefix folder that
// holds a checkpoint is used by every variant that shares it). With options.parallel > 1 the
// prefixes run here first, then the variants in processes of their own, up to `parallel` at
// once; a stop request stops them (they stop as a train run does, at a safe point).
std::vector<AblationVariant> run_ablations(const AblationOptions& options, std::ostream& log);

// A variant's numbers from its metrics records (metrics.jsonl, in order): the records of stage
// "ppo" (or, without any, of "warmup") in step order give ppo_steps, reward_first/last/best,
// pass_rate_last, faster_than_compile_rate_last (when the reward is milestone),
// response_length_first/last, and per-step lists (reward, pass_rate, faster_than_compile_rate,
// response_length, each [step_in_stage, value]). collapse lists what looks like a collapse, as
// the paper saw without RFT or value pretraining:
//   "reward_falling"   the mean reward of the last quarter of the steps (at least one) is more
//                      than 0.25 below that of the first quarter
//   "length_blowup"    the last step's mean response length is more than twice the first's and
//                      more than 64 tokens longer
// Needs two steps to judge; with fewer, collapse is empty. Also "updated_steps" (the steps that
// took an update: a step whose episodes were all masked takes none) and "episodes_masked" (the
// steps' episodes_task_fault: their task could not be evaluated). Pure.
nlohmann::json summarize_variant(const std::vector<nlohmann::json>& records);

// The comparison as Markdown: a table of the variants (failed ones with their error) and what
// the columns mean.
std::string ablation_markdown(const std::vector<AblationVariant>& variants);

}  // namespace cuda_agent::rl
