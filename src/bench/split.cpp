#include "cuda_agent/bench/split.h"

#include <set>

#include "cuda_agent/core/config.h"
#include "cuda_agent/core/error.h"

namespace fs = std::filesystem;

namespace cuda_agent::bench {
namespace {

std::optional<double> optional_number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  CA_CHECK(j[key].is_number(), "{}: '{}' must be a number, got {}", where, key, j[key].dump());
  return j[key].get<double>();
}

}  // namespace

void read_task_sidecar(const fs::path& model_py, TaskEntry& entry) {
  const fs::path sidecar = model_py.parent_path() / "task.yaml";
  if (!fs::is_regular_file(sidecar)) return;
  nlohmann::json side = load_yaml_file(sidecar);
  if (!side.is_object()) return;
  if (side.contains("level")) {
    CA_CHECK(side["level"].is_number_integer() && side["level"].get<int>() >= 1,
             "{}: 'level' must be a positive integer, got {}", sidecar.string(), side["level"].dump());
    entry.level = side["level"];
  }
  if (auto a = optional_number(side, "atol", sidecar.string())) entry.atol = a;
  if (auto r = optional_number(side, "rtol", sidecar.string())) entry.rtol = r;
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
  split.name = doc.value("name", split.root.filename().string());
  split.description = doc.value("description", "");
  CA_CHECK(doc.contains("tasks") && doc["tasks"].is_array() && !doc["tasks"].empty(),
           "{}: 'tasks' must be a non-empty list", where);
  std::set<std::string> seen;
  for (size_t i = 0; i < doc["tasks"].size(); ++i) {
    const nlohmann::json& t = doc["tasks"][i];
    const std::string at = fmt::format("{}: tasks[{}]", where, i);
    CA_CHECK(t.is_object(), "{}: expected a mapping with id and path", at);
    for (const auto& [key, _] : t.items())
      CA_CHECK(key == "id" || key == "path" || key == "level" || key == "atol" || key == "rtol",
               "{}: unknown key '{}' (known: id, path, level, atol, rtol)", at, key);
    CA_CHECK(t.contains("id") && t["id"].is_string() && !t["id"].get<std::string>().empty(), "{}: 'id' is required", at);
    CA_CHECK(t.contains("path") && t["path"].is_string(), "{}: 'path' is required", at);
    TaskEntry e;
    e.id = t["id"];
    CA_CHECK(seen.insert(e.id).second, "{}: duplicate task id '{}'", at, e.id);
    e.path = fs::weakly_canonical(split.root / t["path"].get<std::string>());
    CA_CHECK(fs::is_regular_file(e.path), "{}: task file {} does not exist", at, e.path.string());
    read_task_sidecar(e.path, e);  // the split's own fields below override it
    if (t.contains("level")) {
      CA_CHECK(t["level"].is_number_integer() && t["level"].get<int>() >= 1, "{}: 'level' must be a positive integer", at);
      e.level = t["level"];
    }
    if (auto a = optional_number(t, "atol", at)) e.atol = a;
    if (auto r = optional_number(t, "rtol", at)) e.rtol = r;
    split.tasks.push_back(std::move(e));
  }
  return split;
}

std::optional<fs::path> find_solution(const fs::path& solutions_dir, const std::string& task_id) {
  for (const fs::path& candidate : {solutions_dir / task_id / "model_new.py", solutions_dir / (task_id + ".py")})
    if (fs::is_regular_file(candidate)) return fs::absolute(candidate);
  return std::nullopt;
}

}  // namespace cuda_agent::bench
