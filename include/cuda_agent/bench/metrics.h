// Benchmark metrics over a run's result JSONs, per level and overall: the columns of the CUDA
// Agent paper's Table 1, KernelBench's fast_p, the reward distribution and the failures.
//
// Input: a JSON array of results as the bench runner writes them (results/<id>.json). Every
// key may be missing or have the wrong type; such a key counts as absent, never as an error.
// Fields read: task_id, level, ok, correct, category, reward, reward_kind, options.reward,
// options.speedup_margin, speedup_vs_eager, speedup_vs_compile.
//
// Conventions (also returned as text under "conventions", and printed under report.md):
//
//   passing      ok == true and correct == true. Everything else (failed, wrong, missing
//                solution, not verified) is not passing.
//   denominator  every rate and every fast_p value is over ALL tasks of the level (or of the
//                run): failed and missing tasks count as not passing and not faster.
//   faster       speedup > 1 + margin, margin = the result's options.speedup_margin (0.05 when
//                absent), strictly, as in the reward. A speedup counts only when it is a
//                finite number > 0.
//   vs compile   where torch.compile was not timed for a passing result (speedup_vs_compile
//                null: it failed on the task, or profile_compile was off), the result counts
//                as faster than compile iff it is faster than eager, as in the reward.
//   geomean      two conventions, both reported:
//                *_correct_only:    over the passing results that have that speedup; null
//                                   when there are none.
//                *_failures_as_1:   over ALL tasks; a task that is not passing, or a passing
//                                   one without that speedup (e.g. compile not timed), counts
//                                   as 1.0x (the fallback-to-PyTorch convention).
//   fast_p       KernelBench: (passing tasks with speedup > p) / ALL tasks, at each p of
//                kFastPThresholds. fast_0 is the pass rate: at p = 0 every passing task counts,
//                even one without a speedup. The compile curve uses speedup_vs_compile, or
//                speedup_vs_eager where torch.compile was not timed (as above), so
//                fast_1.05 of each curve equals the faster-than rate when all margins are 0.05.
//   rewards      a reward that is not a finite number counts as -1. "rewards" counts the
//                values -1, 1, 2 and 3 (always present, 0 when none; any other value under its
//                own {:g} key); a raw_speedup reward other than -1 (reward_kind, else
//                options.reward, is "raw_speedup") goes into "raw_speedup_histogram" instead,
//                in the bins of kRawRewardBinEdges. mean_reward is over all tasks.
//   failures     failures_by_category counts the results that are not passing, by category
//                ("not_verified" for ok without correct == true, "unknown" without a category).
//   levels       the result's integer level ("1", "2", ...), "unknown" when absent or not an
//                integer.
//
// Thread-safe (pure functions).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::bench {

// The p values of the fast_p curves, in order. JSON keys are formatted with {:g} ("1.05").
inline const std::vector<double> kFastPThresholds = {0, 0.5, 0.8, 1.0, 1.05, 1.2, 1.5, 2, 3, 5};

// Bin edges of the raw_speedup reward histogram: bins "<0.5", "0.5-0.8", ..., "5+"; each bin
// is [lo, hi).
inline const std::vector<double> kRawRewardBinEdges = {0.5, 0.8, 1.0, 1.05, 1.2, 1.5, 2, 3, 5};

// Returns
//   {"overall": M, "levels": {"1": M, "2": M, ...}, "conventions": {name: text, ...}}
// where each M has: tasks, passed, pass_rate, faster_than_eager, faster_than_eager_rate,
// faster_than_compile, faster_than_compile_rate, geomean_vs_eager_correct_only,
// geomean_vs_compile_correct_only, geomean_vs_eager_failures_as_1,
// geomean_vs_compile_failures_as_1, correct_with_speedup_vs_eager,
// correct_with_speedup_vs_compile, fast_p_eager {"0": r, "0.5": r, ...}, fast_p_compile,
// rewards {"-1": n, "1": n, "2": n, "3": n, ...}, raw_speedup_histogram {bin: n} (only bins
// with results), mean_reward, failures_by_category {category: n}.
// Rates, fast_p values and mean_reward are null when there are no tasks.
// Throws Error when `results` is not an array or an element is not an object.
nlohmann::json compute_metrics(const nlohmann::json& results);

// The conventions above as {name: text}, the same object compute_metrics returns.
nlohmann::json metric_conventions();

// ---- field helpers shared by report and compare; tolerant of missing keys and wrong types ----

// obj[key] when obj is an object and the value is a finite number, else nullopt.
std::optional<double> number_field(const nlohmann::json& obj, const char* key);
// obj[key] when obj is an object and the value is a string, else `fallback`.
std::string string_field(const nlohmann::json& obj, const char* key, const std::string& fallback = "");
// ok == true and correct == true.
bool is_passing(const nlohmann::json& result);
// speedup_vs_eager / speedup_vs_compile (`key`) when a finite number > 0, else nullopt.
std::optional<double> usable_speedup(const nlohmann::json& result, const char* key);
// options.speedup_margin, else 0.05.
double speedup_margin(const nlohmann::json& result);
// "1", "2", ... for an integer level (2.0 and "2" count too), else "unknown".
std::string level_key(const nlohmann::json& result);
// "pass" for a passing result, else its category as described under "failures" above.
std::string result_label(const nlohmann::json& result);
// Marks `result` (a result JSON of bench or eval) degenerate when the split flags the task
// (`flagged`) or the evaluation's task check did: result["degenerate"], which the metrics and
// reports read. Returns the mark.
bool mark_degenerate(nlohmann::json& result, bool flagged);
// Level keys sorted numerically, "unknown" (and any other non-number) last.
std::vector<std::string> sorted_level_keys(const nlohmann::json& levels);

}  // namespace cuda_agent::bench
