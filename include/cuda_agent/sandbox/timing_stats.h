// Summary statistics of timed runs, shared by the timer, the result and the reports.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct TimingStats {
  std::vector<double> ms;  // one per timed run, in order
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0, stddev_ms = 0, p10_ms = 0, p90_ms = 0;
  static TimingStats from_samples(std::vector<double> ms);
  nlohmann::json to_json() const;
  // Recomputes the statistics from "samples_ms"; throws nlohmann's error when it is missing.
  static TimingStats from_json(const nlohmann::json& j);
};

// The uncertainty of a speedup, baseline median / candidate median: a percentile bootstrap
// (each side's runs resampled with replacement, independently, `resamples` times) with a fixed
// seed, so the same samples always give the same interval. Reported beside each speedup
// (result["speedup_interval"]); the reward still decides on the point estimate.
struct SpeedupInterval {
  double speedup = 0;  // the point estimate: baseline median / candidate median
  double low = 0, high = 0;
  double confidence = 0.95;
  int resamples = 0;
  nlohmann::json to_json() const;
};
// Empty samples on either side, or a candidate median of 0: speedup, low and high stay 0.
SpeedupInterval speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                 double confidence = 0.95, int resamples = 2000, uint64_t seed = 0x5eed);

}  // namespace cuda_agent::sandbox
