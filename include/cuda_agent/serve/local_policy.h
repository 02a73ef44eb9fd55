// The agent driven by the in-process libtorch model: an agent::Policy over a ChatSession, so
// `cuda-agent solve --policy local:MODEL` and `eval` run without a model server, and every reply
// carries the token ids and log-probabilities the RL trainer needs (PolicyReply's token records).
//
//   spec: local:PATH[?key=value&key=value...]   (PATH: a Hugging Face folder or a .gguf file; it
//         may not contain '?')
//   keys: temperature (default 1; 0 is greedy), top_p (1), top_k (0: off), max_new_tokens (2048,
//         cut to what the context leaves), seed (0), device (cpu | cuda | cuda:N), dtype (float32 |
//         bfloat16), thinking (1/0, true/false: Qwen3's enable_thinking; unset leaves the template's
//         default), batch_engine (1/0, true/false; default 0: each call decodes its own batch; 1:
//         the calls of every policy over the model decode together, lm::LmOptions::batch_engine,
//         with the GPU's quiet lock held by the engine between steps)
//   e.g.  local:models/SmolLM2-135M-Instruct.Q4_1.gguf?temperature=0&max_new_tokens=512
//
// The defaults sample from the model's own distribution (temperature 1, no top-p/top-k), the
// one completion_logprobs are measured under, so the records are on-policy for PPO.
// Call k of a policy (k = 0, 1, ...) samples with seed + k: the turns of an episode differ, and
// the same spec replays the same episode.
//
// Tool calls stay in PolicyReply::text as the <tool_call> blocks the model wrote (the text the
// completion tokens decode to); PolicyReply::tool_calls stays empty, so the agent loop parses
// them as it parses any text reply (its own call ids, parse errors fed back to the model).
//
// Token chaining (multi-turn PPO needs one token sequence per episode, with the sampled ids kept
// exactly): the policy keeps the ids of its last call (prompt + completion) and the text they stand
// for (the rendered prompt + the completion decoded with special tokens, "<|im_end|>" included,
// invalid bytes repaired as in PolicyReply::text: decode_with_specials). When the next request
// continues that conversation (same first message, more messages) and its rendered prompt starts
// with the kept text, only the new suffix is encoded (no BOS; special tokens parsed as in a full
// encode) and appended to the kept ids, so prompt_token_ids(k+1) = prompt_token_ids(k) +
// completion_token_ids(k) + the suffix's ids, and PolicyReply::prompt_extends_previous is true.
// Otherwise (first call, a new conversation, or the template rendered earlier text differently:
// e.g. tool calls re-rendered from the parsed calls in the template's own layout, a special token
// sampled mid-reply and dropped from the text) the whole prompt is encoded afresh and the flag is
// false. The ids at the join may differ from what a full encode of the same text gives (BPE merges
// do not cross it, and a sampled invalid byte stays the byte, where the text holds U+FFFD);
// decode_with_specials of either gives the same text.
//
// This lives in ca_serve (it needs ca_policy and ca_agent); register_local_policy() makes
// agent::make_policy accept "local:" specs.
//
// Thread safety: a LocalPolicy is not thread-safe; eval gives each episode its own, all over one
// model per GPU (agent::make_policy_source: the model loaded once, a session over it per policy;
// sessions over one model may generate in several threads at once).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/policy.h"
#include "cuda_agent/serve/chat_session.h"

namespace cuda_agent::serve {

struct LocalPolicyOptions {
  std::filesystem::path model;  // Hugging Face folder or .gguf file
  std::string device = "cpu";   // cpu, cuda, cuda:N
  std::string dtype = "float32";
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0: no top-k filter
  int64_t max_new_tokens = 2048;
  uint64_t seed = 0;  // call k samples with seed + k
  std::optional<bool> enable_thinking;
  bool batch_engine = false;  // lm::LmOptions::batch_engine

  // The spec that gives these options back ("local:PATH?temperature=...&..."; every key written).
  std::string to_spec() const;
};

// "local:PATH[?key=value&...]" -> options. Throws Error naming the spec and the bad key or value
// (an unknown key lists the known ones; an empty path says what to pass).
LocalPolicyOptions parse_local_policy_spec(const std::string& spec);

// The agent's messages as ChatSession::chat / ChatTemplate::render take them: roles as given;
// assistant tool calls as {"id", "type": "function", "function": {"name", "arguments": object}};
// tool turns with "tool_call_id" and "name".
nlohmann::ordered_json template_messages(const std::vector<agent::ChatMessage>& messages);
// OpenAI function-tool schemas as the template takes them (null or [] -> []). Throws Error when
// `tools` is neither null nor an array.
nlohmann::ordered_json template_tools(const nlohmann::json& tools);

class LocalPolicy : public agent::Policy {
 public:
  // Opens options.model (ChatSession::open). Throws Error naming the file and what is wrong.
  explicit LocalPolicy(LocalPolicyOptions options);
  // Over a session the caller opened: the RL trainer's, ChatSession::open_with_model on
  // PpoLearner::policy(), so its rollouts come from the weights it trains (each call samples from
  // the weights as they are then). `options` gives the sampling and template options;
  // options.model, device and dtype are replaced by the session's path and its model's options
  // (name() is that spec, though the weights are the session's, not the file's). The policy owns
  // the session; a borrowed model must outlive both.
  LocalPolicy(std::unique_ptr<ChatSession> session, LocalPolicyOptions options);
  // Teacher forcing: `teacher` (any agent::Policy: reference:, openai:, replay:, another local:)
  // answers every call, and the reply comes back as if this policy's model had written it, with
  // token records in the session's tokenizer and chat template: the stages.sft and RFT teacher
  // episodes of the trainer (docs/training.md). The reply text holds the teacher's calls as
  // <tool_call> blocks (structured calls are written out), so the actor learns the text form it
  // must produce itself. completion_token_ids are the assistant turn as the template renders it in
  // later prompts (the calls in its layout), end-of-turn token included; when the template's
  // rendering cannot be isolated (it rewrites earlier turns) they are the reply text plus the
  // end-of-turn token. Prompts chain as for sampled replies. A reply longer than max_new_tokens
  // throws Error (the episode ends with policy_error), one that would end past the model's
  // context ContextFullError (context_full), as sampling would: a demonstration the actor could
  // not write itself. completion_logprobs are zeros and
  // PolicyReply::teacher_forced is true: the tokens are not the model's samples, so they serve
  // supervised updates only (rl::ppo_samples refuses them). Nothing is sampled; the model's
  // weights are not read. name() is "teacher:" + the teacher's name.
  LocalPolicy(std::unique_ptr<ChatSession> session, LocalPolicyOptions options, std::unique_ptr<agent::Policy> teacher);

  std::string name() const override { return teacher_ ? "teacher:" + teacher_->name() : options_.to_spec(); }
  // One reply: text (raw, <tool_call> blocks included), finish_reason ("stop", "length" or
  // "tool_calls"), token counts and token records. Throws Error naming the model file when the
  // conversation cannot be rendered (bad role, malformed call), ContextFullError when it does not
  // fit the context.
  agent::PolicyReply complete(const agent::PolicyRequest& request) override;
  int64_t context_tokens() const override;
  int64_t max_reply_tokens() const override { return options_.max_new_tokens; }
  // Through a batch engine with a gate (lm::LmOptions::engine_gate), which holds the quiet lock.
  bool holds_quiet_lock_itself() const override;

  // The sampling and template options of call number `call`.
  ChatRequestOptions request_options(uint64_t call) const;
  const LocalPolicyOptions& options() const { return options_; }
  ChatSession& session() { return *session_; }
  uint64_t calls() const { return calls_; }
  // Forgets the kept conversation: the next call encodes its whole prompt.
  void reset_chain();

 private:
  // The prompt ids for `text`, the rendering of `request`: the kept ids + the suffix's ids when
  // the request continues the kept conversation, else a full encode. Sets *extends.
  std::vector<int64_t> prompt_ids(const agent::PolicyRequest& request, const std::string& text, bool* extends) const;
  // The teacher-forced reply to `request` whose rendered prompt is `text` (see the constructor).
  agent::PolicyReply teacher_reply(const agent::PolicyRequest& request, const std::string& text);
  // Keeps prompt + completion (and the text they stand for) as the chain the next call extends.
  void keep_chain(const agent::PolicyRequest& request, std::string text, const std::vector<int64_t>& prompt,
                  const std::vector<int64_t>& completion);

  LocalPolicyOptions options_;
  std::unique_ptr<ChatSession> session_;
  std::unique_ptr<agent::Policy> teacher_;  // set: teacher forcing
  uint64_t calls_ = 0;
  // The chain: ids of the last prompt + completion, the text they stand for, and what identifies
  // the conversation (its first message, its message count).
  std::vector<int64_t> chain_ids_;
  std::string chain_text_;
  std::string chain_first_message_;
  size_t chain_messages_ = 0;
};

// Registers "local:" with agent::register_policy_factory. Call once before make_policy sees a
// local spec (main() does, before parsing verbs); calling it again is harmless.
void register_local_policy();

}  // namespace cuda_agent::serve
