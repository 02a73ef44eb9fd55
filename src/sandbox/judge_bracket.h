// The judge's bracket of a candidate's timed run: a floor under the candidate process's timing
// that its process cannot touch (docs/integrity.md, "Trust").
//
// Every timing the candidate process reports is its claim: native code in that process can
// rewrite the tables the harness calls through, the CUDA events' elapsed time and CUPTI's records
// alike. What it cannot change is when memory in the judge's own CUDA context changed. So, per
// timed run, the candidate's host queues the whole run behind a wait (in the GPU's front end) for
// the judge's go word, its outputs' copies into the shared output block and a done word after
// it, and then tells the judge the run is queued. The judge then queues on its own stream: the
// run's inputs (each tensor from where it lies in memory of its own) into the shared input block,
// the L2 flush, the go event and the go word; then a wait for the done word, the end event and a
// copy of the output block into memory of its own, which is what it compares. Correct outputs in
// that copy cannot exist before inputs the judge wrote just before its go event, so
// the span from the go event to the end event holds the run's true GPU time plus the hand-overs
// between the two contexts and the outputs' copy, whatever the candidate's process claims.
//
// Those costs are calibrated before the solution loads (Judge::calibrate_bracket(): runs of the
// candidate process's harness alone, whose "forward" fills as many bytes as the reference's
// outputs hold and whose export copies them; the fill's own interval is taken off each span),
// and each timed run's floor is its span less the calibration's median and spread
// (bracket_floors(), timing_stats.h); the candidate's sample is the larger of its claim and that
// floor (judge_profile.cpp).
//
// Internal to the sandbox library; the judge's thread, with torch's CUDA context current.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda_agent/sandbox/shared_block.h"
#include "cuda_agent/sandbox/tensor_exchange.h"
#include "cuda_agent/sandbox/timer.h"
#include "cuda_agent/sandbox/timing_stats.h"

namespace cuda_agent::sandbox {

class __attribute__((visibility("hidden"))) JudgeBracket {
 public:
  // The shared block of the two words, a stream of the judge's own and its events. Throws Error.
  JudgeBracket();
  // Releases whatever is still queued (abandon()) without waiting on the candidate.
  ~JudgeBracket();
  JudgeBracket(const JudgeBracket&) = delete;
  JudgeBracket& operator=(const JudgeBracket&) = delete;

  const SharedBlock& words() const { return *words_; }
  // The next run's ticket (the value the go and done words take for it).
  uint32_t next_ticket() { return ticket_ = sandbox::next_ticket(ticket_); }

  // Queues one run's half on the judge's stream, as above: each of `inputs` into `in_block` at its
  // offset (from where the judge's own copy of it lies: stage_tree_deferred), the L2 flush, the
  // go word; the wait for the done word; `out_bytes` from `out_block` to `snapshot` (0: none).
  void queue(const std::vector<InputCopy>& inputs, uint64_t in_block, uint64_t out_block, uint64_t snapshot,
             size_t out_bytes);
  // Waits up to `timeout_s` for the queued run to end (its done word, then the copy). False when
  // the done word did not come: the judge then writes both words itself, so that its stream
  // moves on (the run has no span).
  bool finish(double timeout_s);
  // The last finished run's span, go event to end event, in milliseconds.
  double span_ms() const;
  // Lets a queued run's wait go (both words written by the judge) and waits for its stream:
  // for runs that failed or whose candidate process died. Does nothing when none is queued.
  void abandon() noexcept;
  bool queued() const { return queued_; }

 private:
  std::unique_ptr<SharedBlock> words_;
  CUstream stream_ = nullptr, rescue_ = nullptr;
  CUevent go_ = nullptr, end_ = nullptr, copied_ = nullptr;
  uint32_t ticket_ = 0;
  bool queued_ = false;
};

}  // namespace cuda_agent::sandbox
