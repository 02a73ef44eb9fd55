// The PPO reference numerics (rl/advantages.h) against values worked out by hand below:
// GAE with a masked tool-output token, masked whitening, KL estimators, the clipped surrogate
// and value losses, and the three loss aggregations. Tolerance 1e-5 (results are float).
#include "cuda_agent/rl/advantages.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "../test_util.h"

namespace cuda_agent::rl {
namespace {

using cuda_agent::testing::error_message;

constexpr double kTol = 1e-5;

// Five tokens: policy, policy, a tool-output token (masked), policy, policy.
//   position  0    1    2(tool)  3    4
//   reward    0    0    0.5      0    1
//   value     0.5  0.6  9.0      0.7  0.8     (9.0 is ignored: masked)
// With the tool token removed the policy tokens are k = 1..4 at positions 0, 1, 3, 4, with
// r' = [0, 0 + 0.5, 0, 1] (the tool token's 0.5 belongs to position 1) and V = [.5, .6, .7, .8].
const std::vector<float> kRewards = {0, 0, 0.5f, 0, 1};
const std::vector<float> kValues = {0.5f, 0.6f, 9.0f, 0.7f, 0.8f};
const std::vector<float> kMask = {1, 1, 0, 1, 1};

TEST(Gae, MaskedToolTokenGammaOneLambda095) {
  // gamma 1, lambda 0.95 (gamma*lambda = 0.95):
  //   delta_4 = 1   + 0   - 0.8 = 0.2        A_4 = 0.2
  //   delta_3 = 0   + 0.8 - 0.7 = 0.1        A_3 = 0.1 + 0.95 * 0.2    = 0.29
  //   delta_2 = 0.5 + 0.7 - 0.6 = 0.6        A_2 = 0.6 + 0.95 * 0.29   = 0.8755
  //   delta_1 = 0   + 0.6 - 0.5 = 0.1        A_1 = 0.1 + 0.95 * 0.8755 = 0.931725
  //   returns = A + V: 1.431725, 1.4755, 0.99, 1.0
  GaeResult r = compute_gae(kRewards, kValues, kMask, 1.0, 0.95);
  const std::vector<double> adv = {0.931725, 0.8755, 0.0, 0.29, 0.2};
  const std::vector<double> ret = {1.431725, 1.4755, 0.0, 0.99, 1.0};
  ASSERT_EQ(r.advantages.size(), 5u);
  ASSERT_EQ(r.returns.size(), 5u);
  for (size_t t = 0; t < 5; ++t) {
    EXPECT_NEAR(r.advantages[t], adv[t], kTol) << "advantage at " << t;
    EXPECT_NEAR(r.returns[t], ret[t], kTol) << "return at " << t;
  }
}

TEST(Gae, MaskedToolTokenGamma09Lambda095) {
  // gamma 0.9, lambda 0.95 (gamma*lambda = 0.855):
  //   delta_4 = 1   + 0         - 0.8 = 0.2    A_4 = 0.2
  //   delta_3 = 0   + 0.9 * 0.8 - 0.7 = 0.02   A_3 = 0.02 + 0.855 * 0.2      = 0.191
  //   delta_2 = 0.5 + 0.9 * 0.7 - 0.6 = 0.53   A_2 = 0.53 + 0.855 * 0.191    = 0.693305
  //   delta_1 = 0   + 0.9 * 0.6 - 0.5 = 0.04   A_1 = 0.04 + 0.855 * 0.693305 = 0.632775775
  //   returns = A + V: 1.132775775, 1.293305, 0.891, 1.0
  GaeResult r = compute_gae(kRewards, kValues, kMask, 0.9, 0.95);
  const std::vector<double> adv = {0.632775775, 0.693305, 0.0, 0.191, 0.2};
  const std::vector<double> ret = {1.132775775, 1.293305, 0.0, 0.891, 1.0};
  for (size_t t = 0; t < 5; ++t) {
    EXPECT_NEAR(r.advantages[t], adv[t], kTol) << "advantage at " << t;
    EXPECT_NEAR(r.returns[t], ret[t], kTol) << "return at " << t;
  }
}

TEST(Gae, GammaAndLambdaOneGiveRewardToGo) {
  // lambda = gamma = 1: the values telescope away and the return is the sum of the rewards from
  // the token on: 1.5, 1.5, -, 1, 1.
  GaeResult r = compute_gae(kRewards, kValues, kMask, 1.0, 1.0);
  EXPECT_NEAR(r.returns[0], 1.5, kTol);
  EXPECT_NEAR(r.returns[1], 1.5, kTol);
  EXPECT_NEAR(r.returns[3], 1.0, kTol);
  EXPECT_NEAR(r.returns[4], 1.0, kTol);
  EXPECT_NEAR(r.advantages[0], 1.5 - 0.5, kTol);
}

TEST(Gae, SameAsWithTheMaskedTokensRemoved) {
  // The convention in one line: masking a token is removing it and giving its reward to the
  // policy token before it.
  GaeResult masked = compute_gae(kRewards, kValues, kMask, 0.9, 0.95);
  const std::vector<float> rewards = {0, 0.5f, 0, 1}, values = {0.5f, 0.6f, 0.7f, 0.8f}, mask = {1, 1, 1, 1};
  GaeResult removed = compute_gae(rewards, values, mask, 0.9, 0.95);
  const size_t kept[] = {0, 1, 3, 4};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_FLOAT_EQ(masked.advantages[kept[k]], removed.advantages[k]);
    EXPECT_FLOAT_EQ(masked.returns[kept[k]], removed.returns[k]);
  }
}

TEST(Gae, PromptTokensAndBadInput) {
  // Leading prompt tokens (mask 0, reward 0) get zeros and change nothing.
  GaeResult r = compute_gae(std::vector<float>{0, 0, 1}, std::vector<float>{3, 3, 0.25f}, std::vector<float>{0, 0, 1},
                            1.0, 0.95);
  EXPECT_FLOAT_EQ(r.advantages[0], 0.0f);
  EXPECT_FLOAT_EQ(r.returns[1], 0.0f);
  EXPECT_NEAR(r.advantages[2], 0.75, kTol);  // 1 - 0.25
  EXPECT_NEAR(r.returns[2], 1.0, kTol);

  std::string msg = error_message([] {
    compute_gae(std::vector<float>{0.5f, 0}, std::vector<float>{0, 0}, std::vector<float>{0, 1}, 1.0, 1.0);
  });
  EXPECT_NE(msg.find("before the first policy token"), std::string::npos) << msg;
  msg = error_message([] {
    compute_gae(std::vector<float>{0, 0}, std::vector<float>{0, 0}, std::vector<float>{1, 0.5f}, 1.0, 1.0);
  });
  EXPECT_NE(msg.find("mask[1] = 0.5"), std::string::npos) << msg;
  msg = error_message([] {
    compute_gae(std::vector<float>{0, 0, 0}, std::vector<float>{0, 0}, std::vector<float>{1, 1, 1}, 1.0, 1.0);
  });
  EXPECT_NE(msg.find("values has 2"), std::string::npos) << msg;
  msg = error_message([] { compute_gae(kRewards, kValues, kMask, 1.5, 0.95); });
  EXPECT_NE(msg.find("gamma = 1.5"), std::string::npos) << msg;
}

TEST(Whiten, MaskedMeanAndUnbiasedStd) {
  // Policy values 1, 2 | 3, 4 (the 100 is masked): mean 2.5; squared deviations
  // 2.25 + 0.25 + 0.25 + 2.25 = 5; unbiased variance 5 / 3; std = 1.2909944.
  // Whitened: -1.5 / std = -1.1618950, -0.5 / std = -0.3872983, then +0.3872983, +1.1618950.
  TokenBatch values = {{1, 2, 100}, {3, 4}};
  const TokenBatch masks = {{1, 1, 0}, {1, 1}};
  whiten_masked(values, masks);
  EXPECT_NEAR(values[0][0], -1.1618950, kTol);
  EXPECT_NEAR(values[0][1], -0.3872983, kTol);
  EXPECT_EQ(values[0][2], 0.0f);  // masked: zeroed
  EXPECT_NEAR(values[1][0], 0.3872983, kTol);
  EXPECT_NEAR(values[1][1], 1.1618950, kTol);

  // keep_mean adds the mean back: 1.3381050, 2.1127017, 2.8872983, 3.6618950.
  TokenBatch kept = {{1, 2, 100}, {3, 4}};
  whiten_masked(kept, masks, /*keep_mean=*/true);
  EXPECT_NEAR(kept[0][0], 1.3381050, kTol);
  EXPECT_NEAR(kept[0][1], 2.1127017, kTol);
  EXPECT_NEAR(kept[1][0], 2.8872983, kTol);
  EXPECT_NEAR(kept[1][1], 3.6618950, kTol);

  TokenBatch one = {{5, 6}};
  std::string msg = error_message([&] { whiten_masked(one, TokenBatch{{1, 0}}); });
  EXPECT_NE(msg.find("at least 2"), std::string::npos) << msg;
}

TEST(Whiten, AcrossProcessesUsesTheUnionsMeanAndVariance) {
  // Two "processes": this one holds {1, 2, masked 100}, the other {3, 4}. sum_across adds the
  // other's contribution to each call (sum and count, then squares around the mean 2.5), as the
  // job's all-reduce would: this process's values come out as in the hand-computed union above.
  TokenBatch mine = {{1, 2, 100}};
  const TokenBatch mine_mask = {{1, 1, 0}};
  int call = 0;
  whiten_masked(mine, mine_mask, false, 1e-8, [&](const std::vector<double>& v) {
    ++call;
    return call == 1 ? std::vector<double>{v[0] + 7.0, v[1] + 2.0}    // the other: 3 + 4, two tokens
                     : std::vector<double>{v[0] + 0.25 + 2.25};      // (3 - 2.5)^2 + (4 - 2.5)^2
  });
  EXPECT_EQ(call, 2);
  EXPECT_NEAR(mine[0][0], -1.1618950, kTol);
  EXPECT_NEAR(mine[0][1], -0.3872983, kTol);
  EXPECT_EQ(mine[0][2], 0.0f);
  // Alone, the same values whiten around their own mean (the hook is what makes the difference).
  TokenBatch alone = {{1, 2, 100}};
  whiten_masked(alone, mine_mask);
  EXPECT_NEAR(alone[0][0], -0.7071068, kTol);
  // A process with no policy token still takes part (the job has enough).
  TokenBatch empty;
  int calls = 0;
  whiten_masked(empty, TokenBatch{}, false, 1e-8, [&](const std::vector<double>& v) {
    ++calls;
    return calls == 1 ? std::vector<double>{v[0] + 3.0, v[1] + 2.0} : std::vector<double>{v[0] + 0.5};
  });
  EXPECT_EQ(calls, 2);
}

TEST(Kl, Estimators) {
  // logp = -1, logp_ref = -1.5: diff 0.5.
  //   k1 = 0.5; k2 = 0.5 * 0.25 = 0.125; k3 = exp(-0.5) + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307
  EXPECT_NEAR(kl_estimate(-1.0, -1.5, KlEstimator::kK1), 0.5, 1e-12);
  EXPECT_NEAR(kl_estimate(-1.0, -1.5, KlEstimator::kK2), 0.125, 1e-12);
  EXPECT_NEAR(kl_estimate(-1.0, -1.5, KlEstimator::kK3), 0.1065307, 1e-7);
  // Reversed, diff -0.5: k1 = -0.5 (k1 can be negative); k3 = exp(0.5) - 0.5 - 1 = 0.1487213.
  EXPECT_NEAR(kl_estimate(-1.5, -1.0, KlEstimator::kK1), -0.5, 1e-12);
  EXPECT_NEAR(kl_estimate(-1.5, -1.0, KlEstimator::kK3), 0.1487213, 1e-7);
  EXPECT_EQ(kl_estimate(-2.0, -2.0, KlEstimator::kK3), 0.0);

  EXPECT_EQ(parse_kl_estimator("k3"), KlEstimator::kK3);
  std::string msg = error_message([] { parse_kl_estimator("k4"); });
  EXPECT_NE(msg.find("'k4'"), std::string::npos) << msg;

  // Reward mode: rewards -= 0.1 * k1 at policy tokens only: 1 - 0.1 * 0.5 = 0.95.
  std::vector<float> rewards = {0, 1};
  apply_kl_penalty(rewards, std::vector<float>{-7, -1}, std::vector<float>{-1, -1.5f}, std::vector<float>{0, 1}, 0.1,
                   KlEstimator::kK1);
  EXPECT_FLOAT_EQ(rewards[0], 0.0f);
  EXPECT_NEAR(rewards[1], 0.95, kTol);
}

// ratio = exp(logp - old_logp); clip_low 0.2, clip_high 0.28: the clamp range is [0.8, 1.28].
TokenLoss surrogate(double ratio, double advantage) {
  return ppo_policy_token_loss(std::log(ratio), 0.0, advantage, 0.2, 0.28);
}

TEST(PpoLoss, ClippedSurrogatePositiveAdvantage) {
  // A = 2. loss = max(-A r, -A clamp(r)):
  //   r = 0.5 (below): max(-1.0, -1.6) = -1.0   unclipped (the pessimistic term still moves)
  //   r = 1.1 (in):    max(-2.2, -2.2) = -2.2   unclipped
  //   r = 1.5 (above): max(-3.0, -2.56) = -2.56 clipped (no gradient past 1 + 0.28)
  EXPECT_NEAR(surrogate(0.5, 2).loss, -1.0, 1e-9);
  EXPECT_FALSE(surrogate(0.5, 2).clipped);
  EXPECT_NEAR(surrogate(1.1, 2).loss, -2.2, 1e-9);
  EXPECT_FALSE(surrogate(1.1, 2).clipped);
  EXPECT_NEAR(surrogate(1.5, 2).loss, -2.56, 1e-9);
  EXPECT_TRUE(surrogate(1.5, 2).clipped);
}

TEST(PpoLoss, ClippedSurrogateNegativeAdvantage) {
  // A = -2. loss = max(2 r, 2 clamp(r)):
  //   r = 0.5 (below): max(1.0, 1.6) = 1.6   clipped (no gradient below 1 - 0.2)
  //   r = 1.1 (in):    2.2                   unclipped
  //   r = 1.5 (above): max(3.0, 2.56) = 3.0  unclipped
  EXPECT_NEAR(surrogate(0.5, -2).loss, 1.6, 1e-9);
  EXPECT_TRUE(surrogate(0.5, -2).clipped);
  EXPECT_NEAR(surrogate(1.1, -2).loss, 2.2, 1e-9);
  EXPECT_FALSE(surrogate(1.1, -2).clipped);
  EXPECT_NEAR(surrogate(1.5, -2).loss, 3.0, 1e-9);
  EXPECT_FALSE(surrogate(1.5, -2).clipped);
}

TEST(PpoLoss, BatchPolicyLossAndClipFraction) {
  // The six tokens above in two sequences (A = 2 then A = -2), plus a masked token with NaN
  // log-probabilities that must not matter.
  //   token_mean = (-1.0 - 2.2 - 2.56 + 1.6 + 2.2 + 3.0) / 6 = 1.04 / 6 = 0.1733333
  //   clip fraction = 2 clipped of 6 = 0.3333333
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float l05 = std::log(0.5f), l11 = std::log(1.1f), l15 = std::log(1.5f);
  const TokenBatch logp = {{nan, l05, l11, l15}, {l05, l11, l15}};
  const TokenBatch old_logp = {{nan, 0, 0, 0}, {0, 0, 0}};
  const TokenBatch adv = {{0, 2, 2, 2}, {-2, -2, -2}};
  const TokenBatch masks = {{0, 1, 1, 1}, {1, 1, 1}};
  LossStats s = ppo_policy_loss(logp, old_logp, adv, masks, 0.2, 0.28, LossAggregation::kTokenMean);
  EXPECT_NEAR(s.loss, 1.04 / 6, kTol);
  EXPECT_NEAR(s.clip_fraction, 1.0 / 3, kTol);
  // seq_mean_token_mean: mean(-5.76 / 3, 6.8 / 3) = mean(-1.92, 2.2666667) = 0.1733333 (equal
  // lengths: the same as token_mean); seq_mean_token_sum: mean(-5.76, 6.8) = 0.52.
  EXPECT_NEAR(ppo_policy_loss(logp, old_logp, adv, masks, 0.2, 0.28, LossAggregation::kSeqMeanTokenSum).loss, 0.52,
              kTol);
}

TEST(PpoLoss, ClippedValueLoss) {
  // old value 1, return 2, value_clip 0.2: the clipped value stays in [0.8, 1.2].
  //   v = 1.1: inside; 0.5 * 0.9^2 = 0.405                                   unclipped
  //   v = 1.5: max((1.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) -> 0.5*0.64 = 0.32  clipped
  //   v = 0.5: max((0.5-2)^2, (0.8-2)^2) = max(2.25, 1.44) -> 1.125           unclipped
  //   v = 2.5: max((2.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) -> 0.32            clipped
  const double vs[] = {1.1, 1.5, 0.5, 2.5};
  const double want[] = {0.405, 0.32, 1.125, 0.32};
  const bool clipped[] = {false, true, false, true};
  for (int i = 0; i < 4; ++i) {
    TokenLoss l = ppo_value_token_loss(vs[i], 1.0, 2.0, 0.2);
    EXPECT_NEAR(l.loss, want[i], 1e-9) << "value " << vs[i];
    EXPECT_EQ(l.clipped, clipped[i]) << "value " << vs[i];
  }
  // As a batch: token_mean = (0.405 + 0.32 + 1.125 + 0.32) / 4 = 0.5425, clip fraction 0.5.
  LossStats s = ppo_value_loss({{1.1f, 1.5f}, {0.5f, 2.5f}}, {{1, 1}, {1, 1}}, {{2, 2}, {2, 2}}, {{1, 1}, {1, 1}}, 0.2,
                               LossAggregation::kTokenMean);
  EXPECT_NEAR(s.loss, 0.5425, kTol);
  EXPECT_NEAR(s.clip_fraction, 0.5, kTol);
}

TEST(Aggregation, ThreeModes) {
  // Sequence A: losses 1, 2 (a masked NaN after them); B: 6; C: no policy token.
  //   token_mean          = (1 + 2 + 6) / 3 = 3
  //   seq_mean_token_sum  = mean(3, 6)      = 4.5    (C has no policy token: not counted)
  //   seq_mean_token_mean = mean(1.5, 6)    = 3.75
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const TokenBatch losses = {{1, 2, nan}, {6}, {7, 8}};
  const TokenBatch masks = {{1, 1, 0}, {1}, {0, 0}};
  EXPECT_NEAR(aggregate_loss(losses, masks, LossAggregation::kTokenMean), 3.0, 1e-9);
  EXPECT_NEAR(aggregate_loss(losses, masks, LossAggregation::kSeqMeanTokenSum), 4.5, 1e-9);
  EXPECT_NEAR(aggregate_loss(losses, masks, LossAggregation::kSeqMeanTokenMean), 3.75, 1e-9);

  EXPECT_EQ(parse_loss_aggregation("seq_mean_token_sum"), LossAggregation::kSeqMeanTokenSum);
  std::string msg = error_message([] { parse_loss_aggregation("sum"); });
  EXPECT_NE(msg.find("'sum'"), std::string::npos) << msg;
  msg = error_message([&] { aggregate_loss({{7, 8}}, {{0, 0}}, LossAggregation::kTokenMean); });
  EXPECT_NE(msg.find("no policy tokens"), std::string::npos) << msg;
  msg = error_message([&] { aggregate_loss({{7, 8}}, {{1}}, LossAggregation::kTokenMean); });
  EXPECT_NE(msg.find("sequence 0 has 2 tokens but its mask has 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cuda_agent::rl
