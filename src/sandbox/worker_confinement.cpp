#include "cuda_agent/sandbox/worker_confinement.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

// Longer messages are cut, so that the line stays one atomic pipe write (PIPE_BUF, 4096 bytes).
constexpr size_t kMaxMessage = 3000;

}  // namespace

std::string gpu_lock_path(int gpu, const char* which) {
  return (host_temp_directory() / fmt::format("cuda-agent-gpu{}.{}.lock", gpu, which)).string();
}

std::vector<std::string> gpu_lock_files(int gpu) {
  std::vector<std::string> files;
  for (const char* which : {"gpu", "quiet"}) {
    const std::string path = gpu_lock_path(gpu, which);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;  // another user's file, say: its holders run without that lock, as unconfined
    ::close(fd);
    files.push_back(path);
  }
  return files;
}

GpuLock::GpuLock(int gpu, const char* which, bool exclusive) {
  try {
    fd_ = lock_file(gpu_lock_path(gpu, which), exclusive);
  } catch (const Error& e) {
    std::fprintf(stderr, "cuda-agent: %s; running without it\n", e.what());
  }
}

void GpuLock::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ConfinementPlan worker_confinement_plan(const EvalRequest& request, const std::string& result_path) {
  ConfinementPlan plan;
  std::error_code ec;
  plan.writable.push_back(fs::absolute(result_path).parent_path().string());
  const fs::path cache = request.options.resolved_cache_dir();
  fs::create_directories(cache, ec);
  CA_CHECK(!ec, "cannot create the evaluation cache {}: {}", cache.string(), ec.message());
  plan.writable.push_back(cache.string());
  if (request.device != "cpu" && request.gpu_lock)
    for (const std::string& path : gpu_lock_files(request.gpu)) plan.writable.push_back(path);
  plan.private_dirs.push_back("/tmp");
  const fs::path tmp = fs::temp_directory_path(ec);
  if (!ec && fs::is_directory(tmp, ec)) {
    const fs::path resolved = fs::canonical(tmp, ec);
    if (!ec && resolved != "/" && resolved != fs::canonical("/tmp", ec)) plan.private_dirs.push_back(resolved.string());
  }
  plan.tmpfs_bytes = static_cast<uint64_t>(request.options.host_memory_gb * (1ULL << 30));
  return plan;
}

void confine_worker(const EvalRequest& request, const std::string& result_path) {
  const ConfinementPlan plan = worker_confinement_plan(request, result_path);
  confine_this_process(plan);
  // The tools' default caches live under $HOME or in the host's /tmp, read-only now: they go to
  // the private /tmp. Shared caches (poisonable by one solution for the next) are kept to what
  // was shared before: cpp_extension builds.
  const fs::path cache = request.options.resolved_cache_dir();
  ::setenv("TORCH_EXTENSIONS_DIR", (cache / "torch_extensions").c_str(), 1);
  set_environment(private_cache_env());
}

StartupReport::~StartupReport() {
  if (fd_ >= 0) ::close(fd_);
}

void StartupReport::ready() { send(nlohmann::json{{"ready", true}}.dump()); }

void StartupReport::failed(const std::string& phase, const std::string& message) {
  const std::string text = message.size() > kMaxMessage ? message.substr(0, kMaxMessage) + "..." : message;
  send(nlohmann::json{{"ready", false}, {"phase", phase}, {"message", text}}.dump(-1, ' ', false,
                                                                                  nlohmann::json::error_handler_t::replace));
}

void StartupReport::send(const std::string& line) {
  if (fd_ < 0) return;
  const std::string text = line + "\n";
  ssize_t ignored = ::write(fd_, text.data(), text.size());
  (void)ignored;  // the parent reads what arrived; a lost line reads as "no report"
  ::close(fd_);
  fd_ = -1;
}

StartupStatus parse_startup_status(const std::string& text) {
  StartupStatus status;
  const size_t end = text.find('\n');
  if (end == std::string::npos) return status;  // no complete line: no report
  try {
    const nlohmann::json j = nlohmann::json::parse(text.substr(0, end));
    status.ready = j.at("ready").get<bool>();
    status.phase = j.value("phase", "");
    status.message = j.value("message", "");
    status.reported = true;
  } catch (const std::exception&) {
    status = StartupStatus{};
  }
  return status;
}

}  // namespace cuda_agent::sandbox
