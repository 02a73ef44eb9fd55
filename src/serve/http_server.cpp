#include "http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"

namespace cuda_agent::serve {
namespace {

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

// A request the server refuses before any handler sees it.
struct Refusal {
  int status;
  std::string message;
  std::string param;
};

// Reads one request from `fd`. Returns false with `refusal` set for a malformed or oversized
// request, false with refusal.status 0 when the client sent nothing usable (closed, timed out).
bool read_request(int fd, const HttpServerOptions& opt, HttpRequest& req, Refusal& refusal) {
  std::string data;
  char buf[16384];
  size_t header_end;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    if (data.size() > opt.max_header_bytes) {
      refusal = {431, fmt::format("request headers exceed {} bytes", opt.max_header_bytes), ""};
      return false;
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      refusal.status = data.empty() ? 0 : 400;
      refusal.message = "the request ended before its headers did";
      return false;
    }
    data.append(buf, static_cast<size_t>(n));
  }
  std::string_view head(data.data(), header_end);
  size_t line_end = head.find("\r\n");
  std::string_view request_line = head.substr(0, line_end);
  size_t sp1 = request_line.find(' '), sp2 = request_line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1 || request_line.substr(sp2 + 1).rfind("HTTP/", 0) != 0) {
    refusal = {400, fmt::format("malformed request line '{}'", request_line.substr(0, 200)), ""};
    return false;
  }
  req.method = std::string(request_line.substr(0, sp1));
  req.target = std::string(request_line.substr(sp1 + 1, sp2 - sp1 - 1));
  req.path = req.target.substr(0, req.target.find('?'));
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view line = head.substr(pos, e - pos);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos)
      req.headers[lower(std::string(line.substr(0, colon)))] = trim(line.substr(colon + 1));
    pos = e + 2;
  }
  if (req.headers.count("transfer-encoding")) {
    refusal = {411, "chunked request bodies are not supported: send a Content-Length", ""};
    return false;
  }
  size_t length = 0;
  if (auto it = req.headers.find("content-length"); it != req.headers.end()) {
    // Digits only: std::stoull takes "-5" as 2^64 - 5.
    const std::string& text = it->second;
    const bool digits = !text.empty() && text.size() <= 19 && text.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      refusal = {400, fmt::format("Content-Length '{}' is not a number of bytes", text), ""};
      return false;
    }
    length = static_cast<size_t>(std::stoull(text));
  }
  if (length > opt.max_body_bytes) {
    refusal = {413, fmt::format("the request body is {} bytes; this server accepts at most {}", length,
                                opt.max_body_bytes), ""};
    return false;
  }
  req.body = data.substr(header_end + 4);
  while (req.body.size() < length) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      refusal = {400, fmt::format("the request body ended after {} of its {} bytes", req.body.size(), length), ""};
      return false;
    }
    req.body.append(buf, static_cast<size_t>(n));
  }
  req.body.resize(length);
  return true;
}

// Discards what the client is still sending (up to a limit), so that closing the socket after an
// early reply does not reset the connection before the client has read that reply.
void drain(int fd) {
  shutdown(fd, SHUT_WR);
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[65536];
  size_t total = 0;
  while (total < (64u << 20)) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    total += static_cast<size_t>(n);
  }
}

}  // namespace

std::string openai_error_body(const std::string& message, const std::string& type, const std::string& param) {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  return nlohmann::json{{"error", e}}.dump();
}

const char* error_type_for(int status) {
  return status >= 400 && status < 500 ? "invalid_request_error" : "server_error";
}

bool HttpReply::write_all(std::string_view data) {
  while (!data.empty() && !gone_) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      gone_ = true;
      break;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return !gone_;
}

void HttpReply::respond(int status, const std::string& body, const std::string& content_type) {
  CA_ASSERT(status_ == 0, "an HTTP reply was started twice");
  status_ = status;
  write_all(fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        status, reason_phrase(status), content_type, body.size()));
  write_all(body);
}

void HttpReply::begin_stream(int status, const std::string& content_type) {
  CA_ASSERT(status_ == 0, "an HTTP reply was started twice");
  status_ = status;
  // No Content-Length: the body ends when the connection closes (RFC 9112 6.3, last rule).
  write_all(fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
                        status, reason_phrase(status), content_type));
}

bool HttpReply::send(std::string_view data) { return write_all(data); }

void serve_http(const HttpServerOptions& opt, const HttpHandler& handler, const std::atomic<bool>& stop,
                const std::function<void(int port)>& on_listening) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  CA_CHECK(opt.port >= 0 && opt.port <= 65535, "port {} is out of range: give 1 to 65535, or 0 for any free port",
           opt.port);
  const std::string port_text = std::to_string(opt.port);
  int rc = getaddrinfo(opt.host.c_str(), port_text.c_str(), &hints, &res);
  CA_CHECK(rc == 0, "cannot resolve host '{}': {}", opt.host, gai_strerror(rc));
  int lfd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (lfd < 0) {
    freeaddrinfo(res);
    CA_FAIL("cannot create a socket for {}:{}: {}", opt.host, opt.port, std::strerror(errno));
  }
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 64) != 0) {
    int err = errno;
    freeaddrinfo(res);
    close(lfd);
    CA_FAIL("cannot listen on {}:{}: {} (pick another --port or --host)", opt.host, opt.port, std::strerror(err));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (on_listening) on_listening(port);

  std::mutex mutex;
  std::condition_variable idle;
  int active = 0;
  while (!stop.load()) {
    pollfd p{lfd, POLLIN, 0};
    int ready = poll(&p, 1, 200);
    if (ready <= 0) continue;  // timeout, or EINTR from the stopping signal
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = accept(lfd, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    if (fd < 0) continue;
    char host[INET6_ADDRSTRLEN] = "?";
    int peer_port = 0;
    if (peer.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      peer_port = ntohs(a->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      peer_port = ntohs(a->sin6_port);
    }
    std::string peer_name = fmt::format("{}:{}", host, peer_port);
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++active;
    }
    std::thread([&, fd, peer_name] {
      timeval tv{static_cast<time_t>(opt.read_timeout_s), 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      HttpRequest req;
      req.peer = peer_name;
      Refusal refusal{0, "", ""};
      HttpReply reply(fd);
      if (read_request(fd, opt, req, refusal)) {
        try {
          handler(req, reply);
        } catch (const std::exception& e) {
          CA_LOG_ERROR("serve", "{} {}: {}", req.method, req.path, e.what());
          if (reply.status() == 0) reply.respond(500, openai_error_body(e.what(), "server_error"));
        }
      } else if (refusal.status != 0) {
        reply.respond(refusal.status, openai_error_body(refusal.message, error_type_for(refusal.status), refusal.param));
        CA_LOG_INFO("serve", "{} {} {} -> {} ({})", peer_name, req.method.empty() ? "-" : req.method,
                    req.path.empty() ? "-" : req.path, refusal.status, refusal.message);
        drain(fd);
      }
      close(fd);
      std::lock_guard<std::mutex> lock(mutex);
      if (--active == 0) idle.notify_all();
    }).detach();
  }
  close(lfd);
  std::unique_lock<std::mutex> lock(mutex);
  idle.wait_for(lock, std::chrono::seconds(60), [&] { return active == 0; });
}

}  // namespace cuda_agent::serve
