// The batch side of the PPO learner (src/lm/ppo_learner.cpp): checking samples, padding a
// mini-batch into tensors, and the masked aggregations of rl::aggregate_loss on tensors.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "cuda_agent/lm/ppo_learner.h"

namespace cuda_agent::lm {

// Which update a batch feeds: it decides the per-position vectors a sample must carry.
enum class Use { kPpo, kSft, kValue };

const char* label(Use use);  // "PPO", "SFT", "value"

// Error naming the sample, the vector and the lengths (or the token) when sample i is malformed
// for `use`.
void check_sample(const lm::PpoSample& s, size_t i, const policy::ModelConfig& config, Use use);

// One mini-batch, right-padded to [B, T] on the model's device; padding has mask false. Only the
// vectors its Use reads are filled; the others stay undefined.
struct Padded {
  torch::Tensor ids, mask, old_logprobs, advantages, returns, old_values, ref_logprobs;  // ref: undefined if absent
  int64_t tokens = 0;
};

Padded pad(const std::vector<const lm::PpoSample*>& samples, const torch::Device& device, Use use);

// rl::aggregate_loss on tensors: masked positions are selected away (they may hold inf or NaN),
// sequences without policy tokens do not count in the seq_ modes.
torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& mask, lm::LossAggregation mode);

// The share of policy tokens where `flag` holds (the reference's clip fractions).
double token_fraction(const torch::Tensor& flag, const torch::Tensor& mask, int64_t tokens);

}  // namespace cuda_agent::lm
