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

// The percentile interval of the resampled ratios at out.confidence.
void set_bounds(SpeedupInterval& out, std::vector<double> ratios) {
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1 - out.confidence) / 2;
  out.low = percentile(ratios, tail);
  out.high = percentile(ratios, 1 - tail);
}

}  // namespace

double median(std::vector<double> v) {
  return median_of(v);
}

GpuActivity gpu_activity(std::vector<std::pair<uint64_t, uint64_t>> intervals) {
  GpuActivity a;
  a.records = intervals.size();
  if (intervals.empty()) return a;
  std::sort(intervals.begin(), intervals.end());
  uint64_t busy = 0, last_end = 0, cur_start = intervals.front().first, cur_end = intervals.front().second;
  for (const auto& [start, end] : intervals) {
    last_end = std::max(last_end, end);
    if (start > cur_end) {
      busy += cur_end - cur_start;
      cur_start = start;
      cur_end = end;
    } else {
      cur_end = std::max(cur_end, end);
    }
  }
  busy += cur_end - cur_start;
  a.busy_ms = static_cast<double>(busy) / 1e6;
  a.span_ms = static_cast<double>(last_end - intervals.front().first) / 1e6;
  return a;
}

SpeedupInterval paired_speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                        const std::vector<double>& scale_baseline_ms,
                                        const std::vector<double>& scale_reference_ms, double confidence, int resamples,
                                        uint64_t seed) {
  SpeedupInterval out;
  out.confidence = confidence;
  const bool scaled = !scale_baseline_ms.empty() && !scale_reference_ms.empty();
  out.method = scaled ? "paired bootstrap of the rounds (ratio of medians), times the cached baseline's ratio to the "
                        "reference (resampled independently)"
                      : "paired bootstrap of the interleaved rounds (ratio of medians)";
  if (baseline_ms.empty() || baseline_ms.size() != candidate_ms.size()) return out;
  std::vector<double> b = baseline_ms, c = candidate_ms, sb = scale_baseline_ms, sr = scale_reference_ms;
  const double cm = median_of(c);
  if (!(cm > 0)) return out;
  double scale = 1;
  if (scaled) {
    const double r = median_of(sr);
    if (!(r > 0)) return out;
    scale = median_of(sb) / r;
  }
  out.speedup = median_of(b) / cm * scale;
  out.resamples = std::max(resamples, 1);
  std::mt19937_64 rng(seed);
  const size_t n = baseline_ms.size();
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<double> rb(n), rc(n), rsb(scale_baseline_ms.size()), rsr(scale_reference_ms.size());
  std::uniform_int_distribution<size_t> pick_sb(0, scaled ? sb.size() - 1 : 0), pick_sr(0, scaled ? sr.size() - 1 : 0);
  std::vector<double> ratios;
  ratios.reserve(static_cast<size_t>(out.resamples));
  for (int r = 0; r < out.resamples; ++r) {
    for (size_t i = 0; i < n; ++i) {
      const size_t k = pick(rng);
      rb[i] = baseline_ms[k];
      rc[i] = candidate_ms[k];
    }
    double s = 1;
    if (scaled) {
      for (double& x : rsb) x = scale_baseline_ms[pick_sb(rng)];
      for (double& x : rsr) x = scale_reference_ms[pick_sr(rng)];
      const double ref = median_of(rsr);
      if (!(ref > 0)) continue;
      s = median_of(rsb) / ref;
    }
    const double m = median_of(rc);
    if (m > 0) ratios.push_back(median_of(rb) / m * s);
  }
  set_bounds(out, std::move(ratios));
  return out;
}

bool drifted_beyond(const std::vector<double>& now_ms, const std::vector<double>& cached_ms, double band) {
  if (now_ms.empty() || cached_ms.empty()) return false;
  const SpeedupInterval ratio = speedup_interval(now_ms, cached_ms);
  if (ratio.speedup <= 0) return false;
  return ratio.low > 1 + band || ratio.high < 1 - band;
}

SpeedupInterval speedup_interval(const std::vector<double>& baseline_ms, const std::vector<double>& candidate_ms,
                                 double confidence, int resamples, uint64_t seed) {
  SpeedupInterval out;
  out.confidence = confidence;
  out.method = "percentile bootstrap of the ratio of medians (independent runs)";
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
  set_bounds(out, std::move(ratios));
  return out;
}

nlohmann::json SpeedupInterval::to_json() const {
  return {{"speedup", speedup},     {"low", low},      {"high", high}, {"confidence", confidence},
          {"resamples", resamples}, {"method", method}};
}

TimingStats TimingStats::from_samples(std::vector<double> ms, std::vector<double> gpu_ms) {
  TimingStats s;
  s.ms = ms;
  s.gpu_ms = std::move(gpu_ms);
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

TimingStats TimingStats::scaled(double factor) const {
  std::vector<double> m = ms, g = gpu_ms;
  for (double& x : m) x *= factor;
  for (double& x : g) x *= factor;
  return from_samples(std::move(m), std::move(g));
}

nlohmann::json TimingStats::to_json() const {
  nlohmann::json j = {{"median_ms", median_ms}, {"mean_ms", mean_ms},      {"min_ms", min_ms}, {"max_ms", max_ms},
                      {"stddev_ms", stddev_ms}, {"p10_ms", p10_ms},        {"p90_ms", p90_ms}, {"runs", ms.size()},
                      {"samples_ms", ms},       {"gpu_kernel_ms", nullptr}};
  if (!gpu_ms.empty()) {
    j["gpu_kernel_ms"] = median(gpu_ms);
    j["gpu_samples_ms"] = gpu_ms;
  }
  return j;
}

TimingStats TimingStats::from_json(const nlohmann::json& j) {
  return from_samples(j.at("samples_ms").get<std::vector<double>>(), j.value("gpu_samples_ms", std::vector<double>{}));
}

BracketCalibration calibration_of(std::vector<double> spans_ms) {
  BracketCalibration c;
  c.runs = static_cast<int>(spans_ms.size());
  if (spans_ms.empty()) return c;
  std::sort(spans_ms.begin(), spans_ms.end());
  c.median_ms = percentile(spans_ms, 0.5);
  // Tukey's fence: a hiccup in one or two of the empty runs (a context switch of the machine's)
  // does not widen it, as a high percentile would.
  c.spread_ms = 1.5 * (percentile(spans_ms, 0.75) - percentile(spans_ms, 0.25));
  return c;
}

bool calibration_noisy(const BracketCalibration& c) {
  return c.spread_ms > std::max(0.020, 0.05 * c.median_ms);
}

std::vector<double> bracket_floors(const std::vector<double>& spans_ms, const BracketCalibration& c) {
  std::vector<double> floors;
  floors.reserve(spans_ms.size());
  for (double span : spans_ms) floors.push_back(span > 0 ? std::max(0.0, span - c.median_ms - c.spread_ms) : 0.0);
  return floors;
}

}  // namespace cuda_agent::sandbox
