// One batched decoder for every generate() call of a process (continuous batching).
//
// Callers on any thread submit prompts; one worker thread decodes every live sequence in one
// forward per step. A call's sequences join the batch at the step after their prefill and leave
// it when they end, so a short turn never waits for a long one. Keys and values live in a pool of
// slots handed out in blocks of `block_size` positions: a sequence holds only the blocks its
// tokens fill, not room for max_new_tokens.
//
// Full blocks are kept by content (a hash chained over every token up to their end, checked
// against the tokens themselves): a prompt that starts like one seen before (the system prompt
// every episode shares, an episode's previous turn, the copies of a PPO group's prompt) reuses
// their keys and values instead of prefilling them again. Blocks no sequence holds stay cached
// until the pool needs them, least recently used first, and the whole pool is freed after the
// engine has been idle for `idle_release_s`.
//
// Sampling is per call, as lm::generate does it: a call's rows are picked together by one
// Sampler seeded from the call's options, in prompt order, so a call gives the same tokens and
// log-probs through the engine as alone, up to float rounding of batched products. Rows of
// calls with equal sampling options share one pass on the device.
//
// Admitted sequences are prefilled together, in batched forwards (a sequence that reuses blocks
// another one is still filling waits for the next one). Decode steps pad their rows and keys to
// buckets, so that their shapes change rarely; on a GPU each shape's step is captured once as a
// CUDA graph and replayed (eager launches cost more than a small model's whole step there).
//
// When the pool runs out, a new call waits; a running sequence that needs a block for its next
// token takes one from the most recently admitted other call, which goes back to the head of the
// queue with its tokens and sampler and is prefilled again once blocks are free (cheaply, when
// its blocks are still cached). A call that cannot fit the whole pool fails with an Error saying
// so; so do the calls in flight when a forward fails (out of memory): the engine goes on.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "cuda_agent/lm/lm.h"
#include "model.h"

namespace cuda_agent::lm {

struct EngineOptions {
  int64_t block_size = 16;       // positions per block
  int64_t kv_tokens = 131072;    // the pool's size in positions (whole blocks)
  int64_t max_rows = 256;        // most sequences in one decode step
  int64_t prefill_chunk = 1024;  // most prompt tokens in one prefill forward
  double idle_release_s = 2.0;   // the pool is freed after this long without work
  bool cuda_graphs = true;       // on a GPU, decode steps replay CUDA graphs (one per shape)
  // On a GPU, decode steps attend straight from the pool's blocks (paged_attention.h) instead of
  // gathering each row's keys and values into a padded tensor for torch's attention.
  bool paged_attention = true;
  // LmOptions::engine_gate: true before each round of work, false once there is none; may block.
  std::function<void(bool working)> gate;
};

class BatchEngine {
 public:
  // The model must outlive the engine and must not be trained while a call is in flight.
  // Throws Error for options out of range (naming them).
  BatchEngine(CausalLMImpl& model, EngineOptions options);
  ~BatchEngine();  // calls still waiting fail with Error
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // lm::generate's contract, from any thread; blocks until the call's sequences are done.
  // on_token runs on the engine's thread.
  std::vector<lm::Generation> generate(const std::vector<std::vector<int64_t>>& prompts,
                                       const lm::SamplingOptions& options,
                                       const std::function<bool(size_t, int64_t)>& on_token);

  lm::EngineStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda_agent::lm
