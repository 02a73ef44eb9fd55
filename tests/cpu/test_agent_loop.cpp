// The ReAct loop: a replayed episode end to end through the real sandbox (verify on the CPU),
// and the loop's stop conditions, budget and single-turn mode with small in-test policies.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "cuda_agent/agent/agent_loop.h"
#include "cuda_agent/agent/episode.h"
#include "cuda_agent/agent/eval_runner.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/evaluation.h"

using namespace cuda_agent;
using namespace cuda_agent::agent;

namespace {

const std::string kSource = CUDA_AGENT_SOURCE_DIR;

std::string line(const nlohmann::json& j) { return j.dump() + "\n"; }

// The tools' outputs of an episode folder's trajectory, in order.
std::vector<std::string> observation_outputs(const std::filesystem::path& episode) {
  std::vector<std::string> outputs;
  std::ifstream in(episode / "trajectory.jsonl");
  for (std::string text; std::getline(in, text);) {
    const nlohmann::json e = nlohmann::json::parse(text);
    if (e.value("type", "") == "observation") outputs.push_back(e.value("output", ""));
  }
  return outputs;
}

// The tools.confine modes that work here: bwrap (bubblewrap), namespaces (this binary's own).
std::vector<std::string> confined_bash_modes() {
  std::vector<std::string> modes;
  if (std::system("bwrap --ro-bind / / --unshare-net --die-with-parent true > /dev/null 2>&1") == 0) modes.push_back("bwrap");
  if (std::system((std::string(CUDA_AGENT_BINARY) + " confined-exec true > /dev/null 2>&1").c_str()) == 0)
    modes.push_back("namespaces");
  return modes;
}

// Replies from a list; after it, "Done." with no call.
class ListPolicy : public Policy {
 public:
  explicit ListPolicy(std::vector<std::string> replies) : replies_(std::move(replies)) {}
  std::string name() const override { return "list"; }
  PolicyReply complete(const PolicyRequest& request) override {
    last_request = request;
    PolicyReply r;
    r.text = next_ < replies_.size() ? replies_[next_++] : "Done.";
    return r;
  }
  PolicyRequest last_request;

 private:
  std::vector<std::string> replies_;
  size_t next_ = 0;
};

// The same reply forever.
class RepeatPolicy : public Policy {
 public:
  explicit RepeatPolicy(std::string reply) : reply_(std::move(reply)) {}
  std::string name() const override { return "repeat"; }
  PolicyReply complete(const PolicyRequest&) override {
    PolicyReply r;
    r.text = reply_;
    r.finish_reason = "stop";
    return r;
  }

 private:
  std::string reply_;
};

class FailingPolicy : public Policy {
 public:
  std::string name() const override { return "failing"; }
  PolicyReply complete(const PolicyRequest&) override { throw Error("connection refused by the model server"); }
};

std::string call(const std::string& name, const nlohmann::json& args) {
  return "<tool_call>\n" + nlohmann::json{{"name", name}, {"arguments", args}}.dump() + "\n</tool_call>";
}

struct Fixture {
  TempDir dir{"agent-loop-"};
  Workspace workspace;
  ToolRegistry tools;
  Fixture()
      : workspace(Workspace::create({dir.path() / "ws", kSource + "/tests/data/tasks/add/model.py", {}, "", "", false, ""})),
        tools(workspace) {}
};

// Scores by reading the file: the loop, not the sandbox, is under test here.
nlohmann::json file_scorer_result(const std::string& path) {
  const std::string text = read_file(path);
  return {{"ok", !text.empty()}, {"reward", text.empty() ? -1.0 : 1.0}};
}

// The episode the answers tests replay: the probe, then the solution written, then verify.sh.
std::string probe_episode(const std::filesystem::path& dir, const std::string& probe, const std::string& solution) {
  const std::filesystem::path path = dir / "episode.jsonl";
  std::ofstream f(path);
  f << line({{"content", call("Bash", {{"command", probe}})}});
  f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", solution}})}});
  f << line({{"content", call("Bash", {{"command", "./verify.sh"}})}});
  return "replay:" + path.string();
}

}  // namespace

TEST(AgentLoop, ReplayedEpisodeEndToEndThroughTheSandbox) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  TempDir dir("agent-episode-");
  setenv("CUDA_AGENT_CACHE_DIR", (dir.path() / "cache").c_str(), 1);
  const std::string solution =
      "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
      "        super().__init__()\n\n    def forward(self, a, b):\n        return torch.add(a, b)\n";
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    f << line({{"content", "Reading the task.\n" + call("Read", {{"file_path", "model.py"}})}});
    f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", solution}})}});
    nlohmann::json verify_call = {{"name", "Bash"}, {"arguments", {{"command", "./verify.sh"}}}};
    f << line({{"content", ""}, {"tool_calls", nlohmann::json::array({verify_call})}});
    f << line({{"content", "It passes. Done."}});
  }
  EpisodeSpec spec;
  spec.task = kSource + "/tests/data/tasks/add/model.py";
  spec.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.output_dir = dir.path() / "run";
  spec.skill_file = kSource + "/skills/cuda-kernel-sandbox/SKILL.md";
  spec.device = "cpu";
  spec.sandbox.cache_dir = (dir.path() / "cache").string();
  std::vector<nlohmann::json> streamed;
  EpisodeResult r = run_task_episode(spec, [&](const nlohmann::json& e) { streamed.push_back(e); });

  EXPECT_EQ(r.stop_reason, "answered");
  EXPECT_EQ(r.turns, 4);
  EXPECT_EQ(r.tool_calls, 3);
  EXPECT_EQ(r.invalid_tool_calls, 0);
  EXPECT_EQ(r.reward, 1.0) << r.score.dump(2);
  EXPECT_TRUE(r.score["ok"].get<bool>()) << r.score.dump(2);
  EXPECT_EQ(streamed.size(), r.trajectory.size());
  bool saw_verify = false;
  for (const auto& e : r.trajectory)
    if (e.value("sandbox_check", "") == "verify") {
      saw_verify = true;
      EXPECT_NE(e["output"].get<std::string>().find("result    pass"), std::string::npos) << e["output"];
    }
  EXPECT_TRUE(saw_verify);
  // The system prompt carries the skill; the trajectory file has one JSON object per line.
  EXPECT_NE(r.trajectory[0]["content"].get<std::string>().find("name: cuda-kernel-sandbox"), std::string::npos);
  std::ifstream in(spec.output_dir / "trajectory.jsonl");
  std::string l;
  size_t count = 0;
  while (std::getline(in, l)) {
    ASSERT_FALSE(nlohmann::json::parse(l, nullptr, false).is_discarded()) << l;
    ++count;
  }
  EXPECT_EQ(count, r.trajectory.size() + 1);  // + the episode header
  EXPECT_TRUE(std::filesystem::exists(spec.output_dir / "result.json"));
}

// The policy's commands can make model_new.py a symlink out of the workspace (to a file it cannot
// read, or into a loop), or a FIFO, which a read blocks on forever. That is its answer: scored as
// one that cannot be loaded (-1), never an episode left unscored (or hung), which the trainer
// would leave out of the batch instead of a -1.
TEST(AgentLoop, AModelNewThatLeavesTheWorkspaceIsAFailureNotAnUnscoredEpisode) {
  for (const std::string& command : {std::string("ln -sf /etc/hostname model_new.py"),
                                     std::string("rm -f model_new.py && ln -s model_new.py model_new.py"),
                                     std::string("rm -f model_new.py && mkfifo model_new.py")}) {
    SCOPED_TRACE(command);
    Fixture fx;
    ListPolicy policy({call("Bash", {{"command", command}})});
    int scored = 0;
    const Scorer scorer = [&](const std::string& path) {
      ++scored;  // and not read: a FIFO would block the test
      return nlohmann::json{{"ok", false}, {"reward", -1.0}, {"path", path}};
    };
    EpisodeResult r;
    ASSERT_NO_THROW(r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, scorer));
    std::error_code ec;
    EXPECT_FALSE(
        std::filesystem::is_regular_file(std::filesystem::symlink_status(fx.workspace.root() / "model_new.py", ec)))
        << "the command did not run";
    EXPECT_EQ(scored, 0) << "nothing outside the workspace is scored";
    EXPECT_EQ(r.reward, -1.0);
    EXPECT_EQ(r.score.value("category", ""), "load_error") << r.score.dump(2);
    EXPECT_NE(r.score.value("message", "").find("model_new.py"), std::string::npos) << r.score.dump(2);
  }
}

TEST(AgentLoop, RepeatedIdenticalCallsStopAsLooping) {
  Fixture fx;
  RepeatPolicy policy(call("Read", {{"file_path", "model.py"}}));
  AgentOptions o;
  o.max_repeated_calls = 4;
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, o, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "looping");
  EXPECT_EQ(r.turns, 4);
}

TEST(AgentLoop, UnparsableCallsStopAfterTheLimitAndAreObservations) {
  Fixture fx;
  RepeatPolicy policy("<tool_call>{not json}</tool_call>");
  AgentOptions o;
  o.max_invalid_turns = 3;
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, o, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "invalid_tool_calls");
  EXPECT_EQ(r.turns, 3);
  EXPECT_EQ(r.invalid_tool_calls, 3);
  int parse_observations = 0;
  for (const auto& e : r.trajectory) parse_observations += e.value("parse_error", false);
  EXPECT_EQ(parse_observations, 3);
  EXPECT_EQ(r.reward, -1.0);  // model_new.py stayed empty
}

TEST(AgentLoop, ToolErrorsAreObservationsNotExceptions) {
  Fixture fx;
  ListPolicy policy({call("Write", {{"file_path", "model.py"}, {"content", "x"}}), call("NoSuchTool", {}),
                     call("Read", {{"file_path", "../../etc/passwd"}})});
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "answered");
  EXPECT_EQ(r.invalid_tool_calls, 3);
  // The model saw each error as a tool message.
  int tool_messages = 0;
  for (const auto& m : policy.last_request.messages) tool_messages += m.role == "tool";
  EXPECT_EQ(tool_messages, 3);
}

TEST(AgentLoop, MaxTurnsAndPolicyErrors) {
  {
    Fixture fx;
    RepeatPolicy policy(call("Bash", {{"command", "echo hi"}}) + "\n" + call("Glob", {{"pattern", "*.py"}}));
    AgentOptions o;
    o.max_turns = 3;
    o.max_repeated_calls = 100;
    EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, o, file_scorer_result);
    EXPECT_EQ(r.stop_reason, "max_turns");
    EXPECT_EQ(r.turns, 3);
    EXPECT_EQ(r.tool_calls, 6);
  }
  {
    Fixture fx;
    FailingPolicy policy;
    EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, file_scorer_result);
    EXPECT_EQ(r.stop_reason, "policy_error");
    bool found = false;
    for (const auto& e : r.trajectory)
      found = found || e.value("message", "").find("connection refused") != std::string::npos;
    EXPECT_TRUE(found);
  }
}

// A policy that sees tokens (LocalPolicy) puts its records into the assistant events; others do not.
class TokenPolicy : public Policy {
 public:
  std::string name() const override { return "tokens"; }
  PolicyReply complete(const PolicyRequest&) override {
    PolicyReply r;
    r.text = "Done.";
    r.finish_reason = "stop";
    r.prompt_tokens = 3;
    r.completion_tokens = 2;
    r.prompt_token_ids = {1, 2, 3};
    r.completion_token_ids = {7, 0};
    r.completion_logprobs = {-0.25f, -1.5f};
    return r;
  }
};

TEST(AgentLoop, AssistantEventsCarryTokenRecordsWhenThePolicyHasThem) {
  auto assistant_event = [](Policy& policy) {
    Fixture fx;
    EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, file_scorer_result);
    for (const auto& e : r.trajectory)
      if (e.value("type", "") == "assistant") return e;
    return nlohmann::json();
  };
  TokenPolicy with;
  const nlohmann::json e = assistant_event(with);
  EXPECT_EQ(e["prompt_token_ids"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(e["completion_token_ids"], nlohmann::json({7, 0}));
  EXPECT_EQ(e["completion_logprobs"], nlohmann::json({-0.25, -1.5}));
  EXPECT_EQ(e["prompt_extends_previous"], false);
  EXPECT_EQ(e["content"], "Done.");
  RepeatPolicy without("Done.");
  const nlohmann::json plain = assistant_event(without);
  EXPECT_FALSE(plain.contains("prompt_token_ids") || plain.contains("completion_token_ids") ||
               plain.contains("completion_logprobs") || plain.contains("prompt_extends_previous"))
      << plain.dump();
  EXPECT_EQ(plain["content"], "Done.");
}

TEST(AgentLoop, OldObservationsAreShortenedToFitTheBudget) {
  Fixture fx;
  std::vector<std::string> replies;
  for (int i = 0; i < 6; ++i) replies.push_back(call("Bash", {{"command", "head -c 20000 /dev/zero | tr '\\\\0' a; echo " + std::to_string(i)}}));
  ListPolicy policy(replies);
  AgentOptions o;
  o.context_budget_chars = 50000;
  o.keep_recent_observations = 2;
  o.shortened_observation_chars = 1000;
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, o, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "answered");
  std::vector<size_t> sizes;
  for (const auto& m : policy.last_request.messages)
    if (m.role == "tool") sizes.push_back(m.content.size());
  ASSERT_EQ(sizes.size(), 6u);
  EXPECT_LT(sizes[0], 1200u);            // shortened
  EXPECT_GT(sizes[5], 19000u);           // the newest stays whole
  EXPECT_NE(policy.last_request.messages[2 + 1].content.find("removed to fit the context"), std::string::npos);
}

// A model with a small window: a prompt counts 200 tokens of template and tool schemas plus a
// token per 3 characters of the messages, and one that does not fit throws as LocalPolicy does.
class WindowPolicy : public Policy {
 public:
  WindowPolicy(std::vector<std::string> replies, int64_t context) : replies_(std::move(replies)), context_(context) {}
  std::string name() const override { return "window"; }
  int64_t context_tokens() const override { return context_; }
  int64_t max_reply_tokens() const override { return 500; }
  PolicyReply complete(const PolicyRequest& request) override {
    size_t chars = 0;
    for (const auto& m : request.messages) {
      chars += m.content.size();
      for (const auto& c : m.tool_calls) chars += c.arguments.dump().size() + c.name.size();
    }
    const int64_t tokens = 200 + static_cast<int64_t>(chars / 3);
    if (tokens >= context_) throw ContextFullError(fmt::format("the prompt is {} tokens", tokens));
    prompt_tokens.push_back(tokens);
    PolicyReply r;
    r.text = next_ < replies_.size() ? replies_[next_++] : "Done.";
    r.prompt_tokens = static_cast<int>(tokens);
    return r;
  }
  std::vector<int64_t> prompt_tokens;

 private:
  std::vector<std::string> replies_;
  size_t next_ = 0;
  int64_t context_;
};

TEST(AgentLoop, AConversationIsKeptInsideTheModelsWindow) {
  // Eight observations of ~1000 tokens each through a 4000-token window: the older ones are
  // shortened (the six newest too, the window being small) so that every prompt leaves the reply
  // its room, and the episode ends as the policy meant it to.
  Fixture fx;
  std::vector<std::string> replies;
  for (int i = 0; i < 8; ++i)
    replies.push_back(call("Bash", {{"command", "head -c 3000 /dev/zero | tr '\\0' b; echo " + std::to_string(i)}}));
  WindowPolicy policy(replies, 4000);
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "answered") << ::testing::PrintToString(policy.prompt_tokens);
  ASSERT_EQ(policy.prompt_tokens.size(), 9u);
  for (size_t i = 1; i < policy.prompt_tokens.size(); ++i)
    EXPECT_LE(policy.prompt_tokens[i], 4000 - 500) << "prompt " << i;
  // The same conversation without a window known to the loop runs into the model's limit.
  Fixture fx2;
  class Unknown : public WindowPolicy {
   public:
    using WindowPolicy::WindowPolicy;
    int64_t context_tokens() const override { return 0; }
  } blind(replies, 4000);
  EpisodeResult r2 = run_episode(blind, fx2.workspace, fx2.tools, AgentOptions{}, file_scorer_result);
  EXPECT_EQ(r2.stop_reason, "context_full");
  EXPECT_EQ(r2.trajectory.back().value("type", ""), "score") << "the episode is still scored";
  bool found = false;
  for (const auto& e : r2.trajectory)
    found = found || (e.value("type", "") == "error" && e.value("source", "") == "context");
  EXPECT_TRUE(found);
}

TEST(AgentLoop, AConversationThatCannotBeShortenedEndsContextFull) {
  // The policy's own replies fill the window (nothing of theirs is shortened): the loop stops
  // before the model would refuse, as `context_full`, not `policy_error`.
  Fixture fx;
  std::vector<std::string> replies;
  for (int i = 0; i < 10; ++i)
    replies.push_back(std::string(3000, 'x') + "\n" + call("Bash", {{"command", "echo " + std::to_string(i)}}));
  WindowPolicy policy(replies, 4000);
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, AgentOptions{}, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "context_full");
  EXPECT_LT(r.turns, 10);
  EXPECT_EQ(r.trajectory.back().value("type", ""), "score");
}

TEST(AgentLoop, SingleTurnTakesTheLastPythonBlock) {
  Fixture fx;
  ListPolicy policy({"Here it is:\n```python\nfirst = 1\n```\nbetter:\n```python\nclass ModelNew: pass\n```\n"});
  AgentOptions o;
  o.single_turn = true;
  EpisodeResult r = run_episode(policy, fx.workspace, fx.tools, o, file_scorer_result);
  EXPECT_EQ(r.stop_reason, "single_turn");
  EXPECT_EQ(r.turns, 1);
  EXPECT_EQ(fx.workspace.read_solution(), "class ModelNew: pass\n");
  EXPECT_TRUE(policy.last_request.tools.empty());
  EXPECT_NE(policy.last_request.messages[0].content.find("one ```python code block"), std::string::npos);
}

TEST(AgentLoop, ExtractPythonBlock) {
  EXPECT_EQ(extract_python_block("no code"), "");
  EXPECT_EQ(extract_python_block("```python\na\n```"), "a\n");
  EXPECT_EQ(extract_python_block("```python\nunterminated"), "unterminated");
}

TEST(AgentLoop, ChangingTheOriginalTaskFailsTheEpisode) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  TempDir dir("agent-tamper-");
  std::filesystem::create_directories(dir.path() / "task");
  const auto task = dir.path() / "task" / "model.py";
  write_file_atomic(task, read_file(kSource + "/tests/data/tasks/add/model.py"));
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    nlohmann::json tamper = {{"name", "Bash"}, {"arguments", {{"command", "echo '# changed' >> " + task.string()}}}};
    f << line({{"content", ""}, {"tool_calls", nlohmann::json::array({tamper})}});
  }
  EpisodeSpec spec;
  spec.task = task;
  spec.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.output_dir = dir.path() / "run";
  spec.device = "cpu";
  spec.sandbox.cache_dir = (dir.path() / "cache").string();
  // Unconfined, as on a machine without bubblewrap (confined, the write fails: AgentConfinement).
  spec.tools.confine = "off";
  EpisodeResult r = run_task_episode(spec);
  EXPECT_EQ(r.reward, -1.0);
  EXPECT_EQ(r.score.value("category", ""), "task_modified") << r.score.dump(2);
}

// The scoring cache decides the reward (its baselines); the policy's commands must not be able to
// write an entry that verifies there. A confined Bash sees it read-only with its secret key
// hidden, and verify.sh evaluates with the episode's own cache (tools-cache/). Skipped where Bash
// cannot run confined (bubblewrap and the binary's namespaces both missing).
TEST(AgentLoop, ThePolicysCommandsCannotReachTheScoringCache) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  if (confined_bash_modes().empty()) GTEST_SKIP() << "Bash cannot run confined here (neither bubblewrap nor user namespaces)";
  TempDir dir("agent-cache-");
  const auto cache = dir.path() / "cache";
  const std::string key_file = (sandbox::cache_secret_dir(cache) / "key").string();
  const std::string probe =
      "cat " + key_file + " > /dev/null 2>&1 && echo key=read || echo key=hidden; "
      "cat " + (cache / "builds" / "0123456789abcdef" / "cuda.cu").string() + " 2>/dev/null || echo builds=hidden; "
      "mkdir -p " + (cache / "baselines").string() + " 2>/dev/null; echo x > " + (cache / "baselines" / "forged.json").string() +
      " 2>/dev/null && echo scoring=written || echo scoring=read-only; echo tools=$CUDA_AGENT_CACHE_DIR; "
      "echo seeded=$(ls $CUDA_AGENT_CACHE_DIR/baselines/ 2>/dev/null | tr '\\n' ,)";
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    nlohmann::json bash = {{"name", "Bash"}, {"arguments", {{"command", probe}}}};
    f << line({{"content", ""}, {"tool_calls", nlohmann::json::array({bash})}});
    const std::string solution =
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n"
        "        return a + b\n";
    f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", solution}})}});
    f << line({{"content", call("Bash", {{"command", "./verify.sh"}})}});
  }
  EpisodeSpec spec;
  spec.task = kSource + "/tests/data/tasks/add/model.py";
  spec.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.output_dir = dir.path() / "run";
  spec.device = "cpu";
  spec.sandbox.cache_dir = cache.string();
  // A baseline the scoring cache holds for this task (as after any scored episode of it), one of
  // another task, and one for this task written without the key: the tools' cache gets the
  // first, re-signed, and neither of the others.
  const sandbox::BaselineCache scoring = sandbox::BaselineCache::of(cache);
  sandbox::BaselineKey timed{file_sha256(spec.task), "H200", "2.11", "loose", {{"runs", 10}}};
  scoring.put(timed, {{"eager", {{"median_ms", 1.5}}}});
  sandbox::BaselineKey other = timed;
  other.task_sha256 = std::string(64, 'f');
  scoring.put(other, {{"eager", {{"median_ms", 2.5}}}});
  const std::string seeded = scoring.path_for(timed).filename().string();
  write_file_atomic(cache / "baselines" / (seeded.substr(0, 17) + "forged.json"),
                    R"({"key": {}, "eager": {"median_ms": 99}, "mac": "00"})");
  // An evaluated solution's build folder (a load_inline solution writes its sources there).
  write_file_atomic(cache / "builds" / "0123456789abcdef" / "cuda.cu", "// THE-ANSWER\n");
  EpisodeResult r = run_task_episode(spec);
  const std::vector<std::string> outputs = observation_outputs(spec.output_dir);
  ASSERT_EQ(outputs.size(), 3u) << r.score.dump(2);
  EXPECT_NE(outputs[0].find("key=hidden"), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[0].find("builds=hidden"), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[0].find("scoring=read-only"), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[0].find("tools=" + (spec.output_dir / "tools-cache").string()), std::string::npos) << outputs[0];
  EXPECT_FALSE(std::filesystem::exists(cache / "baselines" / "forged.json"));
  // verify.sh still works, with the tools' cache.
  EXPECT_NE(outputs[2].find("result    pass"), std::string::npos) << outputs[2];
  EXPECT_EQ(r.reward, 1.0) << r.score.dump(2);  // scored with the scoring cache, outside
  // The tools' cache, the episode's own, had the scoring cache's verified entry (re-signed) and
  // not the forged one; it is removed with the episode.
  EXPECT_NE(outputs[0].find("seeded=" + seeded + ",\n"), std::string::npos) << outputs[0];
  EXPECT_FALSE(std::filesystem::exists(spec.output_dir / "tools-cache"));
}

// What the trainer and eval ask before they start judges to time baselines (a judge that finds
// them cached still waits for the GPU's lock): an entry of the task that verifies under the
// cache's key and has the evaluation's precision and timing settings, whatever GPU timed it.
TEST(BaselineCacheHolds, AnEntryOfTheTaskWithItsSettingsFromAnyGpu) {
  TempDir dir("baseline-holds-");
  const std::filesystem::path cache = dir.path() / "cache";
  const sandbox::BaselineCache scoring = sandbox::BaselineCache::of(cache);
  const sandbox::SandboxOptions options;
  const std::string task(64, 'a');
  EXPECT_FALSE(scoring.holds(sandbox::baseline_key_of(task, options))) << "an empty cache";
  // As the judge writes it: the options' part, then the GPU, torch and driver.
  sandbox::BaselineKey timed = sandbox::baseline_key_of(task, options);
  timed.gpu_name = "NVIDIA H200";
  timed.torch_version = "2.11.0";
  timed.timing["driver_version"] = "580.95";
  scoring.put(timed, {{"eager", {{"median_ms", 1.5}}}});
  EXPECT_TRUE(scoring.holds(sandbox::baseline_key_of(task, options)));
  sandbox::SandboxOptions loose = options;
  loose.precision = "loose";  // the same float32 baselines as strict
  EXPECT_TRUE(scoring.holds(sandbox::baseline_key_of(task, loose)));
  sandbox::SandboxOptions tf32 = options;
  tf32.precision = "tf32";
  EXPECT_FALSE(scoring.holds(sandbox::baseline_key_of(task, tf32)));
  sandbox::SandboxOptions longer = options;
  longer.timed_runs += 5;
  EXPECT_FALSE(scoring.holds(sandbox::baseline_key_of(task, longer)));
  EXPECT_FALSE(scoring.holds(sandbox::baseline_key_of(std::string(64, 'b'), options))) << "another task";
  // The same entry written by something without the cache's key (a solution, say): not held.
  const std::filesystem::path path = scoring.path_for(timed);
  nlohmann::json forged = nlohmann::json::parse(read_file(path));
  forged["mac"] = std::string(64, '0');
  write_file_atomic(path, forged.dump());
  EXPECT_FALSE(scoring.holds(sandbox::baseline_key_of(task, options)));
}

// The answers on disk: the task's reference solution (its split's solutions/ folder, and the
// history of the repository it lies in) and what the caller hides (the run's folder: other
// episodes' solutions, a teacher's demonstrations). Neither
// the policy's commands nor its solution may read them, in either confinement of Bash; the
// episode's own workspace stays writable and the task readable. Unconfined, the same probes read
// both (the control: the probes work).
TEST(AgentLoop, NeitherThePolicysCommandsNorItsSolutionReadTheAnswers) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  std::vector<std::string> modes = confined_bash_modes();
  if (modes.empty()) GTEST_SKIP() << "Bash cannot run confined here (neither bubblewrap nor user namespaces)";
  modes.insert(modes.begin(), "off");
  for (const std::string& mode : modes) {
    SCOPED_TRACE("tools.confine " + mode);
    TempDir dir("agent-answers-");
    const auto task = dir.path() / "split" / "tasks" / "add" / "model.py";
    std::filesystem::create_directories(task.parent_path());
    write_file_atomic(task, read_file(kSource + "/tests/data/tasks/add/model.py"));
    const auto answer = dir.path() / "split" / "solutions" / "add" / "model_new.py";
    const auto run = dir.path() / "run";
    const auto peer = run / "other-e0" / "workspace" / "model_new.py";
    // The repository's history holds the answer as committed (git show HEAD:split/solutions/...).
    const auto history = dir.path() / ".git" / "objects" / "an" / "swer";
    for (const auto& file : {answer, peer, history}) {
      std::filesystem::create_directories(file.parent_path());
      write_file_atomic(file, "# THE-ANSWER\n");
    }
    // Also through /proc/<pid>/root/ of the processes outside the confinement (the test's own).
    const std::string probe = "cat " + answer.string() + " 2>/dev/null || echo answer=hidden; cat " + peer.string() +
                              " 2>/dev/null || echo peer=hidden; cat " + history.string() +
                              " 2>/dev/null || echo history=hidden; head -c 12 " + task.string() +
                              " > /dev/null && echo task=readable; echo x > mine.txt && echo workspace=writable; "
                              "for root in /proc/[0-9]*/root; do cat $root" + answer.string() + " $root" + peer.string() +
                              " 2>/dev/null | head -1; done | sort -u";
    // A correct solution that reads whatever answers it can at import, and says so in its output.
    const std::string solution =
        "import torch\nimport torch.nn as nn\nseen = []\nfor path in [" + nlohmann::json(answer.string()).dump() + ", " +
        nlohmann::json(peer.string()).dump() + ", " + nlohmann::json(history.string()).dump() + "]:\n    try:\n        seen.append(open(path).read())\n"
        "    except OSError:\n        pass\nif seen:\n    raise RuntimeError('read the answers: ' + repr(seen))\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n";
    EpisodeSpec spec;
    spec.task = task;
    spec.policy = probe_episode(dir.path(), probe, solution);
    spec.output_dir = run / "mine-e0";
    spec.hidden_paths = {run};
    spec.device = "cpu";
    spec.sandbox.cache_dir = (dir.path() / "cache").string();
    spec.sandbox.confine = mode == "off" ? "off" : "auto";
    spec.tools.confine = mode;
    EpisodeResult r = run_task_episode(spec);
    const std::vector<std::string> outputs = observation_outputs(spec.output_dir);
    ASSERT_EQ(outputs.size(), 3u) << r.score.dump(2);
    EXPECT_NE(outputs[0].find("task=readable"), std::string::npos) << outputs[0];
    EXPECT_NE(outputs[0].find("workspace=writable"), std::string::npos) << outputs[0];
    if (mode == "off") {
      EXPECT_EQ(outputs[0].find("hidden"), std::string::npos) << outputs[0];
      // verify.sh's evaluation keeps the default confinement and read scope (sandbox.confine is
      // not one of the options it takes from the episode): its candidate reads none of them
      // even beside an unconfined Bash. The final score, with confine off, reads them.
      EXPECT_EQ(outputs[2].find("read the answers"), std::string::npos) << outputs[2];
      EXPECT_EQ(r.reward, -1.0) << r.score.dump(2);
      continue;
    }
    EXPECT_NE(outputs[0].find("answer=hidden"), std::string::npos) << outputs[0];
    EXPECT_NE(outputs[0].find("peer=hidden"), std::string::npos) << outputs[0];
    EXPECT_NE(outputs[0].find("history=hidden"), std::string::npos) << outputs[0];
    EXPECT_EQ(outputs[0].find("THE-ANSWER"), std::string::npos) << outputs[0];
    EXPECT_NE(outputs[2].find("result    pass"), std::string::npos) << outputs[2];
    EXPECT_EQ(r.reward, 1.0) << r.score.dump(2);  // the scorer's candidate did not read them either
    EXPECT_EQ(read_file(answer), "# THE-ANSWER\n");
    EXPECT_TRUE(std::filesystem::exists(spec.output_dir / "workspace" / "mine.txt"));
  }
}

// sandbox.read_scope "system": the policy's commands read the system, the task and their own
// workspace, and nothing else (a copy of the answer in a folder nobody hid, a note beside the
// split); verify.sh still runs and passes inside that view, in either confinement of Bash.
TEST(AgentLoop, TheSystemReadScopeKeepsThePolicysCommandsToWhatTheyNeed) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  const std::vector<std::string> modes = confined_bash_modes();
  if (modes.empty()) GTEST_SKIP() << "Bash cannot run confined here (neither bubblewrap nor user namespaces)";
  for (const std::string& mode : modes) {
    SCOPED_TRACE("tools.confine " + mode);
    TempDir dir("agent-scope-");
    const auto task = dir.path() / "split" / "tasks" / "add" / "model.py";
    std::filesystem::create_directories(task.parent_path());
    write_file_atomic(task, read_file(kSource + "/tests/data/tasks/add/model.py"));
    const auto elsewhere = dir.path() / "old-run" / "add-e0" / "workspace" / "model_new.py";
    std::filesystem::create_directories(elsewhere.parent_path());
    write_file_atomic(elsewhere, "# THE-ANSWER\n");
    write_file_atomic(dir.path() / "notes.txt", "# THE-ANSWER\n");
    const std::string probe = "cat " + elsewhere.string() + " 2>/dev/null || echo elsewhere=hidden; cat " +
                              (dir.path() / "notes.txt").string() + "; head -c 12 " + task.string() +
                              " > /dev/null && echo task=readable; python3 -c 'print(\"python=runs\")'; "
                              "echo x > mine.txt && echo workspace=writable";
    const std::string solution =
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n"
        "        return a + b\n";
    EpisodeSpec spec;
    spec.task = task;
    spec.policy = probe_episode(dir.path(), probe, solution);
    spec.output_dir = dir.path() / "run" / "add-e0";
    spec.device = "cpu";
    spec.sandbox.cache_dir = (dir.path() / "cache").string();
    spec.sandbox.read_scope = "system";
    spec.tools.confine = mode;
    EpisodeResult r = run_task_episode(spec);
    const std::vector<std::string> outputs = observation_outputs(spec.output_dir);
    ASSERT_EQ(outputs.size(), 3u) << r.score.dump(2);
    for (const char* said : {"elsewhere=hidden", "task=readable", "python=runs", "workspace=writable"})
      EXPECT_NE(outputs[0].find(said), std::string::npos) << said << " in " << outputs[0];
    EXPECT_EQ(outputs[0].find("THE-ANSWER"), std::string::npos) << outputs[0];
    EXPECT_NE(outputs[2].find("result    pass"), std::string::npos) << outputs[2];
    EXPECT_EQ(r.reward, 1.0) << r.score.dump(2);
  }
}

TEST(AgentEval, EpisodesOverASplitFeedTheBenchReport) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  TempDir dir("agent-eval-");
  // Two tasks; the scripted solution is right for `add` and wrong for `linear_small`.
  write_file_atomic(dir.path() / "split" / "split.yaml",
                    "name: tiny\ntasks:\n  - id: add\n    path: " + kSource + "/tests/data/tasks/add/model.py\n    level: 1\n"
                    "  - id: linear\n    path: " + kSource + "/tests/data/tasks/linear_small/model.py\n    level: 2\n");
  const std::string solution =
      "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self, *args):\n"
      "        super().__init__()\n\n    def forward(self, a, b):\n        return a + b\n";
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", solution}})}});
  }
  EvalSpec spec;
  spec.split = dir.path() / "split";
  spec.output_dir = dir.path() / "run";
  spec.episode.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.episode.device = "cpu";
  spec.episode.sandbox.cache_dir = (dir.path() / "cache").string();
  std::ostringstream progress;
  nlohmann::json out = run_eval(spec, progress);
  ASSERT_EQ(out["results"].size(), 2u);
  EXPECT_EQ(out["results"][0]["task_id"], "add");
  EXPECT_EQ(out["results"][0]["reward"], 1.0) << out["results"][0].dump(2);
  EXPECT_EQ(out["results"][0]["episode"]["stop_reason"], "answered");
  EXPECT_EQ(out["results"][1]["reward"], -1.0);
  EXPECT_EQ(out["metrics"]["overall"]["passed"], 1);
  for (const char* f : {"report.md", "report.json", "results/add.json", "results/linear.json",
                        "episodes/add/trajectory.jsonl", "episodes/linear/workspace/model_new.py"})
    EXPECT_TRUE(std::filesystem::exists(spec.output_dir / f)) << f;
  EXPECT_NE(progress.str().find("2/2"), std::string::npos) << progress.str();
  // Without a GPU nothing is timed: the report records the device and says "not timed" where a
  // GPU run has speeds, rather than "0% faster".
  EXPECT_EQ(out["results"][0]["mode"], "verify");
  EXPECT_EQ(out["metrics"]["overall"]["passed_not_timed"], 1);
  const std::string md = read_file(spec.output_dir / "report.md");
  EXPECT_NE(md.find("- **device**: cpu (verified only: nothing timed)"), std::string::npos) << md;
  EXPECT_NE(md.find("| **Overall** | 2 | 50.0% (1/2) | not timed | not timed | not timed | not timed |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("Not measured: every correct result was verified only"), std::string::npos) << md;
  EXPECT_EQ(md.find("fast_1.5"), std::string::npos) << md;

  // Two episodes at once on the GPU (each with its own policy, replies under the quiet lock): the
  // same results, in the split's order.
  spec.episodes_per_gpu = 2;
  spec.output_dir = dir.path() / "run-two";
  const nlohmann::json two = run_eval(spec, progress);
  ASSERT_EQ(two["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(two["results"][i]["task_id"], out["results"][i]["task_id"]);
    EXPECT_EQ(two["results"][i]["reward"], out["results"][i]["reward"]) << two["results"][i].dump(2);
    EXPECT_EQ(two["results"][i]["episode"]["turns"], out["results"][i]["episode"]["turns"]);
  }
  spec.episodes_per_gpu = 0;
  EXPECT_THROW(run_eval(spec, progress), Error);
}

// The task's tolerance and precision reach the episode's score and its check scripts alike: the
// split entry over the task.yaml, the task.yaml over the run's defaults.
TEST(AgentEval, TheTasksToleranceAppliesToTheScoreAndTheScripts) {
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  TempDir dir("agent-eval-tol-");
  write_file_atomic(dir.path() / "split" / "tasks" / "add" / "model.py", read_file(kSource + "/tests/data/tasks/add/model.py"));
  write_file_atomic(dir.path() / "split" / "tasks" / "add" / "task.yaml", "atol: 0.5\nprecision: loose\n");
  write_file_atomic(dir.path() / "split" / "split.yaml",
                    "name: tol\ntasks:\n  - id: add\n    path: tasks/add/model.py\n    atol: 0.0\n");
  const std::string solution =
      "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self, *args):\n"
      "        super().__init__()\n\n    def forward(self, a, b):\n        return a + b\n";
  {
    std::ofstream f(dir.path() / "episode.jsonl");
    f << line({{"content", call("Write", {{"file_path", "model_new.py"}, {"content", solution}})}});
  }
  EvalSpec spec;
  spec.split = dir.path() / "split";
  spec.output_dir = dir.path() / "run";
  spec.episode.policy = "replay:" + (dir.path() / "episode.jsonl").string();
  spec.episode.device = "cpu";
  spec.episode.sandbox.cache_dir = (dir.path() / "cache").string();
  std::ostringstream progress;
  nlohmann::json out = run_eval(spec, progress);
  ASSERT_EQ(out["results"].size(), 1u);
  const nlohmann::json& r = out["results"][0];
  ASSERT_EQ(r["reward"], 1.0) << r.dump(2);
  EXPECT_EQ(r["verify"]["atol"], 0.0) << r["verify"];
  EXPECT_EQ(r["verify"]["rtol"], 0.01) << r["verify"];
  EXPECT_EQ(r["verify"]["precision"], "loose") << r["verify"];
  const std::string script = read_file(spec.output_dir / "episodes" / "add" / "workspace" / "verify.sh");
  EXPECT_NE(script.find("--set sandbox.atol=0.0 --set sandbox.rtol=0.01 --set sandbox.precision=loose"), std::string::npos)
      << script;
}

// A policy that cannot work fails eval before its first episode, with the error solve gives,
// for every policy form: an unknown one, a malformed OpenAI spec, a replay file that is not
// there (local: ones in EvalCheckpoint). No episode folder or result is written.
TEST(AgentEval, AnUnusablePolicyIsRejectedBeforeAnyEpisode) {
  TempDir dir("agent-eval-policy-");
  write_file_atomic(dir.path() / "split" / "split.yaml",
                    "name: tiny\ntasks:\n  - id: add\n    path: " + kSource + "/tests/data/tasks/add/model.py\n    level: 1\n");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"nonsense", "unknown policy 'nonsense'"},
      {"openai:foo", "expected openai:MODEL@BASE_URL"},
      {"replay:" + (dir.path() / "missing.jsonl").string(), "no replay file"},
  };
  for (const auto& [policy, fragment] : bad) {
    EvalSpec spec;
    spec.split = dir.path() / "split";
    spec.output_dir = dir.path() / "run";
    spec.episode.policy = policy;
    spec.episode.device = "cpu";
    std::ostringstream progress;
    try {
      run_eval(spec, progress);
      ADD_FAILURE() << policy << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << policy << ": " << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(spec.output_dir / "results")) << policy;
  }
}
