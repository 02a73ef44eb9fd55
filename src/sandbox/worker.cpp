// The caller's side of an evaluation: one fresh worker process per request.
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

std::string tail(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  return "...\n" + text.substr(text.size() - max_bytes);
}

}  // namespace

nlohmann::json evaluate(const EvalRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json failure = {{"schema_version", 1},
                            {"task_id", request.task_id},
                            {"task_path", request.task_path},
                            {"solution_path", request.solution_path},
                            {"task_sha256", file_sha256(request.task_path)},
                            {"solution_sha256", solution_fingerprint(request.solution_path)},
                            {"mode", to_string(request.mode)},
                            {"ok", false},
                            {"correct", nullptr},
                            {"reward", -1.0},
                            {"reward_kind", request.options.reward},
                            {"precision", request.options.precision},
                            {"options", request.options.to_json()}};
  try {
    TempDir dir("cuda-agent-eval-");
    const fs::path request_path = dir.path() / "request.json";
    const fs::path result_path = dir.path() / "result.json";
    const fs::path log_path = dir.path() / "worker.log";
    write_file_atomic(request_path, request.to_json().dump(2));

    SubprocessOptions sp;
    sp.argv = {self_executable(), "worker", "--request", request_path.string(), "--result", result_path.string()};
    if (request.device != "cpu") sp.env_set["CUDA_VISIBLE_DEVICES"] = std::to_string(request.gpu);
    else sp.env_set["CUDA_VISIBLE_DEVICES"] = "";
    sp.env_set["PYTHONUNBUFFERED"] = "1";
    sp.env_set["PYTHONDONTWRITEBYTECODE"] = "1";
    sp.stdout_path = log_path.string();
    sp.stderr_path = log_path.string();
    sp.timeout_s = request.options.timeout_s;
    sp.max_rss_bytes = static_cast<int64_t>(request.options.host_memory_gb * (1LL << 30));
    SubprocessResult run = run_subprocess(sp);

    std::string log;
    try {
      log = read_file(log_path);
    } catch (...) {
    }
    nlohmann::json result;
    std::error_code ec;
    if (fs::exists(result_path, ec)) {
      try {
        result = nlohmann::json::parse(read_file(result_path));
      } catch (const std::exception& e) {
        result = nullptr;
      }
    }
    std::string phase = "start";
    try {
      phase = read_file(result_path.string() + ".phase");
    } catch (...) {
    }
    if (result.is_null() || !result.is_object()) {
      result = failure;
      if (run.timed_out) {
        result["category"] = category::kTimeout;
        result["message"] = fmt::format("the evaluation did not finish within {} s (it was in phase '{}'); an endless "
                                        "kernel or a hanging Python call is the usual cause",
                                        request.options.timeout_s, phase);
      } else if (run.memory_exceeded) {
        result["category"] = category::kOutOfMemory;
        result["message"] = fmt::format("the worker exceeded the host memory limit of {} GB in phase '{}' ({})",
                                        request.options.host_memory_gb, phase, run.describe());
      } else if (run.term_signal != 0) {
        result["category"] = category::kCrash;
        result["message"] = fmt::format("the worker crashed in phase '{}': {}", phase, run.describe());
      } else {
        result["category"] = category::kInfrastructure;
        result["message"] = fmt::format("the worker ended without a result in phase '{}': {}", phase, run.describe());
      }
    }
    if (!result.value("ok", false)) result["log"] = tail(log, 8000);
    result["worker"] = {{"exit_code", run.exit_code},
                        {"signal", run.term_signal},
                        {"timed_out", run.timed_out},
                        {"memory_exceeded", run.memory_exceeded},
                        {"peak_rss_bytes", run.peak_rss_bytes},
                        {"gpu", request.gpu}};
    result["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  } catch (const std::exception& e) {
    failure["category"] = category::kInfrastructure;
    failure["message"] = fmt::format("cannot run the worker: {}", e.what());
    failure["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return failure;
  }
}

}  // namespace cuda_agent::sandbox
