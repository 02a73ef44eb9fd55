#include <algorithm>
#include <filesystem>
#include <vector>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace cuda_agent::sandbox {

std::string solution_fingerprint(const std::string& solution_path) {
  namespace fs = std::filesystem;
  // What a solution's folder may hold and still be hashed whole; a larger one is never shared.
  constexpr size_t kMaxFiles = 4096;
  constexpr uintmax_t kMaxBytes = uintmax_t{64} << 20;
  Sha256 hash;
  try {
    hash.update(read_file(solution_path));
  } catch (...) {
    return "";
  }
  // Every other file of the folder (helpers it imports, kernels/, data it reads): by relative
  // path, in path order; a link by its target and the bytes it reads as. Hidden entries and __pycache__
  // too: the candidate's loader compiles the folder's modules from their source, but a program
  // may read any file beside it (an exec of a hidden file, a .pyc unmarshalled by hand), and two
  // folders that differ in any byte are two programs. A folder that cannot be read whole
  // (too large, a file gone or unreadable meanwhile) gets a fingerprint of its own: nothing cached
  // for another solution is taken for it.
  fs::path folder = fs::path(solution_path).parent_path();
  if (folder.empty()) folder = ".";
  std::vector<std::pair<std::string, fs::path>> files;
  uintmax_t bytes = 0;
  bool whole = true;
  std::error_code walk;
  fs::recursive_directory_iterator it(folder, fs::directory_options::skip_permission_denied, walk);
  for (; !walk && it != fs::recursive_directory_iterator(); it.increment(walk)) {
    std::error_code ec;
    const fs::path& p = it->path();
    const bool link = it->is_symlink(ec);
    if (!link && !it->is_regular_file(ec)) continue;
    if (fs::equivalent(p, solution_path, ec)) continue;
    if (!link) bytes += it->file_size(ec);
    files.emplace_back(fs::relative(p, folder, ec).generic_string(), p);
    if (files.size() > kMaxFiles || bytes > kMaxBytes) {
      whole = false;
      break;
    }
  }
  if (walk) whole = false;
  std::sort(files.begin(), files.end());
  for (size_t i = 0; whole && i < files.size(); ++i) {
    const auto& [relative, path] = files[i];
    hash.update(relative);
    hash.update(std::string(1, '\0'));
    std::error_code ec;
    try {
      if (fs::is_symlink(path, ec)) {
        // The link's text, framed by its length, and what it reads as: the loader follows links,
        // so a link to a file outside the folder is that file's bytes. A link to a folder (its
        // files are not walked) leaves the folder without a fingerprint to share.
        const std::string target = fs::read_symlink(path, ec).string();
        hash.update("link:" + std::to_string(target.size()) + ":" + target);
        hash.update(std::string(1, '\0'));
        if (fs::is_directory(path, ec)) whole = false;
        if (fs::is_regular_file(path, ec)) {
          const std::string content = read_file(path);
          bytes += content.size();
          if (bytes > kMaxBytes) whole = false;
          hash.update(std::to_string(content.size()));
          hash.update(std::string(1, '\0'));
          hash.update(content);
        }
        ec.clear();  // a dangling link is its text alone
      } else {
        const std::string content = read_file(path);
        hash.update(std::to_string(content.size()));
        hash.update(std::string(1, '\0'));
        hash.update(content);
      }
    } catch (...) {
      whole = false;
    }
    if (ec) whole = false;
  }
  if (!whole) hash.update(random_bytes(16));
  return hash.hex_digest();
}

nlohmann::json SandboxOptions::to_json() const {
  return {{"trials", trials},
          {"seed", seed},
          {"atol", atol},
          {"rtol", rtol},
          {"precision", precision},
          {"strict_factor", strict_factor},
          {"strict_floor", strict_floor},
          {"fallback", fallback},
          {"provenance", provenance},
          {"provenance_allow", provenance_allow},
          {"integrity_checks", integrity_checks},
          {"secret_seeds", secret_seeds},
          {"warmup_runs", warmup_runs},
          {"warmup_ms", warmup_ms},
          {"timed_runs", timed_runs},
          {"flush_l2", flush_l2},
          {"compile_mode", compile_mode},
          {"profile_compile", profile_compile},
          {"record_kernels", record_kernels},
          {"use_baseline_cache", use_baseline_cache},
          {"compile_baseline", compile_baseline},
          {"baseline_drift", baseline_drift},
          {"quiet_start", quiet_start},
          {"compile_before_lock", compile_before_lock},
          {"init_before_lock", init_before_lock},
          {"prebuild", prebuild},
          {"judge_bracket", judge_bracket},
          {"slice_watch", slice_watch},
          {"warm_workers", warm_workers},
          {"reward", reward},
          {"speedup_margin", speedup_margin},
          {"reward_rule", reward_rule},
          {"timeout_s", timeout_s},
          {"forward_timeout_s", forward_timeout_s},
          {"gpu_wait_s", gpu_wait_s},
          {"host_memory_gb", host_memory_gb},
          {"gpu_memory_fraction", gpu_memory_fraction},
          {"cache_dir", cache_dir},
          {"confine", confine},
          {"read_scope", read_scope}};
}

nlohmann::json SandboxOptions::defaults() { return SandboxOptions{}.to_json(); }

SandboxOptions SandboxOptions::from_json(const nlohmann::json& j) {
  nlohmann::json merged = defaults();
  merged.update(j);
  SandboxOptions o;
  o.trials = merged["trials"];
  o.seed = merged["seed"];
  o.atol = merged["atol"];
  o.rtol = merged["rtol"];
  o.precision = merged["precision"];
  o.strict_factor = merged["strict_factor"];
  o.strict_floor = merged["strict_floor"];
  o.fallback = merged["fallback"];
  o.provenance = merged["provenance"];
  o.provenance_allow = merged["provenance_allow"].get<std::vector<std::string>>();
  o.integrity_checks = merged["integrity_checks"];
  o.secret_seeds = merged["secret_seeds"];
  o.warmup_runs = merged["warmup_runs"];
  o.warmup_ms = merged["warmup_ms"];
  o.timed_runs = merged["timed_runs"];
  o.flush_l2 = merged["flush_l2"];
  o.compile_mode = merged["compile_mode"];
  o.profile_compile = merged["profile_compile"];
  o.record_kernels = merged["record_kernels"];
  o.use_baseline_cache = merged["use_baseline_cache"];
  o.compile_baseline = merged["compile_baseline"];
  o.baseline_drift = merged["baseline_drift"];
  o.quiet_start = merged["quiet_start"];
  o.compile_before_lock = merged["compile_before_lock"];
  o.init_before_lock = merged["init_before_lock"];
  o.prebuild = merged["prebuild"];
  o.judge_bracket = merged["judge_bracket"];
  o.slice_watch = merged["slice_watch"];
  o.warm_workers = merged["warm_workers"];
  o.reward = merged["reward"];
  o.speedup_margin = merged["speedup_margin"];
  o.reward_rule = merged["reward_rule"];
  o.timeout_s = merged["timeout_s"];
  o.forward_timeout_s = merged["forward_timeout_s"];
  o.gpu_wait_s = merged["gpu_wait_s"];
  o.host_memory_gb = merged["host_memory_gb"];
  o.gpu_memory_fraction = merged["gpu_memory_fraction"];
  o.cache_dir = merged["cache_dir"];
  o.confine = merged["confine"];
  o.read_scope = merged["read_scope"];
  CA_CHECK(o.trials >= 1, "sandbox.trials must be at least 1, got {}", o.trials);
  CA_CHECK(o.warm_workers >= 0 && o.warm_workers <= 16, "sandbox.warm_workers must be 0 to 16, got {}", o.warm_workers);
  CA_CHECK(o.timed_runs >= 1, "sandbox.timed_runs must be at least 1, got {}", o.timed_runs);
  CA_CHECK(o.atol >= 0 && o.rtol >= 0, "sandbox.atol and sandbox.rtol must be >= 0, got {} and {}", o.atol, o.rtol);
  CA_CHECK(o.precision == "loose" || o.precision == "strict" || o.precision == "tf32",
           "sandbox.precision '{}' is unknown: use loose, strict or tf32", o.precision);
  CA_CHECK(o.fallback == "off" || o.fallback == "warn" || o.fallback == "enforce",
           "sandbox.fallback '{}' is unknown: use off, warn or enforce", o.fallback);
  CA_CHECK(o.provenance == "off" || o.provenance == "warn" || o.provenance == "enforce",
           "sandbox.provenance '{}' is unknown: use off, warn or enforce", o.provenance);
  CA_CHECK(o.strict_factor >= 1 && o.strict_floor >= 0, "sandbox.strict_factor must be >= 1 and strict_floor >= 0, got {} and {}",
           o.strict_factor, o.strict_floor);
  CA_CHECK(o.reward == "milestone" || o.reward == "raw_speedup",
           "sandbox.reward '{}' is unknown: use 'milestone' or 'raw_speedup'", o.reward);
  CA_CHECK(o.reward_rule == "interval" || o.reward_rule == "point",
           "sandbox.reward_rule '{}' is unknown: use 'interval' (the speedup's 95% interval decides) or 'point' (the "
           "point estimate decides, as in the CUDA Agent paper)",
           o.reward_rule);
  CA_CHECK(o.compile_baseline == "cached" || o.compile_baseline == "fresh",
           "sandbox.compile_baseline '{}' is unknown: use 'cached' (timed once per task, carried over by eager's "
           "drift) or 'fresh' (timed in every evaluation)",
           o.compile_baseline);
  CA_CHECK(o.baseline_drift > 0, "sandbox.baseline_drift must be positive (a fraction such as 0.1), got {}",
           o.baseline_drift);
  CA_CHECK(o.timeout_s > 0, "sandbox.timeout_s must be positive, got {}", o.timeout_s);
  CA_CHECK(o.forward_timeout_s >= 0,
           "sandbox.forward_timeout_s must be >= 0 (seconds one forward of the solution may take; 0: timeout_s alone), "
           "got {}",
           o.forward_timeout_s);
  CA_CHECK(o.gpu_wait_s >= 0, "sandbox.gpu_wait_s must be >= 0 (seconds an evaluation may wait for the GPU's locks), got {}",
           o.gpu_wait_s);
  CA_CHECK(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1,
           "sandbox.gpu_memory_fraction must be in (0, 1], got {}", o.gpu_memory_fraction);
  CA_CHECK(o.confine == "auto" || o.confine == "namespaces" || o.confine == "off",
           "sandbox.confine '{}' is unknown: use auto, namespaces or off", o.confine);
  CA_CHECK(o.read_scope == "all" || o.read_scope == "system",
           "sandbox.read_scope '{}' is unknown: use all (the file system read-only but for what is hidden) or system "
           "(the system's and Python's folders, the task and the solution only)",
           o.read_scope);
  return o;
}

std::string SandboxOptions::resolved_cache_dir() const {
  return cache_dir.empty() ? default_cache_dir().string() : cache_dir;
}

const char* to_string(EvalMode mode) {
  switch (mode) {
    case EvalMode::kVerify: return "verify";
    case EvalMode::kProfile: return "profile";
    case EvalMode::kEvaluate: return "evaluate";
    case EvalMode::kBaselines: return "baselines";
  }
  return "?";
}

EvalMode eval_mode_from_string(const std::string& s) {
  if (s == "verify") return EvalMode::kVerify;
  if (s == "profile") return EvalMode::kProfile;
  if (s == "evaluate") return EvalMode::kEvaluate;
  if (s == "baselines") return EvalMode::kBaselines;
  CA_FAIL("unknown evaluation mode '{}': use verify, profile, evaluate or baselines", s);
}

nlohmann::json EvalRequest::to_json() const {
  return {{"task_path", task_path},   {"solution_path", solution_path}, {"task_id", task_id},
          {"mode", to_string(mode)},  {"device", device},               {"gpu", gpu},
          {"gpu_lock", gpu_lock},     {"options", options.to_json()},   {"confine_candidate", confine_candidate},
          {"unconfined_reason", unconfined_reason}, {"confine_required", confine_required},
          {"hidden_paths", hidden_paths}};
}

EvalRequest EvalRequest::from_json(const nlohmann::json& j) {
  EvalRequest r;
  r.task_path = j.at("task_path");
  r.solution_path = j.at("solution_path");
  r.task_id = j.value("task_id", "");
  r.mode = eval_mode_from_string(j.value("mode", "evaluate"));
  r.device = j.value("device", "cuda");
  r.gpu = j.value("gpu", 0);
  r.gpu_lock = j.value("gpu_lock", false);
  r.options = SandboxOptions::from_json(j.value("options", nlohmann::json::object()));
  r.confine_candidate = j.value("confine_candidate", true);
  r.unconfined_reason = j.value("unconfined_reason", "");
  r.confine_required = j.value("confine_required", false);
  r.hidden_paths = j.value("hidden_paths", std::vector<std::string>{});
  return r;
}

}  // namespace cuda_agent::sandbox
