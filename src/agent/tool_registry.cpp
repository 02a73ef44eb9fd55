#include "cuda_agent/agent/tool_registry.h"

#include <cstdlib>

#include "background_shells.h"
#include "builtin_tools.h"
#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::agent {

namespace {

constexpr const char* kDefaultPath = "/usr/local/bin:/usr/bin:/bin";

std::map<std::string, std::string> shell_environment(const Workspace& workspace,
                                                     const std::map<std::string, std::string>& env) {
  const char* path = std::getenv("PATH");
  const char* lang = std::getenv("LANG");
  std::map<std::string, std::string> out = {
      {"PATH", path != nullptr && path[0] != '\0' ? path : kDefaultPath},
      {"HOME", workspace.root().string()},
      {"LANG", lang != nullptr && lang[0] != '\0' ? lang : "C.UTF-8"},
      // The host's temporary directory, where the GPU lock files are: an evaluation the shell
      // starts (verify.sh) takes the same locks as ours, whatever TMPDIR the shell gets.
      {"CUDA_AGENT_HOST_TMPDIR", host_temp_directory().string()}};
  for (const auto& [name, value] : env) {
    CA_CHECK(!name.empty() && name.find('=') == std::string::npos,
             "invalid environment variable name '{}' for the tools' shells", name);
    out[name] = value;
  }
  return out;
}

// Makes every string in `value` valid UTF-8 (file names can hold any bytes), so that the
// result can always be serialized.
void sanitize_json(nlohmann::json& value) {
  if (value.is_string()) {
    value = sanitize_utf8(value.get_ref<const std::string&>());
  } else if (value.is_structured()) {
    for (auto& item : value) sanitize_json(item);
  }
}

}  // namespace

// Members are destroyed bottom-up: the tools, then the shells (killed), then the scratch
// directory that held their output.
struct ToolRegistry::Impl {
  TempDir scratch{"cuda-agent-tools-"};
  ToolContext context;
  std::unique_ptr<BackgroundShells> shells;
  std::vector<std::unique_ptr<Tool>> tools;
};

ToolRegistry::ToolRegistry(Workspace& workspace, ToolOptions options,
                           std::map<std::string, std::string> env)
    : impl_(std::make_unique<Impl>()) {
  CA_CHECK(options.max_output_chars >= 1000, "tool option max_output_chars is {}; it must be "
           ">= 1000", options.max_output_chars);
  CA_CHECK(options.default_timeout_s > 0 && options.max_timeout_s > 0,
           "tool timeouts must be positive (default_timeout_s {}, max_timeout_s {})",
           options.default_timeout_s, options.max_timeout_s);
  CA_CHECK(options.default_timeout_s <= options.max_timeout_s,
           "tool option default_timeout_s ({}) is larger than max_timeout_s ({})",
           options.default_timeout_s, options.max_timeout_s);
  impl_->shells = std::make_unique<BackgroundShells>(impl_->scratch.path());
  ToolContext& context = impl_->context;
  context.workspace = &workspace;
  context.options = options;
  context.scratch = impl_->scratch.path();
  context.shells = impl_->shells.get();
  context.shell_env = shell_environment(workspace, env);

  auto& tools = impl_->tools;
  tools.push_back(make_bash_tool(context));
  tools.push_back(make_bash_output_tool(context));
  tools.push_back(make_kill_bash_tool(context));
  tools.push_back(make_read_tool(context));
  tools.push_back(make_write_tool(context));
  tools.push_back(make_edit_tool(context));
  tools.push_back(make_multi_edit_tool(context));
  tools.push_back(make_glob_tool(context));
  tools.push_back(make_grep_tool(context));
  tools.push_back(make_notebook_edit_tool(context));
}

ToolRegistry::~ToolRegistry() = default;

void ToolRegistry::stop_background() { impl_->shells->stop_all(); }
ToolRegistry::ToolRegistry(ToolRegistry&&) noexcept = default;
ToolRegistry& ToolRegistry::operator=(ToolRegistry&&) noexcept = default;

nlohmann::json ToolRegistry::schemas() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& tool : impl_->tools) out.push_back(tool->schema());
  return out;
}

std::vector<std::string> ToolRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& tool : impl_->tools) out.push_back(tool->name());
  return out;
}

ToolResult ToolRegistry::call(const std::string& name, const nlohmann::json& arguments) {
  ToolResult result;
  // Background shells that keep the GPU's lock files (ToolOptions::lock_hold_limits) go first.
  std::string stopped_note;
  if (!impl_->context.options.lock_hold_limits.empty()) {
    try {
      for (const std::string& line : impl_->shells->stop_lock_holders(impl_->context.options.lock_hold_limits))
        stopped_note += fmt::format(
            "[background shell {}; it was stopped: a command may hold the GPU's lock files "
            "only while it evaluates]\n",
            line);
    } catch (const std::exception&) {
    }
  }
  try {
    Tool* tool = nullptr;
    for (const auto& candidate : impl_->tools) {
      if (candidate->name() == name) tool = candidate.get();
    }
    if (tool == nullptr) {
      std::string known;
      for (const auto& candidate : impl_->tools) {
        known += (known.empty() ? "" : ", ") + candidate->name();
      }
      result = tool_error(fmt::format("unknown tool '{}'; the tools are: {}", name, known));
    } else {
      nlohmann::json args = arguments;
      const nlohmann::json schema = tool->schema();
      if (auto error = check_arguments(name, schema["function"]["parameters"], args)) {
        result = tool_error(*error);
      } else {
        result = tool->run(args);
      }
    }
  } catch (const std::exception& e) {
    result = tool_error(fmt::format("{}: unexpected error: {}", name, e.what()));
  } catch (...) {
    result = tool_error(fmt::format("{}: unexpected error", name));
  }
  result.output = truncate_output(sanitize_utf8(stopped_note + result.output), impl_->context.options.max_output_chars);
  sanitize_json(result.data);
  return result;
}

}  // namespace cuda_agent::agent
