#include "cuda_agent/sandbox/eval_result.h"

#include <array>
#include <utility>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/subprocess.h"

namespace cuda_agent::sandbox {
namespace {

constexpr std::array<std::pair<Category, const char*>, 22> kNames = {{
    {Category::kNone, ""},
    {Category::kCompileError, "compile_error"},
    {Category::kLoadError, "load_error"},
    {Category::kInterfaceError, "interface_error"},
    {Category::kRuntimeError, "runtime_error"},
    {Category::kIllegalMemoryAccess, "illegal_memory_access"},
    {Category::kOutOfMemory, "out_of_memory"},
    {Category::kTimeout, "timeout"},
    {Category::kCrash, "crash"},
    {Category::kMismatch, "mismatch"},
    {Category::kForbiddenFallback, "forbidden_fallback"},
    {Category::kPrecision, "precision"},
    {Category::kInputModified, "input_modified"},
    {Category::kInvalidOutput, "invalid_output"},
    {Category::kNondeterministic, "nondeterministic"},
    {Category::kTimingMismatch, "timing_mismatch"},
    {Category::kTampering, "tampering"},
    {Category::kTaskError, "task_error"},
    {Category::kTaskDependencyMissing, "task_dependency_missing"},
    {Category::kTaskTooLarge, "task_too_large"},
    {Category::kInfrastructure, "infrastructure_error"},
    {Category::kGpuBusy, "gpu_busy"},
}};

// Reports written at the top level of the result, in this order, when present.
constexpr std::array<const char*, 22> kReports = {
    "verify",         "task_check",      "fallback",         "provenance", "timing_inputs",  "timing",
    "timing_check",   "roofline",        "kernels",          "versions",   "device",         "runtime",
    "memory",         "reference64",     "speedup_interval", "backends",   "candidate_idle", "processes",
    "verify_seconds", "profile_seconds", "load_seconds",     "prebuild"};

template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

template <typename T>
std::optional<T> optional_from(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<T>();
}

}  // namespace

const char* to_string(Category category) {
  for (const auto& [c, name] : kNames)
    if (c == category) return name;
  return "?";
}

Category category_from_string(const std::string& name) {
  for (const auto& [c, n] : kNames)
    if (name == n) return c;
  CA_FAIL("unknown result category '{}'", name);
}

bool is_task_fault(Category c) {
  return c == Category::kTaskError || c == Category::kTaskDependencyMissing || c == Category::kTaskTooLarge ||
         c == Category::kGpuBusy;
}

bool is_task_fault(const nlohmann::json& category) {
  if (!category.is_string()) return false;
  for (const auto& [c, name] : kNames)
    if (category.get<std::string>() == name) return is_task_fault(c);
  return false;
}

bool is_wrong_answer(Category c) {
  switch (c) {
    case Category::kMismatch:
    case Category::kPrecision:
    case Category::kInputModified:
    case Category::kInvalidOutput:
    case Category::kNondeterministic:
    case Category::kForbiddenFallback:
    case Category::kTampering:
    case Category::kTimingMismatch:
      return true;
    default:
      return false;
  }
}

nlohmann::json ProcessReport::to_json() const {
  return {{"exit_code", exit_code},
          {"signal", signal},
          {"timed_out", timed_out},
          {"memory_exceeded", memory_exceeded},
          {"peak_rss_bytes", peak_rss_bytes}};
}

ProcessReport ProcessReport::of(const SubprocessResult& run) {
  ProcessReport p;
  p.exit_code = run.exit_code;
  p.signal = run.term_signal;
  p.timed_out = run.timed_out;
  p.memory_exceeded = run.memory_exceeded;
  p.peak_rss_bytes = run.peak_rss_bytes;
  return p;
}

ProcessReport ProcessReport::from_json(const nlohmann::json& j) {
  ProcessReport p;
  p.exit_code = j.value("exit_code", -1);
  p.signal = j.value("signal", 0);
  p.timed_out = j.value("timed_out", false);
  p.memory_exceeded = j.value("memory_exceeded", false);
  p.peak_rss_bytes = j.value("peak_rss_bytes", int64_t{0});
  return p;
}

nlohmann::json TimingSummary::to_json() const {
  auto stats = [](const std::optional<TimingStats>& s) { return s ? s->to_json() : nlohmann::json(nullptr); };
  nlohmann::json j = {{"eager", stats(eager)},
                      {"compile", stats(compile)},
                      {"baselines_cached", baselines_cached},
                      {"compile_error", optional_json(compile_error)}};
  if (candidate) j["candidate"] = candidate->to_json();
  return j;
}

TimingSummary TimingSummary::from_json(const nlohmann::json& j) {
  TimingSummary t;
  auto stats = [&](const char* key) -> std::optional<TimingStats> {
    if (!j.contains(key) || !j[key].is_object()) return std::nullopt;
    return TimingStats::from_json(j[key]);
  };
  t.eager = stats("eager");
  t.compile = stats("compile");
  t.candidate = stats("candidate");
  t.baselines_cached = j.value("baselines_cached", false);
  t.compile_error = optional_from<std::string>(j, "compile_error");
  return t;
}

bool EvalResult::degenerate() const {
  const nlohmann::json& check = reports.contains("task_check") ? reports["task_check"] : nlohmann::json();
  return check.is_object() && check.value("degenerate", false);
}

void EvalResult::fail(Category c, std::string text) {
  ok = false;
  category = c;
  message = std::move(text);
  reward = -1.0;
  if (is_wrong_answer(c)) correct = false;
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json j = {
      {"schema_version", kSchemaVersion},
      {"task_id", task_id},
      {"task_path", task_path},
      {"task_sha256", task_sha256},
      {"solution_path", solution_path},
      {"solution_sha256", solution_sha256},
      {"mode", mode},
      {"ok", ok},
      {"category", category == Category::kNone ? nlohmann::json(nullptr) : nlohmann::json(to_string(category))},
      {"message", message},
      {"correct", optional_json(correct)},
      {"reward", optional_json(reward)},
      {"reward_kind", reward_kind},
      {"speedup_vs_eager", optional_json(speedup_vs_eager)},
      {"speedup_vs_compile", optional_json(speedup_vs_compile)},
      {"precision", precision},
      {"options", options},
      {"phase_seconds", phase_seconds},
  };
  if (input_seed) j["input_seed"] = *input_seed;
  if (timings) j["timings"] = timings->to_json();
  if (!build_path.empty()) j["build_path"] = build_path;
  for (const char* key : kReports)
    if (reports.contains(key) && !reports[key].is_null()) j[key] = reports[key];
  nlohmann::json w = worker.to_json();
  w["gpu"] = gpu;
  w["confine"] = confine;
  w["confined"] = confined;
  if (!confined && !unconfined_reason.empty()) w["unconfined_reason"] = unconfined_reason;
  if (confinement_unavailable) w["confinement_unavailable"] = true;
  w["signals_scoped"] = signals_scoped;
  if (!signals_scoped && !signals_unscoped_reason.empty()) w["signals_unscoped_reason"] = signals_unscoped_reason;
  if (judge) w["judge"] = judge->to_json();
  j["worker"] = w;
  if (!ok) j["log"] = log;
  j["worker_seconds"] = worker_seconds;
  j["wall_seconds"] = wall_seconds;
  return j;
}

EvalResult EvalResult::from_json(const nlohmann::json& j) {
  CA_CHECK(j.is_object(), "an evaluation result must be a JSON object, got {}", j.type_name());
  EvalResult r;
  r.task_id = j.value("task_id", "");
  r.task_path = j.value("task_path", "");
  r.task_sha256 = j.value("task_sha256", "");
  r.solution_path = j.value("solution_path", "");
  r.solution_sha256 = j.value("solution_sha256", "");
  r.mode = j.value("mode", "");
  r.ok = j.value("ok", false);
  r.category = j.contains("category") && j["category"].is_string() ? category_from_string(j["category"])
                                                                     : Category::kNone;
  r.message = j.value("message", "");
  r.correct = optional_from<bool>(j, "correct");
  r.reward = optional_from<double>(j, "reward");
  r.reward_kind = j.value("reward_kind", "");
  r.speedup_vs_eager = optional_from<double>(j, "speedup_vs_eager");
  r.speedup_vs_compile = optional_from<double>(j, "speedup_vs_compile");
  r.precision = j.value("precision", "");
  r.options = j.value("options", nlohmann::json::object());
  if (j.contains("phase_seconds") && j["phase_seconds"].is_object())
    r.phase_seconds = j["phase_seconds"].get<std::map<std::string, double>>();
  r.input_seed = optional_from<int64_t>(j, "input_seed");
  if (j.contains("timings") && j["timings"].is_object()) r.timings = TimingSummary::from_json(j["timings"]);
  r.build_path = j.value("build_path", "");
  for (const char* key : kReports)
    if (j.contains(key)) r.reports[key] = j[key];
  const nlohmann::json w = j.value("worker", nlohmann::json::object());
  r.worker = ProcessReport::from_json(w);
  r.gpu = w.value("gpu", 0);
  r.confine = w.value("confine", "");
  r.confined = w.value("confined", false);
  r.unconfined_reason = w.value("unconfined_reason", "");
  r.confinement_unavailable = w.value("confinement_unavailable", false);
  r.signals_scoped = w.value("signals_scoped", false);
  r.signals_unscoped_reason = w.value("signals_unscoped_reason", "");
  if (w.contains("judge") && w["judge"].is_object()) r.judge = ProcessReport::from_json(w["judge"]);
  r.log = j.value("log", "");
  r.worker_seconds = j.value("worker_seconds", 0.0);
  r.wall_seconds = j.value("wall_seconds", 0.0);
  return r;
}

}  // namespace cuda_agent::sandbox
