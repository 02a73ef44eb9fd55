// The reward of one evaluation (CUDA Agent paper, section on reward design).
//
//   milestone (default): -1 failed or wrong; 3 more than (1 + margin) times faster than both
//                        eager and torch.compile; 2 faster than eager only; 1 otherwise.
//                        "Faster" is decided by `rule`: "interval" (default): the lower end of the
//                        speedup's 95% interval is above 1 + margin, so that repeated evaluations of
//                        the same kernel agree; "point": the point estimate is (the paper's rule).
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
  // The lower ends of the speedups' 95% intervals (timing_stats.h); rule "interval" needs them.
  std::optional<double> low_vs_eager, low_vs_compile;
  // torch.compile failed in this evaluation after the solution's code had started beside it: a
  // solution can make it fail (by taking the GPU's memory from under its first call, say), so
  // the failure removes no bar: the milestone tier above eager is not granted. A torch.compile
  // not timed at all (profile_compile off) still sets no bar.
  bool compile_failed_beside_solution = false;
};

// Throws Error for an unknown kind or rule, and for rule "interval" with a speedup but no lower end.
double compute_reward(const std::string& kind, const RewardInputs& in, double margin = 0.05,
                      const std::string& rule = "point");

}  // namespace cuda_agent::sandbox
