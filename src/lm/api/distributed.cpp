#include "cuda_agent/lm/distributed.h"

#include <charconv>
#include <cstdlib>

#include "cuda_agent/core/error.h"

namespace cuda_agent::lm {
namespace {

int whole_number(const std::map<std::string, std::string>& env, const char* name, int fallback) {
  const auto it = env.find(name);
  if (it == env.end()) return fallback;
  int x = 0;
  const std::string& v = it->second;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  CA_CHECK(ec == std::errc() && end == v.data() + v.size() && !v.empty(),
           "environment: {}='{}' is not a whole number (torchrun sets it; unset it for a single process)", name, v);
  return x;
}

}  // namespace

DistributedOptions DistributedOptions::from_environment(const std::map<std::string, std::string>& env) {
  DistributedOptions o;
  CA_CHECK(env.count("RANK") == env.count("WORLD_SIZE"),
           "environment: {} is set but {} is not; set both (torchrun does) or neither (a single process)",
           env.count("RANK") ? "RANK" : "WORLD_SIZE", env.count("RANK") ? "WORLD_SIZE" : "RANK");
  o.world_size = whole_number(env, "WORLD_SIZE", 1);
  CA_CHECK(o.world_size >= 1, "environment: WORLD_SIZE={} must be at least 1", o.world_size);
  o.rank = whole_number(env, "RANK", 0);
  CA_CHECK(o.rank >= 0 && o.rank < o.world_size, "environment: RANK={} must be in [0, WORLD_SIZE={})", o.rank,
           o.world_size);
  o.local_rank = whole_number(env, "LOCAL_RANK", o.rank);
  CA_CHECK(o.local_rank >= 0, "environment: LOCAL_RANK={} must not be negative", o.local_rank);
  if (const auto it = env.find("MASTER_ADDR"); it != env.end()) {
    CA_CHECK(!it->second.empty(), "environment: MASTER_ADDR is empty; set it to rank 0's host (127.0.0.1 on one host)");
    o.master_addr = it->second;
  }
  o.master_port = whole_number(env, "MASTER_PORT", o.master_port);
  CA_CHECK(o.master_port >= 1 && o.master_port <= 65535, "environment: MASTER_PORT={} must be in 1..65535",
           o.master_port);
  return o;
}

DistributedOptions DistributedOptions::from_environment() {
  std::map<std::string, std::string> env;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    if (const char* v = std::getenv(name)) env[name] = v;
  return from_environment(env);
}

}  // namespace cuda_agent::lm
