#include "cuda_agent/sandbox/reward.h"

#include "cuda_agent/core/error.h"

namespace cuda_agent::sandbox {

double compute_reward(const std::string& kind, const RewardInputs& in, double margin) {
  CA_CHECK(kind == "milestone" || kind == "raw_speedup",
           "unknown reward kind '{}': use 'milestone' or 'raw_speedup'", kind);
  if (!in.correct) return -1.0;
  if (kind == "raw_speedup") {
    if (in.speedup_vs_compile) return *in.speedup_vs_compile;
    return in.speedup_vs_eager.value_or(0.0);
  }
  const double bar = 1.0 + margin;
  const bool beats_eager = in.speedup_vs_eager && *in.speedup_vs_eager > bar;
  // A torch.compile that failed on the task is no bar to clear.
  const bool beats_compile = !in.speedup_vs_compile || *in.speedup_vs_compile > bar;
  if (beats_eager && beats_compile) return 3.0;
  if (beats_eager) return 2.0;
  return 1.0;
}

}  // namespace cuda_agent::sandbox
