// The ReAct loop of one episode: the policy replies, its tool calls run in the workspace, their
// outputs go back as observations, until the policy answers without calling a tool or a limit
// is hit. The workspace's model_new.py is then scored into the episode's reward.
//
// Every event (system prompt, replies, calls, observations, the score) is handed to `on_event`
// as it happens and kept in EpisodeResult::trajectory, the JSONL of docs/agent.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/policy.h"
#include "cuda_agent/agent/tool_registry.h"
#include "cuda_agent/agent/workspace.h"

namespace cuda_agent::agent {

struct AgentOptions {
  int max_turns = 150;                  // policy replies; the paper trains with 150, evaluates with 200
  size_t context_budget_chars = 400000;  // ~100k tokens; past it, old observations are shortened
  // The conversation's window in tokens (the smaller of this and the policy's
  // Policy::context_tokens; 0: the policy's) and the room kept for a reply (at most half the
  // window; 0: the policy's max_reply_tokens, at most a quarter); with no window known, the
  // character budget alone. Once a reply reports its prompt's token count,
  // old observations are shortened so that the prompt leaves the reply its room; a conversation
  // that still does not fit the window ends `context_full`.
  int64_t context_tokens = 0;
  int64_t reserve_tokens = 0;
  size_t shortened_observation_chars = 1500;
  size_t keep_recent_observations = 6;  // shortened only when the older ones are not enough; the newest never
  int max_invalid_turns = 5;            // consecutive replies whose calls all failed to parse or run
  int max_repeated_calls = 6;           // the same call (name and arguments) this many times in a row: looping
  bool single_turn = false;             // no tools: one answer holding model_new.py, scored
  std::string skill;                    // SKILL.md text for the system prompt
  std::string task_text;                // model.py, shown in the first user message
};

// Scores a solution file: returns a sandbox result (the JSON of docs/results.md).
using Scorer = std::function<nlohmann::json(const std::string& solution_path)>;

// One assistant turn's token records (PolicyReply's), kept typed beside its event so that an
// in-process trainer need not read them back from JSON. Empty vectors: the policy does not see
// tokens.
struct TurnTokens {
  int turn = 0;
  std::vector<int64_t> prompt, completion;
  std::vector<float> logprobs;
  bool teacher_forced = false;
};

struct EpisodeResult {
  std::string stop_reason;   // answered, max_turns, policy_error, context_full, invalid_tool_calls, looping,
                             // single_turn
  int turns = 0;
  int tool_calls = 0;
  int invalid_tool_calls = 0;
  double reward = -1.0;
  nlohmann::json score;       // the scorer's result
  nlohmann::json trajectory = nlohmann::json::array();  // every event, in order
  std::vector<TurnTokens> turn_tokens;  // every assistant event's token records, in order
};

// Runs one episode. Never throws for anything the policy or the tools do; throws Error only
// for a scorer failure that is not a result (a bug) — scorers return failures as results.
EpisodeResult run_episode(Policy& policy, Workspace& workspace, ToolRegistry& tools, const AgentOptions& options,
                          const Scorer& scorer, const std::function<void(const nlohmann::json&)>& on_event = {});

// The last ```python fenced block of a reply (single-turn answers); empty when there is none.
std::string extract_python_block(const std::string& text);

// The system prompt: the role, the workspace, the tools protocol (or the single-turn answer
// format) and the skill text.
std::string system_prompt(const AgentOptions& options);

}  // namespace cuda_agent::agent
