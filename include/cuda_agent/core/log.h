// Logging: spdlog behind thin macros, one named logger per component.
// Loggers write to stderr; stdout is for a verb's own output (tables, JSON).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "cuda_agent/core/log_forward.h"

namespace cuda_agent {

// Returns the logger for `component` ("sandbox", "bench", ...), creating it on first use.
// Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& component);

// Sets the level of every logger, current and future: "trace", "debug", "info", "warn",
// "error", "off". Throws Error on an unknown name.
void set_log_level(const std::string& level);


}  // namespace cuda_agent

#define CA_LOG_DEBUG(component, ...) ::cuda_agent::logger(component)->debug(__VA_ARGS__)
#define CA_LOG_INFO(component, ...) ::cuda_agent::logger(component)->info(__VA_ARGS__)
#define CA_LOG_WARN(component, ...) ::cuda_agent::logger(component)->warn(__VA_ARGS__)
#define CA_LOG_ERROR(component, ...) ::cuda_agent::logger(component)->error(__VA_ARGS__)
