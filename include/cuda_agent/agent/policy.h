// The policy interface the agent loop drives: chat messages and tool schemas in, one assistant
// reply out. Implementations: ReplayPolicy (scripted replies from JSONL, for tests and demos),
// ReferencePolicy (a finished solution played as an episode, reference_policy.h),
// OpenAiPolicy (an OpenAI-compatible HTTP server, openai_policy.h) and, registered from ca_serve,
// LocalPolicy (the in-process libtorch model, cuda_agent/serve/local_policy.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
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
  // Called by a policy that decodes in this process (LocalPolicy without the batch engine) between
  // two decode steps, on the thread that called complete(), with none of the decoding's GPU work in
  // flight; it may block (QuietGpuPolicy lets an evaluation's timed run in there). Empty: none.
  std::function<void()> between_steps;
};

struct PolicyReply {
  std::string text;                  // the raw assistant text (may hold <tool_call> blocks)
  std::vector<ToolCall> tool_calls;  // calls the API returned structurally (OpenAI tools API)
  std::string finish_reason;         // "stop", "length", "tool_calls", ...
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Token records of an in-process model (LocalPolicy), for the RL trainer; empty for policies
  // that do not see tokens (HTTP, replay). prompt_token_ids: the rendered prompt as fed to the
  // model. completion_token_ids: every sampled token, the end-of-turn token included (`text` is
  // their decode without special tokens). completion_logprobs: log p of each completion token
  // under the model's unmodified distribution (temperature 1, no top-k/top-p), as
  // lm::Generation::logprobs; same length as completion_token_ids.
  std::vector<int64_t> prompt_token_ids;
  std::vector<int64_t> completion_token_ids;
  std::vector<float> completion_logprobs;
  // LocalPolicy only: prompt_token_ids start with the previous reply's prompt_token_ids followed
  // by its completion_token_ids, exactly (the conversation went on and the template rendered the
  // earlier turns unchanged, so only the new text was encoded). false: the whole prompt was
  // encoded afresh (first turn, a new conversation, or the template rewrote earlier text).
  bool prompt_extends_previous = false;
  // The token records are a teacher's reply written in the model's tokens (LocalPolicy's teacher
  // forcing), not samples of the model: completion_logprobs are zeros, fit for supervised
  // updates only.
  bool teacher_forced = false;
  // Seconds of the reply spent waiting for the GPU's quiet lock while evaluations timed beside it
  // (QuietGpuPolicy: before it started and at its pauses between decode steps); part of the
  // reply's wall time.
  double quiet_wait_s = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // One completion. Throws Error when the policy cannot answer (transport failure, exhausted
  // retries); the loop records it and ends the episode with stop reason "policy_error"
  // (ContextFullError: "context_full").
  virtual PolicyReply complete(const PolicyRequest& request) = 0;
  // The model's context window in tokens and the most a reply may take (0: unknown). The loop
  // keeps the conversation inside the window with room for a reply; a policy that finds a
  // conversation too long for it throws ContextFullError (the episode ends "context_full").
  virtual int64_t context_tokens() const { return 0; }
  virtual int64_t max_reply_tokens() const { return 0; }
  // Its GPU work holds the GPU's quiet lock by itself (LocalPolicy decoding through a batch engine
  // with a gate, lm::LmOptions::engine_gate): QuietGpuPolicy holds nothing around its replies then,
  // whose holds would keep a timed run out while the engine steps aside for it.
  virtual bool holds_quiet_lock_itself() const { return false; }
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

// Builds the policy for the text after a registered prefix (for "local:m.gguf?seed=1", the
// factory registered for "local:" gets "m.gguf?seed=1"). Throws Error for a bad spec.
using PolicyFactory = std::function<std::unique_ptr<Policy>(const std::string& rest)>;

// Adds a policy form to make_policy: specs starting with `prefix` go to `factory`; `usage` (e.g.
// "local:MODEL[?key=value&...] (an in-process libtorch model)") is listed in make_policy's
// unknown-spec error. Lets libraries that depend on ca_agent (ca_serve's LocalPolicy) plug in
// without ca_agent depending on them; call it explicitly (main() does, before parsing verbs).
// Registering a prefix again replaces the earlier factory. `check` (optional) validates the text
// after the prefix without building the policy (no model load): validate_policy_spec calls it.
// Thread-safe.
using PolicySpecCheck = std::function<void(const std::string& rest)>;
// Policies for episodes that run side by side (eval's episodes on one GPU): a source is made once
// and called once per episode, from several threads at once. `source` (optional) lets a form's
// policies share what make_policy would make for each (local: one model loaded once, each policy
// a session over it, and with batch_engine=1 one engine decoding every episode's turns); without
// it the source calls make_policy each time. What a source shares lives as long as the source and
// the policies it made.
using PolicySource = std::function<std::unique_ptr<Policy>()>;
using PolicySourceFactory = std::function<PolicySource(const std::string& rest)>;
void register_policy_factory(const std::string& prefix, PolicyFactory factory, const std::string& usage,
                             PolicySpecCheck check = {}, PolicySourceFactory source = {});

// "replay:PATH.jsonl" -> ReplayPolicy, "openai:MODEL@BASE_URL" -> OpenAiPolicy,
// "reference:FILE.py" -> ReferencePolicy (reference_policy.h), then the registered prefixes. Throws Error for an unknown spec, listing every form. Thread-safe.
std::unique_ptr<Policy> make_policy(const std::string& spec);

// A source of `spec`'s policies (register_policy_factory): the registered form's own where it has
// one (which may load a model here, once), else one that calls make_policy per policy. Throws
// Error as make_policy does.
PolicySource make_policy_source(const std::string& spec);

// Checks a spec as make_policy would take it, without loading a model or reaching a server: the
// form, the replay file (read and parsed), the OpenAI model@URL, a registered form's own check
// (local: its options and that the model file or folder exists). Throws Error naming what is
// wrong; callers that run many episodes call it before the first. Thread-safe.
void validate_policy_spec(const std::string& spec);

}  // namespace cuda_agent::agent
