#include "torch_fmt.h"  // first: see there
#include "training.h"

#include "checkpoint.h"

namespace cuda_agent::lm {

TokenStats token_stats(CausalLMImpl& model, const torch::Tensor& input_ids, const TokenStatsOptions& options) {
  const int64_t batch = input_ids.size(0), len = input_ids.size(1);
  auto positions = torch::arange(len, input_ids.options()).unsqueeze(0).expand({batch, len});
  auto hidden = model.forward(input_ids, positions, nullptr, {}, options.checkpoint);
  auto zero = torch::zeros({batch, 1}, torch::TensorOptions().device(input_ids.device()).dtype(torch::kFloat32));
  TokenStats out;
  if (len < 2) {
    out.logprobs = zero.expand({batch, len}).clone();
    out.entropy = out.logprobs.clone();
    if (model.has_value_head()) out.values = out.logprobs.clone();
    return out;
  }
  auto predicting = hidden.narrow(1, 0, len - 1);
  auto targets = input_ids.narrow(1, 1, len - 1);
  const bool recompute = options.checkpoint && torch::GradMode::is_enabled();
  const int64_t step = std::max<int64_t>(1, options.chunk_tokens / std::max<int64_t>(batch, 1));
  std::vector<torch::Tensor> parts;
  for (int64_t start = 0; start < len - 1; start += step) {
    const int64_t n = std::min(step, len - 1 - start);
    auto h = predicting.narrow(1, start, n);
    auto t = targets.narrow(1, start, n);
    parts.push_back(recompute ? checkpointed_head_stats(model, h, t, options.temperature)
                              : head_stats(model, h, t, options.temperature));
  }
  auto stats = torch::cat(parts, 2);
  out.logprobs = torch::cat({zero, stats[0]}, 1);
  out.entropy = torch::cat({zero, stats[1]}, 1);
  if (model.has_value_head()) out.values = torch::cat({zero, model.values(predicting)}, 1);
  return out;
}

}  // namespace cuda_agent::lm
