// profile, on the judge's side: eager, torch.compile and the candidate timed in interleaved
// rounds on the same input sets, each drawn right before its round (the baselines in this
// process, which never ran solution code; the candidate in its own), every timed output of the
// candidate compared under the precision policy, and the speedups with their intervals.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include <fmt/format.h>
#include <pybind11/embed.h>

#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/cuda_device.h"
#include "cuda_agent/sandbox/reward.h"
#include "cuda_agent/sandbox/task_runner.h"
#include "cuda_agent/sandbox/timer.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "evaluation_support.h"
#include "judge.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

constexpr int kEager = 0, kCompile = 1;
// The most of the GPU's memory a judge takes while it compiles before the exclusive lock
// (judge_precompile_baseline), beside others doing the same.
constexpr double kPrecompileMemoryFraction = 0.125;

TimingOptions timing_options(const SandboxOptions& o) {
  TimingOptions t;
  t.warmup_runs = o.warmup_runs;
  t.warmup_ms = o.warmup_ms;
  t.timed_runs = o.timed_runs;
  t.flush_l2 = o.flush_l2;
  t.record_kernels = o.record_kernels;
  return t;
}

int64_t timed_seed(Judge& j, int run) {
  return j.input_seed(j.opt.trials + 1 + run);
}

// The least DRAM traffic the task needs (reading every input once, writing every output once:
// `bytes`) against the device's peak bandwidth: a candidate faster than that is flagged for review.
nlohmann::json roofline_check(int64_t bytes, double candidate_ms) {
  const double peak = current_device_info().peak_dram_gbps();
  const double min_ms = peak > 0 ? bytes / (peak * 1e9) * 1e3 : 0;
  const double achieved = candidate_ms > 0 ? bytes / (candidate_ms * 1e-3) / 1e9 : 0;
  return {{"min_bytes", bytes}, {"peak_dram_gbps", peak}, {"min_ms", min_ms},
          {"achieved_gbps", achieved}, {"flag", peak > 0 && achieved > peak}};
}

BaselineKey baseline_key(const Judge& j) {
  BaselineKey key = baseline_key_of(j.result.task_sha256, j.opt);
  key.gpu_name = j.result.reports["device"]["name"];
  key.torch_version = j.result.reports["versions"]["torch"];
  key.timing["driver_version"] = j.result.reports["device"]["driver_version"];
  return key;
}

// torch.compile of the reference, or None with *error set when torch.compile itself fails.
// Compilation happens at the first call (the warm-up). Without a solution (the baselines mode)
// a failure is the task's; beside one it removes no bar (RewardInputs::compile_failed_beside_solution).
py::object compile_reference(Judge& j, std::optional<std::string>* error) {
  try {
    return py::module_::import("torch").attr("compile")(j.reference, py::arg("mode") = j.opt.compile_mode);
  } catch (const std::exception& e) {
    *error = std::string(e.what()).substr(0, 2000);
    CA_LOG_WARN("sandbox", "torch.compile failed on {}: {}", j.req.task_path, e.what());
    return py::none();
  }
}

// Warms torch.compile's model up (compiling it); None with *error set when that fails.
py::object warm_compiled(Judge& j, py::object compiled, py::handle inputs, std::optional<std::string>* error) {
  if (compiled.is_none()) return compiled;
  try {
    warm_up(compiled, inputs, timing_options(j.opt));
    return compiled;
  } catch (const std::exception& e) {
    *error = std::string(e.what()).substr(0, 2000);
    CA_LOG_WARN("sandbox", "torch.compile failed on {}: {}", j.req.task_path, e.what());
    return py::none();
  }
}

// Pre-runs: an untimed forward of each side right before its timed run, on the warm-up inputs,
// so that the host's path through the forward is as warm in the rounds as in a loop of runs
// (between rounds the judge draws and compares, and each process sleeps while the other runs).
// They hold one more input set in each process: only where the memory plan has room.
bool room_for_pre_runs(const Judge& j) {
  return j.plan && !j.plan->release_cached &&
         j.plan->need_bytes + 2 * j.plan->needs.input_bytes <= j.plan->needs.free_bytes;
}

// Eager and torch.compile in rounds of their own (no candidate): the `baselines` mode, and the
// re-timing of a cached torch.compile baseline when eager drifted.
struct BaselineRounds {
  std::optional<TimingStats> eager, compile;
  std::optional<std::string> compile_error;
  nlohmann::json eager_kernels = nlohmann::json::array(), compile_kernels = nlohmann::json::array();
  nlohmann::json slice_watch = nullptr;  // slice_watch_report()
};

// Which rounds' baseline runs the slice watch sees (timer.h, watched_rounds): half of them, drawn
// at random where seeds are secret (from the seed otherwise); every round with `all`.
std::vector<bool> rounds_to_watch(Judge& j, int rounds, bool all) {
  if (!j.opt.slice_watch || all) return std::vector<bool>(static_cast<size_t>(std::max(rounds, 0)), j.opt.slice_watch);
  const uint64_t seed = j.opt.secret_seeds
                            ? (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()
                            : static_cast<uint64_t>(j.opt.seed) + 0x5eed;
  return watched_rounds(rounds, seed);
}

// What the slice watch took off a series' samples (timer.h, SliceGaps).
nlohmann::json slice_report(const TimedSeries::Series& s) {
  double total = 0, most = 0;
  for (const double ms : s.sliced_ms) total += ms, most = std::max(most, ms);
  return {{"runs_watched", s.watched_runs},
          {"runs_sliced", s.sliced_runs},
          {"slices", s.slices},
          {"sliced_ms_total", total},
          {"sliced_ms_most_in_a_run", most},
          {"longest_clock_step_us", s.longest_step_us}};
}

// timing.slice_watch: each baseline series' account, or null where the watch was off.
nlohmann::json slice_watch_report(const SandboxOptions& opt, const TimedSeries::Series& eager,
                                  const TimedSeries::Series* compile, bool all_watched) {
  if (!opt.slice_watch) return nullptr;
  return {{"gap_us", static_cast<double>(kSliceGapNs) / 1e3},
          {"every_run_watched", all_watched},
          {"eager", slice_report(eager)},
          {"compile", compile ? slice_report(*compile) : nlohmann::json()}};
}

BaselineRounds time_baselines(Judge& j, py::handle warm_inputs, bool watch_all = false) {
  const SandboxOptions& opt = j.opt;
  BaselineRounds out;
  // Compiled already, before the exclusive lock (judge_precompile_baseline): its first call done.
  py::object compiled = !opt.profile_compile ? py::none()
                        : j.precompiled      ? j.precompiled
                                             : compile_reference(j, &out.compile_error);
  const bool pre_runs = room_for_pre_runs(j);
  const std::vector<bool> watched = rounds_to_watch(j, opt.timed_runs, watch_all);
  TimedSeries series(2, opt.record_kernels);
  guarded(Category::kTaskError, "warming up the eager reference",
          [&] { warm_up(j.reference, warm_inputs, timing_options(opt)); });
  compiled = warm_compiled(j, compiled, warm_inputs, &out.compile_error);
  for (int k = 0; k < opt.timed_runs; ++k) {
    py::object inputs;
    guarded(Category::kTaskError, fmt::format("baseline round {}: drawing inputs", k),
            [&] { inputs = draw_inputs(j.task, j.device, timed_seed(j, k)); });
    // Each timed run after a pre-run, as in the candidate's rounds.
    guarded(Category::kTaskError, fmt::format("baseline round {}: timing the eager reference", k), [&] {
      if (pre_runs) (void)call_model(j.reference, warm_inputs);
      (void)series.run(kEager, j.reference, clone_tree(inputs), opt.flush_l2, watched[static_cast<size_t>(k)]);
    });
    if (!compiled.is_none()) {
      try {
        if (pre_runs) (void)call_model(compiled, warm_inputs);
        (void)series.run(kCompile, compiled, clone_tree(inputs), opt.flush_l2, watched[static_cast<size_t>(k)]);
      } catch (const std::exception& e) {
        out.compile_error = std::string(e.what()).substr(0, 2000);
        compiled = py::none();
      }
    }
    inputs = py::none();
    j.release_cached();
  }
  std::vector<TimedSeries::Series> s = series.finish();
  // Another context ran on the GPU during a watched run: the rest may hold such stretches too.
  if (!watch_all && (s[kEager].contended() || s[kCompile].contended())) {
    return time_baselines(j, warm_inputs, /*watch_all=*/true);
  }
  out.eager = TimingStats::from_samples(s[kEager].ms, s[kEager].gpu_ms);
  out.eager_kernels = kernel_table(summarize_kernels(s[kEager].kernels), opt.timed_runs);
  if (!out.compile_error && opt.profile_compile) {
    out.compile = TimingStats::from_samples(s[kCompile].ms, s[kCompile].gpu_ms);
    out.compile_kernels = kernel_table(summarize_kernels(s[kCompile].kernels), opt.timed_runs);
  }
  out.slice_watch = slice_watch_report(opt, s[kEager], out.compile ? &s[kCompile] : nullptr, watch_all);
  return out;
}

nlohmann::json cache_entry(const BaselineRounds& b, const nlohmann::json& backends) {
  return {{"eager", b.eager ? b.eager->to_json() : nlohmann::json()},
          {"compile", b.compile ? b.compile->to_json() : nlohmann::json()},
          {"compile_error", b.compile_error ? nlohmann::json(*b.compile_error) : nlohmann::json()},
          {"eager_kernels", b.eager_kernels},
          {"compile_kernels", b.compile_kernels},
          {"backends", backends}};
}

std::optional<TimingStats> stats_of(const nlohmann::json& entry, const char* which) {
  if (!entry.contains(which) || !entry[which].is_object()) return std::nullopt;
  return TimingStats::from_json(entry[which]);
}

}  // namespace

void judge_precompile_baseline(Judge& j) {
  const SandboxOptions& opt = j.opt;
  if (!j.gpu || !opt.profile_compile) return;
  if (opt.use_baseline_cache && BaselineCache::of(opt.resolved_cache_dir()).get(baseline_key(j))) return;
  py::object cuda = py::module_::import("torch").attr("cuda");
  try {
    cuda.attr("set_per_process_memory_fraction")(kPrecompileMemoryFraction);
    py::object warm = draw_inputs(j.task, j.device, j.input_seed(opt.trials));  // as judge_profile's warm-up
    std::optional<std::string> error;
    py::object compiled = compile_reference(j, &error);
    if (!compiled.is_none()) {
      (void)call_model(compiled, warm);
      synchronize(j.device);
      j.precompiled = compiled;
    }
  } catch (const std::exception& e) {
    j.precompiled = py::object();
    CA_LOG_INFO("sandbox", "torch.compile of {} before the GPU's lock failed; it compiles in the lock: {}",
                j.req.task_path, std::string(e.what()).substr(0, 300));
  }
  cuda.attr("empty_cache")();
  cuda.attr("set_per_process_memory_fraction")(opt.gpu_memory_fraction);
}

void judge_profile(Judge& j) {
  const SandboxOptions& opt = j.opt;
  EvalResult& result = j.result;
  const bool candidate = j.candidate != nullptr;
  Laps laps;  // what the exclusive lock's span, and so evaluations per GPU-minute, are made of
  py::object warm;
  guarded(Category::kTaskError, "drawing the warm-up inputs",
          [&] { warm = draw_inputs(j.task, j.device, j.input_seed(opt.trials)); });
  nlohmann::json backends = {{"judge", backend_settings()}};
  const fs::path cache_dir = opt.resolved_cache_dir();
  const BaselineCache cache = BaselineCache::of(cache_dir);
  const BaselineKey key = baseline_key(j);
  std::optional<nlohmann::json> cached;
  if (opt.use_baseline_cache) cached = cache.get(key);
  result.reports["timing_inputs"] = opt.timed_runs;
  result.reports["backends"] = backends;

  if (!candidate) {
    // The baselines alone (the `baselines` mode): the cache's entry, or eager and torch.compile
    // timed now in rounds of their own.
    TimingSummary timings;
    nlohmann::json entry;
    if (cached) {
      entry = *cached;
      timings.baselines_cached = true;
    } else {
      const BaselineRounds b = time_baselines(j, warm);
      result.reports["timing"] = {{"slice_watch", b.slice_watch}};
      entry = cache_entry(b, backends["judge"]);
      if (opt.use_baseline_cache && entry["compile_error"].is_null()) cache.put(key, entry);
    }
    timings.eager = stats_of(entry, "eager");
    timings.compile = stats_of(entry, "compile");
    if (entry["compile_error"].is_string()) timings.compile_error = entry["compile_error"].get<std::string>();
    result.timings = timings;
    result.reports["kernels"] = {{"eager", entry.value("eager_kernels", nlohmann::json::array())},
                                 {"compile", entry.value("compile_kernels", nlohmann::json::array())}};
    return;
  }

  // torch.compile in this evaluation's rounds: always under "fresh", else when the cache has no
  // entry (or the entry has no torch.compile timing to carry over).
  const bool cached_compile = cached && opt.compile_baseline == "cached" && stats_of(*cached, "compile").has_value();
  std::optional<std::string> compile_error;  // (a failed torch.compile is never cached)
  py::object compiled =
      opt.profile_compile && !cached_compile && !compile_error ? compile_reference(j, &compile_error) : py::none();
  laps.lap("setup");

  // Warm-ups: the eager reference, torch.compile (its compilation), the candidate.
  TimedSeries series(2, opt.record_kernels);
  guarded(Category::kTaskError, "warming up the eager reference",
          [&] { warm_up(j.reference, warm, timing_options(opt)); });
  laps.lap("warmup_eager");
  compiled = warm_compiled(j, compiled, warm, &compile_error);
  laps.lap("warmup_compile");
  j.candidate->set_phase("profile");
  py::object warm_ref;
  guarded(Category::kTaskError, "running the reference on the warm-up inputs", [&] {
    j.reference_outputs(warm, &warm_ref);
    j.reserve_outputs(warm_ref);
  });
  warm_ref = py::none();
  const bool pre_runs = room_for_pre_runs(j);
  laps.lap("warmup_reference_outputs");
  j.warm_up_candidate(warm, pre_runs);
  if (!pre_runs) warm = py::none();  // one input set at a time (the memory plan)
  j.release_cached();
  laps.lap("warmup_candidate");

  // The rounds: eager, torch.compile, the candidate, one after the other on one input set.
  const std::vector<bool> watched = rounds_to_watch(j, opt.timed_runs, /*all=*/false);
  std::vector<double> claimed, host_ms, round_trips, spans;
  std::vector<std::string> wheres;
  int unjoined = 0, cand_hold_timeouts = 0;
  int64_t traffic_bytes = 0;
  for (int k = 0; k < opt.timed_runs; ++k) {
    const std::string where = fmt::format("timed run {}", k);
    py::object inputs, ref, ref64;
    guarded(Category::kTaskError, where + ": drawing inputs",
            [&] { inputs = draw_inputs(j.task, j.device, timed_seed(j, k)); });
    laps.lap("rounds_inputs");
    guarded(Category::kTaskError, where + ": timing the eager reference", [&] {
      if (pre_runs) (void)call_model(j.reference, warm);
      // Eager's timed output is the reference's output for this round.
      ref = series.run(kEager, j.reference, clone_tree(inputs), opt.flush_l2, watched[static_cast<size_t>(k)]).output;
    });
    laps.lap("rounds_eager");
    guarded(Category::kTaskError, where + ": the float64 reference and the outputs' block", [&] {
      ref64 = j.float64_outputs(inputs);
      synchronize(j.device);
      j.reserve_outputs(ref);
    });
    j.release_cached();
    laps.lap("rounds_reference64");
    if (!compiled.is_none()) {
      try {
        if (pre_runs) (void)call_model(compiled, warm);
        (void)series.run(kCompile, compiled, clone_tree(inputs), opt.flush_l2, watched[static_cast<size_t>(k)]);
      } catch (const std::exception& e) {
        compile_error = std::string(e.what()).substr(0, 2000);
        compiled = py::none();
      }
      j.release_cached();
      laps.lap("rounds_compile");
    }
    if (pre_runs) j.pre_run_candidate(where);
    RunFlags flags;
    flags.defer_report = true;
    flags.bracket = true;
    CandidateRun run = j.run_candidate(inputs, flags, where);
    wheres.push_back(where);
    laps.lap("rounds_candidate");
    CompareResult cmp;
    guarded(Category::kRuntimeError, where + ": comparing outputs", [&] { cmp = j.compare(ref, ref64, run.outputs); });
    if (!cmp.ok && cmp.precision_failure)
      throw Failure{Category::kPrecision, fmt::format("{}: {}: {}", where, cmp.path, cmp.reason)};
    if (!cmp.ok)
      throw Failure{Category::kTimingMismatch,
                    fmt::format("an output produced while timed is wrong ({}: {}: {}): results cached across calls, "
                                "work finished after forward returned, or a shortcut taken only when timed",
                                where, cmp.path, cmp.reason)};
    claimed.push_back(run.ms);
    host_ms.push_back(run.host_ms);
    round_trips.push_back(run.round_trip_ms);
    spans.push_back(run.bracket_ms);
    if (!run.joined) ++unjoined;
    if (!run.held) ++cand_hold_timeouts;
    if (k == 0) traffic_bytes = tree_tensor_bytes(inputs) + tree_tensor_bytes(ref);
    inputs = ref = ref64 = py::none();
    j.release_cached();
    laps.lap("rounds_compare");
  }
  const std::vector<GpuActivity> cand_gpu = j.report_deferred_runs(wheres);
  laps.lap("candidate_records");
  std::vector<TimedSeries::Series> base = series.finish();
  laps.lap("baseline_records");
  // The slice watch saw another context run on the GPU during a watched round (the candidate's
  // process, say, keeping a kernel of a context of its own there): the rounds not watched may hold
  // such stretches too, so eager (and torch.compile where these rounds timed it) are timed again in
  // rounds of their own on the same input sets, every run watched and corrected.
  const bool compile_in_rounds = !compiled.is_none() && !compile_error;
  nlohmann::json slice_watch = slice_watch_report(opt, base[kEager], compile_in_rounds ? &base[kCompile] : nullptr, false);
  if (base[kEager].contended() || (compile_in_rounds && base[kCompile].contended())) {
    py::object again;
    guarded(Category::kTaskError, "drawing the warm-up inputs again",
            [&] { again = draw_inputs(j.task, j.device, j.input_seed(opt.trials)); });
    const BaselineRounds b = time_baselines(j, again, /*watch_all=*/true);
    laps.lap("slice_watch_retimed");
    base[kEager].ms = b.eager->ms;
    base[kEager].gpu_ms = b.eager->gpu_ms;
    if (compile_in_rounds && b.compile) {
      base[kCompile].ms = b.compile->ms;
      base[kCompile].gpu_ms = b.compile->gpu_ms;
    }
    slice_watch["retimed"] = b.slice_watch;
  }

  // The candidate's samples: its claimed interval, or the GPU's span of its run when longer.
  std::vector<double> cand_ms = claimed, cand_gpu_ms;
  int cand_extended = 0;
  for (size_t k = 0; k < cand_gpu.size() && k < cand_ms.size(); ++k) {
    if (cand_gpu[k].span_ms > cand_ms[k]) cand_ms[k] = cand_gpu[k].span_ms, ++cand_extended;
    cand_gpu_ms.push_back(cand_gpu[k].busy_ms);
  }
  // Then the judge's own floor (judge_bracket.h): what its context saw the run take, less the
  // calibrated hand-overs. Everything above is the candidate process's claim.
  nlohmann::json bracket_report = nullptr;
  if (j.bracket) {
    const std::vector<double> floors = bracket_floors(spans, j.bracket_calibration);
    int raised = 0;
    for (size_t k = 0; k < floors.size() && k < cand_ms.size(); ++k)
      if (floors[k] > cand_ms[k]) cand_ms[k] = floors[k], ++raised;
    bracket_report = {{"calibration",
                       {{"median_ms", j.bracket_calibration.median_ms},
                        {"spread_ms", j.bracket_calibration.spread_ms},
                        {"runs", j.bracket_calibration.runs}}},
                      {"span_median_ms", median(spans)},
                      {"floor_median_ms", median(floors)},
                      {"runs_raised_to_floor", raised}};
  }
  TimingSummary timings;
  timings.eager = TimingStats::from_samples(base[kEager].ms, base[kEager].gpu_ms);
  timings.candidate = TimingStats::from_samples(cand_ms, cand_gpu_ms);
  nlohmann::json kernels = {{"eager", kernel_table(summarize_kernels(base[kEager].kernels), opt.timed_runs)},
                            {"compile", nlohmann::json::array()},
                            {"candidate", kernel_table(j.timed_kernels, opt.timed_runs)}};

  // torch.compile: timed in these rounds, or the cache's timing carried over by eager's drift
  // (re-timed, with the cache entry, when the drift is beyond the band). The cache's eager timing
  // is a cross-check of this evaluation's (reports.timing.baseline_check).
  nlohmann::json baseline_check = nullptr;
  std::string compile_source =
      opt.profile_compile ? "none (torch.compile failed)" : "none (sandbox.profile_compile off)";
  std::vector<double> compile_scale_num, compile_scale_den;  // cached compile, and the eager it is relative to
  std::vector<double> compile_paired;                        // compile timed in these rounds
  std::optional<TimingStats> cached_eager = cached ? stats_of(*cached, "eager") : std::nullopt;
  const double drift =
      cached_eager && cached_eager->median_ms > 0 ? timings.eager->median_ms / cached_eager->median_ms : 1.0;
  const bool drifted = cached_eager && drifted_beyond(timings.eager->ms, cached_eager->ms, opt.baseline_drift);
  if (cached_eager)
    baseline_check = {{"cached_eager_median_ms", cached_eager->median_ms},
                      {"eager_median_ms", timings.eager->median_ms},
                      {"drift", drift},
                      {"band", opt.baseline_drift},
                      {"retimed", drifted && cached_compile}};
  BaselineRounds rounds;  // this evaluation's, for the cache
  rounds.eager = timings.eager;
  rounds.eager_kernels = kernels["eager"];
  if (!compiled.is_none() && !compile_error) {
    timings.compile = TimingStats::from_samples(base[kCompile].ms, base[kCompile].gpu_ms);
    kernels["compile"] = kernel_table(summarize_kernels(base[kCompile].kernels), opt.timed_runs);
    compile_paired = base[kCompile].ms;
    compile_source = "timed in this evaluation's rounds";
    rounds.compile = timings.compile;
    rounds.compile_kernels = kernels["compile"];
    if (opt.use_baseline_cache) j.baselines_to_cache.emplace(key, cache_entry(rounds, backends["judge"]));
  } else if (cached_compile) {
    TimingStats reference_eager = *cached_eager;
    TimingStats compile_stats = *stats_of(*cached, "compile");
    bool retime_failed = false;
    kernels["compile"] = cached->value("compile_kernels", nlohmann::json::array());
    if (drifted) {
      // The GPU runs eager differently from when the cache entry was made: eager and
      // torch.compile timed again, in rounds of their own, and the entry replaced.
      py::object again;
      guarded(Category::kTaskError, "drawing the warm-up inputs again",
              [&] { again = draw_inputs(j.task, j.device, j.input_seed(opt.trials)); });
      laps.lap("stats");
      BaselineRounds b = time_baselines(j, again);
      laps.lap("retimed_baselines");
      if (b.compile) {
        reference_eager = *b.eager;
        compile_stats = *b.compile;
        j.baselines_to_cache.emplace(key, cache_entry(b, backends["judge"]));
        kernels["compile"] = b.compile_kernels;
      } else {
        // It timed before, without a solution beside it; failing now, beside one, is no fact of
        // the task's (a solution can take the GPU's memory from under it): the cached timing is
        // carried over by this evaluation's eager, as when eager has not drifted.
        result.reports["compile_retime_error"] = b.compile_error.value_or("").substr(0, 500);
        retime_failed = true;
      }
    }
    if (!compile_error) {
      compile_scale_num = compile_stats.ms;
      compile_scale_den = reference_eager.ms;
      const double factor = reference_eager.median_ms > 0 ? timings.eager->median_ms / reference_eager.median_ms : 1.0;
      timings.compile = compile_stats.scaled(factor);
      timings.baselines_cached = true;
      compile_source = !drifted ? "cache, carried over by eager's drift"
                       : retime_failed
                           ? "cache, carried over by eager's drift (eager drifted beyond the band; re-timing "
                             "torch.compile failed beside the solution)"
                           : "re-timed (eager drifted beyond the band), carried over by eager's drift";
    }
  } else if (opt.use_baseline_cache && !compile_error && (!cached_eager || drifted)) {
    // Eager alone: the cross-check's reference.
    j.baselines_to_cache.emplace(key, cache_entry(rounds, backends["judge"]));
  }
  if (compile_error) timings.compile_error = *compile_error;
  result.timings = timings;
  result.reports["kernels"] = kernels;
  result.reports["roofline"] = roofline_check(traffic_bytes, timings.candidate->median_ms);

  const int extended_eager = base[kEager].extended,
            extended_compile = compile_paired.empty() ? 0 : base[kCompile].extended;
  result.reports["timing"] = {
      {"protocol", "interleaved rounds: eager, torch.compile, the candidate, on one freshly drawn input set per round"},
      {"rounds", opt.timed_runs},
      {"interval",
       "CUDA events around the forward on the timing stream, every stream it used joined; L2 flushed "
       "and the device synchronized before; the timing stream held until the host had queued the "
       "forward, so that the interval is its GPU time, not the host's launch latency; under the judge's bracket "
       "(timing.bracket) the timing stream waits for the judge's go instead of the hold, and each sample is at "
       "least the judge's span of the run less the calibrated hand-overs; under the slice watch "
       "(timing.slice_watch) each eager and torch.compile sample is less the time the GPU gave other "
       "processes' contexts during it"},
      {"compile_source", compile_source},
      {"baseline_check", baseline_check},
      {"runs_extended_by_gpu_span",
       {{"eager", extended_eager}, {"compile", extended_compile}, {"candidate", cand_extended}}},
      {"runs_hold_timed_out",
       {{"eager", base[kEager].hold_timeouts},
        {"compile", compile_paired.empty() ? 0 : base[kCompile].hold_timeouts},
        {"candidate", cand_hold_timeouts}}},
      {"pre_runs", pre_runs},
      {"candidate_unjoined_runs", unjoined},
      {"bracket", bracket_report},
      {"slice_watch", slice_watch},
      {"candidate_host_median_ms", median(host_ms)}};

  // The candidate's timings are its process's claims; the judge's own clock around each run
  // (inputs handed over to outputs back) bounds them from above (docs/integrity.md, "Trust").
  result.reports["timing_check"] = {{"claimed_median_ms", median(claimed)},
                                    {"judge_round_trip_median_ms", median(round_trips)},
                                    {"within_round_trip", true}};
  for (size_t k = 0; k < cand_ms.size(); ++k)
    if (cand_ms[k] > round_trips[k] + 1.0) {
      result.reports["timing_check"]["within_round_trip"] = false;
      throw Failure{Category::kTampering,
                    fmt::format("timed run {}: the candidate process claimed {:.3f} ms for a run the judge saw take "
                                "{:.3f} ms from inputs to outputs",
                                k, cand_ms[k], round_trips[k])};
    }

  RewardInputs rin;
  rin.correct = result.correct.value_or(false);
  // Every torch.compile of this function's runs ran after the solution's code had started.
  rin.compile_failed_beside_solution = compile_error.has_value();
  if (timings.candidate->median_ms > 0) {
    const SpeedupInterval vs_eager = paired_speedup_interval(timings.eager->ms, timings.candidate->ms);
    nlohmann::json intervals = {{"vs_eager", vs_eager.to_json()}};
    rin.speedup_vs_eager = result.speedup_vs_eager = vs_eager.speedup;
    rin.low_vs_eager = vs_eager.low;
    std::optional<SpeedupInterval> vs_compile;
    if (!compile_paired.empty())
      vs_compile = paired_speedup_interval(compile_paired, timings.candidate->ms);
    else if (!compile_scale_num.empty())
      vs_compile =
          paired_speedup_interval(timings.eager->ms, timings.candidate->ms, compile_scale_num, compile_scale_den);
    if (vs_compile) {
      intervals["vs_compile"] = vs_compile->to_json();
      rin.speedup_vs_compile = result.speedup_vs_compile = vs_compile->speedup;
      rin.low_vs_compile = vs_compile->low;
    }
    intervals["rule"] = opt.reward_rule;
    result.reports["speedup_interval"] = intervals;
  }
  // What the candidate's process said of its own PyTorch settings (after the solution loaded).
  result.reports["backends"]["candidate"] = j.candidate_backends;
  laps.lap("stats");
  result.reports["profile_seconds"] = laps.to_json();
  if (j.req.mode == EvalMode::kEvaluate)
    result.reward = compute_reward(opt.reward, rin, opt.speedup_margin, opt.reward_rule);
}

}  // namespace cuda_agent::sandbox
