// Tests for the split loaders beyond split.yaml: the KernelBench folder layout, imported
// Ops-6K style rows (JSONL, JSON array, parquet), load_any_split's dispatch, the manifest, and
// the precision / degenerate / source / extra keys of split.yaml and task.yaml.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <map>

#include <gtest/gtest.h>

#include "test_util.h"

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/subprocess.h"

namespace cuda_agent::bench {
namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = CUDA_AGENT_SOURCE_DIR;

using cuda_agent::testing::error_message;

// A small KernelBench-format module; `op` makes each one different.
std::string module_code(const std::string& op) {
  return "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch." + op +
         "(x)\n\ndef get_inputs():\n    return [torch.randn(16)]\n\ndef get_init_inputs():\n    return []\n";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// ---- the KernelBench layout ------------------------------------------------------------------

class KernelBenchTree : public ::testing::Test {
 protected:
  void SetUp() override {
    write("level1/1_Square_matrix_multiplication_.py", module_code("matmul"));
    write("level1/19_ReLU.py", module_code("relu"));
    write("level1/2_Not_a_module.py", "print('no Model here')\n");  // listed all the same
    write("level2/5_Foo.py", module_code("sigmoid"));
    write("level3/README.md", "# notes\n");                          // skipped, with a warning
    write("level1/notes.txt", "x\n");                                 // skipped, with a warning
    write("level1/__pycache__/19_ReLU.cpython-312.pyc", "");          // skipped quietly
    write("levels/3_Nope.py", module_code("tanh"));                   // not a levelN folder
    write("level0/3_Nope.py", module_code("tanh"));                   // neither
  }
  void write(const std::string& rel, const std::string& content) const {
    write_file_atomic(root() / rel, content);
  }
  const fs::path& root() const { return dir_.path(); }

  TempDir dir_{"ca-kb-"};
};

TEST_F(KernelBenchTree, IdsLevelsOrderAndHashes) {
  const Split s = load_kernelbench_dir(root());
  EXPECT_EQ(s.name, root().filename().string());
  EXPECT_EQ(s.root, fs::canonical(root()));
  ASSERT_EQ(s.tasks.size(), 4u);
  // By level, then by number (19 after 2, although "19_" sorts before "2_" as text).
  const char* ids[] = {"L1_1_Square_matrix_multiplication_", "L1_2_Not_a_module", "L1_19_ReLU", "L2_5_Foo"};
  const char* files[] = {"level1/1_Square_matrix_multiplication_.py", "level1/2_Not_a_module.py", "level1/19_ReLU.py",
                         "level2/5_Foo.py"};
  const int levels[] = {1, 1, 1, 2};
  const int numbers[] = {1, 2, 19, 5};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(ids[i]);
    const TaskEntry& t = s.tasks[i];
    EXPECT_EQ(t.id, ids[i]);
    EXPECT_EQ(t.level, levels[i]);
    EXPECT_EQ(t.source, "kernelbench");
    EXPECT_TRUE(t.path.is_absolute());
    EXPECT_EQ(t.path, fs::canonical(root() / files[i]));
    EXPECT_EQ(t.sha256, sha256_hex(read_file(root() / files[i])));
    EXPECT_EQ(t.sha256.size(), 64u);
    EXPECT_EQ(t.extra["file"], files[i]);
    EXPECT_EQ(t.extra["problem_id"], numbers[i]);
    EXPECT_FALSE(t.atol.has_value());
    EXPECT_TRUE(t.precision.empty());
    EXPECT_FALSE(t.degenerate);
  }
  EXPECT_EQ(s.tasks[2].extra["name"], "ReLU");
  // Loading twice gives the same split.
  EXPECT_EQ(split_manifest(load_kernelbench_dir(root())), split_manifest(s));
}

TEST_F(KernelBenchTree, IdsAreFileSafeAndUnique) {
  write("level1/7_Conv 3D+bias.py", module_code("relu"));
  write("level1/8_a b.py", module_code("relu"));
  write("level1/8_a_b.py", module_code("relu"));
  write("level01/9_Twice.py", module_code("relu"));
  write("level1/9_Twice.py", module_code("relu"));
  const Split s = load_kernelbench_dir(root());
  std::vector<std::string> ids;
  for (const auto& t : s.tasks) ids.push_back(t.id);
  const std::vector<std::string> expected = {"L1_1_Square_matrix_multiplication_",
                                             "L1_2_Not_a_module",
                                             "L1_7_Conv_3D_bias",
                                             "L1_8_a_b",      // "8_a b.py" sorts first (' ' < '_')
                                             "L1_8_a_b_2",    // "8_a_b.py"
                                             "L1_9_Twice",    // level01/ sorts before level1/
                                             "L1_9_Twice_2",
                                             "L1_19_ReLU",
                                             "L2_5_Foo"};
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(s.tasks[5].path.parent_path().filename(), "level01");
}

TEST(KernelBenchLayout, Errors) {
  TempDir dir("ca-kb-");
  write_file_atomic(dir.path() / "tasks" / "a" / "model.py", module_code("relu"));
  write_file_atomic(dir.path() / "level_1" / "1_A.py", module_code("relu"));
  std::string msg = error_message([&] { load_kernelbench_dir(dir.path()); });
  expect_contains(msg, fs::canonical(dir.path()).string());
  expect_contains(msg, "no levelN/ folder");

  msg = error_message([&] { load_kernelbench_dir(dir.path() / "missing"); });
  expect_contains(msg, (dir.path() / "missing").string());

  // Level folders without a single task file.
  write_file_atomic(dir.path() / "level1" / "README.md", "x\n");
  write_file_atomic(dir.path() / "level2" / "_NoNumber.py", module_code("relu"));
  write_file_atomic(dir.path() / "level2" / "12_.py", module_code("relu"));
  msg = error_message([&] { load_kernelbench_dir(dir.path()); });
  expect_contains(msg, "no task files");
}

// ---- Ops-6K style rows -----------------------------------------------------------------------

std::string row(const nlohmann::json& fields) { return fields.dump() + "\n"; }

class OpsRows : public ::testing::Test {
 protected:
  fs::path write_rows(const std::string& name, const std::string& text) const {
    write_file_atomic(dir_.path() / name, text);
    return dir_.path() / name;
  }
  // Three rows: an id, ops as a list and a data source; a name needing sanitising, level 2 and
  // ops as a string; nothing but code. A blank line and a CRLF line in between.
  fs::path three_rows() const {
    return write_rows("ops_sample.jsonl",
                      row({{"id", "relu"}, {"code", module_code("relu")}, {"ops", {"torch.relu"}},
                           {"data_source", "synth-v1"}}) +
                          "\n   \n" +
                          row({{"name", "Conv 2D/bias"}, {"level", 2}, {"code", module_code("tanh")},
                               {"ops", "nn.Conv2d,torch.add"}, {"extra_column", 5}}) +
                          nlohmann::json{{"code", module_code("sigmoid")}}.dump() + "\r\n");
  }
  fs::path out() const { return dir_.path() / "imported"; }

  TempDir dir_{"ca-ops-"};
};

TEST_F(OpsRows, ImportsJsonlRows) {
  const fs::path rows = three_rows();
  const Split s = import_ops_rows(rows, out());
  EXPECT_EQ(s.name, "ops_sample");
  EXPECT_EQ(s.root, fs::absolute(out()));
  ASSERT_EQ(s.tasks.size(), 3u);
  const char* ids[] = {"relu", "Conv_2D_bias", "row_2"};
  const char* fns[] = {"relu", "tanh", "sigmoid"};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(ids[i]);
    const TaskEntry& t = s.tasks[i];
    EXPECT_EQ(t.id, ids[i]);
    EXPECT_EQ(t.source, "ops");
    EXPECT_EQ(t.path, fs::canonical(out() / "tasks" / ids[i] / "model.py"));
    EXPECT_EQ(read_file(t.path), module_code(fns[i]));  // byte for byte
    EXPECT_EQ(t.sha256, sha256_hex(read_file(t.path)));
    EXPECT_EQ(t.extra["row"], i);
  }
  EXPECT_EQ(s.tasks[0].level, 1);
  EXPECT_EQ(s.tasks[1].level, 2);
  EXPECT_EQ(s.tasks[0].extra["ops"], nlohmann::json::array({"torch.relu"}));
  EXPECT_EQ(s.tasks[0].extra["data_source"], "synth-v1");
  EXPECT_EQ(s.tasks[1].extra["ops"], "nn.Conv2d,torch.add");
  EXPECT_TRUE(s.tasks[1].extra["data_source"].is_null());
  EXPECT_TRUE(s.tasks[2].extra["ops"].is_null());
  EXPECT_FALSE(s.tasks[1].extra.contains("extra_column"));

  // The written folder is a split of the project's own format, provenance included.
  EXPECT_EQ(split_manifest(load_split(out())), split_manifest(s));

  // Importing again: same ids, same files, same split.
  const std::string yaml_before = read_file(out() / "split.yaml");
  const auto mtime = fs::last_write_time(out() / "tasks" / "relu" / "model.py");
  const Split again = import_ops_rows(rows, out());
  EXPECT_EQ(split_manifest(again), split_manifest(s));
  EXPECT_EQ(read_file(out() / "split.yaml"), yaml_before);
  EXPECT_EQ(fs::last_write_time(out() / "tasks" / "relu" / "model.py"), mtime);
}

TEST_F(OpsRows, JsonArrayAndDuplicateIds) {
  nlohmann::json rows = nlohmann::json::array();
  for (const char* op : {"relu", "tanh", "exp"}) rows.push_back({{"id", "same"}, {"code", module_code(op)}});
  rows.push_back({{"id", 42}, {"code", module_code("abs")}, {"level", "3"}});
  rows.push_back({{"id", "../../etc"}, {"code", module_code("neg")}});
  const Split s = import_ops_rows(write_rows("array.json", rows.dump(2)), out());
  std::vector<std::string> ids;
  for (const auto& t : s.tasks) ids.push_back(t.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"same", "same_2", "same_3", "42", "_._.._etc"}));
  EXPECT_EQ(s.tasks[3].level, 3);
  EXPECT_EQ(s.name, "array");
}

TEST_F(OpsRows, ReimportDropsTasksOfTheEarlierImport) {
  import_ops_rows(three_rows(), out());
  write_file_atomic(out() / "notes.txt", "kept\n");
  const fs::path fewer = write_rows("fewer.jsonl", row({{"id", "relu"}, {"code", module_code("relu")}}));
  const Split s = import_ops_rows(fewer, out());
  ASSERT_EQ(s.tasks.size(), 1u);
  EXPECT_FALSE(fs::exists(out() / "tasks" / "row_2"));
  EXPECT_FALSE(fs::exists(out() / "tasks" / "Conv_2D_bias"));
  EXPECT_TRUE(fs::exists(out() / "tasks" / "relu" / "model.py"));
  EXPECT_TRUE(fs::exists(out() / "notes.txt"));
}

TEST_F(OpsRows, ErrorsNameTheFileAndTheRow) {
  const std::string good = row({{"id", "ok"}, {"code", module_code("relu")}});
  struct Case {
    std::string text;
    std::vector<std::string> expected;
  };
  const Case cases[] = {
      {good + "\n" + row({{"id", "x"}, {"ops", {"a"}}}), {"line 3 (row 1)", "'code' is required"}},
      {good + row({{"code", 7}}), {"line 2 (row 1)", "'code' is required"}},
      {good + row({{"code", "import torch\nclass Model:\n    pass\ndef get_init_inputs():\n    return []\n"}}),
       {"line 2 (row 1)", "lacks get_inputs", "KernelBench"}},
      {row({{"code", "class ModelNew:\n    pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n"}}),
       {"line 1 (row 0)", "lacks class Model"}},
      {good + good + "{\"code\": \"x\",\n", {"line 3", "malformed JSON"}},
      {good + "[1, 2]\n", {"line 2 (row 1)", "expected a JSON object"}},
      {good + row({{"code", module_code("relu")}, {"level", 0}}), {"row 1", "'level' must be a positive integer"}},
      {good + row({{"code", module_code("relu")}, {"ops", 5}}), {"row 1", "'ops' must be a list or a string"}},
      {good + row({{"code", module_code("relu")}, {"data_source", {1}}}), {"row 1", "'data_source' must be a string"}},
      {"\n\n", {"no rows"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const fs::path file = write_rows("bad.jsonl", c.text);
    const std::string msg = error_message([&] { import_ops_rows(file, out()); });
    expect_contains(msg, file.string());
    for (const auto& e : c.expected) expect_contains(msg, e);
    EXPECT_FALSE(fs::exists(out())) << "a failed import wrote " << out();  // checked before writing
  }
  // A malformed JSON array names the file.
  const fs::path array = write_rows("bad.json", "[{\"code\": 1},");
  expect_contains(error_message([&] { import_ops_rows(array, out()); }), "malformed JSON");
  // A folder holding a split of its own is never overwritten.
  const fs::path demo_copy = dir_.path() / "own";
  write_file_atomic(demo_copy / "split.yaml", "tasks:\n  - {id: a, path: a.py}\n");
  const std::string msg = error_message([&] { import_ops_rows(three_rows(), demo_copy); });
  expect_contains(msg, "not written by an import");
  EXPECT_FALSE(fs::exists(demo_copy / "tasks"));
  expect_contains(error_message([&] { import_ops_rows(dir_.path() / "none.jsonl", out()); }), "none.jsonl");
}

std::string python() {
  const char* env = std::getenv("CUDA_AGENT_PYTHON");
  return env && *env ? env : "python3";
}

// True when `python` runs `code` successfully.
bool python_runs(const std::vector<std::string>& args) {
  SubprocessOptions o;
  o.argv = {python()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout_s = 120;
  try {
    return run_subprocess(o).ok();
  } catch (const Error&) {
    return false;
  }
}

TEST_F(OpsRows, ParquetWithoutPyarrowSaysWhatToInstall) {
  const fs::path file = write_rows("rows.parquet", "PAR1 not really parquet");
  if (!python_runs({"-c", "pass"})) GTEST_SKIP() << "no Python (" << python() << ") to run the converter";
  // Make the real Python fail to import pyarrow and pandas, whether or not they are installed.
  for (const char* m : {"pyarrow", "pandas"})
    write_file_atomic(dir_.path() / "shadow" / m / "__init__.py", "raise ImportError('hidden by the test')\n");
  ScopedEnv path("PYTHONPATH", (dir_.path() / "shadow").string());
  const std::string msg = error_message([&] { import_ops_rows(file, out()); });
  expect_contains(msg, file.string());
  expect_contains(msg, "pip install pyarrow");
}

TEST_F(OpsRows, ParquetWithoutPythonSaysWhatToSet) {
  const fs::path file = write_rows("rows.parquet", "PAR1");
  ScopedEnv py("CUDA_AGENT_PYTHON", (dir_.path() / "no-such-python").string());
  const std::string msg = error_message([&] { import_ops_rows(file, out()); });
  expect_contains(msg, "CUDA_AGENT_PYTHON");
  expect_contains(msg, "pip install pyarrow");
}

TEST_F(OpsRows, ParquetWithPyarrow) {
  if (!python_runs({"-c", "import pyarrow.parquet"}))
    GTEST_SKIP() << python() << " has no pyarrow (set CUDA_AGENT_PYTHON to a Python with pyarrow to run this)";
  const fs::path file = dir_.path() / "ops6k.parquet";
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back({{"code", module_code("relu")}, {"ops", {"torch.relu", "torch.add"}}, {"data_source", "a"}});
  rows.push_back({{"code", module_code("tanh")}, {"ops", nullptr}, {"data_source", "b"}});
  const fs::path json = write_rows("rows_for_parquet.json", rows.dump());
  ASSERT_TRUE(python_runs({"-c",
                           "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n"
                           "pq.write_table(pa.Table.from_pylist(json.load(open(sys.argv[1]))), sys.argv[2])\n",
                           json.string(), file.string()}));
  const Split s = import_ops_rows(file, out());
  EXPECT_EQ(s.name, "ops6k");
  ASSERT_EQ(s.tasks.size(), 2u);
  EXPECT_EQ(s.tasks[0].id, "row_0");
  EXPECT_EQ(read_file(s.tasks[1].path), module_code("tanh"));
  EXPECT_EQ(s.tasks[0].extra["ops"], nlohmann::json::array({"torch.relu", "torch.add"}));
  EXPECT_TRUE(s.tasks[1].extra["ops"].is_null());
  EXPECT_EQ(s.tasks[1].extra["data_source"], "b");
}

// ---- load_any_split --------------------------------------------------------------------------

TEST_F(KernelBenchTree, LoadAnySplitDispatches) {
  TempDir import_dir("ca-any-");
  const fs::path demo = kSourceDir / "data" / "demo";
  EXPECT_EQ(load_any_split(demo, {}).tasks.size(), 4u);
  EXPECT_EQ(load_any_split(demo / "split.yaml", {}).tasks.size(), 4u);
  EXPECT_EQ(load_any_split(demo, {}).tasks[0].source, "own");

  const Split kb = load_any_split(root(), {});
  ASSERT_EQ(kb.tasks.size(), 4u);
  EXPECT_EQ(kb.tasks[0].source, "kernelbench");

  write("rows.jsonl", row({{"id", "a"}, {"code", module_code("relu")}}));
  const Split ops = load_any_split(root() / "rows.jsonl", import_dir.path() / "rows");
  ASSERT_EQ(ops.tasks.size(), 1u);
  EXPECT_EQ(ops.tasks[0].source, "ops");
  EXPECT_TRUE(fs::is_regular_file(import_dir.path() / "rows" / "split.yaml"));
  // The imported folder now loads as a split of its own.
  EXPECT_EQ(load_any_split(import_dir.path() / "rows", {}).tasks[0].source, "ops");
  write("array.json", nlohmann::json::array({{{"code", module_code("relu")}}}).dump());
  EXPECT_EQ(load_any_split(root() / "array.json", import_dir.path() / "array").tasks[0].id, "row_0");

  // A rows file needs a folder to import into.
  expect_contains(error_message([&] { load_any_split(root() / "rows.jsonl", {}); }), "import");
  // Anything else names the path and the accepted forms.
  for (const fs::path& bad : {root() / "missing", root() / "level1" / "notes.txt", root() / "levels"}) {
    SCOPED_TRACE(bad);
    const std::string msg = error_message([&] { load_any_split(bad, import_dir.path()); });
    expect_contains(msg, bad.string());
    expect_contains(msg, "split.yaml");
    expect_contains(msg, "level1/");
    expect_contains(msg, ".jsonl");
  }
}

// ---- split.yaml / task.yaml keys and the manifest --------------------------------------------

TEST(SplitKeys, PrecisionDegenerateSourceExtraAndManifest) {
  TempDir dir("ca-keys-");
  for (const char* t : {"a", "b", "c"}) write_file_atomic(dir.path() / "tasks" / t / "model.py", module_code("relu"));
  write_file_atomic(dir.path() / "tasks" / "b" / "task.yaml", "precision: tf32\ndegenerate: true\nnotes: ignored\n");
  write_file_atomic(dir.path() / "tasks" / "c" / "task.yaml", "precision: tf32\ndegenerate: true\n");
  write_file_atomic(dir.path() / "split.yaml",
                    "name: keys\n"
                    "tasks:\n"
                    "  - {id: a, path: tasks/a/model.py, precision: strict, degenerate: true, atol: 0.5,\n"
                    "     source: kernelbench, extra: {problem_id: 3}}\n"
                    "  - {id: b, path: tasks/b/model.py}\n"
                    "  - {id: c, path: tasks/c/model.py, precision: loose, degenerate: false}\n");
  const Split s = load_split(dir.path());
  ASSERT_EQ(s.tasks.size(), 3u);
  EXPECT_EQ(s.tasks[0].precision, "strict");
  EXPECT_TRUE(s.tasks[0].degenerate);
  EXPECT_EQ(s.tasks[0].source, "kernelbench");
  EXPECT_EQ(s.tasks[0].extra, (nlohmann::json{{"problem_id", 3}}));
  EXPECT_EQ(s.tasks[1].precision, "tf32");  // from the sidecar
  EXPECT_TRUE(s.tasks[1].degenerate);
  EXPECT_EQ(s.tasks[1].source, "own");
  EXPECT_EQ(s.tasks[2].precision, "loose");  // split.yaml wins
  EXPECT_FALSE(s.tasks[2].degenerate);

  const nlohmann::json m = split_manifest(s);
  EXPECT_EQ(m["name"], "keys");
  EXPECT_EQ(m["description"], "");
  EXPECT_EQ(m["root"], s.root.string());
  ASSERT_EQ(m["tasks"].size(), 3u);
  const nlohmann::json expected_a = {{"id", "a"},
                                     {"level", 1},
                                     {"path", fs::canonical(dir.path() / "tasks" / "a" / "model.py").string()},
                                     {"sha256", sha256_hex(module_code("relu"))},
                                     {"source", "kernelbench"},
                                     {"precision", "strict"},
                                     {"atol", 0.5},
                                     {"rtol", nullptr},
                                     {"degenerate", true},
                                     {"extra", {{"problem_id", 3}}}};
  EXPECT_EQ(m["tasks"][0], expected_a);
  EXPECT_EQ(m["tasks"][1]["atol"], nullptr);
  EXPECT_EQ(m["tasks"][1]["extra"], nlohmann::json::object());
  Split bare;
  bare.tasks.push_back(TaskEntry{});
  EXPECT_TRUE(split_manifest(bare)["tasks"][0]["precision"].is_null());
}

TEST(SplitKeys, BadValuesNameTheFileAndTheKey) {
  TempDir dir("ca-keys-");
  write_file_atomic(dir.path() / "tasks" / "a" / "model.py", module_code("relu"));
  const std::string where = (dir.path() / "split.yaml").string();
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"precision: fp8", {"tasks[0]", "'precision' must be one of loose, strict, tf32", "fp8"}},
      {"degenerate: maybe", {"tasks[0]", "'degenerate' must be true or false"}},
      {"source: hf", {"tasks[0]", "'source' must be one of"}},
      {"extra: [1]", {"tasks[0]", "'extra' must be a mapping"}},
      {"degenrate: true", {"tasks[0]", "unknown key 'degenrate'", "degenerate", "precision"}},
  };
  for (const auto& [line, expected] : cases) {
    SCOPED_TRACE(line);
    write_file_atomic(dir.path() / "split.yaml",
                      std::string("tasks:\n  - id: a\n    path: tasks/a/model.py\n    ") + line + "\n");
    const std::string msg = error_message([&] { load_split(dir.path()); });
    expect_contains(msg, where);
    for (const auto& e : expected) expect_contains(msg, e);
  }
  write_file_atomic(dir.path() / "split.yaml", "tasks:\n  - id: a\n    path: tasks/a/model.py\n");
  write_file_atomic(dir.path() / "tasks" / "a" / "task.yaml", "degenerate: 1\n");
  const std::string msg = error_message([&] { load_split(dir.path()); });
  expect_contains(msg, (dir.path() / "tasks" / "a" / "task.yaml").string());
  expect_contains(msg, "'degenerate'");
}

TEST(SplitKeys, DemoSplitIsOwnWithHashes) {
  const Split s = load_split(kSourceDir / "data" / "demo");
  ASSERT_EQ(s.tasks.size(), 4u);
  for (const TaskEntry& t : s.tasks) {
    SCOPED_TRACE(t.id);
    EXPECT_EQ(t.source, "own");
    EXPECT_EQ(t.sha256, sha256_hex(read_file(t.path)));
    EXPECT_TRUE(t.precision.empty());
    EXPECT_FALSE(t.degenerate);
    EXPECT_EQ(t.extra, nlohmann::json::object());
  }
}

}  // namespace
}  // namespace cuda_agent::bench

TEST(CoreSplit, LoadsWithEveryLevelAndItsReferenceSolutions) {
  const std::filesystem::path root = std::filesystem::path(CUDA_AGENT_SOURCE_DIR) / "data" / "core";
  cuda_agent::bench::Split split = cuda_agent::bench::load_split(root);
  EXPECT_EQ(split.name, "core");
  EXPECT_GE(split.tasks.size(), 40u);
  std::map<int, int> per_level;
  int with_solution = 0;
  for (const auto& t : split.tasks) {
    per_level[t.level]++;
    EXPECT_FALSE(t.sha256.empty()) << t.id;
    if (cuda_agent::bench::find_solution(root / "solutions", t.id)) ++with_solution;
  }
  EXPECT_GE(per_level[1], 10);
  EXPECT_GE(per_level[2], 10);
  EXPECT_GE(per_level[3], 5);
  EXPECT_GE(with_solution, 10);
}
