// Glob and Grep: finding files by name and by content, confined to the workspace.
#include <algorithm>
#include <system_error>
#include <unordered_map>

#include "builtin_tools.h"
#include "cuda_agent/core/error.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxListedEntries = 200000;
constexpr size_t kMaxGlobResults = 100;
constexpr double kGrepTimeoutS = 60;
constexpr size_t kGrepFilesPerRun = 1000;
constexpr size_t kMaxGrepOutputBytes = 8 << 20;

// The directory to search: `path` when given, else the root.
fs::path search_base(const Workspace& workspace, const json& args) {
  return has_arg(args, "path") ? workspace.resolve(string_arg(args, "path")) : workspace.root();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines, size_t count) {
  std::string out;
  for (size_t i = 0; i < count && i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

class GlobTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Glob"; }

  json schema() const override {
    return function_schema(
        name(),
        "Finds files whose path matches a glob pattern, newest first (by modification time), "
        "at most 100. '*' and '?' match within one path segment, '**' matches any number of "
        "directories, '{a,b}' either alternative: \"**/*.py\", \"kernels/*.{cu,cuh}\". Paths "
        "are shown relative to the workspace root.",
        {{"pattern", {{"type", "string"}, {"description", "The glob pattern"}}},
         {"path",
          {{"type", "string"},
           {"description", "Directory to search in (default: the workspace root)"}}}},
        {"pattern"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path base = search_base(workspace(), args);
    std::error_code ec;
    if (!fs::is_directory(base, ec)) {
      return tool_error(fmt::format("{} is not a directory", display_path(workspace(), base)));
    }
    std::string pattern = string_arg(args, "pattern");
    if (pattern.empty()) return tool_error("pattern is empty; give a glob such as \"**/*.py\"");
    if (pattern.front() == '/') {
      // An absolute pattern must lie inside the search directory.
      const fs::path relative = fs::path(pattern).lexically_normal().lexically_relative(base);
      if (relative.empty() || *relative.begin() == "..") {
        return tool_error(fmt::format("path escapes the workspace: pattern '{}' is outside {}; "
                                      "give a pattern relative to the workspace", pattern,
                                      display_path(workspace(), base)));
      }
      pattern = relative.generic_string();
    }
    for (const auto& segment : fs::path(pattern)) {
      if (segment == "..") {
        return tool_error(fmt::format("pattern '{}' contains '..'; patterns cannot leave the "
                                      "search directory", pattern));
      }
    }

    bool capped = false;
    std::vector<ListedFile> files = list_files(workspace(), base, kMaxListedEntries, &capped);
    std::erase_if(files, [&](const ListedFile& file) {
      return !glob_match(pattern, file.from_base);
    });
    sort_newest_first(files);

    ToolResult result;
    result.data = {{"count", files.size()}, {"files", json::array()}};
    if (files.empty()) {
      result.output = fmt::format("No files found matching '{}' in {}", pattern,
                                  display_path(workspace(), base));
      return result;
    }
    for (size_t i = 0; i < files.size() && i < kMaxGlobResults; ++i) {
      result.output += files[i].relative + "\n";
      result.data["files"].push_back(files[i].relative);
    }
    if (files.size() > kMaxGlobResults) {
      result.output += fmt::format("({} more files not shown; narrow the pattern or path)\n",
                                   files.size() - kMaxGlobResults);
    }
    if (capped) result.output += "(the listing stopped early: the directory is very large)\n";
    return result;
  }
};

class GrepTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Grep"; }

  json schema() const override {
    const json integer = {{"type", "integer"}};
    return function_schema(
        name(),
        "Searches file contents for a regular expression (Perl-compatible, as grep -P: \\d, "
        "\\w, \\s, (?i), lookarounds), one line at a time. output_mode \"files_with_matches\" "
        "(default) lists matching files, newest first; \"content\" shows matching lines as "
        "path:line:text (context lines as path-line-text, groups separated by --); \"count\" "
        "gives matches per file. Binary files are skipped.",
        {{"pattern", {{"type", "string"}, {"description", "The regular expression"}}},
         {"path",
          {{"type", "string"},
           {"description", "File or directory to search (default: the workspace root)"}}},
         {"glob",
          {{"type", "string"},
           {"description", "Only files matching this glob, e.g. \"*.py\" (file name) or "
                           "\"kernels/**/*.cu\" (path from `path`)"}}},
         {"output_mode",
          {{"type", "string"},
           {"enum", {"content", "files_with_matches", "count"}},
           {"description", "What to show (default files_with_matches)"}}},
         {"-A", {{"type", "integer"}, {"description", "Lines of context after each match "
                                                      "(content mode)"}}},
         {"-B", {{"type", "integer"}, {"description", "Lines of context before each match "
                                                      "(content mode)"}}},
         {"-C", {{"type", "integer"}, {"description", "Lines of context around each match "
                                                      "(content mode)"}}},
         {"-n", {{"type", "boolean"}, {"description", "Show line numbers (content mode; "
                                                      "default true)"}}},
         {"-i", {{"type", "boolean"}, {"description", "Case-insensitive search"}}},
         {"head_limit",
          {{"type", "integer"},
           {"description", "Show only the first N lines or entries of the result"}}}},
        {"pattern"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path base = search_base(workspace(), args);
    const std::string pattern = string_arg(args, "pattern");
    const std::string mode = string_arg(args, "output_mode", "files_with_matches");
    const int64_t head_limit = int_arg(args, "head_limit", 0);
    if (head_limit < 0) return tool_error("head_limit must be >= 0 (0: no limit)");
    for (const char* key : {"-A", "-B", "-C"}) {
      if (int_arg(args, key, 0) < 0) return tool_error(fmt::format("{} must be >= 0", key));
    }

    std::error_code ec;
    std::vector<ListedFile> files;
    bool capped = false;
    if (fs::is_regular_file(base, ec)) {
      files.push_back({base, display_path(workspace(), base), base.filename().string(),
                       fs::last_write_time(base, ec)});
    } else if (fs::is_directory(base, ec)) {
      files = list_files(workspace(), base, kMaxListedEntries, &capped);
    } else {
      return tool_error(fmt::format("{} does not exist", display_path(workspace(), base)));
    }
    if (has_arg(args, "glob")) {
      const std::string glob = string_arg(args, "glob");
      const bool by_path = glob.find('/') != std::string::npos;
      std::erase_if(files, [&](const ListedFile& file) {
        return !glob_match(glob, by_path ? file.from_base
                                         : fs::path(file.from_base).filename().string());
      });
    }

    std::vector<std::string> flags = {"-I", "-s", "-H"};
    if (bool_arg(args, "-i", false)) flags.push_back("-i");
    if (mode == "files_with_matches") flags.push_back("-l");
    if (mode == "count") flags.push_back("-c");
    if (mode == "content") {
      if (bool_arg(args, "-n", true)) flags.push_back("-n");
      for (const char* key : {"-A", "-B", "-C"}) {
        if (has_arg(args, key)) flags.push_back(fmt::format("{}{}", key, int_arg(args, key, 0)));
      }
    }
    flags.insert(flags.end(), {"-e", pattern, "--"});

    std::string output;
    bool output_capped = false;
    for (size_t begin = 0; begin < files.size(); begin += kGrepFilesPerRun) {
      std::vector<std::string> run_args = flags;
      for (size_t i = begin; i < files.size() && i < begin + kGrepFilesPerRun; ++i) {
        run_args.push_back(files[i].relative);
      }
      const GrepRun run =
          run_grep(run_args, workspace().root(), context_.scratch, kGrepTimeoutS, kMaxGrepOutputBytes, &context_);
      if (run.timed_out) {
        return tool_error(fmt::format("the search took longer than {:g} s; simplify the "
                                      "pattern or narrow path and glob", kGrepTimeoutS));
      }
      if ((run.exit_code == 2 && run.out.empty()) || run.exit_code < 0) {
        return tool_error(fmt::format("invalid pattern '{}': {}", pattern,
                                      run.err.empty() ? "grep failed" : run.err));
      }
      output += run.out;
      output_capped = output_capped || run.out_capped;
    }
    return format(mode, output, files, head_limit, output_capped || capped);
  }

 private:
  static ToolResult format(const std::string& mode, const std::string& output,
                           const std::vector<ListedFile>& files, int64_t head_limit,
                           bool capped) {
    std::vector<std::string> lines = split_lines(output);
    ToolResult result;
    std::string summary;
    if (mode == "files_with_matches") {
      std::unordered_map<std::string, fs::file_time_type> mtimes;
      for (const auto& file : files) mtimes[file.relative] = file.mtime;
      std::stable_sort(lines.begin(), lines.end(), [&](const auto& a, const auto& b) {
        return mtimes[a] > mtimes[b];
      });
      summary = fmt::format("Found {} file{}", lines.size(), lines.size() == 1 ? "" : "s");
      result.data = {{"files", lines.size()}};
    } else if (mode == "count") {
      int64_t total = 0;
      std::erase_if(lines, [&](const std::string& line) {
        const size_t colon = line.rfind(':');
        const int64_t count = colon == std::string::npos ? 0 : std::atoll(line.c_str() + colon + 1);
        total += count;
        return count == 0;
      });
      summary = fmt::format("Found {} matching line{} in {} file{}", total, total == 1 ? "" : "s",
                            lines.size(), lines.size() == 1 ? "" : "s");
      result.data = {{"matches", total}, {"files", lines.size()}};
    } else {
      result.data = {{"lines", lines.size()}};
    }
    if (lines.empty()) {
      result.output = "No matches found";
      return result;
    }
    const size_t shown = head_limit > 0 ? std::min<size_t>(head_limit, lines.size())
                                        : lines.size();
    if (!summary.empty()) result.output = summary + "\n";
    result.output += join_lines(lines, shown);
    if (shown < lines.size()) {
      result.output += fmt::format("(showing the first {} of {}; raise head_limit or narrow the "
                                   "search)\n", shown, lines.size());
    }
    if (capped) result.output += "(the search output was cut short: narrow the search)\n";
    return result;
  }
};

}  // namespace

std::unique_ptr<Tool> make_glob_tool(ToolContext& context) {
  return std::make_unique<GlobTool>(context);
}
std::unique_ptr<Tool> make_grep_tool(ToolContext& context) {
  return std::make_unique<GrepTool>(context);
}

}  // namespace cuda_agent::agent
