#include "torch_fmt.h"  // first: see there
#include "torch_language_model.h"

#include <torch/cuda.h>

#include <optional>

#include "cuda_agent/core/log_forward.h"
#include "generation.h"
#include "training.h"
#include "weights_io.h"

namespace cuda_agent::lm {
namespace {

int64_t parameter_count(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

std::vector<float> to_vector(const torch::Tensor& t) {
  auto cpu = t.to(torch::kCPU, torch::kFloat32).contiguous();
  return {cpu.data_ptr<float>(), cpu.data_ptr<float>() + cpu.numel()};
}

torch::TensorOptions tensor_options(const lm::LmOptions& options) {
  return torch::TensorOptions().device(parse_device(options.device)).dtype(parse_dtype(options.dtype));
}

}  // namespace

void for_each_padded_run(const std::vector<std::vector<int64_t>>& sequences, int64_t max_tokens,
                         const std::function<void(size_t, size_t, const torch::Tensor&)>& fn) {
  const size_t n = sequences.size();
  size_t begin = 0;
  while (begin < n) {
    size_t end = begin + 1;
    int64_t longest = static_cast<int64_t>(sequences[begin].size());
    while (end < n) {
      const int64_t l = std::max<int64_t>(longest, static_cast<int64_t>(sequences[end].size()));
      if (l * static_cast<int64_t>(end + 1 - begin) > max_tokens) break;
      longest = l;
      ++end;
    }
    auto ids = torch::zeros({static_cast<int64_t>(end - begin), longest}, torch::kInt64);
    for (size_t i = begin; i < end; ++i)
      ids[static_cast<int64_t>(i - begin)]
          .narrow(0, 0, static_cast<int64_t>(sequences[i].size()))
          .copy_(torch::tensor(sequences[i], torch::kInt64));
    fn(begin, end, ids);
    begin = end;
  }
}

torch::Device parse_device(const std::string& name) {
  const bool cuda = name == "cuda" || name.starts_with("cuda:");
  CA_CHECK(name == "cpu" || cuda, "unknown device '{}': use cpu, cuda or cuda:N", name);
  std::optional<torch::Device> device;
  try {
    device.emplace(name);
  } catch (const c10::Error&) {
    CA_FAIL("unknown device '{}': use cpu, cuda or cuda:N", name);
  }
  if (cuda) {
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    CA_CHECK(count > 0,
             "device '{}': libtorch sees no CUDA GPU on this machine; use device cpu, or check the driver "
             "(nvidia-smi) and CUDA_VISIBLE_DEVICES",
             name);
    CA_CHECK(!device->has_index() || device->index() < count, "device '{}': this machine has {} CUDA device(s)", name,
             count);
  }
  return *device;
}

torch::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "float") return torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  CA_FAIL("unknown dtype '{}': use float32 or bfloat16", name);
}

TorchLanguageModel::TorchLanguageModel(CausalLM model, lm::LmOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  // Dynamic RoPE scales by the longest sequence of a forward: in a shared batch one call's
  // tokens would depend on the others', so those models decode each call alone.
  if (options_.batch_engine && model_->config().rope_scaling.type != "dynamic") {
    EngineOptions e;
    e.kv_tokens = options_.kv_tokens;
    e.block_size = options_.kv_block;
    e.paged_attention = options_.paged_attention;
    e.gate = options_.engine_gate;
    engine_ = std::make_unique<BatchEngine>(*model_, e);
  } else {
    // Calls decode on their own threads here: options() says so (a gate would never be called).
    options_.batch_engine = false;
    options_.engine_gate = nullptr;
  }
}

std::unique_ptr<TorchLanguageModel> TorchLanguageModel::random(const policy::ModelConfig& config,
                                                               const lm::LmOptions& options) {
  return translate_errors("random_language_model", [&] {
    CausalLM model(config, options.value_head, tensor_options(options));
    model->init_random(options.seed, options.init_std);
    log_text(LogLevel::kDebug, "lm",
             fmt::format("random model: {} parameters, {} on {}", parameter_count(*model), options.dtype,
                         options.device));
    return std::make_unique<TorchLanguageModel>(std::move(model), options);
  });
}

std::unique_ptr<TorchLanguageModel> TorchLanguageModel::load(const std::filesystem::path& path,
                                                             const lm::LmOptions& options) {
  return translate_errors("load_language_model", [&] {
    auto model = load_causal_lm(path, options, tensor_options(options));
    log_text(LogLevel::kDebug, "lm",
             fmt::format("loaded {}: {} parameters, {} on {}", path.string(), parameter_count(*model), options.dtype,
                         options.device));
    return std::make_unique<TorchLanguageModel>(std::move(model), options);
  });
}

std::vector<float> TorchLanguageModel::logits(const std::vector<int64_t>& tokens) {
  return translate_errors("logits", [&] {
    CA_CHECK(!tokens.empty(), "logits: the token list is empty");
    check_tokens(config(), tokens, "logits");
    c10::InferenceMode inference;
    const int64_t len = static_cast<int64_t>(tokens.size());
    auto ids = torch::tensor(tokens, torch::kInt64).to(model_->device()).view({1, len});
    auto positions = torch::arange(len, ids.options()).view({1, len});
    return to_vector(model_->logits(model_->forward(ids, positions)));
  });
}

std::vector<float> TorchLanguageModel::logits_with_cache(const std::vector<int64_t>& tokens, int64_t prefill) {
  return translate_errors("logits_with_cache", [&] { return to_vector(cached_logits(*model_, tokens, prefill)); });
}

std::vector<lm::Generation> TorchLanguageModel::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                         const lm::SamplingOptions& options,
                                                         const std::function<bool(size_t, int64_t)>& on_token) {
  return translate_errors("generate", [&] {
    return engine_ ? engine_->generate(prompts, options, on_token) : lm::generate(*model_, prompts, options, on_token);
  });
}

lm::EngineStats TorchLanguageModel::engine_stats() const {
  return engine_ ? engine_->stats() : lm::EngineStats{};
}

std::vector<lm::TrainForward> TorchLanguageModel::forward_for_training(
    const std::vector<std::vector<int64_t>>& sequences, const std::vector<std::vector<uint8_t>>& loss_mask) {
  return translate_errors("forward_for_training", [&] {
    const size_t n = sequences.size();
    CA_CHECK(loss_mask.empty() || loss_mask.size() == n,
             "forward_for_training: {} loss masks for {} sequences (give one per sequence, or none)", loss_mask.size(),
             n);
    for (size_t i = 0; i < n; ++i) {
      CA_CHECK(!sequences[i].empty(), "forward_for_training: sequence {} is empty", i);
      check_tokens(config(), sequences[i], fmt::format("forward_for_training sequence {}", i));
      CA_CHECK(loss_mask.empty() || loss_mask[i].empty() || loss_mask[i].size() == sequences[i].size(),
               "forward_for_training: loss mask {} has {} entries for a sequence of {} tokens", i, loss_mask[i].size(),
               sequences[i].size());
    }
    c10::InferenceMode inference;
    std::vector<lm::TrainForward> out(n);
    for_each_padded_run(sequences, kTrainingForwardTokens, [&](size_t begin, size_t end, const torch::Tensor& ids) {
      TokenStats stats = token_stats(*model_, ids.to(model_->device()));
      auto logprobs = stats.logprobs.cpu(), entropy = stats.entropy.cpu();
      auto values = stats.values.defined() ? stats.values.cpu() : torch::Tensor();
      for (size_t i = begin; i < end; ++i) {
        const int64_t row = static_cast<int64_t>(i - begin);
        const int64_t len = static_cast<int64_t>(sequences[i].size());
        auto& r = out[i];
        r.logprobs = to_vector(logprobs[row].narrow(0, 0, len));
        r.entropy = to_vector(entropy[row].narrow(0, 0, len));
        if (values.defined()) r.values = to_vector(values[row].narrow(0, 0, len));
        if (loss_mask.empty() || loss_mask[i].empty()) continue;
        for (int64_t t = 0; t < len; ++t) {
          if (loss_mask[i][t] != 0) continue;
          r.logprobs[t] = 0;
          r.entropy[t] = 0;
          if (!r.values.empty()) r.values[t] = 0;
        }
      }
    });
    return out;
  });
}

void TorchLanguageModel::save_hf(const std::filesystem::path& dir) {
  translate_errors("save_hf", [&] { save_hf_folder(*model_, dir); });
}

}  // namespace cuda_agent::lm
