#include "cuda_agent/bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "cuda_agent/core/error.h"

namespace cuda_agent::bench {
namespace {

using nlohmann::json;

std::string p_key(double p) { return fmt::format("{:g}", p); }

std::string raw_bin(double v) {
  const auto& e = kRawRewardBinEdges;
  if (v < e.front()) return fmt::format("<{:g}", e.front());
  for (size_t i = 0; i + 1 < e.size(); ++i)
    if (v < e[i + 1]) return fmt::format("{:g}-{:g}", e[i], e[i + 1]);
  return fmt::format("{:g}+", e.back());
}

bool is_raw_speedup_kind(const json& r) {
  const json options = r.contains("options") ? r.at("options") : json();
  return string_field(r, "reward_kind", string_field(options, "reward", "milestone")) == "raw_speedup";
}

// Running sums for one level (or the whole run).
struct Tally {
  int tasks = 0, passed = 0, faster_eager = 0, faster_compile = 0;
  int not_timed = 0;                       // passing results that were verified only (mode "verify": no GPU)
  int n_eager = 0, n_compile = 0;          // passing results with that speedup
  double log_eager = 0, log_compile = 0;   // sums of log(speedup) over those
  double reward_sum = 0;
  std::vector<int> fast_eager = std::vector<int>(kFastPThresholds.size(), 0);
  std::vector<int> fast_compile = std::vector<int>(kFastPThresholds.size(), 0);
  std::map<std::string, int> rewards = {{"-1", 0}, {"1", 0}, {"2", 0}, {"3", 0}};
  std::map<std::string, int> raw_bins;
  std::map<std::string, int> failures;

  void add(const json& r) {
    ++tasks;
    const std::optional<double> reward = number_field(r, "reward");
    const double rv = reward.value_or(-1.0);
    reward_sum += rv;
    if (rv != -1.0 && is_raw_speedup_kind(r))
      raw_bins[raw_bin(rv)]++;
    else
      rewards[fmt::format("{:g}", rv)]++;

    if (!is_passing(r)) {
      failures[result_label(r)]++;
      return;
    }
    ++passed;
    if (string_field(r, "mode") == "verify") ++not_timed;
    const double bar = 1.0 + speedup_margin(r);
    const std::optional<double> eager = usable_speedup(r, "speedup_vs_eager");
    const std::optional<double> compile = usable_speedup(r, "speedup_vs_compile");
    // torch.compile not timed: no bar of its own, the candidate is judged against eager.
    const std::optional<double> compile_or_eager = compile ? compile : eager;
    if (eager) {
      ++n_eager, log_eager += std::log(*eager);
      if (*eager > bar) ++faster_eager;
    }
    if (compile) ++n_compile, log_compile += std::log(*compile);
    if (compile_or_eager && *compile_or_eager > bar) ++faster_compile;
    for (size_t i = 0; i < kFastPThresholds.size(); ++i) {
      const double p = kFastPThresholds[i];
      if (p == 0 || (eager && *eager > p)) ++fast_eager[i];
      if (p == 0 || (compile_or_eager && *compile_or_eager > p)) ++fast_compile[i];
    }
  }

  json to_json() const {
    auto rate = [&](double n) { return tasks ? json(n / tasks) : json(); };
    auto geomean = [](double log_sum, int n) { return n ? json(std::exp(log_sum / n)) : json(); };
    json fe = json::object(), fc = json::object();
    for (size_t i = 0; i < kFastPThresholds.size(); ++i) {
      fe[p_key(kFastPThresholds[i])] = rate(fast_eager[i]);
      fc[p_key(kFastPThresholds[i])] = rate(fast_compile[i]);
    }
    // Tasks without a usable speedup add log(1) = 0 to the sum and 1 to the count.
    return {{"tasks", tasks},
            {"passed", passed},
            {"pass_rate", rate(passed)},
            {"passed_not_timed", not_timed},
            {"faster_than_eager", faster_eager},
            {"faster_than_eager_rate", rate(faster_eager)},
            {"faster_than_compile", faster_compile},
            {"faster_than_compile_rate", rate(faster_compile)},
            {"geomean_vs_eager_correct_only", geomean(log_eager, n_eager)},
            {"geomean_vs_compile_correct_only", geomean(log_compile, n_compile)},
            {"geomean_vs_eager_failures_as_1", geomean(log_eager, tasks)},
            {"geomean_vs_compile_failures_as_1", geomean(log_compile, tasks)},
            {"correct_with_speedup_vs_eager", n_eager},
            {"correct_with_speedup_vs_compile", n_compile},
            {"fast_p_eager", fe},
            {"fast_p_compile", fc},
            {"rewards", rewards},
            {"raw_speedup_histogram", raw_bins},
            {"mean_reward", tasks ? json(reward_sum / tasks) : json()},
            {"failures_by_category", failures}};
  }
};

}  // namespace

std::optional<double> number_field(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::string string_field(const nlohmann::json& obj, const char* key, const std::string& fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool is_passing(const nlohmann::json& result) {
  if (!result.is_object()) return false;
  auto ok = result.find("ok");
  auto correct = result.find("correct");
  return ok != result.end() && ok->is_boolean() && ok->get<bool>() && correct != result.end() &&
         correct->is_boolean() && correct->get<bool>();
}

std::optional<double> usable_speedup(const nlohmann::json& result, const char* key) {
  std::optional<double> s = number_field(result, key);
  if (s && *s > 0) return s;
  return std::nullopt;
}

double speedup_margin(const nlohmann::json& result) {
  if (!result.is_object() || !result.contains("options")) return 0.05;
  return number_field(result.at("options"), "speedup_margin").value_or(0.05);
}

std::string level_key(const nlohmann::json& result) {
  if (!result.is_object() || !result.contains("level")) return "unknown";
  const json& l = result.at("level");
  if (l.is_number_integer()) return std::to_string(l.get<long long>());
  if (l.is_number_float()) {
    const double v = l.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  }
  if (l.is_string()) {
    const std::string s = l.get<std::string>();
    if (!s.empty() && s.size() < 16 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::to_string(std::stoll(s));
  }
  return "unknown";
}

std::string result_label(const nlohmann::json& result) {
  if (is_passing(result)) return "pass";
  const std::string category = string_field(result, "category");
  if (!category.empty()) return category;
  const bool ok = result.is_object() && result.contains("ok") && result.at("ok").is_boolean() && result.at("ok").get<bool>();
  return ok ? "not_verified" : "unknown";
}

bool mark_degenerate(nlohmann::json& result, bool flagged) {
  const nlohmann::json check = result.is_object() ? result.value("task_check", nlohmann::json::object()) : nlohmann::json();
  const bool degenerate = flagged || (check.is_object() && check.value("degenerate", false));
  result["degenerate"] = degenerate;
  return degenerate;
}

std::vector<std::string> sorted_level_keys(const nlohmann::json& levels) {
  std::vector<std::string> keys;
  if (levels.is_object())
    for (auto it = levels.begin(); it != levels.end(); ++it) keys.push_back(it.key());
  auto numeric = [](const std::string& k) {
    return !k.empty() && k.size() < 16 && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    const bool na = numeric(a), nb = numeric(b);
    if (na != nb) return na;
    if (na) return std::stoll(a) < std::stoll(b);
    return a < b;
  });
  return keys;
}

nlohmann::json metric_conventions() {
  return {
      {"passing", "ok == true and correct == true; failed, wrong, missing and unverified results are not passing"},
      {"denominator", "every rate and fast_p value is over ALL tasks of the level (or run); failed and missing tasks "
                      "count as not passing and not faster"},
      {"faster", "speedup > 1 + margin (strictly), margin = the result's options.speedup_margin (default 0.05), as in "
                 "the reward; a speedup counts only when it is a finite number > 0"},
      {"not_timed", "passed_not_timed counts passing results that were verified only (mode verify: a run without a "
                    "GPU); they have no speedup, count as not faster, and the report marks their speed columns "
                    "'not timed' instead of showing 0%"},
      {"faster_than_compile", "where torch.compile was not timed for a passing result (speedup_vs_compile null), it "
                              "counts as faster than compile iff it is faster than eager, as in the reward"},
      {"geomean_correct_only", "geometric mean over the passing results that have that speedup (null if none)"},
      {"geomean_failures_as_1", "geometric mean over ALL tasks; a task that is not passing, or a passing one without "
                                "that speedup (e.g. torch.compile not timed), counts as 1.0x (fallback to PyTorch)"},
      {"fast_p", "KernelBench fast_p: (passing tasks with speedup > p) / ALL tasks; fast_0 = pass rate (every passing "
                 "task counts at p = 0); the compile curve uses speedup_vs_eager where torch.compile was not timed"},
      {"rewards", "a reward that is not a number counts as -1; milestone values -1/1/2/3 are counted, non-failed "
                  "raw_speedup rewards are binned in raw_speedup_histogram ([lo, hi) bins); mean_reward is over ALL "
                  "tasks"},
      {"failures", "failures_by_category counts results that are not passing by category (not_verified: ok without "
                   "correct == true; unknown: no category)"}};
}

nlohmann::json compute_metrics(const nlohmann::json& results) {
  CA_CHECK(results.is_array(), "compute_metrics: results must be a JSON array of result objects, got {}",
           results.type_name());
  Tally overall;
  std::map<std::string, Tally> levels;
  json excluded = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const json& r = results[i];
    CA_CHECK(r.is_object(), "compute_metrics: results[{}] must be a result object (results/<id>.json), got {}", i,
             r.type_name());
    // Degenerate tasks (a zeros kernel could pass them) are reported, not scored.
    if (r.value("degenerate", false)) {
      excluded.push_back(string_field(r, "task_id", fmt::format("results[{}]", i)));
      continue;
    }
    overall.add(r);
    levels[level_key(r)].add(r);
  }
  json by_level = json::object();
  for (const auto& [key, tally] : levels) by_level[key] = tally.to_json();
  return {{"overall", overall.to_json()}, {"levels", by_level}, {"excluded_degenerate", excluded},
          {"conventions", metric_conventions()}};
}

}  // namespace cuda_agent::bench
