#include "cuda_agent/serve/local_policy.h"

#include <charconv>
#include <filesystem>
#include <cmath>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/sandbox/worker_confinement.h"

namespace cuda_agent::serve {

// The policy component's types, used throughout this file.
using lm::LmOptions;
using policy::ChatOptions;

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kKeys = "temperature, top_p, top_k, max_new_tokens, seed, device, dtype, thinking, batch_engine";

double parse_double(const std::string& spec, const std::string& key, const std::string& value) {
  double x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  CA_CHECK(ec == std::errc() && end == value.data() + value.size() && std::isfinite(x),
           "policy '{}': {}={} is not a number", spec, key, value);
  return x;
}

template <typename Int>
Int parse_int(const std::string& spec, const std::string& key, const std::string& value) {
  Int x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  CA_CHECK(ec == std::errc() && end == value.data() + value.size() && !value.empty(),
           "policy '{}': {}={} is not a whole number", spec, key, value);
  return x;
}

// The GPU of a policy's device: -1 for cpu, N for cuda:N, 0 for cuda. `spec` names the policy in
// the error for anything else.
int gpu_of(const std::string& spec, const std::string& device) {
  if (device == "cpu") return -1;
  int gpu = 0;
  bool ok = device == "cuda";
  if (!ok && device.rfind("cuda:", 0) == 0 && device.size() > 5) {
    const char* last = device.data() + device.size();
    const auto [end, ec] = std::from_chars(device.data() + 5, last, gpu);
    ok = ec == std::errc() && end == last && gpu >= 0;
  }
  CA_CHECK(ok, "policy '{}': device={}; use cpu, cuda or cuda:N", spec, device);
  return gpu;
}

bool parse_flag(const std::string& spec, const std::string& key, const std::string& value) {
  CA_CHECK(value == "1" || value == "0" || value == "true" || value == "false",
           "policy '{}': {}={}; use 1, 0, true or false", spec, key, value);
  return value == "1" || value == "true";
}

// The model's options for `o`. With the batch engine on a GPU, the engine's thread holds the
// GPU's quiet lock while it decodes and steps aside between two steps for a timed run (as the
// trainer sets it up): its episodes' evaluations time on a quiet GPU.
LmOptions lm_options(const LocalPolicyOptions& o) {
  LmOptions lm;
  lm.device = o.device;
  lm.dtype = o.dtype;
  lm.batch_engine = o.batch_engine;
  if (const int gpu = gpu_of(o.model.string(), o.device); o.batch_engine && gpu >= 0)
    lm.engine_gate = sandbox::batch_engine_gate(gpu);
  return lm;
}

// A policy over a session that shares a model with its source's other policies; the model's
// owner (`base`) is a base class so that it outlives the LocalPolicy part, which borrows it.
struct SharedModel {
  std::shared_ptr<ChatSession> base;
};
class SharedModelPolicy : private SharedModel, public LocalPolicy {
 public:
  SharedModelPolicy(std::shared_ptr<ChatSession> base, const LocalPolicyOptions& options)
      : SharedModel{std::move(base)},
        LocalPolicy(ChatSession::share_with_model(*SharedModel::base, SharedModel::base->model()), options) {}
};

}  // namespace

std::string LocalPolicyOptions::to_spec() const {
  std::string s = fmt::format("local:{}?temperature={}&top_p={}&top_k={}&max_new_tokens={}&seed={}&device={}&dtype={}",
                              model.string(), temperature, top_p, top_k, max_new_tokens, seed, device, dtype);
  if (enable_thinking) s += *enable_thinking ? "&thinking=1" : "&thinking=0";
  if (batch_engine) s += "&batch_engine=1";
  return s;
}

LocalPolicyOptions parse_local_policy_spec(const std::string& spec) {
  CA_CHECK(spec.rfind("local:", 0) == 0, "not a local policy spec: '{}'; expected local:PATH[?key=value&...]", spec);
  const std::string rest = spec.substr(6);
  const size_t q = rest.find('?');
  LocalPolicyOptions o;
  o.model = rest.substr(0, q);
  CA_CHECK(!o.model.empty(), "policy '{}': no model; expected local:PATH[?key=value&...] with PATH a Hugging Face "
           "folder or a .gguf file, e.g. local:models/SmolLM2-135M-Instruct.Q4_1.gguf?temperature=0", spec);
  if (q == std::string::npos) return o;
  const std::string query = rest.substr(q + 1);
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string item = query.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    CA_CHECK(eq != std::string::npos && eq > 0, "policy '{}': '{}' is not key=value (keys: {})", spec, item, kKeys);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "temperature") {
      o.temperature = parse_double(spec, key, value);
      CA_CHECK(o.temperature >= 0, "policy '{}': temperature={} must not be negative (0 is greedy)", spec, value);
    } else if (key == "top_p") {
      o.top_p = parse_double(spec, key, value);
      CA_CHECK(o.top_p > 0 && o.top_p <= 1, "policy '{}': top_p={} must be in (0, 1]", spec, value);
    } else if (key == "top_k") {
      o.top_k = parse_int<int64_t>(spec, key, value);
      CA_CHECK(o.top_k >= 0, "policy '{}': top_k={} must not be negative (0 turns it off)", spec, value);
    } else if (key == "max_new_tokens") {
      o.max_new_tokens = parse_int<int64_t>(spec, key, value);
      CA_CHECK(o.max_new_tokens >= 1, "policy '{}': max_new_tokens={} must be at least 1", spec, value);
    } else if (key == "seed") {
      o.seed = parse_int<uint64_t>(spec, key, value);
    } else if (key == "device") {
      (void)gpu_of(spec, value);
      o.device = value;
    } else if (key == "dtype") {
      CA_CHECK(value == "float32" || value == "bfloat16", "policy '{}': dtype={}; use float32 or bfloat16", spec, value);
      o.dtype = value;
    } else if (key == "thinking") {
      o.enable_thinking = parse_flag(spec, key, value);
    } else if (key == "batch_engine") {
      o.batch_engine = parse_flag(spec, key, value);
    } else {
      CA_FAIL("policy '{}': unknown key '{}' (keys: {})", spec, key, kKeys);
    }
  }
  return o;
}

ojson template_messages(const std::vector<agent::ChatMessage>& messages) {
  ojson out = ojson::array();
  for (const auto& m : messages) {
    ojson j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const auto& c : m.tool_calls) {
        // Arguments as an object: the form the model writes them in, which every template renders
        // the same (Qwen3's would write a JSON string verbatim, quoted).
        ojson args = ojson::parse(c.arguments.dump());
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    out.push_back(std::move(j));
  }
  return out;
}

ojson template_tools(const nlohmann::json& tools) {
  if (tools.is_null()) return ojson::array();
  CA_CHECK(tools.is_array(), "the tool schemas must be an array of OpenAI function tools, got {}", tools.dump().substr(0, 200));
  return ojson::parse(tools.dump());
}

LocalPolicy::LocalPolicy(LocalPolicyOptions options) : options_(std::move(options)) {
  session_ = ChatSession::open(options_.model, lm_options(options_));
  options_.batch_engine = session_->model().options().batch_engine;  // off where the model cannot have it
}

LocalPolicy::LocalPolicy(std::unique_ptr<ChatSession> session, LocalPolicyOptions options)
    : options_(std::move(options)), session_(std::move(session)) {
  CA_CHECK(session_ != nullptr, "local policy: no chat session given");
  options_.model = session_->path();
  options_.device = session_->model().options().device;
  options_.dtype = session_->model().options().dtype;
  options_.batch_engine = session_->model().options().batch_engine;
}

LocalPolicy::LocalPolicy(std::unique_ptr<ChatSession> session, LocalPolicyOptions options,
                         std::unique_ptr<agent::Policy> teacher)
    : LocalPolicy(std::move(session), std::move(options)) {
  CA_CHECK(teacher != nullptr, "local policy: teacher forcing needs a teacher policy");
  teacher_ = std::move(teacher);
}

ChatRequestOptions LocalPolicy::request_options(uint64_t call) const {
  ChatRequestOptions r;
  r.sampling.temperature = options_.temperature;
  r.sampling.top_p = options_.top_p;
  r.sampling.top_k = options_.top_k;
  r.sampling.max_new_tokens = options_.max_new_tokens;
  r.sampling.seed = options_.seed + call;
  r.chat.enable_thinking = options_.enable_thinking;
  return r;
}

void LocalPolicy::reset_chain() {
  chain_ids_.clear();
  chain_text_.clear();
  chain_first_message_.clear();
  chain_messages_ = 0;
}

std::vector<int64_t> LocalPolicy::prompt_ids(const agent::PolicyRequest& request, const std::string& text,
                                             bool* extends) const {
  *extends = false;
  const bool same_conversation = !chain_ids_.empty() && request.messages.size() > chain_messages_ &&
                                 request.messages.front().to_json().dump() == chain_first_message_;
  if (!same_conversation || text.size() < chain_text_.size() || text.compare(0, chain_text_.size(), chain_text_) != 0)
    return session_->encode_prompt(text);
  // Specials in the suffix (the template's "<|im_start|>") become their ids, as in encode_prompt;
  // no BOS: the sequence already has its start.
  const std::vector<int32_t> suffix = session_->tokenizer().encode(std::string_view(text).substr(chain_text_.size()));
  std::vector<int64_t> ids = chain_ids_;
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  *extends = true;
  return ids;
}

void LocalPolicy::keep_chain(const agent::PolicyRequest& request, std::string text, const std::vector<int64_t>& prompt,
                             const std::vector<int64_t>& completion) {
  chain_ids_ = prompt;
  chain_ids_.insert(chain_ids_.end(), completion.begin(), completion.end());
  chain_text_ = std::move(text) + decode_with_specials(session_->tokenizer(), completion);
  chain_first_message_ = request.messages.empty() ? "" : request.messages.front().to_json().dump();
  chain_messages_ = request.messages.size();
}

agent::PolicyReply LocalPolicy::teacher_reply(const agent::PolicyRequest& request, const std::string& text) {
  const agent::PolicyReply taught = teacher_->complete(request);  // its errors end the episode as policy_error
  // The reply as text the actor must learn to write: structured calls become <tool_call> blocks.
  std::string reply_text = taught.text;
  if (!taught.tool_calls.empty()) {
    const std::string blocks = agent::render_hermes_tool_calls(taught.tool_calls);
    reply_text += (reply_text.empty() || blocks.empty() ? "" : "\n") + blocks;
  }
  // The assistant turn as later prompts render it: the conversation with the reply parsed as the
  // agent loop parses it, minus the conversation without it and minus the generation prompt.
  const std::string& eot = session_->chat_template().end_of_turn();
  std::string completion_text = reply_text + eot;
  if (!request.tools.is_null() && !request.tools.empty()) {
    const agent::ParsedReply parsed = agent::parse_hermes_tool_calls(reply_text);
    std::vector<agent::ChatMessage> with = request.messages;
    with.push_back({"assistant", parsed.content, parsed.calls, "", ""});
    const ChatOptions closed{.add_generation_prompt = false, .enable_thinking = options_.enable_thinking};
    const ojson tools = template_tools(request.tools);
    const std::string before = session_->render(template_messages(request.messages), tools, closed);
    const std::string after = session_->render(template_messages(with), tools, closed);
    if (after.compare(0, before.size(), before) == 0 && text.compare(0, before.size(), before) == 0) {
      const std::string head = text.substr(before.size());  // "<|im_start|>assistant\n"
      const std::string turn = after.substr(before.size());
      const size_t end = turn.rfind(eot);
      if (turn.compare(0, head.size(), head) == 0 && end != std::string::npos && end >= head.size())
        completion_text = turn.substr(head.size(), end + eot.size() - head.size());
    }
  }
  bool extends = false;
  std::vector<int64_t> prompt = prompt_ids(request, text, &extends);
  const std::vector<int32_t> encoded = session_->tokenizer().encode(completion_text);
  std::vector<int64_t> completion(encoded.begin(), encoded.end());
  // A demonstration the actor could not write itself teaches nothing it can use: a reply longer
  // than it may sample fails (policy_error); a turn past its context ends the episode where a
  // sampled one would end (context_full).
  const int64_t context = session_->model().config().max_position_embeddings;
  CA_CHECK(static_cast<int64_t>(completion.size()) <= options_.max_new_tokens,
           "the teacher's reply is {} tokens, more than the {} the actor may sample (max_new_tokens)",
           completion.size(), options_.max_new_tokens);
  if (static_cast<int64_t>(prompt.size() + completion.size()) > context)
    throw ContextFullError(fmt::format("the teacher's turn ends at token {} but the model's context is {}",
                                       prompt.size() + completion.size(), context));
  keep_chain(request, text, prompt, completion);

  agent::PolicyReply reply;
  reply.text = std::move(reply_text);
  reply.finish_reason = taught.tool_calls.empty() ? taught.finish_reason : "tool_calls";
  reply.prompt_tokens = static_cast<int>(prompt.size());
  reply.completion_tokens = static_cast<int>(completion.size());
  reply.completion_logprobs.assign(completion.size(), 0.0f);
  reply.prompt_token_ids = std::move(prompt);
  reply.completion_token_ids = std::move(completion);
  reply.prompt_extends_previous = extends;
  reply.teacher_forced = true;
  return reply;
}

bool LocalPolicy::holds_quiet_lock_itself() const {
  return session_->model().options().engine_gate != nullptr;
}

int64_t LocalPolicy::context_tokens() const { return session_->model().config().max_position_embeddings; }

agent::PolicyReply LocalPolicy::complete(const agent::PolicyRequest& request) {
  ChatRequestOptions opts = request_options(calls_++);
  opts.between_steps = request.between_steps;
  ChatReply chat;
  std::string text;
  bool extends = false;
  try {
    text = session_->render(template_messages(request.messages), template_tools(request.tools), opts.chat);
    if (teacher_) return teacher_reply(request, text);
    chat = session_->chat_from_ids(prompt_ids(request, text, &extends), opts);
  } catch (const Error& e) {
    reset_chain();
    const std::string message = fmt::format("{} {}: {}", teacher_ ? "teacher" : "local policy",
                                            teacher_ ? teacher_->name() : options_.model.string(), e.what());
    if (dynamic_cast<const ContextFullError*>(&e)) throw ContextFullError(message);
    throw Error(message);
  }
  // Keep what the model saw and sampled, and the text it stands for, for the next turn.
  keep_chain(request, std::move(text), chat.prompt_token_ids, chat.completion_token_ids);

  agent::PolicyReply reply;
  reply.prompt_extends_previous = extends;
  reply.text = std::move(chat.text);
  reply.finish_reason = chat.finish_reason;
  reply.prompt_tokens = static_cast<int>(chat.prompt_tokens);
  reply.completion_tokens = static_cast<int>(chat.completion_tokens);
  reply.prompt_token_ids = std::move(chat.prompt_token_ids);
  reply.completion_token_ids = std::move(chat.completion_token_ids);
  reply.completion_logprobs = std::move(chat.completion_logprobs);
  return reply;
}

void register_local_policy() {
  agent::register_policy_factory(
      "local:",
      [](const std::string& rest) -> std::unique_ptr<agent::Policy> {
        return std::make_unique<LocalPolicy>(parse_local_policy_spec("local:" + rest));
      },
      "local:MODEL[?temperature=T&top_p=P&top_k=K&max_new_tokens=N&seed=S&device=D&dtype=DT&thinking=0|1"
      "&batch_engine=0|1] (the in-process libtorch model: a Hugging Face folder or a .gguf file)",
      [](const std::string& rest) {
        const LocalPolicyOptions o = parse_local_policy_spec("local:" + rest);
        CA_CHECK(std::filesystem::exists(o.model), "policy 'local:{}': no model at {}: give a Hugging Face folder or a "
                 ".gguf file (scripts/setup.sh fetches models/SmolLM2-135M-Instruct.Q4_1.gguf)", rest, o.model.string());
      },
      // Side by side (eval's episodes on one GPU): the model loaded once, a session over it per policy.
      [](const std::string& rest) -> agent::PolicySource {
        LocalPolicyOptions o = parse_local_policy_spec("local:" + rest);
        std::shared_ptr<ChatSession> base = ChatSession::open(o.model, lm_options(o));
        return [base, o] { return std::make_unique<SharedModelPolicy>(base, o); };
      });
}

}  // namespace cuda_agent::serve
