// RoPE frequencies: the same float32 operations, in the same order, as transformers'
// modeling_rope_utils, so fp32 logits agree to rounding.
#include "torch_fmt.h"  // first: see there
#include "rope.h"

#include <cmath>

#include "cuda_agent/core/error.h"

namespace cuda_agent::lm {
namespace {

// base ** (arange(0, dim, 2) / dim), float32.
torch::Tensor powers(const torch::Tensor& base, int64_t dim) {
  auto exponent = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
  return torch::pow(base, exponent);
}

torch::Tensor default_inv_freq(double base, int64_t dim) {
  return powers(torch::tensor(base, torch::kFloat64).to(torch::kFloat32), dim).reciprocal();
}

torch::Tensor llama3_inv_freq(const policy::ModelConfig& c, int64_t dim) {
  const auto& s = c.rope_scaling;
  const double old_context = static_cast<double>(
      s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : c.max_position_embeddings);
  CA_CHECK(s.high_freq_factor != s.low_freq_factor,
           "rope_scaling llama3: high_freq_factor and low_freq_factor are both {}; they must differ",
           s.high_freq_factor);
  auto inv = default_inv_freq(c.rope_theta, dim);
  const double low_wavelen = old_context / s.low_freq_factor;
  const double high_wavelen = old_context / s.high_freq_factor;
  // Python's scalar / tensor is reciprocal(tensor) * scalar; the same here, to the last bit.
  auto wavelen = inv.reciprocal() * (2 * M_PI);
  auto inv_llama = torch::where(wavelen > low_wavelen, inv / s.factor, inv);
  auto smooth = (wavelen.reciprocal() * old_context - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * inv_llama / s.factor + smooth * inv_llama;
  auto medium = torch::logical_not(wavelen < high_wavelen).logical_and(torch::logical_not(wavelen > low_wavelen));
  return torch::where(medium, smoothed, inv_llama);
}

torch::Tensor yarn_inv_freq(const policy::ModelConfig& c, int64_t dim) {
  const auto& s = c.rope_scaling;
  const double base = c.rope_theta;
  const double original = static_cast<double>(
      s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : c.max_position_embeddings);
  // The dimension at which a frequency completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  // transformers truncates by default ("truncate": true); ModelConfig has no switch for it.
  double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  auto pos_freqs = powers(torch::tensor(base, torch::kFloat64).to(torch::kFloat32), dim);
  auto extrapolation = pos_freqs.reciprocal();
  auto interpolation = (s.factor * pos_freqs).reciprocal();
  auto ramp = ((torch::arange(dim / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
  auto extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

Rope::Rope(const policy::ModelConfig& config) : config_(config) {
  const int64_t dim = config.head_dim;
  CA_CHECK(dim > 0 && dim % 2 == 0, "head_dim {} must be positive and even for rotary embeddings", dim);
  CA_CHECK(config.rope_theta > 0, "rope_theta {} must be positive", config.rope_theta);
  const auto& s = config.rope_scaling;
  CA_CHECK(s.type == "none" || s.factor > 0, "rope_scaling factor {} must be positive", s.factor);
  if (s.type == "none" || s.type == "dynamic") {
    inv_freq_ = default_inv_freq(config.rope_theta, dim);
  } else if (s.type == "linear") {
    inv_freq_ = default_inv_freq(config.rope_theta, dim) / s.factor;
  } else if (s.type == "llama3") {
    inv_freq_ = llama3_inv_freq(config, dim);
  } else if (s.type == "yarn") {
    inv_freq_ = yarn_inv_freq(config, dim);
    attention_scaling_ = s.attention_factor > 0 ? s.attention_factor
                         : s.factor <= 1        ? 1.0
                                                : 0.1 * std::log(s.factor) + 1.0;
  } else {
    CA_FAIL("rope_scaling type '{}' is not supported (none, linear, dynamic, llama3, yarn)", s.type);
  }
}

torch::Tensor Rope::inv_freq(int64_t seq_len) const {
  const auto& s = config_.rope_scaling;
  if (s.type != "dynamic" || seq_len <= config_.max_position_embeddings) return inv_freq_;
  // transformers grows the base with the sequence, in float32 tensor arithmetic.
  const int64_t dim = config_.head_dim;
  auto len = torch::tensor(seq_len, torch::kInt64);
  auto base = config_.rope_theta *
              torch::pow(s.factor * len / static_cast<double>(config_.max_position_embeddings) - (s.factor - 1),
                         static_cast<double>(dim) / static_cast<double>(dim - 2));
  return powers(base, dim).reciprocal();
}

std::pair<torch::Tensor, torch::Tensor> Rope::cos_sin(const torch::Tensor& positions, torch::ScalarType dtype) const {
  torch::Tensor inv;
  if (config_.rope_scaling.type == "dynamic") {
    inv = inv_freq(positions.max().item<int64_t>() + 1).to(positions.device());
  } else {
    std::lock_guard<std::mutex> lock(device_copy_mutex_);
    if (!inv_freq_on_device_.defined() || inv_freq_on_device_.device() != positions.device())
      inv_freq_on_device_ = inv_freq_.to(positions.device());
    inv = inv_freq_on_device_;
  }
  auto freqs = positions.unsqueeze(-1).to(torch::kFloat32) * inv;
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos();
  auto sin = emb.sin();
  if (attention_scaling_ != 1.0) {
    cos = cos * attention_scaling_;
    sin = sin * attention_scaling_;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace cuda_agent::lm
