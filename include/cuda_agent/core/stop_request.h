// A stop asked for by a signal (SIGINT, SIGTERM): long jobs (training) install the handlers, check
// at safe points and end with a message instead of dying wherever the signal found them.
//
// The first signal only records the request (and writes one line to stderr, from the handler);
// a second one of the same kind ends the process at once with the default action.
#pragma once

#include <string>

#include "cuda_agent/core/error.h"

namespace cuda_agent {

// Installs the handlers for SIGINT and SIGTERM (idempotent). Not thread-safe against itself:
// call from main before starting threads.
void install_stop_handlers();

// The signal that asked for a stop, or 0. Thread-safe, async-signal-safe.
int stop_signal();

// Thrown by throw_if_stop_requested.
class StopRequested : public Error {
 public:
  StopRequested(int signal, const std::string& where);
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Throws StopRequested when a stop was asked for; `where` says what was under way.
void throw_if_stop_requested(const std::string& where);

// "SIGTERM", "SIGINT", "signal N".
std::string signal_name(int signal);

}  // namespace cuda_agent
