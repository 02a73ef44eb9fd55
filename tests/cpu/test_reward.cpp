// Tests for the reward: the milestone scheme (-1/1/2/3) and the raw-speedup ablation.
#include "cuda_agent/sandbox/reward.h"

#include <algorithm>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/cupti_kernel_recorder.h"
#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/launch_origins.h"
#include "cuda_agent/sandbox/timer.h"
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
  // torch.compile not timed (profile_compile off): beating eager is enough for the top reward.
  EXPECT_EQ(compute_reward("milestone", inputs(true, 1.2, std::nullopt)), 3.0);
  // torch.compile failed beside the solution, which can make it fail: the top tier is not granted.
  RewardInputs failed = inputs(true, 1.2, std::nullopt);
  failed.compile_failed_beside_solution = true;
  EXPECT_EQ(compute_reward("milestone", failed), 2.0);
  failed.speedup_vs_eager = 1.01;
  EXPECT_EQ(compute_reward("milestone", failed), 1.0);
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

// The interval rule: "faster" needs the lower end of the speedup's interval above the bar; the
// point rule (the paper's) the estimate itself.
TEST(Reward, IntervalRuleDecidesOnTheLowerEnd) {
  RewardInputs in = inputs(true, 1.10, 1.10);
  in.low_vs_eager = 1.07;
  in.low_vs_compile = 1.03;  // the estimate clears 1.05, its interval does not
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "point"), 3.0);
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "interval"), 2.0);
  in.low_vs_eager = 1.04;
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "interval"), 1.0);
  in.low_vs_eager = in.low_vs_compile = 1.06;
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "interval"), 3.0);
  // A failed torch.compile is still no bar; a wrong answer is still -1.
  in.speedup_vs_compile.reset();
  in.low_vs_compile.reset();
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "interval"), 3.0);
  in.correct = false;
  EXPECT_EQ(compute_reward("milestone", in, 0.05, "interval"), -1.0);
  // A speedup without its interval cannot be judged by the interval rule; an unknown rule is named.
  RewardInputs bare = inputs(true, 1.2, 1.2);
  EXPECT_THROW(compute_reward("milestone", bare, 0.05, "interval"), Error);
  try {
    compute_reward("milestone", bare, 0.05, "median");
    ADD_FAILURE() << "expected cuda_agent::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'median'"), std::string::npos) << e.what();
  }
}

// Interleaved rounds: drift shared by a round cancels in the paired interval, which the
// independent one cannot see; a scale by a cached ratio multiplies the estimate.
TEST(SpeedupInterval, PairedRoundsCancelSharedDrift) {
  std::vector<double> eager, cand;
  for (int i = 0; i < 20; ++i) {
    const double drift = 1.0 + 0.3 * (i % 4);  // the GPU's clock wanders across rounds
    eager.push_back(2.0 * drift * (1 + 0.001 * (i % 3)));
    cand.push_back(1.0 * drift);
  }
  const SpeedupInterval paired = paired_speedup_interval(eager, cand);
  const SpeedupInterval independent = speedup_interval(eager, cand);
  EXPECT_NEAR(paired.speedup, independent.speedup, 1e-12);
  EXPECT_LE(paired.low, paired.speedup);
  EXPECT_GE(paired.high, paired.speedup);
  EXPECT_LT(paired.high - paired.low, (independent.high - independent.low) / 5);
  EXPECT_GT(paired.low, 1.9);
  // The cached torch.compile baseline, 0.5 of the cached eager: the speedup against it is half.
  const std::vector<double> cached_eager(10, 4.0), cached_compile(10, 2.0);
  const SpeedupInterval scaled = paired_speedup_interval(eager, cand, cached_compile, cached_eager);
  EXPECT_NEAR(scaled.speedup, paired.speedup * 0.5, 1e-12);
  EXPECT_NEAR(scaled.low, paired.low * 0.5, 1e-9);
  EXPECT_NE(scaled.method, paired.method);
  // Rounds that do not pair, or a zero candidate: nothing to say.
  EXPECT_EQ(paired_speedup_interval(eager, std::vector<double>(3, 1.0)).speedup, 0);
  EXPECT_EQ(paired_speedup_interval(eager, std::vector<double>(20, 0.0)).speedup, 0);
}

// The GPU's time in a forward: the union of its records (concurrent work once), and the span.
TEST(GpuActivity, UnionAndSpanOfTheRecords) {
  EXPECT_EQ(gpu_activity({}).busy_ms, 0);
  // [0, 1 ms], [0.5, 1.5 ms] overlap; [3, 4 ms] apart: busy 2.5 ms, span 4 ms.
  const GpuActivity a = gpu_activity({{3'000'000, 4'000'000}, {0, 1'000'000}, {500'000, 1'500'000}});
  EXPECT_NEAR(a.busy_ms, 2.5, 1e-12);
  EXPECT_NEAR(a.span_ms, 4.0, 1e-12);
  EXPECT_EQ(a.records, 3u);
  // A record inside another counts once.
  const GpuActivity b = gpu_activity({{0, 10'000'000}, {2'000'000, 3'000'000}});
  EXPECT_NEAR(b.busy_ms, 10.0, 1e-12);
  EXPECT_NEAR(b.span_ms, 10.0, 1e-12);
}

// Copies and fills in no forward's window are the solution's data movement where it is not timed
// when it issued them; the harness's own (the flush, the export) and unattributed ones are not.
TEST(GpuActivity, CopiesOutsideEveryWindowAreCountedByWhoIssuedThem) {
  const std::vector<Window> windows = {{1'000, 2'000}, {5'000, 6'000}};
  auto copy = [](uint64_t start, uint64_t end, CopyOrigin origin, uint64_t bytes) {
    GpuSpan t;
    t.start_ns = start, t.end_ns = end, t.origin = origin, t.bytes = bytes;
    return t;
  };
  const std::vector<GpuSpan> transfers = {
      copy(1'100, 1'900, CopyOrigin::kSolution, 64),   // inside the first forward: timed
      copy(5'000, 6'000, CopyOrigin::kSolution, 64),   // exactly the second window
      copy(3'000, 3'500, CopyOrigin::kSolution, 100),  // between the two
      copy(900, 1'500, CopyOrigin::kSolution, 28),     // started before the first window opened
      copy(3'000, 3'100, CopyOrigin::kHarness, 4096),  // the L2 flush
      copy(7'000, 7'100, CopyOrigin::kUnknown, 8)};
  const OutsideCopies out = outside_copies(transfers, windows);
  EXPECT_EQ(out.count, 2u);
  EXPECT_EQ(out.bytes, 128u);
  EXPECT_EQ(out.unattributed, 1u);
  EXPECT_EQ(outside_copies(transfers, {{0, 10'000}}).count, 0u) << "every copy inside one window";
  EXPECT_EQ(outside_copies({}, windows).count, 0u);
}

// Work that started while the timing stream was held (a kernel on a non-blocking stream, launched
// inside the forward) counts until the hold let go: a forward that copied its input to mapped host
// memory with one early kernel, computed on the CPU for 4.8 ms and returned host memory as its
// output showed as that kernel's 10 us. Work that starts after the hold is measured as before.
TEST(GpuActivity, WorkStartedDuringTheHoldCountsUntilTheHoldLetGo) {
  auto record = [](const char* name, uint64_t start, uint64_t end, LaunchOrigin origin) {
    KernelRecord k;
    k.name = name, k.start_ns = start, k.end_ns = end, k.origin = origin;
    return k;
  };
  const std::vector<Window> windows = {{0, 10'000'000}};
  const KernelRecord hold = record("cuda_agent_timer_hold", 100, 5'000'000, LaunchOrigin::kHarness);
  ASSERT_TRUE(is_timer_hold(hold));
  std::vector<KernelRecord> early = {hold, record("copy_to_host", 200'000, 210'000, LaunchOrigin::kOwn)};
  RunGpu r = runs_gpu(windows, {0.005}, early, {}).front();
  EXPECT_NEAR(r.sample_ms, 4.8, 1e-9) << "from the early kernel's start to the hold's end";
  EXPECT_NEAR(r.gpu.busy_ms, 0.01, 1e-9) << "the GPU's busy time is still its records'";
  EXPECT_TRUE(r.extended);

  std::vector<KernelRecord> after = {hold, record("softmax", 5'010'000, 5'510'000, LaunchOrigin::kOwn)};
  r = runs_gpu(windows, {0.52}, after, {}).front();
  EXPECT_NEAR(r.sample_ms, 0.52, 1e-9) << "the events' interval, as before";
  EXPECT_FALSE(r.extended);

  std::vector<KernelRecord> across = {hold, record("a", 4'900'000, 4'950'000, LaunchOrigin::kOwn),
                                      record("b", 5'100'000, 6'000'000, LaunchOrigin::kOwn)};
  r = runs_gpu(windows, {0.9}, across, {}).front();
  EXPECT_NEAR(r.sample_ms, 1.1, 1e-9) << "first record to last, which already passes the hold";
}

// The slice watch's account (timer.h, SliceGaps): each watched run's sample less the time the GPU
// gave other contexts during it; a run not watched (or whose watch did not see it through) keeps
// its sample; nothing goes below zero; a series in which a watched run lost time is contended.
TEST(SliceWatch, EachWatchedSampleLosesTheTimeOtherContextsTook) {
  TimedSeries::Series s;
  s.ms = {5.0, 9.0, 5.1, 12.0, 0.5};
  auto gaps = [](bool watched, uint64_t count, double ms, double longest_us) {
    SliceGaps g;
    g.watched = watched, g.count = count, g.ms = ms, g.longest_us = longest_us;
    return g;
  };
  take_off_slices(s, {gaps(true, 0, 0, 2.5), gaps(true, 2, 4.0, 2100), gaps(true, 0, 0, 3.0),
                      gaps(false, 0, 0, 0), gaps(true, 1, 0.8, 800)});
  EXPECT_EQ(s.ms, (std::vector<double>{5.0, 5.0, 5.1, 12.0, 0.0}));
  EXPECT_EQ(s.sliced_ms, (std::vector<double>{0, 4.0, 0, 0, 0.8}));
  EXPECT_EQ(s.watched_runs, 4);
  EXPECT_EQ(s.sliced_runs, 2);
  EXPECT_EQ(s.slices, 3u);
  EXPECT_DOUBLE_EQ(s.longest_step_us, 2100);
  EXPECT_TRUE(s.contended());

  TimedSeries::Series quiet;
  quiet.ms = {5.0, 9.0};
  take_off_slices(quiet, {gaps(true, 0, 0, 4.0), gaps(false, 0, 0, 0)});
  EXPECT_EQ(quiet.ms, (std::vector<double>{5.0, 9.0}));
  EXPECT_FALSE(quiet.contended()) << "a run not watched says nothing";
}

// Half the rounds watched (at least three, at most all), the same ones for the same seed.
TEST(SliceWatch, HalfTheRoundsAreWatchedAtRandom) {
  auto count = [](const std::vector<bool>& v) { return std::count(v.begin(), v.end(), true); };
  EXPECT_EQ(count(watched_rounds(20, 1)), 10);
  EXPECT_EQ(count(watched_rounds(7, 1)), 3);
  EXPECT_EQ(count(watched_rounds(2, 1)), 2);
  EXPECT_TRUE(watched_rounds(0, 1).empty());
  EXPECT_EQ(watched_rounds(20, 5), watched_rounds(20, 5));
  int differ = 0;
  for (uint64_t seed = 0; seed < 8; ++seed) differ += watched_rounds(20, seed) != watched_rounds(20, seed + 100);
  EXPECT_GE(differ, 7) << "the rounds depend on the seed";
}

// The watch's kernel is beside a run, not in it: its record neither stretches the run's span nor
// joins its kernels.
TEST(SliceWatch, TheWatchsRecordIsNoneOfTheRunsWork) {
  KernelRecord watch, kernel;
  watch.name = "cuda_agent_timer_watch", watch.start_ns = 1'000, watch.end_ns = 9'000'000;
  watch.origin = LaunchOrigin::kHarness;
  kernel.name = "softmax", kernel.start_ns = 2'000'000, kernel.end_ns = 2'500'000, kernel.origin = LaunchOrigin::kOwn;
  ASSERT_TRUE(is_timer_watch(watch));
  std::vector<KernelRecord> records = {watch, kernel};
  std::vector<std::vector<KernelRecord>> inside;
  const RunGpu r = runs_gpu({{0, 10'000'000}}, {0.5}, records, {}, &inside).front();
  EXPECT_NEAR(r.sample_ms, 0.5, 1e-9);
  EXPECT_FALSE(r.extended);
  ASSERT_EQ(inside.front().size(), 1u);
  EXPECT_EQ(inside.front().front().name, "softmax");
}

// A baseline carried over by drift: every time scaled, the GPU times too.
TEST(TimingStats, ScaledAndTheGpuTimeInItsJson) {
  const TimingStats s = TimingStats::from_samples({1.0, 2.0, 3.0}, {0.5, 0.5, 0.7});
  const nlohmann::json j = s.to_json();
  EXPECT_DOUBLE_EQ(j["gpu_kernel_ms"].get<double>(), 0.5);
  const TimingStats back = TimingStats::from_json(j);
  EXPECT_EQ(back.gpu_ms, s.gpu_ms);
  const TimingStats twice = s.scaled(2.0);
  EXPECT_DOUBLE_EQ(twice.median_ms, 4.0);
  EXPECT_DOUBLE_EQ(twice.gpu_ms[2], 1.4);
  EXPECT_TRUE(TimingStats::from_samples({1.0}).to_json()["gpu_kernel_ms"].is_null());
}

// A cached baseline is re-timed only when eager drifted beyond the band with confidence: a
// shift inside the band, or noise wide enough to hold 1, is not drift.
TEST(SpeedupInterval, DriftBeyondTheBandNeedsConfidence) {
  std::vector<double> cached, same, slower, noisy_slower;
  for (int i = 0; i < 20; ++i) {
    cached.push_back(1.0 + 0.005 * (i % 4));
    same.push_back(1.03 + 0.005 * ((i * 3) % 4));    // 3% off: inside a 10% band
    slower.push_back(1.25 + 0.005 * ((i * 3) % 4));  // 25% off, tight: drift
    noisy_slower.push_back(i % 2 ? 0.8 : 1.8);       // a median far off, but nothing certain
  }
  EXPECT_FALSE(drifted_beyond(same, cached, 0.10));
  EXPECT_TRUE(drifted_beyond(slower, cached, 0.10));
  EXPECT_TRUE(drifted_beyond(cached, slower, 0.10));  // faster now, as much
  EXPECT_FALSE(drifted_beyond(slower, cached, 0.30));
  EXPECT_FALSE(drifted_beyond(noisy_slower, cached, 0.10));
  EXPECT_FALSE(drifted_beyond({}, cached, 0.10));
}

// The result's reports that go with the timing (the speedups' intervals, where the profile
// phase's time went) are written to its JSON and read back; a report the result does not know
// stays out of it.
TEST(EvalResult, TimingReportsRoundTripThroughItsJson) {
  EvalResult r;
  r.reports["speedup_interval"] = {{"vs_eager", {{"speedup", 1.5}, {"low", 1.4}, {"high", 1.6}}}};
  r.reports["profile_seconds"] = {{"rounds_candidate", 0.42}, {"warmup_eager", 0.11}};
  r.reports["not_a_report"] = 1;
  const nlohmann::json j = r.to_json();
  EXPECT_DOUBLE_EQ(j.at("profile_seconds").at("rounds_candidate").get<double>(), 0.42);
  EXPECT_FALSE(j.contains("not_a_report"));
  const EvalResult back = EvalResult::from_json(j);
  EXPECT_EQ(back.reports.at("profile_seconds"), r.reports.at("profile_seconds"));
  EXPECT_EQ(back.reports.at("speedup_interval"), r.reports.at("speedup_interval"));
}

// The judge's bracket (judge_bracket.h): the calibration is the empty runs' median and 1.5 times
// their interquartile range (an outlier among them does not widen it); a timed run's floor is its
// span less both, and a run without a span has none.
TEST(BracketFloor, TheFloorIsTheSpanLessTheCalibratedHandOversAndTheirSpread) {
  std::vector<double> empty;
  for (int i = 0; i < 10; ++i) empty.push_back(0.300 + 0.001 * i);  // 0.300 .. 0.309 ms
  const BracketCalibration c = calibration_of(empty);
  EXPECT_EQ(c.runs, 10);
  EXPECT_NEAR(c.median_ms, 0.3045, 1e-9);
  EXPECT_NEAR(c.spread_ms, 1.5 * (0.30675 - 0.30225), 1e-9);
  std::vector<double> hiccup = empty;
  hiccup.back() = 1.3;  // one empty run a millisecond late
  EXPECT_NEAR(calibration_of(hiccup).spread_ms, c.spread_ms, 1e-9);
  // A 16 us run claimed as 2 us: its span still holds the 16 us, so its floor is near them.
  const std::vector<double> floors = bracket_floors({0.3045 + 0.016, 0.0, 0.2}, c);
  ASSERT_EQ(floors.size(), 3u);
  EXPECT_NEAR(floors[0], 0.016 - c.spread_ms, 1e-9);
  EXPECT_GT(floors[0], 4 * 0.002);  // far above the claim of 2 us
  EXPECT_EQ(floors[1], 0.0);        // no span
  EXPECT_EQ(floors[2], 0.0);        // below the calibration: never negative
  EXPECT_EQ(calibration_of({}).runs, 0);
  // Noisy: a spread beyond 20 us, or 5% of the median where that is more.
  EXPECT_FALSE(calibration_noisy(c));
  EXPECT_TRUE(calibration_noisy({0.3, 0.021, 16}));
  EXPECT_FALSE(calibration_noisy({1.7, 0.080, 16}));
  EXPECT_TRUE(calibration_noisy({1.7, 0.34, 16}));
}

}  // namespace
}  // namespace cuda_agent::sandbox
