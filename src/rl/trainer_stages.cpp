// The per-step work of the trainer's stages (trainer_internal.h): running episodes, the step
// metrics, a PPO step, RFT and value pretraining.
#include "trainer_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <future>
#include <initializer_list>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "cuda_agent/agent/episode.h"
#include "cuda_agent/agent/policy.h"
#include "cuda_agent/agent/reference_policy.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/parallel.h"
#include "cuda_agent/core/progress.h"
#include "cuda_agent/core/stop_request.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/rft_filter.h"
#include "cuda_agent/rl/rollout.h"
#include "cuda_agent/rl/run_state.h"
#include "cuda_agent/rl/train_config.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/cuda_libs.h"
#include "cuda_agent/sandbox/eval_result.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "cuda_agent/serve/chat_session.h"
#include "cuda_agent/serve/local_policy.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace cuda_agent::rl::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string rollout_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// The GPU's quiet lock, shared, around the learner's GPU work when evaluations may be timing
// beside it: this run's own (`beside_episodes`: a step's episodes sampled meanwhile) or another
// process's (TrainRunOptions::shared_gpu). An evaluation's timing takes that lock exclusive.
sandbox::GpuLock learner_quiet_lock(const RunContext& ctx, bool beside_episodes = false) {
  if (ctx.options.device != "cuda" || !(beside_episodes || ctx.options.shared_gpu)) return sandbox::GpuLock();
  // Bounded as the episodes' evaluations wait (sandbox.gpu_wait_s).
  return sandbox::quiet_for_untimed_work(ctx.gpu, sandbox::SandboxOptions{}.gpu_wait_s, "the learner's update");
}

// The critic's values of every sequence of `episodes`, in sequence_tokens() order: the value head
// on the actor's trunk (shared) or the separate critic model, through PpoLearner::forward.
std::vector<std::vector<float>> critic_values(RunContext& ctx, const std::vector<EpisodeSequence>& episodes) {
  const sandbox::GpuLock quiet = learner_quiet_lock(ctx);
  const std::vector<lm::TrainForward> forward = ctx.learner->forward(sequence_tokens(episodes), {});
  std::vector<std::vector<float>> values;
  values.reserve(forward.size());
  for (const auto& f : forward) values.push_back(f.values);
  return values;
}

// GPU `gpu`'s memory in bytes; 0 where the driver does not say (no bound then).
uint64_t gpu_total_bytes(int gpu) {
  static std::mutex mutex;
  static std::map<int, uint64_t> totals;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = totals.find(gpu);
  if (it == totals.end()) {
    size_t bytes = 0;
    try {
      const auto& api = sandbox::driver();
      CUdevice device = 0;
      if (api.cuInit(0) != CUDA_SUCCESS || api.cuDeviceGet(&device, gpu) != CUDA_SUCCESS ||
          api.cuDeviceTotalMem(&bytes, device) != CUDA_SUCCESS)
        bytes = 0;
    } catch (const std::exception&) {
      bytes = 0;  // no driver here
    }
    it = totals.emplace(gpu, bytes).first;
  }
  return it->second;
}

// One episode of a step: which, where, and how it went.
struct EpisodeRun {
  size_t task_index = 0;
  int episode = 0;
  std::string teacher;  // a teacher's episode (make_policy spec), teacher-forced in the actor's tokens; "": the actor's own
  lm::LanguageModel* actor = nullptr;  // the model it samples: the learner's actor, or its snapshot
  fs::path dir;
  bool ok = false;
  std::string error;  // why it could not run (when !ok)
  double seconds = 0;
  agent::EpisodeResult result;
};

// The sandbox options an episode of task `task_index` is scored with.
sandbox::SandboxOptions scoring_options(const RunContext& ctx, size_t task_index) {
  sandbox::SandboxOptions o;
  o.timeout_s = ctx.config.rollout.sandbox_timeout_s;
  o.reward = ctx.config.reward.kind;
  o.speedup_margin = ctx.config.reward.speedup_margin;
  bench::apply_task_options(o, ctx.split.tasks[task_index]);  // as bench and eval score it
  return o;
}

// Runs `run` (its folder, seed and task set); `beside_others`: other episodes run at the same time
// on this GPU, so evaluations and generation take the GPU's locks. Never throws: a failure is
// kept in run.error. Reads ctx only, so episodes may run in several threads.
void run_one_episode(const RunContext& ctx, const Stage& stage, int64_t step, bool beside_others, EpisodeRun& run) {
  const TrainConfig::Rollout& rollout = ctx.config.rollout;
  const auto t0 = Clock::now();
  try {
    serve::LocalPolicyOptions lp;
    lp.temperature = rollout.temperature;
    lp.top_p = rollout.top_p;
    lp.max_new_tokens = rollout.max_new_tokens;
    lp.seed = episode_seed(ctx.config.run.seed, step, run.task_index, run.episode);
    std::unique_ptr<serve::ChatSession> session =
        serve::ChatSession::share_with_model(*ctx.chat, run.actor != nullptr ? *run.actor : ctx.learner->policy());
    std::unique_ptr<serve::LocalPolicy> own =
        run.teacher.empty()
            ? std::make_unique<serve::LocalPolicy>(std::move(session), lp)
            : std::make_unique<serve::LocalPolicy>(std::move(session), lp, agent::make_policy(run.teacher));
    serve::LocalPolicy& policy = *own;
    const bool on_gpu = ctx.options.device == "cuda";
    agent::QuietGpuPolicy quiet_policy(policy, ctx.gpu, scoring_options(ctx, run.task_index).gpu_wait_s);

    agent::EpisodeSpec spec;
    spec.task = ctx.split.tasks[run.task_index].path;
    spec.policy_instance = beside_others && on_gpu ? static_cast<agent::Policy*>(&quiet_policy) : &policy;
    spec.output_dir = run.dir;
    // What the policy must not copy: the run's other episodes and demonstrations, the teachers'
    // reference solutions (the task's own split's are hidden by the episode itself).
    spec.hidden_paths = {ctx.run_dir};
    for (const std::string& teacher : {ctx.config.stages.sft.teacher, ctx.config.stages.rft.teacher})
      if (const auto answers = agent::teacher_answers(teacher)) spec.hidden_paths.push_back(*answers);
    spec.skill_file = ctx.options.skill_file;
    spec.device = ctx.options.device;
    spec.gpu = ctx.gpu;
    spec.gpu_lock = beside_others;
    // Episodes sharing the GPU: no command of one holds more than its share of the GPU's memory
    // outside evaluations (a background shell that allocates and sleeps would leave the others'
    // evaluations short of it).
    if (beside_others && on_gpu)
      spec.tools.max_gpu_memory_bytes = episode_gpu_share(
          gpu_total_bytes(ctx.gpu), ctx.config.rollout.concurrent_episodes, ctx.options.gpu_processes);
    spec.agent.single_turn = stage.single_turn;
    spec.agent.max_turns = stage.single_turn ? 1 : rollout.max_turns;
    spec.agent.max_invalid_turns = rollout.max_invalid_turns;
    spec.agent.max_repeated_calls = rollout.max_repeated_calls;
    // The stage's window in tokens (the model's own bounds it too); before the first reply tells
    // the prompt's token count, ~4 characters a token, as AgentOptions' default (400k ~ 100k).
    spec.agent.context_tokens = stage.max_context_tokens;
    spec.agent.context_budget_chars = static_cast<size_t>(stage.max_context_tokens) * 4;
    spec.sandbox = scoring_options(ctx, run.task_index);
    run.result = agent::run_task_episode(spec);
    run.ok = true;
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  run.seconds = seconds_since(t0);
}

// Generated tokens of an episode's trajectory events.
int64_t generated_tokens(const json& events) {
  int64_t n = 0;
  for (const json& e : events)
    if (e.value("type", "") == "assistant") n += e.value("completion_tokens", int64_t{0});
  return n;
}

// Runs every episode of `runs`, up to `concurrent` at a time (threads of this process), with a
// progress line per finished episode (a step can take minutes). Once a stop is asked for
// (SIGINT, SIGTERM) no further episode starts, and the step ends with StopRequested.
// `beside_learner`: the learner updates on this GPU meanwhile, so the episodes take the GPU's
// locks even one at a time.
void run_episodes(const RunContext& ctx, const Stage& stage, int64_t step, int concurrent,
                  std::vector<EpisodeRun>& runs, bool beside_learner = false) {
  const size_t threads = std::min(static_cast<size_t>(std::max(concurrent, 1)), runs.size());
  ProgressReporter progress(ctx.log, runs.size(), "episode", stderr_is_terminal());
  parallel_for(
      runs.size(), threads,
      [&](size_t k) {
        run_one_episode(ctx, stage, step, threads > 1 || beside_learner || ctx.options.shared_gpu, runs[k]);
        const EpisodeRun& r = runs[k];
        progress.step(r.ok ? fmt::format("step {}, {}: reward {:g}, {} tokens", step, r.dir.filename().string(),
                                         r.result.reward, generated_tokens(r.result.trajectory))
                           : fmt::format("step {}, {}: failed", step, r.dir.filename().string()));
      },
      [] { return stop_signal() != 0; });
  throw_if_stop_requested(fmt::format("during step {} ({} of {} episodes had finished)", step,
                                      std::count_if(runs.begin(), runs.end(), [](const EpisodeRun& r) { return r.ok; }),
                                      runs.size()));
}

// The baselines (eager, torch.compile) of the tasks of `runs` that this run has not timed yet,
// timed first in the scoring cache, rollout.concurrent_episodes tasks at a time (their judges'
// Python starts side by side; the GPU's lock orders their GPU phases, one at a time, as the
// episodes' evaluations). Otherwise a task's first episodes time them over and over: each in its
// profile.sh (the tools' cache, which every episode seeds from the scoring cache: episode.cpp)
// and again in its final score. Returns the seconds spent.
double time_new_baselines(RunContext& ctx, const std::vector<EpisodeRun>& runs) {
  if (ctx.options.device != "cuda") return 0;
  const auto t0 = Clock::now();
  std::vector<size_t> tasks;
  size_t cached = 0;
  for (const EpisodeRun& run : runs) {
    if (!ctx.baselines_timed.insert(run.task_index).second) continue;
    // Timed earlier into the scoring cache (this run before a resume, the run an ablation variant
    // starts from, another run): not again. A judge that finds them still takes the GPU's lock,
    // and with other processes on the GPU that wait is minutes.
    if (sandbox::baselines_cached(ctx.split.tasks[run.task_index].path, scoring_options(ctx, run.task_index)))
      ++cached;
    else
      tasks.push_back(run.task_index);
  }
  if (cached > 0) ctx.log << fmt::format("[train] baselines of {} new task(s) found in the scoring cache\n", cached);
  std::vector<std::string> notes(tasks.size());
  const size_t threads = std::min(tasks.size(), static_cast<size_t>(std::max(1, ctx.config.rollout.concurrent_episodes)));
  parallel_for(
      tasks.size(), threads,
      [&](size_t k) {
        const bench::TaskEntry& task = ctx.split.tasks[tasks[k]];
        sandbox::EvalRequest req;
        req.task_path = task.path.string();
        req.task_id = task.id;
        req.mode = sandbox::EvalMode::kBaselines;
        req.device = "cuda";
        req.gpu = ctx.gpu;
        req.gpu_lock = true;
        req.options = scoring_options(ctx, tasks[k]);
        const sandbox::EvalResult r = sandbox::evaluate(req);
        if (!r.ok)  // the episodes' own scoring says the same again, per episode
          notes[k] = fmt::format("[train] baselines of task {}: {}: {}\n", task.id, sandbox::to_string(r.category),
                                 r.message.substr(0, 300));
      },
      [] { return stop_signal() != 0; });
  for (const std::string& note : notes) ctx.log << note;
  const double seconds = seconds_since(t0);
  if (!tasks.empty())
    ctx.log << fmt::format("[train] baselines of {} new task(s) timed first, {} at a time ({:.1f} s)\n", tasks.size(),
                           threads, seconds);
  return seconds;
}

}  // namespace

// The episodes of one batch of tasks.
struct Sampling {
  std::vector<fs::path> trajectories;         // trajectory.jsonl of each episode that completed, in order
  std::vector<agent::EpisodeResult> results;  // the same episodes' results
  json task_ids = json::array();
  int64_t failed = 0, passed = 0, faster = 0;
  int64_t degenerate = 0;  // episodes whose evaluation flagged the task degenerate: masked
  int64_t task_faults = 0;  // episodes whose task could not be evaluated (sandbox::is_task_fault): masked
  double reward_sum = 0, reward_square_sum = 0, seconds = 0;
  double baselines_seconds = 0;  // new tasks' baselines timed before the episodes (time_new_baselines)
  // Parts of `seconds` from the trajectories: the policy's replies and the tools' calls (Bash,
  // verify.sh, profile.sh: sandbox evaluations among them); the rest is setup and the final score.
  double generation_seconds = 0, tool_seconds = 0;
  double tool_gpu_wait_seconds = 0;  // of tool_seconds, Bash commands' waits for the GPU's lock
  double generation_quiet_wait_seconds = 0;  // of generation_seconds, replies' waits for timed runs
  int64_t generated_tokens = 0;
  int64_t without_demonstration = 0;  // teacher episodes not run: the teacher has nothing for the task
  double wall_seconds = 0;            // the whole sampling's wall time (set for prefetched steps)
};

// A PPO step's episodes sampled while the learner took the step before (run_ppo_step).
struct PrefetchedStep {
  int64_t step = 0;  // the global step they belong to
  std::string stage;
  Sampling sampling;
  double seconds = 0;  // their wall time, which overlapped the update
};

namespace {

// Adds an episode's generation and tool times and generated tokens (trajectory events) to `s`.
void add_episode_times(const json& events, Sampling& s) {
  for (const json& e : events) {
    const std::string type = e.value("type", "");
    if (type == "assistant") {
      s.generation_seconds += e.value("generation_s", 0.0);
      s.generation_quiet_wait_seconds += e.value("quiet_wait_s", 0.0);
    } else if (type == "observation") {
      s.tool_seconds += e.value("tool_s", 0.0);
      s.tool_gpu_wait_seconds += e.value("gpu_wait_s", 0.0);
    }
  }
  s.generated_tokens += generated_tokens(events);
}

// `per_task` episodes of each task in `picks`, each in folder/<task>-eE/ and seeded with
// episode_seed(run.seed, step, task index, E): the actor's own, or with `teacher` (a teacher spec:
// reference:DIR resolved per task, agent::teacher_spec_for_task) the teacher's, teacher-forced in
// the actor's tokens, in folder/<task>-tE/ (a task the teacher has nothing for is skipped, logged
// and counted). A task drawn twice numbers its episodes on, so
// no two episodes share a folder or a seed. In a data-parallel job every process gets the same
// picks and runs the tasks at the positions i with i mod world = rank (task_ids lists them all).
// rollout.concurrent_episodes of them run at once; the results keep this order whatever the
// timing, so a step's batch does not depend on how many ran at once. `actor` (default: the
// learner's) is the model sampled; `beside_learner` as run_episodes. Runs no collective and
// writes ctx.log and ctx.baselines_timed only, so it may run beside the learner's update.
Sampling sample_episodes(RunContext& ctx, const Stage& stage, int64_t step, const std::vector<size_t>& picks,
                         const fs::path& folder, int per_task, const std::string& teacher = "",
                         lm::LanguageModel* actor = nullptr, bool beside_learner = false) {
  const bool milestone = ctx.config.reward.kind == "milestone";
  Sampling s;
  std::vector<EpisodeRun> runs;
  std::map<size_t, int> numbered;
  for (size_t position = 0; position < picks.size(); ++position) {
    const size_t index = picks[position];
    const bench::TaskEntry& task = ctx.split.tasks[index];
    s.task_ids.push_back(task.id);
    const int first = numbered[index];
    numbered[index] += per_task;
    if (static_cast<int>(position % static_cast<size_t>(ctx.world)) != ctx.rank) continue;
    std::string teacher_spec;
    if (!teacher.empty()) {
      try {
        teacher_spec = agent::teacher_spec_for_task(teacher, task.id);
      } catch (const std::exception& e) {
        s.without_demonstration += per_task;
        ctx.log << fmt::format("[train] step {}: no teacher episode for task {}: {}\n", step, task.id, e.what());
        continue;
      }
    }
    for (int e = first; e < first + per_task; ++e) {
      EpisodeRun run;
      run.task_index = index;
      run.episode = e;
      run.teacher = teacher_spec;
      run.actor = actor;
      run.dir = folder / fmt::format("{}-{}{}", task.id, teacher.empty() ? "e" : "t", e);
      runs.push_back(std::move(run));
    }
  }
  s.baselines_seconds = time_new_baselines(ctx, runs);
  run_episodes(ctx, stage, step, ctx.config.rollout.concurrent_episodes, runs, beside_learner);
  for (EpisodeRun& run : runs) {
    s.seconds += run.seconds;
    if (!run.ok) {
      ++s.failed;
      ctx.log << fmt::format("[train] step {}: episode {} of task {} failed: {}\n", step, run.episode,
                             ctx.split.tasks[run.task_index].id, run.error);
      continue;
    }
    agent::EpisodeResult& result = run.result;
    add_episode_times(result.trajectory, s);
    const json check = result.score.is_object() ? result.score.value("task_check", json::object()) : json::object();
    if (check.is_object() && check.value("degenerate", false)) {
      // Its reward says nothing about the kernel: masked, neither in the batch nor in the means.
      ++s.degenerate;
      continue;
    }
    if (sandbox::is_task_fault(result.score.is_object() ? result.score.value("category", json()) : json())) {
      // The task could not be evaluated (too large for the GPU, a broken or unimportable task):
      // its -1 says nothing about the kernel either.
      ++s.task_faults;
      ctx.log << fmt::format("[train] step {}: episode {} of task {} masked: the task could not be evaluated ({}): {}\n",
                             step, run.episode, ctx.split.tasks[run.task_index].id,
                             result.score.value("category", std::string()),
                             result.score.value("message", std::string()).substr(0, 300));
      continue;
    }
    s.reward_sum += result.reward;
    s.reward_square_sum += result.reward * result.reward;
    if (result.score.is_object() && result.score.value("correct", json()) == json(true)) ++s.passed;
    if (milestone && result.reward >= 3.0) ++s.faster;
    s.trajectories.push_back(run.dir / "trajectory.jsonl");
    s.results.push_back(std::move(result));
  }
  return s;
}

// The job's episode counts and rates (summed over the processes; episode_seconds is the sum of
// every episode's wall time), each key with `prefix` ("teacher_" for a teacher's episodes).
void add_sampling_metrics(const RunContext& ctx, const Sampling& s, json& record, const std::string& prefix = "") {
  const std::vector<double> g =
      ctx.sum({static_cast<double>(s.results.size()), static_cast<double>(s.failed), static_cast<double>(s.passed),
               static_cast<double>(s.faster), s.reward_sum, s.seconds, s.generation_seconds, s.tool_seconds,
               static_cast<double>(s.generated_tokens), static_cast<double>(s.degenerate),
               static_cast<double>(s.task_faults), static_cast<double>(s.without_demonstration), s.baselines_seconds,
               s.tool_gpu_wait_seconds, s.generation_quiet_wait_seconds, s.reward_square_sum});
  const auto completed = static_cast<int64_t>(g[0]);
  const std::string& p = prefix;
  record[p + "tasks"] = s.task_ids;
  record[p + "episodes"] = completed;
  record[p + "episodes_failed"] = static_cast<int64_t>(g[1]);
  record[p + "episodes_degenerate"] = static_cast<int64_t>(g[9]);
  record[p + "episodes_task_fault"] = static_cast<int64_t>(g[10]);
  if (!p.empty()) record[p + "episodes_without_demonstration"] = static_cast<int64_t>(g[11]);
  record[p + "episode_seconds"] = g[5];
  record[p + "baselines_seconds"] = g[12];
  record[p + "generation_seconds"] = g[6];
  record[p + "tool_seconds"] = g[7];
  record[p + "tool_gpu_wait_seconds"] = g[13];
  record[p + "generation_quiet_wait_seconds"] = g[14];
  record[p + "scoring_seconds"] = std::max(0.0, g[5] - g[6] - g[7]);
  record[p + "generated_tokens"] = static_cast<int64_t>(g[8]);  // a teacher's: its replies in the actor's tokens
  if (g[6] > 0 && p.empty()) record[p + "generation_tokens_per_s"] = g[8] / g[6];  // nothing is sampled for a teacher
  if (completed == 0) return;
  record[p + "reward_mean"] = g[4] / g[0];
  // The episodes' sample standard deviation: what a step's mean can say (the ablations' collapse
  // check weighs a fall against it).
  if (completed >= 2) record[p + "reward_std"] = std::sqrt(std::max(0.0, (g[15] - g[4] * g[4] / g[0]) / (g[0] - 1)));
  record[p + "pass_rate"] = g[2] / g[0];
  if (ctx.config.reward.kind == "milestone")
    record[p + "faster_than_compile_rate"] = g[3] / g[0];
}

// The job's rollout statistics of the usable episodes; returns the job's sequence count.
int64_t add_rollout_metrics(const RunContext& ctx, const std::vector<EpisodeSequence>& episodes, int64_t unusable,
                            json& record) {
  const RolloutStats stats = rollout_stats(episodes);
  const std::vector<double> g =
      ctx.sum({static_cast<double>(stats.episodes), static_cast<double>(stats.sequences),
               static_cast<double>(stats.chained_episodes), stats.response_length_mean * stats.episodes,
               static_cast<double>(stats.tokens), static_cast<double>(unusable)});
  record["episodes_unusable"] = static_cast<int64_t>(g[5]);
  record["sequences"] = static_cast<int64_t>(g[1]);
  record["chained_episodes"] = static_cast<int64_t>(g[2]);
  record["response_length_mean"] = g[0] > 0 ? g[3] / g[0] : 0.0;
  record["response_length_max"] = static_cast<int64_t>(ctx.max(static_cast<double>(stats.response_length_max)));
  record["tokens"] = static_cast<int64_t>(g[4]);
  return static_cast<int64_t>(g[1]);
}

// The episode of a trajectory without its sequences that hold no policy token (a turn whose reply
// was empty: nothing to learn from, and ppo_samples refuses it). Error when none is left.
EpisodeSequence usable_episode(EpisodeSequence episode) {
  std::erase_if(episode.sequences, [](const TokenSequence& s) {
    return std::find(s.loss_mask.begin(), s.loss_mask.end(), uint8_t{1}) == s.loss_mask.end();
  });
  CA_CHECK(!episode.sequences.empty(), "no reply of the trajectory holds a sampled token");
  return episode;
}

// The usable episodes of trajectory files (read from disk), counting and logging the others.
std::vector<EpisodeSequence> read_usable_episodes(RunContext& ctx, const std::vector<fs::path>& files, int64_t step,
                                                  int64_t* unusable) {
  std::vector<EpisodeSequence> episodes;
  for (const fs::path& file : files) {
    try {
      episodes.push_back(usable_episode(episode_sequence(read_trajectory(file))));
    } catch (const std::exception& e) {
      ++*unusable;
      ctx.log << fmt::format("[train] step {}: {} has no usable token records: {}\n", step, file.string(), e.what());
    }
  }
  return episodes;
}

// The trajectory files under `folder` (one episode folder each), in name order.
std::vector<fs::path> trajectory_files(const fs::path& folder) {
  std::vector<fs::path> files;
  if (!fs::is_directory(folder)) return files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (fs::is_regular_file(entry.path() / "trajectory.jsonl")) files.push_back(entry.path() / "trajectory.jsonl");
  std::sort(files.begin(), files.end());
  return files;
}

// `section`.tasks tasks (stages.rft, stages.sft): every task of the split in its order (0), else the
// next ones of the cursor.
std::vector<size_t> stage_tasks(RunContext& ctx, const TrainConfig::FineTune& section) {
  const size_t count = section.tasks;
  if (count > 0) return ctx.cursor.next(count);
  std::vector<size_t> all(ctx.split.tasks.size());
  std::iota(all.begin(), all.end(), size_t{0});
  return all;
}

std::string describe_drops(const std::map<std::string, size_t>& by_reason) {
  std::string out;
  for (const auto& [reason, count] : by_reason) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", reason, count);
  return out.empty() ? "none" : out;
}

// rollout.off_policy_steps: when the stage has a step after `step`, draws its tasks and starts
// sampling its episodes from a snapshot of the actor's current weights in a thread; else an
// empty future. The cursor as it was before is kept for a checkpoint taken meanwhile.
std::future<Sampling> prefetch_next_step(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  const TrainConfig& c = ctx.config;
  if (c.rollout.off_policy_steps < 1 || step_in_stage >= stage.steps || stop_signal() != 0) return {};
  ctx.cursor_before_prefetch = ctx.cursor.state();
  const std::vector<size_t> picks = ctx.cursor.next(static_cast<size_t>(c.data.tasks_per_step));
  lm::LanguageModel* snapshot = &ctx.learner->snapshot_policy();
  return std::async(std::launch::async, [&ctx, &stage, step, picks, snapshot] {
    const auto t0 = Clock::now();
    Sampling s = sample_episodes(ctx, stage, step + 1, picks, ctx.run_dir / "rollouts" / rollout_dir_name(step + 1),
                                 ctx.config.rollout.episodes_per_task, "", snapshot, /*beside_learner=*/true);
    s.wall_seconds = seconds_since(t0);
    return s;
  });
}

// Waits for the next step's episodes (prefetch_next_step) and keeps them in ctx.prefetched; the
// wait after the update goes into `record`. A stop asked for meanwhile discards them: this step
// still counts (its update is done), and the run stops before the next.
void collect_prefetch(RunContext& ctx, const Stage& stage, int64_t step, std::future<Sampling>& next, json& record) {
  const auto t_wait = Clock::now();
  try {
    Sampling s = next.get();
    auto p = std::make_shared<PrefetchedStep>();
    p->step = step + 1;
    p->stage = stage.name;
    p->seconds = s.wall_seconds;
    p->sampling = std::move(s);
    ctx.prefetched = std::move(p);
  } catch (const StopRequested& e) {
    // Their tasks are drawn again by the resumed run: the cursor goes back to before them.
    ctx.cursor.restore(ctx.cursor_before_prefetch);
    ctx.log << fmt::format("[train] step {}: the next step's episodes were stopped ({}): discarded\n", step, e.what());
  }
  record["rollout_wait_seconds"] = seconds_since(t_wait);
}

// A warm-up or agentic PPO step. With rollout.off_policy_steps = 1 and a next step in the stage,
// that step's episodes are sampled from a snapshot of the actor (PpoLearner::snapshot_policy)
// in a thread of their own while the learner updates on this step's (veRL's one-step async
// mode): they are kept in ctx.prefetched and used by the next call, one update stale.
json run_ppo_step(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  const TrainConfig& c = ctx.config;
  const auto t_step = Clock::now();
  Sampling sampled;
  int staleness = 0;
  double overlapped_seconds = 0;
  if (ctx.prefetched && ctx.prefetched->step == step && ctx.prefetched->stage == stage.name) {
    sampled = std::move(ctx.prefetched->sampling);
    overlapped_seconds = ctx.prefetched->seconds;
    staleness = 1;
  } else {
    const std::vector<size_t> picks = ctx.cursor.next(static_cast<size_t>(c.data.tasks_per_step));
    sampled = sample_episodes(ctx, stage, step, picks, ctx.run_dir / "rollouts" / rollout_dir_name(step),
                              c.rollout.episodes_per_task);
  }
  ctx.prefetched.reset();

  json record = {{"step", step}, {"stage", stage.name}, {"step_in_stage", step_in_stage}};
  add_sampling_metrics(ctx, sampled, record);
  // Updates between the weights that sampled this step and those it trains (0: on-policy).
  record["rollout_staleness"] = staleness;
  if (staleness > 0) record["rollout_overlapped_seconds"] = overlapped_seconds;
  std::vector<EpisodeSequence> episodes;
  int64_t unusable = 0;
  for (size_t i = 0; i < sampled.results.size(); ++i) {
    try {
      episodes.push_back(usable_episode(episode_sequence(sampled.results[i])));
    } catch (const std::exception& err) {
      ++unusable;
      ctx.log << fmt::format("[train] step {}: {} has no usable token records: {}\n", step,
                             sampled.trajectories[i].string(), err.what());
    }
  }
  add_rollout_metrics(ctx, episodes, unusable, record);

  // Every process updates or none does: each needs mini_batches sequences of its own.
  const int mini_batches = c.ppo.learner.mini_batches;
  const auto fewest = static_cast<int64_t>(ctx.min(static_cast<double>(rollout_stats(episodes).sequences)));
  if (fewest < mini_batches) {
    ctx.log << fmt::format("[train] step {}: {} usable sequences{}, fewer than ppo.mini_batches = {}: no update\n", step,
                           fewest, ctx.world > 1 ? " on some process" : "", mini_batches);
    record["update_skipped"] = true;
  } else {
    const auto t_update = Clock::now();
    const std::vector<lm::PpoSample> samples =
        ppo_samples(episodes, critic_values(ctx, episodes), c.ppo.gamma,
                    c.ppo.lambda, c.ppo.whiten_advantages,
                    // the whitening's mean and variance over every process's share
                    ctx.world > 1 ? SumAcross([&](const std::vector<double>& v) { return ctx.sum(v); }) : SumAcross());
    std::future<Sampling> next = prefetch_next_step(ctx, stage, step, step_in_stage);
    lm::PpoStats s;
    {
      // The next step's evaluations (and other processes') time nothing while the update runs.
      const sandbox::GpuLock quiet = learner_quiet_lock(ctx, next.valid());
      s = ctx.learner->update(samples);
    }
    const double update_seconds = seconds_since(t_update);
    if (next.valid()) collect_prefetch(ctx, stage, step, next, record);
    record["update_skipped"] = false;
    record["loss"] = s.loss;
    record["policy_loss"] = s.policy_loss;
    record["value_loss"] = s.value_loss;
    record["entropy"] = s.entropy;
    record["kl"] = s.kl;
    record["clip_fraction"] = s.clip_fraction;
    record["value_clip_fraction"] = s.value_clip_fraction;
    record["grad_norm_actor"] = s.grad_norm_actor;
    record["grad_norm_critic"] = s.grad_norm_critic;
    record["policy_tokens"] = s.tokens;
    record["update_seconds"] = update_seconds;
    record["training_tokens_per_s"] = record["tokens"].get<double>() / update_seconds;
  }
  record["step_seconds"] = seconds_since(t_step);
  return record;
}

// The drop reasons in a fixed order, so every process of a job sums the same entries.
const std::vector<std::string>& drop_reasons() {
  static const std::vector<std::string> reasons = [] {
    std::vector<std::string> r = {"malformed", "too_many_invalid_tool_calls", "low_reward"};
    for (const std::string& stop : kStopReasons) r.push_back("stop_reason:" + stop);
    return r;
  }();
  return reasons;
}

// What the filter of `section` (stages.rft, stages.sft: keep_reward_above, drop_stop_reasons,
// max_invalid_tool_calls) keeps of `sampled`'s trajectories, as usable episodes; the job's counts
// go into `record` as <prefix>kept, <prefix>dropped, <prefix>dropped_by_reason (and
// <prefix>kept_reward_mean). `*job_kept` gets the job's count of usable kept episodes.
std::vector<EpisodeSequence> keep_filtered(RunContext& ctx, const Sampling& sampled, const TrainConfig::FineTune& section,
                                           int64_t step, const std::string& prefix, json& record, int64_t* job_kept,
                                           int64_t* unusable) {
  const RftFilterResult filtered = filter_trajectories(sampled.trajectories, section.filter);
  std::vector<EpisodeSequence> kept = read_usable_episodes(ctx, filtered.kept, step, unusable);
  const std::vector<std::string>& reasons = drop_reasons();
  std::vector<double> counts = {static_cast<double>(filtered.kept.size()), static_cast<double>(filtered.dropped.size()),
                                rollout_stats(kept).reward_mean * static_cast<double>(kept.size()),
                                static_cast<double>(kept.size())};
  std::map<std::string, size_t> other_reasons;
  for (const auto& [reason, n] : filtered.dropped_by_reason)
    if (std::find(reasons.begin(), reasons.end(), reason) == reasons.end()) other_reasons[reason] = n;
  for (const std::string& reason : reasons) {
    const auto it = filtered.dropped_by_reason.find(reason);
    counts.push_back(it == filtered.dropped_by_reason.end() ? 0.0 : static_cast<double>(it->second));
  }
  const std::vector<double> g = ctx.sum(counts);
  std::map<std::string, size_t> by_reason = ctx.world == 1 ? filtered.dropped_by_reason : other_reasons;
  if (ctx.world > 1)
    for (size_t i = 0; i < reasons.size(); ++i)
      if (g[4 + i] > 0) by_reason[reasons[i]] = static_cast<size_t>(g[4 + i]);
  record[prefix + "kept"] = static_cast<int64_t>(g[0]);
  record[prefix + "dropped"] = static_cast<int64_t>(g[1]);
  record[prefix + "dropped_by_reason"] = json(by_reason);
  if (g[3] > 0) record[prefix + "kept_reward_mean"] = g[2] / g[3];
  *job_kept = static_cast<int64_t>(g[3]);
  ctx.log << fmt::format("[train] step {} ({}): kept {} of {} {}trajectories; dropped: {}\n", step,
                         record["stage"].get<std::string>(), g[0], g[0] + g[1], prefix.empty() ? "" : "teacher ",
                         describe_drops(by_reason));
  return kept;
}

// Fine-tunes the actor on `kept` (the loss on the assistant's tokens only: prompts, tool output and
// template text carry none) with `section`'s lr, epochs and batch_size: ceil(job_kept / batch_size)
// mini-batches, at most as many as the process with the fewest kept has. Every process fine-tunes
// or none does; one whose share kept nothing leaves the stage without an update, and says so.
void fine_tune(RunContext& ctx, const std::vector<EpisodeSequence>& kept, int64_t job_kept, const TrainConfig::FineTune& section,
               int64_t step, json& record) {
  const auto fewest = static_cast<int64_t>(ctx.min(static_cast<double>(kept.size())));
  if (fewest == 0) {
    ctx.log << fmt::format("[train] step {} ({}): no usable trajectory kept{} ({} dropped, {} kept but unusable): "
                           "the actor is not fine-tuned\n",
                           step, record["stage"].get<std::string>(), ctx.world > 1 && job_kept > 0 ? " by some process" : "",
                           record.value("dropped", record.value("teacher_dropped", json(0))).dump(),
                           record.value("episodes_unusable", json(0)).dump());
    record["update_skipped"] = true;
    return;
  }
  const auto t_update = Clock::now();
  std::vector<lm::PpoSample> samples;
  for (const EpisodeSequence& episode : kept)
    for (const TokenSequence& s : episode.sequences) {
      lm::PpoSample sample;
      sample.tokens = s.tokens;
      sample.loss_mask = s.loss_mask;
      samples.push_back(std::move(sample));
    }
  const auto batch_size = section.batch_size;
  lm::StageUpdateOptions plan;
  plan.lr = section.lr;
  plan.epochs = section.epochs;
  plan.mini_batches = static_cast<int>(std::min<int64_t>(fewest, (job_kept + batch_size - 1) / batch_size));
  const lm::PpoStats s = [&] {
    const sandbox::GpuLock quiet = learner_quiet_lock(ctx);
    return ctx.learner->sft_update(samples, plan);
  }();
  record["update_skipped"] = false;
  record["loss"] = s.loss;  // the mean NLL of the kept assistant tokens, before each step
  record["loss_first_step"] = s.first_loss;
  record["loss_last_step"] = s.last_loss;
  record["entropy"] = s.entropy;
  record["grad_norm_actor"] = s.grad_norm_actor;
  record["policy_tokens"] = s.tokens;
  record["optimizer_steps"] = plan.epochs * plan.mini_batches;
  record["update_seconds"] = seconds_since(t_update);
}

// A teacher's `per_task` episodes of `tasks` into `folder`, their metrics (prefix "teacher_") and
// what `section`'s filter keeps of them; adds the job's kept count to *job_kept.
std::vector<EpisodeSequence> teacher_episodes(RunContext& ctx, const Stage& stage, int64_t step,
                                              const std::vector<size_t>& tasks, const fs::path& folder, int per_task,
                                              const TrainConfig::FineTune& section, json& record, int64_t* job_kept,
                                              int64_t* unusable) {
  const Sampling taught =
      sample_episodes(ctx, stage, step, tasks, folder, per_task, section.teacher);
  add_sampling_metrics(ctx, taught, record, "teacher_");
  int64_t kept = 0;
  std::vector<EpisodeSequence> demos = keep_filtered(ctx, taught, section, step, "teacher_", record, &kept, unusable);
  *job_kept += kept;
  return demos;
}

// Empties `folders` on the writer (a stage redone after an interruption starts over), then waits
// for every process.
void fresh_folders(RunContext& ctx, std::initializer_list<fs::path> folders) {
  if (ctx.writer())
    for (const fs::path& f : folders) fs::remove_all(f);
  ctx.barrier();
}

// Stage 2: sample, filter, fine-tune the actor on what is kept: the actor's own episodes
// (rollout.episodes_per_task a task, into rollouts/rft/) and, when stages.rft.teacher_episodes_per_task
// > 0, the teacher's (into rollouts/rft-teacher/, which value pretraining does not read), each
// through the same filter; the metrics keep the two apart (kept, teacher_kept, ...).
json run_rft(RunContext& ctx, const Stage& stage, int64_t step) {
  const TrainConfig::Rft& rft = ctx.config.stages.rft;
  const auto t_step = Clock::now();
  const fs::path folder = ctx.run_dir / "rollouts" / "rft";
  const fs::path teacher_folder = ctx.run_dir / "rollouts" / "rft-teacher";
  fresh_folders(ctx, {folder, teacher_folder});
  const std::vector<size_t> tasks = stage_tasks(ctx, rft);
  const Sampling sampled =
      sample_episodes(ctx, stage, step, tasks, folder, ctx.config.rollout.episodes_per_task);
  json record = {{"step", step}, {"stage", stage.name}, {"step_in_stage", 1}};
  add_sampling_metrics(ctx, sampled, record);
  int64_t unusable = 0, job_kept = 0;
  std::vector<EpisodeSequence> kept = keep_filtered(ctx, sampled, rft, step, "", record, &job_kept, &unusable);
  const int teacher_per_task = rft.teacher_episodes_per_task;
  if (teacher_per_task > 0)
    for (EpisodeSequence& e :
         teacher_episodes(ctx, stage, step, tasks, teacher_folder, teacher_per_task, rft, record, &job_kept, &unusable))
      kept.push_back(std::move(e));
  add_rollout_metrics(ctx, kept, unusable, record);
  fine_tune(ctx, kept, job_kept, rft, step, record);
  record["step_seconds"] = seconds_since(t_step);
  return record;
}

// The supervised warm-up (before stage 1): stages.sft.episodes_per_task teacher episodes of
// stages.sft.tasks tasks, teacher-forced in the actor's tokens into rollouts/sft/, filtered as RFT
// filters (stages.sft's keep_reward_above, drop_stop_reasons, max_invalid_tool_calls), then the
// actor fine-tuned on what is kept (stages.sft's lr, epochs, batch_size).
json run_sft(RunContext& ctx, const Stage& stage, int64_t step) {
  const TrainConfig::Sft& sft = ctx.config.stages.sft;
  const auto t_step = Clock::now();
  const fs::path folder = ctx.run_dir / "rollouts" / "sft";
  fresh_folders(ctx, {folder});
  json record = {{"step", step}, {"stage", stage.name}, {"step_in_stage", 1}, {"teacher", sft.teacher}};
  int64_t unusable = 0, job_kept = 0;
  const std::vector<EpisodeSequence> kept = teacher_episodes(ctx, stage, step, stage_tasks(ctx, sft), folder,
                                                             sft.episodes_per_task, sft, record,
                                                             &job_kept, &unusable);
  add_rollout_metrics(ctx, kept, unusable, record);
  fine_tune(ctx, kept, job_kept, sft, step, record);
  record["step_seconds"] = seconds_since(t_step);
  return record;
}

// Stage 3: the critic learns on RFT's trajectories (or fresh ones) with the actor frozen.
//
// The returns (the critic's targets) come once, from GAE over the values before the stage. The
// stage's stages.value_pretrain.steps optimizer steps go in passes over the sequences: each pass
// splits them (a permutation seeded by run.seed and the step, independent of the learner's own
// shuffle, so a resumed run repeats it) into min(steps left, sequences) mini-batches and takes
// one value_update step on each. Before every pass but the first, old_values are refreshed to the
// critic's current values: the value clip (ppo.value_clip) bounds how far one pass moves a value,
// not the whole stage.
json run_value_pretrain(RunContext& ctx, const Stage& stage, int64_t step) {
  const TrainConfig::ValuePretrain& vp = ctx.config.stages.value_pretrain;
  const auto t_step = Clock::now();
  json record = {{"step", step}, {"stage", stage.name}, {"step_in_stage", 1}};
  std::vector<fs::path> files = trajectory_files(ctx.run_dir / "rollouts" / "rft");
  if (ctx.world > 1) {  // this process's share: every world-th file
    std::vector<fs::path> mine;
    for (size_t i = static_cast<size_t>(ctx.rank); i < files.size(); i += static_cast<size_t>(ctx.world))
      mine.push_back(files[i]);
    files = mine;
  }
  if (ctx.max(files.empty() ? 0.0 : 1.0) > 0) {
    record["source"] = "rft";
    ctx.log << fmt::format("[train] step {} (value_pretrain): the critic learns on the {} trajectories of {}\n", step,
                           files.size(), (ctx.run_dir / "rollouts" / "rft").string());
  } else {
    const fs::path folder = ctx.run_dir / "rollouts" / "value_pretrain";
    fresh_folders(ctx, {folder});
    ctx.log << fmt::format("[train] step {} (value_pretrain): no RFT trajectories in {}: sampling into {}\n", step,
                           (ctx.run_dir / "rollouts" / "rft").string(), folder.string());
    const Sampling sampled = sample_episodes(ctx, stage, step, stage_tasks(ctx, ctx.config.stages.rft), folder,
                                             ctx.config.rollout.episodes_per_task);
    add_sampling_metrics(ctx, sampled, record);
    files = sampled.trajectories;
    record["source"] = "sampled";
  }
  record["trajectories"] = static_cast<int64_t>(ctx.sum({static_cast<double>(files.size())})[0]);
  int64_t unusable = 0;
  const std::vector<EpisodeSequence> episodes = read_usable_episodes(ctx, files, step, &unusable);
  add_rollout_metrics(ctx, episodes, unusable, record);
  if (ctx.min(static_cast<double>(episodes.size())) == 0) {
    ctx.log << fmt::format("[train] step {} (value_pretrain): no usable trajectory{} ({} unusable): the critic is not "
                           "pretrained\n",
                           step, ctx.world > 1 ? " on some process" : "", record["episodes_unusable"].dump());
    record["update_skipped"] = true;
    record["step_seconds"] = seconds_since(t_step);
    return record;
  }

  const auto t_update = Clock::now();
  std::vector<lm::PpoSample> samples =
      ppo_samples(episodes, critic_values(ctx, episodes), vp.gamma, vp.lambda,
                  /*whiten=*/false);  // advantages are not used here
  const int steps = vp.steps;
  const size_t n = samples.size();
  // Every process takes as many steps per pass: as many as the fewest sequences of a process.
  const size_t per_pass = std::min(static_cast<size_t>(steps), static_cast<size_t>(ctx.min(static_cast<double>(n))));
  lm::StageUpdateOptions one_step;
  one_step.lr = vp.lr;
  int64_t policy_tokens = 0;
  for (const auto& s : samples) policy_tokens += std::count(s.loss_mask.begin(), s.loss_mask.end(), uint8_t{1});
  policy_tokens = static_cast<int64_t>(ctx.sum({static_cast<double>(policy_tokens)})[0]);

  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  uint64_t state = splitmix64(splitmix64(ctx.config.run.seed) ^ static_cast<uint64_t>(step));
  double loss_sum = 0, clip_sum = 0, grad_sum = 0, first_pass = 0, last_pass = 0;
  int done = 0, passes = 0;
  while (done < steps) {
    if (passes > 0) {
      std::vector<std::vector<float>> values = critic_values(ctx, episodes);
      for (size_t i = 0; i < n; ++i) samples[i].old_values = std::move(values[i]);
    }
    for (size_t i = n; i > 1; --i) {  // Fisher-Yates with splitmix64: the same order on every platform
      state = splitmix64(state);
      std::swap(order[i - 1], order[state % i]);
    }
    const size_t parts = std::min(per_pass, static_cast<size_t>(steps - done));
    double pass_loss = 0;
    for (size_t k = 0; k < parts; ++k) {
      std::vector<lm::PpoSample> part;
      for (size_t j = n * k / parts; j < n * (k + 1) / parts; ++j) part.push_back(samples[order[j]]);
      const lm::PpoStats s = [&] {
        const sandbox::GpuLock quiet = learner_quiet_lock(ctx);
        return ctx.learner->value_update(part, one_step);
      }();
      loss_sum += s.value_loss;
      clip_sum += s.value_clip_fraction;
      grad_sum += s.grad_norm_critic;
      pass_loss += s.value_loss / static_cast<double>(parts);
      ++done;
    }
    if (passes == 0) first_pass = pass_loss;
    last_pass = pass_loss;
    ++passes;
  }
  record["update_skipped"] = false;
  record["value_loss"] = loss_sum / steps;
  record["value_loss_first_pass"] = first_pass;
  record["value_loss_last_pass"] = last_pass;
  record["value_clip_fraction"] = clip_sum / steps;
  record["grad_norm_critic"] = grad_sum / steps;
  record["optimizer_steps"] = steps;
  record["passes"] = passes;
  record["policy_tokens"] = policy_tokens;
  record["update_seconds"] = seconds_since(t_update);
  record["step_seconds"] = seconds_since(t_step);
  return record;
}

}  // namespace

json run_stage_step(RunContext& ctx, const Stage& stage, int64_t step, int step_in_stage) {
  json record;
  switch (stage.kind) {
    case StageKind::kSft:
      record = run_sft(ctx, stage, step);
      break;
    case StageKind::kRft:
      record = run_rft(ctx, stage, step);
      break;
    case StageKind::kValuePretrain:
      record = run_value_pretrain(ctx, stage, step);
      break;
    case StageKind::kPpo:
      record = run_ppo_step(ctx, stage, step, step_in_stage);
      break;
  }
  // What the step's learner and decoder left cached goes back to the driver: the next step's
  // evaluations (the sandbox's processes, and other runs on this GPU) plan their memory with what
  // the driver has free. Five ablation variants on one H100 otherwise held it all, every data/core
  // task was masked task_too_large and no PPO step updated (docs/benchmarks.md section 12).
  if (ctx.options.device == "cuda") record["gpu_cache_released_bytes"] = lm::release_cached_gpu_memory();
  return record;
}

std::string step_summary(const Stage& stage, int k, const json& r) {
  auto field = [&](const char* key) { return r.value(key, json()).dump(); };
  const std::string head = fmt::format("[train] step {} ({} {}/{}): ", r["step"].get<int64_t>(), stage.name, k,
                                       stage.steps);
  const std::string tail = fmt::format(" ({:.1f} s)\n", r["step_seconds"].get<double>());
  switch (stage.kind) {
    case StageKind::kSft:
      return head + fmt::format("kept {} of {} teacher episodes (teacher reward_mean {}) nll {} (first step {}, "
                                "last step {})", field("teacher_kept"),
                                r["teacher_kept"].get<int64_t>() + r["teacher_dropped"].get<int64_t>(),
                                field("teacher_reward_mean"), field("loss"), field("loss_first_step"),
                                field("loss_last_step")) + tail;
    case StageKind::kRft:
      return head + fmt::format("kept {} of {} reward_mean {}{} nll {}", field("kept"), r["kept"].get<int64_t>() +
                                r["dropped"].get<int64_t>(), field("reward_mean"),
                                r.contains("teacher_kept") ? fmt::format(", teacher kept {}", field("teacher_kept")) : "",
                                field("loss")) + tail;
    case StageKind::kValuePretrain:
      return head + fmt::format("{} critic steps on {} sequences: value_loss {} (first pass {}, last pass {})",
                                field("optimizer_steps"), field("sequences"), field("value_loss"),
                                field("value_loss_first_pass"), field("value_loss_last_pass")) + tail;
    case StageKind::kPpo:
      break;
  }
  return head + fmt::format("reward_mean {} pass_rate {} policy_loss {} value_loss {}", field("reward_mean"),
                            field("pass_rate"), field("policy_loss"), field("value_loss")) + tail;
}

}  // namespace cuda_agent::rl::detail
