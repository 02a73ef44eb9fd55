// Importing CUDA-Agent-Ops-6K style rows (JSONL, a JSON array, parquet) into the project's own
// split format (see split.h). Every row is checked before anything is written, so a bad row
// leaves out_dir as it was.
#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/subprocess.h"
#include "task_ids.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

// The first line of every split.yaml this file writes: an out_dir whose split.yaml lacks it
// belongs to someone else and is never overwritten.
constexpr std::string_view kMarker = "# Written by cuda-agent import_ops_rows";

// Exit code of kParquetToJsonl when neither pyarrow nor pandas (with a parquet engine) imports.
constexpr int kNoParquetModule = 3;

// argv: SRC.parquet DST.jsonl. Plain Python values only: numpy arrays and scalars become lists
// and numbers, NaN and infinities (pandas' missing values) become null, so that the output is
// strict JSON.
constexpr const char* kParquetToJsonl = R"PY(
import json, math, sys
src, dst = sys.argv[1], sys.argv[2]
try:
    import pyarrow.parquet as pq
    rows = pq.read_table(src).to_pylist()
except ImportError:
    try:
        import pandas
        rows = pandas.read_parquet(src).to_dict(orient="records")
    except ImportError:
        sys.exit(3)
def clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    if hasattr(v, "tolist"):
        return clean(v.tolist())
    return v
with open(dst, "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps(clean(r), default=str) + "\n")
)PY";

struct Row {
  nlohmann::json value;
  size_t index = 0;  // counted from 0 over the rows
  size_t line = 0;   // 1-based line in a JSONL file; 0 when there is none to name
};

struct ImportedTask {
  std::string id;
  int level = 1;
  std::string code;
  nlohmann::json extra;
};

std::string row_where(const fs::path& file, const Row& row) {
  return row.line ? fmt::format("{}: line {} (row {})", file.string(), row.line, row.index)
                  : fmt::format("{}: row {}", file.string(), row.index);
}

std::vector<Row> parse_jsonl(const fs::path& file, const std::string& text, bool name_lines) {
  std::vector<Row> rows;
  size_t start = 0;
  for (size_t line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line_no == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);  // a UTF-8 BOM
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    Row row{nlohmann::json(), rows.size(), name_lines ? line_no : 0};
    try {
      row.value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      CA_FAIL("{}: line {}: malformed JSON ({}); expected one JSON object per line (JSONL) or a JSON array",
              file.string(), line_no, e.what());
    }
    CA_CHECK(row.value.is_object(), "{}: expected a JSON object with a 'code' field, got {}", row_where(file, row),
             row.value.type_name());
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Row> parse_json_array(const fs::path& file, const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    CA_FAIL("{}: malformed JSON ({}); expected a JSON array of row objects, or JSONL", file.string(), e.what());
  }
  CA_CHECK(doc.is_array(), "{}: expected a JSON array of row objects", file.string());
  std::vector<Row> rows;
  for (size_t i = 0; i < doc.size(); ++i) {
    Row row{std::move(doc[i]), i, 0};
    CA_CHECK(row.value.is_object(), "{}: expected a JSON object with a 'code' field, got {}", row_where(file, row),
             row.value.type_name());
    rows.push_back(std::move(row));
  }
  return rows;
}

// Converts a parquet file to JSONL text with a Python child process.
std::string parquet_to_jsonl(const fs::path& file) {
  const char* env = std::getenv("CUDA_AGENT_PYTHON");
  const std::string python = env && *env ? env : "python3";
  TempDir tmp("ca-parquet-");
  SubprocessOptions opts;
  opts.argv = {python, "-c", kParquetToJsonl, fs::absolute(file).string(), (tmp.path() / "rows.jsonl").string()};
  opts.stderr_path = (tmp.path() / "stderr.txt").string();
  opts.timeout_s = 600;
  SubprocessResult r;
  try {
    r = run_subprocess(opts);
  } catch (const Error& e) {
    CA_FAIL("{}: reading parquet needs Python with pyarrow ({}); install python3 or set CUDA_AGENT_PYTHON to a "
            "Python, then pip install pyarrow, or convert the file to JSONL", file.string(), e.what());
  }
  CA_CHECK(!(r.term_signal == 0 && r.exit_code == kNoParquetModule),
           "{}: reading parquet needs pyarrow (or pandas with a parquet engine) in {}: pip install pyarrow "
           "(or set CUDA_AGENT_PYTHON to a Python that has it, or convert the file to JSONL)", file.string(), python);
  if (!r.ok()) {
    std::string err;
    try {
      err = read_file(tmp.path() / "stderr.txt");
    } catch (const Error&) {
    }
    if (err.size() > 2000) err = "..." + err.substr(err.size() - 2000);
    CA_FAIL("{}: converting parquet to JSONL with {} failed: the child {}:\n{}", file.string(), python, r.describe(),
            err);
  }
  return read_file(tmp.path() / "rows.jsonl");
}

std::vector<Row> read_rows(const fs::path& file) {
  const std::string ext = file.extension().string();
  if (ext == ".parquet") return parse_jsonl(file, parquet_to_jsonl(file), false);
  const std::string text = read_file(file);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (ext == ".json" && first != std::string::npos && text[first] == '[') return parse_json_array(file, text);
  return parse_jsonl(file, text, true);
}

bool mentions(const std::string& code, const std::regex& pattern) { return std::regex_search(code, pattern); }

ImportedTask check_row(const fs::path& file, const Row& row) {
  const nlohmann::json& r = row.value;
  const std::string where = row_where(file, row);
  CA_CHECK(r.contains("code") && r["code"].is_string() && !r["code"].get<std::string>().empty(),
           "{}: 'code' is required: a string holding a whole KernelBench module (class Model, get_inputs, "
           "get_init_inputs)", where);
  ImportedTask t;
  t.code = r["code"];
  static const std::regex kModel(R"(\bclass\s+Model\b)"), kInputs(R"(\bget_inputs\b)"),
      kInitInputs(R"(\bget_init_inputs\b)");
  std::string missing;
  if (!mentions(t.code, kModel)) missing += ", class Model";
  if (!mentions(t.code, kInputs)) missing += ", get_inputs";
  if (!mentions(t.code, kInitInputs)) missing += ", get_init_inputs";
  CA_CHECK(missing.empty(), "{}: 'code' is not a KernelBench module: it lacks {}; a task needs class Model, "
           "get_inputs() and get_init_inputs()", where, missing.substr(2));

  if (r.contains("level") && !r["level"].is_null()) {
    const nlohmann::json& l = r["level"];
    // 2.0 is what pandas makes of an integer column with gaps; "2" what a CSV export makes.
    double v = 0;
    if (l.is_number()) {
      v = l.get<double>();
    } else if (l.is_string()) {
      const std::string s = l.get<std::string>();
      if (!s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos) v = std::stod(s);
    }
    CA_CHECK(v >= 1 && v <= 1000000 && v == std::floor(v), "{}: 'level' must be a positive integer, got {}", where,
             l.dump());
    t.level = static_cast<int>(v);
  }

  nlohmann::json ops;
  if (r.contains("ops") && !r["ops"].is_null()) {
    ops = r["ops"];
    CA_CHECK(ops.is_string() || ops.is_array(), "{}: 'ops' must be a list or a string, got {}", where, ops.type_name());
  }
  nlohmann::json data_source;
  if (r.contains("data_source") && !r["data_source"].is_null()) {
    data_source = r["data_source"];
    CA_CHECK(data_source.is_string(), "{}: 'data_source' must be a string, got {}", where, data_source.type_name());
  }
  t.extra = {{"ops", ops}, {"data_source", data_source}, {"row", row.index}};

  for (const char* key : {"id", "name"}) {
    if (!r.contains(key) || r[key].is_null()) continue;
    const nlohmann::json& v = r[key];
    CA_CHECK(v.is_string() || v.is_number_integer(), "{}: '{}' must be a string or an integer, got {}", where, key,
             v.type_name());
    t.id = v.is_string() ? v.get<std::string>() : v.dump();
    if (!t.id.empty()) break;
  }
  return t;
}

// The ids an earlier import listed in out_dir/split.yaml (empty when there is none). Throws
// when split.yaml exists but was not written by import_ops_rows.
std::set<std::string> previous_import(const fs::path& split_yaml) {
  std::set<std::string> ids;
  if (!fs::exists(split_yaml)) return ids;
  const std::string text = read_file(split_yaml);
  CA_CHECK(text.rfind(kMarker, 0) == 0, "{}: already holds a split that was not written by an import; import into "
           "an empty or new folder instead", split_yaml.string());
  try {
    const nlohmann::json doc = load_yaml_file(split_yaml);
    for (const auto& t : doc.value("tasks", nlohmann::json::array()))
      if (t.is_object() && t.contains("id") && t["id"].is_string()) ids.insert(t["id"].get<std::string>());
  } catch (const Error& e) {
    CA_LOG_WARN("bench", "{}: cannot read the earlier import ({}); its task folders are left in place",
                split_yaml.string(), e.what());
  }
  return ids;
}

// Writes `content` unless the file already holds exactly that (keeps mtimes of unchanged tasks).
void write_if_changed(const fs::path& path, const std::string& content) {
  if (fs::is_regular_file(path)) {
    try {
      if (read_file(path) == content) return;
    } catch (const Error&) {
    }
  }
  write_file_atomic(path, content);
}

std::string split_yaml_text(const fs::path& rows_file, const std::vector<ImportedTask>& tasks) {
  const std::string file = rows_file.filename().string();
  const auto q = [](const std::string& s) { return nlohmann::json(s).dump(); };  // a YAML double-quoted scalar
  std::string out = fmt::format("{} from {}; importing it again rewrites this file.\n", kMarker, file);
  out += fmt::format("name: {}\n", q(rows_file.stem().string()));
  out += fmt::format("description: {}\n", q(fmt::format("Imported from {} ({} rows)", file, tasks.size())));
  out += "tasks:\n";
  for (const ImportedTask& t : tasks) {
    out += fmt::format("  - id: {}\n", q(t.id));
    out += fmt::format("    path: {}\n", q("tasks/" + t.id + "/model.py"));
    out += fmt::format("    level: {}\n", t.level);
    out += "    source: ops\n";
    out += fmt::format("    extra: {}\n", t.extra.dump());  // JSON is a YAML flow mapping
  }
  return out;
}

}  // namespace

Split import_ops_rows(const fs::path& rows_file, const fs::path& out_dir) {
  CA_CHECK(fs::is_regular_file(rows_file), "no rows file at {}: expected a .jsonl, .json or .parquet file",
           rows_file.string());
  const std::vector<Row> rows = read_rows(rows_file);
  CA_CHECK(!rows.empty(), "{}: no rows; expected one JSON object per line with a 'code' field", rows_file.string());

  std::vector<ImportedTask> tasks;
  detail::UniqueIds ids;
  for (const Row& row : rows) {
    ImportedTask t = check_row(rows_file, row);
    const std::string fallback = fmt::format("row_{}", row.index);
    t.id = ids.claim(detail::safe_task_id(t.id, fallback));
    tasks.push_back(std::move(t));
  }

  const fs::path split_yaml = out_dir / "split.yaml";
  std::set<std::string> stale = previous_import(split_yaml);
  for (const ImportedTask& t : tasks) {
    stale.erase(t.id);
    write_if_changed(out_dir / "tasks" / t.id / "model.py", t.code);
  }
  write_if_changed(split_yaml, split_yaml_text(rows_file, tasks));
  for (const std::string& id : stale) {
    if (id != detail::safe_task_id(id, "") || id.empty()) continue;  // never a path outside tasks/
    std::error_code ec;
    fs::remove(out_dir / "tasks" / id / "model.py", ec);
    fs::remove(out_dir / "tasks" / id, ec);  // only if now empty: anything else there is not ours
  }

  Split split = load_split(out_dir);
  CA_LOG_INFO("bench", "imported {} tasks from {} into {}", split.tasks.size(), rows_file.string(), out_dir.string());
  return split;
}

}  // namespace cuda_agent::bench
