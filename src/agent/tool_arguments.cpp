// Checks tool-call arguments against the subset of JSON Schema the tool schemas use: type
// (string, integer, number, boolean, array, object), required, properties,
// additionalProperties: false, enum, items. Models get the checker's message back as an
// observation, so each message names the tool, the argument, what was expected and what came.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tool_support.h"

namespace cuda_agent::agent {
namespace {

using nlohmann::json;

std::string type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    default: return "unknown";
  }
}

// A short rendering of the value for messages.
std::string preview(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

bool has_type(const json& value, const std::string& type) {
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer() || value.is_number_unsigned()) return true;
    if (!value.is_number_float()) return false;
    const double number = value.get<double>();
    return std::isfinite(number) && std::floor(number) == number;
  }
  return true;  // a type this checker does not know: accept
}

std::string article(const std::string& type) {
  return (type == "integer" || type == "array" || type == "object") ? "an " + type : "a " + type;
}

std::optional<std::string> check_value(const std::string& tool, const std::string& where,
                                       const json& schema, json& value);

std::optional<std::string> check_object(const std::string& tool, const std::string& where,
                                        const json& schema, json& value) {
  const json properties = schema.value("properties", json::object());
  // Nulls count as absent: several model families emit "arg": null for unused options.
  for (auto it = value.begin(); it != value.end();) {
    it = it.value().is_null() ? value.erase(it) : std::next(it);
  }
  const auto label = [&](const std::string& key) {
    return where.empty() ? key : where + "." + key;
  };
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!properties.contains(it.key())) {
      if (schema.value("additionalProperties", true) == false) {
        std::string known;
        for (auto p = properties.begin(); p != properties.end(); ++p) {
          known += (known.empty() ? "" : ", ") + p.key();
        }
        return fmt::format("{}: unknown argument '{}'; {} takes: {}", tool, label(it.key()),
                           where.empty() ? tool : "'" + where + "'", known);
      }
      continue;
    }
    if (auto error = check_value(tool, label(it.key()), properties.at(it.key()), it.value())) {
      return error;
    }
  }
  if (schema.contains("required")) {
    for (const auto& key : schema.at("required")) {
      const std::string name = key.get<std::string>();
      if (value.contains(name)) continue;
      const std::string type = properties.contains(name)
                                   ? properties.at(name).value("type", std::string("value"))
                                   : std::string("value");
      return fmt::format("{}: missing required argument '{}' ({})", tool, label(name), type);
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_value(const std::string& tool, const std::string& where,
                                       const json& schema, json& value) {
  const std::string type = schema.value("type", std::string());
  if (!type.empty() && !has_type(value, type)) {
    return fmt::format("{}: argument '{}' must be {}, got {} {}", tool, where, article(type),
                       type_name(value), preview(value));
  }
  if (schema.contains("enum")) {
    const json& options = schema.at("enum");
    if (std::find(options.begin(), options.end(), value) == options.end()) {
      std::string listed;
      for (const auto& option : options) listed += (listed.empty() ? "" : ", ") + option.dump();
      return fmt::format("{}: argument '{}' must be one of {}, got {}", tool, where, listed,
                         preview(value));
    }
  }
  if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) {
      if (auto error = check_value(tool, fmt::format("{}[{}]", where, i), schema.at("items"),
                                   value[i])) {
        return error;
      }
    }
  }
  if (value.is_object() && (schema.contains("properties") || schema.contains("required"))) {
    return check_object(tool, where, schema, value);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_arguments(const std::string& tool, const json& parameters,
                                           json& args) {
  if (args.is_null()) args = json::object();
  if (!args.is_object()) {
    return fmt::format("{}: arguments must be a JSON object of named arguments, got {} {}",
                       tool, type_name(args), preview(args));
  }
  return check_object(tool, "", parameters, args);
}

}  // namespace cuda_agent::agent
