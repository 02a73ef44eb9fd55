// The policy interface the agent loop drives: chat messages and tool schemas in, one assistant
// reply out. Implementations: ReplayPolicy (scripted replies from JSONL, for tests and demos);
// an OpenAI-compatible HTTP client and the libtorch policy plug in through the same interface.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/tool_call_parser.h"

namespace cuda_agent::agent {

struct ChatMessage {
  std::string role;                  // system, user, assistant, tool
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant turns that called tools
  std::string tool_call_id;          // tool turns: the call answered
  std::string name;                  // tool turns: the tool's name
  nlohmann::json to_json() const;    // OpenAI chat-completions message form
};

struct PolicyRequest {
  std::vector<ChatMessage> messages;
  nlohmann::json tools = nlohmann::json::array();  // OpenAI function-tool schemas; empty: no tools
};

struct PolicyReply {
  std::string text;                  // the raw assistant text (may hold <tool_call> blocks)
  std::vector<ToolCall> tool_calls;  // calls the API returned structurally (OpenAI tools API)
  std::string finish_reason;         // "stop", "length", "tool_calls", ...
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // One completion. Throws Error when the policy cannot answer (transport failure, exhausted
  // retries); the loop records it and ends the episode with stop reason "policy_error".
  virtual PolicyReply complete(const PolicyRequest& request) = 0;
};

// Plays scripted replies, one JSONL line per turn:
//   {"content": "text, possibly with <tool_call>{...}</tool_call> blocks"}
//   {"content": "...", "tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]}
// After the last line it answers "Done." with no calls, which ends the episode.
// Throws Error (naming the file and line) for a missing file or a malformed line.
class ReplayPolicy : public Policy {
 public:
  explicit ReplayPolicy(const std::filesystem::path& jsonl);
  std::string name() const override { return "replay:" + path_.string(); }
  PolicyReply complete(const PolicyRequest& request) override;
  size_t remaining() const { return replies_.size() - next_; }

 private:
  std::filesystem::path path_;
  std::vector<PolicyReply> replies_;
  size_t next_ = 0;
};

// "replay:PATH.jsonl" -> ReplayPolicy. Throws Error for an unknown spec, listing the forms.
std::unique_ptr<Policy> make_policy(const std::string& spec);

}  // namespace cuda_agent::agent
