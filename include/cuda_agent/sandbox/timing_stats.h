// Summary statistics of timed runs, shared by the timer, the result and the reports.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct TimingStats {
  std::vector<double> ms;  // one per timed run, in order
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0, stddev_ms = 0, p10_ms = 0, p90_ms = 0;
  // The GPU's time per run from CUPTI (GpuActivity::busy_ms), in order; empty when not recorded.
  std::vector<double> gpu_ms;
  static TimingStats from_samples(std::vector<double> ms, std::vector<double> gpu_ms = {});
  // The same runs with every time multiplied by `factor` (a baseline carried over by drift).
  TimingStats scaled(double factor) const;
  nlohmann::json to_json() const;  // gpu_kernel_ms: the median of gpu_ms (null when empty)
  // Recomputes the statistics from "samples_ms" (and "gpu_samples_ms" when present); throws
  // nlohmann's error when "samples_ms" is missing.
  static TimingStats from_json(const nlohmann::json& j);
};

// The uncertainty of a speedup, baseline median / candidate median, as a percentile bootstrap
// with a fixed seed, so the same samples always give the same interval (result
// ["speedup_interval"]); the milestone reward decides "faster" on it (reward.h).
struct SpeedupInterval {
  double speedup = 0;  // the point estimate: baseline median / candidate median (times `scale`)
  double low = 0, high = 0;
  double confidence = 0.95;
  int resamples = 0;
  std::string method;
  nlohmann::json to_json() const;
};
// Independent runs: each side's runs resampled with replacement, independently. Empty samples
// on either side, or a candidate median of 0: speedup, low and high stay 0.
SpeedupInterval speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                 double confidence = 0.95, int resamples = 2000, uint64_t seed = 0x5eed);
// Interleaved rounds (run k of the baseline and of the candidate timed one after the other, on
// the same inputs): the rounds are resampled, each keeping its pair, so drift shared by a round
// cancels. With `scale_baseline_ms` and `scale_reference_ms` (both non-empty: the cached
// measurement of this baseline and of the reference it is scaled by), the speedup is multiplied
// by median(scale_baseline) / median(scale_reference), those samples resampled independently in
// the same draws: the speedup against a cached baseline, carried over through the reference
// timed in this evaluation. The sizes of baseline_ms and candidate_ms must agree (else all 0).
SpeedupInterval paired_speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                        const std::vector<double>& scale_baseline_ms = {},
                                        const std::vector<double>& scale_reference_ms = {}, double confidence = 0.95,
                                        int resamples = 2000, uint64_t seed = 0x5eed);

// The GPU's time in one forward, from CUPTI's records of the kernels, copies and fills that ran
// inside its window (start and end in ns on CUPTI's clock): busy, the union of the intervals (what
// the GPU spent; concurrent work counted once); span, the first start to the last end.
struct GpuActivity {
  double busy_ms = 0, span_ms = 0;
  size_t records = 0;
};
GpuActivity gpu_activity(std::vector<std::pair<uint64_t, uint64_t>> intervals);

// Whether a baseline timed now (`now_ms`) has drifted from its cached timing (`cached_ms`) beyond
// `band` (0.1: 10%) rather than within the noise: the 95% interval of median(now) / median(cached)
// (speedup_interval, independent runs) lies wholly outside [1 - band, 1 + band]. False when either
// side is empty.
bool drifted_beyond(const std::vector<double>& now_ms, const std::vector<double>& cached_ms, double band);

double median(std::vector<double> v);  // 0 for an empty vector

// The calibration of the judge's bracket (judge_bracket.h) from the spans of empty runs: what the
// hand-overs between the two processes and the outputs' copy add to a run (the median), and how
// much that varies (the spread: 1.5 times the interquartile range, so that one or two outliers
// among the empty runs do not widen it).
struct BracketCalibration {
  double median_ms = 0, spread_ms = 0;
  int runs = 0;
};
BracketCalibration calibration_of(std::vector<double> spans_ms);
// Whether a calibration's spread is wider than its runs' usual noise (20 µs, or 5% of the median
// where that is more): something else disturbed them, and the judge calibrates again.
bool calibration_noisy(const BracketCalibration& c);
// Each timed run's floor: its span less the calibration's median and spread, never below 0; a
// run without a span (0) has none (0).
std::vector<double> bracket_floors(const std::vector<double>& spans_ms, const BracketCalibration& c);

}  // namespace cuda_agent::sandbox
