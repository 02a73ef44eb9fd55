#include "cuda_agent/rl/ablation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cuda_agent/bench/svg_plot.h"
#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/stop_request.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cuda_agent::rl {
namespace {

constexpr double kRewardFallMargin = 0.25;
constexpr double kLengthBlowupFactor = 2.0;
constexpr double kLengthBlowupTokens = 64.0;

// The mean of `values` from index `begin` (inclusive) to `end` (exclusive).
double mean_of(const std::vector<double>& values, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += values[i];
  return sum / static_cast<double>(end - begin);
}

// summary[key] with `decimals` decimals ("-" when absent); a share as a whole percentage.
std::string number_or_dash(const json& summary, const char* key, int decimals = 2, bool percent = false) {
  const json v = summary.value(key, json());
  if (!v.is_number()) return "-";
  return percent ? fmt::format("{:.0f}%", 100 * v.get<double>()) : fmt::format("{:.{}f}", v.get<double>(), decimals);
}

// "base, no_rft, ...": the variants' names.
std::string names_of(const std::vector<AblationVariant>& variants) {
  std::string names;
  for (const AblationVariant& v : variants) names += (names.empty() ? "" : ", ") + v.name;
  return names;
}

// The four per-step charts of the comparison, one curve per variant that has the metric.
void write_plots(const std::vector<AblationVariant>& variants, const fs::path& dir) {
  struct Chart {
    const char* key;
    const char* file;
    const char* title;
    const char* y_label;
    bool fraction;
  };
  const std::vector<Chart> charts = {
      {"reward", "reward.svg", "Mean reward per PPO step", "reward", false},
      {"pass_rate", "pass_rate.svg", "Pass rate per PPO step", "share of episodes", true},
      {"faster_than_compile_rate", "faster_than_compile.svg", "Faster than torch.compile, per PPO step",
       "share of episodes", true},
      {"response_length", "response_length.svg", "Response length per PPO step", "tokens per episode", false},
  };
  for (const Chart& chart : charts) {
    std::vector<bench::Curve> curves;
    for (const AblationVariant& v : variants) {
      const json series = v.summary.value("per_step", json::object()).value(chart.key, json::array());
      bench::Curve c{v.name, {}};
      for (const json& p : series) c.points.emplace_back(p[0].get<double>(), p[1].get<double>());
      if (!c.points.empty()) curves.push_back(std::move(c));
    }
    if (curves.empty()) continue;
    fs::create_directories(dir);
    write_file_atomic(dir / chart.file, chart.fraction
                                            ? bench::fraction_curves_svg(curves, chart.title, "PPO step", chart.y_label)
                                            : bench::line_chart_svg(curves, chart.title, "PPO step", chart.y_label));
  }
}

}  // namespace

std::vector<AblationVariant> ablation_variants(const AblationOptions& options) {
  CA_CHECK(fs::is_regular_file(options.base_config), "ablate: no base config {}: give --config, e.g. "
           "configs/learning.yaml", options.base_config.string());
  CA_CHECK(fs::is_directory(options.ablations_dir), "ablate: no ablations folder {}: give --ablations, e.g. "
           "configs/ablations", options.ablations_dir.string());
  const json base_yaml = load_yaml_file(options.base_config);
  std::vector<std::pair<std::string, fs::path>> files = {{"base", options.base_config}};
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(options.ablations_dir))
    if (e.is_regular_file() && e.path().extension() == ".yaml") found.push_back(e.path());
  std::sort(found.begin(), found.end());
  CA_CHECK(!found.empty(), "ablate: {} holds no *.yaml ablation", options.ablations_dir.string());
  for (const fs::path& f : found) {
    CA_CHECK(f.stem() != "base", "ablate: {}: 'base' names the base recipe; rename the file", f.string());
    files.emplace_back(f.stem().string(), f);
  }

  std::vector<AblationVariant> variants;
  for (const auto& [name, file] : files) {
    AblationVariant v;
    v.name = name;
    v.config_file = file;
    json config = train_config_defaults();
    merge_checked(config, base_yaml, options.base_config.string());
    if (name != "base") {
      json ablation = load_yaml_file(file);
      if (ablation.is_object()) {
        ablation.erase("model");  // a placeholder actor: the base names the model
        ablation.erase("run");    // the paper-scale output folder: each variant gets its own
      }
      merge_checked(config, ablation, file.string());
    }
    for (const std::string& assignment : options.set_overrides) apply_override(config, assignment);
    config["run"]["output_dir"] = (options.output_dir / name).string();
    try {
      validate_train_config(config);
    } catch (const Error& e) {
      CA_FAIL("ablate: variant {} ({}): {}", name, file.string(), e.what());
    }
    v.config = std::move(config);
    variants.push_back(std::move(v));
  }
  for (const std::string& name : options.only) {
    if (std::any_of(variants.begin(), variants.end(), [&](const AblationVariant& v) { return v.name == name; }))
      continue;
    CA_FAIL("ablate --variants: no variant '{}': the variants are {} (base and the stems of {}'s *.yaml)", name,
            names_of(variants), options.ablations_dir.string());
  }
  return variants;
}

json summarize_variant(const std::vector<json>& records) {
  std::vector<const json*> steps;
  for (const char* stage : {"ppo", "warmup"}) {
    for (const json& r : records)
      if (r.value("stage", "") == stage) steps.push_back(&r);
    if (!steps.empty()) break;
  }
  json per_step = {{"reward", json::array()}, {"pass_rate", json::array()}, {"faster_than_compile_rate", json::array()},
                   {"response_length", json::array()}};
  json s = {{"steps", records.size()}, {"ppo_steps", steps.size()}, {"collapse", json::array()}};
  if (!steps.empty()) s["stage"] = (*steps.front())["stage"];
  for (const json* r : steps) {
    const double x = r->value("step_in_stage", 0.0);
    for (const auto& [key, series] : std::vector<std::pair<const char*, const char*>>{
             {"reward_mean", "reward"},
             {"pass_rate", "pass_rate"},
             {"faster_than_compile_rate", "faster_than_compile_rate"},
             {"response_length_mean", "response_length"}})
      if (r->contains(key) && (*r)[key].is_number()) per_step[series].push_back({x, (*r)[key].get<double>()});
  }
  s["per_step"] = per_step;
  auto values = [&](const char* series) {
    std::vector<double> v;
    for (const json& p : per_step[series]) v.push_back(p[1].get<double>());
    return v;
  };
  const std::vector<double> rewards = values("reward"), lengths = values("response_length");
  auto last_of = [&](const char* series) { return per_step[series].empty() ? json() : per_step[series].back()[1]; };
  if (!rewards.empty()) {
    s["reward_first"] = rewards.front();
    s["reward_last"] = rewards.back();
    s["reward_best"] = *std::max_element(rewards.begin(), rewards.end());
  }
  if (!last_of("pass_rate").is_null()) s["pass_rate_last"] = last_of("pass_rate");
  if (!last_of("faster_than_compile_rate").is_null())
    s["faster_than_compile_rate_last"] = last_of("faster_than_compile_rate");
  if (!lengths.empty()) {
    s["response_length_first"] = lengths.front();
    s["response_length_last"] = lengths.back();
  }
  if (rewards.size() >= 2) {
    const size_t quarter = std::max<size_t>(1, rewards.size() / 4);
    const double first = mean_of(rewards, 0, quarter), last = mean_of(rewards, rewards.size() - quarter, rewards.size());
    if (last < first - kRewardFallMargin) s["collapse"].push_back("reward_falling");
  }
  if (lengths.size() >= 2 && lengths.back() > kLengthBlowupFactor * lengths.front() &&
      lengths.back() - lengths.front() > kLengthBlowupTokens)
    s["collapse"].push_back("length_blowup");
  return s;
}

std::string ablation_markdown(const std::vector<AblationVariant>& variants) {
  std::string md = "# Ablations\n\n"
                   "| variant | config | PPO steps | reward first -> last (best) | pass rate | faster than compile | "
                   "response length first -> last | collapse |\n|---|---|---|---|---|---|---|---|\n";
  for (const AblationVariant& v : variants) {
    if (!v.ok) {
      md += fmt::format("| {} | {} | failed: {} | | | | | |\n", v.name, v.config_file.string(), v.error.substr(0, 300));
      continue;
    }
    const json& s = v.summary;
    std::string collapse;
    for (const json& c : s["collapse"]) collapse += (collapse.empty() ? "" : ", ") + c.get<std::string>();
    md += fmt::format("| {} | {} | {} | {} -> {} ({}) | {} | {} | {} -> {} | {} |\n", v.name, v.config_file.string(),
                      s["ppo_steps"].get<int64_t>(), number_or_dash(s, "reward_first"), number_or_dash(s, "reward_last"),
                      number_or_dash(s, "reward_best"), number_or_dash(s, "pass_rate_last", 0, true),
                      number_or_dash(s, "faster_than_compile_rate_last", 0, true),
                      number_or_dash(s, "response_length_first", 0),
                      number_or_dash(s, "response_length_last", 0), collapse.empty() ? "none" : collapse);
  }
  md += fmt::format(
      "\nEach variant trained the base recipe with its ablation file applied, the same seed and scale. The columns "
      "are over the PPO stage's steps (the warm-up's where a variant has no PPO stage): mean reward of the first and "
      "last step (and the best), and the last step's pass rate, faster-than-torch.compile rate and mean response "
      "length. Collapse: reward_falling when the last quarter of the steps averages more than {} below the first "
      "quarter; length_blowup when the last response is more than {}x the first and {} tokens longer. Charts: "
      "plots/reward.svg, pass_rate.svg, faster_than_compile.svg, response_length.svg.\n",
      kRewardFallMargin, kLengthBlowupFactor, kLengthBlowupTokens);
  return md;
}

namespace {

// The stages a shared prefix runs: "sft" (the supervised warm-up alone) or "rft" (the warm-up,
// the single-turn warm-up where enabled, and RFT).
const std::vector<std::string> kPrefixLevels = {"rft", "sft"};  // deepest first

bool stage_enabled(const json& config, const std::string& stage) {
  return config.value("stages", json::object()).value(stage, json::object()).value("enabled", false);
}

// `config` with only the stages of the prefix `level` enabled, into `run_dir`.
json prefix_config(const json& config, const std::string& level, const fs::path& run_dir) {
  json prefix = config;
  if (level == "sft")
    for (const char* stage : {"warmup", "rft"}) prefix["stages"][stage]["enabled"] = false;
  prefix["stages"]["value_pretrain"]["enabled"] = false;
  prefix["ppo"]["enabled"] = false;
  prefix["run"]["output_dir"] = run_dir.string();
  return prefix;
}

const char* prefix_words(const std::string& level) {
  return level == "sft" ? "supervised warm-up" : "warm-up and RFT";
}

}  // namespace

bool shares_prefix(const json& base, const json& variant, const std::string& level) {
  CA_CHECK(level == "sft" || level == "rft", "unknown prefix level '{}': use sft or rft", level);
  if (!stage_enabled(base, "sft") || !stage_enabled(variant, "sft")) return false;
  if (level == "rft" && (!stage_enabled(base, "rft") || !stage_enabled(variant, "rft") ||
                         stage_enabled(base, "warmup") != stage_enabled(variant, "warmup")))
    return false;
  // The prefix the variant would run must be the base's, but for what a run resumed from the
  // prefix's checkpoint may change (the reward, after the supervised warm-up alone, when that
  // kept every correct demonstration: resume_may_change).
  const json a = prefix_config(base, level, "prefix"), b = prefix_config(variant, level, "prefix");
  return config_differences(a, b, resume_may_change(a, level)).empty();
}

bool shares_sft_prefix(const json& base, const json& variant) { return shares_prefix(base, variant, "sft"); }

std::vector<AblationVariant> run_ablations(const AblationOptions& options, std::ostream& log) {
  std::vector<AblationVariant> variants = ablation_variants(options);
  const auto trained = [&](const AblationVariant& v) {
    return options.only.empty() || std::find(options.only.begin(), options.only.end(), v.name) != options.only.end();
  };
  log << fmt::format("[ablate] {} variants into {}: {}", variants.size(), options.output_dir.string(),
                     names_of(variants));
  if (!options.only.empty()) log << fmt::format(" (training {} in this call)", fmt::join(options.only, ", "));
  log << "\n";
  TrainRunOptions train = options.train;
  train.resume = true;  // a second call continues each variant where it stopped
  // What is the same in several variants runs once, as the base's first stages on their own
  // (OUTPUT/.sft-prefix: the supervised warm-up; OUTPUT/.rft-prefix: that and RFT, itself
  // started from a copy of the first), and each variant that shares it starts from a copy of
  // that folder at its checkpoint: the deepest prefix it shares with at least one other variant.
  const json& base = variants.front().config;
  std::map<std::string, size_t> sharing;
  for (const std::string& level : kPrefixLevels)
    for (const AblationVariant& v : variants)
      sharing[level] += trained(v) && shares_prefix(base, v.config, level) ? 1 : 0;
  std::function<fs::path(const std::string&)> ready_prefix = [&](const std::string& level) {
    const fs::path dir = options.output_dir / ("." + level + "-prefix");
    if (latest_checkpoint(dir).step >= 0) return dir;
    if (level == "rft" && sharing["sft"] >= 2) {
      const fs::path sft = ready_prefix("sft");
      fs::remove_all(dir);
      fs::copy(sft, dir, fs::copy_options::recursive);
    }
    log << fmt::format("[ablate] the {}, once for the variants that share it\n", prefix_words(level));
    run_training(prefix_config(base, level, dir), train, log);
    return dir;
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    AblationVariant& v = variants[i];
    const fs::path metrics = options.output_dir / v.name / "metrics.jsonl";
    if (!trained(v)) {
      v.ok = fs::exists(metrics);
      if (!v.ok)
        v.error = fmt::format("not trained in this call (--variants) and no earlier run in {}",
                              metrics.parent_path().string());
      log << fmt::format("[ablate] variant {} of {}: {}: {}\n", i + 1, variants.size(), v.name,
                         v.ok ? "not trained in this call; its earlier run's metrics are compared" : v.error);
      v.summary = summarize_variant(v.ok ? MetricsLog::read(metrics) : std::vector<json>{});
      continue;
    }
    log << fmt::format("[ablate] variant {} of {}: {} ({})\n", i + 1, variants.size(), v.name, v.config_file.string());
    try {
      const fs::path run_dir = v.config["run"]["output_dir"].get<std::string>();
      for (const std::string& level : kPrefixLevels) {
        if (sharing[level] < 2 || !shares_prefix(base, v.config, level) || latest_checkpoint(run_dir).step >= 0) continue;
        const fs::path shared = ready_prefix(level);
        if (latest_checkpoint(shared).step < 0) break;
        fs::remove_all(run_dir);
        fs::create_directories(run_dir.parent_path());
        fs::copy(shared, run_dir, fs::copy_options::recursive);
        log << fmt::format("[ablate] {} starts from the shared {} ({})\n", v.name, prefix_words(level), shared.string());
        break;
      }
      run_training(v.config, train, log);
      v.ok = true;
    } catch (const StopRequested&) {
      throw;
    } catch (const std::exception& e) {
      v.error = e.what();
      log << fmt::format("[ablate] variant {} failed: {}\n", v.name, v.error);
    }
    v.summary = summarize_variant(fs::exists(metrics) ? MetricsLog::read(metrics) : std::vector<json>{});
  }
  json out = json::array();
  for (const AblationVariant& v : variants)
    out.push_back({{"name", v.name}, {"config_file", v.config_file.string()}, {"ok", v.ok}, {"error", v.error},
                   {"run_dir", v.config["run"]["output_dir"]}, {"summary", v.summary}});
  write_file_atomic(options.output_dir / "comparison.json", out.dump(2));
  write_file_atomic(options.output_dir / "comparison.md", ablation_markdown(variants));
  write_plots(variants, options.output_dir / "plots");
  return variants;
}

}  // namespace cuda_agent::rl
