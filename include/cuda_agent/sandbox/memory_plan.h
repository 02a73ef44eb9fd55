// The memory plan of one evaluation: what each phase needs of the GPU's memory, worked out from
// the task's real tensors (measured by the judge on one input set, before any solution code
// runs) against the memory free, and the sizes that make it fit. Torch-free arithmetic; the
// judge measures (judge_memory.cpp) and follows the plan. docs/results.md, "Memory plan".
//
// Who holds what during an evaluation (the judge and the candidate are two processes on one
// GPU; each keeps what its caching allocator once held unless it releases it):
//
//   judge, throughout   the reference's weights, one input set (sets are drawn one at a time,
//                       on the device), the input block (the staged copy the candidate reads)
//                       and the output block (where the candidate's outputs land); under the
//                       bracket its copy of the output block (and of inputs with gaps)
//   judge, reference    the reference's own working memory: the input clone, temporaries, its
//                       outputs, and under strict the float64 inputs and outputs
//   judge, verifying    the task check's copy of the first trial's reference outputs
//   judge, comparing    the reference's outputs (and float64 outputs), one copy of the
//                       candidate's outputs (the second run on the same inputs), and the
//                       comparison's float64 temporaries, one chunk at a time
//   candidate           a copy of the weights, and its forward's working memory, estimated as
//                       the reference's
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace cuda_agent::sandbox {

// Elements per comparison chunk: the comparison's float64 temporaries (about six of them) stay
// under 1 GiB whatever the output's size.
constexpr int64_t kCompareChunkElements = int64_t{1} << 24;

// What the judge measured, in bytes.
struct MemoryNeeds {
  int64_t total_bytes = 0;  // the device's memory
  // Free for this evaluation: the device's free memory plus what the judge's allocator caches,
  // measured once both processes have their CUDA context and before the solution loads.
  int64_t free_bytes = 0;
  int64_t judge_limit_bytes = 0;  // the judge's own cap (sandbox.gpu_memory_fraction of the total)
  int64_t weights_bytes = 0;      // the reference's parameters and buffers
  int64_t weights64_bytes = 0;    // the float64 reference's (strict), 0 without
  int64_t input_bytes = 0;        // one input set, staged (padded) size
  int64_t output_bytes = 0;       // the reference's outputs on it
  int64_t output64_bytes = 0;     // the float64 reference's outputs (strict), 0 without
  int64_t reference_peak_bytes = 0;    // the most the float32 reference allocated beyond its weights and inputs
  int64_t reference64_peak_bytes = 0;  // the same for the float64 reference (its float64 inputs included)
  bool candidate = true;               // a candidate process shares the GPU (not for baselines)
  // The judge's bracket times the candidate (judge_bracket.h): the judge keeps a copy of the
  // output block of its own, and copies of the input tensors that do not lie as the input block
  // holds them (bracket_staging_bytes; stage_tree_deferred: 0 for the usual dense inputs).
  bool bracket = false;
  int64_t bracket_staging_bytes = 0;
};

struct MemoryPlan {
  MemoryNeeds needs;
  double output_block_factor = 2;  // the output block holds this many times the reference's outputs
  int64_t input_block_bytes = 0;
  int64_t output_block_bytes = 0;
  int64_t compare_chunk_elements = kCompareChunkElements;
  int64_t compare_bytes = 0;     // the comparison's temporaries, at most
  int live_input_sets = 1;       // input sets held at once (drawn right before the run that uses each)
  bool release_cached = false;   // both processes hand their cached memory back after each run
  // Whether the evaluation has a float64 reference: true under strict unless it does not fit
  // beside the rest (tried only when nothing else fits; strict then compares as loose and
  // reports.reference64 says so) or the model cannot run in float64; false under loose and tf32.
  bool float64_reference = true;
  int64_t judge_peak_bytes = 0;  // the judge's estimated peak under this plan
  int64_t candidate_bytes = 0;   // the candidate's estimate (weights and working memory)
  int64_t need_bytes = 0;        // the most both hold at once under this plan, with the margin
  int64_t margin_bytes = 0;      // for CUDA's own growth (the timer's L2 flush buffers, library workspaces)
  // Non-empty: the task does not fit on this GPU at all (category task_too_large); names the sizes.
  std::string too_large;

  bool fits() const { return too_large.empty(); }
  nlohmann::json to_json() const;
};

// Sizes the evaluation to fit `needs`, trying in turn: the output block at twice the outputs
// (room for an output that is a view with gaps); the same with both processes' caches released
// after each run; the output block at once the outputs; without the float64 reference. The
// first that fits is the plan; too_large when none does.
MemoryPlan plan_memory(const MemoryNeeds& needs);

// "1.50 GiB", "12.0 MiB", "512 B": for messages.
std::string format_bytes(int64_t bytes);

}  // namespace cuda_agent::sandbox
