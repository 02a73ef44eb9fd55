// lm::LanguageModel implemented on CausalLM, inside the module. The trainer (same module)
// reaches the torch model through model().
//
// Every method translates what libtorch throws (c10::Error, std::bad_alloc, ...) into
// cuda_agent::Error, so the torch-free side only ever sees Error.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <new>

#include "cuda_agent/core/error.h"
#include "cuda_agent/lm/lm.h"
#include "batch_engine.h"
#include "model.h"

namespace cuda_agent::lm {

// "cpu", "cuda", "cuda:N" -> a device that exists here; Error naming the string otherwise.
torch::Device parse_device(const std::string& name);
// "float32" / "fp32" / "float", "bfloat16" / "bf16" -> the dtype; Error otherwise.
torch::ScalarType parse_dtype(const std::string& name);

class TorchLanguageModel final : public lm::LanguageModel {
 public:
  TorchLanguageModel(CausalLM model, lm::LmOptions options);

  // A model of `config` with random weights (CausalLMImpl::init_random), per options.
  static std::unique_ptr<TorchLanguageModel> random(const policy::ModelConfig& config, const lm::LmOptions& options);
  // A model loaded from a Hugging Face folder or a GGUF file, per options.
  static std::unique_ptr<TorchLanguageModel> load(const std::filesystem::path& path, const lm::LmOptions& options);

  const policy::ModelConfig& config() const override { return model_->config(); }
  const lm::LmOptions& options() const override { return options_; }
  std::vector<float> logits(const std::vector<int64_t>& tokens) override;
  std::vector<float> logits_with_cache(const std::vector<int64_t>& tokens, int64_t prefill) override;
  std::vector<lm::Generation> generate(const std::vector<std::vector<int64_t>>& prompts,
                                       const lm::SamplingOptions& options,
                                       const std::function<bool(size_t, int64_t)>& on_token) override;
  std::vector<lm::TrainForward> forward_for_training(const std::vector<std::vector<int64_t>>& sequences,
                                                     const std::vector<std::vector<uint8_t>>& loss_mask) override;
  void save_hf(const std::filesystem::path& dir) override;
  lm::EngineStats engine_stats() const override;

  CausalLM& model() { return model_; }

 private:
  CausalLM model_;
  lm::LmOptions options_;
  std::unique_ptr<BatchEngine> engine_;  // options.batch_engine; destroyed before the model
};

// Sequences per forward of forward_for_training: at most this many (padded) tokens at once.
inline constexpr int64_t kTrainingForwardTokens = 16384;

// Splits `sequences` into runs of consecutive ones, each right-padded with token 0 into one int64
// [B, T] CPU tensor of at most max_tokens padded tokens (a longer sequence is a run of its own),
// and calls fn(begin, end, ids) for each run in order: sequences [begin, end) are ids' rows.
void for_each_padded_run(const std::vector<std::vector<int64_t>>& sequences, int64_t max_tokens,
                         const std::function<void(size_t begin, size_t end, const torch::Tensor& ids)>& fn);

// Runs fn, turning any exception but Error into Error with `what` and the original text
// (c10::Error without its C++ backtrace).
template <typename Fn>
auto translate_errors(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    CA_FAIL("{}: libtorch: {}", what, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    CA_FAIL("{}: out of memory; use a smaller batch, shorter sequences or a bigger device", what);
  } catch (const std::exception& e) {
    CA_FAIL("{}: {}", what, e.what());
  }
}

}  // namespace cuda_agent::lm
