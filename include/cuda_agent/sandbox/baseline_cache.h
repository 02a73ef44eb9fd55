// On-disk cache of baseline timings (eager and torch.compile) so that evaluations of many
// solutions of one task time the baselines once.
//
// The key covers everything that changes a baseline: the task file's content, the GPU's name,
// the torch version, the precision policy and the timing settings (runs, warm-up, L2 flush,
// torch.compile mode). Entries are JSON files written atomically, each with an HMAC-SHA256
// under a secret key of the cache (cache_secret()): only the judge, which never runs solution
// code, holds the key; confined candidate processes cannot read it, so an entry a solution
// wrote does not verify and is a miss. An unreadable or unverified entry is a miss.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

struct BaselineKey {
  std::string task_sha256;
  std::string gpu_name;
  std::string torch_version;
  std::string precision;
  nlohmann::json timing;  // the timing settings that matter
  std::string digest() const;
  nlohmann::json to_json() const;
};

struct SandboxOptions;

// The part of a baseline's key that an evaluation's options decide, for the task whose file
// hashes to `task_sha256`: its precision and timing settings. The judge fills in the rest (the
// GPU's name, torch's version, the driver's: timing.driver_version).
BaselineKey baseline_key_of(const std::string& task_sha256, const SandboxOptions& opt);

// Whether the scoring cache of `opt` holds baselines of the task file `task` under `opt`'s
// settings (BaselineCache::holds: timed on any GPU). What a runner asks before it starts judges
// to time them: a judge that finds them cached still waits for the GPU's lock. Never throws:
// false when it cannot tell.
bool baselines_cached(const std::filesystem::path& task, const SandboxOptions& opt);

// The folder of a cache that holds its secret key (hidden from confined candidate processes).
std::filesystem::path cache_secret_dir(const std::filesystem::path& cache_dir);
// That folder, created (0700) when missing, without reading or making the key: what a process
// does before it forks one that must never hold the key. Throws Error when it cannot be made.
void ensure_cache_secret_dir(const std::filesystem::path& cache_dir);
// The cache's secret key, created (32 random bytes, a 0600 file in a 0700 folder) on first use.
// Throws Error when it can neither be read nor created.
std::string cache_secret(const std::filesystem::path& cache_dir);

class BaselineCache {
 public:
  // `dir`: the baselines folder; `key`: the secret entries are authenticated with.
  BaselineCache(std::filesystem::path dir, std::string key);
  // The baselines of the cache folder `cache_dir` (its baselines/ folder, under its secret key).
  static BaselineCache of(const std::filesystem::path& cache_dir);
  // The cached entry ({"eager": ..., "compile": ...}) or nullopt. Never throws.
  std::optional<nlohmann::json> get(const BaselineKey& key) const;
  // Stores an entry; failures to write are logged, not thrown.
  void put(const BaselineKey& key, const nlohmann::json& entry) const;
  std::filesystem::path path_for(const BaselineKey& key) const;
  // Copies the entries of the task whose file hashes to `task_sha256` that verify under this
  // cache's key into `to`, authenticated under `to`'s key (replacing what `to` had): how a
  // trusted process hands its baselines to a cache that commands it does not trust write to (an
  // agent's tools), never the other way. Reads no other task's entries. Returns how many it
  // copied. Never throws.
  int copy_verified_to(const BaselineCache& to, const std::string& task_sha256) const;
  // Whether an entry of `partial`'s task verifies under this cache's key and has its precision
  // and every timing setting it names; the GPU, torch and driver are not compared (what a process
  // that never initialises CUDA can ask, before it starts judges to time baselines: an entry of
  // another GPU counts, and the evaluations then time what they miss). Never throws.
  bool holds(const BaselineKey& partial) const;

 private:
  std::string mac(const nlohmann::json& stored) const;
  bool verifies(const nlohmann::json& stored) const;  // its "mac" is this cache's of the rest
  std::filesystem::path dir_;
  std::string key_;
};

}  // namespace cuda_agent::sandbox
