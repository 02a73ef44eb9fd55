#include "cuda_agent/serve/chat_session.h"

#include <algorithm>
#include <chrono>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/policy/weights.h"

namespace fs = std::filesystem;

namespace cuda_agent::serve {

// The policy component's types, used throughout this file.
using lm::Generation;
using lm::LanguageModel;
using lm::LmOptions;
using lm::load_language_model;
using lm::SamplingOptions;
using policy::ChatOptions;
using policy::ChatTemplate;
using policy::Family;
using policy::ModelConfig;
using policy::open_gguf;
using policy::Tokenizer;

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence starting at s[i]: n > 0 for a complete valid character, 0 when the
// bytes so far are a valid but incomplete start, -1 for an invalid byte at s[i].
int utf8_sequence(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) len = 2;
  else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  else return -1;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -1;
  }
  return len;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StreamDecoder::StreamDecoder(std::vector<std::string> stop, std::vector<std::string> hold_back)
    : stop_(std::move(stop)), hold_back_(std::move(hold_back)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
  std::erase_if(hold_back_, [](const std::string& s) { return s.empty(); });
}

std::string StreamDecoder::push(std::string_view bytes) {
  if (stopped_) return "";
  pending_bytes_.append(bytes);
  const size_t old_size = text_.size();
  size_t i = 0;
  while (i < pending_bytes_.size()) {
    int n = utf8_sequence(pending_bytes_, i);
    if (n == 0) break;  // wait for the rest of the character
    if (n < 0) {
      text_.append(kReplacement);
      ++i;
    } else {
      text_.append(pending_bytes_, i, n);
      i += n;
    }
  }
  pending_bytes_.erase(0, i);
  // A stop string may straddle the old end of the text.
  size_t cut = std::string::npos;
  for (const auto& s : stop_) {
    size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
    cut = std::min(cut, text_.find(s, from));
  }
  if (cut != std::string::npos) {
    text_.resize(cut);
    pending_bytes_.clear();
    std::string out = release(true);
    stopped_ = true;
    return out;
  }
  return release(false);
}

std::string StreamDecoder::finish() {
  if (stopped_) return "";
  for (size_t k = 0; k < pending_bytes_.size(); ++k) text_.append(kReplacement);
  pending_bytes_.clear();
  return release(true);
}

std::string StreamDecoder::release(bool final) {
  if (holding_) return "";
  size_t hold = std::string::npos;
  for (const auto& h : hold_back_) hold = std::min(hold, text_.find(h, emitted_));
  if (hold != std::string::npos) {
    holding_ = true;
    std::string out = text_.substr(emitted_, hold - emitted_);
    emitted_ = hold;
    return out;
  }
  size_t safe = text_.size();
  if (!final) {
    // Keep back a tail that could be the start of a stop string or a held-back marker.
    auto keep_prefix_of = [&](const std::string& s) {
      for (size_t k = std::min(s.size() - 1, text_.size() - emitted_); k > 0; --k)
        if (ends_with(text_, std::string_view(s).substr(0, k))) {
          safe = std::min(safe, text_.size() - k);
          return;
        }
    };
    for (const auto& s : stop_) keep_prefix_of(s);
    for (const auto& s : hold_back_) keep_prefix_of(s);
  }
  std::string out = text_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return out;
}

std::string decode_with_specials(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::string out;
  StreamDecoder decoder({}, {});
  for (int64_t id : ids) {
    const auto id32 = static_cast<int32_t>(id);
    if (!tokenizer.is_special(id32)) {
      decoder.push(tokenizer.token_to_piece(id32));
      continue;
    }
    // ChatSession::generate never feeds a special token to its decoder: close the text before it.
    decoder.finish();
    out += decoder.text();
    out += tokenizer.token_to_piece(id32);
    decoder = StreamDecoder({}, {});
  }
  decoder.finish();
  return out + decoder.text();
}

void extract_tool_calls(ChatReply& reply) {
  agent::ParsedReply parsed = agent::parse_hermes_tool_calls(reply.text);
  reply.tool_call_errors = parsed.errors;
  if (parsed.calls.empty()) {
    reply.content = reply.text;
    reply.tool_calls.clear();
    return;
  }
  reply.content = parsed.content;
  reply.tool_calls = std::move(parsed.calls);
  reply.finish_reason = "tool_calls";
}

std::unique_ptr<ChatSession> ChatSession::open(const fs::path& model, const LmOptions& options) {
  std::unique_ptr<ChatSession> s(new ChatSession());
  s->path_ = model;
  s->load_tokenizer();
  s->owned_model_ = load_language_model(model, options);
  s->model_ = s->owned_model_.get();
  s->attach_model();
  return s;
}

std::unique_ptr<ChatSession> ChatSession::open_with_model(const fs::path& model_path, LanguageModel& model) {
  std::unique_ptr<ChatSession> s(new ChatSession());
  s->path_ = model_path;
  s->load_tokenizer();
  s->model_ = &model;
  s->attach_model();
  return s;
}

std::unique_ptr<ChatSession> ChatSession::share_with_model(const ChatSession& like, LanguageModel& model) {
  std::unique_ptr<ChatSession> s(new ChatSession());
  s->path_ = like.path_;
  s->tokenizer_ = like.tokenizer_;
  s->model_ = &model;
  s->attach_model();
  return s;
}

void ChatSession::load_tokenizer() {
  CA_CHECK(fs::exists(path_), "model '{}' does not exist: pass a Hugging Face folder or a .gguf file", path_.string());
  if (fs::is_directory(path_)) {
    const fs::path tj = path_ / "tokenizer.json";
    CA_CHECK(fs::exists(tj), "model folder '{}' has no tokenizer.json: copy the model's tokenizer files there",
             path_.string());
    tokenizer_ = std::make_shared<const Tokenizer>(Tokenizer::from_tokenizer_json(tj));
  } else {
    auto file = open_gguf(path_);
    tokenizer_ = std::make_shared<const Tokenizer>(Tokenizer::from_gguf_metadata(file->metadata(), path_.string()));
  }
}

void ChatSession::attach_model() {
  CA_ASSERT(model_ != nullptr && tokenizer_ != nullptr, "attach_model() before the tokenizer and the model are set");
  const ModelConfig& config = model_->config();
  // A larger model vocabulary is fine (padded embeddings); a smaller one would sample ids the
  // tokenizer cannot decode, or miss ids the template encodes.
  CA_CHECK(tokenizer_->vocab_size() <= config.vocab_size,
           "model '{}': the tokenizer has {} ids but the model's vocabulary has {}: the tokenizer and the weights "
           "must come from the same model", path_.string(), tokenizer_->vocab_size(), config.vocab_size);

  const std::string& jinja = tokenizer_->chat_template();
  if (!jinja.empty()) {
    try {
      template_ = std::make_unique<ChatTemplate>(ChatTemplate::from_template(jinja));
    } catch (const Error& e) {
      CA_LOG_WARN("serve", "{}: chat template not recognized ({}); using the {} family's", path_.string(), e.what(),
                  family_name(config.family));
    }
  }
  if (!template_) {
    const Family f = config.family;
    template_ = std::make_unique<ChatTemplate>(
        ChatTemplate::for_family(f == Family::kQwen3 ? "qwen3" : f == Family::kQwen2 ? "qwen2.5" : "chatml"));
  }

  auto add_stop = [&](int64_t id) {
    if (id >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) stop_ids_.push_back(id);
  };
  for (int64_t id : config.eos_token_ids) add_stop(id);
  add_stop(tokenizer_->eos_id());
  add_stop(tokenizer_->token_id(template_->end_of_turn()));
  CA_CHECK(!stop_ids_.empty(), "model '{}' names no end-of-sequence token and its vocabulary has no '{}'",
           path_.string(), template_->end_of_turn());
}

std::string ChatSession::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                const ChatOptions& options) const {
  return template_->render(messages, tools.is_null() ? nlohmann::ordered_json::array() : tools, options);
}

std::vector<int64_t> ChatSession::encode_prompt(const std::string& text) const {
  std::vector<int64_t> ids;
  const int32_t bos = tokenizer_->bos_id();
  std::vector<int32_t> body = tokenizer_->encode(text);
  if (tokenizer_->add_bos() && bos >= 0 && (body.empty() || body.front() != bos)) ids.push_back(bos);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

ChatReply ChatSession::chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                            const ChatRequestOptions& options, const TextDeltaFn& on_text_delta) {
  ChatReply reply = generate(encode_prompt(render(messages, tools, options.chat)), options, on_text_delta);
  extract_tool_calls(reply);
  return reply;
}

ChatReply ChatSession::chat_from_ids(std::vector<int64_t> prompt_ids, const ChatRequestOptions& options,
                                     const TextDeltaFn& on_text_delta) {
  ChatReply reply = generate(std::move(prompt_ids), options, on_text_delta);
  extract_tool_calls(reply);
  return reply;
}

ChatReply ChatSession::complete(const std::string& prompt, const ChatRequestOptions& options,
                                const TextDeltaFn& on_text_delta) {
  ChatReply reply = generate(encode_prompt(prompt), options, on_text_delta);
  reply.content = reply.text;
  return reply;
}

ChatReply ChatSession::generate(std::vector<int64_t> prompt, const ChatRequestOptions& options,
                                const TextDeltaFn& on_text_delta) {
  const int64_t context = model_->config().max_position_embeddings;
  CA_CHECK(!prompt.empty(), "the prompt is empty: give some text to continue");
  if (static_cast<int64_t>(prompt.size()) >= context)
    throw ContextFullError(fmt::format("the prompt is {} tokens but the model's context is {}: shorten the conversation",
                                       prompt.size(), context));
  SamplingOptions s = options.sampling;
  CA_CHECK(s.max_new_tokens > 0, "max new tokens is {}: it must be at least 1", s.max_new_tokens);
  s.max_new_tokens = std::min<int64_t>(s.max_new_tokens, context - static_cast<int64_t>(prompt.size()));
  for (int64_t id : stop_ids_)
    if (std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), id) == s.stop_token_ids.end())
      s.stop_token_ids.push_back(id);
  if (s.temperature == 0) s.greedy = true;

  StreamDecoder decoder(options.stop, options.hold_back);
  bool caller_stopped = false;
  auto emit = [&](const std::string& delta) {
    if (!delta.empty() && on_text_delta && !caller_stopped && !on_text_delta(delta)) caller_stopped = true;
  };
  // The engine's thread runs on_token for every caller's rows: a pause there would stop them all.
  const bool pauses = options.between_steps && !model_->options().batch_engine;
  auto on_token = [&](size_t, int64_t token) {
    if (pauses) options.between_steps();
    const bool is_stop = std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) != s.stop_token_ids.end();
    if (is_stop || tokenizer_->is_special(static_cast<int32_t>(token))) return true;
    emit(decoder.push(tokenizer_->token_to_piece(static_cast<int32_t>(token))));
    return !caller_stopped && !decoder.stopped();
  };

  const auto t0 = std::chrono::steady_clock::now();
  Generation g = model_->generate({prompt}, s, on_token).at(0);
  emit(decoder.finish());
  ChatReply reply;
  reply.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  reply.text = decoder.text();
  reply.content = reply.text;
  reply.prompt_tokens = static_cast<int64_t>(prompt.size());
  reply.completion_tokens = static_cast<int64_t>(g.tokens.size());
  // Cut short by the caller (a server that is stopping, a client that left): "abort", as vLLM
  // reports it, not a natural "stop".
  reply.finish_reason = caller_stopped ? "abort" : g.finish_reason == "length" && !decoder.stopped() ? "length" : "stop";
  CA_ASSERT(g.logprobs.size() == g.tokens.size(), "generation returned {} log-probs for {} tokens", g.logprobs.size(),
            g.tokens.size());
  reply.prompt_token_ids = std::move(prompt);
  reply.completion_token_ids = std::move(g.tokens);
  reply.completion_logprobs = std::move(g.logprobs);
  return reply;
}

}  // namespace cuda_agent::serve
