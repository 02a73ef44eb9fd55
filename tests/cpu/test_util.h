// Helpers shared by the CPU suites.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <exception>
#include <string>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent::testing {

// Runs `fn`, expects it to throw cuda_agent::Error, and returns the message (empty, with a
// test failure recorded, when it does not).
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected cuda_agent::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected cuda_agent::Error, nothing was thrown";
  return "";
}

// A TCP listener on 127.0.0.1 at a free port (for checks that a confined process cannot reach
// the host's loopback). fd is invalid when the socket could not be set up.
struct LoopbackListener {
  UniqueFd fd;
  int port = 0;
};

inline LoopbackListener listen_on_loopback() {
  LoopbackListener l;
  l.fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (l.fd.get() < 0 || ::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(l.fd.get(), 8) != 0 || ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return LoopbackListener();
  l.port = ntohs(addr.sin_port);
  return l;
}

}  // namespace cuda_agent::testing
