#include "cuda_agent/core/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>

namespace cuda_agent {
namespace {

std::atomic<int> g_stop{0};

void on_signal(int sig) {
  if (g_stop.load() == sig) {
    // Asked twice: the default action now.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop.store(sig);
  const char* text = sig == SIGINT ? "\ncuda-agent: SIGINT received: stopping after the current episode or step (again to quit at once)\n"
                                   : "\ncuda-agent: SIGTERM received: stopping after the current episode or step (again to quit at once)\n";
  ssize_t ignored = ::write(2, text, std::strlen(text));
  (void)ignored;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return g_stop.load(); }

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return fmt::format("signal {}", sig);
}

StopRequested::StopRequested(int sig, const std::string& where)
    : Error(fmt::format("stopped by {} {}", signal_name(sig), where)), signal_(sig) {}

void throw_if_stop_requested(const std::string& where) {
  if (const int sig = stop_signal()) throw StopRequested(sig, where);
}

}  // namespace cuda_agent
