// Logging without spdlog's headers, for code that cannot include them: the libtorch module
// (src/lm), whose fmt is libtorch's (src/lm/torch_fmt.h), and the binary's end of that module's
// logs. Messages go through log.h's loggers all the same.
#pragma once

#include <string>

namespace cuda_agent {

// spdlog's level numbers.
enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4 };

// `text` through logger(component) at `level`.
void log_text(LogLevel level, const char* component, const std::string& text);

// A copy of this library inside a module loaded with RTLD_LOCAL (libca_lm.so) has loggers of its
// own. forward_logs_to() makes that copy hand every message (the level number, the component,
// the text) to `forward` instead of writing it: the binary passes log_forwarded, so that the
// module's messages come out of the binary's loggers, with their format and their level (whenever
// it is set). Loggers made before the call are replaced. Where the binary exports its symbols
// (ours do), the module's calls already reach the binary's copy and this does nothing.
// Thread-safe.
using LogForward = void (*)(int level, const char* component, const char* text);
void forward_logs_to(LogForward forward);

// The binary's end of forward_logs_to: `text` through logger(component) at `level`.
void log_forwarded(int level, const char* component, const char* text);

}  // namespace cuda_agent
