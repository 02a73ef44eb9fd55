// RFT trajectory filtering: which sampled agent trajectories the actor is fine-tuned on.
//
// A trajectory is the JSONL file an episode writes (agent/episode.cpp): one JSON event per
// line, "type" being episode, system, user, assistant, observation, answer, error or score.
// The episode's outcome is its one "score" event:
//   {"type": "score", "stop_reason": "answered"|"max_turns"|"policy_error"|"invalid_tool_calls"|
//    "looping"|"single_turn", "turns": N, "tool_calls": N, "invalid_tool_calls": N,
//    "reward": R, "result": {the sandbox's result}}
// invalid_tool_calls counts calls that failed to parse and calls that ran and failed.
//
// Thread-safe: no shared state; files are only read.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cuda_agent::rl {

// The RFT stage's filter settings (train config stages.rft).
struct RftFilterOptions {
  double keep_reward_above = 0.0;  // keep only reward > this
  std::vector<std::string> drop_stop_reasons = {"looping", "invalid_tool_calls", "policy_error"};
  int max_invalid_tool_calls = -1;  // drop when invalid_tool_calls > this; -1: no limit

  // Reads keep_reward_above, drop_stop_reasons and max_invalid_tool_calls from the train
  // config's stages.rft section (other keys are ignored). Throws Error naming a missing key or
  // a wrong type.
  static RftFilterOptions from_config(const nlohmann::json& rft_section);
};

// The score event of one trajectory file.
struct TrajectoryOutcome {
  std::string stop_reason;
  int turns = 0;
  int tool_calls = 0;
  int invalid_tool_calls = 0;
  int replies = 0;  // assistant events: 0 when the policy never answered
  double reward = 0;
};

// Reads `path` and returns its score event. Throws Error naming the file (and the line) when it
// cannot be read, a line is not a JSON object, there is no score event or more than one, or a
// score field is missing or of the wrong type.
TrajectoryOutcome read_trajectory_outcome(const std::filesystem::path& path);

// Why a trajectory was dropped. The first rule that applies wins, in this order:
//   "malformed"                          read_trajectory_outcome threw (unreadable, bad JSON, no score)
//   "no_reply"                           the policy never answered (e.g. its first prompt did not fit
//                                        the model's context): nothing to learn from
//   "stop_reason:<reason>"               its stop reason is in drop_stop_reasons
//   "too_many_invalid_tool_calls"        invalid_tool_calls > max_invalid_tool_calls (when >= 0)
//   "low_reward"                         reward <= keep_reward_above
struct DroppedTrajectory {
  std::filesystem::path path;
  std::string reason;  // one of the keys above
  std::string detail;  // the error for malformed files, else e.g. "reward -1 <= 0"
};

struct RftFilterResult {
  std::vector<std::filesystem::path> kept;       // in input order
  std::vector<DroppedTrajectory> dropped;        // in input order
  std::map<std::string, size_t> dropped_by_reason;  // reason -> count; reasons with no drop are absent

  size_t total() const { return kept.size() + dropped.size(); }
};

// Applies the filter to every file. Never throws for a bad file: it is dropped as "malformed"
// (and logged with its name and the error); throws only for invalid options.
RftFilterResult filter_trajectories(const std::vector<std::filesystem::path>& files, const RftFilterOptions& options);
// The same with the options read from the train config's stages.rft section.
RftFilterResult filter_trajectories(const std::vector<std::filesystem::path>& files, const nlohmann::json& rft_section);

}  // namespace cuda_agent::rl
