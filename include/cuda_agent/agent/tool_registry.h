// The ten tools of an agent episode, bound to one Workspace:
//
//   Bash, BashOutput, KillBash, Read, Write, Edit, MultiEdit, Glob, Grep, NotebookEdit
//
// with the semantics known from Claude Code (and OpenHands). Summary of what differs or is
// worth knowing; each tool's schema description tells the model the rest:
//
// - Paths are relative to the workspace root or absolute inside it; everything goes through
//   Workspace::resolve, so escapes are refused. Listings show paths relative to the root.
// - Bash runs `bash -c COMMAND` with cwd = root, in its own process group, with a clean
//   environment: PATH (the parent's), HOME = root, LANG (the parent's, else C.UTF-8), then
//   the `env` given to the constructor (put CUDA_AGENT_CACHE_DIR, CUDA_VISIBLE_DEVICES,
//   LD_LIBRARY_PATH, ... there; with HOME = root a tool's ~/.cache lands in the workspace).
//   Every call starts a fresh shell in the root: cd and shell variables do not carry over
//   (unlike Claude Code's persistent session). Foreground commands run through run_subprocess with the timeout; when they end, every
//   process left in their group is killed (use run_in_background for servers and long jobs).
//   Background commands write to a file in a scratch directory outside the root that the
//   registry owns; BashOutput returns what is new since the last read.
// - Grep runs GNU grep with Perl-compatible regular expressions (grep -P, under LC_ALL=C;
//   grep -E where grep lacks PCRE), one line at a time, over the files the workspace
//   listing yields (symlinks that leave the root are skipped), under a time limit, so a
//   pathological pattern cannot hang the loop. BashOutput's filter uses the same engine.
// - Glob patterns: '*', '?', '[...]' within one path segment, '**' for any number of
//   segments, '{a,b}' alternatives; matched against paths relative to the search directory.
//
// Not thread-safe: one episode calls its tools one at a time. Background shells are
// independent processes; the registry reaps them only when asked (BashOutput, KillBash) and
// kills every one that is left, with its process group, in the destructor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/tool.h"
#include "cuda_agent/agent/workspace.h"

namespace cuda_agent::agent {

class ToolRegistry {
 public:
  // `workspace` must outlive the registry. `env` is added to the shells' environment
  // (overriding PATH, HOME, LANG when it names them). Throws Error on bad options (see
  // ToolOptions) or when the scratch directory cannot be created.
  ToolRegistry(Workspace& workspace, ToolOptions options = {},
               std::map<std::string, std::string> env = {});
  ~ToolRegistry();  // kills the background shells that are still running
  // Ends the background shells still running, now (the episode's final score comes next).
  void stop_background();
  ToolRegistry(ToolRegistry&&) noexcept;
  ToolRegistry& operator=(ToolRegistry&&) noexcept;
  ToolRegistry(const ToolRegistry&) = delete;
  ToolRegistry& operator=(const ToolRegistry&) = delete;

  // A JSON array of the ten tool schemas, in the order above.
  nlohmann::json schemas() const;

  // Runs the tool `name` with `arguments`. Never throws. Before the tool runs, the
  // arguments are checked against its schema: they must be a JSON object; null values count
  // as absent; every required argument must be present; every argument must be known and of
  // the declared type (an integral number such as 5.0 counts as an integer), enums must hold
  // one of their values, array items are checked the same way. A failure gives ok=false with
  // a message naming the tool, the argument and the expected type; so does an unknown tool
  // (the message lists the known ones). The output and the strings in data are made valid
  // UTF-8 (invalid bytes become U+FFFD), and the output is truncated to max_output_chars.
  ToolResult call(const std::string& name, const nlohmann::json& arguments);

  // The tool names, in schema order.
  std::vector<std::string> names() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda_agent::agent
