#include "cuda_agent/core/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "cuda_agent/core/error.h"

namespace cuda_agent {
namespace {
std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::info;
}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto existing = spdlog::get(component)) return existing;
  auto created = spdlog::stderr_color_mt(component);
  created->set_level(g_level);
  created->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return created;
}

void set_log_level(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  CA_CHECK(parsed != spdlog::level::off || level == "off",
           "unknown log level '{}': use trace, debug, info, warn, error or off", level);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_level = parsed;
  spdlog::set_level(parsed);
}

}  // namespace cuda_agent
