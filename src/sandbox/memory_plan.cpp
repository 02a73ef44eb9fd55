#include "cuda_agent/sandbox/memory_plan.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace cuda_agent::sandbox {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// One arrangement of the evaluation, costed.
struct Arrangement {
  double factor;
  bool release;
  bool float64;
  int64_t judge_peak = 0, candidate = 0, need = 0;
};

Arrangement cost(const MemoryNeeds& n, double factor, bool release, bool float64, int64_t compare_bytes,
                 int64_t margin) {
  Arrangement a{factor, release, float64};
  const int64_t weights = n.weights_bytes + (float64 ? n.weights64_bytes : 0);
  const int64_t output64 = float64 ? n.output64_bytes : 0, peak64 = float64 ? n.reference64_peak_bytes : 0;
  const int64_t out_block = static_cast<int64_t>(factor * static_cast<double>(n.output_bytes)) + kMiB;
  // The bracket's copy of the output block, and of the inputs that do not lie as staged.
  const int64_t bracket = n.candidate && n.bracket ? n.bracket_staging_bytes + out_block : 0;
  const int64_t fixed = weights + n.input_bytes + n.input_bytes + out_block + bracket;
  const int64_t reference = std::max(n.reference_peak_bytes, n.output_bytes + peak64);
  // The reference's outputs, held through the candidate's run, and the task check's copy of the
  // first trial's (held through verify).
  const int64_t kept = n.output_bytes + output64 + n.output_bytes;
  const int64_t comparing = kept + n.output_bytes + compare_bytes;
  a.judge_peak = fixed + std::max(reference, comparing);
  if (!n.candidate) {
    a.need = a.judge_peak + margin;
    return a;
  }
  // The candidate's working memory is estimated as the reference's.
  a.candidate = n.weights_bytes + n.reference_peak_bytes;
  if (!release) {
    a.need = a.judge_peak + a.candidate + margin;  // each allocator keeps its peak cached
  } else {
    // The judge's reference and comparison run while the candidate holds its weights only; the
    // candidate runs while the judge holds what it keeps.
    a.need = std::max({fixed + reference + n.weights_bytes, fixed + kept + a.candidate,
                       fixed + comparing + n.weights_bytes}) +
             margin;
  }
  return a;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(kGiB));
  if (bytes >= kMiB) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / static_cast<double>(kMiB));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{} B", bytes);
}

MemoryPlan plan_memory(const MemoryNeeds& needs) {
  MemoryPlan p;
  p.needs = needs;
  p.compare_chunk_elements = kCompareChunkElements;
  // About six float64 temporaries of one chunk (or of the whole output, when smaller).
  p.compare_bytes = 6 * std::min(2 * needs.output_bytes, 8 * kCompareChunkElements);
  p.margin_bytes = kGiB + needs.total_bytes / 50;
  p.input_block_bytes = needs.input_bytes;
  const bool strict = needs.output64_bytes > 0;
  std::vector<Arrangement> tries = {cost(needs, 2, false, strict, p.compare_bytes, p.margin_bytes),
                                    cost(needs, 2, true, strict, p.compare_bytes, p.margin_bytes),
                                    cost(needs, 1, true, strict, p.compare_bytes, p.margin_bytes)};
  if (strict) tries.push_back(cost(needs, 1, true, false, p.compare_bytes, p.margin_bytes));
  const int64_t limit = needs.judge_limit_bytes > 0 ? needs.judge_limit_bytes : needs.total_bytes;
  const Arrangement* chosen = nullptr;
  for (const Arrangement& a : tries) {
    if (!needs.candidate && a.release && a.factor == 2) continue;  // nothing shares the GPU to release to
    if (a.need <= needs.free_bytes && a.judge_peak <= limit) {
      chosen = &a;
      break;
    }
  }
  const Arrangement& a = chosen ? *chosen : tries.back();
  p.output_block_factor = a.factor;
  p.output_block_bytes = static_cast<int64_t>(a.factor * static_cast<double>(needs.output_bytes)) + kMiB;
  p.release_cached = a.release && needs.candidate;
  p.float64_reference = a.float64;
  p.judge_peak_bytes = a.judge_peak;
  p.candidate_bytes = a.candidate;
  p.need_bytes = a.need;
  if (!chosen) {
    p.too_large = fmt::format(
        "the task does not fit in this GPU's memory: an evaluation needs about {} at once and {} is free (of {}); "
        "inputs {}, outputs {}{}, the reference's working memory {}{}, weights {}. The judge would hold {} (its "
        "cap, sandbox.gpu_memory_fraction, is {}){}, even without a float64 reference and with the caches released "
        "after each run. Make the task's tensors smaller, or evaluate it on a GPU with more memory",
        format_bytes(a.need), format_bytes(needs.free_bytes), format_bytes(needs.total_bytes),
        format_bytes(needs.input_bytes), format_bytes(needs.output_bytes),
        needs.output64_bytes > 0 ? fmt::format(", float64 reference outputs {}", format_bytes(needs.output64_bytes))
                                 : "",
        format_bytes(needs.reference_peak_bytes),
        needs.reference64_peak_bytes > 0
            ? fmt::format(" (the float64 reference's {})", format_bytes(needs.reference64_peak_bytes))
            : "",
        format_bytes(needs.weights_bytes), format_bytes(a.judge_peak), format_bytes(limit),
        needs.candidate ? fmt::format(", the candidate about {}", format_bytes(a.candidate)) : "");
  }
  return p;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json j = {{"total_bytes", needs.total_bytes},
                      {"free_bytes", needs.free_bytes},
                      {"judge_limit_bytes", needs.judge_limit_bytes},
                      {"weights_bytes", needs.weights_bytes},
                      {"input_bytes", needs.input_bytes},
                      {"output_bytes", needs.output_bytes},
                      {"output64_bytes", needs.output64_bytes},
                      {"reference_peak_bytes", needs.reference_peak_bytes},
                      {"reference64_peak_bytes", needs.reference64_peak_bytes},
                      {"output_block_factor", output_block_factor},
                      {"input_block_bytes", input_block_bytes},
                      {"output_block_bytes", output_block_bytes},
                      {"compare_chunk_elements", compare_chunk_elements},
                      {"compare_bytes", compare_bytes},
                      {"live_input_sets", live_input_sets},
                      {"release_cached", release_cached},
                      {"float64_reference", float64_reference},
                      {"weights64_bytes", needs.weights64_bytes},
                      {"bracket_staging_bytes", needs.bracket_staging_bytes},
                      {"judge_peak_bytes", judge_peak_bytes},
                      {"candidate_bytes", candidate_bytes},
                      {"need_bytes", need_bytes},
                      {"margin_bytes", margin_bytes},
                      {"fits", fits()}};
  if (!fits()) j["too_large"] = too_large;
  return j;
}

}  // namespace cuda_agent::sandbox
