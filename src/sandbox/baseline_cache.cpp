#include "cuda_agent/sandbox/baseline_cache.h"

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/hash.h"
#include "cuda_agent/core/log.h"

namespace cuda_agent::sandbox {

nlohmann::json BaselineKey::to_json() const {
  return {{"task_sha256", task_sha256}, {"gpu_name", gpu_name}, {"torch_version", torch_version},
          {"precision", precision},     {"timing", timing},     {"schema", 1}};
}

std::string BaselineKey::digest() const { return sha256_hex(to_json().dump()); }

BaselineCache::BaselineCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

std::filesystem::path BaselineCache::path_for(const BaselineKey& key) const {
  return dir_ / (key.digest() + ".json");
}

std::optional<nlohmann::json> BaselineCache::get(const BaselineKey& key) const {
  const auto path = path_for(key);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    auto entry = nlohmann::json::parse(read_file(path));
    if (entry.at("key") != key.to_json()) return std::nullopt;  // a digest collision, or tampering
    return entry;
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "ignoring unreadable baseline cache entry {}: {}", path.string(), e.what());
    return std::nullopt;
  }
}

void BaselineCache::put(const BaselineKey& key, const nlohmann::json& entry) const {
  nlohmann::json stored = entry;
  stored["key"] = key.to_json();
  try {
    write_file_atomic(path_for(key), stored.dump(2));
  } catch (const std::exception& e) {
    CA_LOG_WARN("sandbox", "cannot write baseline cache entry in {}: {}", dir_.string(), e.what());
  }
}

}  // namespace cuda_agent::sandbox
