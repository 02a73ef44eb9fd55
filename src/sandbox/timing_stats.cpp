#include "cuda_agent/sandbox/timing_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace cuda_agent::sandbox {
namespace {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

double median_of(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return percentile(v, 0.5);
}

}  // namespace

SpeedupInterval speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                 double confidence, int resamples, uint64_t seed) {
  SpeedupInterval out;
  out.confidence = confidence;
  if (baseline_ms.empty() || candidate_ms.empty()) return out;
  std::vector<double> b = baseline_ms, c = candidate_ms;
  const double cm = median_of(c);
  if (!(cm > 0)) return out;
  out.speedup = median_of(b) / cm;
  out.resamples = std::max(resamples, 1);
  std::mt19937_64 rng(seed);
  std::vector<double> ratios, rb(b.size()), rc(c.size());
  ratios.reserve(static_cast<size_t>(out.resamples));
  std::uniform_int_distribution<size_t> pick_b(0, b.size() - 1), pick_c(0, c.size() - 1);
  for (int r = 0; r < out.resamples; ++r) {
    for (double& x : rb) x = b[pick_b(rng)];
    for (double& x : rc) x = c[pick_c(rng)];
    const double m = median_of(rc);
    if (m > 0) ratios.push_back(median_of(rb) / m);
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1 - confidence) / 2;
  out.low = percentile(ratios, tail);
  out.high = percentile(ratios, 1 - tail);
  return out;
}

nlohmann::json SpeedupInterval::to_json() const {
  return {{"speedup", speedup}, {"low", low}, {"high", high}, {"confidence", confidence}, {"resamples", resamples},
          {"method", "percentile bootstrap of the ratio of medians"}};
}

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
