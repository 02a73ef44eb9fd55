// The agent's workspace and its ten tools, driven through ToolRegistry::call as the loop does.
#include "cuda_agent/agent/tool_registry.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/agent/workspace.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "test_util.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kTask =
    "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
    "        return x * 2\n";

unsigned mode_of(const fs::path& path) {
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// True when `pid` no longer runs (gone, or a zombie); waits up to 3 s.
bool process_gone(pid_t pid) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
  while (Clock::now() < deadline) {
    std::ifstream stat(stat_path);
    std::string line;
    if (!stat || !std::getline(stat, line)) return true;
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() &&
        (line[paren + 2] == 'Z' || line[paren + 2] == 'X')) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Waits up to 5 s for `path` to hold a pid (written by a background command).
pid_t wait_for_pid(const fs::path& path) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);  // a confined shell's start, loaded
  while (Clock::now() < deadline) {
    std::error_code ec;
    if (fs::file_size(path, ec) > 0 && !ec) {
      const std::string text = read_file(path);
      if (text.find('\n') != std::string::npos) return std::atoi(text.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "no pid in " << path;
  return -1;
}

class AgentTools : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(base_.path() / "task");
    fs::create_directories(base_.path() / "outside");
    write_file_atomic(base_.path() / "task" / "model.py", kTask);
    write_file_atomic(base_.path() / "task" / "meta.json", "{\"level\": 1}\n");
    write_file_atomic(base_.path() / "outside" / "secret.py", "SECRET = 1\n");
    WorkspaceOptions options;
    options.root = base_.path() / "ws";
    options.task_file = base_.path() / "task" / "model.py";
    options.extra_task_files = {base_.path() / "task" / "meta.json"};
    options.verify_command = "echo verify-ran";
    options.profile_command = "echo profile-ran";
    options.kernels_dir = true;
    options.initial_solution = "class ModelNew:\n    pass\n";
    workspace_ = std::make_unique<Workspace>(Workspace::create(options));
    registry_ = std::make_unique<ToolRegistry>(*workspace_, tool_options_,
                                               std::map<std::string, std::string>{
                                                   {"CA_TOOL_TEST_VAR", "given"}});
  }

  ToolResult call(const std::string& name, const json& args) {
    ToolResult result;
    EXPECT_NO_THROW(result = registry_->call(name, args)) << name << " " << args.dump();
    return result;
  }
  fs::path root() const { return workspace_->root(); }
  fs::path outside() const { return base_.path() / "outside"; }
  void write(const std::string& relative, const std::string& content) {
    write_file_atomic(root() / relative, content);
  }
  std::string read(const std::string& relative) { return read_file(root() / relative); }

  TempDir base_{"ca-agent-tools-"};
  ToolOptions tool_options_;
  std::unique_ptr<Workspace> workspace_;
  std::unique_ptr<ToolRegistry> registry_;
};

// --- workspace -------------------------------------------------------------------------------

TEST_F(AgentTools, WorkspaceLayoutAndModes) {
  EXPECT_EQ(read("model.py"), kTask);
  EXPECT_EQ(mode_of(root() / "model.py"), 0444u);
  EXPECT_EQ(mode_of(root() / "meta.json"), 0444u);
  EXPECT_EQ(mode_of(root() / "model_new.py"), 0644u);
  EXPECT_EQ(mode_of(root() / "verify.sh"), 0555u);
  EXPECT_EQ(mode_of(root() / "profile.sh"), 0555u);
  EXPECT_EQ(mode_of(root() / "README.md"), 0444u);
  EXPECT_TRUE(fs::is_directory(root() / "kernels"));
  EXPECT_NE(read("verify.sh").find("exec echo verify-ran \"$@\""), std::string::npos);
  EXPECT_NE(read("README.md").find("model_new.py"), std::string::npos);
  EXPECT_EQ(workspace_->read_solution(), "class ModelNew:\n    pass\n");
  EXPECT_TRUE(workspace_->is_locked(root() / "model.py"));
  EXPECT_TRUE(workspace_->is_locked(root() / "verify.sh"));
  EXPECT_TRUE(workspace_->is_locked(root() / "meta.json"));
  EXPECT_TRUE(workspace_->is_locked(root() / "README.md"));
  EXPECT_FALSE(workspace_->is_locked(root() / "model_new.py"));
  fs::create_symlink(root() / "model.py", root() / "alias.py");
  EXPECT_TRUE(workspace_->is_locked(root() / "alias.py"));
}

TEST_F(AgentTools, WorkspaceCreateRefusesBadInput) {
  WorkspaceOptions options;
  options.root = root();  // not empty
  options.task_file = base_.path() / "task" / "model.py";
  EXPECT_NE(testing::error_message([&] { Workspace::create(options); }).find("not empty"),
            std::string::npos);
  options.root = base_.path() / "ws2";
  options.task_file = base_.path() / "missing.py";
  EXPECT_NE(testing::error_message([&] { Workspace::create(options); }).find("missing.py"),
            std::string::npos);
  options.task_file = base_.path() / "task" / "model.py";
  options.extra_task_files = {base_.path() / "task" / "model.py"};
  EXPECT_NE(testing::error_message([&] { Workspace::create(options); }).find("model.py"),
            std::string::npos);
}

TEST_F(AgentTools, ResolveConfinesPaths) {
  EXPECT_EQ(workspace_->resolve("model_new.py"), root() / "model_new.py");
  EXPECT_EQ(workspace_->resolve((root() / "kernels/a.cu").string()), root() / "kernels/a.cu");
  EXPECT_EQ(workspace_->resolve("kernels/../new/x.py"), root() / "new/x.py");
  EXPECT_EQ(workspace_->resolve("."), root());
  fs::create_directory_symlink(outside(), root() / "link_out");
  for (const std::string bad : {"../x", "/etc/passwd", "nope/../../x", "link_out/secret.py",
                                "link_out"}) {
    const std::string message = testing::error_message([&] { workspace_->resolve(bad); });
    EXPECT_NE(message.find("path escapes the workspace"), std::string::npos) << bad;
  }
}

TEST_F(AgentTools, ScriptsRunTheirCommandsFromTheRoot) {
  const ToolResult result = call("Bash", {{"command", "cd kernels && ../verify.sh --x 1"}});
  EXPECT_TRUE(result.ok) << result.output;
  EXPECT_EQ(result.output, "verify-ran --x 1\n");
  EXPECT_EQ(call("Bash", {{"command", "./profile.sh"}}).output, "profile-ran\n");
}

TEST_F(AgentTools, FileModesStopShellWritesToTheTask) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: file modes do not bind root";
  const ToolResult r = call("Bash", {{"command", "echo hacked > model.py"}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("Permission denied"), std::string::npos) << r.output;
  EXPECT_EQ(read("model.py"), kTask);
}

// --- registry --------------------------------------------------------------------------------

TEST_F(AgentTools, SchemasListTenTools) {
  const json schemas = registry_->schemas();
  ASSERT_TRUE(schemas.is_array());
  ASSERT_EQ(schemas.size(), 10u);
  const std::vector<std::string> expected = {"Bash", "BashOutput", "KillBash", "Read", "Write",
                                             "Edit", "MultiEdit", "Glob", "Grep",
                                             "NotebookEdit"};
  EXPECT_EQ(registry_->names(), expected);
  for (size_t i = 0; i < schemas.size(); ++i) {
    const json& schema = schemas[i];
    EXPECT_EQ(schema["type"], "function");
    EXPECT_EQ(schema["function"]["name"], expected[i]);
    EXPECT_FALSE(schema["function"]["description"].get<std::string>().empty());
    EXPECT_EQ(schema["function"]["parameters"]["type"], "object");
    EXPECT_TRUE(schema["function"]["parameters"]["properties"].is_object());
    EXPECT_TRUE(schema["function"]["parameters"]["required"].is_array());
  }
}

TEST_F(AgentTools, CallRejectsBadCallsWithMessages) {
  ToolResult r = call("Frobnicate", json::object());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("unknown tool 'Frobnicate'"), std::string::npos);
  EXPECT_NE(r.output.find("Bash"), std::string::npos);

  r = call("Read", json::object());
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.output, "Read: missing required argument 'file_path' (string)");

  r = call("Read", {{"file_path", 3}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.output, "Read: argument 'file_path' must be a string, got integer 3");

  r = call("Read", {{"file_path", "model.py"}, {"offset", "ten"}});
  EXPECT_NE(r.output.find("'offset' must be an integer"), std::string::npos) << r.output;

  r = call("Bash", {{"command", "true"}, {"run_in_background", "yes"}});
  EXPECT_NE(r.output.find("Bash: argument 'run_in_background' must be a boolean"),
            std::string::npos) << r.output;

  r = call("Grep", {{"pattern", "x"}, {"output_mode", "lines"}});
  EXPECT_NE(r.output.find("'output_mode' must be one of"), std::string::npos) << r.output;

  r = call("MultiEdit", {{"file_path", "model_new.py"}, {"edits", {{{"new_string", "x"}}}}});
  EXPECT_EQ(r.output, "MultiEdit: missing required argument 'edits[0].old_string' (string)");

  r = call("Read", {{"path", "model.py"}});
  EXPECT_NE(r.output.find("unknown argument 'path'"), std::string::npos) << r.output;

  r = call("Read", json::array({1}));
  EXPECT_NE(r.output.find("must be a JSON object"), std::string::npos);

  // Nulls count as absent; integral floats are integers.
  r = call("Read", {{"file_path", "model.py"}, {"offset", nullptr}, {"limit", 2.0}});
  EXPECT_TRUE(r.ok) << r.output;
}

TEST_F(AgentTools, NothingThrowsOutOfCall) {
  write("notebook.ipynb", "{not json");
  const std::vector<std::pair<std::string, json>> calls = {
      {"Read", {{"file_path", "kernels"}}},
      {"Read", {{"file_path", ""}}},
      {"Read", {{"file_path", "missing.py"}}},
      {"Read", {{"file_path", "model.py"}, {"offset", 1e300}}},
      {"Write", {{"file_path", "kernels"}, {"content", "x"}}},
      {"Edit", {{"file_path", "missing.py"}, {"old_string", "a"}, {"new_string", "b"}}},
      {"NotebookEdit", {{"notebook_path", "notebook.ipynb"}, {"new_source", "x"}}},
      {"Glob", {{"pattern", "[unclosed"}}},
      {"Grep", {{"pattern", "("}}},
      {"BashOutput", {{"bash_id", "bash_99"}}},
      {"KillBash", {{"shell_id", "nope"}}},
      {"Bash", {{"command", "   "}}},
      {"Bash", {{"command", "true"}, {"timeout", -5}}},
  };
  for (const auto& [name, args] : calls) {
    const ToolResult r = call(name, args);
    if (name != "Glob") {
      EXPECT_FALSE(r.ok) << name << " " << args.dump() << ": " << r.output;
    }
    EXPECT_EQ(r.output.rfind(name + ":", 0), name == "Glob" ? std::string::npos : 0u)
        << r.output;
  }
}

TEST_F(AgentTools, PathEscapesAreRefusedByEveryFileTool) {
  fs::create_directory_symlink(outside(), root() / "link_out");
  fs::create_symlink(outside() / "secret.py", root() / "secret_link.py");
  const std::vector<std::string> escapes = {"../outside/secret.py",
                                            (outside() / "secret.py").string(), "/etc/passwd",
                                            "link_out/secret.py", "secret_link.py"};
  for (const std::string& bad : escapes) {
    const std::vector<std::pair<std::string, json>> calls = {
        {"Read", {{"file_path", bad}}},
        {"Write", {{"file_path", bad}, {"content", "x"}}},
        {"Edit", {{"file_path", bad}, {"old_string", "SECRET"}, {"new_string", "X"}}},
        {"MultiEdit",
         {{"file_path", bad}, {"edits", {{{"old_string", "SECRET"}, {"new_string", "X"}}}}}},
        {"Glob", {{"pattern", "*"}, {"path", bad}}},
        {"Grep", {{"pattern", "SECRET"}, {"path", bad}}},
        {"NotebookEdit", {{"notebook_path", bad}, {"new_source", "x"}, {"cell_number", 0}}},
    };
    for (const auto& [name, args] : calls) {
      const ToolResult r = call(name, args);
      EXPECT_FALSE(r.ok) << name << " " << bad;
      EXPECT_NE(r.output.find("path escapes the workspace"), std::string::npos)
          << name << ": " << r.output;
    }
  }
  EXPECT_EQ(read_file(outside() / "secret.py"), "SECRET = 1\n");
  EXPECT_FALSE(fs::exists(base_.path() / "x"));
  // Glob patterns cannot leave either, and listings do not follow links out.
  EXPECT_FALSE(call("Glob", {{"pattern", "../outside/*"}}).ok);
  EXPECT_FALSE(call("Glob", {{"pattern", (outside() / "*").string()}}).ok);
  const ToolResult glob = call("Glob", {{"pattern", "**/*.py"}});
  EXPECT_EQ(glob.output.find("link_out"), std::string::npos) << glob.output;
  EXPECT_EQ(glob.output.find("secret_link"), std::string::npos) << glob.output;
  const ToolResult grep = call("Grep", {{"pattern", "SECRET"}});
  EXPECT_EQ(grep.output, "No matches found");
}

// The file tools check a path by name (resolve) and then use it: a background shell can swap a
// folder on the way for a symlink to outside in between (a race a policy can win by retrying).
// What they read and write goes through read_inside / write_inside, which walk from the root
// without following a link: the swap makes the call fail instead of reading the answer or
// planting a file outside. Played here without the race: the swap between resolve and the use.
TEST_F(AgentTools, AFolderSwappedForALinkAfterTheCheckIsNotFollowed) {
  fs::create_directories(root() / "d");
  write("d/model_new.py", "mine\n");
  const fs::path resolved = workspace_->resolve("d/model_new.py");
  EXPECT_EQ(workspace_->read_inside(resolved, 1 << 20), "mine\n");
  fs::rename(root() / "d", root() / "d_real");
  write_file_atomic(outside() / "model_new.py", "ANSWER\n");
  fs::create_directory_symlink(outside(), root() / "d");
  EXPECT_THROW(workspace_->read_inside(resolved, 1 << 20), Error);
  EXPECT_THROW(workspace_->write_inside(resolved, "planted\n"), Error);
  EXPECT_EQ(read_file(outside() / "model_new.py"), "ANSWER\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(outside()), fs::directory_iterator()), 2);  // no temporary
  // The file itself swapped for a link: not read through; a write replaces the link, not its target.
  fs::remove(root() / "d");
  fs::rename(root() / "d_real", root() / "d");
  fs::remove(root() / "d" / "model_new.py");
  fs::create_symlink(outside() / "secret.py", root() / "d" / "model_new.py");
  EXPECT_THROW(workspace_->read_inside(resolved, 1 << 20), Error);
  workspace_->write_inside(resolved, "mine again\n");
  EXPECT_EQ(read_file(outside() / "secret.py"), "SECRET = 1\n");
  EXPECT_FALSE(fs::is_symlink(root() / "d" / "model_new.py"));
  EXPECT_EQ(read("d/model_new.py"), "mine again\n");
  // Missing folders are made; a file's mode is kept; too large a file is refused.
  workspace_->write_inside(workspace_->resolve("new/deeper/f.txt"), "x");
  EXPECT_EQ(read("new/deeper/f.txt"), "x");
  fs::permissions(root() / "d" / "model_new.py", fs::perms::owner_read | fs::perms::owner_write);
  workspace_->write_inside(resolved, "third\n");
  EXPECT_EQ(fs::status(root() / "d" / "model_new.py").permissions(), fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_THROW(workspace_->read_inside(resolved, 3), Error);
  // A link that stays inside the workspace is resolved first, and read as before.
  fs::create_symlink(root() / "d" / "model_new.py", root() / "alias.py");
  const ToolResult alias = call("Read", {{"file_path", "alias.py"}});
  EXPECT_TRUE(alias.ok) << alias.output;
  EXPECT_NE(alias.output.find("third"), std::string::npos) << alias.output;
}

// --- Bash ------------------------------------------------------------------------------------

TEST_F(AgentTools, BashForegroundOutputExitCodeAndEnvironment) {
  ToolResult r = call("Bash", {{"command", "echo out; echo err >&2; exit 3"}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.output, "out\nerr\nexit code: 3");
  EXPECT_EQ(r.data["exit_code"], 3);

  ::setenv("CA_TOOL_TEST_PARENT", "leak", 1);
  r = call("Bash", {{"command", "pwd; echo $HOME; echo ${CA_TOOL_TEST_VAR}; "
                                "echo [${CA_TOOL_TEST_PARENT}]"},
                    {"description", "where am I"}});
  ::unsetenv("CA_TOOL_TEST_PARENT");
  EXPECT_TRUE(r.ok);
  const std::string root_text = root().string();
  EXPECT_EQ(r.output, root_text + "\n" + root_text + "\ngiven\n[]\n");
  EXPECT_EQ(call("Bash", {{"command", "true"}}).output, "(no output)");
}

TEST_F(AgentTools, BashTimeoutStopsTheCommand) {
  const auto start = Clock::now();
  const ToolResult r = call("Bash", {{"command", "sleep 60"}, {"timeout", 500}});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 20.0);  // well before the command's own end (its confinement starts first)
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("timed out after 0.5 s"), std::string::npos) << r.output;
  EXPECT_EQ(r.data["timed_out"], true);
}

// Bash with `gpu_wait_s`: a command whose process is named as a judge waiting for the GPU's lock
// (sandbox::kGpuWaitName) runs past its timeout by that wait, up to gpu_wait_s; the call's data
// says how long it waited, and a timeout past the bound says what was not counted.
void expect_gpu_waits_do_not_count(std::unique_ptr<ToolRegistry>& registry, Workspace& workspace, ToolOptions options) {
  const json command = {{"command", std::string("cp \"$(command -v sleep)\" ./") + cuda_agent::sandbox::kGpuWaitName +
                                        " && ./" + cuda_agent::sandbox::kGpuWaitName + " 6 && echo slept"},
                        {"timeout", 3000}};  // room for the confinement's start, which counts
  options.gpu_wait_s = 30;
  registry = std::make_unique<ToolRegistry>(workspace, options, std::map<std::string, std::string>{});
  const ToolResult waited = registry->call("Bash", command);
  EXPECT_TRUE(waited.ok) << waited.output;
  EXPECT_NE(waited.output.find("slept"), std::string::npos) << waited.output;
  EXPECT_GE(waited.data["gpu_wait_s"].get<double>(), 3.0) << waited.data.dump();
  options.gpu_wait_s = 1;
  registry = std::make_unique<ToolRegistry>(workspace, options, std::map<std::string, std::string>{});
  const ToolResult bounded = registry->call("Bash", command);
  EXPECT_FALSE(bounded.ok) << bounded.output;
  EXPECT_NE(bounded.output.find("timed out after 3 s (not counting 1 s of waiting for the GPU"), std::string::npos)
      << bounded.output;
  options.gpu_wait_s = 0;  // outside episodes that take the GPU's lock, every second counts
  registry = std::make_unique<ToolRegistry>(workspace, options, std::map<std::string, std::string>{});
  const ToolResult counted = registry->call("Bash", command);
  EXPECT_NE(counted.output.find("timed out after 3 s;"), std::string::npos) << counted.output;
  EXPECT_EQ(counted.data["gpu_wait_s"].get<double>(), 0.0);
}

TEST_F(AgentTools, WaitsForTheGpuLockDoNotCountAgainstTheTimeout) {
  expect_gpu_waits_do_not_count(registry_, *workspace_, tool_options_);
}

// A background shell that keeps a lock file of ToolOptions::lock_hold_limits past its limit (the
// GPU's quiet lock, which every episode's generation waits for) is stopped at the next tool call,
// which says so; one within its limit runs on.
TEST_F(AgentTools, ABackgroundShellThatKeepsTheGpusLockIsStopped) {
  const fs::path quiet = outside() / "gpu0.quiet.lock", gpu = outside() / "gpu0.gpu.lock";
  write_file_atomic(quiet, "");
  write_file_atomic(gpu, "");
  ToolOptions options = tool_options_;
  options.lock_hold_limits = {{quiet.string(), 1.0}, {gpu.string(), 600.0}};
  registry_ = std::make_unique<ToolRegistry>(*workspace_, options, std::map<std::string, std::string>{});
  const ToolResult keeper =
      call("Bash", {{"command", "flock -x " + quiet.string() + " sleep 60"}, {"run_in_background", true}});
  const ToolResult within =
      call("Bash", {{"command", "flock -s " + gpu.string() + " sleep 60"}, {"run_in_background", true}});
  ASSERT_TRUE(keeper.ok && within.ok) << keeper.output << within.output;
  const std::string keeper_id = keeper.data["shell_id"], within_id = within.data["shell_id"];
  for (int i = 0; i < 100 && (lock_holders(quiet).empty() || lock_holders(gpu).empty()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE(lock_holders(quiet).empty()) << "the background flock never took the lock";
  EXPECT_EQ(call("Bash", {{"command", "true"}}).output, "(no output)") << "first seen: not yet past its limit";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const ToolResult next = call("Bash", {{"command", "echo next"}});
  EXPECT_NE(next.output.find("[background shell " + keeper_id + ": its process"), std::string::npos) << next.output;
  EXPECT_NE(next.output.find("it was stopped"), std::string::npos) << next.output;
  EXPECT_NE(next.output.find("next"), std::string::npos) << next.output;
  EXPECT_EQ(next.output.find(within_id), std::string::npos) << next.output;
  EXPECT_TRUE(lock_holders(quiet).empty()) << "the lock is free again";
  EXPECT_NE(call("BashOutput", {{"bash_id", keeper_id}}).output.find("status: killed"), std::string::npos);
  EXPECT_NE(call("BashOutput", {{"bash_id", within_id}}).output.find("status: running"), std::string::npos);
}

TEST_F(AgentTools, LongOutputIsTruncatedWithANotice) {
  tool_options_.max_output_chars = 1000;
  registry_ = std::make_unique<ToolRegistry>(*workspace_, tool_options_);
  const ToolResult r = call("Bash", {{"command", "seq 1 20000"}});
  EXPECT_TRUE(r.ok);
  EXPECT_LE(r.output.size(), 1000u);
  EXPECT_NE(r.output.find("characters truncated ...]"), std::string::npos);
  EXPECT_EQ(r.output.rfind("1\n2\n3\n", 0), 0u);
  EXPECT_EQ(r.output.substr(r.output.size() - 6), "20000\n");

  // Invalid UTF-8 from a command becomes U+FFFD, so the observation always serializes.
  const ToolResult bytes = call("Bash", {{"command", "printf 'a\\377b'"}});
  EXPECT_EQ(bytes.output, "a\xEF\xBF\xBD" "b");
  EXPECT_NO_THROW(json(bytes.output).dump());
}

TEST_F(AgentTools, BackgroundShellIncrementalOutputFilterAndKill) {
  ToolResult r = call("Bash", {{"command", "for i in 1 2 3 4; do echo line$i; sleep 0.15; done"},
                               {"run_in_background", true}});
  ASSERT_TRUE(r.ok) << r.output;
  EXPECT_EQ(r.data["shell_id"], "bash_1");
  std::string seen;
  int reads = 0;
  for (const auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
    r = call("BashOutput", {{"bash_id", "bash_1"}});
    ASSERT_TRUE(r.ok) << r.output;
    ++reads;
    const std::string body = r.output.substr(r.output.find('\n') + 1);
    if (body != "(no new output)") seen += body;
    if (r.data["status"] == "exited") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(seen, "line1\nline2\nline3\nline4\n");  // each line once, in order
  EXPECT_GT(reads, 2);
  EXPECT_EQ(r.output.rfind("status: exited with code 0\n", 0), 0u) << r.output;
  EXPECT_EQ(call("BashOutput", {{"bash_id", "bash_1"}}).output,
            "status: exited with code 0\n(no new output)");

  r = call("Bash", {{"command", "echo apple; echo banana; echo apricot; touch printed; sleep 30"},
                    {"run_in_background", true}});
  const std::string id = r.data["shell_id"];
  // The three lines are in the shell's output file once `printed` exists (a fixed sleep was too
  // short on a loaded machine).
  for (const auto deadline = Clock::now() + std::chrono::seconds(20);
       !fs::exists(root() / "printed") && Clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  r = call("BashOutput", {{"bash_id", id}, {"filter", "^ap"}});
  EXPECT_EQ(r.output, "status: running\napple\napricot\n");
  EXPECT_EQ(call("BashOutput", {{"bash_id", id}}).output, "status: running\n(no new output)");
  EXPECT_FALSE(call("BashOutput", {{"bash_id", id}, {"filter", "(unclosed"}}).ok);

  r = call("KillBash", {{"shell_id", id}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(r.data["was_running"], true);
  r = call("BashOutput", {{"bash_id", id}});
  EXPECT_EQ(r.data["status"], "killed");
}

TEST_F(AgentTools, KillBashStopsTheWholeGroup) {
  ToolResult r = call("Bash", {{"command", "sleep 30 & echo $! > child.pid; echo $$ > shell.pid; "
                                           "wait"},
                               {"run_in_background", true}});
  const pid_t shell = wait_for_pid(root() / "shell.pid");
  const pid_t child = wait_for_pid(root() / "child.pid");
  ASSERT_GT(shell, 0);
  ASSERT_GT(child, 0);
  r = call("KillBash", {{"shell_id", "bash_1"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_TRUE(process_gone(shell));
  EXPECT_TRUE(process_gone(child));
  r = call("KillBash", {{"shell_id", "bash_1"}});
  EXPECT_EQ(r.data["was_running"], false);
}

TEST_F(AgentTools, RegistryDestructorKillsBackgroundShells) {
  call("Bash", {{"command", "echo $$ > bg.pid; exec sleep 30"}, {"run_in_background", true}});
  const pid_t pid = wait_for_pid(root() / "bg.pid");
  ASSERT_GT(pid, 0);
  registry_.reset();
  EXPECT_TRUE(process_gone(pid));
}

// --- Read and Write ----------------------------------------------------------------------------

TEST_F(AgentTools, ReadNumbersLinesWithOffsetAndLimit) {
  write("five.txt", "a\nb\nc\nd\ne\n");
  ToolResult r = call("Read", {{"file_path", "five.txt"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.output, "     1\ta\n     2\tb\n     3\tc\n     4\td\n     5\te\n");
  r = call("Read", {{"file_path", (root() / "five.txt").string()}, {"offset", 2}, {"limit", 2}});
  EXPECT_EQ(r.output, "     2\tb\n     3\tc\n\n(showing lines 2-3 of 5; read on with offset=4)");
  r = call("Read", {{"file_path", "five.txt"}, {"offset", 9}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("has 5 lines; offset 9 is past the end"), std::string::npos);

  write("empty.txt", "");
  r = call("Read", {{"file_path", "empty.txt"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.output, "empty.txt exists but is empty");
  write("blob.bin", std::string("ab\0cd", 5));
  r = call("Read", {{"file_path", "blob.bin"}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("binary"), std::string::npos);
  write("long.txt", std::string(5000, 'x') + "\n");
  r = call("Read", {{"file_path", "long.txt"}});
  EXPECT_NE(r.output.find(std::string(2000, 'x') + " [... line truncated"), std::string::npos);
  EXPECT_EQ(r.output.find(std::string(2001, 'x')), std::string::npos);
}

TEST_F(AgentTools, WriteCreatesFilesAndRefusesLockedOnes) {
  ToolResult r = call("Write", {{"file_path", "kernels/deep/a.cu"}, {"content", "k1\nk2\n"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(read("kernels/deep/a.cu"), "k1\nk2\n");
  EXPECT_EQ(r.data["created"], true);
  r = call("Write", {{"file_path", "model_new.py"}, {"content", "new"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(workspace_->read_solution(), "new");
  EXPECT_EQ(mode_of(root() / "model_new.py"), 0644u);

  r = call("Write", {{"file_path", "model.py"}, {"content", "hacked"}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.output, "Write: model.py is read-only: the task cannot be changed; write your "
                      "solution in model_new.py");
  fs::create_symlink("model.py", root() / "alias.py");
  EXPECT_FALSE(call("Write", {{"file_path", "alias.py"}, {"content", "hacked"}}).ok);
  EXPECT_FALSE(call("Write", {{"file_path", "./verify.sh"}, {"content", "exit 0"}}).ok);
  EXPECT_FALSE(call("Edit", {{"file_path", "meta.json"}, {"old_string", "1"},
                             {"new_string", "2"}}).ok);
  EXPECT_EQ(read("model.py"), kTask);
  EXPECT_NE(read("verify.sh").find("verify-ran"), std::string::npos);
}

// --- Edit and MultiEdit ------------------------------------------------------------------------

TEST_F(AgentTools, EditNeedsAUniqueMatchUnlessReplaceAll) {
  write("e.py", "x = 1\ny = 1\nz = 2\n");
  ToolResult r = call("Edit", {{"file_path", "e.py"}, {"old_string", "= 1"},
                               {"new_string", "= 5"}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("occurs 2 times"), std::string::npos) << r.output;
  EXPECT_EQ(read("e.py"), "x = 1\ny = 1\nz = 2\n");

  r = call("Edit", {{"file_path", "e.py"}, {"old_string", "z = 2"}, {"new_string", "z = 3"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(r.data["replacements"], 1);
  EXPECT_NE(r.output.find("     3\tz = 3"), std::string::npos) << r.output;

  r = call("Edit", {{"file_path", "e.py"}, {"old_string", " = "}, {"new_string", "="},
                    {"replace_all", true}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.data["replacements"], 3);
  EXPECT_EQ(read("e.py"), "x=1\ny=1\nz=3\n");

  r = call("Edit", {{"file_path", "e.py"}, {"old_string", "nope"}, {"new_string", "x"}});
  EXPECT_NE(r.output.find("was not found"), std::string::npos);
  r = call("Edit", {{"file_path", "e.py"}, {"old_string", "x=1"}, {"new_string", "x=1"}});
  EXPECT_NE(r.output.find("are the same"), std::string::npos);
}

TEST_F(AgentTools, MultiEditIsAllOrNothing) {
  write("m.py", "alpha\nbeta\n");
  ToolResult r = call("MultiEdit", {{"file_path", "m.py"},
                                    {"edits", {{{"old_string", "alpha"}, {"new_string", "gamma"}},
                                               {{"old_string", "missing"}, {"new_string", "x"}}}}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("edit 2 of 2 failed"), std::string::npos) << r.output;
  EXPECT_EQ(read("m.py"), "alpha\nbeta\n");

  // Later edits see the result of earlier ones.
  r = call("MultiEdit", {{"file_path", "m.py"},
                         {"edits", {{{"old_string", "alpha"}, {"new_string", "gamma"}},
                                    {{"old_string", "gamma\nbeta"}, {"new_string", "delta"}}}}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(read("m.py"), "delta\n");
  EXPECT_EQ(r.data["replacements"], json::array({1, 1}));
}

// --- Glob and Grep -----------------------------------------------------------------------------

TEST_F(AgentTools, GlobMatchesNewestFirst) {
  write("kernels/a.cu", "");
  write("kernels/b.cuh", "");
  write("kernels/sub/c.cu", "");
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(root() / "kernels/a.cu", now - std::chrono::hours(2));
  fs::last_write_time(root() / "kernels/b.cuh", now - std::chrono::hours(1));
  fs::last_write_time(root() / "kernels/sub/c.cu", now);

  ToolResult r = call("Glob", {{"pattern", "**/*.{cu,cuh}"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.output, "kernels/sub/c.cu\nkernels/b.cuh\nkernels/a.cu\n");
  r = call("Glob", {{"pattern", "*.cu"}, {"path", "kernels"}});
  EXPECT_EQ(r.output, "kernels/a.cu\n");
  r = call("Glob", {{"pattern", "*.py"}});
  EXPECT_NE(r.output.find("model_new.py"), std::string::npos);
  EXPECT_EQ(r.output.find("kernels"), std::string::npos);
  r = call("Glob", {{"pattern", "**/*.rs"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.output.rfind("No files found", 0), 0u);
}

TEST_F(AgentTools, GrepModesContextAndFilters) {
  write("kernels/k.cu", "one\ntwo\n__global__ void add()\nthree\nfour\n");
  write("kernels/notes.txt", "__global__ in text\n");
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(root() / "kernels/k.cu", now);
  fs::last_write_time(root() / "kernels/notes.txt", now - std::chrono::hours(1));

  ToolResult r = call("Grep", {{"pattern", "__global__"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(r.output, "Found 2 files\nkernels/k.cu\nkernels/notes.txt\n");

  r = call("Grep", {{"pattern", "void \\w+\\(\\)"}, {"output_mode", "content"}, {"-C", 1}});
  EXPECT_EQ(r.output, "kernels/k.cu-2-two\nkernels/k.cu:3:__global__ void add()\n"
                      "kernels/k.cu-4-three\n");

  r = call("Grep", {{"pattern", "GLOBAL"}, {"-i", true}, {"glob", "*.cu"},
                    {"output_mode", "content"}, {"-n", false}});
  EXPECT_EQ(r.output, "kernels/k.cu:__global__ void add()\n");

  r = call("Grep", {{"pattern", "o"}, {"output_mode", "count"}, {"path", "kernels"}});
  EXPECT_EQ(r.output, "Found 5 matching lines in 2 files\nkernels/k.cu:4\nkernels/notes.txt:1\n");

  r = call("Grep", {{"pattern", "__global__"}, {"head_limit", 1}});
  EXPECT_NE(r.output.find("kernels/k.cu\n(showing the first 1 of 2"), std::string::npos)
      << r.output;

  r = call("Grep", {{"pattern", "nothing-here"}});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.output, "No matches found");
  r = call("Grep", {{"pattern", "a(b"}});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.output.find("invalid pattern"), std::string::npos);
}

// --- NotebookEdit ------------------------------------------------------------------------------

TEST_F(AgentTools, NotebookEditReplaceInsertDelete) {
  const json notebook = {
      {"nbformat", 4}, {"nbformat_minor", 5}, {"metadata", json::object()},
      {"cells",
       {{{"id", "a1"}, {"cell_type", "markdown"}, {"metadata", json::object()},
         {"source", {"# Title\n"}}},
        {{"id", "b2"}, {"cell_type", "code"}, {"metadata", json::object()},
         {"execution_count", 3}, {"outputs", {{{"output_type", "stream"}}}},
         {"source", {"x = 1\n", "print(x)"}}}}}};
  write("nb.ipynb", notebook.dump(1));
  const auto cells = [&] { return json::parse(read("nb.ipynb"))["cells"]; };

  ToolResult r = call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_id", "b2"},
                                       {"new_source", "y = 2\nprint(y)"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_EQ(cells()[1]["source"], json({"y = 2\n", "print(y)"}));
  EXPECT_EQ(cells()[1]["outputs"], json::array());
  EXPECT_TRUE(cells()[1]["execution_count"].is_null());

  r = call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_id", "a1"},
                            {"edit_mode", "insert"}, {"cell_type", "code"},
                            {"new_source", "import torch"}});
  EXPECT_TRUE(r.ok) << r.output;
  ASSERT_EQ(cells().size(), 3u);
  EXPECT_EQ(cells()[1]["source"], json({"import torch"}));
  EXPECT_EQ(cells()[1]["cell_type"], "code");
  EXPECT_TRUE(cells()[1].contains("id"));

  r = call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_number", 0},
                            {"edit_mode", "insert"}, {"cell_type", "markdown"},
                            {"new_source", "intro"}});
  EXPECT_EQ(cells()[0]["source"], json({"intro"}));
  EXPECT_FALSE(cells()[0].contains("outputs"));

  r = call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_number", 0},
                            {"edit_mode", "delete"}});
  EXPECT_TRUE(r.ok) << r.output;
  ASSERT_EQ(cells().size(), 3u);
  EXPECT_EQ(cells()[0]["id"], "a1");

  EXPECT_FALSE(call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_id", "zz"},
                                     {"new_source", "x"}}).ok);
  EXPECT_FALSE(call("NotebookEdit", {{"notebook_path", "nb.ipynb"}, {"cell_number", 7},
                                     {"new_source", "x"}}).ok);
  EXPECT_FALSE(call("NotebookEdit", {{"notebook_path", "model_new.py"}, {"cell_number", 0},
                                     {"new_source", "x"}}).ok);
}


// --- confinement -----------------------------------------------------------------------------

// Bash confined, under bubblewrap and under the binary's own namespaces (`confined-exec`): the
// workspace is writable, locked task files are not (even for root), nothing outside the
// workspace is, and there is no network.
class AgentConfinement : public AgentTools, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    tool_options_.confine = GetParam();
    tool_options_.writable_paths = {(outside() / "gpu0.lock").string()};  // as a GPU lock file is given
    tool_options_.tmpfs_bytes = 2 << 20;
    tool_options_.max_file_bytes = 2 << 20;
    tool_options_.max_disk_bytes = 16 << 20;
    if (GetParam() == "namespaces") setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);  // confined-exec's binary
    const std::string probe = GetParam() == "bwrap" ? "bwrap --ro-bind / / --unshare-net --die-with-parent true"
                                                    : std::string(CUDA_AGENT_BINARY) + " confined-exec true";
    if (std::system((probe + " > /dev/null 2>&1").c_str()) != 0)
      GTEST_SKIP() << GetParam() << " confinement cannot run on this machine (" << probe << " fails)";
    AgentTools::SetUp();
  }
};

TEST_P(AgentConfinement, BashRunsConfined) {
  // A listener on the host's loopback that the confined shell must not reach.
  const testing::LoopbackListener listener = testing::listen_on_loopback();
  ASSERT_GE(listener.fd.get(), 0);
  const int port = listener.port;
  auto bash = [&](const std::string& command) { return call("Bash", {{"command", command}}).output; };

  EXPECT_NE(bash("echo ok > scratch.txt && cat scratch.txt").find("ok"), std::string::npos);
  EXPECT_EQ(read("scratch.txt"), "ok\n");
  EXPECT_NE(bash("echo hacked > model.py; echo rc=$?").find("rc=1"), std::string::npos);
  EXPECT_EQ(read("model.py"), kTask);
  const fs::path elsewhere = outside() / "planted.txt";
  EXPECT_NE(bash("echo x > " + elsewhere.string() + "; echo rc=$?").find("rc=1"), std::string::npos);
  EXPECT_FALSE(fs::exists(elsewhere));
  // A file of ToolOptions::writable_paths is writable (a missing one is left out).
  write_file_atomic(outside() / "gpu0.lock", "");
  EXPECT_NE(bash("echo held >> " + (outside() / "gpu0.lock").string() + "; echo rc=$?").find("rc=0"), std::string::npos);
  EXPECT_EQ(read_file(outside() / "gpu0.lock"), "held\n");
  EXPECT_NE(bash("echo x >> " + (outside() / "secret.py").string() + "; echo rc=$?").find("rc=1"), std::string::npos);
  // Tools' caches and TMPDIR go to a fresh writable folder of the private /tmp; the host's
  // temporary directory stays named for the GPU lock files.
  const std::string tmp = bash("case \"$TMPDIR\" in /tmp/cuda-agent-caches-*) touch \"$TMPDIR/x\" && echo tmpdir-ok;; esac;"
                               " echo \"host=$CUDA_AGENT_HOST_TMPDIR inductor=$TORCHINDUCTOR_CACHE_DIR\"");
  EXPECT_NE(tmp.find("tmpdir-ok"), std::string::npos) << tmp;
  EXPECT_NE(tmp.find("host=" + fs::temp_directory_path().string()), std::string::npos) << tmp;
  EXPECT_NE(tmp.find("inductor=/tmp/cuda-agent-caches-"), std::string::npos) << tmp;
  const std::string net = bash("exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(port) + " && echo connected || echo refused");
  EXPECT_NE(net.find("refused"), std::string::npos) << net;
  // Scratch files in the private /tmp work and vanish with the command.
  EXPECT_NE(bash("echo t > /tmp/ca-scratch && cat /tmp/ca-scratch").find("t"), std::string::npos);
  EXPECT_FALSE(fs::exists("/tmp/ca-scratch"));
  // Memory and disk are bounded: the private /tmp and /dev/shm hold ToolOptions::tmpfs_bytes (a
  // command filling them would take the machine's RAM from the other episodes and the trainer),
  // and no file, the workspace's included, grows past max_file_bytes.
  const std::string full = bash(
      "for f in /tmp/big /dev/shm/big big.bin; do head -c 3000000 /dev/zero > $f; echo \"$f rc=$?\"; done;"
      " ls -l /dev/shm | wc -l");
  EXPECT_NE(full.find("/tmp/big rc=1"), std::string::npos) << full;
  EXPECT_NE(full.find("/dev/shm/big rc=1"), std::string::npos) << full;
  EXPECT_EQ(full.find("big.bin rc=0"), std::string::npos) << full;
  EXPECT_LE(fs::file_size(root() / "big.bin"), 2u << 20);
  EXPECT_FALSE(fs::exists("/dev/shm/big")) << "the host's /dev/shm";
  fs::remove(root() / "big.bin");
}

// A background command that leaves a daemon in a session of its own and stays alive itself: the
// stop of the shells before the episode's final score ends the daemon too. Under bubblewrap the
// stop's SIGTERM ended bwrap at once, whose --die-with-parent SIGKILLed the command's supervisor
// before it cleared what the command started: the daemon lived on, into the scoring and after it,
// free to take the GPU's memory or its lock so that a failing solution's score ends masked (found
// by an adversarial review, 2026-12-06).
TEST_P(AgentConfinement, ADaemonOfABackgroundCommandEndsWhenTheShellsAreStopped) {
  const ToolResult started = call("Bash", {{"command",
                                            "setsid bash -c 'echo $$ > daemon.pid; exec sleep 300' "
                                            "</dev/null >/dev/null 2>&1 & sleep 1000"},
                                           {"run_in_background", true}});
  ASSERT_TRUE(started.ok) << started.output;
  pid_t daemon = 0;
  for (int i = 0; i < 200 && daemon <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    std::error_code ec;
    if (fs::exists(root() / "daemon.pid", ec)) daemon = std::atoi(read("daemon.pid").c_str());
  }
  ASSERT_GT(daemon, 0) << "the daemon wrote no pid";
  // The process's start time (field 22 of its stat): a pid the suite's other processes reuse once
  // the daemon has gone is another process.
  const auto started_at = [](pid_t pid) -> std::string {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos || close + 2 >= text.size() || text[close + 2] == 'Z') return "";  // gone or a zombie
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
    }
    return field;
  };
  const std::string daemon_start = started_at(daemon);
  const auto alive = [&](pid_t pid) { return !daemon_start.empty() && started_at(pid) == daemon_start; };
  ASSERT_TRUE(alive(daemon));
  registry_->stop_background();  // as the episode does before its final score
  bool lives = true;
  for (int i = 0; i < 150 && lives; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lives = alive(daemon);
  }
  EXPECT_FALSE(lives) << "the background command's daemon " << daemon << " outlived the stop of the shells";
  if (lives) ::kill(daemon, SIGKILL);
}

// Seen from outside the confinement's namespaces, as the episode's trainer sees a verify.sh's judge.
TEST_P(AgentConfinement, WaitsForTheGpuLockDoNotCountAgainstTheTimeout) {
  expect_gpu_waits_do_not_count(registry_, *workspace_, tool_options_);
}

// Many files, each under max_file_bytes, would still fill the disk: a command is stopped once the
// workspace holds more than max_disk_bytes (about every 250 ms, so a little more), and says so; a
// command that removes files runs, and one that writes again under the limit works.
TEST_P(AgentConfinement, BashCannotFillTheDisk) {
  auto bash = [&](const std::string& command) { return call("Bash", {{"command", command}}); };
  const ToolResult filled =
      bash("for i in $(seq 200); do head -c 1000000 /dev/zero > fill$i.bin; sleep 0.01; done; echo finished");
  EXPECT_FALSE(filled.ok) << filled.output;
  EXPECT_EQ(filled.output.find("finished"), std::string::npos) << filled.output;
  EXPECT_NE(filled.output.find("grew past 16.0 MiB on disk"), std::string::npos) << filled.output;
  uint64_t held = 0;
  for (const auto& e : fs::directory_iterator(root()))
    if (e.path().filename().string().rfind("fill", 0) == 0) held += fs::file_size(e.path());
  EXPECT_GT(held, 8u << 20) << "it wrote before it was stopped";
  EXPECT_LT(held, 100u << 20) << "stopped well before its 200 MB";
  const ToolResult removed = bash("rm -f fill*.bin; echo removed");
  EXPECT_NE(removed.output.find("removed"), std::string::npos) << removed.output;
  const ToolResult again = bash("head -c 1000000 /dev/zero > one.bin && echo wrote");
  EXPECT_NE(again.output.find("wrote"), std::string::npos) << again.output;
}

// Nor the machine's memory: a command whose processes (a daemon that left its session
// included) hold more than max_memory_bytes together is stopped and told so, before the kernel's
// OOM killer would pick a process of its own choosing (another episode's evaluation, the
// trainer); one under the limit runs.
TEST_P(AgentConfinement, BashCannotExhaustMemory) {
  EXPECT_GE(ToolOptions{}.max_memory_bytes, 8ULL << 30) << "the default";
  tool_options_.max_memory_bytes = 256 << 20;
  registry_ = std::make_unique<ToolRegistry>(*workspace_, tool_options_);
  auto bash = [&](const std::string& command) { return call("Bash", {{"command", command}}); };
  // `tail` keeps a line with no end in memory: 3 GB of it, from a process of its own session.
  const ToolResult hog =
      bash("setsid bash -c 'head -c 3000000000 /dev/zero | tail -n 1 | wc -c' & wait; echo finished");
  EXPECT_FALSE(hog.ok) << hog.output;
  EXPECT_EQ(hog.output.find("finished"), std::string::npos) << hog.output;
  EXPECT_NE(hog.output.find("past 256.0 MiB (the tools' max_memory_bytes)"), std::string::npos) << hog.output;
  const ToolResult small = bash("head -c 50000000 /dev/zero | tail -n 1 | wc -c");
  EXPECT_NE(small.output.find("50000000"), std::string::npos) << small.output;
}

// A bound on the GPU memory the command holds outside evaluations (episodes sharing a GPU) is
// confined-exec's to watch; where NVML is missing (this machine) or names none of the command's
// processes, the command runs as before. The bound's enforcement is a GPU test
// (AgentGpu.ACommandHoldingMoreThanItsShareOfTheGpusMemoryIsStopped).
TEST_P(AgentConfinement, AGpuMemoryBoundLeavesACommandWithoutGpuWorkAlone) {
  tool_options_.max_gpu_memory_bytes = 1;
  tool_options_.gpu_lock_file = (workspace_->root() / "gpu0.gpu.lock").string();
  registry_ = std::make_unique<ToolRegistry>(*workspace_, tool_options_);
  const ToolResult r = call("Bash", {{"command", "sleep 1.5; echo done"}});
  EXPECT_TRUE(r.ok) << r.output;
  EXPECT_NE(r.output.find("done"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Modes, AgentConfinement, ::testing::Values("bwrap", "namespaces"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Under the system read scope, bubblewrap's Bash hides what lies outside the scope. Folders beside
// the workspace come and go (other episodes', other tests'): one that vanishes between the moment
// the command's mounts are planned and the moment bubblewrap makes them must not fail the
// command (it did: bubblewrap could not make a mount point over it in a read-only folder). A
// `bwrap` first on PATH removes such a folder just before the real one runs.
class AgentScopedBwrap : public AgentTools {
 protected:
  void SetUp() override {
    tool_options_.confine = "bwrap";
    tool_options_.visible_paths = sandbox::read_scope_system_paths();
    setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);  // what bubblewrap's Bash runs the command through
    // The wrapper goes first on the PATH that the tools' shells get (taken when they are made).
    path_ = getenv("PATH") ? getenv("PATH") : "";
    for (size_t at = 0; at <= path_.size();) {
      const size_t end = std::min(path_.find(':', at), path_.size());
      const fs::path candidate = fs::path(path_.substr(at, end - at)) / "bwrap";
      if (real_.empty() && end > at && fs::is_regular_file(candidate)) real_ = candidate;
      at = end + 1;
    }
    const fs::path bin = base_.path() / "bin";
    fs::create_directories(bin);
    write_file_atomic(bin / "bwrap", "#!/bin/sh\ncase \"$*\" in *ca-vanish-marker*) /bin/rm -rf '" + gone().string() +
                                         "';; esac\nexec '" + real_.string() + "' \"$@\"\n");
    fs::permissions(bin / "bwrap", fs::perms::owner_all);
    setenv("PATH", (bin.string() + ":" + path_).c_str(), 1);
    AgentTools::SetUp();
  }
  void TearDown() override { setenv("PATH", path_.c_str(), 1); }
  fs::path gone() const { return base_.path() / "gone-meanwhile"; }
  std::string path_;
  fs::path real_;  // the real bwrap
};

TEST_F(AgentScopedBwrap, AFolderThatVanishesBesideTheWorkspaceDoesNotFailTheCommand) {
  const std::string probe = real_.string() + " --ro-bind / / --unshare-net --die-with-parent true > /dev/null 2>&1";
  if (real_.empty() || std::system(probe.c_str()) != 0)
    GTEST_SKIP() << "bubblewrap cannot run on this machine";
  fs::create_directories(gone() / "inside");
  const ToolResult r = call("Bash", {{"command", "echo ca-vanish-marker; cat " + (outside() / "secret.py").string() +
                                                     " 2>/dev/null || echo secret=hidden; head -c 6 model.py; echo; "
                                                     "echo x > mine.txt && echo workspace=writable"}});
  EXPECT_FALSE(fs::exists(gone())) << "the wrapper ran";
  EXPECT_TRUE(r.ok) << r.output;
  for (const char* said : {"ca-vanish-marker", "secret=hidden", "workspace=writable"})
    EXPECT_NE(r.output.find(said), std::string::npos) << said << " in " << r.output;
  EXPECT_EQ(r.output.find("SECRET"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::string(kTask).substr(0, 6)), std::string::npos) << "the task is readable: " << r.output;
}

}  // namespace
}  // namespace cuda_agent::agent

