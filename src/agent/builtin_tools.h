// The ten built-in tools, as factories over one ToolContext (tool_support.h), and the base
// class that turns every exception into an ok=false observation.
#pragma once

#include <exception>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/tool.h"
#include "tool_support.h"

namespace cuda_agent::agent {

// A tool bound to the registry's context. run() never throws: an exception from execute()
// becomes an ok=false result, and every error message starts with the tool's name (except
// output marked raw_output_).
class BuiltinTool : public Tool {
 public:
  explicit BuiltinTool(ToolContext& context) : context_(context) {}

  ToolResult run(const nlohmann::json& arguments) final {
    ToolResult result;
    raw_output_ = false;
    try {
      result = execute(arguments);
    } catch (const std::exception& e) {
      result = tool_error(e.what());
    } catch (...) {
      result = tool_error("unexpected error");
    }
    const std::string prefix = name() + ": ";
    if (!result.ok && !raw_output_ && result.output.compare(0, prefix.size(), prefix) != 0) {
      result.output = prefix + result.output;
    }
    return result;
  }

 protected:
  virtual ToolResult execute(const nlohmann::json& arguments) = 0;
  const Workspace& workspace() const { return *context_.workspace; }

  ToolContext& context_;
  // Set by execute() when a failed result is the command's own output (Bash), which must
  // reach the model unprefixed.
  bool raw_output_ = false;
};

// bash_tools.cpp
std::unique_ptr<Tool> make_bash_tool(ToolContext& context);
std::unique_ptr<Tool> make_bash_output_tool(ToolContext& context);
std::unique_ptr<Tool> make_kill_bash_tool(ToolContext& context);
// file_tools.cpp
std::unique_ptr<Tool> make_read_tool(ToolContext& context);
std::unique_ptr<Tool> make_write_tool(ToolContext& context);
// edit_tools.cpp
std::unique_ptr<Tool> make_edit_tool(ToolContext& context);
std::unique_ptr<Tool> make_multi_edit_tool(ToolContext& context);
// search_tools.cpp
std::unique_ptr<Tool> make_glob_tool(ToolContext& context);
std::unique_ptr<Tool> make_grep_tool(ToolContext& context);
// notebook_edit_tool.cpp
std::unique_ptr<Tool> make_notebook_edit_tool(ToolContext& context);

}  // namespace cuda_agent::agent
