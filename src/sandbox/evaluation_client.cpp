// The caller's side of an evaluation: one judge process per request (started for it or ahead
// of it, judge_pool.h; it starts the candidate process), and its result, taken only when its MAC
// verifies under the key this process gave the judge: a file the solution wrote is not a result.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>

#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "judge_pool.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {
namespace {

// The judge's own work (loading, references, comparisons, the result) after the evaluation's
// time is up for the candidate: it stops the candidate itself at timeout_s.
constexpr double kJudgeGraceS = 60;

// Under confine: auto, why this process runs its candidates unconfined, once that is known; and
// whether a candidate of this process ran confined, after which it never runs one unconfined.
std::mutex g_unconfinable_mutex;
std::optional<std::string> g_unconfinable;
bool g_confined_once = false;

bool confined_before() {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  return g_confined_once;
}

void remember_confined() {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  g_confined_once = true;
}

std::optional<std::string> known_unconfinable() {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  return g_unconfinable;
}

void remember_unconfinable(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_unconfinable_mutex);
  if (g_unconfinable || g_confined_once) return;  // an evaluation begun before the first confined one
  g_unconfinable = reason;
  CA_LOG_WARN("sandbox", "candidate processes run unconfined from now on (sandbox.confine: auto): {}", reason);
}

// The judge's result when it verifies, else nullopt; *forged is set when a file is there that
// the judge did not write.
std::optional<EvalResult> read_result(const fs::path& path, const std::string& key, bool* forged) {
  *forged = false;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::string text, mac;
  try {
    text = read_file(path);
    mac = read_file(path.string() + ".mac");
  } catch (...) {
    *forged = true;
    return std::nullopt;
  }
  if (!constant_time_equal(mac, hmac_sha256_hex(key, text))) {
    *forged = true;
    return std::nullopt;
  }
  try {
    return EvalResult::from_json(nlohmann::json::parse(text));
  } catch (const std::exception&) {
    *forged = true;
    return std::nullopt;
  }
}

}  // namespace

EvalResult result_header(const EvalRequest& req) {
  EvalResult r;
  r.task_id = req.task_id;
  r.task_path = req.task_path;
  r.task_sha256 = file_sha256(req.task_path);
  r.solution_path = req.solution_path;
  r.solution_sha256 = req.mode == EvalMode::kBaselines ? "" : solution_fingerprint(req.solution_path);
  r.mode = to_string(req.mode);
  r.reward = -1.0;
  r.reward_kind = req.options.reward;
  r.precision = req.options.precision;
  r.options = req.options.to_json();
  r.gpu = req.gpu;
  r.confine = req.options.confine;
  return r;
}

EvalResult evaluate(const EvalRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  EvalResult failure = result_header(request);
  try {
    EvalRequest judged = request;
    if (request.options.confine == "off") {
      judged.confine_candidate = false;
      judged.unconfined_reason = "sandbox.confine is off";
    } else if (request.options.confine == "auto") {
      const char* inside = std::getenv(kInsideConfinementVariable);
      if (auto why = known_unconfinable()) {
        judged.confine_candidate = false;
        judged.unconfined_reason = *why;
      } else if (inside != nullptr && *inside != '\0') {
        // The agent's Bash, confined by `confined-exec`: the evaluation already runs inside
        // namespaces, in which no further one can be made.
        judged.confine_candidate = false;
        judged.unconfined_reason = "inside the agent's confined shell (no user namespace can be made in it)";
      } else {
        // Confinement worked here before: a failure now is the moment's (a GPU another process
        // filled, something a policy's command used up), and running the candidate unconfined
        // for it would let whoever caused it take the confinement off.
        judged.confine_required = confined_before();
      }
    }
    TempDir dir("cuda-agent-eval-");
    const fs::path request_path = dir.path() / "request.json";
    const fs::path result_path = dir.path() / "result.json";
    const fs::path log_path = dir.path() / "judge.log";
    write_file_atomic(request_path, judged.to_json().dump(2));
    const std::string key = random_hex(32);

    JudgeKind kind;
    kind.executable = self_executable();
    kind.gpu = request.device != "cpu" ? request.gpu : -1;
    kind.quiet_start = kind.gpu >= 0 && request.gpu_lock && request.options.quiet_start;
    kind.max_rss_bytes = static_cast<int64_t>(request.options.host_memory_gb * (1LL << 30));
    kind.environment = environment_digest();
    const JudgeJob job{request_path.string(), result_path.string(), log_path.string(), monotonic_ns()};
    // The judge's waits for the GPU's locks do not count against timeout_s (judge_process.cpp).
    const double timeout_s =
        request.options.timeout_s + kJudgeGraceS + (kind.gpu >= 0 && request.gpu_lock ? request.options.gpu_wait_s : 0.0);
    std::unique_ptr<JudgeProcess> judge = JudgePool::instance().take(kind, request.options.warm_workers);
    if (!judge->give(job, key, timeout_s)) {  // a warm one that ended meanwhile: a fresh one
      judge = std::make_unique<JudgeProcess>(kind);
      judge->give(job, key, timeout_s);  // how it ends is reported below
    }
    const SubprocessResult run = judge->wait();
    CA_CHECK(judge->start_error().empty(), "cannot start the judge process: {}", judge->start_error());
    // From the result written (its file's time) to the judge's end: the judge's exit, its CUDA
    // context's teardown among it, which holds the GPU's lock until it is done.
    std::error_code no_result;
    const fs::file_time_type written = fs::last_write_time(result_path, no_result);
    const double judge_exit =
        std::max(0.0, std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count());

    std::string judge_log;
    try {
      judge_log = read_file(log_path);
    } catch (...) {
    }
    bool forged = false;
    std::optional<EvalResult> result = read_result(result_path, key, &forged);
    if (!result) {
      EvalResult r = failure;
      std::string phase = "start";
      try {
        phase = read_file(result_path.string() + ".phase");
      } catch (...) {
      }
      if (forged) {
        r.fail(Category::kTampering,
               "the result file was not written by the evaluation's judge (its MAC does not verify): solution code "
               "wrote it");
      } else if (run.timed_out) {
        r.fail(Category::kTimeout, fmt::format("the evaluation did not finish within {} s (it was in phase '{}'); an "
                                               "endless kernel or a hanging Python call is the usual cause",
                                               request.options.timeout_s, phase));
      } else if (run.memory_exceeded) {
        r.fail(Category::kOutOfMemory, fmt::format("the judge exceeded the host memory limit of {} GB in phase '{}' ({})",
                                                   request.options.host_memory_gb, phase, run.describe()));
      } else if (run.term_signal != 0) {
        r.fail(Category::kCrash, fmt::format("the judge crashed in phase '{}': {}", phase, run.describe()));
      } else {
        r.fail(Category::kInfrastructure,
               fmt::format("the judge ended without a result in phase '{}': {}", phase, run.describe()));
      }
      r.unconfined_reason = judged.unconfined_reason;
      r.log = tail_text(judge_log, 8000);
      result = std::move(r);
    } else if (!result->ok) {
      result->log = tail_text(result->log.empty() ? judge_log : result->log + "\n--- judge ---\n" + tail_text(judge_log, 2000), 10000);
    }
    if (result->confined) remember_confined();
    else if (result->confinement_unavailable) remember_unconfinable(result->unconfined_reason);
    result->judge = ProcessReport::of(run);
    if (!no_result && !result->phase_seconds.empty()) result->phase_seconds["judge_exit"] = judge_exit;
    result->wall_seconds = seconds();
    return *result;
  } catch (const std::exception& e) {
    failure.fail(Category::kInfrastructure, fmt::format("cannot run the evaluation: {}", e.what()));
    failure.wall_seconds = seconds();
    return failure;
  }
}

std::string settle_confinement(const SandboxOptions& options, const std::string& device, int gpu, bool gpu_lock) {
  if (options.confine != "auto") return "";
  // One probe at a time: callers that come together (episodes starting at once) wait for the
  // first one's finding instead of each starting a candidate of their own.
  static std::mutex probing;
  std::lock_guard<std::mutex> one(probing);
  if (confined_before() || known_unconfinable()) return "";
  const char* inside = std::getenv(kInsideConfinementVariable);
  if (inside != nullptr && *inside != '\0') return "";
  try {
    TempDir dir("cuda-agent-confine-probe-");
    write_file_atomic(dir.path() / "task" / "model.py",
                      "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                      "    def forward(self, x):\n        return x + 1\n\n\n"
                      "def get_inputs():\n    return [torch.arange(8, dtype=torch.float32) * 0.5]\n\n\n"
                      "def get_init_inputs():\n    return []\n");
    write_file_atomic(dir.path() / "solution" / "model_new.py",
                      "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                      "    def forward(self, x):\n        return x + 1\n");
    EvalRequest req;
    req.task_path = (dir.path() / "task" / "model.py").string();
    req.task_id = "confinement-probe";
    req.solution_path = (dir.path() / "solution" / "model_new.py").string();
    req.mode = EvalMode::kVerify;
    req.device = device;
    req.gpu = gpu;
    req.gpu_lock = gpu_lock;
    req.options = options;
    req.options.trials = 1;
    const EvalResult r = evaluate(req);
    if (r.confined) return "candidates run confined (checked before the first evaluation)";
    if (auto why = known_unconfinable()) return "candidates run unconfined: " + *why;
    return fmt::format("confinement not settled: the probe's evaluation ended {} ({}); evaluations find out as before",
                       to_string(r.category), r.message.substr(0, 300));
  } catch (const std::exception& e) {
    return fmt::format("confinement not settled: {}", e.what());
  }
}

}  // namespace cuda_agent::sandbox
