// PpoOptions from the training config's "ppo" section (torch-free; the learner is in the module).
#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/ppo_learner.h"

namespace cuda_agent::lm {
namespace {

// Sets `out` from section[key] when present; a wrong type names the dotted key.
template <typename T>
void read_key(const nlohmann::json& section, const char* key, const char* dotted, T& out) {
  if (!section.contains(key)) return;
  try {
    out = section.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    CA_FAIL("ppo.{} = {}: wrong type ({})", dotted, section.at(key).dump(), e.what());
  }
}

}  // namespace

PpoOptions PpoOptions::from_config(const nlohmann::json& ppo) {
  CA_CHECK(ppo.is_object(), "the ppo section must be a mapping, got {}", ppo.dump());
  PpoOptions o;
  read_key(ppo, "actor_lr", "actor_lr", o.actor_lr);
  read_key(ppo, "critic_lr", "critic_lr", o.critic_lr);
  read_key(ppo, "clip_low", "clip_low", o.clip_low);
  read_key(ppo, "clip_high", "clip_high", o.clip_high);
  read_key(ppo, "value_clip", "value_clip", o.value_clip);
  read_key(ppo, "entropy_coef", "entropy_coef", o.entropy_coef);
  read_key(ppo, "loss_aggregation", "loss_aggregation", o.loss_aggregation);
  read_key(ppo, "grad_clip", "grad_clip", o.grad_clip);
  read_key(ppo, "mini_batches", "mini_batches", o.mini_batches);
  read_key(ppo, "epochs", "epochs", o.epochs);
  read_key(ppo, "shard_optimizer_state", "shard_optimizer_state", o.shard_optimizer_state);
  read_key(ppo, "activation_checkpointing", "activation_checkpointing", o.activation_checkpointing);
  read_key(ppo, "micro_batch_tokens", "micro_batch_tokens", o.micro_batch_tokens);
  if (ppo.contains("kl")) {
    const auto& kl = ppo.at("kl");
    CA_CHECK(kl.is_object(), "ppo.kl must be a mapping, got {}", kl.dump());
    read_key(kl, "coef", "kl.coef", o.kl_coef);
    read_key(kl, "estimator", "kl.estimator", o.kl_estimator);
    read_key(kl, "mode", "kl.mode", o.kl_mode);
  }
  return o;
}

LossAggregation parse_loss_aggregation(const std::string& name) {
  if (name == "token_mean") return LossAggregation::kTokenMean;
  if (name == "seq_mean_token_sum") return LossAggregation::kSeqMeanTokenSum;
  if (name == "seq_mean_token_mean") return LossAggregation::kSeqMeanTokenMean;
  CA_FAIL(
      "unknown loss aggregation '{}' (ppo.loss_aggregation): use token_mean, seq_mean_token_sum or "
      "seq_mean_token_mean",
      name);
}

KlEstimator parse_kl_estimator(const std::string& name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k2") return KlEstimator::kK2;
  if (name == "k3") return KlEstimator::kK3;
  CA_FAIL("unknown KL estimator '{}' (ppo.kl.estimator): use k1, k2 or k3", name);
}

}  // namespace cuda_agent::lm
