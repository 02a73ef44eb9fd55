#include "torch_fmt.h"  // first: see there
#include "sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <limits>
#include <mutex>

#include "cuda_agent/core/error.h"

namespace cuda_agent::lm {

Sampler::Sampler(const lm::SamplingOptions& options)
    : options_(options),
      greedy_(options.greedy || options.temperature == 0.0),
      generator_(at::detail::createCPUGenerator(options.seed)) {
  CA_CHECK(options.temperature >= 0, "sampling temperature {} must not be negative (0 means greedy)",
           options.temperature);
  CA_CHECK(options.top_p > 0 && options.top_p <= 1, "sampling top_p {} must be in (0, 1]", options.top_p);
  CA_CHECK(options.top_k >= 0, "sampling top_k {} must not be negative (0 turns it off)", options.top_k);
  CA_CHECK(options.max_new_tokens >= 0, "max_new_tokens {} must not be negative", options.max_new_tokens);
}

Sampler::Picks Sampler::pick(const torch::Tensor& logits) {
  return pick_with(options_, logits, draw(logits.size(0)));
}

torch::Tensor Sampler::draw(int64_t rows) {
  if (greedy_) return {};
  auto out = torch::empty({rows}, torch::TensorOptions().dtype(torch::kFloat64));
  draw_into(rows, out.data_ptr<double>());
  return out;
}

void Sampler::draw_into(int64_t rows, double* out) {
  if (greedy_) return;
  // What torch::rand's CPU kernel does for float64, one 64-bit draw a value, without its
  // dispatch: a step of many one-row calls draws once per call.
  std::lock_guard<std::mutex> lock(generator_.mutex());
  auto* generator = at::check_generator<at::CPUGeneratorImpl>(generator_);
  at::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < rows; ++i) out[i] = uniform(generator);
}

Sampler::Picks Sampler::pick_with(const lm::SamplingOptions& options, const torch::Tensor& logits,
                                  const torch::Tensor& uniforms) {
  const bool greedy = options.greedy || options.temperature == 0.0;
  CA_ASSERT(greedy || (uniforms.defined() && uniforms.numel() == logits.size(0)), "{} uniforms for {} rows",
            uniforms.defined() ? uniforms.numel() : 0, logits.size(0));
  return read_picks(choose(options, logits, greedy ? uniforms : uniforms.to(logits.device())), logits.size(0));
}

torch::Tensor Sampler::choose(const lm::SamplingOptions& options, const torch::Tensor& logits,
                              const torch::Tensor& uniforms) {
  const int64_t vocab = logits.size(1);
  const bool greedy = options.greedy || options.temperature == 0.0;
  auto logp = torch::log_softmax(logits, -1);
  torch::Tensor tokens;
  if (greedy) {
    tokens = logits.argmax(-1);
  } else {
    auto scaled = logits / options.temperature;
    if (options.top_k > 0 && options.top_k < vocab) {
      auto kth = std::get<0>(scaled.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
      scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
    }
    // float64 so that the cumulative sums over a large vocabulary stay exact enough.
    auto probs = torch::softmax(scaled, -1).to(torch::kFloat64);
    torch::Tensor order;
    if (options.top_p < 1) {
      auto [sorted, indices] = probs.sort(-1, /*descending=*/true);
      // Drop a token when the more likely ones already reach top_p; the first always stays.
      auto before = sorted.cumsum(-1) - sorted;
      probs = sorted.masked_fill(before >= options.top_p, 0.0);
      order = indices;
    }
    auto cdf = probs.cumsum(-1);
    auto target = (uniforms * cdf.select(-1, vocab - 1)).unsqueeze(-1);
    // right=true: the first index whose cdf exceeds the target, which never has zero probability.
    auto index = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(vocab - 1);
    tokens = (order.defined() ? order.gather(-1, index) : index).squeeze(-1);
  }
  auto chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  // Token ids and float32 log-probs are both exact in float64: one tensor, one copy to the host.
  return torch::stack({tokens.to(torch::kFloat64), chosen.to(torch::kFloat64)});
}

Sampler::Picks Sampler::read_picks(const torch::Tensor& chosen, int64_t rows) {
  const auto both = chosen.narrow(1, 0, rows).to(torch::kCPU).contiguous();
  const double* host = both.data_ptr<double>();
  Picks out;
  out.tokens.reserve(rows);
  out.logprobs.reserve(rows);
  for (int64_t r = 0; r < rows; ++r) {
    out.tokens.push_back(static_cast<int64_t>(host[r]));
    out.logprobs.push_back(static_cast<float>(host[rows + r]));
  }
  return out;
}

}  // namespace cuda_agent::lm
