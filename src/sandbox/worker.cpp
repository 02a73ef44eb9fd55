// The caller's side of an evaluation: one fresh worker process per request, confined where
// sandbox.confine says (worker_confinement.h).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/worker_confinement.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

std::string tail(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  return "...\n" + text.substr(text.size() - max_bytes);
}

// The pipe that carries the worker's start-up report.
class ReportPipe {
 public:
  ReportPipe() {
    int fds[2];
    const int rc = ::pipe2(fds, O_CLOEXEC);
    const int err = errno;
    CA_CHECK(rc == 0, "cannot create the worker's report pipe: {}", std::generic_category().message(err));
    read_ = fds[0];
    write_ = fds[1];
  }
  ~ReportPipe() {
    close_write();
    ::close(read_);
  }
  ReportPipe(const ReportPipe&) = delete;
  ReportPipe& operator=(const ReportPipe&) = delete;
  int write_end() const { return write_; }
  void close_write() {
    if (write_ >= 0) ::close(write_);
    write_ = -1;
  }
  // What the worker wrote, without waiting: a process that escaped the worker's group may still
  // hold the write end.
  std::string drain() {
    close_write();
    ::fcntl(read_, F_SETFL, O_NONBLOCK);
    std::string text;
    char buffer[4096];
    ssize_t n;
    while (text.size() < 65536 && (n = ::read(read_, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    return text;
  }

 private:
  int read_ = -1;
  int write_ = -1;
};

// How one worker process went.
struct WorkerRun {
  SubprocessResult run;
  StartupStatus startup;
  nlohmann::json result;  // null when the worker left no readable result
  std::string log;
  std::string phase = "start";  // the last phase the worker entered
};

WorkerRun run_worker(const EvalRequest& request, bool confine) {
  TempDir dir("cuda-agent-eval-");
  const fs::path request_path = dir.path() / "request.json";
  const fs::path result_path = dir.path() / "result.json";
  const fs::path log_path = dir.path() / "worker.log";
  EvalRequest worker_request = request;
  worker_request.confine_worker = confine;
  worker_request.status_fd = 3;  // SubprocessOptions::pass_fd
  write_file_atomic(request_path, worker_request.to_json().dump(2));

  ReportPipe report;
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
  sp.pass_fd = report.write_end();
  WorkerRun w;
  w.run = run_subprocess(sp);
  w.startup = parse_startup_status(report.drain());

  try {
    w.log = read_file(log_path);
  } catch (...) {
  }
  std::error_code ec;
  if (fs::exists(result_path, ec)) {
    try {
      w.result = nlohmann::json::parse(read_file(result_path));
    } catch (const std::exception&) {
      w.result = nullptr;
    }
  }
  try {
    w.phase = read_file(result_path.string() + ".phase");
  } catch (...) {
  }
  return w;
}

// Why a confined worker failed before any solution code ran, or nullopt when it got past its
// start-up (or ended in a way that says nothing about the confinement). Only what the worker
// wrote before the solution could run is trusted: its report line, and, when it wrote none,
// the phase file (no solution code ran then either).
std::optional<std::string> confinement_failure(const WorkerRun& w) {
  auto reason = [](const std::string& phase, const std::string& what) {
    if (phase == "confine") return "cannot set up the namespaces: " + what;
    if (phase == "cuda_init") return "CUDA unavailable inside the namespaces: " + what;
    return fmt::format("the worker failed in phase '{}' inside the namespaces: {}", phase, what);
  };
  if (w.startup.reported) {
    if (w.startup.ready) return std::nullopt;
    return reason(w.startup.phase, w.startup.message);
  }
  const bool died = w.run.term_signal != 0 || w.run.timed_out;
  if (died && (w.phase == "confine" || w.phase == "cuda_init"))
    return reason(w.phase, "the worker " + w.run.describe());
  return std::nullopt;
}

// Under confine: auto, why this process runs its workers unconfined, once that is known.
std::mutex g_unconfinable_mutex;
std::optional<std::string> g_unconfinable;

std::optional<std::string> known_unconfinable() {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  return g_unconfinable;
}

void remember_unconfinable(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  if (g_unconfinable) return;
  g_unconfinable = reason;
  CA_LOG_WARN("sandbox", "evaluation workers run unconfined from now on (sandbox.confine: auto): {}", reason);
}

// The result of a worker run: the worker's own, or a failure built from how it ended.
nlohmann::json worker_result(const EvalRequest& request, const WorkerRun& w, nlohmann::json failure) {
  nlohmann::json result = w.result;
  if (result.is_null() || !result.is_object()) {
    result = std::move(failure);
    const SubprocessResult& run = w.run;
    if (run.timed_out) {
      result["category"] = category::kTimeout;
      result["message"] = fmt::format("the evaluation did not finish within {} s (it was in phase '{}'); an endless "
                                      "kernel or a hanging Python call is the usual cause",
                                      request.options.timeout_s, w.phase);
    } else if (run.memory_exceeded) {
      result["category"] = category::kOutOfMemory;
      result["message"] = fmt::format("the worker exceeded the host memory limit of {} GB in phase '{}' ({})",
                                      request.options.host_memory_gb, w.phase, run.describe());
    } else if (run.term_signal != 0) {
      result["category"] = category::kCrash;
      result["message"] = fmt::format("the worker crashed in phase '{}': {}", w.phase, run.describe());
    } else {
      result["category"] = category::kInfrastructure;
      result["message"] = fmt::format("the worker ended without a result in phase '{}': {}", w.phase, run.describe());
    }
  }
  if (!result.value("ok", false)) result["log"] = tail(w.log, 8000);
  result["worker"] = {{"exit_code", w.run.exit_code},
                      {"signal", w.run.term_signal},
                      {"timed_out", w.run.timed_out},
                      {"memory_exceeded", w.run.memory_exceeded},
                      {"peak_rss_bytes", w.run.peak_rss_bytes},
                      {"gpu", request.gpu}};
  return result;
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
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  try {
    const std::string& mode = request.options.confine;
    std::optional<std::string> unconfined_reason;
    if (mode == "off") unconfined_reason = "sandbox.confine is off";
    else if (mode == "auto") unconfined_reason = known_unconfinable();
    bool confined = !unconfined_reason;

    WorkerRun w = run_worker(request, confined);
    if (confined) {
      if (const auto why = confinement_failure(w)) {
        if (mode == "namespaces") {
          nlohmann::json result = worker_result(request, w, failure);
          result["ok"] = false;
          result["category"] = category::kInfrastructure;
          result["message"] = fmt::format(
              "sandbox.confine is 'namespaces', but the worker cannot run confined on this machine: {}. Set "
              "sandbox.confine to auto (confine where it works, else run unconfined) or off",
              *why);
          result["correct"] = nullptr;
          result["reward"] = -1.0;
          result["log"] = tail(w.log, 8000);
          result["worker"]["confine"] = mode;
          result["worker"]["confined"] = false;
          result["worker"]["unconfined_reason"] = *why;
          result["wall_seconds"] = seconds();
          return result;
        }
        // auto: no solution code ran, so running it again unconfined cannot be the solution's
        // doing. When that start-up works, the namespaces were the cause: remember it.
        w = run_worker(request, false);
        if (w.startup.ready) remember_unconfinable(*why);
        confined = false;
        unconfined_reason = *why;
      }
    }
    nlohmann::json result = worker_result(request, w, failure);
    result["worker"]["confine"] = mode;
    result["worker"]["confined"] = confined;
    if (!confined) result["worker"]["unconfined_reason"] = *unconfined_reason;
    result["wall_seconds"] = seconds();
    return result;
  } catch (const std::exception& e) {
    failure["category"] = category::kInfrastructure;
    failure["message"] = fmt::format("cannot run the worker: {}", e.what());
    failure["wall_seconds"] = seconds();
    return failure;
  }
}

}  // namespace cuda_agent::sandbox
