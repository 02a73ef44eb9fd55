// Batched generation over a KV cache, and the cached logits that tests compare with a full
// forward.
//
// Prompts are prefilled one distinct prompt at a time (identical prompts, as in PPO's groups of
// samples, share one prefill), each exactly as it would be alone, and placed left-padded in one
// batched cache. Decoding then runs all live rows together: one new token per row and step,
// positions counted per row from its first real token, and a boolean mask that hides the padding
// (no mask when no live row is padded). Finished rows leave the batch at once.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "cuda_agent/lm/lm.h"
#include "model.h"

namespace cuda_agent::lm {

// Appends a sampled token and its log-prob to `out` and, when the sequence ends there, sets its
// finish_reason: "stop" (a stop token), "callback" (`go_on` false: on_token said stop) or
// "length" (max_new_tokens). Returns whether the sequence goes on.
bool take_token(lm::Generation& out, const lm::SamplingOptions& options, int64_t token, float logprob, bool go_on);

// Throws Error when a token id is outside [0, vocab_size); `what` names the sequence.
void check_tokens(const policy::ModelConfig& config, const std::vector<int64_t>& tokens, const std::string& what);

std::vector<lm::Generation> generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const lm::SamplingOptions& options,
                                     const std::function<bool(size_t, int64_t)>& on_token);

// Logits [T, vocab] float32 (CPU): `prefill` tokens in one cached forward, then one per forward.
torch::Tensor cached_logits(CausalLMImpl& model, const std::vector<int64_t>& tokens, int64_t prefill);

}  // namespace cuda_agent::lm
