#include "cuda_agent/sandbox/baseline_cache.h"

#include <sys/stat.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/sandbox/evaluation.h"

namespace fs = std::filesystem;

namespace cuda_agent::sandbox {

nlohmann::json BaselineKey::to_json() const {
  return {{"task_sha256", task_sha256}, {"gpu_name", gpu_name}, {"torch_version", torch_version},
          {"precision", precision},     {"timing", timing},     {"schema", 1}};
}

std::string BaselineKey::digest() const { return sha256_hex(to_json().dump()); }

fs::path cache_secret_dir(const fs::path& cache_dir) { return cache_dir / "secret"; }

void ensure_cache_secret_dir(const fs::path& cache_dir) {
  const fs::path dir = cache_secret_dir(cache_dir);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  fs::create_directories(dir, ec);
  CA_CHECK(!ec, "cannot create the cache's secret folder {}: {}", dir.string(), ec.message());
  ::chmod(dir.c_str(), 0700);
}

std::string cache_secret(const fs::path& cache_dir) {
  const fs::path dir = cache_secret_dir(cache_dir);
  const fs::path file = dir / "key";
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) {
    const std::string key = read_file(file);
    CA_CHECK(key.size() >= 32, "the cache key {} is truncated: delete the folder {} to make a new one", file.string(),
             dir.string());
    return key;
  }
  ensure_cache_secret_dir(cache_dir);
  const std::string key = random_hex(32);
  write_file_atomic(file, key);
  ::chmod(file.c_str(), 0600);
  return read_file(file);  // another process may have won the race: use what is on disk
}

BaselineCache::BaselineCache(fs::path dir, std::string key) : dir_(std::move(dir)), key_(std::move(key)) {}

BaselineCache BaselineCache::of(const fs::path& cache_dir) { return {cache_dir / "baselines", cache_secret(cache_dir)}; }

namespace {

// An entry's file name starts with its task's hash (then the digest of its whole key), so that
// a task's entries are found without reading the others.
std::string task_prefix(const std::string& task_sha256) { return task_sha256.substr(0, 16) + "-"; }

// Calls `visit` on each entry file of the task `task_sha256` in `dir` until it returns true;
// returns whether one did.
template <typename Visit>
bool any_task_entry(const fs::path& dir, const std::string& task_sha256, Visit visit) {
  const std::string prefix = task_prefix(task_sha256);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    if (path.extension() == ".json" && path.filename().string().rfind(prefix, 0) == 0 && visit(path)) return true;
  }
  return false;
}

}  // namespace

BaselineKey baseline_key_of(const std::string& task_sha256, const SandboxOptions& opt) {
  BaselineKey key;
  key.task_sha256 = task_sha256;
  // loose and strict time the same float32 baselines (they differ only in how the candidate is
  // checked), so they share one key, spelled "loose"; tf32 baselines are other runs.
  key.precision = opt.precision == "tf32" ? "tf32" : "loose";
  key.timing = {{"warmup_runs", opt.warmup_runs},
                {"warmup_ms", opt.warmup_ms},
                {"timed_runs", opt.timed_runs},
                {"flush_l2", opt.flush_l2},
                {"compile_mode", opt.compile_mode},
                {"profile_compile", opt.profile_compile},
                {"seed", opt.seed},
                {"record_kernels", opt.record_kernels},
                {"protocol", "interleaved-rounds-v3"}};
  return key;
}

fs::path BaselineCache::path_for(const BaselineKey& key) const {
  return dir_ / (task_prefix(key.task_sha256) + key.digest() + ".json");
}

bool BaselineCache::verifies(const nlohmann::json& stored) const {
  return stored.contains("mac") && stored["mac"].is_string() &&
         constant_time_equal(stored["mac"].get<std::string>(), mac(stored));
}

std::string BaselineCache::mac(const nlohmann::json& stored) const {
  nlohmann::json body = stored;
  body.erase("mac");
  return hmac_sha256_hex(key_, body.dump());
}

std::optional<nlohmann::json> BaselineCache::get(const BaselineKey& key) const {
  const auto path = path_for(key);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    auto entry = nlohmann::json::parse(read_file(path));
    if (entry.at("key") != key.to_json()) return std::nullopt;  // a digest collision, or tampering
    if (!verifies(entry)) {
      CA_LOG_WARN("sandbox", "ignoring baseline cache entry {}: its MAC does not verify (not written by a judge "
                  "holding this cache's key)", path.string());
      return std::nullopt;
    }
    entry.erase("mac");
    return entry;
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "ignoring unreadable baseline cache entry {}: {}", path.string(), e.what());
    return std::nullopt;
  }
}

void BaselineCache::put(const BaselineKey& key, const nlohmann::json& entry) const {
  nlohmann::json stored = entry;
  stored["key"] = key.to_json();
  stored["mac"] = mac(stored);
  try {
    write_file_atomic(path_for(key), stored.dump(2));
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "cannot write baseline cache entry in {}: {}", dir_.string(), e.what());
  }
}

int BaselineCache::copy_verified_to(const BaselineCache& to, const std::string& task_sha256) const {
  int copied = 0;
  any_task_entry(dir_, task_sha256, [&](const fs::path& path) {
    try {
      nlohmann::json entry = nlohmann::json::parse(read_file(path));
      if (!verifies(entry)) return false;
      entry["mac"] = to.mac(entry);
      std::error_code dir_ec;
      fs::create_directories(to.dir_, dir_ec);
      write_file_atomic(to.dir_ / path.filename(), entry.dump(2));
      ++copied;
    } catch (const std::exception& e) {
      CA_LOG_WARN("sandbox", "cannot copy baseline cache entry {} to {}: {}", path.string(), to.dir_.string(), e.what());
    }
    return false;
  });
  return copied;
}

bool BaselineCache::holds(const BaselineKey& partial) const {
  return any_task_entry(dir_, partial.task_sha256, [&](const fs::path& path) {
    try {
      const nlohmann::json entry = nlohmann::json::parse(read_file(path));
      const nlohmann::json& key = entry.at("key");
      if (key.at("task_sha256") != partial.task_sha256 || key.at("precision") != partial.precision) return false;
      const nlohmann::json& timing = key.at("timing");
      if (!timing.is_object() || !partial.timing.is_object()) return false;
      for (auto it = partial.timing.begin(); it != partial.timing.end(); ++it)
        if (!timing.contains(it.key()) || timing.at(it.key()) != it.value()) return false;
      return verifies(entry);
    } catch (const std::exception&) {
      return false;  // unreadable: not held
    }
  });
}

bool baselines_cached(const fs::path& task, const SandboxOptions& opt) {
  try {
    const std::string sha = file_sha256(task);
    return !sha.empty() && BaselineCache::of(opt.resolved_cache_dir()).holds(baseline_key_of(sha, opt));
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace cuda_agent::sandbox
