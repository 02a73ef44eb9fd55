#include "cuda_agent/agent/eval_runner.h"
#include "cuda_agent/agent/policy.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cuda_agent/bench/bench_runner.h"
#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/report.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/progress.h"

namespace fs = std::filesystem;

namespace cuda_agent::agent {

std::string place_policy_on_gpu(const std::string& policy, int gpu) {
  if (policy.rfind("local:", 0) != 0) return policy;
  const size_t q = policy.find('?');
  if (q == std::string::npos) return policy;
  std::string out = policy.substr(0, q + 1);
  size_t pos = q + 1;
  while (pos <= policy.size()) {
    size_t amp = policy.find('&', pos);
    if (amp == std::string::npos) amp = policy.size();
    const std::string item = policy.substr(pos, amp - pos);
    if (pos > q + 1) out += "&";
    out += item == "device=cuda" ? fmt::format("device=cuda:{}", gpu) : item;
    pos = amp + 1;
  }
  return out;
}

nlohmann::json run_eval(const EvalSpec& spec, std::ostream& progress) {
  // A policy that cannot work fails the run before its first episode, as solve does.
  validate_policy_spec(spec.episode.policy);
  bench::Split split = bench::load_any_split(spec.split, spec.output_dir / "imported");
  CA_CHECK(!spec.gpus.empty(), "no GPUs to run on: pass --gpus 0,1,...");
  CA_CHECK(spec.episodes_per_gpu >= 1 && spec.episodes_per_gpu <= 64,
           "episodes per GPU is {}: give 1 to 64", spec.episodes_per_gpu);
  const bool beside_others = spec.episodes_per_gpu > 1;  // (on the CPU the locks order nothing, and cost nothing)
  fs::create_directories(spec.output_dir / "results");
  std::vector<nlohmann::json> results(split.tasks.size());
  if (spec.episode.device == "cuda" && !spec.baselines_first) {
    progress << "[eval] baselines timed where a solution needs them (--baselines lazy)\n";
  } else if (spec.episode.device == "cuda") {
    // Every task's baselines (eager, torch.compile) timed first into the scoring cache, as bench
    // `baselines` does, so that an episode's profile.sh finds them (its tools' cache is seeded
    // from the scoring cache) and its final score does not time them again, under the GPU's lock
    // while the other episodes wait. A judge that finds them still takes the GPU's lock, so none
    // is started when every task has them.
    bench::BenchOptions b;
    b.split = spec.split;
    b.output_dir = spec.output_dir / "baselines";
    b.gpus = spec.gpus;
    b.workers_per_gpu = std::max(spec.episodes_per_gpu, 2);
    b.sandbox = spec.episode.sandbox;
    b.interactive_progress = spec.interactive_progress;
    bench::time_baselines_first(std::move(b), split, progress, "[eval]");
  }
  // One source of policies per GPU, made before any episode starts (a local model is loaded here,
  // once per GPU, and its episodes share it; a model that cannot load fails the run before its
  // first episode).
  std::map<int, PolicySource> sources;
  for (int gpu : spec.gpus)
    if (!sources.count(gpu)) sources[gpu] = make_policy_source(place_policy_on_gpu(spec.episode.policy, gpu));
  // Before any episode's commands run beside another's scoring (sandbox.confine auto).
  const std::string confinement =
      sandbox::settle_confinement(spec.episode.sandbox, spec.episode.device, spec.gpus.front(), beside_others);
  if (!confinement.empty()) progress << "[eval] " << confinement << "\n";
  std::atomic<size_t> next{0};
  ProgressReporter reporter(progress, split.tasks.size(), "episode", spec.interactive_progress);

  auto work = [&](int gpu) {
    for (size_t i = next++; i < split.tasks.size(); i = next++) {
      const bench::TaskEntry& task = split.tasks[i];
      EpisodeSpec episode = spec.episode;
      episode.task = task.path;
      episode.gpu = gpu;
      episode.policy = place_policy_on_gpu(spec.episode.policy, gpu);
      episode.output_dir = spec.output_dir / "episodes" / task.id;
      episode.hidden_paths.push_back(spec.output_dir);  // the other tasks' episodes and results
      bench::apply_task_options(episode.sandbox, task);
      nlohmann::json result;
      try {
        fs::remove_all(episode.output_dir);  // an eval run re-runs its episodes
        std::unique_ptr<Policy> own = sources.at(gpu)();
        std::optional<QuietGpuPolicy> quiet;
        episode.policy_instance = own.get();
        if (beside_others) {
          episode.gpu_lock = true;
          quiet.emplace(*own, gpu, episode.sandbox.gpu_wait_s);
          episode.policy_instance = &*quiet;
        }
        EpisodeResult r = run_task_episode(episode);
        result = r.score;
        result["episode"] = {{"stop_reason", r.stop_reason}, {"turns", r.turns}, {"tool_calls", r.tool_calls},
                             {"invalid_tool_calls", r.invalid_tool_calls},
                             {"trajectory", (episode.output_dir / "trajectory.jsonl").string()}};
      } catch (const std::exception& e) {
        result = {{"ok", false}, {"category", "infrastructure_error"}, {"reward", -1.0}, {"correct", nullptr},
                  {"message", fmt::format("the episode could not run: {}", e.what())}};
      }
      result["task_id"] = task.id;
      result["level"] = task.level;
      // As in bench: a degenerate task is reported and left out of the scores.
      bench::mark_degenerate(result, task.degenerate);
      result["reward"] = result.value("reward", nlohmann::json(-1.0)).is_number() ? result["reward"] : nlohmann::json(-1.0);
      write_file_atomic(spec.output_dir / "results" / (task.id + ".json"), result.dump(2));
      results[i] = result;
      const nlohmann::json ep = result.value("episode", nlohmann::json::object());
      reporter.step(fmt::format("{} (gpu {}): {}, reward {:g}, {} turns, {}", task.id, gpu,
                                result.value("ok", false) ? "pass" : bench::result_label(result),
                                result["reward"].get<double>(), ep.value("turns", 0), ep.value("stop_reason", "-")));
    }
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < spec.episodes_per_gpu; ++k)
    for (int gpu : spec.gpus) threads.emplace_back(work, gpu);
  for (auto& t : threads) t.join();

  nlohmann::json all = nlohmann::json::array();
  for (auto& r : results) all.push_back(r);
  nlohmann::json meta = {{"split", split.name}, {"policy", spec.episode.policy}, {"run_dir", spec.output_dir.string()},
                         {"max_turns", spec.episode.agent.max_turns}, {"single_turn", spec.episode.agent.single_turn},
                         {"episodes_per_gpu", spec.episodes_per_gpu},
                         {"device", spec.episode.device == "cpu" ? "cpu (verified only: nothing timed)"
                                                                 : fmt::format("cuda (GPUs {})", fmt::join(spec.gpus, ","))}};
  bench::write_report(spec.output_dir, all, meta);
  return {{"split", split.name}, {"results", all}, {"metrics", bench::compute_metrics(all)}};
}

}  // namespace cuda_agent::agent
