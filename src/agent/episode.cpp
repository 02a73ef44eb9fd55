#include "cuda_agent/agent/episode.h"

#include <algorithm>
#include <chrono>
#include <fstream>

#include <fmt/format.h>

#include "cuda_agent/agent/policy.h"
#include "cuda_agent/agent/tool_registry.h"
#include "cuda_agent/agent/workspace.h"
#include "cuda_agent/bench/split.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "tool_support.h"

namespace fs = std::filesystem;

namespace cuda_agent::agent {
namespace {

std::string clip(const std::string& text, size_t max_chars) {
  if (text.size() <= max_chars) return text;
  return text.substr(0, max_chars) + fmt::format("\n[... {} more characters]", text.size() - max_chars);
}

}  // namespace

std::string format_event(const nlohmann::json& e, size_t max_chars) {
  const std::string type = e.value("type", "");
  if (type == "system") return "";  // long and always the same
  if (type == "user") return "── task ──\n" + clip(e.value("content", ""), max_chars) + "\n";
  if (type == "assistant") {
    std::string s = fmt::format("── turn {} ── assistant ({:.1f} s)\n{}\n", e.value("turn", 0), e.value("generation_s", 0.0),
                                clip(e.value("content", ""), max_chars));
    for (const auto& err : e.value("parse_errors", nlohmann::json::array())) s += "  ! " + err.get<std::string>() + "\n";
    return s;
  }
  if (type == "observation") {
    if (e.value("parse_error", false)) return "";
    return fmt::format("→ {} {}{}\n{}\n", e.value("tool", "?"), clip(e.value("arguments", nlohmann::json::object()).dump(), 300),
                       e.value("ok", false) ? "" : "  [error]", clip(e.value("output", ""), max_chars));
  }
  if (type == "error") return fmt::format("!! {} error: {}\n", e.value("source", "?"), e.value("message", ""));
  if (type == "answer") return e.value("found_code", false) ? "(answer holds model_new.py)\n" : "(no ```python block in the answer)\n";
  if (type == "score") {
    const nlohmann::json& r = e["result"];
    return fmt::format("══ episode ended: {} after {} turns, {} tool calls ({} invalid); reward {:g}{}\n",
                       e.value("stop_reason", "?"), e.value("turns", 0), e.value("tool_calls", 0),
                       e.value("invalid_tool_calls", 0), e.value("reward", -1.0),
                       r.value("ok", false) ? "" : fmt::format(" [{}: {}]", r.value("category", nlohmann::json("?")).dump(),
                                                              clip(r.value("message", ""), 300)));
  }
  return "";
}

EpisodeResult run_task_episode(const EpisodeSpec& spec, const std::function<void(const nlohmann::json&)>& on_event) {
  CA_CHECK(fs::is_regular_file(spec.task), "--task {}: no such file", spec.task.string());
  CA_CHECK(spec.device == "cuda" || spec.device == "cpu", "device must be cuda or cpu, got '{}'", spec.device);
  std::unique_ptr<Policy> owned_policy;
  Policy* policy = spec.policy_instance;
  if (policy == nullptr) {
    owned_policy = make_policy(spec.policy);
    policy = owned_policy.get();
  }
  const fs::path task = fs::absolute(spec.task);
  const fs::path ws_root = spec.output_dir / "workspace";
  CA_CHECK(!fs::exists(ws_root), "{} already holds a workspace; choose another --output", spec.output_dir.string());
  fs::create_directories(spec.output_dir);

  // The scripts call this binary's verbs on the original task file, so that nothing done to
  // the workspace copy changes what is checked.
  const std::string bin = shell_quote(self_executable());
  const bool gpu_lock = spec.gpu_lock && spec.device == "cuda";
  const std::string device_flag = spec.device == "cpu" ? " --device cpu"
                                  : fmt::format(" --gpu {}{}", spec.gpu, gpu_lock ? " --gpu-lock" : "");
  WorkspaceOptions wopts;
  wopts.root = ws_root;
  wopts.task_file = task;
  // The scripts check with the tolerance and precision the episode is scored with.
  sandbox::SandboxOptions sandbox_options = spec.sandbox;
  bench::apply_task_options(sandbox_options, task);
  const std::string pinned = bench::pinned_task_option_flags(sandbox_options);
  wopts.verify_command =
      fmt::format("{} verify --task {} --solution model_new.py{}{}", bin, shell_quote(task.string()), device_flag, pinned);
  wopts.profile_command = spec.device == "cpu" ? ""
                          : fmt::format("{} profile --task {} --solution model_new.py{}{}", bin, shell_quote(task.string()),
                                        device_flag, pinned);
  Workspace workspace = Workspace::create(wopts);
  // The policy's commands (verify.sh and profile.sh among them) evaluate with a cache of their
  // own: the scoring cache, whose baselines decide the reward, is read-only to a confined Bash
  // and its secret key hidden, so no command can write an entry that verifies there. The tools'
  // cache is the episode's own (no other episode's commands can plant a baseline or a compiled
  // kernel that this episode's scripts would use), made here before any command runs, and given
  // the baselines the scoring cache holds (verified, re-signed under its key), so that the
  // scripts do not time again what scoring timed. Its entries only change what the scripts print.
  // The task's hash, taken before any command runs: its baselines are looked up by it, and the
  // episode is scored only if the task still has it (below).
  const std::string task_sha = sha256_hex(read_file(task));
  // Before the policy's first command (a background shell of it lives until the episode is
  // scored): whether the scoring's candidate runs confined is settled now (sandbox.confine auto;
  // a no-op once this process knows, as a trainer's or an eval run's does before its episodes).
  (void)sandbox::settle_confinement(sandbox_options, spec.device, spec.gpu, gpu_lock);
  const fs::path scoring_cache = spec.sandbox.resolved_cache_dir();
  const fs::path tools_cache = fs::absolute(spec.output_dir / "tools-cache");
  CA_CHECK(!fs::exists(tools_cache), "{} already exists; choose another --output", tools_cache.string());
  sandbox::BaselineCache::of(scoring_cache).copy_verified_to(sandbox::BaselineCache::of(tools_cache), task_sha);
  std::map<std::string, std::string> env = {{"CUDA_AGENT_CACHE_DIR", tools_cache.string()}};
  if (spec.device == "cuda") env["CUDA_VISIBLE_DEVICES"] = std::to_string(spec.gpu);
  ToolOptions tool_options = spec.tools;
  tool_options.gpu_wait_s = gpu_lock ? spec.sandbox.gpu_wait_s : 0.0;
  if (gpu_lock) {
    // The longest an evaluation holds each of the GPU's lock files: the quiet lock while it times
    // (within its timeout_s), each turnstile while it waits for its lock (within gpu_wait_s), the
    // gpu lock from before CUDA starts to its end (both); with a margin for its finish. The
    // scripts' evaluations run with the defaults but for the pinned options (pinned_task_option_flags),
    // the scoring with the episode's: the longer of each.
    const sandbox::SandboxOptions scripts;
    const double timeout = std::max(sandbox_options.timeout_s, scripts.timeout_s),
                 wait = std::max(spec.sandbox.gpu_wait_s, scripts.gpu_wait_s), margin = 120;
    tool_options.gpu_lock_file = sandbox::gpu_lock_path(spec.gpu, "gpu");  // evaluations' GPU memory is theirs
    tool_options.lock_hold_limits = {{sandbox::gpu_lock_path(spec.gpu, "quiet"), timeout + margin},
                                     {sandbox::gpu_lock_path(spec.gpu, sandbox::kQuietTurn), wait + margin},
                                     {sandbox::gpu_lock_path(spec.gpu, "gpu"), timeout + wait + margin},
                                     {sandbox::gpu_lock_path(spec.gpu, sandbox::kGpuTurn), wait + margin}};
  }
  // The scoring cache, which verify.sh does not use (it has the tools' cache): its key, and the
  // solutions' cubins and builds (a reference solution's, other episodes') are answers.
  if (sandbox::may_hide(scoring_cache) && fs::is_directory(scoring_cache))
    tool_options.hidden_paths.push_back(fs::canonical(scoring_cache).string());
  else
    tool_options.hidden_paths.push_back(sandbox::cache_secret_dir(scoring_cache).string());
  // The answers: the task's reference solutions and what the caller hides (the run's other
  // episodes and demonstrations), for the policy's commands here and for its solution in the
  // scorer (the judge hides the task's answers itself). The task stays readable for the scripts.
  std::vector<std::string> answers = sandbox::answer_directories(task.string());
  for (const fs::path& dir : spec.hidden_paths)
    if (sandbox::may_hide(dir)) answers.push_back(fs::absolute(dir).string());
  for (const std::string& dir : answers) {
    tool_options.hidden_paths.push_back(dir);
    if (sandbox::path_within(task.parent_path(), dir)) tool_options.read_only_paths.push_back(task.parent_path().string());
  }
  // sandbox.read_scope "system": the policy's commands read only the system's and Python's
  // folders, the task's, the GPU's lock files and their own (a copy of an answer anywhere else,
  // an earlier run's folder, cannot be read).
  if (spec.sandbox.read_scope == "system") {
    tool_options.visible_paths = sandbox::read_scope_system_paths();
    tool_options.visible_paths.push_back(fs::absolute(task).parent_path().string());
    tool_options.visible_paths.push_back(sandbox::gpu_lock_directory().string());
  }
  // The GPU's lock files exist before any command runs: verify.sh's evaluations take them, through
  // a read-only descriptor (a confined Bash sees them read-only: no channel between episodes, no
  // disk outside the watch).
  if (gpu_lock) (void)sandbox::gpu_lock_files(spec.gpu);
  ToolRegistry tools(workspace, tool_options, env);

  AgentOptions options = spec.agent;
  options.task_text = read_file(task);
  if (!spec.skill_file.empty()) options.skill = read_file(spec.skill_file);

  // Bash runs confined where bubblewrap works (tool option confine); where it does not, file
  // modes do not stop a root shell. Either way, if the original task changed during the
  // episode, the episode fails instead of being scored against it.
  Scorer scorer = [&](const std::string& solution) {
    if (sha256_hex(read_file(task)) != task_sha) {
      return nlohmann::json{{"ok", false}, {"category", "task_modified"}, {"reward", -1.0}, {"correct", nullptr},
                            {"message", fmt::format("the task file {} changed during the episode; it is not scored",
                                                    task.string())}};
    }
    sandbox::EvalRequest req;
    req.task_path = task.string();
    req.solution_path = solution;
    req.task_id = task.parent_path().filename().string();
    req.mode = spec.device == "cpu" ? sandbox::EvalMode::kVerify : sandbox::EvalMode::kEvaluate;
    req.device = spec.device;
    req.gpu = spec.gpu;
    req.gpu_lock = gpu_lock;
    for (const fs::path& dir : spec.hidden_paths) req.hidden_paths.push_back(fs::absolute(dir).string());
    req.options = sandbox_options;
    nlohmann::json r = sandbox::evaluate(req).to_json();
    // The GPU's lock held by others past sandbox.gpu_wait_s (an episode's commands beside this
    // one, say): scored again, up to twice, by when what held it has usually ended (an episode's
    // processes end with it); only then is the episode left unscored (gpu_busy is masked).
    for (int retry = 0; retry < 2 && r.value("category", nlohmann::json()) == "gpu_busy"; ++retry)
      r = sandbox::evaluate(req).to_json();
    // Verify-only scoring (no GPU): a correct solution earns 1, as correct-but-not-faster does.
    if (req.mode == sandbox::EvalMode::kVerify && r.value("ok", false)) r["reward"] = 1.0;
    return r;
  };

  std::ofstream trajectory(spec.output_dir / "trajectory.jsonl");
  CA_CHECK(trajectory.good(), "cannot write {}", (spec.output_dir / "trajectory.jsonl").string());
  trajectory << nlohmann::json{{"type", "episode"}, {"task", task.string()}, {"policy", policy->name()},
                               {"device", spec.device}, {"max_turns", options.max_turns},
                               {"single_turn", options.single_turn}}.dump()
             << "\n";
  auto record = [&](const nlohmann::json& event) {
    trajectory << event.dump() << "\n" << std::flush;
    if (on_event) on_event(event);
  };
  EpisodeResult result = run_episode(*policy, workspace, tools, options, scorer, record);
  std::error_code ec;
  fs::remove_all(tools_cache, ec);  // compiled kernels and timings of the scripts: nothing to keep
  write_file_atomic(spec.output_dir / "result.json",
                    nlohmann::json{{"stop_reason", result.stop_reason}, {"turns", result.turns},
                                   {"tool_calls", result.tool_calls}, {"invalid_tool_calls", result.invalid_tool_calls},
                                   {"reward", result.reward}, {"score", result.score}}
                        .dump(2));
  return result;
}

PolicyReply QuietGpuPolicy::complete(const PolicyRequest& request) {
  if (inner_.holds_quiet_lock_itself()) return inner_.complete(request);
  const auto start = std::chrono::steady_clock::now();
  sandbox::QuietSteps quiet(gpu_, max_wait_s_, "the policy's reply");
  const double taken_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  PolicyRequest paused = request;
  paused.between_steps = [&quiet, outer = request.between_steps] {
    if (outer) outer();
    quiet.pause_point();
  };
  PolicyReply reply = inner_.complete(paused);
  reply.quiet_wait_s += taken_s + quiet.paused_s();
  return reply;
}

}  // namespace cuda_agent::agent
