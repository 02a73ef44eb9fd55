// Edit and MultiEdit: exact string replacement in a file, one edit or several applied
// together (all or none).
#include <algorithm>
#include <system_error>

#include "builtin_tools.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kSnippetContext = 3;

struct EditOutcome {
  size_t replacements = 0;
  size_t first_position = 0;  // byte offset of the first replacement in the new text
  std::string error;          // empty on success
};

// Replaces old_string by new_string in `text` (non-overlapping occurrences, left to right).
EditOutcome apply_edit(std::string& text, const std::string& old_string,
                       const std::string& new_string, bool replace_all, const std::string& shown) {
  EditOutcome outcome;
  if (old_string.empty()) {
    outcome.error = "old_string is empty; give the exact text to replace (use Write to create "
                    "or overwrite a whole file)";
    return outcome;
  }
  if (old_string == new_string) {
    outcome.error = "old_string and new_string are the same; nothing would change";
    return outcome;
  }
  size_t count = 0;
  for (size_t at = text.find(old_string); at != std::string::npos;
       at = text.find(old_string, at + old_string.size())) {
    ++count;
  }
  if (count == 0) {
    outcome.error = fmt::format("old_string was not found in {}; it must match the file "
                                "exactly, whitespace and indentation included (Read the file "
                                "to see its current text)", shown);
    return outcome;
  }
  if (count > 1 && !replace_all) {
    outcome.error = fmt::format("old_string occurs {} times in {}; include more surrounding "
                                "lines to make it unique, or set replace_all to replace every "
                                "occurrence", count, shown);
    return outcome;
  }
  std::string result;
  result.reserve(text.size() + count * new_string.size());
  size_t from = 0;
  for (size_t at = text.find(old_string); at != std::string::npos;
       at = text.find(old_string, from)) {
    result.append(text, from, at - from);
    if (outcome.replacements == 0) outcome.first_position = result.size();
    result += new_string;
    from = at + old_string.size();
    ++outcome.replacements;
  }
  result.append(text, from, std::string::npos);
  text = std::move(result);
  return outcome;
}

// Lines around [position, position + length) of `text`, numbered like Read's output.
std::string numbered_snippet(const std::string& text, size_t position, size_t length) {
  const auto line_of = [&](size_t offset) {
    return static_cast<int64_t>(std::count(text.begin(), text.begin() + offset, '\n')) + 1;
  };
  const int64_t first = std::max<int64_t>(line_of(position) - kSnippetContext, 1);
  const int64_t last = line_of(std::min(position + length, text.size())) + kSnippetContext;
  std::string out;
  int64_t number = 1;
  size_t begin = 0;
  while (begin <= text.size() && number <= last) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    if (number >= first && !(begin == text.size() && end == begin)) {
      std::string line = text.substr(begin, std::min<size_t>(end - begin, 2000));
      out += fmt::format("{:>6}\t{}\n", number, line);
    }
    begin = end + 1;
    ++number;
  }
  return out;
}

// Resolves file_path to an existing, writable, unlocked regular file; returns the error.
std::optional<std::string> editable_file_error(const Workspace& workspace, const fs::path& path) {
  if (workspace.is_locked(path)) return locked_message(workspace, path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  const std::string shown = display_path(workspace, path);
  if (!fs::exists(status)) {
    return fmt::format("{} does not exist; create it with Write", shown);
  }
  if (!fs::is_regular_file(status)) return fmt::format("{} is not a regular file", shown);
  return std::nullopt;
}

json path_property() {
  return {{"type", "string"},
          {"description", "Path of the file, relative to the workspace root or absolute"}};
}

json edit_properties() {
  return {{"old_string", {{"type", "string"}, {"description", "The exact text to replace"}}},
          {"new_string", {{"type", "string"}, {"description", "The text to put in its place"}}},
          {"replace_all",
           {{"type", "boolean"},
            {"description", "Replace every occurrence instead of requiring exactly one "
                            "(default false)"}}}};
}

class EditTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Edit"; }

  json schema() const override {
    json properties = edit_properties();
    properties["file_path"] = path_property();
    return function_schema(
        name(),
        "Replaces old_string with new_string in a file. old_string must match the file "
        "exactly (whitespace and indentation included) and occur exactly once, unless "
        "replace_all is true; new_string must differ from it. Returns the number of "
        "replacements and the changed lines.",
        properties, {"file_path", "old_string", "new_string"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path path = workspace().resolve(string_arg(args, "file_path"));
    if (auto error = editable_file_error(workspace(), path)) return tool_error(*error);
    const std::string shown = display_path(workspace(), path);
    std::string text = workspace().read_inside(path, kEditedFileMaxBytes);
    const std::string new_string = string_arg(args, "new_string");
    const EditOutcome outcome =
        apply_edit(text, string_arg(args, "old_string"), new_string,
                   bool_arg(args, "replace_all", false), shown);
    if (!outcome.error.empty()) return tool_error(outcome.error);
    workspace().write_inside(path, text);

    ToolResult result;
    result.output = fmt::format("Replaced {} occurrence{} in {}.", outcome.replacements,
                                outcome.replacements == 1 ? "" : "s", shown);
    if (outcome.replacements == 1) {
      result.output += " The lines around the change:\n" +
                       numbered_snippet(text, outcome.first_position, new_string.size());
    }
    result.data = {{"path", shown}, {"replacements", outcome.replacements}};
    return result;
  }
};

class MultiEditTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "MultiEdit"; }

  json schema() const override {
    return function_schema(
        name(),
        "Applies several Edit-style replacements to one file, in order, each to the result of "
        "the previous one. Either all edits succeed and the file is written once, or none is "
        "applied and the file is unchanged. Each edit follows Edit's rules (exact match, "
        "unique unless replace_all).",
        {{"file_path", path_property()},
         {"edits",
          {{"type", "array"},
           {"description", "The edits, applied in order"},
           {"items",
            {{"type", "object"},
             {"properties", edit_properties()},
             {"required", {"old_string", "new_string"}},
             {"additionalProperties", false}}}}}},
        {"file_path", "edits"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path path = workspace().resolve(string_arg(args, "file_path"));
    if (auto error = editable_file_error(workspace(), path)) return tool_error(*error);
    const std::string shown = display_path(workspace(), path);
    const json& edits = args.at("edits");
    if (edits.empty()) return tool_error("edits is empty; give at least one edit");
    std::string text = workspace().read_inside(path, kEditedFileMaxBytes);
    json counts = json::array();
    size_t total = 0;
    for (size_t i = 0; i < edits.size(); ++i) {
      const EditOutcome outcome =
          apply_edit(text, string_arg(edits[i], "old_string"), string_arg(edits[i], "new_string"),
                     bool_arg(edits[i], "replace_all", false), shown);
      if (!outcome.error.empty()) {
        return tool_error(fmt::format("edit {} of {} failed: {}. No edit was applied; {} is "
                                      "unchanged.", i + 1, edits.size(), outcome.error, shown),
                          {{"failed_edit", i}});
      }
      counts.push_back(outcome.replacements);
      total += outcome.replacements;
    }
    workspace().write_inside(path, text);
    ToolResult result;
    result.output = fmt::format("Applied {} edit{} to {} ({} replacement{}).", edits.size(),
                                edits.size() == 1 ? "" : "s", shown, total,
                                total == 1 ? "" : "s");
    result.data = {{"path", shown}, {"replacements", counts}};
    return result;
  }
};

}  // namespace

std::unique_ptr<Tool> make_edit_tool(ToolContext& context) {
  return std::make_unique<EditTool>(context);
}
std::unique_ptr<Tool> make_multi_edit_tool(ToolContext& context) {
  return std::make_unique<MultiEditTool>(context);
}

}  // namespace cuda_agent::agent
