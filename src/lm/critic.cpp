#include "torch_fmt.h"  // first: see there
#include "critic.h"

#include "cuda_agent/core/error.h"
#include "torch_language_model.h"
#include "weights_io.h"

namespace cuda_agent::lm {
namespace {

lm::LmOptions with_value_head(lm::LmOptions options) {
  options.value_head = true;
  return options;
}

torch::TensorOptions tensor_options(const lm::LmOptions& options) {
  return torch::TensorOptions().device(parse_device(options.device)).dtype(parse_dtype(options.dtype));
}

}  // namespace

CriticKind critic_kind(const std::string& critic) {
  CA_CHECK(!critic.empty(), "the critic (model.critic) is empty: use shared, from_actor or the critic's weights");
  if (critic == "shared") return CriticKind::kShared;
  if (critic == "from_actor") return CriticKind::kFromActor;
  return CriticKind::kPath;
}

CausalLM critic_from_actor(CausalLMImpl& actor, const lm::LmOptions& options) {
  CausalLM critic(actor.config(), /*value_head=*/true,
                  torch::TensorOptions().device(actor.device()).dtype(actor.dtype()), /*lm_head=*/false);
  copy_parameters(actor, *critic, "its critic", "value_head.");
  critic->init_value_head(options.seed, options.init_std);
  return critic;
}

CausalLM critic_from_path(const std::filesystem::path& path, const lm::LmOptions& options,
                          const policy::ModelConfig& actor) {
  const auto critic_options = with_value_head(options);
  CausalLM critic = load_causal_lm(path, critic_options, tensor_options(critic_options), /*lm_head=*/false);
  CA_CHECK(critic->config().vocab_size == actor.vocab_size,
           "critic {}: vocab_size {}, the actor's is {}; the critic reads the actor's tokens, so it needs the same "
           "vocabulary",
           path.string(), critic->config().vocab_size, actor.vocab_size);
  return critic;
}

torch::Tensor critic_values(CausalLMImpl& critic, const torch::Tensor& input_ids) {
  const int64_t batch = input_ids.size(0), len = input_ids.size(1);
  auto positions = torch::arange(len, input_ids.options()).unsqueeze(0).expand({batch, len});
  auto hidden = critic.forward(input_ids, positions);
  auto zero = torch::zeros({batch, 1}, torch::TensorOptions().device(input_ids.device()).dtype(torch::kFloat32));
  if (len < 2) return zero.expand({batch, len}).clone();
  return torch::cat({zero, critic.values(hidden.narrow(1, 0, len - 1))}, 1);
}

}  // namespace cuda_agent::lm
