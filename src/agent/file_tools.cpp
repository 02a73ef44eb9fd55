// Read and Write: whole files in the workspace, read as numbered lines.
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <fstream>
#include <system_error>

#include "builtin_tools.h"
#include "cuda_agent/core/error.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kDefaultLimit = 2000;
constexpr size_t kMaxLineChars = 2000;

// Checks that `path` is an existing regular file the tools may read; returns the error.
std::optional<std::string> readable_file_error(const Workspace& workspace, const fs::path& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  const std::string shown = display_path(workspace, path);
  if (!fs::exists(status)) {
    return fmt::format("{} does not exist; list files with Glob (pattern \"**/*\")", shown);
  }
  if (fs::is_directory(status)) {
    return fmt::format("{} is a directory; list it with Glob or Bash (ls)", shown);
  }
  if (!fs::is_regular_file(status)) return fmt::format("{} is not a regular file", shown);
  return std::nullopt;
}

// Cuts `line` to kMaxLineChars on a UTF-8 boundary.
std::string cut_line(const std::string& line) {
  if (line.size() <= kMaxLineChars) return line;
  size_t cut = kMaxLineChars;
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
  return line.substr(0, cut) + fmt::format(" [... line truncated, {} characters in all]",
                                           line.size());
}

class ReadTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Read"; }

  json schema() const override {
    return function_schema(
        name(),
        "Reads a text file of the workspace and returns its lines numbered like cat -n "
        "(\"     1\\tfirst line\"). Reads up to 2000 lines from the start by default; give "
        "offset (1-based line number) and limit to read a part of a long file. Lines longer "
        "than 2000 characters are cut. Binary files are refused.",
        {{"file_path",
          {{"type", "string"},
           {"description", "Path of the file, relative to the workspace root or absolute"}}},
         {"offset",
          {{"type", "integer"}, {"description", "Line number to start at (1-based)"}}},
         {"limit", {{"type", "integer"}, {"description", "Number of lines to read (2000)"}}}},
        {"file_path"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path path = workspace().resolve(string_arg(args, "file_path"));
    if (auto error = readable_file_error(workspace(), path)) return tool_error(*error);
    const std::string shown = display_path(workspace(), path);
    const int64_t offset = std::max<int64_t>(int_arg(args, "offset", 1), 1);
    const int64_t limit = int_arg(args, "limit", kDefaultLimit);
    if (int_arg(args, "offset", 1) < 0) {
      return tool_error("offset must be a line number >= 1");
    }
    if (limit <= 0) return tool_error(fmt::format("limit is {}; give at least 1 line", limit));

    // Opened from the root without following a link (the checks above went by name: a folder a
    // background shell swapped for a symlink since is refused here, not read through).
    __gnu_cxx::stdio_filebuf<char> file(workspace().open_inside(path), std::ios::in | std::ios::binary);
    std::istream in(&file);
    {
      char head[8192];
      in.read(head, sizeof(head));
      if (std::find(head, head + in.gcount(), '\0') != head + in.gcount()) {
        return tool_error(fmt::format("{} is a binary file (it holds NUL bytes); Read shows text files only", shown));
      }
      in.clear();
      in.seekg(0);
    }
    const size_t budget = context_.options.max_output_chars > 400
                              ? context_.options.max_output_chars - 300
                              : context_.options.max_output_chars;
    std::string output;
    std::string line;
    int64_t number = 0;
    int64_t last_shown = 0;
    bool over_budget = false;
    while (std::getline(in, line)) {
      ++number;
      if (number < offset || number >= offset + limit || over_budget) continue;
      std::string numbered = fmt::format("{:>6}\t{}\n", number, cut_line(line));
      if (output.size() + numbered.size() > budget && last_shown > 0) {
        over_budget = true;
        continue;
      }
      output += numbered;
      last_shown = number;
    }
    const int64_t total = number;

    ToolResult result;
    result.data = {{"lines", total}};
    if (total == 0) {
      result.output = fmt::format("{} exists but is empty", shown);
      return result;
    }
    if (offset > total) {
      return tool_error(fmt::format("{} has {} lines; offset {} is past the end", shown, total,
                                    offset), result.data);
    }
    if (last_shown < total) {
      output += fmt::format("\n(showing lines {}-{} of {}{}; read on with offset={})", offset,
                            last_shown, total,
                            over_budget ? ", the output limit was reached" : "",
                            last_shown + 1);
    }
    result.output = std::move(output);
    result.data["first"] = offset;
    result.data["last"] = last_shown;
    return result;
  }
};

class WriteTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Write"; }

  json schema() const override {
    return function_schema(
        name(),
        "Writes a file of the workspace, replacing it if it exists and creating missing "
        "directories. Use it for new files and complete rewrites; use Edit to change part of a "
        "file. The task files (model.py, verify.sh, profile.sh, README.md) are read-only; the "
        "solution goes in model_new.py.",
        {{"file_path",
          {{"type", "string"},
           {"description", "Path of the file, relative to the workspace root or absolute"}}},
         {"content", {{"type", "string"}, {"description", "The complete new content"}}}},
        {"file_path", "content"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path path = workspace().resolve(string_arg(args, "file_path"));
    if (workspace().is_locked(path)) return tool_error(locked_message(workspace(), path));
    const std::string shown = display_path(workspace(), path);
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (fs::is_directory(status)) {
      return tool_error(fmt::format("{} is a directory; give a file path", shown));
    }
    const bool existed = fs::exists(status);
    const std::string content = string_arg(args, "content");
    workspace().write_inside(path, content);  // its mode kept; no link followed on the way
    const auto lines = std::count(content.begin(), content.end(), '\n') +
                       (!content.empty() && content.back() != '\n' ? 1 : 0);
    ToolResult result;
    result.output = fmt::format("{} {} ({} lines, {} bytes)", existed ? "Overwrote" : "Created",
                                shown, lines, content.size());
    result.data = {{"path", shown}, {"created", !existed}, {"bytes", content.size()}};
    return result;
  }
};

}  // namespace

std::unique_ptr<Tool> make_read_tool(ToolContext& context) {
  return std::make_unique<ReadTool>(context);
}
std::unique_ptr<Tool> make_write_tool(ToolContext& context) {
  return std::make_unique<WriteTool>(context);
}

}  // namespace cuda_agent::agent
