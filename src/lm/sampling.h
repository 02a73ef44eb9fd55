// Choosing the next token from logits: greedy, or temperature, top-k and top-p (nucleus)
// sampling, seeded.
//
// Randomness comes from one CPU generator seeded with SamplingOptions::seed, one uniform draw per
// row and step, turned into a token by inverse-CDF search on the model's device: the same seed
// gives the same tokens on every run (and, up to rounding of the probabilities, on every device).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "cuda_agent/lm/lm.h"

namespace cuda_agent::lm {

class Sampler {
 public:
  // Throws Error naming the option when temperature < 0, top_p not in (0, 1], top_k < 0 or
  // max_new_tokens < 0.
  explicit Sampler(const lm::SamplingOptions& options);

  struct Picks {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;  // log-softmax of the unmodified logits at the chosen tokens
  };
  // One token per row of `logits` ([B, vocab], float32, any device).
  Picks pick(const torch::Tensor& logits);

  // pick() in two halves, so that rows of several samplers with the same options share one pass
  // on the device (BatchEngine): draw() takes the uniforms pick() would take for `rows` rows
  // from this sampler's generator (float64 [rows] on the CPU; undefined when greedy), and
  // pick_with() chooses with the uniforms given, one per row of `logits`.
  torch::Tensor draw(int64_t rows);
  static Picks pick_with(const lm::SamplingOptions& options, const torch::Tensor& logits, const torch::Tensor& uniforms);

  // draw() into `out` (`rows` values, the same ones torch::rand gives from this generator),
  // without making a tensor; nothing when greedy.
  void draw_into(int64_t rows, double* out);
  // pick_with() in two halves again, for a CUDA graph: choose() does the device's part with
  // `uniforms` already on the logits' device and returns float64 [2, rows] there (the tokens,
  // then their log-probs), with no host copy or wait; read_picks() brings its first `rows`
  // columns to the host (one copy).
  static torch::Tensor choose(const lm::SamplingOptions& options, const torch::Tensor& logits,
                              const torch::Tensor& uniforms);
  static Picks read_picks(const torch::Tensor& chosen, int64_t rows);
  const lm::SamplingOptions& options() const { return options_; }

 private:
  lm::SamplingOptions options_;
  bool greedy_;
  at::Generator generator_;
};

}  // namespace cuda_agent::lm
