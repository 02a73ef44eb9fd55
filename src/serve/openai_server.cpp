#include "cuda_agent/serve/openai_server.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"
#include "http_server.h"

namespace cuda_agent::serve {

// The policy component's types, used throughout this file.
using lm::SamplingOptions;

namespace {

using ojson = nlohmann::ordered_json;

std::atomic<bool> g_stop{false};

void on_stop_signal(int) { g_stop.store(true); }

// A request field the server cannot use: answered with 400 and `param` naming the field.
struct BadRequest {
  std::string param;
  std::string message;
};

struct ChatCall {
  ojson messages = ojson::array();
  ojson tools = ojson::array();
  ChatRequestOptions options;
  bool stream = false;
  bool include_usage = false;
};

std::string type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw BadRequest{param, message}; }

double number_field(const ojson& body, const char* key, double lo, double hi, double fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const ojson& v = body[key];
  if (!v.is_number()) bad(key, fmt::format("'{}' must be a number, got {}", key, type_name(v)));
  double x = v.get<double>();
  if (x < lo || x > hi) bad(key, fmt::format("'{}' is {}; it must be between {} and {}", key, x, lo, hi));
  return x;
}

// Integers may come as 24.0 from some clients; a fractional value is refused.
std::optional<int64_t> integer_field(const ojson& body, const char* key, int64_t lo) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const ojson& v = body[key];
  if (!v.is_number() || (v.is_number_float() && v.get<double>() != static_cast<double>(static_cast<int64_t>(v.get<double>()))))
    bad(key, fmt::format("'{}' must be an integer, got {}", key, v.is_number() ? v.dump() : type_name(v)));
  int64_t x = v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
  if (x < lo) bad(key, fmt::format("'{}' is {}; it must be at least {}", key, x, lo));
  return x;
}

ojson message_content(const ojson& content, const std::string& where) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) bad(where, fmt::format("'{}' must be a string, an array of text parts or null, got {}", where, type_name(content)));
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string pw = fmt::format("{}[{}]", where, j);
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(pw, fmt::format("'{}' must be {{\"type\": \"text\", \"text\": ...}}: this server takes text only", pw));
    text += part["text"].get<std::string>();
  }
  return text;
}

ChatCall parse_chat_call(const std::string& text, const ServeOptions& serve) {
  ojson body = ojson::parse(text, nullptr, false);
  if (body.is_discarded()) bad("", "the request body is not valid JSON");
  if (!body.is_object()) bad("", fmt::format("the request body must be a JSON object, got {}", type_name(body)));
  ChatCall call;
  if (body.contains("model") && !body["model"].is_string() && !body["model"].is_null())
    bad("model", fmt::format("'model' must be a string, got {}", type_name(body["model"])));

  if (!body.contains("messages")) bad("messages", "'messages' is required: an array of chat messages");
  const ojson& msgs = body["messages"];
  if (!msgs.is_array()) bad("messages", fmt::format("'messages' must be an array, got {}", type_name(msgs)));
  if (msgs.empty()) bad("messages", "'messages' is empty: give at least one message");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(where, fmt::format("'{}' must be an object, got {}", where, type_name(m)));
    if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role", fmt::format("'{}.role' must be a string", where));
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad(where + ".role", fmt::format("'{}.role' is '{}'; use system, user, assistant or tool", where, role));
    ojson out = {{"role", role == "developer" ? "system" : role}};
    out["content"] = message_content(m.value("content", ojson()), where + ".content");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) bad(where + ".tool_calls", fmt::format("'{}.tool_calls' must be an array", where));
      out["tool_calls"] = m["tool_calls"];
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content"})
      if (m.contains(key) && m[key].is_string()) out[key] = m[key];
    call.messages.push_back(std::move(out));
  }

  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", type_name(tools)));
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        bad(fmt::format("tools[{}]", i),
            fmt::format("'tools[{}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}", i));
    }
    call.tools = tools;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const ojson& tc = body["tool_choice"];
    if (!tc.is_string() && !tc.is_object()) bad("tool_choice", "'tool_choice' must be a string or an object");
    if (tc.is_string() && tc != "none" && tc != "auto" && tc != "required")
      bad("tool_choice", fmt::format("'tool_choice' is {}; use none, auto, required or a function", tc.dump()));
    if (tc == "none") call.tools = ojson::array();
  }

  SamplingOptions& s = call.options.sampling;
  s.temperature = number_field(body, "temperature", 0, 2, 1.0);
  s.top_p = number_field(body, "top_p", 1e-9, 1, 1.0);
  s.top_k = integer_field(body, "top_k", 0).value_or(0);
  auto max_tokens = integer_field(body, "max_completion_tokens", 1);
  if (!max_tokens) max_tokens = integer_field(body, "max_tokens", 1);
  s.max_new_tokens = max_tokens.value_or(serve.default_max_tokens);
  if (auto seed = integer_field(body, "seed", INT64_MIN)) s.seed = static_cast<uint64_t>(*seed);
  if (auto n = integer_field(body, "n", 1); n && *n != 1) bad("n", "'n' must be 1: this server returns one choice");

  if (body.contains("stop") && !body["stop"].is_null()) {
    const ojson& st = body["stop"];
    if (st.is_string()) {
      call.options.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (const auto& x : st) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        call.options.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(st)));
    }
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) bad("stream", fmt::format("'stream' must be a boolean, got {}", type_name(body["stream"])));
    call.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object())
    call.include_usage = body["stream_options"].value("include_usage", false);
  if (!call.tools.empty()) call.options.hold_back.push_back("<tool_call>");
  return call;
}

ojson tool_calls_json(const std::vector<agent::ToolCall>& calls, bool with_index) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c;
    if (with_index) c["index"] = i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}};
    out.push_back(std::move(c));
  }
  return out;
}

std::string new_completion_id() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  return fmt::format("chatcmpl-{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

class Server {
 public:
  Server(ChatSession& session, const ServeOptions& options) : session_(session), options_(options) {
    name_ = options.model_name.empty() ? session.path().filename().string() : options.model_name;
  }

  void handle(const serve::HttpRequest& req, serve::HttpReply& reply) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string note;
    route(req, reply, note);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CA_LOG_INFO("serve", "{} {} {} -> {} in {:.2f} s{}", req.peer, req.method, req.target, reply.status(), secs, note);
  }

 private:
  void error(serve::HttpReply& reply, int status, const std::string& message, const std::string& param,
             std::string& note) {
    reply.respond(status, serve::openai_error_body(message, serve::error_type_for(status), param));
    note = " (" + message + ")";
  }

  void route(const serve::HttpRequest& req, serve::HttpReply& reply, std::string& note) {
    const bool get = req.method == "GET", post = req.method == "POST";
    if (req.path == "/health" || req.path == "/v1/models" || req.path == "/v1/models/" + name_) {
      if (!get) return error(reply, 405, fmt::format("{} takes GET, not {}", req.path, req.method), "", note);
      ojson model = {{"id", name_}, {"object", "model"}, {"created", started_}, {"owned_by", "cuda-agent"}};
      if (req.path == "/health") reply.respond(200, ojson{{"status", "ok"}, {"model", name_}}.dump());
      else if (req.path == "/v1/models") reply.respond(200, ojson{{"object", "list"}, {"data", {model}}}.dump());
      else reply.respond(200, model.dump());
      return;
    }
    if (req.path == "/v1/chat/completions") {
      if (!post) return error(reply, 405, fmt::format("{} takes POST, not {}", req.path, req.method), "", note);
      try {
        ChatCall call = parse_chat_call(req.body, options_);
        std::string prompt;
        try {
          prompt = session_.render(call.messages, call.tools, call.options.chat);
        } catch (const Error& e) {
          bad("messages", e.what());
        }
        chat(std::move(call), prompt, reply, note);
      } catch (const BadRequest& b) {
        error(reply, 400, b.message, b.param, note);
      }
      return;
    }
    error(reply, 404, fmt::format("no endpoint {} {}: this server has GET /health, GET /v1/models and POST "
                                  "/v1/chat/completions", req.method, req.path), "", note);
  }

  void chat(ChatCall call, const std::string& prompt, serve::HttpReply& reply, std::string& note) {
    const std::string id = new_completion_id();
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    auto chunk = [&](ojson delta, ojson finish) {
      ojson c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", name_}};
      c["choices"] = ojson::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                    {"finish_reason", std::move(finish)}}});
      return "data: " + c.dump() + "\n\n";
    };

    std::vector<int64_t> ids = session_.encode_prompt(prompt);
    const int64_t context = session_.model().config().max_position_embeddings;
    if (static_cast<int64_t>(ids.size()) >= context)
      bad("messages", fmt::format("the conversation is {} tokens; the model's context is {}", ids.size(), context));

    std::string streamed;
    TextDeltaFn on_delta = [&](const std::string& d) {
      if (g_stop.load()) return false;
      if (!call.stream) return true;
      streamed += d;
      return reply.send(chunk({{"content", d}}, nullptr));
    };
    std::unique_lock<std::mutex> lock(model_mutex_);
    if (call.stream) {
      reply.begin_stream(200, "text/event-stream");
      reply.send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
    }
    ChatReply r = session_.chat(call.messages, call.tools, call.options, on_delta);
    lock.unlock();
    note = fmt::format(" prompt {} + completion {} tokens, {}{}", r.prompt_tokens, r.completion_tokens,
                       r.finish_reason, call.stream ? ", streamed" : "");
    ojson usage = {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens},
                   {"total_tokens", r.prompt_tokens + r.completion_tokens}};
    if (call.stream) {
      // Text from "<tool_call>" on was held back: send what the content still lacks (text after
      // the calls, or a block that was not a valid call and so stays content).
      const std::string& content = r.tool_calls.empty() ? r.text : r.content;
      if (content.size() > streamed.size() && content.compare(0, streamed.size(), streamed) == 0)
        reply.send(chunk({{"content", content.substr(streamed.size())}}, nullptr));
      if (!r.tool_calls.empty()) reply.send(chunk({{"tool_calls", tool_calls_json(r.tool_calls, true)}}, nullptr));
      reply.send(chunk(ojson::object(), r.finish_reason));
      if (call.include_usage) {
        ojson c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", name_},
                   {"choices", ojson::array()}, {"usage", usage}};
        reply.send("data: " + c.dump() + "\n\n");
      }
      reply.send("data: [DONE]\n\n");
      return;
    }
    ojson message = {{"role", "assistant"}};
    if (r.tool_calls.empty()) {
      message["content"] = r.text;
    } else {
      message["content"] = r.content.empty() ? ojson() : ojson(r.content);
      message["tool_calls"] = tool_calls_json(r.tool_calls, false);
    }
    ojson out = {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", name_}};
    out["choices"] = ojson::array({{{"index", 0}, {"message", message}, {"logprobs", nullptr},
                                    {"finish_reason", r.finish_reason}}});
    out["usage"] = usage;
    reply.respond(200, out.dump());
  }

  ChatSession& session_;
  ServeOptions options_;
  std::string name_;
  int64_t started_ = static_cast<int64_t>(std::time(nullptr));
  std::mutex model_mutex_;
};

}  // namespace

void run_openai_server(ChatSession& session, const ServeOptions& options) {
  Server server(session, options);
  g_stop.store(false);
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  serve::HttpServerOptions http;
  http.host = options.host;
  http.port = options.port;
  http.max_body_bytes = options.max_body_bytes;
  try {
    serve::serve_http(
        http, [&](const serve::HttpRequest& req, serve::HttpReply& reply) { server.handle(req, reply); }, g_stop,
        [&](int port) {
          CA_LOG_INFO("serve", "serving {} on http://{}:{}/v1 (Ctrl-C stops)", session.path().string(), options.host, port);
        });
  } catch (...) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    throw;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  CA_LOG_INFO("serve", "stopped");
}

}  // namespace cuda_agent::serve
