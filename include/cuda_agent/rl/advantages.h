// PPO numerics on plain vectors: GAE, masked whitening, KL estimators, the clipped policy and
// value losses, and loss aggregation.
//
// These are the reference implementations: scalar, no autograd, double arithmetic inside. The
// libtorch trainer computes the same quantities on tensors and its tests compare against these
// functions.
//
// Sequences are token sequences of one trajectory (prompt, policy replies, tool outputs). A
// mask marks the policy's tokens: 1 = a token the policy sampled (it gets an advantage, a
// return and a loss term), 0 = prompt or tool-output text (no target, no loss). Masks hold
// exactly 0 or 1; anything else is an Error. A batch is a list of sequences of any lengths.
//
// Every function is pure and thread-safe. Mismatched lengths are Errors naming both lengths.
#pragma once

#include <functional>

#include <span>
#include <string>
#include <vector>

#include "cuda_agent/lm/ppo_learner.h"

namespace cuda_agent::rl {

using TokenBatch = std::vector<std::vector<float>>;  // one row per sequence, ragged

// ---- GAE -------------------------------------------------------------------------------------
//
// Generalized advantage estimation over one sequence, computed as if the masked tokens were
// removed. Let p_1 < ... < p_K be the positions with mask 1. Then
//
//   r'_k   = rewards[p_k] + the rewards of the masked positions after p_k and before p_{k+1}
//            (after p_K: up to the end), i.e. a reward on a tool-output token belongs to the
//            policy token that precedes it;
//   V_k    = values[p_k]        (values at masked positions are ignored)
//   V_{K+1}= 0                  (the episode ends after the sequence: no bootstrap)
//   delta_k = r'_k + gamma * V_{k+1} - V_k
//   A_k     = delta_k + gamma * lambda * A_{k+1},   A_{K+1} = 0
//   R_k     = A_k + V_k         (the critic's target)
//
// so gamma and lambda discount once per policy token, never per masked token. advantages[p_k]
// = A_k and returns[p_k] = R_k; both are 0 at masked positions. A nonzero reward before the
// first policy token has no token to belong to: Error. gamma and lambda must lie in [0, 1].
struct GaeResult {
  std::vector<float> advantages;
  std::vector<float> returns;
};
GaeResult compute_gae(std::span<const float> rewards, std::span<const float> values, std::span<const float> mask,
                      double gamma, double lambda);

// ---- whitening ---------------------------------------------------------------------------------
//
// Normalizes `values` in place over every position with mask 1 in the whole batch:
//   mean = mean of the masked values, var = their unbiased variance (Bessel: / (n - 1)),
//   x <- (x - mean) / sqrt(var + eps), then + mean again when keep_mean is true.
// Masked positions (mask 0) are set to 0. Needs at least two mask-1 positions (Error otherwise).
//
// Data parallelism: with `sum_across` (the sum of numbers over the job's processes, e.g.
// PpoLearner::sum_over_processes), the mean and the variance are those of the union of every
// process's batch (each process whitens its own values with them); every process must call it,
// also one whose batch is empty. Without it, this batch alone.
using SumAcross = std::function<std::vector<double>(const std::vector<double>&)>;
void whiten_masked(TokenBatch& values, const TokenBatch& masks, bool keep_mean = false, double eps = 1e-8,
                   const SumAcross& sum_across = {});

// ---- KL to the reference policy ----------------------------------------------------------------
//
// Per-token estimates of KL(pi || pi_ref) from the log-probabilities of the sampled token:
//   k1 = logp - logp_ref
//   k2 = 0.5 * (logp - logp_ref)^2
//   k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1      (unbiased, never negative)
using lm::KlEstimator;         // defined with the learner (policy/ppo_learner.h)
using lm::parse_kl_estimator;  // "k1", "k2", "k3"; Error otherwise
double kl_estimate(double logp, double logp_ref, KlEstimator estimator);

// KL in "reward" mode: rewards[t] -= coef * kl_estimate(logp[t], logp_ref[t]) at every
// position with mask 1 of one sequence; masked positions are untouched.
void apply_kl_penalty(std::vector<float>& rewards, std::span<const float> logp, std::span<const float> logp_ref,
                      std::span<const float> mask, double coef, KlEstimator estimator);

// ---- per-token losses ------------------------------------------------------------------------
//
// The clipped surrogate (to minimize) for one token, with separate clip bounds:
//   ratio = exp(logp - old_logp)
//   loss  = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
// `clipped` is true when the clamped term is strictly the larger one: the token's gradient is
// zero (for A > 0 above 1 + clip_high, for A < 0 below 1 - clip_low).
struct TokenLoss {
  double loss = 0;
  bool clipped = false;
};
TokenLoss ppo_policy_token_loss(double logp, double old_logp, double advantage, double clip_low, double clip_high);

// The clipped value loss for one token:
//   v_clipped = old_value + clamp(value - old_value, -value_clip, value_clip)
//   loss      = 0.5 * max((value - ret)^2, (v_clipped - ret)^2)
// `clipped` is true when the clipped error is strictly the larger one.
TokenLoss ppo_value_token_loss(double value, double old_value, double ret, double value_clip);

// ---- aggregation -------------------------------------------------------------------------------
//
// How per-token losses l[i][t] with mask m[i][t] become one number:
//   token_mean          sum_i sum_t l m / sum_i sum_t m    (every policy token of the batch weighs the same)
//   seq_mean_token_sum  mean over sequences of sum_t l m
//   seq_mean_token_mean mean over sequences of (sum_t l m / sum_t m)
// The two seq_ modes average over the sequences that hold at least one mask-1 token; a batch
// with no mask-1 token at all is an Error.
using lm::LossAggregation;         // defined with the learner (policy/ppo_learner.h)
using lm::parse_loss_aggregation;  // the names above; Error otherwise
double aggregate_loss(const TokenBatch& per_token, const TokenBatch& masks, LossAggregation mode);

// ---- batch losses ------------------------------------------------------------------------------
//
// The policy and value losses of a batch, aggregated with `mode`, and the clip fraction: the
// share of mask-1 tokens (token mean, whatever `mode` is) whose `clipped` flag is set.
struct LossStats {
  double loss = 0;
  double clip_fraction = 0;
};
LossStats ppo_policy_loss(const TokenBatch& logp, const TokenBatch& old_logp, const TokenBatch& advantages,
                          const TokenBatch& masks, double clip_low, double clip_high, LossAggregation mode);
LossStats ppo_value_loss(const TokenBatch& values, const TokenBatch& old_values, const TokenBatch& returns,
                         const TokenBatch& masks, double value_clip, LossAggregation mode);

}  // namespace cuda_agent::rl
