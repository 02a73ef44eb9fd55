#include "cuda_agent/bench/compare.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/report.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

using nlohmann::json;

const char* const kChanges[] = {"fixed", "broke", "faster", "slower", "same", "only_a", "only_b"};

const json& field(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

json opt_json(std::optional<double> v) { return v ? json(*v) : json(); }

json side_of(const json& r) {
  return {{"result", result_label(r)},
          {"reward", opt_json(number_field(r, "reward"))},
          {"speedup_vs_eager", opt_json(number_field(r, "speedup_vs_eager"))},
          {"speedup_vs_compile", opt_json(number_field(r, "speedup_vs_compile"))}};
}

std::string change_of(const json* a, const json* b) {
  if (!b) return "only_a";
  if (!a) return "only_b";
  const bool pa = is_passing(*a), pb = is_passing(*b);
  if (!pa && pb) return "fixed";
  if (pa && !pb) return "broke";
  if (pa && pb) {
    const auto sa = usable_speedup(*a, "speedup_vs_eager"), sb = usable_speedup(*b, "speedup_vs_eager");
    if (sa && sb) {
      const double ratio = *sb / *sa;
      if (ratio > 1 + kCompareSpeedupTolerance) return "faster";
      if (ratio < 1 - kCompareSpeedupTolerance) return "slower";
    }
  }
  return "same";
}

// Delta cells: rates in percentage points, speedups and rewards as plain differences.
enum class Kind { kCount, kRate, kSpeedup, kReward };

std::string cell(const json& m, const char* key, Kind kind, const char* count_key) {
  const json& v = field(m, key);
  switch (kind) {
    case Kind::kCount: return v.is_number() ? v.dump() : "-";
    case Kind::kRate: return count_key ? fmt_fraction(m, count_key, key) : fmt_rate(v);
    case Kind::kSpeedup: return fmt_speedup(v);
    case Kind::kReward: return v.is_number() ? fmt::format("{:.3f}", v.get<double>()) : "-";
  }
  return "-";
}

std::string delta(const json& a, const json& b, Kind kind) {
  if (!a.is_number() || !b.is_number()) return "-";
  const double d = b.get<double>() - a.get<double>();
  switch (kind) {
    case Kind::kCount: return fmt::format("{:+g}", d);
    case Kind::kRate: return fmt::format("{:+.1f} pp", 100 * d);
    case Kind::kSpeedup: return fmt::format("{:+.2f}x", d);
    case Kind::kReward: return fmt::format("{:+.3f}", d);
  }
  return "-";
}

std::string side_cells(const json& side) {
  if (!side.is_object()) return "- | - | - | -";
  const json& reward = field(side, "reward");
  return fmt::format("{} | {} | {} | {}", md_cell(string_field(side, "result", "?")),
                     reward.is_number() ? fmt::format("{:g}", reward.get<double>()) : "-",
                     fmt_speedup(field(side, "speedup_vs_eager")), fmt_speedup(field(side, "speedup_vs_compile")));
}

}  // namespace

nlohmann::json load_run_results(const fs::path& run_dir) {
  const fs::path dir = run_dir / "results";
  CA_CHECK(fs::is_directory(dir),
           "run folder {} has no results/ folder: pass a folder written by `cuda-agent bench` (its --output), "
           "which holds results/<task id>.json",
           run_dir.string());
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  json results = json::array();
  std::map<std::string, fs::path> seen;
  for (const fs::path& file : files) {
    json r;
    try {
      r = json::parse(read_file(file));
    } catch (const json::exception& e) {
      CA_FAIL("{} is not valid JSON ({}): fix it, or delete it and run the bench again", file.string(), e.what());
    }
    CA_CHECK(r.is_object(), "{} must hold one result object (as `cuda-agent bench` writes), got {}", file.string(),
             r.type_name());
    const std::string id = string_field(r, "task_id", file.stem().string());
    r["task_id"] = id;
    auto [it, fresh] = seen.emplace(id, file);
    CA_CHECK(fresh, "{} and {} both hold task_id '{}': remove one of them", it->second.string(), file.string(), id);
    results.push_back(std::move(r));
  }
  return results;
}

nlohmann::json compare_runs(const fs::path& run_a, const fs::path& run_b) {
  const json results_a = load_run_results(run_a);
  const json results_b = load_run_results(run_b);
  std::map<std::string, std::pair<const json*, const json*>> by_id;
  for (const json& r : results_a) by_id[r.at("task_id").get<std::string>()].first = &r;
  for (const json& r : results_b) by_id[r.at("task_id").get<std::string>()].second = &r;

  json tasks = json::array();
  json changes = json::object();
  for (const char* c : kChanges) changes[c] = 0;
  for (const auto& [id, pair] : by_id) {
    const auto [a, b] = pair;
    const std::string change = change_of(a, b);
    changes[change] = changes[change].get<int>() + 1;
    tasks.push_back({{"id", id},
                     {"level", level_key(a ? *a : *b)},
                     {"a", a ? side_of(*a) : json()},
                     {"b", b ? side_of(*b) : json()},
                     {"change", change}});
  }
  return {{"run_a", run_a.string()},
          {"run_b", run_b.string()},
          {"tasks", tasks},
          {"metrics", {{"a", compute_metrics(results_a)}, {"b", compute_metrics(results_b)}}},
          {"changes", changes}};
}

std::string render_compare_md(const nlohmann::json& comparison) {
  std::ostringstream out;
  out << "# Bench comparison\n\n";
  out << fmt::format("- **A**: {}\n- **B**: {}\n\n", md_cell(string_field(comparison, "run_a", "?")),
                     md_cell(string_field(comparison, "run_b", "?")));

  out << "## Changes from A to B\n\n|";
  for (const char* c : kChanges) out << " " << c << " |";
  out << "\n|";
  for (size_t i = 0; i < std::size(kChanges); ++i) out << "---|";
  out << "\n|";
  for (const char* c : kChanges) {
    const json& n = field(field(comparison, "changes"), c);
    out << " " << (n.is_number() ? n.dump() : "0") << " |";
  }
  out << fmt::format("\n\nfaster / slower: both correct and the speedup vs eager of B / A above {:g} / below {:g}.\n\n",
                     1 + kCompareSpeedupTolerance, 1 - kCompareSpeedupTolerance);

  const json& ma = field(field(comparison, "metrics"), "a");
  const json& mb = field(field(comparison, "metrics"), "b");
  json levels = json::object();
  for (const json* m : {&ma, &mb}) {
    const json& l = field(*m, "levels");
    if (l.is_object())
      for (auto it = l.begin(); it != l.end(); ++it) levels[it.key()] = true;
  }
  std::vector<std::pair<std::string, std::pair<const json*, const json*>>> sections;
  for (const std::string& k : sorted_level_keys(levels))
    sections.push_back({level_label(k), {&field(field(ma, "levels"), k.c_str()), &field(field(mb, "levels"), k.c_str())}});
  sections.push_back({"Overall", {&field(ma, "overall"), &field(mb, "overall")}});

  struct Row {
    const char* name;
    const char* key;
    Kind kind;
    const char* count_key;
    const char* sub = nullptr;  // key inside the object `key` (fast_p)
  };
  const Row rows[] = {
      {"tasks", "tasks", Kind::kCount, nullptr},
      {"pass", "pass_rate", Kind::kRate, "passed"},
      {"faster than eager", "faster_than_eager_rate", Kind::kRate, "faster_than_eager"},
      {"faster than compile", "faster_than_compile_rate", Kind::kRate, "faster_than_compile"},
      {"geomean vs eager, correct only", "geomean_vs_eager_correct_only", Kind::kSpeedup, nullptr},
      {"geomean vs eager, failures as 1.0x", "geomean_vs_eager_failures_as_1", Kind::kSpeedup, nullptr},
      {"geomean vs compile, correct only", "geomean_vs_compile_correct_only", Kind::kSpeedup, nullptr},
      {"geomean vs compile, failures as 1.0x", "geomean_vs_compile_failures_as_1", Kind::kSpeedup, nullptr},
      {"fast_1 vs eager", "fast_p_eager", Kind::kRate, nullptr, "1"},
      {"fast_1 vs compile", "fast_p_compile", Kind::kRate, nullptr, "1"},
      {"mean reward", "mean_reward", Kind::kReward, nullptr},
  };
  out << "## Per level\n\n";
  for (const auto& [label, pair] : sections) {
    const json& a = *pair.first;
    const json& b = *pair.second;
    out << "### " << label << "\n\n| metric | A | B | delta (B - A) |\n|---|---|---|---|\n";
    for (const Row& row : rows) {
      const json& va = row.sub ? field(field(a, row.key), row.sub) : field(a, row.key);
      const json& vb = row.sub ? field(field(b, row.key), row.sub) : field(b, row.key);
      const std::string ca = row.sub ? fmt_rate(va) : cell(a, row.key, row.kind, row.count_key);
      const std::string cb = row.sub ? fmt_rate(vb) : cell(b, row.key, row.kind, row.count_key);
      out << fmt::format("| {} | {} | {} | {} |\n", row.name, a.is_null() ? "-" : ca, b.is_null() ? "-" : cb,
                         delta(va, vb, row.kind));
    }
    out << "\n";
  }

  out << "## Tasks\n\n| task | level | A result | A reward | A vs eager | A vs compile | B result | B reward | "
         "B vs eager | B vs compile | B / A vs eager | change |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const json& tasks = field(comparison, "tasks");
  if (tasks.is_array())
    for (const json& t : tasks) {
      const auto sa = number_field(field(t, "a"), "speedup_vs_eager");
      const auto sb = number_field(field(t, "b"), "speedup_vs_eager");
      const std::string ratio = sa && sb && *sa > 0 ? fmt::format("{:.2f}", *sb / *sa) : "-";
      out << fmt::format("| {} | {} | {} | {} | {} | {} |\n", md_cell(string_field(t, "id", "?")),
                         md_cell(string_field(t, "level", "unknown")), side_cells(field(t, "a")),
                         side_cells(field(t, "b")), ratio, md_cell(string_field(t, "change", "?")));
    }
  return out.str();
}

}  // namespace cuda_agent::bench
