// The OpenAI-compatible policy against a local HTTP server started by the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "cuda_agent/agent/openai_policy.h"
#include "cuda_agent/core/error.h"

using namespace cuda_agent;
using namespace cuda_agent::agent;

namespace {

// A one-thread HTTP/1.1 server on 127.0.0.1 that answers each request with the next scripted
// (status, body) and records what it received.
class FakeServer {
 public:
  explicit FakeServer(std::vector<std::pair<int, std::string>> script) : script_(std::move(script)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 8);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void serve() {
    size_t next = 0;
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string data;
      char buf[4096];
      size_t need = std::string::npos;
      while (true) {
        ssize_t n = read(c, buf, sizeof(buf));
        if (n <= 0) break;
        data.append(buf, n);
        size_t header_end = data.find("\r\n\r\n");
        if (header_end != std::string::npos && need == std::string::npos) {
          size_t cl = data.find("Content-Length: ");
          need = header_end + 4 + (cl == std::string::npos ? 0 : std::stoul(data.substr(cl + 16)));
        }
        if (need != std::string::npos && data.size() >= need) break;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(data);
      }
      auto [status, body] = next < script_.size() ? script_[next++] : std::make_pair(500, std::string("{}"));
      std::string response = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      (void)!write(c, response.data(), response.size());
      close(c);
    }
  }

  std::vector<std::pair<int, std::string>> script_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::string> requests_;
};

const char* kToolReply = R"({"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": "Let me look.",
  "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": "{\"file_path\": \"model.py\"}"}}]}}],
  "usage": {"prompt_tokens": 120, "completion_tokens": 17}})";

PolicyRequest small_request() {
  PolicyRequest r;
  r.messages = {{"system", "be brief", {}, "", ""}, {"user", "hi", {}, "", ""}};
  r.tools = nlohmann::json::array({{{"type", "function"}, {"function", {{"name", "Read"}, {"parameters", {{"type", "object"}}}}}}});
  return r;
}

}  // namespace

TEST(OpenAiPolicy, SpecParsing) {
  OpenAiOptions o = parse_openai_spec("openai:Qwen/Qwen2.5-7B@http://localhost:8000/v1/");
  EXPECT_EQ(o.model, "Qwen/Qwen2.5-7B");
  EXPECT_EQ(o.base_url, "http://localhost:8000/v1");
  EXPECT_THROW(parse_openai_spec("openai:model-without-url"), Error);
  EXPECT_THROW(parse_openai_spec("openai:m@ftp://x"), Error);
  EXPECT_THROW(make_policy("gemini:foo"), Error);
}

TEST(OpenAiPolicy, RetriesServerErrorsThenParsesToolCalls) {
  FakeServer server({{503, R"({"error": "overloaded"})"}, {200, kToolReply}});
  setenv("CUDA_AGENT_API_KEY", "sk-test-123", 1);
  OpenAiOptions o = parse_openai_spec("openai:my-model@" + server.url());
  o.backoff_s = 0.01;
  o.temperature = 0.6;
  OpenAiPolicy policy(o);
  PolicyReply reply = policy.complete(small_request());
  unsetenv("CUDA_AGENT_API_KEY");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "Read");
  EXPECT_EQ(reply.tool_calls[0].arguments["file_path"], "model.py");
  EXPECT_EQ(reply.text, "Let me look.");
  EXPECT_EQ(reply.finish_reason, "tool_calls");
  EXPECT_EQ(reply.prompt_tokens, 120);
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);  // the 503, then the retry
  EXPECT_NE(requests[1].find("POST /v1/chat/completions"), std::string::npos);
  EXPECT_NE(requests[1].find("Authorization: Bearer sk-test-123"), std::string::npos);
  auto body = nlohmann::json::parse(requests[1].substr(requests[1].find("\r\n\r\n") + 4));
  EXPECT_EQ(body["model"], "my-model");
  EXPECT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["tools"][0]["function"]["name"], "Read");
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.6);
}

TEST(OpenAiPolicy, ClientErrorsAreNotRetried) {
  FakeServer server({{400, R"({"error": {"message": "model not found"}})"}, {200, kToolReply}});
  OpenAiOptions o = parse_openai_spec("openai:nope@" + server.url());
  o.backoff_s = 0.01;
  OpenAiPolicy policy(o);
  try {
    policy.complete(small_request());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 400"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model not found"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(OpenAiPolicy, UnreachableServerFailsAfterRetries) {
  OpenAiOptions o = parse_openai_spec("openai:m@http://127.0.0.1:1/v1");
  o.backoff_s = 0.01;
  o.max_retries = 2;
  o.timeout_s = 5;
  OpenAiPolicy policy(o);
  try {
    policy.complete(small_request());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("after 3 attempts"), std::string::npos) << e.what();
  }
}

TEST(OpenAiPolicy, ResponseParsing) {
  PolicyReply text = OpenAiPolicy::parse_response(
      R"({"choices": [{"finish_reason": "stop", "message": {"content": "<tool_call>{\"name\": \"Bash\", \"arguments\": {}}</tool_call>"}}]})");
  EXPECT_TRUE(text.tool_calls.empty());  // text calls are left for the loop's Hermes parser
  EXPECT_NE(text.text.find("<tool_call>"), std::string::npos);
  EXPECT_THROW(OpenAiPolicy::parse_response("not json"), Error);
  EXPECT_THROW(OpenAiPolicy::parse_response(R"({"choices": []})"), Error);
}
