// Bash, BashOutput and KillBash: shell commands in the workspace, in the foreground under a
// timeout or in the background with incremental output.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <system_error>

#include "background_shells.h"
#include "builtin_tools.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/worker_confinement.h"

extern char** environ;

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Seconds a filter's grep may take.
constexpr double kFilterTimeoutS = 30;
// How far back from the end BashOutput looks for the last complete line when filtering.
constexpr uint64_t kLineSearchWindow = 64 * 1024;

// Every variable of our own environment, so that the shell gets only the ones we set.
std::vector<std::string> parent_variables() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq != std::string_view::npos && eq > 0) names.emplace_back(text.substr(0, eq));
  }
  return names;
}

json status_data(const std::string& id, const ShellStatus& status) {
  static const char* const kStates[] = {"running", "exited", "killed"};
  json data = {{"shell_id", id}, {"status", kStates[static_cast<int>(status.state)]}};
  if (status.state == ShellStatus::State::kExited) data["exit_code"] = status.exit_code;
  if (status.state == ShellStatus::State::kKilled) data["signal"] = status.signal;
  return data;
}

class BashTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "Bash"; }

  json schema() const override {
    const ToolOptions& options = context_.options;
    return function_schema(
        name(),
        fmt::format(
            "Runs a bash command in the workspace root (bash -c, in its own process group) and "
            "returns its stdout and stderr interleaved. Each call starts a fresh shell in the "
            "workspace root: cd and variables do not carry over to the next call (chain "
            "commands with &&). \"exit code: N\" is appended when the command fails. Times out after {:g} s unless `timeout` says otherwise (at most {:g} s); "
            "a timed-out command is stopped with everything it started. Use "
            "run_in_background for long jobs or servers: it returns a shell_id to read with "
            "BashOutput and to stop with KillBash. Run ./verify.sh to check the solution and "
            "./profile.sh to time it. Prefer Read, Edit, Write, Glob and Grep over cat, sed, "
            "echo >, find and grep. Output beyond {} characters is truncated in the middle.",
            options.default_timeout_s, options.max_timeout_s, options.max_output_chars),
        {{"command", {{"type", "string"}, {"description", "The command to run"}}},
         {"timeout",
          {{"type", "number"},
           {"description", fmt::format("Optional timeout in milliseconds (max {:g})",
                                       options.max_timeout_s * 1000)}}},
         {"description",
          {{"type", "string"},
           {"description", "A few words saying what the command does"}}},
         {"run_in_background",
          {{"type", "boolean"},
           {"description", "Run the command in the background; read its output later with "
                           "BashOutput"}}}},
        {"command"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const std::string command = string_arg(args, "command");
    if (command.find_first_not_of(" \t\r\n") == std::string::npos) {
      return tool_error("command is empty; give the shell command to run");
    }
    const ToolOptions& options = context_.options;
    if (bool_arg(args, "run_in_background", false)) {
      const std::string id =
          context_.shells->start(shell_argv(context_, command), workspace().root(), context_.shell_env);
      ToolResult result;
      result.output = fmt::format(
          "Command running in the background with shell_id {}. Read its output with "
          "BashOutput (bash_id \"{}\"); stop it with KillBash (shell_id \"{}\").", id, id, id);
      result.data = {{"shell_id", id}};
      return result;
    }

    double timeout_s = options.default_timeout_s;
    if (has_arg(args, "timeout")) {
      const double ms = number_arg(args, "timeout", 0);
      if (!(ms > 0)) {
        return tool_error(fmt::format("timeout is {} ms; give a positive number of "
                                      "milliseconds", args.at("timeout").dump()));
      }
      timeout_s = std::min(ms / 1000.0, options.max_timeout_s);
    }

    SubprocessOptions run;
    try {
      run.argv = shell_argv(context_, command);
    } catch (const Error& e) {
      return tool_error(e.what());
    }
    run.env_unset = parent_variables();
    run.env_set = context_.shell_env;
    run.cwd = workspace().root().string();
    run.stdout_path = (context_.scratch / "bash.out").string();
    run.stderr_path = run.stdout_path;
    run.timeout_s = timeout_s;
    run.kill_grace_s = 1.0;
    run.sample_rss = false;  // confined-exec bounds the command's memory (ToolOptions::max_memory_bytes)
    if (options.gpu_wait_s > 0) {
      run.clock_paused = [](pid_t child) { return sandbox::waits_for_gpu_lock(child); };
      run.max_paused_s = options.gpu_wait_s;
    }
    const SubprocessResult finished = run_subprocess(run);

    std::string output = read_range(run.stdout_path, 0, 0, options.max_output_chars);
    std::error_code ec;
    fs::remove(run.stdout_path, ec);
    std::string status;
    if (finished.timed_out) {
      status = fmt::format(
          "timed out after {:g} s{}; the command and everything it started were stopped (use "
          "run_in_background for long jobs)",
          timeout_s,
          finished.paused_s > 0 ? fmt::format(" (not counting {:.0f} s of waiting for the GPU, which other "
                                              "evaluations held)",
                                              finished.paused_s)
                                : "");
    } else if (finished.term_signal != 0) {
      status = finished.describe();
    } else if (finished.exit_code != 0) {
      status = fmt::format("exit code: {}", finished.exit_code);
    }
    if (!status.empty()) {
      if (!output.empty() && output.back() != '\n') output += '\n';
      output += status;
    }
    ToolResult result;
    raw_output_ = true;
    result.ok = finished.ok();
    result.output = output.empty() ? "(no output)" : output;
    result.data = {
        {"exit_code", finished.term_signal == 0 && !finished.timed_out ? json(finished.exit_code) : json(nullptr)},
        {"timed_out", finished.timed_out},
        {"signal", finished.term_signal},
        {"wall_s", finished.wall_s},
        {"gpu_wait_s", finished.paused_s}};
    return result;
  }
};

// End of the last complete line in [offset, size), or `offset` when there is none in the
// last kLineSearchWindow bytes and the range is shorter than that (a line still being
// written); a longer range without a newline is taken whole.
uint64_t complete_lines_end(const fs::path& path, uint64_t offset, uint64_t size) {
  const uint64_t window_begin = size - std::min(size - offset, kLineSearchWindow);
  std::ifstream in(path, std::ios::binary);
  std::string window(size - window_begin, '\0');
  in.seekg(static_cast<std::streamoff>(window_begin));
  in.read(window.data(), static_cast<std::streamsize>(window.size()));
  window.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  const size_t newline = window.rfind('\n');
  if (newline != std::string::npos) return window_begin + newline + 1;
  return window_begin == offset ? offset : size;
}

// Copies bytes [offset, end) of `from` into `to`.
void copy_range(const fs::path& from, uint64_t offset, uint64_t end, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  CA_CHECK(in.good() && out.good(), "cannot copy shell output to '{}'", to.string());
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<char> buffer(1 << 20);
  for (uint64_t left = end - offset; left > 0 && in.good();) {
    in.read(buffer.data(), static_cast<std::streamsize>(std::min<uint64_t>(left, buffer.size())));
    out.write(buffer.data(), in.gcount());
    left -= static_cast<uint64_t>(in.gcount());
    if (in.gcount() == 0) break;
  }
}

class BashOutputTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "BashOutput"; }

  json schema() const override {
    return function_schema(
        name(),
        "Returns the output a background shell (started by Bash with run_in_background) "
        "wrote since the last BashOutput call for it, after a status line: running, exited "
        "with code N, or killed. With `filter`, a regular expression (Perl-compatible, as grep "
        "-P), only matching lines are shown; the other lines are consumed and will not be "
        "shown again.",
        {{"bash_id", {{"type", "string"}, {"description", "The shell_id Bash returned"}}},
         {"filter",
          {{"type", "string"},
           {"description", "Optional regular expression: show only the lines that match"}}}},
        {"bash_id"});
  }

 protected:
  ToolResult execute(const json& args) override {
    BackgroundShells& shells = *context_.shells;
    const std::string id = string_arg(args, "bash_id");
    // Status first: once a shell has ended, everything it wrote is already in the file.
    const ShellStatus status = shells.status(id);
    const fs::path& path = shells.output_path(id);
    const uint64_t offset = shells.read_offset(id);
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    CA_CHECK(!ec, "cannot read the output of {}: {}", id, ec.message());
    const size_t limit = context_.options.max_output_chars > 400
                             ? context_.options.max_output_chars - 200
                             : context_.options.max_output_chars;

    std::string text;
    uint64_t consumed = std::max(size, offset);
    if (!has_arg(args, "filter")) {
      text = read_range(path, offset, size, limit);
    } else {
      // grep runs even on nothing new, so that a bad filter is reported at once.
      if (status.state == ShellStatus::State::kRunning && size > offset) {
        consumed = complete_lines_end(path, offset, size);
      }
      const fs::path chunk = context_.scratch / "filter.in";
      copy_range(path, offset, consumed, chunk);
      const GrepRun run = run_grep({"-a", "-e", string_arg(args, "filter"), chunk.string()},
                                   context_.scratch, context_.scratch, kFilterTimeoutS, limit);
      fs::remove(chunk, ec);
      if (run.timed_out) {
        return tool_error(fmt::format("the filter took longer than {:g} s; simplify the "
                                      "regular expression", kFilterTimeoutS));
      }
      if (run.exit_code == 2 || run.exit_code < 0) {
        return tool_error(fmt::format("invalid filter '{}': {}", string_arg(args, "filter"),
                                      run.err.empty() ? "grep failed" : run.err));
      }
      text = run.out;
      if (run.out_capped) text += "[... more matching lines truncated ...]\n";
    }
    shells.set_read_offset(id, std::max(offset, consumed));

    ToolResult result;
    result.output = fmt::format("status: {}\n{}", status.describe(),
                                text.empty() ? "(no new output)" : text);
    result.data = status_data(id, status);
    return result;
  }
};

class KillBashTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "KillBash"; }

  json schema() const override {
    return function_schema(
        name(),
        "Stops a background shell started by Bash with run_in_background, with every process "
        "it started (SIGTERM, then SIGKILL after 1 s). Its remaining output stays readable "
        "with BashOutput.",
        {{"shell_id", {{"type", "string"}, {"description", "The shell_id Bash returned"}}}},
        {"shell_id"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const std::string id = string_arg(args, "shell_id");
    bool was_running = false;
    const ShellStatus status = context_.shells->kill(id, &was_running);
    ToolResult result;
    result.output = was_running
                        ? fmt::format("Stopped background shell {}.", id)
                        : fmt::format("Background shell {} had already ended ({}); whatever it "
                                      "left running was stopped.", id, status.describe());
    result.data = status_data(id, status);
    result.data["was_running"] = was_running;
    return result;
  }
};

}  // namespace

std::unique_ptr<Tool> make_bash_tool(ToolContext& context) {
  return std::make_unique<BashTool>(context);
}
std::unique_ptr<Tool> make_bash_output_tool(ToolContext& context) {
  return std::make_unique<BashOutputTool>(context);
}
std::unique_ptr<Tool> make_kill_bash_tool(ToolContext& context) {
  return std::make_unique<KillBashTool>(context);
}

}  // namespace cuda_agent::agent
