// RFT trajectory filtering (rl/rft_filter.h) on trajectory files the test writes: kept, low
// reward, each dropped stop reason, too many invalid calls, and malformed files of every kind;
// and on trajectories written by the real agent loop, so the field names cannot drift.
#include "cuda_agent/rl/rft_filter.h"

#include <fstream>

#include <gtest/gtest.h>

#include "../test_util.h"

#include "cuda_agent/agent/agent_loop.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/rl/train_config.h"

namespace cuda_agent::rl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSource = CUDA_AGENT_SOURCE_DIR;

// A trajectory as the agent writes it: header, system, user, one assistant turn with a tool
// call and its observation, then the score event.
std::string trajectory(const std::string& stop_reason, double reward, int invalid_tool_calls = 0) {
  std::string out;
  for (const json& e : {json{{"type", "episode"}, {"task", "t/model.py"}, {"policy", "test"}},
                        json{{"type", "system"}, {"content", "You write CUDA kernels."}},
                        json{{"type", "user"}, {"content", "Here is the task"}},
                        json{{"type", "assistant"}, {"turn", 1}, {"content", "<tool_call>...</tool_call>"}},
                        json{{"type", "observation"}, {"turn", 1}, {"ok", true}, {"output", "ok"}},
                        json{{"type", "score"}, {"stop_reason", stop_reason}, {"turns", 1}, {"tool_calls", 1},
                             {"invalid_tool_calls", invalid_tool_calls}, {"reward", reward},
                             {"result", {{"ok", reward > 0}}}}})
    out += e.dump() + "\n";
  return out;
}

struct Files {
  TempDir dir{"rft-filter-"};
  std::vector<fs::path> paths;
  fs::path add(const std::string& name, const std::string& content) {
    const fs::path p = dir.path() / name;
    write_file_atomic(p, content);
    paths.push_back(p);
    return p;
  }
};

TEST(RftFilter, KeepsPositiveRewardsAndCountsEachDropReason) {
  Files f;
  const fs::path fast = f.add("fast.jsonl", trajectory("answered", 3.0));
  const fs::path correct = f.add("correct.jsonl", trajectory("max_turns", 1.0, 2));
  f.add("wrong.jsonl", trajectory("answered", -1.0));
  f.add("zero.jsonl", trajectory("answered", 0.0));  // not positive: dropped
  f.add("looping.jsonl", trajectory("looping", 3.0));  // a high reward does not save a looping run
  f.add("invalid.jsonl", trajectory("invalid_tool_calls", 2.0));
  f.add("policy_error.jsonl", trajectory("policy_error", 1.0));
  const fs::path many = f.add("many_invalid.jsonl", trajectory("answered", 2.0, 7));

  RftFilterOptions o = RftFilterOptions::from_config(train_config_defaults()["stages"]["rft"]);
  RftFilterResult r = filter_trajectories(f.paths, o);
  EXPECT_EQ(r.kept, (std::vector<fs::path>{fast, correct, many}));  // no invalid-call limit by default
  EXPECT_EQ(r.total(), 8u);
  const std::map<std::string, size_t> want = {{"low_reward", 2},
                                              {"stop_reason:looping", 1},
                                              {"stop_reason:invalid_tool_calls", 1},
                                              {"stop_reason:policy_error", 1}};
  EXPECT_EQ(r.dropped_by_reason, want);

  o.max_invalid_tool_calls = 5;  // 7 > 5; 2 <= 5
  r = filter_trajectories(f.paths, o);
  EXPECT_EQ(r.kept, (std::vector<fs::path>{fast, correct}));
  EXPECT_EQ(r.dropped_by_reason["too_many_invalid_tool_calls"], 1u);
  for (const auto& d : r.dropped)
    if (d.path == many) {
      EXPECT_EQ(d.detail, "7 invalid tool calls > 5");
    }

  o.keep_reward_above = 1.5;  // only the 3.0
  o.drop_stop_reasons = {};
  o.max_invalid_tool_calls = -1;
  r = filter_trajectories(f.paths, o);
  EXPECT_EQ(r.kept.size(), 4u);  // fast, looping (3.0), invalid (2.0), many_invalid (2.0)
  EXPECT_EQ(r.dropped_by_reason, (std::map<std::string, size_t>{{"low_reward", 4}}));

  // An episode the policy never answered (its first prompt did not fit): nothing to learn from,
  // whatever its stop reason and reward.
  Files g;
  std::string silent = trajectory("context_full", 2.0);
  silent.erase(silent.find("{\"content\":\"<tool_call>"), silent.find("{\"ok\"") - silent.find("{\"content\":\"<tool_call>"));
  ASSERT_EQ(silent.find("\"assistant\""), std::string::npos) << silent;
  g.add("silent.jsonl", silent);
  const fs::path full = g.add("context_full.jsonl", trajectory("context_full", 2.0));
  r = filter_trajectories(g.paths, RftFilterOptions::from_config(train_config_defaults()["stages"]["rft"]));
  EXPECT_EQ(r.kept, std::vector<fs::path>{full});
  EXPECT_EQ(r.dropped_by_reason, (std::map<std::string, size_t>{{"no_reply", 1}}));
}

TEST(RftFilter, MalformedFilesAreDroppedAndNamedNeverThrown) {
  Files f;
  const fs::path good = f.add("good.jsonl", trajectory("answered", 2.0));
  std::string truncated = trajectory("answered", 2.0);
  truncated.resize(truncated.size() - 20);  // the writer died mid-line
  f.add("truncated.jsonl", truncated);
  std::string no_score = trajectory("answered", 2.0);
  no_score.resize(no_score.rfind("{\"invalid_tool_calls\""));  // the score line (keys are sorted)
  f.add("no_score.jsonl", no_score);
  std::string text_reward = trajectory("answered", 2.0);
  text_reward.replace(text_reward.find("\"reward\":2.0"), 12, "\"reward\":\"high\"");
  f.add("text_reward.jsonl", text_reward);
  f.add("two_scores.jsonl", trajectory("answered", 2.0) + trajectory("answered", 2.0));
  f.add("empty.jsonl", "");
  f.add("not_json.jsonl", "this is not a trajectory\n");
  f.add("array_line.jsonl", "[1, 2]\n" + trajectory("answered", 2.0));
  const fs::path missing = f.dir.path() / "missing.jsonl";
  f.paths.push_back(missing);
  f.paths.push_back(f.dir.path());  // a directory

  RftFilterResult r = filter_trajectories(f.paths, RftFilterOptions{});
  EXPECT_EQ(r.kept, std::vector<fs::path>{good});
  EXPECT_EQ(r.dropped_by_reason, (std::map<std::string, size_t>{{"malformed", 9}}));
  for (const auto& d : r.dropped) {
    EXPECT_EQ(d.reason, "malformed");
    EXPECT_NE(d.detail.find(d.path.filename().string()), std::string::npos) << d.detail;
  }
  auto detail_of = [&](const std::string& name) {
    for (const auto& d : r.dropped)
      if (d.path.filename() == name) return d.detail;
    return std::string("(not dropped)");
  };
  EXPECT_NE(detail_of("truncated.jsonl").find("truncated.jsonl:6"), std::string::npos) << detail_of("truncated.jsonl");
  EXPECT_NE(detail_of("no_score.jsonl").find("no score event"), std::string::npos) << detail_of("no_score.jsonl");
  EXPECT_NE(detail_of("text_reward.jsonl").find("'reward' must be a number"), std::string::npos);
  EXPECT_NE(detail_of("two_scores.jsonl").find("second score event"), std::string::npos);
  EXPECT_NE(detail_of("array_line.jsonl").find("array_line.jsonl:1"), std::string::npos);
}

TEST(RftFilter, OptionsFromTheConfigSection) {
  json rft = train_config_defaults()["stages"]["rft"];
  RftFilterOptions o = RftFilterOptions::from_config(rft);
  EXPECT_EQ(o.keep_reward_above, 0.0);
  EXPECT_EQ(o.drop_stop_reasons, (std::vector<std::string>{"looping", "invalid_tool_calls", "policy_error"}));
  EXPECT_EQ(o.max_invalid_tool_calls, -1);
  rft.erase("drop_stop_reasons");
  std::string msg = cuda_agent::testing::error_message([&] { RftFilterOptions::from_config(rft); });
  EXPECT_NE(msg.find("drop_stop_reasons"), std::string::npos) << msg;
}

// Trajectories from the real loop (agent/agent_loop.cpp), recorded the way episode.cpp records
// them, go through the filter: an answered episode with reward 1 is kept, a looping one is not.
class RepeatPolicy : public agent::Policy {
 public:
  explicit RepeatPolicy(std::vector<std::string> replies) : replies_(std::move(replies)) {}
  std::string name() const override { return "repeat"; }
  agent::PolicyReply complete(const agent::PolicyRequest&) override {
    agent::PolicyReply r;
    r.text = replies_[std::min(next_++, replies_.size() - 1)];
    return r;
  }

 private:
  std::vector<std::string> replies_;
  size_t next_ = 0;
};

fs::path record_episode(const fs::path& dir, const std::string& name, std::vector<std::string> replies) {
  agent::Workspace ws = agent::Workspace::create(
      {dir / (name + "-ws"), kSource + "/tests/data/tasks/add/model.py", {}, "", "", false, ""});
  agent::ToolRegistry tools(ws);
  RepeatPolicy policy(std::move(replies));
  const fs::path path = dir / (name + ".jsonl");
  std::ofstream out(path);
  auto scorer = [](const std::string& solution) {
    const bool written = !read_file(solution).empty();
    return json{{"ok", written}, {"reward", written ? 1.0 : -1.0}};
  };
  agent::run_episode(policy, ws, tools, agent::AgentOptions{}, scorer,
                     [&](const json& e) { out << e.dump() << "\n" << std::flush; });
  return path;
}

std::string call(const std::string& name, const json& args) {
  return "<tool_call>\n" + json{{"name", name}, {"arguments", args}}.dump() + "\n</tool_call>";
}

TEST(RftFilter, TrajectoriesWrittenByTheAgentLoop) {
  TempDir dir("rft-agent-");
  const fs::path answered = record_episode(
      dir.path(), "answered", {call("Write", {{"file_path", "model_new.py"}, {"content", "class ModelNew: pass\n"}}),
                               "Done."});
  const fs::path looping = record_episode(dir.path(), "looping", {call("Read", {{"file_path", "model.py"}})});

  TrajectoryOutcome a = read_trajectory_outcome(answered);
  EXPECT_EQ(a.stop_reason, "answered");
  EXPECT_EQ(a.reward, 1.0);
  EXPECT_EQ(a.turns, 2);
  EXPECT_EQ(a.tool_calls, 1);
  EXPECT_EQ(read_trajectory_outcome(looping).stop_reason, "looping");

  RftFilterResult r = filter_trajectories({answered, looping}, train_config_defaults()["stages"]["rft"]);
  EXPECT_EQ(r.kept, std::vector<fs::path>{answered});
  EXPECT_EQ(r.dropped_by_reason, (std::map<std::string, size_t>{{"stop_reason:looping", 1}}));
}

}  // namespace
}  // namespace cuda_agent::rl
