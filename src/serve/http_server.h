// A small HTTP/1.1 server on POSIX sockets for `cuda-agent serve`: one thread per connection,
// request bodies by Content-Length, one request per connection (the reply says Connection:
// close). Errors it detects itself (malformed request, oversized headers or body) are answered
// with OpenAI-shaped JSON errors, since the only server built on it speaks that API.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace cuda_agent::serve {

struct HttpRequest {
  std::string method, target, path;       // path: target without the query string
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;  // "127.0.0.1:51234"
};

// One connection's reply side. Either respond() once, or begin_stream() then send() pieces
// (the body ends when the connection closes). send() returns false once the client is gone.
class HttpReply {
 public:
  explicit HttpReply(int fd) : fd_(fd) {}
  void respond(int status, const std::string& body, const std::string& content_type = "application/json");
  void begin_stream(int status, const std::string& content_type);
  bool send(std::string_view data);
  int status() const { return status_; }
  bool client_gone() const { return gone_; }

 private:
  bool write_all(std::string_view data);
  int fd_;
  int status_ = 0;
  bool gone_ = false;
};

// {"error": {"message": ..., "type": ..., "param": ... or null, "code": null}} as text.
std::string openai_error_body(const std::string& message, const std::string& type, const std::string& param = "");
// "invalid_request_error" for 4xx, "server_error" otherwise.
const char* error_type_for(int status);

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  size_t max_body_bytes = 16u << 20;
  size_t max_header_bytes = 64u << 10;
  double read_timeout_s = 60;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpReply&)>;

// Binds (throws Error naming host:port and the system's reason when it cannot), calls
// on_listening with the bound port, then serves until `stop` becomes true (checked every
// 200 ms); waits up to 60 s for requests in flight, then returns. Handlers run concurrently.
// Exceptions from a handler become a 500 error reply.
void serve_http(const HttpServerOptions& options, const HttpHandler& handler, const std::atomic<bool>& stop,
                const std::function<void(int port)>& on_listening = {});

}  // namespace cuda_agent::serve
