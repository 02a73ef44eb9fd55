#include "cuda_agent/sandbox/reward.h"

#include "cuda_agent/core/error.h"

namespace cuda_agent::sandbox {

double compute_reward(const std::string& kind, const RewardInputs& in, double margin, const std::string& rule) {
  CA_CHECK(kind == "milestone" || kind == "raw_speedup",
           "unknown reward kind '{}': use 'milestone' or 'raw_speedup'", kind);
  CA_CHECK(rule == "interval" || rule == "point", "unknown reward rule '{}': use 'interval' or 'point'", rule);
  if (!in.correct) return -1.0;
  if (kind == "raw_speedup") {
    if (in.speedup_vs_compile) return *in.speedup_vs_compile;
    return in.speedup_vs_eager.value_or(0.0);
  }
  const double bar = 1.0 + margin;
  // The number that must clear the bar: the speedup itself, or the lower end of its interval.
  auto evidence = [&](const std::optional<double>& speedup, const std::optional<double>& low) -> std::optional<double> {
    if (!speedup) return std::nullopt;
    if (rule == "point") return speedup;
    CA_CHECK(low.has_value(),
             "the reward rule 'interval' needs the speedup's interval (a speedup of {} came without one)", *speedup);
    return low;
  };
  const std::optional<double> eager = evidence(in.speedup_vs_eager, in.low_vs_eager);
  const std::optional<double> compile = evidence(in.speedup_vs_compile, in.low_vs_compile);
  const bool beats_eager = eager && *eager > bar;
  // A torch.compile not timed is no bar to clear; one that failed beside the solution is no
  // bar removed either (RewardInputs::compile_failed_beside_solution).
  const bool beats_compile = compile ? *compile > bar : !in.compile_failed_beside_solution;
  if (beats_eager && beats_compile) return 3.0;
  if (beats_eager) return 2.0;
  return 1.0;
}

}  // namespace cuda_agent::sandbox
