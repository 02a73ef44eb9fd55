// The reward of one evaluation (CUDA Agent paper, section on reward design).
//
//   milestone (default): -1 failed or wrong; 3 more than (1 + margin) times faster than both
//                        eager and torch.compile; 2 faster than eager only; 1 otherwise.
//   raw_speedup (ablation): -1 failed or wrong; else the speedup over torch.compile (over eager
//                        when no torch.compile timing exists).
#pragma once

#include <optional>
#include <string>

namespace cuda_agent::sandbox {

struct RewardInputs {
  bool correct = false;
  std::optional<double> speedup_vs_eager;    // eager_ms / candidate_ms
  std::optional<double> speedup_vs_compile;  // compile_ms / candidate_ms; none if compile failed
};

// Throws Error for an unknown kind.
double compute_reward(const std::string& kind, const RewardInputs& in, double margin = 0.05);

}  // namespace cuda_agent::sandbox
