#include "cuda_agent/bench/split.h"

#include <set>

#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

// The precision policies the sandbox knows by name (configs/sandbox.yaml; only loose is
// implemented there yet, and the run rejects the others). A typo here would otherwise
// silently fall back to the run's policy.
const std::set<std::string> kPrecisions = {"loose", "strict", "tf32"};
const std::set<std::string> kSources = {"own", "kernelbench", "ops"};
const std::set<std::string> kSplitKeys = {"id",        "path",       "level",  "atol", "rtol",
                                          "precision", "degenerate", "source", "extra"};

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::optional<double> optional_number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  CA_CHECK(j[key].is_number(), "{}: '{}' must be a number, got {}", where, key, j[key].dump());
  return j[key].get<double>();
}

std::optional<int> optional_level(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("level")) return std::nullopt;
  CA_CHECK(j["level"].is_number_integer() && j["level"].get<long long>() >= 1 &&
               j["level"].get<long long>() <= 1000000,
           "{}: 'level' must be a positive integer, got {}", where, j["level"].dump());
  return j["level"].get<int>();
}

std::optional<std::string> optional_name(const nlohmann::json& j, const char* key, const std::set<std::string>& allowed,
                                         const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  CA_CHECK(j[key].is_string() && allowed.count(j[key].get<std::string>()),
           "{}: '{}' must be one of {}, got {}", where, key, joined(allowed), j[key].dump());
  return j[key].get<std::string>();
}

std::optional<bool> optional_bool(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  CA_CHECK(j[key].is_boolean(), "{}: '{}' must be true or false, got {}", where, key, j[key].dump());
  return j[key].get<bool>();
}

// The fields task.yaml and a split.yaml entry share; split.yaml calls this after the sidecar,
// so that its values win.
void read_common_fields(const nlohmann::json& j, const std::string& where, TaskEntry& entry) {
  if (auto l = optional_level(j, where)) entry.level = *l;
  if (auto a = optional_number(j, "atol", where)) entry.atol = a;
  if (auto r = optional_number(j, "rtol", where)) entry.rtol = r;
  if (auto p = optional_name(j, "precision", kPrecisions, where)) entry.precision = *p;
  if (auto d = optional_bool(j, "degenerate", where)) entry.degenerate = *d;
}

std::string file_sha256(const fs::path& file, const std::string& where) {
  try {
    return sha256_hex(read_file(file));
  } catch (const Error& e) {
    CA_FAIL("{}: cannot read the task file: {}", where, e.what());
  }
}

nlohmann::json optional_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

}  // namespace

void read_task_sidecar(const fs::path& model_py, TaskEntry& entry) {
  const fs::path sidecar = model_py.parent_path() / "task.yaml";
  if (!fs::is_regular_file(sidecar)) return;
  nlohmann::json side = load_yaml_file(sidecar);
  if (!side.is_object()) return;
  read_common_fields(side, sidecar.string(), entry);
}

void apply_task_options(sandbox::SandboxOptions& options, const TaskEntry& task) {
  auto take = [&](const char* key, bool has, auto apply) {
    if (!has || options.pinned.count(key)) return;
    apply();
    options.pinned.insert(key);
  };
  take("atol", task.atol.has_value(), [&] { options.atol = *task.atol; });
  take("rtol", task.rtol.has_value(), [&] { options.rtol = *task.rtol; });
  take("precision", !task.precision.empty(), [&] { options.precision = task.precision; });
}

void apply_task_options(sandbox::SandboxOptions& options, const fs::path& model_py) {
  TaskEntry sidecar;
  read_task_sidecar(model_py, sidecar);
  apply_task_options(options, sidecar);
}

std::string pinned_task_option_flags(const sandbox::SandboxOptions& options) {
  return fmt::format(" --set sandbox.atol={} --set sandbox.rtol={} --set sandbox.precision={}", nlohmann::json(options.atol).dump(),
                     nlohmann::json(options.rtol).dump(), options.precision);
}

std::string split_name(const std::string& split) {
  fs::path p = fs::absolute(split).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.filename() == "split.yaml") return p.parent_path().filename().string();
  if (p.extension() == ".yaml" || p.extension() == ".yml") return p.stem().string();
  return p.filename().string();
}

Split load_split(const fs::path& path) {
  fs::path file = fs::is_directory(path) ? path / "split.yaml" : path;
  CA_CHECK(fs::is_regular_file(file), "no split at {}: expected a folder with split.yaml or the split.yaml itself",
           path.string());
  nlohmann::json doc = load_yaml_file(file);
  const std::string where = file.string();
  CA_CHECK(doc.is_object(), "{}: expected a mapping with name and tasks", where);
  Split split;
  split.root = fs::absolute(file).parent_path();
  CA_CHECK(!doc.contains("name") || doc["name"].is_string(), "{}: 'name' must be a string, got {}", where,
           doc.value("name", nlohmann::json()).dump());
  CA_CHECK(!doc.contains("description") || doc["description"].is_string() || doc["description"].is_null(),
           "{}: 'description' must be a string, got {}", where, doc.value("description", nlohmann::json()).dump());
  split.name = doc.value("name", split.root.filename().string());
  split.description = doc.contains("description") && doc["description"].is_string() ? doc["description"] : "";
  CA_CHECK(doc.contains("tasks") && doc["tasks"].is_array() && !doc["tasks"].empty(),
           "{}: 'tasks' must be a non-empty list", where);
  std::set<std::string> seen;
  for (size_t i = 0; i < doc["tasks"].size(); ++i) {
    const nlohmann::json& t = doc["tasks"][i];
    const std::string at = fmt::format("{}: tasks[{}]", where, i);
    CA_CHECK(t.is_object(), "{}: expected a mapping with id and path", at);
    for (const auto& [key, _] : t.items())
      CA_CHECK(kSplitKeys.count(key), "{}: unknown key '{}' (known: id, path, level, atol, rtol, precision, "
               "degenerate, source, extra)", at, key);
    CA_CHECK(t.contains("id") && t["id"].is_string() && !t["id"].get<std::string>().empty(), "{}: 'id' is required", at);
    CA_CHECK(t.contains("path") && t["path"].is_string(), "{}: 'path' is required", at);
    TaskEntry e;
    e.id = t["id"];
    // Ids name files (results/<id>.json, episodes/<id>/): no path separators, no "." or "..".
    CA_CHECK(e.id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                     std::string::npos &&
                 e.id != "." && e.id != ".." && e.id.size() <= 200,
             "{}: task id '{}' must be 1-200 letters, digits, '.', '_' or '-' (it names result files)", at, e.id);
    CA_CHECK(seen.insert(e.id).second, "{}: duplicate task id '{}'", at, e.id);
    e.path = fs::weakly_canonical(split.root / t["path"].get<std::string>());
    CA_CHECK(fs::is_regular_file(e.path), "{}: task file {} does not exist", at, e.path.string());
    read_task_sidecar(e.path, e);  // the split's own fields below override it
    read_common_fields(t, at, e);
    if (auto s = optional_name(t, "source", kSources, at)) e.source = *s;
    if (t.contains("extra") && !t["extra"].is_null()) {
      CA_CHECK(t["extra"].is_object(), "{}: 'extra' must be a mapping, got {}", at, t["extra"].dump());
      e.extra = t["extra"];
    }
    e.sha256 = file_sha256(e.path, at);
    split.tasks.push_back(std::move(e));
  }
  return split;
}

std::optional<fs::path> find_solution(const fs::path& solutions_dir, const std::string& task_id) {
  for (const fs::path& candidate : {solutions_dir / task_id / "model_new.py", solutions_dir / (task_id + ".py")})
    if (fs::is_regular_file(candidate)) return fs::absolute(candidate);
  return std::nullopt;
}

nlohmann::json split_manifest(const Split& split) {
  nlohmann::json tasks = nlohmann::json::array();
  for (const TaskEntry& t : split.tasks) {
    tasks.push_back({{"id", t.id},
                     {"level", t.level},
                     {"path", t.path.string()},
                     {"sha256", t.sha256},
                     {"source", t.source},
                     {"precision", t.precision.empty() ? nlohmann::json() : nlohmann::json(t.precision)},
                     {"atol", optional_json(t.atol)},
                     {"rtol", optional_json(t.rtol)},
                     {"degenerate", t.degenerate},
                     {"extra", t.extra.is_null() ? nlohmann::json::object() : t.extra}});
  }
  return {{"name", split.name}, {"description", split.description}, {"root", split.root.string()}, {"tasks", tasks}};
}

}  // namespace cuda_agent::bench
