#include "cuda_agent/core/log.h"

#include <map>
#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "cuda_agent/core/error.h"

namespace cuda_agent {
namespace {
static_assert(static_cast<int>(LogLevel::kTrace) == spdlog::level::trace &&
              static_cast<int>(LogLevel::kDebug) == spdlog::level::debug &&
              static_cast<int>(LogLevel::kInfo) == spdlog::level::info &&
              static_cast<int>(LogLevel::kWarn) == spdlog::level::warn &&
              static_cast<int>(LogLevel::kError) == spdlog::level::err);

std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::info;
LogForward g_forward = nullptr;
// This copy's loggers by component. Not spdlog's registry: spdlog may be one shared library for
// the binary and the module, and a module's forwarding logger found there by the binary (a
// binary that does not export its symbols, such as ca-lm-bench, has its own copy of this file)
// would forward each message back to itself and deadlock on its sink's lock.
std::map<std::string, std::shared_ptr<spdlog::logger>> g_loggers;

// Hands each message to g_forward (forward_logs_to).
class ForwardSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ForwardSink(LogForward forward) : forward_(forward) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string component(msg.logger_name.data(), msg.logger_name.size());
    const std::string text(msg.payload.data(), msg.payload.size());
    forward_(static_cast<int>(msg.level), component.c_str(), text.c_str());
  }
  void flush_() override {}

 private:
  LogForward forward_;
};
}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& made = g_loggers[component];
  if (made) return made;
  if (g_forward != nullptr) {
    made = std::make_shared<spdlog::logger>(component, std::make_shared<ForwardSink>(g_forward));
  } else {
    made = std::make_shared<spdlog::logger>(component, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    made->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  }
  made->set_level(g_level);
  return made;
}

void forward_logs_to(LogForward forward) {
  // This copy is the binary's own: the module's references to these functions resolved to the
  // binary's (an executable that exports its symbols), so its messages come here already.
  // Forwarding to itself would loop.
  if (forward == &log_forwarded) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_forward = forward;
  g_level = spdlog::level::trace;  // the receiving logger filters
  g_loggers.clear();  // made again, with the forwarding sink, on their next use
}

void log_text(LogLevel level, const char* component, const std::string& text) {
  logger(component)->log(static_cast<spdlog::level::level_enum>(level), "{}", text);
}

void log_forwarded(int level, const char* component, const char* text) {
  if (level < 0 || level > static_cast<int>(LogLevel::kError)) level = static_cast<int>(LogLevel::kError);
  log_text(static_cast<LogLevel>(level), component, text);
}

void set_log_level(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  CA_CHECK(parsed != spdlog::level::off || level == "off",
           "unknown log level '{}': use trace, debug, info, warn, error or off", level);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_level = parsed;
  for (auto& [name, l] : g_loggers) l->set_level(parsed);
}

}  // namespace cuda_agent
