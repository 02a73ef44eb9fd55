// The training forward: per-token log-probs, entropies and values of whole sequences, with
// autograd (the trainer back-propagates through it) or under no_grad (LanguageModel's
// forward_for_training).
#pragma once

#include <torch/torch.h>

#include "model.h"

namespace cuda_agent::lm {

struct TokenStatsOptions {
  // Recompute each decoder layer, and each chunk's lm_head statistics, in backward instead of
  // keeping their activations: long contexts fit at the cost of about one more forward.
  bool checkpoint = false;
  // Tokens (batch x positions) whose [tokens, vocab] logits exist at once.
  int64_t chunk_tokens = 4096;
  // The log-probs and entropies of softmax(logits / temperature): the distribution a rollout
  // sampled at that temperature (before top-k/top-p, as veRL's actor computes them).
  double temperature = 1.0;
};

// [B, T] float32 each, on the model's device. Position t >= 1: logprobs = log p(ids[t] | ids[<t]),
// entropy of that distribution, values = value head on the hidden state at t - 1 (undefined
// without a value head). Position 0 holds 0. Rows may be right-padded: a position never
// attends to later ones, so padding changes nothing before it.
struct TokenStats {
  torch::Tensor logprobs, entropy, values;
};

TokenStats token_stats(CausalLMImpl& model, const torch::Tensor& input_ids, const TokenStatsOptions& options = {});

}  // namespace cuda_agent::lm
