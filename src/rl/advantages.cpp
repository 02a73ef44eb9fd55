#include "cuda_agent/rl/advantages.h"

#include <algorithm>
#include <cmath>

#include "cuda_agent/core/error.h"

namespace cuda_agent::rl {
namespace {

void check_mask_value(float m, size_t i) {
  CA_CHECK(m == 0.0f || m == 1.0f, "mask[{}] = {}: a mask holds only 0 and 1", i, m);
}

void check_same_length(size_t a, size_t b, const char* what_a, const char* what_b) {
  CA_CHECK(a == b, "{} has {} elements but {} has {}", what_a, a, what_b, b);
}

// Checks that every row of `other` has the length of the matching row of `masks`.
void check_batch_shape(const TokenBatch& other, const TokenBatch& masks, const char* what) {
  CA_CHECK(other.size() == masks.size(), "{} has {} sequences but the masks have {}", what, other.size(), masks.size());
  for (size_t i = 0; i < masks.size(); ++i) {
    CA_CHECK(other[i].size() == masks[i].size(), "{} sequence {} has {} tokens but its mask has {}", what, i,
             other[i].size(), masks[i].size());
    for (size_t t = 0; t < masks[i].size(); ++t) check_mask_value(masks[i][t], t);
  }
}

}  // namespace

GaeResult compute_gae(std::span<const float> rewards, std::span<const float> values, std::span<const float> mask,
                      double gamma, double lambda) {
  check_same_length(rewards.size(), mask.size(), "rewards", "mask");
  check_same_length(values.size(), mask.size(), "values", "mask");
  CA_CHECK(gamma >= 0 && gamma <= 1, "gamma = {} is out of range: allowed [0, 1]", gamma);
  CA_CHECK(lambda >= 0 && lambda <= 1, "lambda = {} is out of range: allowed [0, 1]", lambda);
  const size_t n = mask.size();
  GaeResult out{std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};

  // Walk backwards, folding masked rewards into a running sum that the next policy token
  // (going backwards: the preceding one) takes as its own.
  double pending_reward = 0;  // rewards of masked positions after the current policy token
  double next_value = 0;      // V_{k+1}; 0 after the last policy token
  double next_advantage = 0;  // A_{k+1}
  for (size_t t = n; t-- > 0;) {
    check_mask_value(mask[t], t);
    if (mask[t] == 0.0f) {
      pending_reward += rewards[t];
      continue;
    }
    const double reward = rewards[t] + pending_reward;
    pending_reward = 0;
    const double delta = reward + gamma * next_value - values[t];
    const double advantage = delta + gamma * lambda * next_advantage;
    out.advantages[t] = static_cast<float>(advantage);
    out.returns[t] = static_cast<float>(advantage + values[t]);
    next_value = values[t];
    next_advantage = advantage;
  }
  CA_CHECK(pending_reward == 0,
           "a reward of {} lies before the first policy token (mask 1): no token can receive it", pending_reward);
  return out;
}

void whiten_masked(TokenBatch& values, const TokenBatch& masks, bool keep_mean, double eps,
                   const SumAcross& sum_across) {
  check_batch_shape(values, masks, "values");
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t t = 0; t < values[i].size(); ++t)
      if (masks[i][t] != 0.0f) {
        sum += values[i][t];
        ++count;
      }
  if (sum_across) {
    const std::vector<double> g = sum_across({sum, static_cast<double>(count)});
    sum = g[0];
    count = static_cast<size_t>(g[1]);
  }
  CA_CHECK(count >= 2, "whitening needs at least 2 policy tokens (mask 1) in the batch, got {}", count);
  const double mean = sum / count;
  double squares = 0;
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t t = 0; t < values[i].size(); ++t)
      if (masks[i][t] != 0.0f) squares += (values[i][t] - mean) * (values[i][t] - mean);
  if (sum_across) squares = sum_across({squares})[0];
  const double inv_std = 1.0 / std::sqrt(squares / (count - 1) + eps);
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t t = 0; t < values[i].size(); ++t) {
      if (masks[i][t] == 0.0f) {
        values[i][t] = 0.0f;
        continue;
      }
      const double w = (values[i][t] - mean) * inv_std;
      values[i][t] = static_cast<float>(keep_mean ? w + mean : w);
    }
}

double kl_estimate(double logp, double logp_ref, KlEstimator estimator) {
  const double diff = logp - logp_ref;
  switch (estimator) {
    case KlEstimator::kK1:
      return diff;
    case KlEstimator::kK2:
      return 0.5 * diff * diff;
    case KlEstimator::kK3:
      // exp(-diff) + diff - 1, with expm1 for accuracy when the policies are close.
      return std::expm1(-diff) + diff;
  }
  CA_ASSERT(false, "unhandled KlEstimator {}", static_cast<int>(estimator));
}

void apply_kl_penalty(std::vector<float>& rewards, std::span<const float> logp, std::span<const float> logp_ref,
                      std::span<const float> mask, double coef, KlEstimator estimator) {
  check_same_length(rewards.size(), mask.size(), "rewards", "mask");
  check_same_length(logp.size(), mask.size(), "logp", "mask");
  check_same_length(logp_ref.size(), mask.size(), "logp_ref", "mask");
  for (size_t t = 0; t < mask.size(); ++t) {
    check_mask_value(mask[t], t);
    if (mask[t] == 0.0f) continue;
    rewards[t] = static_cast<float>(rewards[t] - coef * kl_estimate(logp[t], logp_ref[t], estimator));
  }
}

TokenLoss ppo_policy_token_loss(double logp, double old_logp, double advantage, double clip_low, double clip_high) {
  const double ratio = std::exp(logp - old_logp);
  const double unclipped = -advantage * ratio;
  const double clipped = -advantage * std::clamp(ratio, 1.0 - clip_low, 1.0 + clip_high);
  return {std::max(unclipped, clipped), clipped > unclipped};
}

TokenLoss ppo_value_token_loss(double value, double old_value, double ret, double value_clip) {
  const double v_clipped = old_value + std::clamp(value - old_value, -value_clip, value_clip);
  const double unclipped = (value - ret) * (value - ret);
  const double clipped = (v_clipped - ret) * (v_clipped - ret);
  return {0.5 * std::max(unclipped, clipped), clipped > unclipped};
}

double aggregate_loss(const TokenBatch& per_token, const TokenBatch& masks, LossAggregation mode) {
  check_batch_shape(per_token, masks, "per-token losses");
  double total = 0, tokens = 0, seq_total = 0;
  size_t sequences = 0;
  for (size_t i = 0; i < per_token.size(); ++i) {
    double sum = 0, count = 0;
    for (size_t t = 0; t < per_token[i].size(); ++t) {
      // Skipped, not multiplied by 0: a masked position may hold inf or NaN (prompt logits).
      if (masks[i][t] == 0.0f) continue;
      sum += per_token[i][t];
      count += 1;
    }
    if (count == 0) continue;
    total += sum;
    tokens += count;
    seq_total += mode == LossAggregation::kSeqMeanTokenMean ? sum / count : sum;
    ++sequences;
  }
  CA_CHECK(tokens > 0, "the batch has no policy tokens (mask 1): there is no loss to aggregate");
  return mode == LossAggregation::kTokenMean ? total / tokens : seq_total / sequences;
}

namespace {

template <typename TermFn>
LossStats batch_loss(const TokenBatch& masks, LossAggregation mode, TermFn term) {
  TokenBatch losses(masks.size()), clipped(masks.size());
  for (size_t i = 0; i < masks.size(); ++i) {
    losses[i].resize(masks[i].size());
    clipped[i].resize(masks[i].size());
    for (size_t t = 0; t < masks[i].size(); ++t) {
      if (masks[i][t] == 0.0f) continue;
      const TokenLoss l = term(i, t);
      losses[i][t] = static_cast<float>(l.loss);
      clipped[i][t] = l.clipped ? 1.0f : 0.0f;
    }
  }
  return {aggregate_loss(losses, masks, mode), aggregate_loss(clipped, masks, LossAggregation::kTokenMean)};
}

}  // namespace

LossStats ppo_policy_loss(const TokenBatch& logp, const TokenBatch& old_logp, const TokenBatch& advantages,
                          const TokenBatch& masks, double clip_low, double clip_high, LossAggregation mode) {
  check_batch_shape(logp, masks, "logp");
  check_batch_shape(old_logp, masks, "old_logp");
  check_batch_shape(advantages, masks, "advantages");
  CA_CHECK(clip_low > 0 && clip_low < 1, "clip_low = {} is out of range: allowed (0, 1)", clip_low);
  CA_CHECK(clip_high > 0, "clip_high = {} is out of range: allowed (0, inf)", clip_high);
  return batch_loss(masks, mode, [&](size_t i, size_t t) {
    return ppo_policy_token_loss(logp[i][t], old_logp[i][t], advantages[i][t], clip_low, clip_high);
  });
}

LossStats ppo_value_loss(const TokenBatch& values, const TokenBatch& old_values, const TokenBatch& returns,
                         const TokenBatch& masks, double value_clip, LossAggregation mode) {
  check_batch_shape(values, masks, "values");
  check_batch_shape(old_values, masks, "old_values");
  check_batch_shape(returns, masks, "returns");
  CA_CHECK(value_clip > 0, "value_clip = {} is out of range: allowed (0, inf)", value_clip);
  return batch_loss(masks, mode, [&](size_t i, size_t t) {
    return ppo_value_token_loss(values[i][t], old_values[i][t], returns[i][t], value_clip);
  });
}

}  // namespace cuda_agent::rl
