// Errors: two levels, as in c10.
//
//   CA_CHECK(cond, fmt, args...)  bad input (a file, a config value, a solution, model
//                                 output). The message names the bad value and what to do.
//   CA_ASSERT(cond, fmt, args...) a broken invariant of our own: a bug.
//
// Both throw; nothing in library code calls exit() or abort(). Messages use fmt syntax.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace cuda_agent {

// Thrown by CA_CHECK: the caller gave us something we cannot use.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A conversation longer than the model's context window: the caller can shorten it or stop
// (the agent loop ends the episode as `context_full`).
class ContextFullError : public Error {
 public:
  explicit ContextFullError(const std::string& what) : Error(what) {}
};

// Thrown by CA_ASSERT: our own invariant broke. Report it as a bug.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

// strerror for an errno value, thread-safe ("No such file or directory").
std::string errno_text(int err);

namespace detail {
[[noreturn]] void throw_check(const char* file, int line, const std::string& message);
[[noreturn]] void throw_assert(const char* cond, const char* file, int line,
                               const std::string& message);
}  // namespace detail

}  // namespace cuda_agent

#define CA_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::cuda_agent::detail::throw_check(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    }                                                                             \
  } while (0)

#define CA_ASSERT(cond, ...)                                                            \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::cuda_agent::detail::throw_assert(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    }                                                                                   \
  } while (0)

// Throws Error unconditionally.
#define CA_FAIL(...) ::cuda_agent::detail::throw_check(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
