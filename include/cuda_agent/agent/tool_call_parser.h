// Tool calls out of a model's reply, in the two forms models produce them:
//
//  - Qwen/Hermes text: <tool_call>{"name": "...", "arguments": {...}}</tool_call>, one block per
//    call, possibly several, possibly with the last one cut off by the end of generation (no
//    closing tag). Blocks inside <think>...</think> are reasoning, not calls.
//  - The OpenAI chat-completions API: message.tool_calls[] with function.name and
//    function.arguments (a JSON string).
//
// Parsing never throws for model output: what cannot be parsed is reported in `errors`, which
// the agent loop turns into an observation so the model can correct itself.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::agent {

struct ToolCall {
  std::string id;           // the API's id, or "call_<n>" for text calls
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();
};

struct ParsedReply {
  std::string content;                 // the text with the tool-call blocks removed, trimmed
  std::vector<ToolCall> calls;
  std::vector<std::string> errors;     // one per block that was not a valid call
  bool unterminated_call = false;      // the last block had no </tool_call>
};

// `first_id` numbers the generated ids (call_<first_id>, call_<first_id + 1>, ...).
ParsedReply parse_hermes_tool_calls(std::string_view text, int first_id = 0);

// Reads an OpenAI-format assistant message ({"content": ..., "tool_calls": [...]}).
ParsedReply parse_openai_message(const nlohmann::json& message);

// The Hermes text for calls, as a template renders an assistant turn with tool calls.
std::string render_hermes_tool_calls(const std::vector<ToolCall>& calls);

}  // namespace cuda_agent::agent
