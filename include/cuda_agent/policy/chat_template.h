// Chat templates rendered in C++ (no Jinja engine), for the model families the policy runs:
//
//   chatml   <|im_start|>role\ncontent<|im_end|>\n per message, with an optional default system
//            prompt put first when the conversation has none (SmolLM2's template does this with
//            "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
//   qwen2.5  ChatML with Qwen2.5's default system prompt, its "# Tools" system section (one JSON
//            schema per line inside <tools></tools>), assistant tool calls as
//            <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, and consecutive tool
//            results grouped into one user turn of <tool_response>\n...\n</tool_response> blocks.
//   qwen3    Qwen2.5's tool format without a default system prompt, plus Qwen3's think handling:
//            reasoning (message "reasoning_content", or <think>...</think> inside the content) is
//            kept only for assistant turns after the last real user query, and enable_thinking
//            false appends an empty think block to the generation prompt.
//
// The output equals what transformers' apply_chat_template(..., tokenize=False) gives with the
// published templates (tests/cpu/policy/test_chat_template.cpp checks it), with two documented
// differences where the templates cannot do anything sensible:
//   - qwen2.5: tool-call "arguments" given as a JSON string are parsed and written as the object
//     (the template would write a quoted string); qwen3 writes such a string verbatim, as its
//     template does.
//   - chatml: SmolLM2's template ignores tools and tool calls. We ignore `tools` too (describe them
//     in the system prompt), but write an assistant message's tool calls after its content in the
//     qwen format, so that a conversation's calls are not lost.
// JSON (tool schemas, arguments) is written as Python's json.dumps writes it (", " and ": "
// separators, non-ASCII kept, object keys in the order given: pass nlohmann::ordered_json to keep
// an order; a plain nlohmann::json converts, with its keys sorted).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::policy {

struct ChatOptions {
  // Append the start of an assistant turn ("<|im_start|>assistant\n").
  bool add_generation_prompt = true;
  // qwen3: false appends "<think>\n\n</think>\n\n" after the generation prompt (no thinking);
  // true or unset leave the model to think. Ignored by the other families.
  std::optional<bool> enable_thinking;
};

// Immutable; render() is thread-safe.
class ChatTemplate {
 public:
  enum class Kind { kChatML, kQwen2_5, kQwen3 };

  // "chatml" (no default system prompt), "smollm2" / "smollm" (chatml with SmolLM2's default),
  // "qwen2.5" / "qwen2", "qwen3". Throws Error naming the family and listing these otherwise.
  static ChatTemplate for_family(const std::string& family);
  // Recognizes a Jinja chat template (GGUF tokenizer.chat_template, tokenizer_config.json
  // chat_template): qwen3 when it handles <think> and <tool_call>, qwen2.5 when it has
  // <tool_call> and <|im_start|>, chatml when it has <|im_start|> (its default system prompt is
  // read from the template's '<|im_start|>system\n...<|im_end|>' literal, if any). Throws Error
  // quoting the template's start for anything else.
  static ChatTemplate from_template(const std::string& jinja);

  Kind kind() const { return kind_; }
  const std::string& name() const { return name_; }  // "chatml", "qwen2.5", "qwen3"
  // Put first when the conversation has no system message (chatml, qwen2.5); may be "".
  const std::string& default_system_prompt() const { return default_system_; }
  // The text that ends every turn, where generation stops: "<|im_end|>".
  const std::string& end_of_turn() const { return end_of_turn_; }

  // `messages`: OpenAI chat messages: {"role": system|user|assistant|tool, "content": string or
  // null, "tool_calls": [{"function": {"name", "arguments"}} or {"name", "arguments"}],
  // "reasoning_content": string (qwen3)}. `tools`: OpenAI function-tool schemas (an array; null or
  // empty for none), written as given. Throws Error naming the message index and key for an
  // unknown role, non-string content, or a malformed tool call.
  std::string render(const nlohmann::ordered_json& messages,
                     const nlohmann::ordered_json& tools = nlohmann::ordered_json::array(),
                     const ChatOptions& options = {}) const;

 private:
  ChatTemplate(Kind kind, std::string name, std::string default_system);
  Kind kind_;
  std::string name_;
  std::string default_system_;
  std::string end_of_turn_ = "<|im_end|>";
};

// `j` as Python's json.dumps(j, ensure_ascii=False) writes it (what the templates' tojson gives).
std::string python_json_dumps(const nlohmann::ordered_json& j);

}  // namespace cuda_agent::policy
