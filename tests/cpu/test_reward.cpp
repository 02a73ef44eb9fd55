// Tests for the reward: the milestone scheme (-1/1/2/3) and the raw-speedup ablation.
#include "cuda_agent/sandbox/reward.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/timing_stats.h"

namespace cuda_agent::sandbox {
namespace {

RewardInputs inputs(bool correct, std::optional<double> eager, std::optional<double> compile) {
  RewardInputs in;
  in.correct = correct;
  in.speedup_vs_eager = eager;
  in.speedup_vs_compile = compile;
  return in;
}

TEST(Reward, MilestoneLevels) {
  // Wrong or failed: -1, whatever the speed.
  EXPECT_EQ(compute_reward("milestone", inputs(false, 10.0, 10.0)), -1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(false, std::nullopt, std::nullopt)), -1.0);
  // More than 5% faster than both.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.06, 1.06)), 3.0);
  // Faster than eager only.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.06, 1.0)), 2.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 5.0, 0.5)), 2.0);
  // Correct but not faster than eager.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.04, 1.06)), 1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.04, 2.0)), 1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 0.3, 0.2)), 1.0);
  // No timing at all (e.g. verify only): correct is worth 1.
  EXPECT_EQ(compute_reward("milestone", inputs(true, std::nullopt, std::nullopt)), 1.0);
}

TEST(Reward, ExactlyTheMarginIsNotFaster) {
  // 1.05 is "5% faster", not "more than 5% faster".
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.05, 1.05)), 1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.06, 1.05)), 2.0);
  // As the evaluation computes it: eager_ms / candidate_ms.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.05 / 1.0, 2.1 / 2.0)), 1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.0500001, 1.0500001)), 3.0);
}

TEST(Reward, MissingCompileTimingIsNoBar) {
  // torch.compile failed on the task: beating eager is enough for the top reward.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.2, std::nullopt)), 3.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.04, std::nullopt)), 1.0);
}

TEST(Reward, MarginParameter) {
  // margin 0.2: 1.1x is no longer faster, 1.25x is.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.1, 1.1), 0.2), 1.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.25, 1.1), 0.2), 2.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.25, 1.25), 0.2), 3.0);
  // margin 0: any speedup above 1 counts.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.01, 1.01), 0.0), 3.0);
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.0, 1.0), 0.0), 1.0);
  // The default margin is 5%.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.04, 1.04)),
            compute_reward("milestone", inputs(true, 1.04, 1.04), 0.05));
}

TEST(Reward, RawSpeedup) {
  EXPECT_DOUBLE_EQ(compute_reward("raw_speedup", inputs(true, 2.0, 1.5)), 1.5);  // vs torch.compile
  EXPECT_DOUBLE_EQ(compute_reward("raw_speedup", inputs(true, 0.8, 0.4)), 0.4);
  EXPECT_DOUBLE_EQ(compute_reward("raw_speedup", inputs(true, 2.0, std::nullopt)), 2.0);  // eager fallback
  EXPECT_EQ(compute_reward("raw_speedup", inputs(false, 2.0, 1.5)), -1.0);
  EXPECT_EQ(compute_reward("raw_speedup", inputs(false, std::nullopt, std::nullopt)), -1.0);
  // The margin plays no part.
  EXPECT_DOUBLE_EQ(compute_reward("raw_speedup", inputs(true, 1.03, 1.03), 0.5), 1.03);
}

TEST(Reward, UnknownKindThrowsNamingIt) {
  for (bool correct : {true, false}) {
    try {
      compute_reward("speedup_squared", inputs(correct, 2.0, 2.0));
      ADD_FAILURE() << "expected cuda_agent::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'speedup_squared'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("milestone"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(compute_reward("", inputs(true, 2.0, 2.0)), Error);
}

// The speedup's bootstrap interval (timing_stats.h): it holds the point estimate, narrows with
// less noise, is reproducible, and says nothing for empty samples.
TEST(SpeedupInterval, BracketsThePointEstimateAndNarrowsWithLessNoise) {
  std::vector<double> eager, noisy, quiet;
  for (int i = 0; i < 20; ++i) {
    eager.push_back(2.0 + 0.01 * (i % 5));
    noisy.push_back(1.0 + 0.2 * ((i * 7) % 10) / 10.0);
    quiet.push_back(1.0 + 0.002 * ((i * 7) % 10) / 10.0);
  }
  const SpeedupInterval a = speedup_interval(eager, noisy), b = speedup_interval(eager, quiet);
  EXPECT_NEAR(a.speedup, TimingStats::from_samples(eager).median_ms / TimingStats::from_samples(noisy).median_ms, 1e-12);
  EXPECT_LE(a.low, a.speedup);
  EXPECT_GE(a.high, a.speedup);
  EXPECT_LE(b.low, b.speedup);
  EXPECT_GE(b.high, b.speedup);
  EXPECT_LT(b.high - b.low, (a.high - a.low) / 5);
  EXPECT_EQ(a.resamples, 2000);
  const SpeedupInterval again = speedup_interval(eager, noisy);
  EXPECT_EQ(again.low, a.low);
  EXPECT_EQ(again.high, a.high);
  const SpeedupInterval none = speedup_interval({}, noisy);
  EXPECT_EQ(none.speedup, 0);
  EXPECT_EQ(none.to_json()["low"], 0);
}

}  // namespace
}  // namespace cuda_agent::sandbox
