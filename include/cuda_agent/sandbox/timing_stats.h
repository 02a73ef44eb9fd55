// Summary statistics of timed runs, shared by the timer, the result and the reports.
#pragma once

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

}  // namespace cuda_agent::sandbox
