// On-disk cache of baseline timings (eager and torch.compile) so that evaluations of many
// solutions of one task time the baselines once.
//
// The key covers everything that changes a baseline: the task file's content, the GPU's name,
// the torch version, the precision policy and the timing settings (runs, warm-up, L2 flush,
// torch.compile mode). Entries are JSON files written atomically; an unreadable entry is a miss.
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

class BaselineCache {
 public:
  explicit BaselineCache(std::filesystem::path dir);
  // The cached entry ({"eager": ..., "compile": ...}) or nullopt. Never throws.
  std::optional<nlohmann::json> get(const BaselineKey& key) const;
  // Stores an entry; failures to write are logged, not thrown.
  void put(const BaselineKey& key, const nlohmann::json& entry) const;
  std::filesystem::path path_for(const BaselineKey& key) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace cuda_agent::sandbox
