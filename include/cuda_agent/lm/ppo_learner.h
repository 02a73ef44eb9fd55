// The PPO learner: the update step of the RL trainer, on the policy's language model, behind a
// torch-free interface (the libtorch side lives in the module libca_lm.so, like the model: see
// lm.h for how it is found and loaded).
//
// What it does with one batch of scored trajectories: epochs x mini_batches optimizer steps, each
// on a shuffled mini-batch (right-padded into one [B, T] forward), minimizing
//
//   policy_loss - entropy_coef * entropy + kl_coef * kl (kl_mode "loss" only) + value_loss
//
// with the per-token terms of src/rl/advantages.cpp (the reference the tests compare against):
//   policy  max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high)), ratio = exp(logp - old_logp)
//   value   0.5 * max((v - R)^2, (old_v + clamp(v - old_v, +-value_clip) - R)^2)
//   entropy the entropy of the full predictive distribution at the token
//   kl      rl::kl_estimate(logp, ref_logp, kl_estimator)
// each aggregated over the mini-batch's policy tokens (loss_mask 1) with loss_aggregation
// (rl::aggregate_loss: token_mean, seq_mean_token_sum, seq_mean_token_mean).
//
// The critic (PpoOptions::critic) is one of:
//   shared      the value head (Linear(hidden, 1)) on the actor's own trunk; the value loss
//               back-propagates into the shared trunk too. The actor is built with
//               LmOptions::value_head, which must be true.
//   from_actor  its own model (the paper's critic): the actor's config, device and dtype, every
//               weight copied from the actor's at creation, and a value head initialised from
//               LmOptions::seed (init_std). The actor is built without a value head.
//   a path      its own model loaded from a Hugging Face folder or .gguf (as load_language_model
//               reads them; the vocabulary size must equal the actor's), with the value head from
//               value_head.safetensors beside the weights when present (a critic saved by
//               save_state), else initialised from the seed. The actor has no value head.
// A separate critic (from_actor or a path) has no untied lm_head: it never needs logits, which
// saves vocab x hidden weights. The value loss trains the critic's whole model and nothing of the
// actor; the policy, entropy and KL terms train the actor only. update() back-propagates the
// actor's terms before the critic's forward, so only one model's activations are alive at a time.
// With a separate critic, policy().forward_for_training() yields no values (the actor has no value
// head): take old values for PPO samples from forward() instead, which works in every mode.
//
// One AdamW optimizer with two parameter groups, whatever the critic: "actor" (the actor's trunk
// and lm_head) at actor_lr and "critic" (the shared value head, or the separate critic's every
// parameter) at critic_lr; weight_decay applies to both. Gradients are clipped per group to a
// norm of grad_clip: grad_norm_actor is the actor group's norm (with the shared critic it holds
// the value loss's share of the trunk gradient; with a separate one it does not), grad_norm_critic
// the critic group's.
//
// The two earlier training stages step the same models through the same learner (issue 7):
// sft_update (stage 2, RFT: supervised fine-tuning of the actor on kept trajectories) and
// value_update (stage 3, value pretraining: the critic learns while the actor is frozen). All
// three share the one AdamW: a call gives gradients only to the parameters it trains, so the
// others keep their weights bit for bit (no weight decay either) and their optimizer moments;
// the moments of the trained group carry over from stage to stage.
//
// Checkpoints. A learner's state is the actor's weights plus what save_state writes; a
// checkpoint folder holds
//   actor/                  policy().save_hf(dir / "actor"), written by the caller (with the
//                           shared critic it carries the value head, value_head.safetensors)
//   critic/                 the separate critic (save_state): config.json, model.safetensors
//                           (no lm_head.weight for an untied config, so load_language_model does
//                           not take it as a language model; the critic path mode does) and
//                           value_head.safetensors; absent with the shared critic
//   optimizer.safetensors   (save_state) AdamW's exp_avg and exp_avg_sq per parameter, named
//                           "<actor|critic>/<parameter>/exp_avg(_sq)", in the model's dtype
//   learner_state.json      (save_state) format, critic mode, the mini-batch shuffle generator's
//                           state, and per group the parameters' names, shapes and AdamW steps
// To resume: create the learner on dir/actor with the same PpoOptions (critic mode included; a
// separate critic may come from from_actor, dir/critic or anywhere, since load_state overwrites
// its weights), then load_state(dir). The next update() then does what the saved learner's next
// update() would have done, bit for bit on the CPU in float32.
//
// Errors: every function and method throws cuda_agent::Error naming the bad value (a sample, a
// length, an option); failures inside libtorch become Error with their text.
//
// Thread safety: a PpoLearner is not thread-safe; use it from one thread. Between its calls,
// other threads may generate from policy() at once (LanguageModel's rule).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/lm/distributed.h"
#include "cuda_agent/lm/lm.h"

namespace cuda_agent::lm {

// The loss aggregations and KL estimators by name (ppo.loss_aggregation, ppo.kl.estimator), shared
// by the learner and the torch-free reference (rl/advantages.h, which defines them). The parsers
// throw Error naming the value and the allowed names.
enum class LossAggregation { kTokenMean, kSeqMeanTokenSum, kSeqMeanTokenMean };
LossAggregation parse_loss_aggregation(
    const std::string& name);  // token_mean | seq_mean_token_sum | seq_mean_token_mean
enum class KlEstimator { kK1, kK2, kK3 };
KlEstimator parse_kl_estimator(const std::string& name);  // k1 | k2 | k3

struct PpoOptions {
  double actor_lr = 3e-6;           // AdamW lr of the trunk and lm_head
  double critic_lr = 6e-6;          // AdamW lr of the value head
  double clip_low = 0.2;            // ratio clipped below at 1 - clip_low, in (0, 1)
  double clip_high = 0.28;          // ... and above at 1 + clip_high, > 0
  double value_clip = 0.2;          // new values within old +- value_clip in the clipped value loss, > 0
  double entropy_coef = 0;          // entropy bonus (subtracted from the loss)
  double kl_coef = 0;               // weight of the KL term when kl_mode is "loss"
  std::string kl_estimator = "k1";  // k1 | k2 | k3 (rl::kl_estimate)
  // reward | loss. "reward": the caller put the KL penalty into the rewards (rl::apply_kl_penalty)
  // and the learner adds no term; "loss": the learner adds kl_coef * kl. The kl statistic is
  // reported in both modes whenever the samples carry ref_logprobs.
  std::string kl_mode = "reward";
  std::string loss_aggregation = "token_mean";  // token_mean | seq_mean_token_sum | seq_mean_token_mean
  double grad_clip = 1.0;                       // per-group gradient-norm clip; 0 turns it off
  int mini_batches = 1;     // optimizer steps per epoch; the batch must hold at least this many samples
  int epochs = 1;           // passes over one batch
  double weight_decay = 0;  // AdamW's decoupled weight decay, both groups
  uint64_t seed = 0;        // the mini-batch shuffle (one generator per learner, advanced by each update)
  // shared | from_actor | the critic's weights (a path), as described at the top of this file.
  // This is model.critic of the training config (which defaults to from_actor); here the default
  // stays shared, one model in memory, as before the separate critic existed.
  std::string critic = "shared";
  // Data parallelism (policy/distributed.h): with world_size > 1 every process of the job holds
  // a replica and passes its own share of the batch to update(), sft_update() and value_update();
  // each optimizer step then uses the gradient of the loss over the union of the shares (the
  // aggregation's token or sequence counts summed over the processes, the gradients all-reduced),
  // so the replicas stay equal and N processes step as one would on the union. Every process
  // must make the same calls with the same epochs and mini_batches. The replicas start from rank
  // 0's weights (broadcast at creation). The default is a world of one.
  DistributedOptions distributed;
  // ZeRO stage 1, in a world of several: each process keeps the AdamW moments of its share of the
  // parameters only (shares balanced by element count) and steps those; after each step every
  // owner broadcasts its parameters' new values, so the replicas stay equal and the steps are
  // bit for bit those of an unsharded job. save_state gathers the moments on rank 0. Ignored in a
  // world of one.
  bool shard_optimizer_state = false;
  // Each decoder layer of the actor recomputed in backward instead of keeping its activations
  // (lm::TokenStatsOptions::checkpoint), in update, sft_update and value_update: the same
  // gradients up to float rounding for about one more forward, and long contexts fit (131,072
  // tokens of a 1.5B model in 29 GiB above the weights on an H200, against about 4.5 MiB a token
  // without: docs/benchmarks.md, section 6).
  bool activation_checkpointing = false;
  // Most padded tokens (samples x the longest) in one forward and backward of update(),
  // sft_update() and value_update(): each mini-batch is cut into runs of consecutive samples
  // that fit (a longer sample alone) and their gradients accumulated before the one optimizer
  // step, each run's loss weighted by its share of the mini-batch's tokens (or sequences), so
  // the step equals the whole mini-batch's up to float rounding (veRL's ppo_max_token_len_per_gpu).
  // 0: the whole mini-batch in one forward.
  int64_t micro_batch_tokens = 0;
  // The rollout's sampling temperature (rollout.temperature; the trainer sets it). At 1 the
  // samples' recorded old_logprobs are used as given. Otherwise the rollout drew each token from
  // softmax(logits / temperature), which is the policy PPO's ratio must compare before and after
  // the step: the log-probs and entropies of update() and evaluate() are taken at that
  // temperature, and old_logprobs are computed again from the weights at the call's start, at
  // that temperature, in place of the recorded ones (the sampler records the untempered
  // policy's), as veRL's actor does (logits / temperature in compute_log_prob and in the update).
  // ref_logprobs, when given, must be at the same temperature. SFT and value updates ignore it.
  double temperature = 1.0;

  // From the "ppo" section of the training config (rl::train_config_defaults()["ppo"]): actor_lr,
  // critic_lr, clip_low, clip_high, value_clip, entropy_coef, kl.coef, kl.estimator, kl.mode,
  // loss_aggregation, grad_clip, mini_batches, epochs, shard_optimizer_state, activation_checkpointing,
  // micro_batch_tokens.
  // Keys it does not know (steps, gamma, ...)
  // are ignored; a missing key keeps its default; a wrong type is an Error naming "ppo.<key>".
  // weight_decay, seed, critic (model.critic) and temperature (rollout.temperature) are not in
  // that section and keep their defaults.
  static PpoOptions from_config(const nlohmann::json& ppo_section);
};

// One trajectory. Every vector is per position and has tokens.size() entries (ref_logprobs may
// be empty). Position t's log-prob is log p(tokens[t] | tokens[<t]) as in TrainForward, so
// loss_mask[0] must be 0 (no prediction). Values at positions with loss_mask 0 are ignored.
struct PpoSample {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> loss_mask;   // 1 = a policy token with a target (0 or 1 only)
  std::vector<float> old_logprobs;  // from the policy that sampled (Generation::logprobs or forward_for_training)
  std::vector<float> advantages;
  std::vector<float> returns;       // the critic's targets
  std::vector<float> old_values;    // the critic's values before the update (PpoLearner::forward)
  std::vector<float> ref_logprobs;  // the reference policy's; empty: no KL (all samples of a batch alike)
};

// The plan of one sft_update or value_update call: the stage's own learning rate and number of
// steps (stages.rft.* and stages.value_pretrain.* of the training config, not ppo.*). The
// learner's grad_clip and weight_decay apply.
struct StageUpdateOptions {
  double lr = 0;         // AdamW lr of the parameters the stage trains, >= 0
  int epochs = 1;        // passes over the batch
  int mini_batches = 1;  // optimizer steps per epoch; the batch must hold at least this many samples
};

// Per optimizer step, then averaged over the steps of update(). The losses are those of the
// mini-batch under the weights before its step (what its gradient was taken of).
struct PpoStats {
  double loss = 0;                 // the total objective minimized (see the top of this file)
  double first_loss = 0;           // `loss` of the call's first optimizer step, and of its last:
  double last_loss = 0;            // how far a supervised update fitted its batch
  double policy_loss = 0;          // clipped surrogate, aggregated per loss_aggregation
  double value_loss = 0;           // clipped value loss, aggregated per loss_aggregation
  double entropy = 0;              // token mean over policy tokens
  double kl = 0;                   // token mean of the kl_estimator over policy tokens; 0 without ref_logprobs
  double clip_fraction = 0;        // share of policy tokens whose surrogate is clipped (token mean)
  double value_clip_fraction = 0;  // share whose clipped value error is the larger one
  double grad_norm_actor = 0;      // before clipping; 0 from evaluate()
  double grad_norm_critic = 0;
  int64_t tokens = 0;    // policy tokens (loss_mask 1) of the batch, counted once
  int64_t forwards = 0;  // forward and backward passes of this process (micro-batches; 0 from evaluate())
  double seconds = 0;    // wall time of the call
};

class PpoLearner {
 public:
  virtual ~PpoLearner() = default;

  // epochs x mini_batches optimizer steps over `batch` (shuffled per epoch with the seeded
  // generator, split into mini_batches parts of near-equal sample counts); returns the mean of
  // the steps' statistics. Deterministic given the seed, the model and the sequence of calls.
  // Error (and no step) for a malformed sample, a mini-batch without policy tokens, or fewer
  // samples than mini_batches.
  virtual PpoStats update(const std::vector<PpoSample>& batch) = 0;

  // The statistics of `batch` as one mini-batch under the current weights, without gradient or
  // step (grad norms 0). With mini_batches = 1 this is what the first step of update() reports.
  // In a world of several it is this process's batch alone (no communication).
  virtual PpoStats evaluate(const std::vector<PpoSample>& batch) = 0;

  // Stage 2, RFT: stage.epochs x stage.mini_batches steps (seeded shuffle, as update()) on the
  // actor's parameters only (trunk and lm_head, at stage.lr); the value head does not move. The
  // loss of a mini-batch is the mean negative log-likelihood of its loss_mask-1 tokens, always
  // token_mean over the mini-batch (every assistant token weighs the same; loss_aggregation is
  // not used). Only tokens and loss_mask are read: the other vectors may be empty (ignored).
  // Returns loss = that NLL (before each step, averaged over the steps), entropy,
  // grad_norm_actor, tokens and seconds; the other fields are 0. Error (and no step) as update().
  virtual PpoStats sft_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) = 0;

  // Stage 3, value pretraining: stage.epochs x stage.mini_batches steps of the clipped value loss
  // alone (aggregated per loss_aggregation) with the actor frozen: the policy's logits are
  // unchanged bit for bit. With the shared critic only the value head moves (at stage.lr): the
  // trunk is the actor's, so it stays frozen too. A separate critic trains its whole model (trunk
  // and value head; the actor is not even run). Reads tokens, loss_mask, returns and old_values;
  // old_logprobs, advantages and ref_logprobs may be empty (ignored). Returns loss = value_loss,
  // value_clip_fraction, grad_norm_critic, tokens and seconds; the other fields are 0. Error (and
  // no step) as update().
  virtual PpoStats value_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) = 0;

  // The actor's log-probs and entropies and the critic's values of whole sequences, without
  // gradient, as LanguageModel::forward_for_training (same arguments, positions and masking; Error
  // naming the bad sequence or mask). Use this, not policy().forward_for_training(), for the old
  // values of PPO samples and value targets: with a separate critic the actor has no value head.
  virtual std::vector<TrainForward> forward(const std::vector<std::vector<int64_t>>& sequences,
                                            const std::vector<std::vector<uint8_t>>& loss_mask) = 0;

  // Writes the learner's state but the actor into `dir` (created if missing; see "Checkpoints" at
  // the top of this file): critic/ (separate critic only), optimizer.safetensors and
  // learner_state.json, each file replaced atomically (the folder as a whole is not: the caller
  // makes the checkpoint atomic). Error naming the file that cannot be written. In a world of
  // several only rank 0 writes (`dir` is unused elsewhere), and with shard_optimizer_state every
  // process must call it, since the moments are gathered on rank 0 first.
  virtual void save_state(const std::filesystem::path& dir) = 0;

  // Bytes of AdamW state (moments) this process holds.
  virtual int64_t optimizer_state_bytes() = 0;

  // Restores what save_state wrote: the separate critic's weights, the AdamW moments and steps of
  // every parameter (with shard_optimizer_state: of this process's share), and the shuffle
  // generator. The learner must have the same critic mode and
  // parameter lists (names, shapes) as the saved one. Everything is checked before anything
  // changes, so an Error (naming the file and the parameter or tensor: a missing file, another
  // critic mode, a parameter list or shape that differs) leaves the learner as it was.
  virtual void load_state(const std::filesystem::path& dir) = 0;

  // The actor, owned by the learner and valid while it lives: for generation, and for
  // forward_for_training's log-probs (its values exist with the shared critic only; see
  // forward()). The updates change it.
  virtual LanguageModel& policy() = 0;

  // A second copy of the actor, for rollouts sampled while the learner updates (the trainer's
  // rollout.off_policy_steps): each call sets its weights to the actor's current ones and returns
  // it. It has the actor's config, device, dtype and LmOptions (its own batch engine), no value
  // head, and costs the actor's weights again in memory (made at the first call). Valid while the
  // learner lives; updates do not change it. Not to be called while it generates.
  virtual LanguageModel& snapshot_policy() = 0;

  virtual const PpoOptions& options() const = 0;

  // The sum over the job's processes of each number (options().distributed): the trainer's
  // metrics and decisions that every process must take alike. A world of one returns `values`.
  // Every process must call it with as many numbers, in the same order as the other collectives.
  virtual std::vector<double> sum_over_processes(const std::vector<double>& values) = 0;
};

// A learner on a model loaded like load_language_model (Hugging Face folder or .gguf), or on a
// random model like random_language_model; the critic per ppo.critic. With the shared critic
// options.value_head must be true (the value head is the critic); with a separate one it is
// ignored (the actor gets no value head, the critic one). The actor keeps options' device, dtype
// and seed; the critic gets the same.
std::unique_ptr<PpoLearner> create_ppo_learner(const std::filesystem::path& model, const LmOptions& options,
                                               const PpoOptions& ppo);
std::unique_ptr<PpoLearner> create_random_ppo_learner(const policy::ModelConfig& config, const LmOptions& options,
                                                      const PpoOptions& ppo);

// --- the module boundary (src/policy/lm_loader.cpp and src/lm/module_entry.cpp) ---------------

struct PpoCreateRequest {
  int abi = kLmModuleAbi;
  LmCreateRequest model;  // what ca_lm_create would build (path or config, options)
  const PpoOptions* ppo = nullptr;
};

}  // namespace cuda_agent::lm

// Returns the new learner (owned by the caller, delete through the virtual destructor) or nullptr
// with *error set. Optional: a module built before the learner lacks it.
extern "C" cuda_agent::lm::PpoLearner* ca_lm_create_ppo_learner(const cuda_agent::lm::PpoCreateRequest* request,
                                                                std::string* error);
