// Rotary position embeddings as Hugging Face computes them for Llama, Qwen2 and Qwen3: the
// inverse frequencies of each scaling (none, linear, dynamic NTK, llama3, yarn) computed in
// float32 with the same operations, cos/sin of position * inv_freq, and rotate_half (pairs
// (i, i + d/2)).
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <utility>

#include "cuda_agent/policy/model_config.h"

namespace cuda_agent::lm {

class Rope {
 public:
  // Throws Error naming the scaling type or value it cannot use.
  explicit Rope(const policy::ModelConfig& config);

  // cos and sin, [B, T, head_dim] in `dtype` on the positions' device, for int64 positions [B, T]
  // (already scaled by yarn's attention factor). Dynamic NTK recomputes the frequencies from the
  // largest position of this call (as transformers does when the sequence outgrows
  // max_position_embeddings), which costs one device-to-host read.
  std::pair<torch::Tensor, torch::Tensor> cos_sin(const torch::Tensor& positions, torch::ScalarType dtype) const;

  // The inverse frequencies for a sequence of `seq_len` tokens ([head_dim / 2], float32, CPU).
  torch::Tensor inv_freq(int64_t seq_len) const;
  double attention_scaling() const { return attention_scaling_; }

 private:
  policy::ModelConfig config_;
  torch::Tensor inv_freq_;  // the static frequencies (all types but a grown dynamic one)
  // inv_freq_ on the device of the last call's positions, copied once (a copy from host memory
  // inside a CUDA graph capture is not allowed); guarded: threads may generate from one model.
  mutable std::mutex device_copy_mutex_;
  mutable torch::Tensor inv_freq_on_device_;
  double attention_scaling_ = 1.0;
};

// x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x[d/2:], x[:d/2]); cos/sin broadcast
// against x ([B, heads, T, D] with cos [B, 1, T, D]).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace cuda_agent::lm
