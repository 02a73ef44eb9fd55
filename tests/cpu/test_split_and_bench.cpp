// Tests for benchmark splits (split.yaml, task.yaml sidecars, solution lookup) and for the bench
// summary and result table built from result JSONs.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

#include "cuda_agent/bench/bench_runner.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::bench {
namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = CUDA_AGENT_SOURCE_DIR;

using cuda_agent::testing::error_message;

constexpr const char* kTaskPy = "import torch\nclass Model(torch.nn.Module):\n    pass\n";

// A scratch split folder with task files tasks/<name>/model.py.
class SplitDir {
 public:
  SplitDir() {
    for (const char* t : {"a", "b", "c"}) write_file_atomic(root() / "tasks" / t / "model.py", kTaskPy);
  }
  const fs::path& root() const { return dir_.path(); }
  fs::path split(const std::string& yaml) const {
    write_file_atomic(root() / "split.yaml", yaml);
    return root() / "split.yaml";
  }

 private:
  TempDir dir_{"ca-split-"};
};

// ---- load_split ------------------------------------------------------------------------------

TEST(Split, DemoSplit) {
  const fs::path demo = kSourceDir / "data" / "demo";
  Split s = load_split(demo);
  EXPECT_EQ(s.name, "demo");
  EXPECT_FALSE(s.description.empty());
  EXPECT_EQ(fs::canonical(s.root), fs::canonical(demo));
  ASSERT_EQ(s.tasks.size(), 4u);
  const char* ids[] = {"softmax_rows", "gelu_scale_add", "linear_bias_relu", "conv_bias_relu"};
  const int levels[] = {1, 2, 2, 2};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(s.tasks[i].id, ids[i]);
    EXPECT_EQ(s.tasks[i].level, levels[i]) << ids[i];
    EXPECT_TRUE(s.tasks[i].path.is_absolute()) << s.tasks[i].path;
    EXPECT_TRUE(fs::is_regular_file(s.tasks[i].path)) << s.tasks[i].path;
    EXPECT_EQ(s.tasks[i].path.filename(), "model.py");
    EXPECT_EQ(s.tasks[i].path.parent_path().filename(), ids[i]);
    // Only softmax_rows sets a tolerance (atol 1e-5 in its task.yaml: at 1e-2 zeros would pass).
    if (i == 0) {
      ASSERT_TRUE(s.tasks[i].atol.has_value());
      EXPECT_DOUBLE_EQ(*s.tasks[i].atol, 1e-5);
    } else {
      EXPECT_FALSE(s.tasks[i].atol.has_value()) << ids[i];
    }
    // Every demo task has a solution.
    auto sol = find_solution(demo / "solutions", ids[i]);
    ASSERT_TRUE(sol.has_value()) << ids[i];
    EXPECT_TRUE(fs::is_regular_file(*sol));
  }
  // The split.yaml itself works too.
  Split by_file = load_split(demo / "split.yaml");
  ASSERT_EQ(by_file.tasks.size(), 4u);
  EXPECT_EQ(by_file.tasks[3].path, s.tasks[3].path);
}

TEST(Split, RelativePathsOverridesAndSidecars) {
  SplitDir d;
  // b's sidecar: level 3 and atol 0.5; c's sidecar says level 4 but the split says 2.
  write_file_atomic(d.root() / "tasks" / "b" / "task.yaml", "level: 3\natol: 0.5\n");
  write_file_atomic(d.root() / "tasks" / "c" / "task.yaml", "level: 4\nrtol: 0.25\n");
  const fs::path file = d.split(
      "description: scratch\n"
      "tasks:\n"
      "  - id: a\n"
      "    path: ./tasks/b/../a/model.py\n"
      "    atol: 1e-3\n"
      "    rtol: 2\n"
      "  - id: b\n"
      "    path: tasks/b/model.py\n"
      "  - id: c\n"
      "    path: tasks/c/model.py\n"
      "    level: 2\n");
  Split s = load_split(d.root());
  // No name: the folder's name.
  EXPECT_EQ(s.name, d.root().filename().string());
  EXPECT_EQ(s.description, "scratch");
  ASSERT_EQ(s.tasks.size(), 3u);

  const TaskEntry& a = s.tasks[0];
  EXPECT_EQ(a.path, fs::canonical(d.root() / "tasks" / "a" / "model.py"));
  EXPECT_EQ(a.level, 1);
  ASSERT_TRUE(a.atol.has_value());
  EXPECT_DOUBLE_EQ(*a.atol, 1e-3);
  ASSERT_TRUE(a.rtol.has_value());
  EXPECT_DOUBLE_EQ(*a.rtol, 2.0);  // an int is a number

  const TaskEntry& b = s.tasks[1];
  EXPECT_EQ(b.level, 3);
  ASSERT_TRUE(b.atol.has_value());
  EXPECT_DOUBLE_EQ(*b.atol, 0.5);
  EXPECT_FALSE(b.rtol.has_value());

  const TaskEntry& c = s.tasks[2];
  EXPECT_EQ(c.level, 2);  // split.yaml wins
  ASSERT_TRUE(c.rtol.has_value());
  EXPECT_DOUBLE_EQ(*c.rtol, 0.25);
  EXPECT_EQ(load_split(file).tasks.size(), 3u);
}

TEST(Split, ErrorsNameTheFileAndTheField) {
  SplitDir d;
  const std::string where = (d.root() / "split.yaml").string();
  struct Case {
    const char* yaml;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {"name: x\n", {"'tasks' must be a non-empty list"}},
      {"name: x\ntasks: []\n", {"'tasks' must be a non-empty list"}},
      {"tasks: {a: 1}\n", {"'tasks' must be a non-empty list"}},
      {"tasks:\n  - id: a\n    path: tasks/a/model.py\n  - id: a\n    path: tasks/b/model.py\n",
       {"tasks[1]", "duplicate task id 'a'"}},
      {"tasks:\n  - id: ../../etc\n    path: tasks/a/model.py\n", {"tasks[0]", "task id '../../etc' must be"}},
      {"tasks:\n  - id: a/b\n    path: tasks/a/model.py\n", {"tasks[0]", "task id 'a/b' must be"}},
      {"tasks:\n  - id: ..\n    path: tasks/a/model.py\n", {"task id '..' must be"}},
      {"tasks:\n  - id: a\n    path: tasks/a/model.py\n  - id: z\n    path: tasks/z/model.py\n",
       {"tasks[1]", "task file", "tasks/z/model.py", "does not exist"}},
      {"tasks:\n  - id: a\n    path: tasks/a/model.py\n    lvl: 2\n", {"tasks[0]", "unknown key 'lvl'", "level"}},
      {"tasks:\n  - path: tasks/a/model.py\n", {"tasks[0]", "'id' is required"}},
      {"tasks:\n  - id: a\n", {"tasks[0]", "'path' is required"}},
      {"tasks:\n  - id: a\n    path: tasks/a/model.py\n    level: 0\n", {"tasks[0]", "'level' must be a positive integer"}},
      {"tasks:\n  - id: a\n    path: tasks/a/model.py\n    atol: tight\n", {"tasks[0]", "'atol' must be a number"}},
      {"tasks:\n  - just-a-string\n", {"tasks[0]", "expected a mapping"}},
      {"- a\n- b\n", {"expected a mapping"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    d.split(c.yaml);
    const std::string msg = error_message([&] { load_split(d.root()); });
    EXPECT_NE(msg.find(where), std::string::npos) << msg;
    for (const auto& e : c.expected) EXPECT_NE(msg.find(e), std::string::npos) << "'" << e << "' not in: " << msg;
  }
  // No split at all.
  TempDir empty;
  std::string msg = error_message([&] { load_split(empty.path()); });
  EXPECT_NE(msg.find("no split at " + empty.path().string()), std::string::npos) << msg;
  // A malformed sidecar names the sidecar.
  write_file_atomic(d.root() / "tasks" / "a" / "task.yaml", "atol: loose\n");
  d.split("tasks:\n  - id: a\n    path: tasks/a/model.py\n");
  msg = error_message([&] { load_split(d.root()); });
  EXPECT_NE(msg.find((d.root() / "tasks" / "a" / "task.yaml").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("'atol' must be a number"), std::string::npos) << msg;
}

// Regression test (was a bug in src/bench/split.cpp, load_split, the task.yaml sidecar): `level` is read with
// side["level"].get<int>() without a check, so `level: high` throws nlohmann's type_error (naming
// neither the sidecar nor the field) and `level: 0` is accepted, unlike in split.yaml.
TEST(Split, SidecarLevelIsChecked) {
  SplitDir d;
  d.split("tasks:\n  - id: a\n    path: tasks/a/model.py\n");
  const std::string sidecar = (d.root() / "tasks" / "a" / "task.yaml").string();
  for (const char* yaml : {"level: high\n", "level: 0\n"}) {
    SCOPED_TRACE(yaml);
    write_file_atomic(sidecar, yaml);
    const std::string msg = error_message([&] { load_split(d.root()); });
    EXPECT_NE(msg.find(sidecar), std::string::npos) << msg;
    EXPECT_NE(msg.find("'level'"), std::string::npos) << msg;
  }
}

TEST(Split, FindSolution) {
  TempDir dir;
  write_file_atomic(dir.path() / "folder_task" / "model_new.py", "x = 1\n");
  write_file_atomic(dir.path() / "flat_task.py", "x = 1\n");
  write_file_atomic(dir.path() / "both" / "model_new.py", "x = 1\n");
  write_file_atomic(dir.path() / "both.py", "x = 1\n");
  fs::create_directories(dir.path() / "empty_folder");

  auto s = find_solution(dir.path(), "folder_task");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, dir.path() / "folder_task" / "model_new.py");
  s = find_solution(dir.path(), "flat_task");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, dir.path() / "flat_task.py");
  s = find_solution(dir.path(), "both");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, dir.path() / "both" / "model_new.py");  // the folder layout first
  EXPECT_FALSE(find_solution(dir.path(), "missing").has_value());
  EXPECT_FALSE(find_solution(dir.path(), "empty_folder").has_value());
  EXPECT_FALSE(find_solution(dir.path() / "nope", "flat_task").has_value());
}

// ---- summarize / format_table ----------------------------------------------------------------

nlohmann::json result(const std::string& id, bool ok, nlohmann::json category, nlohmann::json correct, double reward,
                      nlohmann::json eager, nlohmann::json compile, double margin = 0.05) {
  return {{"task_id", id},
          {"ok", ok},
          {"category", std::move(category)},
          {"correct", std::move(correct)},
          {"reward", reward},
          {"speedup_vs_eager", std::move(eager)},
          {"speedup_vs_compile", std::move(compile)},
          {"message", ok ? "" : "something went wrong in " + id},
          {"options", {{"speedup_margin", margin}}},
          {"level", 2}};
}

nlohmann::json sample_results() {
  return nlohmann::json::array({
      result("t_fast", true, nullptr, true, 3.0, 2.0, 1.5),
      result("t_slow", true, nullptr, true, 1.0, 0.5, 0.6),
      result("t_wrong", false, "mismatch", false, -1.0, nullptr, nullptr),
      result("t_broken", false, "compile_error", nullptr, -1.0, nullptr, nullptr),
      result("t_wrong2", false, "mismatch", false, -1.0, nullptr, nullptr),
  });
}

TEST(BenchSummary, CountsRatesAndGeomeans) {
  const nlohmann::json s = summarize(sample_results());
  EXPECT_EQ(s["tasks"], 5);
  EXPECT_EQ(s["passed"], 2);
  EXPECT_DOUBLE_EQ(s["pass_rate"].get<double>(), 0.4);
  EXPECT_EQ(s["faster_than_eager"], 1);
  EXPECT_DOUBLE_EQ(s["faster_than_eager_rate"].get<double>(), 0.2);
  EXPECT_EQ(s["faster_than_compile"], 1);
  EXPECT_DOUBLE_EQ(s["faster_than_compile_rate"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(s["mean_reward"].get<double>(), (3.0 + 1.0 - 3.0) / 5);
  // Geometric means over the correct results only: sqrt(2 * 0.5) = 1, sqrt(1.5 * 0.6).
  EXPECT_NEAR(s["geomean_speedup_vs_eager"].get<double>(), 1.0, 1e-12);
  EXPECT_NEAR(s["geomean_speedup_vs_compile"].get<double>(), std::sqrt(0.9), 1e-12);
  EXPECT_EQ(s["failures_by_category"], (nlohmann::json{{"mismatch", 2}, {"compile_error", 1}}));
}

TEST(BenchSummary, MarginAndEmptyResults) {
  // Exactly 5% is not "faster"; the margin comes from each result's options.
  nlohmann::json rs = nlohmann::json::array({result("a", true, nullptr, true, 1.0, 1.05, 1.0501),
                                             result("b", true, nullptr, true, 1.0, 1.02, 1.02, 0.01)});
  nlohmann::json s = summarize(rs);
  EXPECT_EQ(s["passed"], 2);
  EXPECT_EQ(s["faster_than_eager"], 1);    // b only (1.02 > 1.01)
  EXPECT_EQ(s["faster_than_compile"], 2);  // 1.0501 > 1.05 and 1.02 > 1.01
  EXPECT_TRUE(s["failures_by_category"].empty());

  // A correct result without timings (verify only) counts as passed, not in the geomeans.
  rs = nlohmann::json::array({result("v", true, nullptr, true, 1.0, nullptr, nullptr)});
  s = summarize(rs);
  EXPECT_EQ(s["passed"], 1);
  EXPECT_TRUE(s["geomean_speedup_vs_eager"].is_null());
  EXPECT_TRUE(s["geomean_speedup_vs_compile"].is_null());

  s = summarize(nlohmann::json::array());
  EXPECT_EQ(s["tasks"], 0);
  EXPECT_EQ(s["pass_rate"], 0.0);
  EXPECT_EQ(s["mean_reward"], 0.0);
  EXPECT_TRUE(s["geomean_speedup_vs_eager"].is_null());
  const std::string table = format_table(nlohmann::json::array(), s);
  EXPECT_NE(table.find("pass 0/0"), std::string::npos) << table;
}

TEST(BenchSummary, FormatTable) {
  const nlohmann::json results = sample_results();
  const std::string table = format_table(results, summarize(results));
  EXPECT_EQ(table.rfind("| task | level | result |", 0), 0u) << table;
  for (const char* id : {"t_fast", "t_slow", "t_wrong", "t_broken", "t_wrong2"})
    EXPECT_NE(table.find(std::string("| ") + id + " |"), std::string::npos) << id << "\n" << table;
  EXPECT_NE(table.find("| t_fast | 2 | pass | 3 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| t_wrong | 2 | mismatch | -1 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| t_broken | 2 | compile_error | -1 |"), std::string::npos) << table;
  EXPECT_NE(table.find("2.00x"), std::string::npos) << table;
  EXPECT_NE(table.find("0.50x"), std::string::npos) << table;
  EXPECT_NE(table.find("pass 2/5 (40.0%), faster than eager 20.0%, faster than torch.compile 20.0%, mean reward 0.20"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("geomean speedup 1.00x vs eager, 0.95x vs torch.compile"), std::string::npos) << table;
  // The failures are listed with their messages.
  EXPECT_NE(table.find("- t_wrong: mismatch: something went wrong in t_wrong"), std::string::npos) << table;
  EXPECT_NE(table.find("- t_broken: compile_error: something went wrong in t_broken"), std::string::npos) << table;
  EXPECT_EQ(table.find("- t_fast:"), std::string::npos) << table;
  EXPECT_EQ(table.find("timed under:"), std::string::npos) << table;  // no result says
}

// The settings the baselines were timed under are in the open: TF32 on each side, the policy.
TEST(BenchSummary, FormatTableSaysWhatTheBaselinesWereTimedUnder) {
  nlohmann::json results = sample_results();
  results[1]["precision"] = "strict";
  results[1]["backends"] = {{"judge", {{"matmul_tf32", false}, {"cudnn_tf32", false}}},
                            {"candidate", {{"matmul_tf32", true}, {"cudnn_tf32", false}}}};
  const std::string table = format_table(results, summarize(results));
  EXPECT_NE(table.find("timed under: precision strict; eager and torch.compile: TF32 off for matmuls, off for cuDNN; "
                       "candidate (as the solution left it): TF32 on for matmuls, off for cuDNN"),
            std::string::npos)
      << table;
}

// ---- run_bench without a GPU: resume, missing solutions, output files -------------------------
//
// Nothing here starts Python: results are either reused from disk, or the "worker" is /bin/false
// (CUDA_AGENT_BIN), which ends at once without a result.

class BenchRun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("CUDA_AGENT_BIN")) old_bin_ = v;
    ::setenv("CUDA_AGENT_BIN", "/bin/false", 1);
    for (const char* t : {"a", "b", "c", "d"}) write_file_atomic(root() / "tasks" / t / "model.py", std::string(kTaskPy) + "# " + t + "\n");
    write_file_atomic(root() / "split.yaml",
                      "name: scratch\n"
                      "tasks:\n"
                      "  - {id: a, path: tasks/a/model.py, atol: 0.5}\n"
                      "  - {id: b, path: tasks/b/model.py, level: 3}\n"
                      "  - {id: c, path: tasks/c/model.py}\n"
                      "  - {id: d, path: tasks/d/model.py}\n");
    write_file_atomic(root() / "solutions" / "a" / "model_new.py", "# a\n");
    write_file_atomic(root() / "solutions" / "b.py", "# b\n");
    write_file_atomic(root() / "solutions" / "d.py", "# d\n");
    // c has no solution.
    opts_.split = root();
    opts_.solutions = root() / "solutions";
    opts_.output_dir = root() / "run";
    opts_.gpus = {0};
  }
  void TearDown() override {
    if (old_bin_) ::setenv("CUDA_AGENT_BIN", old_bin_->c_str(), 1);
    else ::unsetenv("CUDA_AGENT_BIN");
  }
  const fs::path& root() const { return dir_.path(); }

  // A passing result as a previous run would have stored it for `id`.
  void store_previous(const std::string& id, const fs::path& solution, const sandbox::SandboxOptions& options) {
    nlohmann::json r = {{"task_id", id},
                        {"ok", true},
                        {"category", nullptr},
                        {"correct", true},
                        {"reward", 2.0},
                        {"speedup_vs_eager", 1.5},
                        {"speedup_vs_compile", 0.9},
                        {"message", ""},
                        {"task_sha256", sha256_hex(read_file(root() / "tasks" / id / "model.py"))},
                        {"solution_sha256", sandbox::solution_fingerprint(solution.string())},
                        {"options", options.to_json()}};
    write_file_atomic(root() / "run" / "results" / (id + ".json"), r.dump(2));
  }

  static const nlohmann::json& by_id(const nlohmann::json& report, const std::string& id) {
    for (const auto& r : report["results"])
      if (r.value("task_id", "") == id) return r;
    static const nlohmann::json none;
    ADD_FAILURE() << "no result for " << id;
    return none;
  }

  TempDir dir_{"ca-bench-"};
  BenchOptions opts_;
  std::optional<std::string> old_bin_;
};

TEST_F(BenchRun, ResumesMatchingResultsAndReportsMissingSolutions) {
  store_previous("b", root() / "solutions" / "b.py", opts_.sandbox);
  // d's stored result is for another version of the solution: it must be evaluated again.
  store_previous("d", root() / "solutions" / "b.py", opts_.sandbox);
  std::ostringstream progress;
  nlohmann::json report = run_bench(opts_, progress);
  EXPECT_EQ(report["split"], "scratch");
  ASSERT_EQ(report["results"].size(), 4u);

  const nlohmann::json& b = by_id(report, "b");
  EXPECT_EQ(b["ok"], true) << b.dump(2);
  EXPECT_EQ(b["reward"], 2.0);
  EXPECT_EQ(b["level"], 3);
  EXPECT_NE(progress.str().find("[cached]"), std::string::npos) << progress.str();

  const nlohmann::json& c = by_id(report, "c");
  EXPECT_EQ(c["category"], "missing_solution") << c.dump(2);
  EXPECT_EQ(c["reward"], -1.0);
  EXPECT_NE(c["message"].get<std::string>().find("c/model_new.py"), std::string::npos) << c.dump(2);

  // Re-evaluated with a worker that ends at once: a structured failure, never an exception.
  const nlohmann::json& d = by_id(report, "d");
  EXPECT_EQ(d["category"], "infrastructure_error") << d.dump(2);
  EXPECT_NE(d["message"].get<std::string>().find("without a result"), std::string::npos) << d.dump(2);

  const nlohmann::json& s = report["summary"];
  EXPECT_EQ(s["tasks"], 4);
  EXPECT_EQ(s["passed"], 1);
  EXPECT_EQ(s["failures_by_category"]["missing_solution"], 1);
  EXPECT_EQ(s["failures_by_category"]["infrastructure_error"], 2);  // a and d

  // The run folder: one result per task, the summary and the table.
  for (const char* id : {"a", "b", "c", "d"})
    EXPECT_TRUE(fs::exists(root() / "run" / "results" / (std::string(id) + ".json"))) << id;
  nlohmann::json stored_c = nlohmann::json::parse(read_file(root() / "run" / "results" / "c.json"));
  EXPECT_EQ(stored_c["level"], 1);
  EXPECT_EQ(nlohmann::json::parse(read_file(root() / "run" / "summary.json"))["summary"], s);
  const std::string table = read_file(root() / "run" / "results.md");
  EXPECT_NE(table.find("| b | 3 | pass | 2 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| c | 1 | missing_solution | -1 |"), std::string::npos) << table;

  // Without resume, b is evaluated again (and fails here, having no worker).
  opts_.resume = false;
  std::ostringstream progress2;
  report = run_bench(opts_, progress2);
  EXPECT_EQ(by_id(report, "b")["category"], "infrastructure_error");
  EXPECT_EQ(progress2.str().find("[cached]"), std::string::npos) << progress2.str();
}

// On a GPU, the baselines the scoring cache lacks are timed before any solution runs, by a
// `baselines` run (judges without a candidate) into the run's baselines/ folder, so that no
// eager or torch.compile timing (Inductor's autotuning) runs beside a solution's process: those of
// the tasks the run evaluates (not of a task without a solution, nor of one whose earlier result
// it reuses); none where the cache holds them all, is off, or with --baselines lazy.
TEST_F(BenchRun, BaselinesTheCacheLacksAreTimedBeforeAnySolution) {
  opts_.sandbox.cache_dir = (root() / "cache").string();
  // b's result of an earlier run of this folder is reused: its baselines are not timed.
  store_previous("b", root() / "solutions" / "b.py", opts_.sandbox);
  std::ostringstream first;
  run_bench(opts_, first);
  EXPECT_NE(first.str().find("[bench] baselines of 2 task(s) first (0 found in the scoring cache)"), std::string::npos)
      << first.str();
  for (const char* id : {"a", "d"})
    EXPECT_TRUE(fs::exists(root() / "run" / "baselines" / "results" / (std::string(id) + ".json"))) << id;
  // Nothing to time for c (no solution, so nothing is evaluated) nor for b (reused).
  for (const char* id : {"b", "c"})
    EXPECT_FALSE(fs::exists(root() / "run" / "baselines" / "results" / (std::string(id) + ".json"))) << id;
  // a twice in the progress, timed then scored, the timing after the heading.
  const std::string text = first.str();
  const size_t heading = text.find("baselines of 2 task(s) first"), timed = text.find("a (gpu 0)");
  EXPECT_LT(heading, timed) << text;
  EXPECT_NE(text.find("a (gpu 0)", timed + 1), std::string::npos) << text;
  EXPECT_NE(text.find("b (gpu 0): pass, reward 2 [cached]"), std::string::npos) << text;

  // Every result reusable (c has none to reuse, and no solution): no judge is started.
  sandbox::SandboxOptions a_options = opts_.sandbox;
  a_options.atol = 0.5;  // the split's override for a
  store_previous("a", root() / "solutions" / "a" / "model_new.py", a_options);
  store_previous("d", root() / "solutions" / "d.py", opts_.sandbox);
  fs::remove_all(root() / "run" / "baselines");
  std::ostringstream resumed;
  run_bench(opts_, resumed);
  EXPECT_NE(resumed.str().find("[bench] no task to evaluate: no baselines to time first"), std::string::npos)
      << resumed.str();
  EXPECT_FALSE(fs::exists(root() / "run" / "baselines"));

  // Every task's baselines in the cache (as a judge writes them): no judge is started for them.
  const sandbox::BaselineCache scoring = sandbox::BaselineCache::of(root() / "cache");
  for (const char* id : {"a", "b", "c", "d"}) {
    sandbox::SandboxOptions o = opts_.sandbox;
    if (std::string(id) == "a") o.atol = 0.5;
    sandbox::BaselineKey key = sandbox::baseline_key_of(file_sha256(root() / "tasks" / id / "model.py"), o);
    key.gpu_name = "NVIDIA H200";
    scoring.put(key, {{"eager", {{"median_ms", 1.5}}}});
  }
  opts_.output_dir = root() / "run2";
  std::ostringstream cached;
  run_bench(opts_, cached);
  EXPECT_NE(cached.str().find("[bench] baselines of the 3 task(s) to evaluate found in the scoring cache"),
            std::string::npos)
      << cached.str();
  EXPECT_FALSE(fs::exists(root() / "run2" / "baselines" / "results"));

  opts_.sandbox.cache_dir = (root() / "empty-cache").string();
  opts_.baselines_first = false;
  opts_.output_dir = root() / "run3";
  std::ostringstream lazy;
  run_bench(opts_, lazy);
  EXPECT_NE(lazy.str().find("--baselines lazy"), std::string::npos) << lazy.str();
  EXPECT_FALSE(fs::exists(root() / "run3" / "baselines"));

  opts_.baselines_first = true;
  opts_.sandbox.use_baseline_cache = false;
  opts_.output_dir = root() / "run4";
  std::ostringstream off;
  run_bench(opts_, off);
  EXPECT_NE(off.str().find("the scoring cache is off"), std::string::npos) << off.str();
  EXPECT_FALSE(fs::exists(root() / "run4" / "baselines" / "results"));

  // Without a GPU (verify-only runs) there are no baselines to time.
  opts_.sandbox.use_baseline_cache = true;
  opts_.device = "cpu";
  opts_.output_dir = root() / "run5";
  std::ostringstream cpu;
  run_bench(opts_, cpu);
  EXPECT_EQ(cpu.str().find("baselines"), std::string::npos) << cpu.str();
  EXPECT_FALSE(fs::exists(root() / "run5" / "baselines"));
}

TEST_F(BenchRun, BadOptionsThrow) {
  opts_.solutions = root() / "no_such_folder";
  std::ostringstream progress;
  std::string msg = error_message([&] { run_bench(opts_, progress); });
  EXPECT_NE(msg.find("no_such_folder"), std::string::npos) << msg;
  opts_.solutions = root() / "solutions";
  opts_.gpus.clear();
  msg = error_message([&] { run_bench(opts_, progress); });
  EXPECT_NE(msg.find("--gpus"), std::string::npos) << msg;
}

// Regression test (was a bug in src/bench/bench_runner.cpp, run_bench): the resume check compares the stored result's
// options with options.sandbox.to_json(), but a result of a task with atol/rtol overrides stores
// the per-task options (atol 0.5 here), so such tasks are never reused.
TEST_F(BenchRun, ResumeReusesTasksWithToleranceOverrides) {
  sandbox::SandboxOptions task_options = opts_.sandbox;
  task_options.atol = 0.5;  // what the worker records for task a
  store_previous("a", root() / "solutions" / "a" / "model_new.py", task_options);
  std::ostringstream progress;
  nlohmann::json report = run_bench(opts_, progress);
  EXPECT_EQ(by_id(report, "a")["ok"], true) << by_id(report, "a").dump(2);
}

// Regression test (was a bug in src/bench/bench_runner.cpp, summarize / format_table): they read r["options"],
// r["speedup_vs_eager"], r["speedup_vs_compile"] and r["category"] with the const operator[],
// which is undefined behaviour for a missing key (observed: a type_error "cannot use value()
// with discarded" or "... with number", varying from build to build). Use r.value(...) or
// r.contains(...) instead.
TEST(BenchSummary, ResultsWithoutOptionalKeys) {
  nlohmann::json rs = nlohmann::json::array({nlohmann::json{{"task_id", "x"}, {"ok", true}, {"correct", true}},
                                             nlohmann::json{{"task_id", "y"}, {"ok", false}}});
  nlohmann::json s;
  ASSERT_NO_THROW(s = summarize(rs));
  EXPECT_EQ(s["passed"], 1);
  EXPECT_EQ(s["failures_by_category"]["unknown"], 1);
  EXPECT_NO_THROW(format_table(rs, s));
}

// Regression test: baselines-only results carry "reward": null (no solution was scored), and
// format_table's r.value("reward", -1.0) threw type_error 302 at the end of `cuda-agent baselines`
// on the H200, after every task had been timed.
TEST(BenchSummary, NullRewardFromABaselinesRun) {
  nlohmann::json timing = {{"median_ms", 2.5}};
  nlohmann::json rs = nlohmann::json::array({nlohmann::json{{"task_id", "x"},
                                                            {"ok", true},
                                                            {"level", 1},
                                                            {"reward", nullptr},
                                                            {"correct", nullptr},
                                                            {"timings", {{"eager", timing}, {"compile", timing}}}}});
  std::string table;
  ASSERT_NO_THROW(table = format_table(rs, summarize(rs)));
  EXPECT_NE(table.find("| x |"), std::string::npos) << table;
  ASSERT_NO_THROW(table = format_baselines_table(rs));
  EXPECT_NE(table.find("| x | 1 | ok | 2.500 | 2.500 | no |"), std::string::npos) << table;
}

}  // namespace
}  // namespace cuda_agent::bench

// One resolution of a task's tolerance and precision: the task's values (task.yaml under its
// split entry) replace the run's, except keys the run pinned; applied keys are pinned, so the
// task.yaml read again inside an episode cannot undo a split entry.
TEST(TaskOptions, TheTasksValuesApplyUnlessTheRunPinnedThem) {
  cuda_agent::bench::TaskEntry split_entry;
  split_entry.atol = 0.0;
  split_entry.rtol = 0.0;
  split_entry.precision = "loose";
  cuda_agent::sandbox::SandboxOptions run;
  run.pinned = {"rtol"};  // --set sandbox.rtol=0.05
  run.rtol = 0.05;
  cuda_agent::bench::apply_task_options(run, split_entry);
  EXPECT_EQ(run.atol, 0.0);
  EXPECT_EQ(run.rtol, 0.05);
  EXPECT_EQ(run.precision, "loose");
  cuda_agent::bench::TaskEntry sidecar;  // read later, lower in precedence
  sidecar.atol = 0.5;
  sidecar.precision = "tf32";
  cuda_agent::bench::apply_task_options(run, sidecar);
  EXPECT_EQ(run.atol, 0.0);
  EXPECT_EQ(run.precision, "loose");
  EXPECT_EQ(cuda_agent::bench::pinned_task_option_flags(run),
            " --set sandbox.atol=0.0 --set sandbox.rtol=0.05 --set sandbox.precision=loose");
  cuda_agent::sandbox::SandboxOptions defaults;
  cuda_agent::bench::apply_task_options(defaults, cuda_agent::bench::TaskEntry{});
  EXPECT_EQ(defaults.precision, "strict");
  EXPECT_TRUE(defaults.pinned.empty());
}

// Default run folders are named after the split however --split was written.
TEST(Split, NameForRunFolders) {
  EXPECT_EQ(cuda_agent::bench::split_name("data/core"), "core");
  EXPECT_EQ(cuda_agent::bench::split_name("data/core/"), "core");
  EXPECT_EQ(cuda_agent::bench::split_name("data/core/split.yaml"), "core");
  EXPECT_EQ(cuda_agent::bench::split_name("splits/mine.yaml"), "mine");
  EXPECT_EQ(cuda_agent::bench::split_name("./data/demo/."), "demo");
}
