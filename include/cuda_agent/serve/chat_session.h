// A chat model ready to answer: the language model (lm.h), its tokenizer and its chat template,
// loaded together from one Hugging Face folder or one .gguf file. Used by `cuda-agent generate`,
// `cuda-agent serve` and the agent's local: policy (local_policy.h); lives in the static library ca_serve (it parses
// tool calls with the agent's parser, and ca_policy must stay free of ca_agent, which the libtorch module links).
//
// Streaming: text deltas are whole UTF-8 characters (a character split across tokens is held
// until complete; invalid bytes become U+FFFD), never contain a stop string or the text after
// one, and concatenate to ChatReply::text.
//
// Thread safety: a ChatSession is not thread-safe (the model is not); the server guards it with
// a mutex. StreamDecoder is a plain value type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/tool_call_parser.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/policy/chat_template.h"
#include "cuda_agent/policy/tokenizer.h"

namespace cuda_agent::serve {

// Called with each new piece of text; returning false stops generation (finish_reason "stop").
using TextDeltaFn = std::function<bool(const std::string& delta)>;

struct ChatRequestOptions {
  lm::SamplingOptions sampling;  // stop_token_ids are added to the session's end-of-turn/eos ids
  // Generation ends before the first occurrence of any of these strings (OpenAI's `stop`).
  std::vector<std::string> stop;
  // Text that, once it appears, is not streamed any more (it still ends up in ChatReply::text):
  // the server sets "<tool_call>" when tools are offered, so calls arrive as tool_calls only.
  std::vector<std::string> hold_back;
  policy::ChatOptions chat;  // add_generation_prompt, enable_thinking
  // Called between two decode steps when the model decodes on the calling thread (not through
  // the batch engine, whose thread serves every caller): agent::PolicyRequest::between_steps.
  std::function<void()> between_steps;
};

struct ChatReply {
  std::string text;     // everything generated, end-of-turn token and stop string excluded
  std::string content;  // `text` without <tool_call> blocks (trimmed) when there are calls, else `text`
  std::vector<agent::ToolCall> tool_calls;
  std::vector<std::string> tool_call_errors;  // blocks that were not valid calls (left in content)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // tokens sampled, the end-of-turn token included
  std::string finish_reason;      // "stop", "length", "tool_calls", or "abort" (the caller's callback stopped it)
  double seconds = 0;             // generation wall time (prefill included)
  // What the model saw and sampled, for the RL trainer: the prompt's ids; every sampled token
  // (Generation::tokens: the end-of-turn token included, special tokens and a stop string's
  // tokens too, so `text` is the decode of these minus special tokens and anything from a stop
  // string on); and log p of each under the unmodified distribution (Generation::logprobs).
  std::vector<int64_t> prompt_token_ids;
  std::vector<int64_t> completion_token_ids;
  std::vector<float> completion_logprobs;
};

// Turns token bytes into streamable text; see the header comment for the rules.
class StreamDecoder {
 public:
  StreamDecoder(std::vector<std::string> stop, std::vector<std::string> hold_back);
  // Adds bytes; returns the text that may be emitted now ("" when nothing is complete or safe).
  std::string push(std::string_view bytes);
  // No more bytes: returns what is left to emit (held-back text stays unemitted).
  std::string finish();
  // A stop string was seen: nothing more will be emitted or kept.
  bool stopped() const { return stopped_; }
  // The whole text (stop string and what follows cut off), emitted or not.
  const std::string& text() const { return text_; }
  // How much of text() has been emitted.
  size_t emitted() const { return emitted_; }

 private:
  std::string release(bool final);
  std::vector<std::string> stop_, hold_back_;
  std::string pending_bytes_;  // an incomplete UTF-8 character
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
  bool holding_ = false;
};

// The text `ids` stand for in a rendered conversation: the bytes repaired as ChatReply::text
// repairs them (StreamDecoder: each invalid byte -> U+FFFD), with special tokens kept as their
// text ("<|im_end|>") where ChatReply::text drops them. For valid UTF-8 it equals
// Tokenizer::decode(ids) (specials kept). LocalPolicy chains turns on it.
std::string decode_with_specials(const policy::Tokenizer& tokenizer, const std::vector<int64_t>& ids);

// Fills content, tool_calls, tool_call_errors and (when there are calls) finish_reason of a
// reply whose text is set, with the agent's Hermes parser.
void extract_tool_calls(ChatReply& reply);

class ChatSession {
 public:
  // Loads the model (load_language_model), the tokenizer (tokenizer.json beside a folder, or the
  // GGUF's tokenizer.* metadata) and the chat template (the tokenizer's / GGUF's
  // tokenizer.chat_template, else the family's). Throws Error naming the file and what is missing.
  // Also checks that the model's vocabulary holds every tokenizer id (it may be larger: padded
  // embeddings, as Qwen's are); a mismatch throws Error naming both sizes. The session owns the model.
  static std::unique_ptr<ChatSession> open(const std::filesystem::path& model, const lm::LmOptions& options);
  // The same session over a model it does not own (the RL trainer's PpoLearner::policy(), so
  // rollouts are sampled from the weights being trained): the tokenizer and chat template are read
  // from `model_path` as open() reads them, the weights are not loaded, and the same checks apply
  // (the vocabulary sizes, an end-of-sequence token). `model` is borrowed: it must outlive the
  // session, and whoever changes its weights (an optimizer step) changes what the session samples.
  // Sessions over one model may generate in several threads at once, but not while its owner
  // trains it.
  static std::unique_ptr<ChatSession> open_with_model(const std::filesystem::path& model_path,
                                                      lm::LanguageModel& model);
  // open_with_model without reading the tokenizer again: the new session shares `like`'s
  // tokenizer (immutable, thread-safe) and path, borrows `model` the same way and runs the same
  // checks. The trainer opens one session per run and one of these per episode. `like` may be
  // shared from several threads at once.
  static std::unique_ptr<ChatSession> share_with_model(const ChatSession& like, lm::LanguageModel& model);

  // Renders `messages` (OpenAI chat messages) and `tools` (OpenAI function tools; null or [] for
  // none) with the template, generates, and parses tool calls from the text. Template errors
  // (unknown role, bad content) throw Error naming the message.
  ChatReply chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                 const ChatRequestOptions& options, const TextDeltaFn& on_text_delta = {});
  // chat() on prompt ids the caller encoded (LocalPolicy's chained ids, which keep the tokens the
  // model sampled in earlier turns); parses tool calls as chat() does.
  ChatReply chat_from_ids(std::vector<int64_t> prompt_ids, const ChatRequestOptions& options,
                          const TextDeltaFn& on_text_delta = {});
  // Continues `prompt` verbatim (BOS added when the tokenizer asks for it); no tool parsing.
  ChatReply complete(const std::string& prompt, const ChatRequestOptions& options,
                     const TextDeltaFn& on_text_delta = {});

  // The prompt text chat() feeds the model.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const policy::ChatOptions& options = {}) const;
  // Prompt token ids of `text` (BOS when asked for).
  std::vector<int64_t> encode_prompt(const std::string& text) const;

  // The model (owned, or borrowed through open_with_model).
  lm::LanguageModel& model() { return *model_; }
  bool owns_model() const { return owned_model_ != nullptr; }
  const policy::Tokenizer& tokenizer() const { return *tokenizer_; }
  const policy::ChatTemplate& chat_template() const { return *template_; }
  // eos ids of the config and tokenizer plus the template's end-of-turn token.
  const std::vector<int64_t>& stop_token_ids() const { return stop_ids_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  ChatSession() = default;
  // What open() and open_with_model() share: reads the tokenizer from path_ (before any weights
  // are loaded, so a bad tokenizer fails fast).
  void load_tokenizer();
  // Once model_ is set: checks the vocabulary sizes, picks the template, collects the stop ids.
  void attach_model();
  ChatReply generate(std::vector<int64_t> prompt, const ChatRequestOptions& options, const TextDeltaFn& on_text_delta);

  std::filesystem::path path_;
  std::unique_ptr<lm::LanguageModel> owned_model_;      // null when the model is borrowed
  lm::LanguageModel* model_ = nullptr;                  // owned_model_ or the borrowed one
  std::shared_ptr<const policy::Tokenizer> tokenizer_;  // immutable and thread-safe: sessions may share it
  std::unique_ptr<policy::ChatTemplate> template_;
  std::vector<int64_t> stop_ids_;
};

}  // namespace cuda_agent::serve
