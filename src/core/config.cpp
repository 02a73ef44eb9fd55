#include "cuda_agent/core/config.h"

#include <cmath>

#include <yaml-cpp/yaml.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent {
namespace {

nlohmann::json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& item : node) arr.push_back(to_json(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      nlohmann::json obj = nlohmann::json::object();
      for (const auto& kv : node) obj[kv.first.as<std::string>()] = to_json(kv.second);
      return obj;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted: always a string
      if (s == "true" || s == "True" || s == "yes") return true;
      if (s == "false" || s == "False" || s == "no") return false;
      if (s == "null" || s == "~") return nullptr;
      try {
        size_t used = 0;
        long long i = std::stoll(s, &used);
        if (used == s.size()) return i;
      } catch (...) {
      }
      try {
        size_t used = 0;
        double d = std::stod(s, &used);
        // inf and nan stay strings: JSON cannot carry them, and no option wants them.
        if (used == s.size() && std::isfinite(d)) return d;
      } catch (...) {
      }
      return s;
    }
  }
  return nullptr;
}

const char* type_name(const nlohmann::json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "a mapping";
  return "null";
}

bool compatible(const nlohmann::json& expected, const nlohmann::json& given) {
  if (expected.is_null() || given.is_null()) return true;  // null default: any type; null: unset
  if (expected.is_number_float()) return given.is_number();
  if (expected.is_number_integer()) return given.is_number_integer();
  return expected.type() == given.type();
}

}  // namespace

nlohmann::json parse_yaml(const std::string& text, const std::string& where) {
  try {
    return to_json(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    CA_FAIL("{}: malformed YAML at line {}, column {}: {}", where, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

nlohmann::json load_yaml_file(const std::filesystem::path& path) {
  return parse_yaml(read_file(path), path.string());
}

void merge_checked(nlohmann::json& base, const nlohmann::json& overrides, const std::string& where,
                   const std::string& prefix) {
  if (overrides.is_null()) return;
  CA_CHECK(overrides.is_object(), "{}: expected a mapping{}, got {}", where,
           prefix.empty() ? "" : " at '" + prefix + "'", type_name(overrides));
  for (const auto& [key, value] : overrides.items()) {
    const std::string dotted = prefix.empty() ? key : prefix + "." + key;
    if (!base.contains(key)) {
      std::vector<std::string> known;
      for (const auto& [k, _] : base.items()) known.push_back(k);
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      CA_FAIL("{}: unknown key '{}'; known keys{}: {}", where, dotted,
              prefix.empty() ? "" : " under '" + prefix + "'", list);
    }
    nlohmann::json& slot = base[key];
    if (value.is_null()) continue;  // `key:` with no value, or `--set key=`: keep the default
    if (slot.is_object() && !slot.empty()) {
      merge_checked(slot, value, where, dotted);
      continue;
    }
    CA_CHECK(compatible(slot, value), "{}: '{}' must be {}, got {} ({})", where, dotted, type_name(slot),
             type_name(value), value.dump());
    if (slot.is_number_float() && value.is_number_integer()) slot = value.get<double>();
    else slot = value;
  }
}

void apply_override(nlohmann::json& base, const std::string& assignment) {
  const auto eq = assignment.find('=');
  CA_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key=value, e.g. --set sandbox.timed_runs=50",
           assignment);
  const std::string key = assignment.substr(0, eq);
  nlohmann::json value = parse_yaml(assignment.substr(eq + 1), "--set " + key);
  // Build {"a": {"b": value}} and merge, so errors name the full dotted key.
  nlohmann::json nested = value;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    CA_CHECK(!it->empty(), "--set '{}': empty key component", assignment);
    nested = nlohmann::json{{*it, nested}};
  }
  merge_checked(base, nested, "--set");
}

}  // namespace cuda_agent
