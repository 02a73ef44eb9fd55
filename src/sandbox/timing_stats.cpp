#include "cuda_agent/sandbox/timing_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cuda_agent::sandbox {
namespace {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

}  // namespace

TimingStats TimingStats::from_samples(std::vector<double> ms) {
  TimingStats s;
  s.ms = ms;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.median_ms = percentile(ms, 0.5);
  s.p10_ms = percentile(ms, 0.1);
  s.p90_ms = percentile(ms, 0.9);
  s.min_ms = ms.front();
  s.max_ms = ms.back();
  s.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  double var = 0;
  for (double v : ms) var += (v - s.mean_ms) * (v - s.mean_ms);
  s.stddev_ms = ms.size() > 1 ? std::sqrt(var / (ms.size() - 1)) : 0;
  return s;
}

nlohmann::json TimingStats::to_json() const {
  return {{"median_ms", median_ms}, {"mean_ms", mean_ms}, {"min_ms", min_ms},  {"max_ms", max_ms},
          {"stddev_ms", stddev_ms}, {"p10_ms", p10_ms},   {"p90_ms", p90_ms}, {"runs", ms.size()},
          {"samples_ms", ms}};
}

TimingStats TimingStats::from_json(const nlohmann::json& j) {
  return from_samples(j.at("samples_ms").get<std::vector<double>>());
}

}  // namespace cuda_agent::sandbox
