#include "cuda_agent/rl/rft_filter.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/log.h"

namespace cuda_agent::rl {
namespace {

using nlohmann::json;

const json& field(const json& section, const std::string& key, const std::string& where) {
  CA_CHECK(section.is_object() && section.contains(key), "{}: missing key '{}'", where, key);
  return section[key];
}

int int_field(const json& event, const std::string& key, const std::string& where) {
  const json& v = field(event, key, where);
  CA_CHECK(v.is_number_integer(), "{}: '{}' must be an integer, got {}", where, key, v.dump());
  return v.get<int>();
}

}  // namespace

RftFilterOptions RftFilterOptions::from_config(const json& rft) {
  const std::string where = "train config stages.rft";
  RftFilterOptions o;
  const json& above = field(rft, "keep_reward_above", where);
  CA_CHECK(above.is_number(), "{}: 'keep_reward_above' must be a number, got {}", where, above.dump());
  o.keep_reward_above = above.get<double>();
  const json& reasons = field(rft, "drop_stop_reasons", where);
  CA_CHECK(reasons.is_array(), "{}: 'drop_stop_reasons' must be a list, got {}", where, reasons.dump());
  o.drop_stop_reasons.clear();
  for (const auto& r : reasons) {
    CA_CHECK(r.is_string(), "{}: 'drop_stop_reasons' holds {}, not a stop reason", where, r.dump());
    o.drop_stop_reasons.push_back(r.get<std::string>());
  }
  o.max_invalid_tool_calls = int_field(rft, "max_invalid_tool_calls", where);
  return o;
}

TrajectoryOutcome read_trajectory_outcome(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  std::optional<json> score;
  int replies = 0;
  size_t line_no = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    CA_CHECK(event.is_object(), "{}:{}: not a JSON object (a truncated or corrupt line?)", path.string(), line_no);
    const auto type = event.find("type");
    if (type != event.end() && *type == "assistant") ++replies;
    if (type == event.end() || *type != "score") continue;
    CA_CHECK(!score, "{}:{}: a second score event; a trajectory has one", path.string(), line_no);
    score = std::move(event);
  }
  CA_CHECK(score, "{}: no score event (the episode did not finish?)", path.string());

  const std::string where = path.string() + ": score event";
  TrajectoryOutcome out;
  const json& stop = field(*score, "stop_reason", where);
  CA_CHECK(stop.is_string(), "{}: 'stop_reason' must be a string, got {}", where, stop.dump());
  out.stop_reason = stop.get<std::string>();
  const json& reward = field(*score, "reward", where);
  CA_CHECK(reward.is_number(), "{}: 'reward' must be a number, got {}", where, reward.dump());
  out.reward = reward.get<double>();
  out.turns = int_field(*score, "turns", where);
  out.tool_calls = int_field(*score, "tool_calls", where);
  out.invalid_tool_calls = int_field(*score, "invalid_tool_calls", where);
  out.replies = replies;
  return out;
}

RftFilterResult filter_trajectories(const std::vector<std::filesystem::path>& files, const RftFilterOptions& o) {
  CA_CHECK(o.max_invalid_tool_calls >= -1, "max_invalid_tool_calls = {} is out of range: must be >= -1",
           o.max_invalid_tool_calls);
  RftFilterResult result;
  auto drop = [&](const std::filesystem::path& path, std::string reason, std::string detail) {
    ++result.dropped_by_reason[reason];
    result.dropped.push_back({path, std::move(reason), std::move(detail)});
  };
  for (const auto& path : files) {
    TrajectoryOutcome t;
    try {
      t = read_trajectory_outcome(path);
    } catch (const std::exception& e) {  // Error, or a JSON library error we did not foresee
      CA_LOG_WARN("rl", "RFT: dropping malformed trajectory {}: {}", path.string(), e.what());
      drop(path, "malformed", e.what());
      continue;
    }
    const auto& reasons = o.drop_stop_reasons;
    if (t.replies == 0) {
      drop(path, "no_reply", fmt::format("stopped with {} before the policy's first reply", t.stop_reason));
    } else if (std::find(reasons.begin(), reasons.end(), t.stop_reason) != reasons.end()) {
      drop(path, "stop_reason:" + t.stop_reason, fmt::format("stopped with {}", t.stop_reason));
    } else if (o.max_invalid_tool_calls >= 0 && t.invalid_tool_calls > o.max_invalid_tool_calls) {
      drop(path, "too_many_invalid_tool_calls",
           fmt::format("{} invalid tool calls > {}", t.invalid_tool_calls, o.max_invalid_tool_calls));
    } else if (!(t.reward > o.keep_reward_above)) {
      drop(path, "low_reward", fmt::format("reward {:g} <= {:g}", t.reward, o.keep_reward_above));
    } else {
      result.kept.push_back(path);
    }
  }
  CA_LOG_INFO("rl", "RFT filter: kept {} of {} trajectories", result.kept.size(), result.total());
  return result;
}

RftFilterResult filter_trajectories(const std::vector<std::filesystem::path>& files,
                                    const nlohmann::json& rft_section) {
  return filter_trajectories(files, RftFilterOptions::from_config(rft_section));
}

}  // namespace cuda_agent::rl
