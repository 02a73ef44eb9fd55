// GNU grep as the regex engine of Grep and BashOutput's filter. A child process with a time
// limit, rather than std::regex in the loop's thread: libstdc++'s std::regex recurses per
// character and overflows the stack on lines of ~100k characters, and a backtracking pattern
// could hang the loop with no way to stop it.
#include <system_error>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "tool_support.h"

namespace cuda_agent::agent {

namespace fs = std::filesystem;

const char* grep_syntax_flag() {
  static const char* const flag = [] {
    SubprocessOptions options;
    options.argv = {"grep", "-P", "-q", "-e", "x", "/dev/null"};
    options.timeout_s = 10;
    try {
      // Exit 1: no match, so -P works; exit 2: "grep: support for the -P option is not
      // compiled into this --disable-perl-regexp binary".
      return run_subprocess(options).exit_code == 1 ? "-P" : "-E";
    } catch (const std::exception&) {
      return "-E";
    }
  }();
  return flag;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

GrepRun run_grep(const std::vector<std::string>& args, const fs::path& cwd, const fs::path& scratch, double timeout_s,
                 size_t max_out_bytes, const ToolContext* confined_as) {
  SubprocessOptions options;
  options.argv = {"grep", grep_syntax_flag()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  if (confined_as != nullptr) {
    std::string command = "LC_ALL=C exec";
    for (const std::string& arg : options.argv) command += " " + shell_quote(arg);
    options.argv = shell_argv(*confined_as, command);
  }
  options.env_set = {{"LC_ALL", "C"}};
  options.cwd = cwd.string();
  options.stdout_path = (scratch / "grep.out").string();
  options.stderr_path = (scratch / "grep.err").string();
  options.timeout_s = timeout_s;
  options.kill_grace_s = 0.5;
  const SubprocessResult result = run_subprocess(options);

  GrepRun run;
  run.exit_code = result.term_signal == 0 ? result.exit_code : -1;
  run.timed_out = result.timed_out;
  std::error_code ec;
  const uint64_t size = fs::file_size(options.stdout_path, ec);
  run.out_capped = !ec && size > max_out_bytes;
  if (!ec && size > 0) {
    // Whole lines only: the tools split the output into lines.
    run.out = read_range(options.stdout_path, 0, run.out_capped ? max_out_bytes : size,
                         max_out_bytes + 1);
    if (run.out_capped) {
      const size_t last_newline = run.out.rfind('\n');
      run.out.resize(last_newline == std::string::npos ? 0 : last_newline + 1);
    }
  }
  run.err = read_range(options.stderr_path, 0, 0, 4000);
  fs::remove(options.stdout_path, ec);
  fs::remove(options.stderr_path, ec);
  return run;
}

}  // namespace cuda_agent::agent
