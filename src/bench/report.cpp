#include "cuda_agent/bench/report.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/svg_plot.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

using nlohmann::json;

const json& field(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string fmt_ms(const json& result, const char* which) {
  const std::optional<double> ms = number_field(field(field(result, "timings"), which), "median_ms");
  return ms ? fmt::format("{:.3f}", *ms) : "-";
}

std::string meta_value(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Rows of the per-level tables: each level in numeric order, then the overall row.
std::vector<std::pair<std::string, const json*>> table_rows(const json& metrics) {
  std::vector<std::pair<std::string, const json*>> rows;
  const json& levels = field(metrics, "levels");
  for (const std::string& k : sorted_level_keys(levels)) rows.emplace_back(level_label(k), &levels.at(k));
  rows.emplace_back("**Overall**", &field(metrics, "overall"));
  return rows;
}

void meta_section(std::ostringstream& out, const json& meta) {
  if (!meta.is_object() || meta.empty()) return;
  std::vector<std::string> keys = {"split", "date", "gpu", "torch_version", "run_dir"};
  keys.erase(std::remove_if(keys.begin(), keys.end(), [&](const std::string& k) { return !meta.contains(k); }),
             keys.end());
  std::vector<std::string> rest;
  for (auto it = meta.begin(); it != meta.end(); ++it)
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) rest.push_back(it.key());
  std::sort(rest.begin(), rest.end());
  keys.insert(keys.end(), rest.begin(), rest.end());
  for (const std::string& k : keys) out << fmt::format("- **{}**: {}\n", md_cell(k), md_cell(meta_value(meta.at(k))));
  out << "\n";
}

// Passing results of a row that were verified only (no GPU): their speed is unknown, not 0%.
int not_timed(const json& m) { return static_cast<int>(number_field(m, "passed_not_timed").value_or(0)); }
bool nothing_timed(const json& m) {
  const int passed = static_cast<int>(number_field(m, "passed").value_or(0));
  return passed > 0 && not_timed(m) == passed;
}

// A speed cell: "not timed" where every correct result was verified only, and the count of those
// that were beside the figure where some were.
std::string speed_cell(const json& m, const std::string& figure) {
  if (nothing_timed(m)) return "not timed";
  return not_timed(m) > 0 ? fmt::format("{} ({} correct not timed)", figure, not_timed(m)) : figure;
}

void table1_section(std::ostringstream& out, const json& metrics) {
  out << "## Results (Table 1 of the CUDA Agent paper)\n\n"
      << "| level | tasks | pass | faster than eager | faster than compile | geomean vs eager | geomean vs compile |\n"
      << "|---|---|---|---|---|---|---|\n";
  for (const auto& [label, m] : table_rows(metrics))
    out << fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", label, meta_value(field(*m, "tasks")),
                       fmt_fraction(*m, "passed", "pass_rate"),
                       speed_cell(*m, fmt_fraction(*m, "faster_than_eager", "faster_than_eager_rate")),
                       speed_cell(*m, fmt_fraction(*m, "faster_than_compile", "faster_than_compile_rate")),
                       nothing_timed(*m) ? "not timed" : fmt_speedup(field(*m, "geomean_vs_eager_correct_only")),
                       nothing_timed(*m) ? "not timed" : fmt_speedup(field(*m, "geomean_vs_compile_correct_only")));
  out << "\nRates are over all tasks of the level; geomeans here are over correct results only (see the next "
         "table and the conventions at the end).\n\n";
  if (not_timed(field(metrics, "overall")) > 0)
    out << fmt::format("{} correct result(s) were verified only (a run without a GPU: `--device cpu`): their "
                       "speed was not measured, so they count as correct and not faster.\n\n",
                       not_timed(field(metrics, "overall")));

  out << "## Geomean speedup: correct only vs failures as 1.0x\n\n"
      << "| level | vs eager, correct only | vs eager, failures as 1.0x | vs compile, correct only | "
         "vs compile, failures as 1.0x | correct results with a speedup (eager / compile) |\n"
      << "|---|---|---|---|---|---|\n";
  for (const auto& [label, m] : table_rows(metrics))
    out << fmt::format("| {} | {} | {} | {} | {} | {} / {} of {} |\n", label,
                       fmt_speedup(field(*m, "geomean_vs_eager_correct_only")),
                       fmt_speedup(field(*m, "geomean_vs_eager_failures_as_1")),
                       fmt_speedup(field(*m, "geomean_vs_compile_correct_only")),
                       fmt_speedup(field(*m, "geomean_vs_compile_failures_as_1")),
                       meta_value(field(*m, "correct_with_speedup_vs_eager")),
                       meta_value(field(*m, "correct_with_speedup_vs_compile")), meta_value(field(*m, "tasks")));
  out << "\n";
}

void fast_p_section(std::ostringstream& out, const json& metrics) {
  if (nothing_timed(field(metrics, "overall"))) {
    out << "## fast_p\n\nNot measured: every correct result was verified only, nothing was timed.\n\n";
    return;
  }
  for (const auto& [key, name] : {std::pair{"fast_p_eager", "eager"}, std::pair{"fast_p_compile", "torch.compile"}}) {
    out << fmt::format("## fast_p vs {} (KernelBench; denominator: all tasks)\n\n| level |", name);
    for (double p : kFastPThresholds) out << fmt::format(" fast_{:g} |", p);
    out << "\n|---|";
    for (size_t i = 0; i < kFastPThresholds.size(); ++i) out << "---|";
    out << "\n";
    for (const auto& [label, m] : table_rows(metrics)) {
      out << "| " << label << " |";
      for (double p : kFastPThresholds) out << " " << fmt_rate(field(field(*m, key), fmt::format("{:g}", p).c_str())) << " |";
      out << "\n";
    }
    out << "\n";
  }
}

void reward_section(std::ostringstream& out, const json& metrics) {
  const auto rows = table_rows(metrics);
  std::vector<std::string> keys = {"-1", "1", "2", "3"};
  std::vector<std::string> bins;
  for (const auto& [label, m] : rows) {
    const json& r = field(*m, "rewards");
    if (r.is_object())
      for (auto it = r.begin(); it != r.end(); ++it)
        if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
  }
  std::sort(keys.begin() + 4, keys.end());
  out << "## Reward distribution\n\n| level |";
  for (const auto& k : keys) out << " reward " << k << " |";
  out << " mean reward |\n|---|";
  for (size_t i = 0; i <= keys.size(); ++i) out << "---|";
  out << "\n";
  for (const auto& [label, m] : rows) {
    out << "| " << label << " |";
    for (const auto& k : keys) {
      const json& n = field(field(*m, "rewards"), k.c_str());
      out << " " << (n.is_number() ? n.dump() : "0") << " |";
    }
    const std::optional<double> mean = number_field(*m, "mean_reward");
    out << " " << (mean ? fmt::format("{:.3f}", *mean) : "-") << " |\n";
  }
  const json& hist = field(field(metrics, "overall"), "raw_speedup_histogram");
  if (hist.is_object() && !hist.empty()) {
    const auto& e = kRawRewardBinEdges;
    bins.push_back(fmt::format("<{:g}", e.front()));
    for (size_t i = 0; i + 1 < e.size(); ++i) bins.push_back(fmt::format("{:g}-{:g}", e[i], e[i + 1]));
    bins.push_back(fmt::format("{:g}+", e.back()));
    out << "\nraw_speedup rewards of results that did not fail, in [lo, hi) bins:\n\n| level |";
    for (const auto& b : bins) out << " " << md_cell(b) << " |";
    out << "\n|---|";
    for (size_t i = 0; i < bins.size(); ++i) out << "---|";
    out << "\n";
    for (const auto& [label, m] : rows) {
      out << "| " << label << " |";
      for (const auto& b : bins) {
        const json& n = field(field(*m, "raw_speedup_histogram"), b.c_str());
        out << " " << (n.is_number() ? n.dump() : "0") << " |";
      }
      out << "\n";
    }
  }
  out << "\n";
}

void failures_section(std::ostringstream& out, const json& metrics) {
  const json& excluded = field(metrics, "excluded_degenerate");
  if (excluded.is_array() && !excluded.empty()) {
    out << "## Excluded as degenerate\n\nThese tasks' references are near-constant, near-zero or do not depend on "
           "their inputs (a constant kernel could pass them); they are not counted in any metric above:";
    for (const auto& id : excluded) out << " " << md_cell(id.is_string() ? id.get<std::string>() : id.dump());
    out << "\n\n";
  }
  out << "## Failures by category\n\n";
  const json& all = field(field(metrics, "overall"), "failures_by_category");
  if (!all.is_object() || all.empty()) {
    out << "No failures.\n\n";
    return;
  }
  const auto rows = table_rows(metrics);
  out << "| category |";
  for (size_t i = 0; i + 1 < rows.size(); ++i) out << " " << rows[i].first << " |";
  out << " total |\n|---|";
  for (size_t i = 0; i < rows.size(); ++i) out << "---|";
  out << "\n";
  for (auto it = all.begin(); it != all.end(); ++it) {
    out << "| " << md_cell(it.key()) << " |";
    for (const auto& [label, m] : rows) {
      const json& n = field(field(*m, "failures_by_category"), it.key().c_str());
      out << " " << (n.is_number() ? n.dump() : "0") << " |";
    }
    out << "\n";
  }
  out << "\n";
}

void tasks_section(std::ostringstream& out, const json& results) {
  std::vector<const json*> sorted;
  for (const json& r : results) sorted.push_back(&r);
  std::map<std::string, size_t> level_rank;
  json levels = json::object();
  for (const json* r : sorted) levels[level_key(*r)] = true;
  const auto keys = sorted_level_keys(levels);
  for (size_t i = 0; i < keys.size(); ++i) level_rank[keys[i]] = i;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const json* a, const json* b) { return level_rank[level_key(*a)] < level_rank[level_key(*b)]; });

  out << "## Tasks\n\n| task | level | result | reward | eager ms | compile ms | candidate ms | vs eager | vs compile | "
         "path |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const json* r : sorted) {
    const std::optional<double> reward = number_field(*r, "reward");
    out << fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", md_cell(string_field(*r, "task_id", "?")),
                       level_key(*r), md_cell(result_label(*r)), reward ? fmt::format("{:g}", *reward) : "-",
                       fmt_ms(*r, "eager"), fmt_ms(*r, "compile"), fmt_ms(*r, "candidate"),
                       fmt_speedup(field(*r, "speedup_vs_eager")), fmt_speedup(field(*r, "speedup_vs_compile")),
                       md_cell(string_field(*r, "build_path", "-")));
  }
  bool header = false;
  for (const json* r : sorted) {
    if (is_passing(*r)) continue;
    if (!header) out << "\nFailures:\n\n", header = true;
    std::string message = string_field(*r, "message");
    if (message.size() > 300) message = message.substr(0, 300) + "...";
    out << fmt::format("- {}: {}: {}\n", md_cell(string_field(*r, "task_id", "?")), md_cell(result_label(*r)),
                       md_cell(message));
  }
  out << "\n";
}

}  // namespace

std::string fmt_rate(const nlohmann::json& rate) {
  return rate.is_number() ? fmt::format("{:.1f}%", 100 * rate.get<double>()) : "-";
}

std::string fmt_fraction(const nlohmann::json& m, const char* count_key, const char* rate_key) {
  const json& rate = field(m, rate_key);
  const json& count = field(m, count_key);
  const json& tasks = field(m, "tasks");
  if (!rate.is_number()) return "-";
  if (!count.is_number() || !tasks.is_number()) return fmt_rate(rate);
  return fmt::format("{} ({}/{})", fmt_rate(rate), count.dump(), tasks.dump());
}

std::string fmt_speedup(const nlohmann::json& x) {
  return x.is_number() ? fmt::format("{:.2f}x", x.get<double>()) : "-";
}

std::string md_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out;
}

std::string level_label(const std::string& key) {
  const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
  return numeric ? "L" + key : key;
}

std::string render_report_md(const nlohmann::json& metrics, const nlohmann::json& results, const nlohmann::json& meta) {
  CA_CHECK(results.is_array(), "render_report_md: results must be a JSON array of result objects, got {}",
           results.type_name());
  for (size_t i = 0; i < results.size(); ++i)
    CA_CHECK(results[i].is_object(), "render_report_md: results[{}] must be a result object, got {}", i,
             results[i].type_name());
  std::ostringstream out;
  const std::string split = string_field(meta, "split");
  out << "# Bench report" << (split.empty() ? "" : ": " + md_cell(split)) << "\n\n";
  meta_section(out, meta);
  table1_section(out, metrics);
  fast_p_section(out, metrics);
  reward_section(out, metrics);
  failures_section(out, metrics);
  tasks_section(out, results);

  out << "---\n\n**Conventions.** Both geomean conventions are reported because they differ whenever a task "
         "fails; check which one a published figure uses before comparing with it.\n\n";
  const json conventions = field(metrics, "conventions").is_object() ? field(metrics, "conventions") : metric_conventions();
  // Logical order first (json objects iterate alphabetically), then any other key.
  std::vector<std::string> order = {"passing", "denominator", "faster", "faster_than_compile", "geomean_correct_only",
                                    "geomean_failures_as_1", "fast_p", "rewards", "failures"};
  for (auto it = conventions.begin(); it != conventions.end(); ++it)
    if (std::find(order.begin(), order.end(), it.key()) == order.end()) order.push_back(it.key());
  for (const std::string& k : order)
    if (conventions.contains(k))
      out << fmt::format("- *{}*: {}\n", md_cell(k), md_cell(meta_value(conventions.at(k))));
  return out.str();
}

std::string render_speedup_by_level_svg(const nlohmann::json& results) {
  CA_CHECK(results.is_array(), "render_speedup_by_level_svg: results must be a JSON array, got {}", results.type_name());
  json levels = json::object();
  std::map<std::string, std::vector<double>> speedups;
  for (const json& r : results) {
    const std::string key = level_key(r);
    levels[key] = true;
    speedups[key];
    if (!is_passing(r)) continue;
    if (auto s = usable_speedup(r, "speedup_vs_eager")) speedups[key].push_back(*s);
  }
  std::vector<SpeedupGroup> groups;
  for (const std::string& k : sorted_level_keys(levels)) groups.push_back({level_label(k), speedups[k]});
  return speedup_strip_svg(groups, "Speedup vs eager of correct results, per level");
}

std::string render_fast_p_svg(const nlohmann::json& metrics) {
  const json& overall = field(metrics, "overall");
  std::vector<Curve> curves;
  if (nothing_timed(overall))  // no data, rather than curves that fall to 0% past p = 0
    return fraction_curves_svg(curves, "fast_p: not measured (verified only, nothing timed)", "p (speedup threshold)",
                               "fast_p (share of all tasks)");
  for (const auto& [key, label] :
       {std::pair{"fast_p_eager", "vs eager"}, std::pair{"fast_p_compile", "vs torch.compile"}}) {
    Curve c{label, {}};
    for (double p : kFastPThresholds)
      if (auto v = number_field(field(overall, key), fmt::format("{:g}", p).c_str())) c.points.emplace_back(p, *v);
    curves.push_back(std::move(c));
  }
  return fraction_curves_svg(curves, "fast_p: share of all tasks that are correct and faster than p",
                             "p (speedup threshold)", "fast_p (share of all tasks)", XMarker{1, "p = 1 (as fast)"});
}

void write_report(const fs::path& run_dir, const nlohmann::json& results, const nlohmann::json& meta) {
  const json metrics = compute_metrics(results);
  const json report = {{"meta", meta}, {"metrics", metrics}, {"results", results}};
  write_file_atomic(run_dir / "report.json", report.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  write_file_atomic(run_dir / "report.md", render_report_md(metrics, results, meta));
  write_file_atomic(run_dir / "speedup_by_level.svg", render_speedup_by_level_svg(results));
  write_file_atomic(run_dir / "fast_p.svg", render_fast_p_svg(metrics));
}

}  // namespace cuda_agent::bench
