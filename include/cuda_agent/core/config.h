// Configuration: YAML files and `--set a.b=c` overrides merged onto typed defaults.
//
// Options structs publish their defaults as JSON; a YAML file or an override may only name keys
// that exist there and must keep each value's type (an int is accepted where a float is
// expected). Mistakes are errors naming the dotted key, the file and what was expected, so a
// typo never silently runs with a default.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent {

// Parses a YAML file into JSON. Throws Error naming the file (and line) when it is unreadable
// or malformed.
nlohmann::json load_yaml_file(const std::filesystem::path& path);

// Parses YAML text (a document or a single scalar) into JSON; `where` names it in errors.
nlohmann::json parse_yaml(const std::string& text, const std::string& where);

// Merges `overrides` into `base` recursively. Every key of overrides must exist in base with a
// compatible type; `where` (a file name, "--set") appears in error messages.
void merge_checked(nlohmann::json& base, const nlohmann::json& overrides, const std::string& where,
                   const std::string& prefix = "");

// Applies one "a.b.c=value" assignment (value parsed as a YAML scalar or flow collection).
void apply_override(nlohmann::json& base, const std::string& assignment);

}  // namespace cuda_agent
