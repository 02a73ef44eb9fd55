#include "cuda_agent/bench/bench_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/report.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/progress.h"
#include "cuda_agent/sandbox/baseline_cache.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

std::string fmt_ms(const nlohmann::json& timing) {
  if (!timing.is_object() || !timing.contains("median_ms")) return "-";
  return fmt::format("{:.3f}", timing["median_ms"].get<double>());
}

std::string category_name(const nlohmann::json& r) {
  const nlohmann::json c = r.value("category", nlohmann::json());
  return c.is_string() ? c.get<std::string>() : "unknown";
}

std::string fmt_x(const nlohmann::json& v) { return v.is_number() ? fmt::format("{:.2f}x", v.get<double>()) : "-"; }

// A result of an earlier run of the same task file, solution and options (resume), not one that
// failed for the machine's sake; none where options.resume is off or there is no solution.
std::optional<nlohmann::json> reusable_result(const BenchOptions& options, const TaskEntry& task,
                                              const sandbox::SandboxOptions& task_options,
                                              const std::optional<fs::path>& solution, const fs::path& result_file) {
  if (!options.resume || !solution || !fs::exists(result_file)) return std::nullopt;
  try {
    auto previous = nlohmann::json::parse(read_file(result_file));
    if (previous.value("task_sha256", "") == file_sha256(task.path) &&
        previous.value("solution_sha256", "") == sandbox::solution_fingerprint(solution->string()) &&
        previous.value("options", nlohmann::json()) == task_options.to_json() &&
        previous.value("category", nlohmann::json()) !=
            nlohmann::json(sandbox::to_string(sandbox::Category::kInfrastructure)))
      return previous;
  } catch (...) {
  }
  return std::nullopt;
}

sandbox::SandboxOptions options_of(const BenchOptions& options, const TaskEntry& task) {
  sandbox::SandboxOptions o = options.sandbox;
  apply_task_options(o, task);
  return o;
}

// One task of the split: a reused result (resume) or a fresh evaluation, written to
// results_dir/<id>.json.
nlohmann::json evaluate_task(const BenchOptions& options, const TaskEntry& task, int gpu, const fs::path& results_dir,
                             bool* reused) {
  const fs::path result_file = results_dir / (task.id + ".json");
  const sandbox::SandboxOptions task_options = options_of(options, task);
  sandbox::EvalRequest req;
  req.task_path = task.path.string();
  req.task_id = task.id;
  req.gpu = gpu;
  req.device = options.device;
  req.gpu_lock = options.gpu_lock;  // GPU phases and timed runs one at a time (BenchOptions::workers_per_gpu)
  req.options = task_options;
  req.mode = options.mode;
  nlohmann::json result;
  *reused = false;
  if (options.mode == sandbox::EvalMode::kBaselines) {
    result = sandbox::evaluate(req).to_json();  // the baseline cache makes a repeat cheap
  } else {
    auto solution = find_solution(options.solutions, task.id);
    if (auto previous = reusable_result(options, task, task_options, solution, result_file)) {
      *reused = true;
      (*previous)["level"] = task.level;
      return *previous;
    }
    if (!solution) {
      result = {{"task_id", task.id}, {"task_path", task.path.string()}, {"ok", false},
                {"category", "missing_solution"}, {"correct", nullptr}, {"reward", -1.0},
                {"message", fmt::format("no {}/{}/model_new.py or {}/{}.py", options.solutions.string(), task.id,
                                        options.solutions.string(), task.id)},
                {"options", task_options.to_json()}};
    } else {
      req.solution_path = solution->string();
      result = sandbox::evaluate(req).to_json();
    }
  }
  result["level"] = task.level;
  // Flagged in the split, or found by verify's task check: reported, excluded from the scores.
  mark_degenerate(result, task.degenerate);
  write_file_atomic(result_file, result.dump(2));
  return result;
}

}  // namespace

nlohmann::json summarize(const nlohmann::json& results) {
  // The overall row of the report's metrics, in the summary's field names.
  const nlohmann::json o = compute_metrics(results)["overall"];
  auto number_or_zero = [&](const char* key) { return o[key].is_number() ? o[key].get<double>() : 0.0; };
  return {{"tasks", o["tasks"]},
          {"passed", o["passed"]},
          {"pass_rate", number_or_zero("pass_rate")},
          {"faster_than_eager", o["faster_than_eager"]},
          {"faster_than_eager_rate", number_or_zero("faster_than_eager_rate")},
          {"faster_than_compile", o["faster_than_compile"]},
          {"faster_than_compile_rate", number_or_zero("faster_than_compile_rate")},
          {"mean_reward", number_or_zero("mean_reward")},
          {"geomean_speedup_vs_eager", o["geomean_vs_eager_correct_only"]},
          {"geomean_speedup_vs_compile", o["geomean_vs_compile_correct_only"]},
          {"geomean_over", "correct solutions only"},
          {"failures_by_category", o["failures_by_category"]}};
}

// What the baselines were timed under, from the first result that says (its backends report):
// TF32 for matmuls and cuDNN on each side, and the precision policy. Empty when none says.
std::string baseline_settings(const nlohmann::json& results) {
  auto tf32 = [](const nlohmann::json& b) {
    if (!b.is_object()) return std::string("not reported");
    return fmt::format("TF32 {} for matmuls, {} for cuDNN", b.value("matmul_tf32", false) ? "on" : "off",
                       b.value("cudnn_tf32", false) ? "on" : "off");
  };
  for (const auto& r : results) {
    const nlohmann::json backends = r.value("backends", nlohmann::json());
    if (!backends.is_object() || !backends.contains("judge")) continue;
    return fmt::format("precision {}; eager and torch.compile: {}; candidate (as the solution left it): {}",
                       r.value("precision", std::string("?")), tf32(backends["judge"]),
                       tf32(backends.value("candidate", nlohmann::json())));
  }
  return "";
}

std::string format_table(const nlohmann::json& results, const nlohmann::json& summary) {
  std::ostringstream out;
  out << "| task | level | result | reward | eager ms | compile ms | candidate ms | vs eager | vs compile | path |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    const nlohmann::json timings = r.value("timings", nlohmann::json::object());
    std::string status = r.value("ok", false) ? "pass" : category_name(r);
    const double reward = number_field(r, "reward").value_or(-1.0);  // null in baselines-only results
    out << fmt::format("| {} | {} | {} | {:g} | {} | {} | {} | {} | {} | {} |\n", r.value("task_id", "?"),
                       r.value("level", 0), status, reward, fmt_ms(timings.value("eager", nlohmann::json())),
                       fmt_ms(timings.value("compile", nlohmann::json())), fmt_ms(timings.value("candidate", nlohmann::json())),
                       fmt_x(r.value("speedup_vs_eager", nlohmann::json())),
                       fmt_x(r.value("speedup_vs_compile", nlohmann::json())), r.value("build_path", "-"));
  }
  out << fmt::format("\npass {}/{} ({:.1f}%), faster than eager {:.1f}%, faster than torch.compile {:.1f}%, mean reward {:.2f}",
                     summary["passed"].get<int>(), summary["tasks"].get<int>(), 100 * summary["pass_rate"].get<double>(),
                     100 * summary["faster_than_eager_rate"].get<double>(),
                     100 * summary["faster_than_compile_rate"].get<double>(), summary["mean_reward"].get<double>());
  if (summary["geomean_speedup_vs_eager"].is_number())
    out << fmt::format(", geomean speedup {:.2f}x vs eager", summary["geomean_speedup_vs_eager"].get<double>());
  if (summary["geomean_speedup_vs_compile"].is_number())
    out << fmt::format(", {:.2f}x vs torch.compile", summary["geomean_speedup_vs_compile"].get<double>());
  out << " (geomeans over correct solutions)\n";
  if (const std::string settings = baseline_settings(results); !settings.empty())
    out << "timed under: " << settings << "\n";
  for (const auto& r : results)
    if (!r.value("ok", false))
      out << fmt::format("- {}: {}: {}\n", r.value("task_id", "?"), category_name(r), r.value("message", "").substr(0, 300));
  return out.str();
}

std::string format_baselines_table(const nlohmann::json& results) {
  std::ostringstream out;
  out << "| task | level | status | eager ms | compile ms | cached |\n|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    const nlohmann::json timings = r.value("timings", nlohmann::json::object());
    out << fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.value("task_id", "?"), r.value("level", 0),
                       r.value("ok", false) ? "ok" : category_name(r) + ": " + r.value("message", "").substr(0, 120),
                       fmt_ms(timings.value("eager", nlohmann::json())),
                       fmt_ms(timings.value("compile", nlohmann::json())),
                       timings.value("baselines_cached", false) ? "yes" : "no");
  }
  return out.str();
}

// What report.md's header says about the run: the split, the date, and the machine as the
// first result that reached the GPU recorded it.
nlohmann::json run_meta(const Split& split, const nlohmann::json& results, const BenchOptions& options) {
  nlohmann::json meta = {{"split", split.name}, {"run_dir", options.output_dir.string()}};
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  meta["date"] = date;
  if (const std::string settings = baseline_settings(results); !settings.empty()) meta["timed_under"] = settings;
  for (const auto& r : results) {
    if (r.contains("device") && r["device"].is_object()) {
      meta["gpu"] = r["device"].value("name", "");
      if (r.contains("versions") && r["versions"].is_object()) meta["torch_version"] = r["versions"].value("torch", "");
      break;
    }
  }
  return meta;
}

void time_baselines_first(BenchOptions options, const Split& split, std::ostream& progress, const std::string& tag) {
  if (options.device != "cuda") return;
  if (!options.sandbox.use_baseline_cache) {
    progress << tag << " the scoring cache is off (sandbox.use_baseline_cache): each evaluation times its baselines\n";
    return;
  }
  // A judge that finds a task's baselines cached still takes the GPU's lock (and starts Python):
  // only the tasks the cache lacks are timed.
  options.only_tasks.clear();
  for (const TaskEntry& task : split.tasks)
    if (!sandbox::baselines_cached(task.path, options_of(options, task))) options.only_tasks.push_back(task.id);
  const size_t cached = split.tasks.size() - options.only_tasks.size();
  if (split.tasks.empty()) {
    progress << tag << " no task to evaluate: no baselines to time first\n";
    return;
  }
  if (options.only_tasks.empty()) {
    progress << fmt::format("{} baselines of the {} task(s) to evaluate found in the scoring cache\n", tag,
                            split.tasks.size());
    return;
  }
  progress << fmt::format("{} baselines of {} task(s) first ({} found in the scoring cache)\n", tag,
                          options.only_tasks.size(), cached);
  options.mode = sandbox::EvalMode::kBaselines;
  run_bench(options, progress);
}

nlohmann::json run_bench(const BenchOptions& options, std::ostream& progress) {
  // Own splits, KernelBench folders, and Ops-6K style rows (imported beside the run).
  Split split = load_any_split(options.split, options.output_dir / "imported");
  if (!options.only_tasks.empty())
    std::erase_if(split.tasks, [&](const TaskEntry& task) {
      return std::find(options.only_tasks.begin(), options.only_tasks.end(), task.id) == options.only_tasks.end();
    });
  if (options.mode != sandbox::EvalMode::kBaselines)
    CA_CHECK(fs::is_directory(options.solutions), "solutions folder {} does not exist", options.solutions.string());
  CA_CHECK(!options.gpus.empty(), "no GPUs to run on: pass --gpus 0,1,...");
  if (options.mode == sandbox::EvalMode::kEvaluate && options.device == "cuda") {
    if (options.baselines_first) {
      // The tasks this run evaluates: not those without a solution (nothing to time against),
      // nor those whose earlier result it reuses.
      Split to_evaluate = split;
      std::erase_if(to_evaluate.tasks, [&](const TaskEntry& task) {
        const auto solution = find_solution(options.solutions, task.id);
        return !solution || reusable_result(options, task, options_of(options, task), solution,
                                            options.output_dir / "results" / (task.id + ".json"));
      });
      BenchOptions b = options;
      b.output_dir = options.output_dir / "baselines";
      time_baselines_first(std::move(b), to_evaluate, progress, "[bench]");
    } else {
      progress << "[bench] baselines timed where an evaluation needs them (--baselines lazy)\n";
    }
  }
  const fs::path results_dir = options.output_dir / "results";
  fs::create_directories(results_dir);
  write_file_atomic(options.output_dir / "manifest.json", split_manifest(split).dump(2));

  // Before any solution runs beside another's start-up (sandbox.confine auto).
  if (options.mode != sandbox::EvalMode::kBaselines) {
    const std::string confinement =
        sandbox::settle_confinement(options.sandbox, options.device, options.gpus.front(), options.gpu_lock);
    if (!confinement.empty()) progress << "[bench] " << confinement << "\n";
  }
  std::vector<nlohmann::json> results(split.tasks.size());
  std::atomic<size_t> next{0};
  ProgressReporter reporter(progress, split.tasks.size(), "eval", options.interactive_progress);

  auto work = [&](int gpu) {
    for (size_t i = next++; i < split.tasks.size(); i = next++) {
      const TaskEntry& task = split.tasks[i];
      bool reused = false;
      nlohmann::json result = evaluate_task(options, task, gpu, results_dir, &reused);
      results[i] = result;
      const nlohmann::json reward = result.value("reward", nlohmann::json());
      reporter.step(fmt::format("{} (gpu {}): {}, reward {}{}", task.id, gpu,
                                result.value("ok", false) ? "pass" : category_name(result),
                                reward.is_number() ? fmt::format("{:g}", reward.get<double>()) : "-",
                                reused ? " [cached]" : ""));
    }
  };
  CA_CHECK(options.workers_per_gpu >= 1, "workers per GPU must be at least 1, not {}", options.workers_per_gpu);
  std::vector<std::thread> threads;
  for (int w = 0; w < options.workers_per_gpu; ++w)
    for (int gpu : options.gpus) threads.emplace_back(work, gpu);
  for (auto& t : threads) t.join();

  nlohmann::json all = nlohmann::json::array();
  for (auto& r : results) all.push_back(r);
  if (options.mode == sandbox::EvalMode::kBaselines) {
    // No solutions were scored: the summary counts timed tasks, not pass rates.
    int timed = 0;
    for (const auto& r : all) timed += r.value("ok", false) ? 1 : 0;
    nlohmann::json summary = {{"tasks", all.size()}, {"timed", timed}, {"failed", static_cast<int>(all.size()) - timed}};
    write_file_atomic(options.output_dir / "summary.json", nlohmann::json{{"split", split.name}, {"summary", summary}}.dump(2));
    write_file_atomic(options.output_dir / "results.md", format_baselines_table(all));
    return {{"split", split.name}, {"results", all}, {"summary", summary}};
  }
  nlohmann::json summary = summarize(all);
  write_file_atomic(options.output_dir / "summary.json", nlohmann::json{{"split", split.name}, {"summary", summary}}.dump(2));
  write_file_atomic(options.output_dir / "results.md", format_table(all, summary));
  write_report(options.output_dir, all, run_meta(split, all, options));
  return {{"split", split.name}, {"results", all}, {"summary", summary}};
}

}  // namespace cuda_agent::bench
