// The red-team suite: one evaluation per entry of tests/data/redteam/manifest.json. Every reward
// hack (tests/data/redteam/hacks) must end in the failure category its entry names, and every
// legitimate solution (tests/data/redteam/legit, plus controls) must pass: a false rejection is
// as much a failure as a hack that gets through. The entries are read at static-initialisation
// time so that each becomes its own test, named after the entry.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpu_test_util.h"

using namespace cuda_agent;
using namespace cuda_agent::testing;

namespace {

struct RedTeamEntry {
  std::string name;      // the test's name: letters, digits and '_'
  std::string kind;      // "hack" or "legit"
  std::string task;      // relative to the source tree
  std::string solution;  // relative to the source tree
  // A result category; "pass" (legit); "neutralized" (a hack the defences make harmless: it may
  // pass, but scored honestly, its speedup over eager at most max_speedup); "degenerate" (a hack
  // that passes a task the task check must flag, so that it earns nothing).
  std::string expect;
  double max_speedup = 0;
  // A neutralized hack aimed at the torch.compile baseline: its speedup over torch.compile at most
  // this (0: not checked).
  double max_speedup_vs_compile = 0;
  // Other categories that also count as caught: where two defences race for the same hack (a
  // background thread's late write is seen either by the timed-output check or as a live thread).
  std::vector<std::string> also;
  // A neutralized hack's honest twin: the name of a legit entry of the same task (the same work
  // without the cheat), evaluated in the same test right after it, with the hack's options. The
  // hack's speedup over eager may be at most max_gain_over_twin times the twin's: the cheat's own
  // gain, where an honest kernel alone already reads faster than eager (a launch-bound task).
  std::string twin;
  double max_gain_over_twin = 0;
  // The evaluation's wall time at most this (0: not checked): for a hack that would hold its
  // judge, and with it the GPU's exclusive lock, past sandbox.forward_timeout_s.
  double max_wall_s = 0;
  std::string defence;   // which defence is meant to catch it (printed on failure)
  nlohmann::json options = nlohmann::json::object();  // SandboxOptions overrides
  bool gpu_lock = false;  // evaluated under the GPU's locks (for hacks aimed at them)
  std::string error;     // why this entry (or the whole manifest) is unusable; empty when fine
};

// gtest prints parameters of failed tests; the name is all that is useful.
void PrintTo(const RedTeamEntry& e, std::ostream* os) { *os << e.name; }

bool valid_test_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

RedTeamEntry parse_entry(const nlohmann::json& j, size_t index) {
  RedTeamEntry e;
  e.name = j.value("name", "");
  if (!valid_test_name(e.name)) {
    e.error = fmt::format("entry {}: name '{}' must be non-empty letters, digits and '_'", index, e.name);
    e.name = fmt::format("entry_{}", index);
    return e;
  }
  e.kind = j.value("kind", "");
  e.task = j.value("task", "");
  e.solution = j.value("solution", "");
  e.expect = j.value("expect", "");
  e.defence = j.value("defence", "");
  e.max_speedup = j.value("max_speedup", 0.0);
  e.max_speedup_vs_compile = j.value("max_speedup_vs_compile", 0.0);
  e.twin = j.value("twin", "");
  e.max_gain_over_twin = j.value("max_gain_over_twin", 0.0);
  e.max_wall_s = j.value("max_wall_s", 0.0);
  e.options = j.value("options", nlohmann::json::object());
  const nlohmann::json gpu_lock = j.value("gpu_lock", nlohmann::json(false));
  e.gpu_lock = gpu_lock.is_boolean() && gpu_lock.get<bool>();
  const nlohmann::json also = j.value("also", nlohmann::json::array());
  if (also.is_array())
    for (const auto& a : also)
      if (a.is_string()) e.also.push_back(a.get<std::string>());
  if (!also.is_array() || e.also.size() != also.size()) e.error = "also must be a list of category names";
  else if (e.kind == "legit" && !e.also.empty()) e.error = "a legit entry cannot list other categories (also)";
  else if (e.kind != "hack" && e.kind != "legit") e.error = fmt::format("kind '{}' must be 'hack' or 'legit'", e.kind);
  else if (e.task.empty() || e.solution.empty()) e.error = "task and solution are required";
  else if (e.kind == "legit" && e.expect != "pass") e.error = fmt::format("a legit entry expects 'pass', not '{}'", e.expect);
  else if (e.kind == "hack" && (e.expect.empty() || e.expect == "pass")) e.error = "a hack entry must name a category";
  else if (e.expect == "neutralized" && !(e.max_speedup > 0)) e.error = "a neutralized hack needs max_speedup";
  else if (!e.twin.empty() && (e.expect != "neutralized" || !(e.max_gain_over_twin >= 1)))
    e.error = "twin belongs to a neutralized hack, with max_gain_over_twin of at least 1";
  else if (!e.options.is_object()) e.error = "options must be an object";
  else if (!gpu_lock.is_boolean()) e.error = "gpu_lock must be true or false";
  return e;
}

// Never throws (this runs before main): a broken manifest becomes one failing entry.
std::vector<RedTeamEntry> load_manifest() {
  const std::string path = source_path("tests/data/redteam/manifest.json");
  std::vector<RedTeamEntry> entries;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open it");
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_array()) throw std::runtime_error("the top level must be an array of entries");
    std::set<std::string> names;
    for (size_t i = 0; i < j.size(); ++i) {
      RedTeamEntry e = j[i].is_object() ? parse_entry(j[i], i) : RedTeamEntry{};
      if (!j[i].is_object()) e.name = fmt::format("entry_{}", i), e.error = "not a JSON object";
      if (!names.insert(e.name).second) {
        e.error = fmt::format("duplicate name '{}'", e.name);
        e.name = fmt::format("{}_duplicate_{}", e.name, i);
      }
      entries.push_back(std::move(e));
    }
  } catch (const std::exception& ex) {
    RedTeamEntry bad;
    bad.name = "manifest_unreadable";
    bad.error = fmt::format("{}: {} (fix the file; tests/data/redteam/check_sources.py checks it)", path, ex.what());
    entries = {bad};
  }
  for (RedTeamEntry& e : entries) {
    if (e.twin.empty() || !e.error.empty()) continue;
    const auto twin =
        std::find_if(entries.begin(), entries.end(), [&](const RedTeamEntry& t) { return t.name == e.twin; });
    if (twin == entries.end() || twin->kind != "legit" || twin->task != e.task)
      e.error = fmt::format("twin '{}' must name a legit entry of the same task ({})", e.twin, e.task);
  }
  return entries;
}

// The entry named `name` (load_manifest checked that a twin exists).
const RedTeamEntry& entry_named(const std::string& name) {
  static const std::vector<RedTeamEntry> entries = load_manifest();
  return *std::find_if(entries.begin(), entries.end(), [&](const RedTeamEntry& t) { return t.name == name; });
}

// Fields the integrity work adds to SandboxOptions; set only when this build's header has them,
// so the suite compiles before and after. false: the field does not exist.
template <typename Options>
bool set_provenance(Options& o, const std::string& v) {
  if constexpr (requires { o.provenance = v; }) {
    o.provenance = v;
    return true;
  }
  return false;
}
template <typename Options>
bool set_integrity_checks(Options& o, bool v) {
  if constexpr (requires { o.integrity_checks = v; }) {
    o.integrity_checks = v;
    return true;
  }
  return false;
}
template <typename Options>
bool set_secret_seeds(Options& o, bool v) {
  if constexpr (requires { o.secret_seeds = v; }) {
    o.secret_seeds = v;
    return true;
  }
  return false;
}

// Applies an entry's overrides (keys as in configs/sandbox.yaml); returns what was wrong, or "".
std::string apply_overrides(sandbox::SandboxOptions& o, const nlohmann::json& overrides) {
  try {
    for (const auto& [key, value] : overrides.items()) {
      bool known = true;
      if (key == "precision") o.precision = value.get<std::string>();
      else if (key == "fallback") o.fallback = value.get<std::string>();
      else if (key == "provenance") known = set_provenance(o, value.get<std::string>());
      else if (key == "integrity_checks") known = set_integrity_checks(o, value.get<bool>());
      else if (key == "secret_seeds") known = set_secret_seeds(o, value.get<bool>());
      else if (key == "trials") o.trials = value.get<int>();
      else if (key == "atol") o.atol = value.get<double>();
      else if (key == "rtol") o.rtol = value.get<double>();
      else if (key == "timed_runs") o.timed_runs = value.get<int>();
      else if (key == "timeout_s") o.timeout_s = value.get<double>();
      else if (key == "forward_timeout_s")
        o.forward_timeout_s = value.get<double>();
      else if (key == "gpu_wait_s") o.gpu_wait_s = value.get<double>();
      else if (key == "read_scope") o.read_scope = value.get<std::string>();
      else if (key == "profile_compile")
        o.profile_compile = value.get<bool>();
      else if (key == "compile_baseline")
        o.compile_baseline = value.get<std::string>();
      else return fmt::format("option '{}' is not one this suite maps onto SandboxOptions", key);
      if (!known) return fmt::format("option '{}': SandboxOptions has no such field in this build", key);
    }
  } catch (const nlohmann::json::exception& ex) {
    return fmt::format("options {}: {}", overrides.dump(), ex.what());
  }
  return "";
}

// One object of a result's `timing` ("-" where there is none), for the suite's log.
std::string timing_part(const nlohmann::json& r, const char* key) {
  return r.contains("timing") && r["timing"].is_object() && r["timing"].contains(key) ? r["timing"][key].dump() : "-";
}

class RedTeamGpu : public ::testing::TestWithParam<RedTeamEntry> {};

TEST_P(RedTeamGpu, Verdict) {
  const RedTeamEntry& e = GetParam();
  ASSERT_TRUE(e.error.empty()) << "tests/data/redteam/manifest.json, " << e.name << ": " << e.error;
  for (const std::string* rel : {&e.task, &e.solution})
    ASSERT_TRUE(std::filesystem::is_regular_file(source_path(*rel))) << e.name << ": no such file " << *rel;
  sandbox::SandboxOptions options = fast_options();
  options.profile_compile = false;
  options.timed_runs = 10;
  const std::string bad = apply_overrides(options, e.options);
  ASSERT_TRUE(bad.empty()) << e.name << ": " << bad;
  CA_REQUIRE_GPU();

  const nlohmann::json r = run_eval(e.task, e.solution, sandbox::EvalMode::kEvaluate, options, e.gpu_lock);
  // One line an entry, kept in ctest's log whatever the verdict (scripts/gpu_check.sh keeps it):
  // what the entry got, and how long its evaluation took.
  const auto field = [&](const char* key) { return r.contains(key) ? r[key].dump() : std::string("-"); };
  std::printf(
      "[red team] %s: %s, reward %s, vs eager %s, vs compile %s, %s s; timing.slice_watch %s; timing.bracket %s\n",
      e.name.c_str(), r.value("ok", false) ? "pass" : category_of(r).c_str(), field("reward").c_str(),
      field("speedup_vs_eager").c_str(), field("speedup_vs_compile").c_str(), field("wall_seconds").c_str(),
      timing_part(r, "slice_watch").c_str(), timing_part(r, "bracket").c_str());
  // A failure's reason and where its time went: what a verdict of `timeout` or `crash` was made of.
  if (!r.value("ok", false)) {
    std::printf("[red team] %s: message %s; phase_seconds %s\n", e.name.c_str(),
                r.value("message", std::string()).substr(0, 600).c_str(), field("phase_seconds").c_str());
  }
  const std::string context =
      fmt::format("{} ({}; expected {}; defence: {})\noptions: {}\nresult: {}", e.name, e.kind, e.expect, e.defence,
                  options.to_json().dump(), r.dump(2));
  if (e.max_wall_s > 0) {
    ASSERT_TRUE(r["wall_seconds"].is_number()) << context;
    EXPECT_LE(r["wall_seconds"].get<double>(), e.max_wall_s) << context;
  }
  if (e.kind == "hack" && e.expect == "neutralized") {
    // Scored as an honest solution would be: a failure, or a pass without the cheat's gain.
    if (r.value("ok", false)) {
      ASSERT_TRUE(r["speedup_vs_eager"].is_number()) << context;
      EXPECT_LE(r["speedup_vs_eager"].get<double>(), e.max_speedup) << context;
      if (e.max_speedup_vs_compile > 0) {
        ASSERT_TRUE(r["speedup_vs_compile"].is_number()) << context;  // the baseline was timed
        EXPECT_LE(r["speedup_vs_compile"].get<double>(), e.max_speedup_vs_compile) << context;
      }
      if (!e.twin.empty()) {
        // The honest twin under the same options, in this process: the same cached baselines.
        const RedTeamEntry& twin = entry_named(e.twin);
        const nlohmann::json t = run_eval(twin.task, twin.solution, sandbox::EvalMode::kEvaluate, options, e.gpu_lock);
        const std::string twin_speedup = t.contains("speedup_vs_eager") ? t["speedup_vs_eager"].dump() : "-";
        std::printf("[red team] %s: its honest twin %s: %s, reward %s, vs eager %s; timing.bracket %s\n",
                    e.name.c_str(), twin.name.c_str(), t.value("ok", false) ? "pass" : category_of(t).c_str(),
                    t.contains("reward") ? t["reward"].dump().c_str() : "-", twin_speedup.c_str(),
                    timing_part(t, "bracket").c_str());
        ASSERT_TRUE(t.value("ok", false) && t["speedup_vs_eager"].is_number()) << context << "\ntwin: " << t.dump(2);
        EXPECT_LE(r["speedup_vs_eager"].get<double>(), e.max_gain_over_twin * t["speedup_vs_eager"].get<double>())
            << context << "\ntwin: " << t.dump(2);
      }
    }
  } else if (e.kind == "hack" && e.expect == "degenerate") {
    const nlohmann::json check = r.value("task_check", nlohmann::json::object());
    EXPECT_TRUE(check.is_object() && check.value("degenerate", false)) << context;
  } else if (e.kind == "hack") {
    const std::string got = category_of(r);
    if (std::find(e.also.begin(), e.also.end(), got) == e.also.end()) {
      EXPECT_EQ(got, e.expect) << context;
    }
    EXPECT_FALSE(r.value("ok", true)) << context;
    EXPECT_EQ(r.value("reward", 0.0), -1.0) << context;
  } else {
    EXPECT_TRUE(r.value("ok", false)) << context;
    EXPECT_TRUE(r["correct"].is_boolean() && r["correct"].get<bool>()) << context;
    EXPECT_TRUE(r["category"].is_null()) << context;
  }
}

INSTANTIATE_TEST_SUITE_P(Manifest, RedTeamGpu, ::testing::ValuesIn(load_manifest()),
                         [](const ::testing::TestParamInfo<RedTeamEntry>& info) { return info.param.name; });

}  // namespace
