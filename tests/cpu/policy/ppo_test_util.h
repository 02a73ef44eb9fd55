// Helpers shared by the PPO learner suites (test_ppo_learner.cpp, test_ppo_critic.cpp): a small
// random Llama, a fixed batch of sequences of several lengths and masks, and PPO samples around
// a learner's current outputs.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/advantages.h"
#include "lm_test_util.h"

namespace cuda_agent::testing {

inline policy::ModelConfig small_config(int64_t vocab, bool tied = true) {
  auto c = tiny_config(policy::Family::kLlama);
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  return c;
}

// CPU, float32, a value head (which only the shared critic uses), random weights from `seed`.
inline lm::LmOptions learner_options(uint64_t seed = 3, double init_std = kTestInitStd) {
  use_built_lm_module();
  auto o = test_options("cpu", seed);
  o.value_head = true;
  o.init_std = init_std;
  return o;
}

inline std::unique_ptr<lm::PpoLearner> make_learner(const lm::PpoOptions& ppo, int64_t vocab = 64, uint64_t seed = 3,
                                                    double init_std = kTestInitStd, bool tied = true) {
  return lm::create_random_ppo_learner(small_config(vocab, tied), learner_options(seed, init_std), ppo);
}

inline rl::TokenBatch as_float(const std::vector<std::vector<uint8_t>>& masks) {
  rl::TokenBatch out;
  for (const auto& m : masks) out.emplace_back(m.begin(), m.end());
  return out;
}

// Sequences of several lengths: a 3-token prompt (mask 0), policy tokens, a 2-token "tool
// output" (mask 0) inside the third, and one sequence without policy tokens (skipped by the
// seq_ modes).
struct Batch {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<uint8_t>> masks;
};

inline Batch fixed_batch(int64_t vocab) {
  Batch b;
  const std::vector<size_t> lengths = {9, 14, 12, 5, 11};
  for (size_t i = 0; i < lengths.size(); ++i) {
    b.tokens.push_back(test_tokens(lengths[i], vocab, 11 + i));
    std::vector<uint8_t> m(lengths[i], 1);
    for (size_t t = 0; t < std::min<size_t>(3, lengths[i]); ++t) m[t] = 0;
    if (i == 2) m[6] = m[7] = 0;
    if (i == 3) std::fill(m.begin(), m.end(), 0);
    b.masks.push_back(m);
  }
  return b;
}

// PPO inputs around the model's current outputs: old log-probs new + offsets in [-0.6, 0.6]
// (ratios from 0.55 to 1.8, so both clip bounds bind), old values within +-0.4 of the new ones
// (value_clip 0.2 binds for some), reference log-probs near the new ones.
inline std::vector<lm::PpoSample> samples_around(lm::PpoLearner& learner, const Batch& b, uint64_t seed,
                                                 double logprob_offset = 0.6) {
  const auto now = learner.forward(b.tokens, b.masks);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<lm::PpoSample> out;
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    lm::PpoSample s;
    s.tokens = b.tokens[i];
    s.loss_mask = b.masks[i];
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      s.old_logprobs.push_back(now[i].logprobs[t] + static_cast<float>(logprob_offset) * u(rng));
      s.advantages.push_back(u(rng));
      s.returns.push_back(u(rng));
      s.old_values.push_back(now[i].values[t] + 0.4f * u(rng));
      s.ref_logprobs.push_back(now[i].logprobs[t] + 0.3f * u(rng));
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The token-mean clipped value loss of the learner's current values on `b` against the old
// values and returns of `batch` (one sample per sequence of b): the torch-free reference of what
// value_update minimizes.
inline double reference_value_loss(lm::PpoLearner& learner, const Batch& b, const std::vector<lm::PpoSample>& batch) {
  rl::TokenBatch values, old_values, returns;
  for (const auto& s : batch) {
    old_values.push_back(s.old_values);
    returns.push_back(s.returns);
  }
  for (const auto& f : learner.forward(b.tokens, b.masks)) values.push_back(f.values);
  return rl::ppo_value_loss(values, old_values, returns, as_float(b.masks), learner.options().value_clip,
                            rl::LossAggregation::kTokenMean)
      .loss;
}

}  // namespace cuda_agent::testing
