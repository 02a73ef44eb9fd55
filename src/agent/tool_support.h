// Private helpers shared by the built-in tools: results and schemas, argument access and
// checking, observation text (UTF-8 repair, truncation), files (bounded reads, writes that keep
// the mode), the confined listing of the workspace with glob matching, and the grep runner.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/tool.h"
#include "cuda_agent/agent/workspace.h"

namespace cuda_agent::agent {

class BackgroundShells;

// What every built-in tool is bound to; owned by the registry, outlives its tools.
struct ToolContext {
  Workspace* workspace = nullptr;
  ToolOptions options;
  std::filesystem::path scratch;                // outside the workspace; the registry's
  BackgroundShells* shells = nullptr;
  std::map<std::string, std::string> shell_env;  // the shells' complete environment
};

// The argv that runs `command` with bash in the workspace, confined as options.confine says
// (ToolOptions). Throws Error when confine is "bwrap" and bubblewrap cannot run here.
std::vector<std::string> shell_argv(const ToolContext& context, const std::string& command);
// Whether bubblewrap can confine commands on this machine (probed until it worked once).
bool bwrap_usable();

// --- results and schemas (tool_support.cpp) ---------------------------------------------------

ToolResult tool_error(std::string message, nlohmann::json data = nullptr);

// {"type":"function","function":{"name","description","parameters":{"type":"object",
// "properties", "required", "additionalProperties": false}}}
nlohmann::json function_schema(const std::string& name, const std::string& description,
                               nlohmann::json properties, std::vector<std::string> required);

// Typed access to arguments already checked by check_arguments.
std::string string_arg(const nlohmann::json& args, const char* key, std::string fallback = "");
int64_t int_arg(const nlohmann::json& args, const char* key, int64_t fallback);
double number_arg(const nlohmann::json& args, const char* key, double fallback);
bool bool_arg(const nlohmann::json& args, const char* key, bool fallback);
bool has_arg(const nlohmann::json& args, const char* key);

// Checks `args` against a tool's "parameters" schema (type, required, properties,
// additionalProperties, enum, items), dropping null members. Returns the error message
// ("Read: argument 'offset' must be an integer, got string \"x\"") or nullopt.
std::optional<std::string> check_arguments(const std::string& tool,
                                           const nlohmann::json& parameters,
                                           nlohmann::json& args);

// --- text ---------------------------------------------------------------------------------------

// Replaces every invalid UTF-8 sequence with U+FFFD.
std::string sanitize_utf8(std::string_view text);
// Keeps the head and tail of `text` (cut on UTF-8 boundaries) around
// "\n[... N characters truncated ...]\n" when it is longer than `max_chars`.
std::string truncate_output(std::string_view text, size_t max_chars);

// --- files --------------------------------------------------------------------------------------

// Path relative to the workspace root for messages ("." for the root).
std::string display_path(const Workspace& workspace, const std::filesystem::path& absolute);
// "model.py is read-only: the task cannot be changed; write your solution in model_new.py",
// and the like for the other locked files.
std::string locked_message(const Workspace& workspace, const std::filesystem::path& absolute);
// The most the editing tools (Edit, MultiEdit, NotebookEdit) read of a file they rewrite whole.
inline constexpr uint64_t kEditedFileMaxBytes = uint64_t{64} << 20;
// Bytes [offset, end of file) of `path`; when more than `max_chars`, their head and tail
// around a truncation notice. `end` is the file size when it is 0 or past it. Throws Error.
std::string read_range(const std::filesystem::path& path, uint64_t offset, uint64_t end, size_t max_chars);

// --- listing and globs (workspace_listing.cpp) --------------------------------------------------

struct ListedFile {
  std::filesystem::path absolute;
  std::string relative;  // to the workspace root
  std::string from_base;  // to the directory listed
  std::filesystem::file_time_type mtime;
};

// The files under `base` (a directory inside the workspace), recursively, without following
// symlinked directories; symlinks to files are listed only when they resolve inside the
// workspace. Stops after `max_entries` directory entries and sets *capped.
std::vector<ListedFile> list_files(const Workspace& workspace, const std::filesystem::path& base,
                                   size_t max_entries, bool* capped);
// Newest first, then by path.
void sort_newest_first(std::vector<ListedFile>& files);

// Glob match of a '/'-separated relative path: '*', '?', '[...]' within a segment, '**' as a
// whole segment for zero or more segments, '{a,b}' alternatives (nestable).
bool glob_match(std::string_view pattern, std::string_view path);

// --- grep (grep_runner.cpp) ---------------------------------------------------------------------

struct GrepRun {
  int exit_code = -1;  // 0 match, 1 none, 2 error
  bool timed_out = false;
  std::string out;     // stdout, at most max_out_bytes of it
  bool out_capped = false;
  std::string err;     // stderr
};

// Runs `grep <syntax flag> args...` with LC_ALL=C in `cwd`, output through files in
// `scratch`, under `timeout_s`. With `confined_as`, grep runs as that context's Bash commands
// do (shell_argv, `cwd` its workspace): the Grep tool reads workspace files by name, and a
// folder a background shell swapped for a symlink since they were listed would otherwise lead
// this process out of the workspace. Throws Error when grep cannot be started.
GrepRun run_grep(const std::vector<std::string>& args, const std::filesystem::path& cwd,
                 const std::filesystem::path& scratch, double timeout_s, size_t max_out_bytes,
                 const ToolContext* confined_as = nullptr);
// `s` in single quotes for a POSIX shell.
std::string shell_quote(const std::string& s);
// "-P" when this machine's grep has PCRE, else "-E". Probed once; thread-safe.
const char* grep_syntax_flag();

}  // namespace cuda_agent::agent
