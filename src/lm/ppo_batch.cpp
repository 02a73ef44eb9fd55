#include "torch_fmt.h"  // first: see there
#include "ppo_batch.h"

#include <algorithm>

#include "cuda_agent/core/error.h"
#include "generation.h"

namespace cuda_agent::lm {

const char* label(Use use) {
  switch (use) {
    case Use::kPpo: return "PPO";
    case Use::kSft: return "SFT";
    case Use::kValue: return "value";
  }
  return "?";
}

void check_sample(const lm::PpoSample& s, size_t i, const policy::ModelConfig& config, Use use) {
  const char* name = label(use);
  CA_CHECK(!s.tokens.empty(), "{} sample {} has no tokens", name, i);
  check_tokens(config, s.tokens, fmt::format("{} sample {}", name, i));
  const size_t n = s.tokens.size();
  auto same_length = [&](size_t got, const char* what) {
    CA_CHECK(got == n, "{} sample {}: {} has {} entries for {} tokens (one per position)", name, i, what, got, n);
  };
  same_length(s.loss_mask.size(), "loss_mask");
  if (use == Use::kPpo) {
    same_length(s.old_logprobs.size(), "old_logprobs");
    same_length(s.advantages.size(), "advantages");
    if (!s.ref_logprobs.empty()) same_length(s.ref_logprobs.size(), "ref_logprobs");
  }
  if (use != Use::kSft) {
    same_length(s.returns.size(), "returns");
    same_length(s.old_values.size(), "old_values");
  }
  for (size_t t = 0; t < n; ++t)
    CA_CHECK(s.loss_mask[t] <= 1, "{} sample {}: loss_mask[{}] = {}: a mask holds only 0 and 1", name, i, t,
             s.loss_mask[t]);
  CA_CHECK(s.loss_mask[0] == 0, "{} sample {}: loss_mask[0] is 1, but position 0 has no prediction; mask it out",
           name, i);
}

Padded pad(const std::vector<const lm::PpoSample*>& samples, const torch::Device& device, Use use) {
  const int64_t batch = static_cast<int64_t>(samples.size());
  int64_t len = 0;
  for (const auto* s : samples) len = std::max<int64_t>(len, static_cast<int64_t>(s->tokens.size()));
  const bool policy = use == Use::kPpo, values = use != Use::kSft;
  const bool ref = policy && !samples.front()->ref_logprobs.empty();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  Padded p;
  p.ids = torch::zeros({batch, len}, torch::kInt64);
  p.mask = torch::zeros({batch, len}, torch::kBool);
  if (policy) p.old_logprobs = torch::zeros({batch, len}, f32);
  if (policy) p.advantages = torch::zeros({batch, len}, f32);
  if (values) p.returns = torch::zeros({batch, len}, f32);
  if (values) p.old_values = torch::zeros({batch, len}, f32);
  if (ref) p.ref_logprobs = torch::zeros({batch, len}, f32);
  for (int64_t i = 0; i < batch; ++i) {
    const lm::PpoSample& s = *samples[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    auto row = [&](torch::Tensor& dst, const auto& src, torch::ScalarType type) {
      if (!dst.defined()) return;
      dst[i].narrow(0, 0, n).copy_(torch::from_blob(const_cast<void*>(static_cast<const void*>(src.data())), {n}, type));
    };
    row(p.ids, s.tokens, torch::kInt64);
    row(p.mask, s.loss_mask, torch::kUInt8);
    row(p.old_logprobs, s.old_logprobs, torch::kFloat32);
    row(p.advantages, s.advantages, torch::kFloat32);
    row(p.returns, s.returns, torch::kFloat32);
    row(p.old_values, s.old_values, torch::kFloat32);
    row(p.ref_logprobs, s.ref_logprobs, torch::kFloat32);
  }
  p.tokens = p.mask.sum().item<int64_t>();
  for (auto* t : {&p.ids, &p.mask, &p.old_logprobs, &p.advantages, &p.returns, &p.old_values, &p.ref_logprobs})
    if (t->defined()) *t = t->to(device);
  return p;
}

torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& mask, lm::LossAggregation mode) {
  auto sums = torch::where(mask, per_token, torch::zeros_like(per_token)).sum(1);
  auto counts = mask.sum(1).to(torch::kFloat32);
  if (mode == lm::LossAggregation::kTokenMean) return sums.sum() / counts.sum();
  auto sequences = (counts > 0).sum().to(torch::kFloat32);
  if (mode == lm::LossAggregation::kSeqMeanTokenSum) return sums.sum() / sequences;
  return (sums / counts.clamp_min(1)).sum() / sequences;
}

double token_fraction(const torch::Tensor& flag, const torch::Tensor& mask, int64_t tokens) {
  return (flag & mask).sum().item<double>() / static_cast<double>(tokens);
}

}  // namespace cuda_agent::lm
