// The bench report of one run: report.json, report.md and two SVG plots, built from the run's
// result JSONs and the metrics of bench/metrics.h.
//
// report.md holds, in order:
//   1. the run's meta data (whatever `meta` gives: split, date, gpu, torch version, run dir, ...)
//   2. a table shaped like the CUDA Agent paper's Table 1: rows L1, L2, L3, ..., Overall;
//      columns pass, faster than eager, faster than compile, geomean vs eager, geomean vs
//      compile, with geomeans over the correct results only ("correct only")
//   3. the same geomeans with failed and missing tasks counted as 1.0x ("failures as 1.0x")
//   4. KernelBench's fast_p vs eager and vs torch.compile, per level, denominator all tasks
//   5. the reward distribution (and the raw_speedup histogram when there are such rewards)
//   6. failures by category and level
//   7. one row per task: id, level, result or category, reward, eager / compile / candidate
//      median ms, speedups, build path
//   8. a footnote stating every convention (see metrics.h)
//
// Thread-safe (pure functions); write_report writes files and is safe to call concurrently
// for different run folders.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::bench {

// report.md's text. `metrics` is compute_metrics(results); `meta` is an object whose keys are
// printed as given (split, date, gpu, torch_version and run_dir first, in that order, then the
// rest alphabetically); a null or non-object meta prints nothing. Table cells are escaped for
// Markdown (| and line breaks). Throws Error when `results` is not an array of objects.
std::string render_report_md(const nlohmann::json& metrics, const nlohmann::json& results,
                             const nlohmann::json& meta);

// Computes the metrics and writes, replacing earlier versions atomically (write_file_atomic):
//   run_dir/report.json          {"meta": meta, "metrics": metrics, "results": results}
//   run_dir/report.md            render_report_md(...)
//   run_dir/speedup_by_level.svg strip/box plot of speedup vs eager of the correct results, per level
//   run_dir/fast_p.svg           fast_p curves, vs eager and vs torch.compile, over all levels
// Creates run_dir when missing. Throws Error for bad results (as compute_metrics) or when a
// file cannot be written (naming the path).
void write_report(const std::filesystem::path& run_dir, const nlohmann::json& results,
                  const nlohmann::json& meta);

// The two SVG documents write_report writes, for callers that place them elsewhere.
std::string render_speedup_by_level_svg(const nlohmann::json& results);
std::string render_fast_p_svg(const nlohmann::json& metrics);

// Shared Markdown formatting (also used by compare), "-" for null or a missing key:
//   fmt_rate(0.625) = "62.5%"; fmt_fraction(m, "passed", "pass_rate") = "62.5% (5/8)" using
//   m["tasks"]; fmt_speedup(1.234) = "1.23x"; md_cell escapes | and replaces line breaks.
std::string fmt_rate(const nlohmann::json& rate);
std::string fmt_fraction(const nlohmann::json& level_metrics, const char* count_key, const char* rate_key);
std::string fmt_speedup(const nlohmann::json& x);
std::string md_cell(const std::string& text);
// "L1" for level key "1", the key itself otherwise.
std::string level_label(const std::string& level_key);

}  // namespace cuda_agent::bench
