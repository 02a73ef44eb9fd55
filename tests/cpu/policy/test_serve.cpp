// `cuda-agent generate` and `cuda-agent serve` with the real SmolLM2-135M-Instruct (skipped without
// it), plus the model-free parts of ChatSession: streaming decode and tool-call extraction.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/agent/openai_policy.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/serve/chat_session.h"

extern char** environ;

using namespace cuda_agent;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The model: $CUDA_AGENT_SMOLLM2_GGUF, else models/ in the source tree (scripts put it there).
std::string smollm2_path() {
  if (const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF"); env && *env && fs::exists(env)) return env;
  fs::path p = fs::path(CUDA_AGENT_SOURCE_DIR) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  return fs::exists(p) ? p.string() : "";
}

#define REQUIRE_SMOLLM2(path)                                                                                 \
  const std::string path = smollm2_path();                                                                    \
  if (path.empty())                                                                                           \
  GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found: set CUDA_AGENT_SMOLLM2_GGUF or put it in "     \
               << CUDA_AGENT_SOURCE_DIR << "/models/"

// SmolLM2 is small: OpenMP's fan-out over two shared, busy cores costs far more than it gains
// (13 s instead of 0.5 s for eight tokens), so the children get one thread unless the caller chose.
void one_torch_thread() { setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0); }

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct HttpResult {
  int status = 0;  // 0: no connection
  std::string headers, body;
};

// One raw HTTP/1.1 exchange; the server closes the connection after its reply.
HttpResult http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                const std::string& extra_headers = "") {
  HttpResult r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
  if (extra_headers.find("Content-Length") == std::string::npos)
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string data;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) data.append(buf, static_cast<size_t>(n));
  close(fd);
  size_t end = data.find("\r\n\r\n");
  if (data.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(data.substr(9, 3));
  r.headers = data.substr(0, end);
  r.body = data.substr(end + 4);
  return r;
}

json capital_request(bool stream) {
  return {{"model", "smollm2"},
          {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
          {"temperature", 0},
          {"max_tokens", 24},
          {"stream", stream}};
}

}  // namespace

// --- model-free ------------------------------------------------------------------------------

TEST(ServeStreamDecoder, HoldsSplitUtf8CharactersUntilComplete) {
  serve::StreamDecoder d({}, {});
  EXPECT_EQ(d.push("caf\xC3"), "caf");
  EXPECT_EQ(d.push("\xA9 \xE2"), "\xC3\xA9 ");  // "é "
  EXPECT_EQ(d.push("\x82"), "");
  EXPECT_EQ(d.push("\xAC!"), "\xE2\x82\xAC!");  // "€!"
  EXPECT_EQ(d.push("\xFF"), "\xEF\xBF\xBD");    // never valid: U+FFFD at once
  EXPECT_EQ(d.push("\xF0\x9F"), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // a character cut off by the end
  EXPECT_EQ(d.text(), "caf\xC3\xA9 \xE2\x82\xAC!\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(ServeStreamDecoder, StopStringsAcrossPiecesAreCutAndNeverEmitted) {
  serve::StreamDecoder d({"END"}, {});
  EXPECT_EQ(d.push("abcE"), "abc");  // "E" may start "END"
  EXPECT_EQ(d.push("x"), "Ex");      // it did not
  EXPECT_EQ(d.push("EN"), "");
  EXPECT_FALSE(d.stopped());
  EXPECT_EQ(d.push("Dtail"), "");
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.push("more"), "");
  EXPECT_EQ(d.finish(), "");
  EXPECT_EQ(d.text(), "abcEx");
}

TEST(ServeStreamDecoder, HoldBackKeepsToolCallsOutOfTheStream) {
  serve::StreamDecoder d({}, {"<tool_call>"});
  std::string out = d.push("Sure. <tool");
  out += d.push("_call>{\"name\": \"f\"}</tool_call>");
  out += d.finish();
  EXPECT_EQ(out, "Sure. ");
  EXPECT_EQ(d.text(), "Sure. <tool_call>{\"name\": \"f\"}</tool_call>");
  serve::StreamDecoder e({}, {"<tool_call>"});
  EXPECT_EQ(e.push("a <tool"), "a ");
  EXPECT_EQ(e.push("box>"), "<toolbox>");
}

TEST(ServeToolCalls, ExtractedFromTheModelText) {
  auto extracted = [](std::string text, std::string finish_reason) {
    serve::ChatReply reply;
    reply.text = std::move(text);
    reply.finish_reason = std::move(finish_reason);
    serve::extract_tool_calls(reply);
    return reply;
  };
  serve::ChatReply r = extracted(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "stop");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, json({{"city", "Paris"}}));
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.finish_reason, "tool_calls");

  serve::ChatReply plain = extracted("No tools needed. ", "length");
  EXPECT_TRUE(plain.tool_calls.empty());
  EXPECT_EQ(plain.content, "No tools needed. ");
  EXPECT_EQ(plain.finish_reason, "length");

  serve::ChatReply broken = extracted("<tool_call>{not json}</tool_call>", "stop");
  EXPECT_TRUE(broken.tool_calls.empty());
  EXPECT_EQ(broken.tool_call_errors.size(), 1u);
  EXPECT_EQ(broken.finish_reason, "stop");
}

// --- generate ----------------------------------------------------------------------------------

TEST(GenerateSmolLM2, CapitalOfFranceGreedy) {
  REQUIRE_SMOLLM2(model);
  one_torch_thread();
  TempDir dir("generate");
  SubprocessOptions o;
  o.argv = {CUDA_AGENT_BINARY, "generate", "--model", model, "--chat", "What is the capital of France?",
            "--temperature", "0", "--max-tokens", "32"};
  o.stdout_path = (dir.path() / "out.txt").string();
  o.stderr_path = (dir.path() / "err.txt").string();
  o.timeout_s = 120;
  SubprocessResult r = run_subprocess(o);
  const std::string out = read_file(dir.path() / "out.txt"), err = read_file(dir.path() / "err.txt");
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << err;
  std::cout << "[ SmolLM2  ] " << out << "[ timing   ] " << err;
  EXPECT_NE(out.find("Paris"), std::string::npos) << out;
  EXPECT_LT(out.size(), 300u);
  EXPECT_NE(err.find("tokens/s"), std::string::npos) << err;
}

TEST(GenerateSmolLM2, RefusesTwoPromptKinds) {
  REQUIRE_SMOLLM2(model);
  TempDir dir("generate");
  SubprocessOptions o;
  o.argv = {CUDA_AGENT_BINARY, "generate", "--model", model, "--chat", "a", "--prompt", "b"};
  o.stderr_path = (dir.path() / "err.txt").string();
  SubprocessResult r = run_subprocess(o);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(read_file(dir.path() / "err.txt").find("exactly one of --prompt"), std::string::npos);
}

// --- serve -------------------------------------------------------------------------------------

class ServeSmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = smollm2_path();
    if (model_.empty()) return;
    one_torch_thread();
    log_ = (fs::temp_directory_path() / ("ca_serve_test_" + std::to_string(getpid()) + ".log")).string();
    port_ = free_port();
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {CUDA_AGENT_BINARY, "serve", "--model", model_, "--port", port, "--model-name", "smollm2"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 600 && pid_ > 0; ++i) {  // up to 60 s for the model to load
      if (http(port_, "GET", "/health").status == 200) return;
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    start_error_ = "the server did not come up; its log:\n" + (fs::exists(log_) ? read_file(log_) : "");
  }
  static void TearDownTestSuite() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 150 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "serve did not exit cleanly on SIGTERM; log:\n" << read_file(log_);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    std::error_code ec;
    fs::remove(log_, ec);
  }
  void SetUp() override {
    if (model_.empty())
      GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not found: set CUDA_AGENT_SMOLLM2_GGUF or put it in "
                   << CUDA_AGENT_SOURCE_DIR << "/models/";
    ASSERT_TRUE(start_error_.empty()) << start_error_;
  }
  static json post(const json& body, int expect_status = 200) {
    HttpResult r = http(port_, "POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, expect_status) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  static inline std::string model_, log_, start_error_;
  static inline int port_ = 0;
  static inline pid_t pid_ = -1;
};

TEST_F(ServeSmolLM2, HealthAndModels) {
  HttpResult h = http(port_, "GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json::parse(h.body)["status"], "ok");
  HttpResult m = http(port_, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  json models = json::parse(m.body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "smollm2");
}

TEST_F(ServeSmolLM2, NonStreamingReplyWithUsage) {
  json r = post(capital_request(false));
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r["object"], "chat.completion");
  const auto& choice = r["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  const std::string content = choice["message"]["content"].get<std::string>();
  EXPECT_FALSE(content.empty());
  EXPECT_NE(content.find("Paris"), std::string::npos) << content;
  EXPECT_TRUE(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length") << choice;
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 5);
  EXPECT_GT(r["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_LE(r["usage"]["completion_tokens"].get<int>(), 24);
  EXPECT_EQ(r["usage"]["total_tokens"].get<int>(),
            r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());
}

TEST_F(ServeSmolLM2, StreamedDeltasConcatenateToTheNonStreamedText) {
  json plain = post(capital_request(false));
  HttpResult s = http(port_, "POST", "/v1/chat/completions", capital_request(true).dump());
  ASSERT_EQ(s.status, 200);
  EXPECT_NE(s.headers.find("text/event-stream"), std::string::npos);
  std::string text, finish;
  bool first = true, done = false;
  size_t pos = 0;
  while (pos < s.body.size()) {
    size_t end = s.body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << "unterminated event: " << s.body.substr(pos);
    std::string event = s.body.substr(pos, end - pos);
    pos = end + 2;
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << event;
    ASSERT_FALSE(done) << "event after [DONE]: " << event;
    if (event == "data: [DONE]") {
      done = true;
      continue;
    }
    json chunk = json::parse(event.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& delta = chunk["choices"][0]["delta"];
    if (first) {
      EXPECT_EQ(delta["role"], "assistant");
    }
    first = false;
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, plain["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, plain["choices"][0]["finish_reason"].get<std::string>());
}

TEST_F(ServeSmolLM2, StopStringEndsTheReply) {
  json req = capital_request(false);
  req["stop"] = {"Paris"};
  json r = post(req);
  const std::string content = r["choices"][0]["message"]["content"];
  EXPECT_EQ(content.find("Paris"), std::string::npos) << content;
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  json full = post(capital_request(false));
  const std::string full_text = full["choices"][0]["message"]["content"];
  EXPECT_EQ(full_text.substr(0, content.size()), content);  // the same greedy text, cut before "Paris"
}

// SmolLM2's template knows no tools; a system prompt showing the format and a previous turn that
// called one (rendered in the Hermes form) are what this small model goes by. Greedy, it answers
// <tool_call>{"name": "Paris", "arguments": {"city": "Paris"}}</tool_call> (the wrong name: a
// 135M model), which must come back as a structured call, in both reply forms, with no
// <tool_call> text in the content.
TEST_F(ServeSmolLM2, ToolCallsComeBackStructured) {
  json tools = json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"},
                                           {"description", "Current weather in a city"},
                                           {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  json call = {{"id", "call_0"}, {"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Berlin"})"}}}};
  json messages = json::array(
      {{{"role", "system"},
        {"content", "You call tools by replying <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"
                    "</tool_call>. Tool: get_weather(city)."}},
       {{"role", "user"}, {"content", "Weather in Berlin?"}},
       {{"role", "assistant"}, {"content", ""}, {"tool_calls", {call}}},
       {{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", "12 C, rain"}},
       {{"role", "assistant"}, {"content", "It is 12 C and raining in Berlin."}},
       {{"role", "user"}, {"content", "Weather in Paris?"}}});
  json req = {{"messages", messages}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 40}};
  json r = post(req);
  const json& msg = r["choices"][0]["message"];
  std::cout << "[ tool run ] " << msg.dump() << "\n";
  ASSERT_TRUE(msg.contains("tool_calls")) << msg;
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  const json& tc = msg["tool_calls"][0];
  EXPECT_EQ(tc["type"], "function");
  EXPECT_FALSE(tc["id"].get<std::string>().empty());
  EXPECT_FALSE(tc["function"]["name"].get<std::string>().empty());
  EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_TRUE(msg["content"].is_null() || msg["content"].get<std::string>().find("<tool_call>") == std::string::npos)
      << msg;

  req["stream"] = true;
  HttpResult s = http(port_, "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.body.find("<tool_call>"), std::string::npos) << s.body;
  json streamed_calls;
  std::string finish;
  for (size_t pos = 0; (pos = s.body.find("data: {", pos)) != std::string::npos; ++pos) {
    json chunk = json::parse(s.body.substr(pos + 6, s.body.find("\n\n", pos) - pos - 6));
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("tool_calls")) streamed_calls = choice["delta"]["tool_calls"];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  ASSERT_EQ(streamed_calls.size(), 1u) << s.body;
  EXPECT_EQ(streamed_calls[0]["index"], 0);
  EXPECT_EQ(streamed_calls[0]["function"], tc["function"]);
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(ServeSmolLM2, BadRequestsNameTheField) {
  auto expect_error = [](const HttpResult& r, int status, const std::string& param, const std::string& words) {
    EXPECT_EQ(r.status, status) << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_NE(e["error"]["message"].get<std::string>().find(words), std::string::npos) << r.body;
    if (!param.empty()) {
      EXPECT_EQ(e["error"]["param"], param) << r.body;
    }
    EXPECT_EQ(e["error"]["type"], status < 500 ? "invalid_request_error" : "server_error");
  };
  expect_error(http(port_, "POST", "/v1/chat/completions", "{not json"), 400, "", "not valid JSON");
  expect_error(http(port_, "POST", "/v1/chat/completions", R"({"model": "x"})"), 400, "messages", "'messages'");
  expect_error(http(port_, "POST", "/v1/chat/completions", R"({"messages": "hi"})"), 400, "messages", "'messages'");
  json hot = capital_request(false);
  hot["temperature"] = "hot";
  expect_error(http(port_, "POST", "/v1/chat/completions", hot.dump()), 400, "temperature", "'temperature'");
  json big = capital_request(false);
  big["max_tokens"] = 0;
  expect_error(http(port_, "POST", "/v1/chat/completions", big.dump()), 400, "max_tokens", "'max_tokens'");
  json role = capital_request(false);
  role["messages"][0]["role"] = "wizard";
  expect_error(http(port_, "POST", "/v1/chat/completions", role.dump()), 400, "messages[0].role", "wizard");
  json stop = capital_request(false);
  stop["stop"] = 3;
  expect_error(http(port_, "POST", "/v1/chat/completions", stop.dump()), 400, "stop", "'stop'");
  expect_error(http(port_, "GET", "/v1/chat/completions"), 405, "", "takes POST");
  expect_error(http(port_, "POST", "/v1/models", "{}"), 405, "", "takes GET");
  expect_error(http(port_, "GET", "/v1/completions"), 404, "", "no endpoint");
  expect_error(http(port_, "POST", "/v1/chat/completions", "", "Content-Length: 100000000\r\n"), 413, "", "at most");
  // A negative or non-numeric length is a bad request, not a huge body.
  expect_error(http(port_, "POST", "/v1/chat/completions", "", "Content-Length: -5\r\n"), 400, "", "not a number of bytes");
  expect_error(http(port_, "POST", "/v1/chat/completions", "", "Content-Length: 12abc\r\n"), 400, "", "not a number of bytes");
  // The server is still healthy after all of that.
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
}

TEST_F(ServeSmolLM2, AgentOpenAiPolicyCompletesATurn) {
  agent::OpenAiOptions o = agent::parse_openai_spec("openai:smollm2@http://127.0.0.1:" + std::to_string(port_) + "/v1");
  o.temperature = 0;
  o.max_tokens = 24;
  o.max_retries = 0;
  o.timeout_s = 60;
  agent::OpenAiPolicy policy(o);
  agent::PolicyRequest req;
  req.messages = {{"system", "You are a helpful assistant.", {}, "", ""},
                  {"user", "What is the capital of France?", {}, "", ""}};
  agent::PolicyReply reply = policy.complete(req);
  EXPECT_FALSE(reply.text.empty());
  EXPECT_NE(reply.text.find("Paris"), std::string::npos) << reply.text;
  // The same request sent directly gives the same greedy text.
  json direct = post({{"messages", {{{"role", "system"}, {"content", "You are a helpful assistant."}},
                                    {{"role", "user"}, {"content", "What is the capital of France?"}}}},
                      {"temperature", 0},
                      {"max_tokens", 24}});
  EXPECT_EQ(reply.text, direct["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_GT(reply.prompt_tokens, 5);
  EXPECT_GT(reply.completion_tokens, 0);
  EXPECT_TRUE(reply.finish_reason == "stop" || reply.finish_reason == "length") << reply.finish_reason;
}
