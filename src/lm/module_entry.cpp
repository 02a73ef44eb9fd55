// The module's extern "C" entry points (see include/cuda_agent/lm/lm.h): status and message
// out, never an exception.
#include "torch_fmt.h"  // first: see there
#include <ATen/CPUGeneratorImpl.h>

#include "benchmark.h"
#include "checkpoint.h"
#include "critic.h"
#include "cuda_agent/core/log_forward.h"
#include "cuda_memory.h"
#include "ppo_learner.h"
#include "torch_language_model.h"
#include "training.h"

using cuda_agent::lm::kLmModuleAbi;
using cuda_agent::lm::LanguageModel;
using cuda_agent::lm::LmCreateRequest;
using cuda_agent::lm::PpoCreateRequest;
using cuda_agent::lm::PpoLearner;
using cuda_agent::policy::ModelConfig;

namespace {

constexpr const char* kStale =
    "libca_lm.so was built for another version of include/cuda_agent/lm/lm.h (ABI {} here, {} asked); "
    "rebuild both with scripts/setup.sh";

template <typename Fn>
bool reporting(std::string* error, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
  } catch (...) {
    if (error) *error = "libca_lm.so: an unknown exception";
  }
  return false;
}

std::unique_ptr<cuda_agent::lm::TorchLanguageModel> create_model(const LmCreateRequest& request) {
  CA_CHECK(request.options != nullptr, "ca_lm_create: no options given");
  if (request.path != nullptr) return cuda_agent::lm::TorchLanguageModel::load(request.path, *request.options);
  CA_CHECK(request.config != nullptr, "ca_lm_create: give a model path or a config");
  return cuda_agent::lm::TorchLanguageModel::random(*request.config, *request.options);
}

// Gradients of one loss over every parameter, with and without checkpointing.
double checkpoint_difference(const ModelConfig& config) {
  using namespace cuda_agent::lm;
  CausalLM model(config, /*value_head=*/true, torch::TensorOptions().dtype(torch::kFloat32));
  model->init_random(1, 0.1);
  auto gen = at::detail::createCPUGenerator(2);
  auto ids = torch::randint(config.vocab_size, {2, 13}, gen, torch::kInt64);
  auto gradients = [&](bool checkpoint) {
    model->zero_grad();
    TokenStatsOptions options;
    options.checkpoint = checkpoint;
    options.chunk_tokens = 10;  // several chunks, so the chunked head is exercised too
    TokenStats s = token_stats(*model, ids, options);
    (s.logprobs.sum() + 0.1 * s.entropy.sum() + s.values.sum()).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->named_parameters(true)) {
      CA_CHECK(p.value().grad().defined(), "no gradient reached {} (checkpointing {})", p.key(),
               checkpoint ? "on" : "off");
      grads.push_back(p.value().grad().clone());
    }
    return grads;
  };
  auto plain = gradients(false);
  auto recomputed = gradients(true);
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i)
    worst = std::max(worst, (plain[i] - recomputed[i]).abs().max().item<double>());
  return worst;
}

}  // namespace

extern "C" LanguageModel* ca_lm_create(const LmCreateRequest* request, std::string* error) {
  LanguageModel* model = nullptr;
  reporting(error, [&] {
    CA_CHECK(request != nullptr && request->abi == kLmModuleAbi, kStale, kLmModuleAbi,
             request ? request->abi : -1);
    model = create_model(*request).release();
  });
  return model;
}

extern "C" PpoLearner* ca_lm_create_ppo_learner(const PpoCreateRequest* request, std::string* error) {
  PpoLearner* learner = nullptr;
  reporting(error, [&] {
    CA_CHECK(request != nullptr && request->abi == kLmModuleAbi && request->model.abi == kLmModuleAbi, kStale,
             kLmModuleAbi, request ? request->abi : -1);
    CA_CHECK(request->ppo != nullptr && request->model.options != nullptr,
             "ca_lm_create_ppo_learner: no PPO or model options given");
    // A separate critic has the value head; the actor then gets none (not even an unused one).
    cuda_agent::lm::LmOptions actor_options = *request->model.options;
    if (cuda_agent::lm::critic_kind(request->ppo->critic) != cuda_agent::lm::CriticKind::kShared)
      actor_options.value_head = false;
    LmCreateRequest actor = request->model;
    actor.options = &actor_options;
    learner = cuda_agent::lm::make_ppo_learner(create_model(actor), *request->ppo).release();
  });
  return learner;
}

extern "C" int ca_lm_set_log(int abi, void (*forward)(int, const char*, const char*)) {
  if (abi != kLmModuleAbi || forward == nullptr) return 1;
  cuda_agent::forward_logs_to(forward);
  return 0;
}

extern "C" int ca_lm_release_cached_memory(int abi, int64_t* released, std::string* error) {
  const bool ok = reporting(error, [&] {
    CA_CHECK(abi == kLmModuleAbi, kStale, kLmModuleAbi, abi);
    *released = cuda_agent::lm::translate_errors("releasing cached GPU memory",
                                                 [] { return cuda_agent::lm::release_cached_cuda_memory(); });
  });
  return ok ? 0 : 1;
}

extern "C" int ca_lm_checkpoint_check(int abi, const ModelConfig* config, double* difference, std::string* error) {
  const bool ok = reporting(error, [&] {
    CA_CHECK(abi == kLmModuleAbi, kStale, kLmModuleAbi, abi);
    *difference = cuda_agent::lm::translate_errors("checkpointing check", [&] { return checkpoint_difference(*config); });
  });
  return ok ? 0 : 1;
}

extern "C" int ca_lm_benchmark(int abi, const char* spec, std::string* result, std::string* error) {
  const bool ok = reporting(error, [&] {
    CA_CHECK(abi == kLmModuleAbi, kStale, kLmModuleAbi, abi);
    *result = cuda_agent::lm::translate_errors("benchmark", [&] {
      return cuda_agent::lm::run_benchmark(nlohmann::json::parse(spec)).dump(2);
    });
  });
  return ok ? 0 : 1;
}
