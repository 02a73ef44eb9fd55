#include "cuda_agent/rl/ablation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cuda_agent/bench/svg_plot.h"
#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/stop_request.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/lm/lm.h"
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
  CA_CHECK(options.parallel >= 1, "ablate: --parallel {} trains no variant: give 1 (one at a time) or more",
           options.parallel);
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
  // Steps whose episodes could not be scored (their task could not be evaluated: masked) take no
  // update: a variant none of whose steps updated compares nothing.
  int64_t updated = 0, masked = 0;
  for (const json* r : steps) {
    updated += r->value("update_skipped", false) ? 0 : 1;
    masked += r->value("episodes_task_fault", int64_t{0});
  }
  s["updated_steps"] = updated;
  s["episodes_masked"] = masked;
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
    // A step's mean over a few episodes moves by a whole task's reward over their count: a fall is
    // a collapse only beyond twice the standard error of the two quarters' difference, where the
    // steps recorded their episodes' spread (reward_std, two episodes or more a step).
    std::vector<const json*> scored;
    for (const json* r : steps)
      if (r->contains("reward_mean") && (*r)["reward_mean"].is_number()) scored.push_back(r);
    auto variance_of_mean = [&](size_t begin, size_t end) {
      double v = 0;
      for (size_t i = begin; i < end; ++i) {
        const double n = scored[i]->value("episodes", 0.0), sd = scored[i]->value("reward_std", -1.0);
        if (n < 2 || sd < 0) return -1.0;
        v += sd * sd / n;
      }
      return v / static_cast<double>((end - begin) * (end - begin));
    };
    const double v_first = variance_of_mean(0, quarter),
                 v_last = variance_of_mean(rewards.size() - quarter, rewards.size());
    const double noise = v_first < 0 || v_last < 0 ? 0.0 : 2 * std::sqrt(v_first + v_last);
    if (v_first >= 0 && v_last >= 0) s["reward_fall_noise"] = noise;
    if (last < first - kRewardFallMargin) {
      if (last < first - noise) {
        s["collapse"].push_back("reward_falling");
      } else {
        s["reward_fall_within_noise"] = first - last;
      }
    }
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
    const int64_t steps = s["ppo_steps"].get<int64_t>(), updated = s.value("updated_steps", steps),
                  masked = s.value("episodes_masked", int64_t{0});
    std::string steps_cell = std::to_string(steps);
    if (updated < steps || masked > 0)
      steps_cell += fmt::format(" ({} updated; {} episode(s) masked)", updated, masked);
    if (steps > 0 && updated == 0) collapse = "inconclusive: no step updated";
    if (collapse.empty() && s.contains("reward_fall_within_noise"))
      collapse = fmt::format("none (a fall of {:.2f}, within the noise {:.2f})",
                             s["reward_fall_within_noise"].get<double>(), s["reward_fall_noise"].get<double>());
    md += fmt::format("| {} | {} | {} | {} -> {} ({}) | {} | {} | {} -> {} | {} |\n", v.name, v.config_file.string(),
                      steps_cell, number_or_dash(s, "reward_first"), number_or_dash(s, "reward_last"),
                      number_or_dash(s, "reward_best"), number_or_dash(s, "pass_rate_last", 0, true),
                      number_or_dash(s, "faster_than_compile_rate_last", 0, true),
                      number_or_dash(s, "response_length_first", 0), number_or_dash(s, "response_length_last", 0),
                      collapse.empty() ? "none" : collapse);
  }
  md += fmt::format(
      "\nEach variant trained the base recipe with its ablation file applied, the same seed and scale. The columns "
      "are over the PPO stage's steps (the warm-up's where a variant has no PPO stage): mean reward of the first and "
      "last step (and the best), and the last step's pass rate, faster-than-torch.compile rate and mean response "
      "length. Collapse: reward_falling when the last quarter of the steps averages more than {} below the first "
      "quarter and the fall is beyond twice its standard error (from the steps' episode counts and reward_std; a "
      "smaller fall shows as within the noise); length_blowup when the last response is more than {}x the first and {} "
      "tokens longer. An episode "
      "whose task could not be evaluated (task_too_large on a GPU short of memory, a reference that fails) is "
      "masked: a step with no usable episode takes no update, and a variant none of whose steps updated is "
      "inconclusive. Charts: plots/reward.svg, pass_rate.svg, faster_than_compile.svg, response_length.svg.\n",
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

// How long a variant's process may take to stop at a safe point once asked (SIGTERM), before it
// is killed: it goes on from its last checkpoint either way.
constexpr double kVariantStopGraceS = 60.0;

// The episodes a variant's process runs at once when `at_once` processes train beside each other
// on one GPU: its config's rollout.concurrent_episodes shared out among them (rounded up). The
// GPU's lock orders every evaluation, so more episodes in flight than one run's only queue
// longer for it: the agent's verify.sh and profile.sh then spend their Bash timeout waiting
// (seen on the H200 with five variants of four episodes each). Each episode's seed does not
// depend on it, so a variant samples the same episodes.
int episodes_at_once(int concurrent, size_t at_once) {
  const int n = static_cast<int>(std::max<size_t>(at_once, 1));
  return std::max(1, (concurrent + n - 1) / n);
}

bool sets_key(const std::vector<std::string>& sets, const std::string& key) {
  return std::any_of(sets.begin(), sets.end(), [&](const std::string& s) { return s.rfind(key + "=", 0) == 0; });
}

// The command that trains the variant `name` alone, in a process of its own, as this call would,
// beside `processes` - 1 other such processes on its GPU; `concurrent`: its
// rollout.concurrent_episodes there (0: the config's, or the caller's --set).
std::vector<std::string> variant_command(const AblationOptions& o, const std::string& name, int concurrent,
                                         size_t processes) {
  std::vector<std::string> argv = {self_executable(),
                                   "ablate",
                                   "--config",
                                   o.base_config.string(),
                                   "--ablations",
                                   o.ablations_dir.string(),
                                   "--output",
                                   o.output_dir.string(),
                                   "--variants",
                                   name,
                                   "--device",
                                   o.train.device,
                                   "--gpu",
                                   std::to_string(o.train.gpu),
                                   "--skill",  // an empty value (no skill file) as its own argument
                                   o.train.skill_file.string(),
                                   "--train-only",
                                   "--shared-gpu",
                                   "--gpu-processes",
                                   std::to_string(processes)};
  for (const std::string& set : o.set_overrides) argv.insert(argv.end(), {"--set", set});
  if (concurrent > 0) argv.insert(argv.end(), {"--set", fmt::format("rollout.concurrent_episodes={}", concurrent)});
  return argv;
}

// Why the process that trained `name` failed: its own "[ablate] variant NAME failed: ..." line
// where its log has one, else how the process ended and the log's last lines.
std::string variant_process_error(const std::string& name, const fs::path& log_path, const SubprocessResult& r) {
  std::string text;
  try {
    text = read_file(log_path);
  } catch (const std::exception&) {
  }
  const std::string marker = "[ablate] variant " + name + " failed: ";
  const size_t at = text.rfind(marker);
  if (at != std::string::npos) {
    const size_t begin = at + marker.size();
    return text.substr(begin, text.find('\n', begin) - begin);
  }
  const std::string tail = text.size() > 1500 ? text.substr(text.size() - 1500) : text;
  return fmt::format("its process {} (log {}): ...{}", r.describe(), log_path.string(), tail);
}

// Trains `names` in processes of their own, up to options.parallel at once, each logging to
// OUTPUT/logs/NAME.log, each running `concurrent` (name: its config's
// rollout.concurrent_episodes) shared out by episodes_at_once; a stop request (stop_signal) stops
// them. Returns each variant's error, "" for those whose process succeeded.
std::map<std::string, std::string> train_in_processes(const AblationOptions& options,
                                                      const std::vector<std::string>& names,
                                                      const std::map<std::string, int>& concurrent, std::ostream& log) {
  const size_t workers = std::min<size_t>(static_cast<size_t>(std::max(1, options.parallel)), names.size());
  const fs::path logs = options.output_dir / "logs";
  fs::create_directories(logs);
  std::mutex mutex;  // guards errors and log
  std::map<std::string, std::string> errors;
  std::atomic<size_t> next{0};
  std::atomic<bool> cancel{false};
  std::atomic<size_t> finished{0};
  const auto work = [&] {
    for (size_t i = next++; i < names.size(); i = next++) {
      const std::string& name = names[i];
      const fs::path log_path = logs / (name + ".log");
      std::string error;
      if (cancel) {
        error = "not started: a stop was requested";
      } else {
        try {  // (nothing may leave the thread)
          SubprocessOptions sp;
          const auto c = concurrent.find(name);
          // (a --set of the caller's wins)
          const int episodes = c == concurrent.end() || sets_key(options.set_overrides, "rollout.concurrent_episodes")
                                   ? 0
                                   : episodes_at_once(c->second, workers);
          sp.argv = variant_command(options, name, episodes, workers);
          sp.stdout_path = sp.stderr_path = log_path.string();
          sp.cancel = &cancel;
          sp.kill_grace_s = kVariantStopGraceS;
          {
            std::lock_guard<std::mutex> lock(mutex);
            log << fmt::format("[ablate] {} starts in a process of its own (its log: {}){}\n", name, log_path.string(),
                               episodes > 0 ? fmt::format(", {} episode(s) at once", episodes) : "");
          }
          const SubprocessResult r = run_subprocess(sp);
          if (!r.ok()) error = variant_process_error(name, log_path, r);
          std::lock_guard<std::mutex> lock(mutex);
          log << fmt::format("[ablate] {} {} after {:.0f} s\n", name, error.empty() ? "finished" : "failed", r.wall_s);
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      errors[name] = error;
    }
    ++finished;
  };
  std::vector<std::thread> threads;
  for (size_t k = 0; k < workers; ++k) threads.emplace_back(work);
  while (finished < workers) {
    if (stop_signal() != 0) cancel = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : threads) t.join();
  throw_if_stop_requested("training the variants in processes of their own");
  return errors;
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
  const auto prefix_dir = [&](const std::string& level) { return options.output_dir / ("." + level + "-prefix"); };
  // A prefix is used when several variants of this call share it, or an earlier call (or this
  // call's parent, for a variant trained in a process of its own) left it.
  const auto prefix_used = [&](const std::string& level) {
    return sharing[level] >= 2 || latest_checkpoint(prefix_dir(level)).step >= 0;
  };
  // A run in this process; its models are gone when it returns, and what they left cached goes
  // back to the driver, for the runs after it and the variants' processes (on one H100 this
  // process kept 33 GiB of the shared stages' beside five variants, whose evaluations then found
  // no room).
  const auto train_here = [&](const json& config) {
    try {
      run_training(config, train, log);
    } catch (...) {
      if (train.device == "cuda") lm::release_cached_gpu_memory();
      throw;
    }
    if (train.device != "cuda") return;
    const int64_t released = lm::release_cached_gpu_memory();
    if (released > 0)
      log << fmt::format("[ablate] {:.2f} GiB of cached GPU memory given back\n",
                         static_cast<double>(released) / (1 << 30));
  };
  std::function<fs::path(const std::string&)> ready_prefix = [&](const std::string& level) {
    const fs::path dir = prefix_dir(level);
    if (latest_checkpoint(dir).step >= 0) return dir;
    if (level == "rft" && sharing["sft"] >= 2) {
      const fs::path sft = ready_prefix("sft");
      fs::remove_all(dir);
      fs::copy(sft, dir, fs::copy_options::recursive);
    }
    log << fmt::format("[ablate] the {}, once for the variants that share it\n", prefix_words(level));
    train_here(prefix_config(base, level, dir));
    return dir;
  };
  std::vector<std::string> to_train;
  for (const AblationVariant& v : variants)
    if (trained(v)) to_train.push_back(v.name);
  std::map<std::string, std::string> process_errors;
  const bool in_processes = options.parallel > 1 && to_train.size() > 1;
  if (in_processes) {
    for (const std::string& level : kPrefixLevels)
      if (sharing[level] >= 2) ready_prefix(level);
    log << fmt::format("[ablate] {} variants, up to {} at once in processes of their own\n", to_train.size(),
                       options.parallel);
    std::map<std::string, int> concurrent;
    for (const AblationVariant& v : variants) concurrent[v.name] = v.config["rollout"].value("concurrent_episodes", 1);
    process_errors = train_in_processes(options, to_train, concurrent, log);
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    AblationVariant& v = variants[i];
    const fs::path metrics = options.output_dir / v.name / "metrics.jsonl";
    if (in_processes && trained(v)) {
      v.error = process_errors[v.name];
      v.ok = v.error.empty();
      if (v.ok && !fs::exists(metrics)) v.ok = false, v.error = "its process wrote no " + metrics.string();
      if (!v.ok) log << fmt::format("[ablate] variant {} failed: {}\n", v.name, v.error);
      v.summary = summarize_variant(fs::exists(metrics) ? MetricsLog::read(metrics) : std::vector<json>{});
      continue;
    }
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
        if (!prefix_used(level) || !shares_prefix(base, v.config, level) || latest_checkpoint(run_dir).step >= 0)
          continue;
        const fs::path shared = ready_prefix(level);
        if (latest_checkpoint(shared).step < 0) break;
        fs::remove_all(run_dir);
        fs::create_directories(run_dir.parent_path());
        fs::copy(shared, run_dir, fs::copy_options::recursive);
        log << fmt::format("[ablate] {} starts from the shared {} ({})\n", v.name, prefix_words(level), shared.string());
        break;
      }
      train_here(v.config);
      v.ok = true;
    } catch (const StopRequested&) {
      throw;
    } catch (const std::exception& e) {
      v.error = e.what();
      log << fmt::format("[ablate] variant {} failed: {}\n", v.name, v.error);
    }
    v.summary = summarize_variant(fs::exists(metrics) ? MetricsLog::read(metrics) : std::vector<json>{});
  }
  for (const AblationVariant& v : variants)
    if (v.ok && v.summary.value("ppo_steps", int64_t{0}) > 0 && v.summary.value("updated_steps", int64_t{1}) == 0)
      log << fmt::format(
          "[ablate] variant {}: none of its {} PPO steps updated ({} episode(s) masked: their task could not be "
          "evaluated; its log says why): its row compares nothing\n",
          v.name, v.summary["ppo_steps"].get<int64_t>(), v.summary["episodes_masked"].get<int64_t>());
  if (!options.write_comparison) return variants;
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
