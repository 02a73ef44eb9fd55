// Tests for bench metrics (Table 1 columns, fast_p, rewards), the report (report.md, report.json,
// SVG plots) and `bench compare`, on hand-built result JSONs with hand-computed expectations.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

#include "cuda_agent/bench/compare.h"
#include "cuda_agent/bench/metrics.h"
#include "cuda_agent/bench/report.h"
#include "cuda_agent/bench/svg_plot.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using cuda_agent::testing::error_message;

constexpr double kTol = 1e-9;

// A passing result: eager 2 ms; candidate 2 / s_eager ms; compile (when timed) s_compile x the candidate.
json pass(const std::string& id, int level, double reward, double s_eager, json s_compile, double margin = 0.05) {
  const double cand = 2.0 / s_eager;
  return {{"task_id", id}, {"level", level}, {"ok", true}, {"correct", true}, {"category", nullptr},
          {"reward", reward}, {"reward_kind", "milestone"}, {"speedup_vs_eager", s_eager},
          {"speedup_vs_compile", s_compile}, {"options", {{"speedup_margin", margin}, {"reward", "milestone"}}},
          {"timings", {{"eager", {{"median_ms", 2.0}}}, {"candidate", {{"median_ms", cand}}},
                       {"compile", s_compile.is_number() ? json{{"median_ms", s_compile.get<double>() * cand}} : json()}}},
          {"build_path", "nvrtc"}, {"message", ""}};
}

json fail(const std::string& id, int level, const std::string& category, json correct = nullptr) {
  return {{"task_id", id}, {"level", level}, {"ok", false}, {"correct", correct}, {"category", category},
          {"reward", -1.0}, {"message", category + " in " + id}, {"options", {{"speedup_margin", 0.05}}}};
}

// Eight tasks over three levels (speedups vs eager / vs compile):
//   L1: t1 pass 2.0/1.6 (reward 3), t2 pass but slower 0.5/0.4 (reward 1), t3 compile_error
//   L2: t4 pass 1.5, torch.compile not timed (reward 3), t5 missing_solution, t6 pass 1.04/1.2 (reward 1)
//   L3: t7 pass 4.0/2.0 with a raw_speedup reward of 2.0, t8 mismatch (correct false)
json fixture() {
  json t4 = pass("t4", 2, 3, 1.5, nullptr);
  t4["timings"]["compile_error"] = "torch.compile failed";
  json t5 = {{"task_id", "t5"}, {"task_path", "/x/t5/model.py"}, {"ok", false}, {"category", "missing_solution"},
             {"correct", nullptr}, {"reward", -1.0}, {"message", "no solutions/t5/model_new.py"},
             {"options", {{"speedup_margin", 0.05}}}, {"level", 2}};
  json t7 = pass("t7", 3, 2.0, 4.0, 2.0);
  t7["reward_kind"] = "raw_speedup";
  t7["options"]["reward"] = "raw_speedup";
  return json::array({pass("t1", 1, 3, 2.0, 1.6), pass("t2", 1, 1, 0.5, 0.4), fail("t3", 1, "compile_error"), t4, t5,
                      pass("t6", 2, 1, 1.04, 1.2), t7, fail("t8", 3, "mismatch", false)});
}

// fast_p values in the order of kFastPThresholds {0, 0.5, 0.8, 1, 1.05, 1.2, 1.5, 2, 3, 5}.
void expect_fast_p(const json& curve, const std::vector<double>& expected, const char* what) {
  ASSERT_EQ(expected.size(), kFastPThresholds.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(curve.at(fmt::format("{:g}", kFastPThresholds[i])).get<double>(), expected[i], kTol)
        << what << " at p = " << kFastPThresholds[i];
}

// Enough of an XML check for our SVGs: one <svg> root, every start tag closed in order.
bool well_formed(const std::string& s, std::string& why) {
  std::vector<std::string> stack;
  size_t i = 0, roots = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    if (s.compare(i, 2, "<?") == 0) { i = s.find("?>", i); if (i == std::string::npos) return why = "open <?", false; i += 2; continue; }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return why = "unterminated tag", false;
    const std::string tag = s.substr(i + 1, end - i - 1);
    if (tag.empty()) return why = "empty tag", false;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return why = "unexpected </" + tag.substr(1) + ">", false;
      stack.pop_back();
    } else if (tag.back() != '/') {
      if (stack.empty()) ++roots;
      stack.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
    }
    i = end + 1;
  }
  if (!stack.empty()) return why = "unclosed <" + stack.back() + ">", false;
  if (roots != 1) return why = "not exactly one root element", false;
  return true;
}

void expect_svg(const std::string& svg, const char* what) {
  EXPECT_TRUE(svg.rfind("<?xml", 0) == 0 || svg.rfind("<svg", 0) == 0) << what;
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\""), std::string::npos) << what;
  EXPECT_NE(svg.find("viewBox=\"0 0 "), std::string::npos) << what;
  std::string why;
  EXPECT_TRUE(well_formed(svg, why)) << what << ": " << why;
}

// ---- compute_metrics -------------------------------------------------------------------------

TEST(Metrics, LevelOne) {
  json m = compute_metrics(fixture()).at("levels").at("1");
  EXPECT_EQ(m["tasks"], 3);
  EXPECT_EQ(m["passed"], 2);
  EXPECT_NEAR(m["pass_rate"].get<double>(), 2.0 / 3, kTol);
  EXPECT_EQ(m["faster_than_eager"], 1);  // t1 (2.0); t2 (0.5) is correct but slower
  EXPECT_NEAR(m["faster_than_eager_rate"].get<double>(), 1.0 / 3, kTol);  // denominator: all 3 tasks
  EXPECT_EQ(m["faster_than_compile"], 1);  // t1 (1.6)
  EXPECT_NEAR(m["geomean_vs_eager_correct_only"].get<double>(), 1.0, kTol);    // sqrt(2 * 0.5) = 1
  EXPECT_NEAR(m["geomean_vs_compile_correct_only"].get<double>(), 0.8, kTol);  // sqrt(1.6 * 0.4) = sqrt(0.64)
  EXPECT_NEAR(m["geomean_vs_eager_failures_as_1"].get<double>(), 1.0, kTol);   // cbrt(2 * 0.5 * 1) = 1
  EXPECT_NEAR(m["geomean_vs_compile_failures_as_1"].get<double>(), 0.8617738760127535, kTol);  // cbrt(0.64)
  // eager speedups {2, 0.5}: > 0.5 strictly only 2; nothing > 2.
  expect_fast_p(m["fast_p_eager"], {2. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 0, 0, 0}, "L1 eager");
  expect_fast_p(m["fast_p_compile"], {2. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 1. / 3, 0, 0, 0}, "L1 compile");
  EXPECT_EQ(m["rewards"], (json{{"-1", 1}, {"1", 1}, {"2", 0}, {"3", 1}}));
  EXPECT_NEAR(m["mean_reward"].get<double>(), 1.0, kTol);  // (3 + 1 - 1) / 3
  EXPECT_EQ(m["failures_by_category"], (json{{"compile_error", 1}}));
}

TEST(Metrics, LevelTwoCompileNotTimedAndMissingSolution) {
  json m = compute_metrics(fixture()).at("levels").at("2");
  EXPECT_EQ(m["tasks"], 3);
  EXPECT_EQ(m["passed"], 2);
  EXPECT_EQ(m["faster_than_eager"], 1);    // t4 1.5 > 1.05; t6 1.04 is not
  EXPECT_EQ(m["faster_than_compile"], 2);  // t4: compile not timed, faster than eager; t6: 1.2 > 1.05
  EXPECT_NEAR(m["faster_than_compile_rate"].get<double>(), 2.0 / 3, kTol);
  EXPECT_NEAR(m["geomean_vs_eager_correct_only"].get<double>(), 1.2489995996796797, kTol);   // sqrt(1.5 * 1.04)
  EXPECT_NEAR(m["geomean_vs_compile_correct_only"].get<double>(), 1.2, kTol);                // t6 only
  EXPECT_EQ(m["correct_with_speedup_vs_compile"], 1);
  EXPECT_NEAR(m["geomean_vs_eager_failures_as_1"].get<double>(), 1.1597779995297994, kTol);  // cbrt(1.56)
  // t4 (not timed) and t5 (missing) count 1.0: cbrt(1 * 1 * 1.2).
  EXPECT_NEAR(m["geomean_vs_compile_failures_as_1"].get<double>(), 1.0626585691826111, kTol);
  expect_fast_p(m["fast_p_eager"], {2. / 3, 2. / 3, 2. / 3, 2. / 3, 1. / 3, 1. / 3, 0, 0, 0, 0}, "L2 eager");
  // compile curve: t4 uses its eager speedup 1.5, t6 its compile speedup 1.2.
  expect_fast_p(m["fast_p_compile"], {2. / 3, 2. / 3, 2. / 3, 2. / 3, 2. / 3, 1. / 3, 0, 0, 0, 0}, "L2 compile");
  EXPECT_EQ(m["failures_by_category"], (json{{"missing_solution", 1}}));
}

TEST(Metrics, LevelThreeRawSpeedupReward) {
  json m = compute_metrics(fixture()).at("levels").at("3");
  EXPECT_EQ(m["tasks"], 2);
  EXPECT_NEAR(m["pass_rate"].get<double>(), 0.5, kTol);
  EXPECT_NEAR(m["geomean_vs_eager_failures_as_1"].get<double>(), 2.0, kTol);                 // sqrt(4 * 1)
  EXPECT_NEAR(m["geomean_vs_compile_failures_as_1"].get<double>(), 1.4142135623730951, kTol);  // sqrt(2 * 1)
  expect_fast_p(m["fast_p_compile"], {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0, 0, 0}, "L3 compile");  // 2 > 2 is false
  // The raw reward 2.0 goes to the histogram, not to the milestone "2".
  EXPECT_EQ(m["rewards"], (json{{"-1", 1}, {"1", 0}, {"2", 0}, {"3", 0}}));
  EXPECT_EQ(m["raw_speedup_histogram"], (json{{"2-3", 1}}));
  EXPECT_NEAR(m["mean_reward"].get<double>(), 0.5, kTol);  // (2 - 1) / 2
  EXPECT_EQ(m["failures_by_category"], (json{{"mismatch", 1}}));
}

TEST(Metrics, Overall) {
  json all = compute_metrics(fixture());
  json m = all.at("overall");
  EXPECT_EQ(m["tasks"], 8);
  EXPECT_EQ(m["passed"], 5);
  EXPECT_NEAR(m["pass_rate"].get<double>(), 0.625, kTol);
  EXPECT_NEAR(m["faster_than_eager_rate"].get<double>(), 0.375, kTol);   // t1, t4, t7 of 8
  EXPECT_NEAR(m["faster_than_compile_rate"].get<double>(), 0.5, kTol);   // t1, t4, t6, t7 of 8
  EXPECT_NEAR(m["geomean_vs_eager_correct_only"].get<double>(), 1.442237946188418, kTol);     // 6.24^(1/5)
  EXPECT_NEAR(m["geomean_vs_compile_correct_only"].get<double>(), 1.1132630734854962, kTol);  // 1.536^(1/4)
  EXPECT_NEAR(m["geomean_vs_eager_failures_as_1"].get<double>(), 1.2571817667800753, kTol);   // 6.24^(1/8)
  EXPECT_NEAR(m["geomean_vs_compile_failures_as_1"].get<double>(), 1.0551128250028508, kTol); // 1.536^(1/8)
  // fast_1.0 vs eager: t1, t4, t6, t7 over ALL 8 tasks; fast_0 = pass rate; fast_1.05 = faster-than rates.
  expect_fast_p(m["fast_p_eager"], {5. / 8, 4. / 8, 4. / 8, 4. / 8, 3. / 8, 3. / 8, 2. / 8, 1. / 8, 1. / 8, 0}, "eager");
  expect_fast_p(m["fast_p_compile"], {5. / 8, 4. / 8, 4. / 8, 4. / 8, 4. / 8, 3. / 8, 2. / 8, 0, 0, 0}, "compile");
  EXPECT_EQ(m["rewards"], (json{{"-1", 3}, {"1", 2}, {"2", 0}, {"3", 2}}));
  EXPECT_NEAR(m["mean_reward"].get<double>(), 0.875, kTol);  // (3 + 1 - 1 + 3 - 1 + 1 + 2 - 1) / 8
  EXPECT_EQ(m["failures_by_category"], (json{{"compile_error", 1}, {"mismatch", 1}, {"missing_solution", 1}}));
  EXPECT_EQ(sorted_level_keys(all["levels"]), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_TRUE(all["conventions"].contains("geomean_failures_as_1"));
}

TEST(Metrics, MarginIsPerResult) {
  // 1.4 is not > 1 + 0.5; 1.04 is > 1 + 0.01 (and compile not timed follows eager).
  json m = compute_metrics(json::array({pass("a", 1, 1, 1.4, 1.4, 0.5), pass("b", 1, 3, 1.04, nullptr, 0.01)}));
  EXPECT_EQ(m["overall"]["faster_than_eager"], 1);
  EXPECT_EQ(m["overall"]["faster_than_compile"], 1);
}

TEST(Metrics, MissingKeysAndBadInput) {
  const json odd = json::array({json::object(), {{"task_id", "x"}, {"level", "2"}},
                                {{"ok", true}, {"correct", true}, {"speedup_vs_eager", "fast"}, {"options", nullptr}},
                                {{"ok", true}, {"correct", nullptr}, {"reward", nullptr}, {"timings", {{"eager", nullptr}}}},
                                {{"level", 2.0}, {"ok", "yes"}, {"options", {{"speedup_margin", "big"}}}}});
  json m;
  ASSERT_NO_THROW(m = compute_metrics(odd));
  EXPECT_EQ(m["overall"]["tasks"], 5);
  EXPECT_EQ(m["overall"]["passed"], 1);  // the third one: passing without a usable speedup
  EXPECT_NEAR(m["overall"]["fast_p_eager"]["0"].get<double>(), 0.2, kTol);
  EXPECT_EQ(m["overall"]["fast_p_eager"]["0.5"], 0.0);
  EXPECT_TRUE(m["overall"]["geomean_vs_eager_correct_only"].is_null());
  EXPECT_NEAR(m["overall"]["geomean_vs_eager_failures_as_1"].get<double>(), 1.0, kTol);
  EXPECT_NEAR(m["overall"]["mean_reward"].get<double>(), -1.0, kTol);  // no rewards: each counts -1
  EXPECT_EQ(m["levels"]["2"]["tasks"], 2);
  EXPECT_EQ(m["levels"]["unknown"]["tasks"], 3);
  EXPECT_EQ(m["overall"]["failures_by_category"], (json{{"not_verified", 1}, {"unknown", 3}}));
  EXPECT_NO_THROW(render_report_md(m, odd, nullptr));
  TempDir dir("ca-report-odd-");
  EXPECT_NO_THROW(write_report(dir.path(), odd, json::object()));

  const json empty = compute_metrics(json::array());
  EXPECT_EQ(empty["overall"]["tasks"], 0);
  EXPECT_TRUE(empty["overall"]["pass_rate"].is_null());
  EXPECT_NE(error_message([] { compute_metrics(json::object()); }).find("must be a JSON array"), std::string::npos);
  EXPECT_NE(error_message([] { compute_metrics(json::array({json::object(), 3})); }).find("results[1]"),
            std::string::npos);
}

// ---- report ------------------------------------------------------------------------------------

TEST(Report, MarkdownTables) {
  json results = fixture();
  results[0]["task_id"] = "t1|pipe";
  const json meta = {{"split", "fixture"}, {"gpu", "NVIDIA H200"}, {"torch_version", "2.11.0"}, {"run_dir", "runs/x"}};
  const std::string md = render_report_md(compute_metrics(results), results, meta);
  EXPECT_NE(md.find("# Bench report: fixture"), std::string::npos);
  EXPECT_NE(md.find("- **gpu**: NVIDIA H200"), std::string::npos);
  EXPECT_NE(md.find("| level | tasks | pass | faster than eager | faster than compile | geomean vs eager | geomean vs "
                    "compile |"), std::string::npos);
  EXPECT_NE(md.find("| L1 | 3 | 66.7% (2/3) | 33.3% (1/3) | 33.3% (1/3) | 1.00x | 0.80x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| L2 | 3 | 66.7% (2/3) | 33.3% (1/3) | 66.7% (2/3) | 1.25x | 1.20x |"), std::string::npos);
  EXPECT_NE(md.find("| L3 | 2 | 50.0% (1/2) | 50.0% (1/2) | 50.0% (1/2) | 4.00x | 2.00x |"), std::string::npos);
  EXPECT_NE(md.find("| **Overall** | 8 | 62.5% (5/8) | 37.5% (3/8) | 50.0% (4/8) | 1.44x | 1.11x |"), std::string::npos);
  EXPECT_NE(md.find("| **Overall** | 1.44x | 1.26x | 1.11x | 1.06x | 5 / 4 of 8 |"), std::string::npos);  // failures as 1.0x
  EXPECT_NE(md.find("fast_1.05 |"), std::string::npos);
  EXPECT_NE(md.find("| **Overall** | 62.5% | 50.0% | 50.0% | 50.0% | 37.5% | 37.5% | 25.0% | 12.5% | 12.5% | 0.0% |"),
            std::string::npos);
  EXPECT_NE(md.find("| **Overall** | 3 | 2 | 0 | 2 | 0.875 |"), std::string::npos);  // rewards -1, 1, 2, 3, mean
  EXPECT_NE(md.find("| missing_solution | 0 | 1 | 0 | 1 |"), std::string::npos);
  EXPECT_NE(md.find("| t1\\|pipe | 1 | pass | 3 | 2.000 | 1.600 | 1.000 | 2.00x | 1.60x | nvrtc |"), std::string::npos);
  EXPECT_NE(md.find("| t4 | 2 | pass | 3 | 2.000 | - | 1.333 | 1.50x | - | nvrtc |"), std::string::npos);
  EXPECT_NE(md.find("| t5 | 2 | missing_solution | -1 | - | - | - | - | - | - |"), std::string::npos);
  EXPECT_NE(md.find("**Conventions.**"), std::string::npos);
  EXPECT_NE(md.find("counts as 1.0x (fallback to PyTorch)"), std::string::npos);
  EXPECT_NE(md.find("over ALL tasks"), std::string::npos);
}

// Verified-only results (a run without a GPU) have no speed: "not timed", never "0% faster";
// where some results were timed, the count of the others stands beside the figure.
TEST(Report, VerifiedOnlyResultsAreNotTimedRatherThanSlow) {
  json verified = pass("v", 1, 1, 1.0, 1.0);
  verified["mode"] = "verify";
  verified.erase("speedup_vs_eager"), verified.erase("speedup_vs_compile"), verified.erase("timings");
  const json only = json::array({verified, fail("f", 1, "mismatch")});
  json metrics = compute_metrics(only);
  EXPECT_EQ(metrics["overall"]["passed_not_timed"], 1);
  std::string md = render_report_md(metrics, only, json::object());
  EXPECT_NE(md.find("| **Overall** | 2 | 50.0% (1/2) | not timed | not timed | not timed | not timed |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("Not measured"), std::string::npos) << md;
  EXPECT_EQ(render_fast_p_svg(metrics).find("<polyline"), std::string::npos);

  const json mixed = json::array({verified, pass("t", 1, 3, 2.0, 1.5)});
  metrics = compute_metrics(mixed);
  md = render_report_md(metrics, mixed, json::object());
  EXPECT_NE(md.find("50.0% (1/2) (1 correct not timed)"), std::string::npos) << md;
  EXPECT_NE(md.find("fast_1.5"), std::string::npos) << md;
  // A timed run has no such marks.
  md = render_report_md(compute_metrics(fixture()), fixture(), json::object());
  EXPECT_EQ(md.find("| not timed"), std::string::npos) << md;
  EXPECT_EQ(md.find("correct not timed"), std::string::npos) << md;
}

TEST(Report, WriteReportWritesFourFiles) {
  TempDir dir("ca-report-");
  const json meta = {{"split", "<fixture & co>"}, {"date", "2026-12-01"}};
  write_report(dir.path() / "run", fixture(), meta);
  for (const char* f : {"report.json", "report.md", "speedup_by_level.svg", "fast_p.svg"})
    EXPECT_TRUE(fs::is_regular_file(dir.path() / "run" / f)) << f;
  const json report = json::parse(read_file(dir.path() / "run" / "report.json"));
  EXPECT_EQ(report["meta"], meta);
  EXPECT_EQ(report["results"].size(), 8u);
  EXPECT_EQ(report["metrics"]["overall"]["passed"], 5);
  const std::string strip = read_file(dir.path() / "run" / "speedup_by_level.svg");
  expect_svg(strip, "speedup_by_level.svg");
  for (const char* s : {"L1 (n=2)", "L2 (n=2)", "L3 (n=1)", ">1x<", ">0.5x<", ">4x<"})
    EXPECT_NE(strip.find(s), std::string::npos) << s;
  const std::string fast = read_file(dir.path() / "run" / "fast_p.svg");
  expect_svg(fast, "fast_p.svg");
  for (const char* s : {"vs eager", "vs torch.compile", "<polyline", ">100%<", ">p = 1 (as fast)<"})
    EXPECT_NE(fast.find(s), std::string::npos) << s;
}

TEST(SvgPlot, EscapesAndIsDeterministic) {
  EXPECT_EQ(xml_escape("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos;");
  const std::vector<SpeedupGroup> groups = {{"<L&1>", {0.25, 1.0, 3.0, -1.0}}, {"L2", {}}};
  const std::string svg = speedup_strip_svg(groups, "t <&>");
  expect_svg(svg, "strip");
  EXPECT_NE(svg.find("&lt;L&amp;1&gt; (n=3)"), std::string::npos);  // -1 is skipped
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_EQ(svg, speedup_strip_svg(groups, "t <&>"));
  expect_svg(speedup_strip_svg({}, "empty"), "empty strip");
  expect_svg(fraction_curves_svg({}, "empty", "x", "y"), "empty curves");
}

// ---- compare -----------------------------------------------------------------------------------

void write_run(const fs::path& dir, const json& results) {
  for (const json& r : results) write_file_atomic(dir / "results" / (r["task_id"].get<std::string>() + ".json"), r.dump());
}

TEST(Compare, EveryKindOfChange) {
  TempDir dir("ca-compare-");
  const fs::path a = dir.path() / "a", b = dir.path() / "b";
  write_run(a, json::array({fail("fixed", 1, "compile_error"), pass("broke", 1, 3, 1.5, 1.2), pass("faster", 2, 1, 1.0, 1.0),
                            pass("slower", 2, 3, 2.0, 2.0), pass("same", 2, 3, 1.2, 1.1), fail("same_fail", 3, "timeout"),
                            pass("only_a", 3, 3, 1.3, 1.3)}));
  write_run(b, json::array({pass("fixed", 1, 3, 1.3, 1.2), fail("broke", 1, "runtime_error"), pass("faster", 2, 3, 1.5, 1.5),
                            pass("slower", 2, 3, 1.5, 1.5), pass("same", 2, 3, 1.22, 1.1), fail("same_fail", 3, "crash"),
                            pass("only_b", 3, 3, 1.1, 1.1)}));
  // A result without task_id is matched by its file name.
  json unnamed = pass("x", 1, 1, 1.0, 1.0);
  unnamed.erase("task_id");
  write_file_atomic(a / "results" / "unnamed.json", unnamed.dump());
  write_file_atomic(b / "results" / "unnamed.json", unnamed.dump());

  const json c = compare_runs(a, b);
  std::map<std::string, std::string> change;
  for (const json& t : c["tasks"]) change[t["id"]] = t["change"];
  EXPECT_EQ(change, (std::map<std::string, std::string>{{"broke", "broke"}, {"faster", "faster"}, {"fixed", "fixed"},
                                                        {"only_a", "only_a"}, {"only_b", "only_b"}, {"same", "same"},
                                                        {"same_fail", "same"}, {"slower", "slower"}, {"unnamed", "same"}}));
  EXPECT_EQ(c["changes"], (json{{"fixed", 1}, {"broke", 1}, {"faster", 1}, {"slower", 1}, {"same", 3}, {"only_a", 1},
                                {"only_b", 1}}));
  const json& broke = c["tasks"][0];  // sorted by id
  EXPECT_EQ(broke["id"], "broke");
  EXPECT_EQ(broke["level"], "1");
  EXPECT_EQ(broke["a"]["result"], "pass");
  EXPECT_EQ(broke["a"]["speedup_vs_eager"], 1.5);
  EXPECT_EQ(broke["b"]["result"], "runtime_error");
  EXPECT_TRUE(broke["b"]["speedup_vs_eager"].is_null());
  const json& only_a = c["tasks"][3];
  EXPECT_EQ(only_a["id"], "only_a");
  EXPECT_TRUE(only_a["b"].is_null());
  EXPECT_EQ(c["metrics"]["a"]["overall"]["tasks"], 8);
  EXPECT_EQ(c["metrics"]["a"]["overall"]["passed"], 6);
  EXPECT_EQ(c["metrics"]["b"]["overall"]["passed"], 6);
  EXPECT_EQ(c["metrics"]["b"]["levels"]["1"]["passed"], 2);

  const std::string md = render_compare_md(c);
  EXPECT_NE(md.find("| fixed | broke | faster | slower | same | only_a | only_b |"), std::string::npos);
  EXPECT_NE(md.find("| 1 | 1 | 1 | 1 | 3 | 1 | 1 |"), std::string::npos);
  EXPECT_NE(md.find("### L1"), std::string::npos);
  EXPECT_NE(md.find("### Overall"), std::string::npos);
  EXPECT_NE(md.find("| pass | 66.7% (2/3) | 66.7% (2/3) | +0.0 pp |"), std::string::npos) << md;  // L1: broke + fixed
  EXPECT_NE(md.find("| faster | 2 | pass | 1 | 1.00x | 1.00x | pass | 3 | 1.50x | 1.50x | 1.50 | faster |"),
            std::string::npos);
  EXPECT_NE(md.find("| only_b | 3 | - | - | - | - | pass | 3 | 1.10x | 1.10x | - | only_b |"), std::string::npos);
}

TEST(Compare, BadRunFolders) {
  TempDir dir("ca-compare-bad-");
  const std::string msg = error_message([&] { compare_runs(dir.path(), dir.path()); });
  EXPECT_NE(msg.find(dir.path().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("no results/ folder"), std::string::npos) << msg;
  write_file_atomic(dir.path() / "results" / "bad.json", "{not json");
  EXPECT_NE(error_message([&] { load_run_results(dir.path()); }).find("bad.json"), std::string::npos);
  write_file_atomic(dir.path() / "results" / "bad.json", json({{"task_id", "t"}}).dump());
  write_file_atomic(dir.path() / "results" / "t.json", json({{"task_id", "t"}}).dump());
  EXPECT_NE(error_message([&] { load_run_results(dir.path()); }).find("both hold task_id 't'"), std::string::npos);
}

}  // namespace
TEST(DegenerateInMetrics, MarkedFromTheSplitOrTheTaskCheck) {
  nlohmann::json plain = {{"ok", true}, {"task_check", {{"degenerate", false}}}};
  EXPECT_FALSE(bench::mark_degenerate(plain, false));
  EXPECT_EQ(plain["degenerate"], false);
  nlohmann::json checked = {{"ok", true}, {"task_check", {{"degenerate", true}, {"input_independent", true}}}};
  EXPECT_TRUE(bench::mark_degenerate(checked, false));
  nlohmann::json flagged = {{"ok", false}, {"category", "load_error"}};  // no task check ran
  EXPECT_TRUE(bench::mark_degenerate(flagged, true));
  EXPECT_EQ(flagged["degenerate"], true);
}

}  // namespace cuda_agent::bench
