#include "cuda_agent/core/error.h"

#include <system_error>

namespace cuda_agent {

std::string errno_text(int err) { return std::generic_category().message(err); }

}  // namespace cuda_agent

namespace cuda_agent::detail {

void throw_check(const char* /*file*/, int /*line*/, const std::string& message) {
  // Bad-input messages are for users: the location in our source would only distract.
  throw Error(message);
}

void throw_assert(const char* cond, const char* file, int line, const std::string& message) {
  throw InternalError(fmt::format("internal error: {} ({}) at {}:{}; please report this bug",
                                  message, cond, file, line));
}

}  // namespace cuda_agent::detail
