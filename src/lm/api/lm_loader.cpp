// The torch-free side of the language model: finds libca_lm.so, loads it once with
// dlopen(RTLD_LOCAL) and wraps what it creates so that only cuda_agent::Error leaves a call.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <system_error>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/lm/lm.h"
#include "cuda_agent/lm/ppo_learner.h"

namespace cuda_agent::lm {

using policy::ModelConfig;  // the policy component's
namespace {

constexpr const char* kModuleName = "libca_lm.so";

using CreateFn = LanguageModel* (*)(const LmCreateRequest*, std::string*);
using CheckFn = int (*)(int, const ModelConfig*, double*, std::string*);
using BenchFn = int (*)(int, const char*, std::string*, std::string*);
using PpoCreateFn = PpoLearner* (*)(const PpoCreateRequest*, std::string*);
using ReleaseFn = int (*)(int, int64_t*, std::string*);

struct Module {
  std::filesystem::path path;
  CreateFn create = nullptr;
  CheckFn checkpoint_check = nullptr;
  BenchFn benchmark = nullptr;       // optional: only ca-lm-bench needs it
  PpoCreateFn create_ppo = nullptr;  // optional: only training needs it
  ReleaseFn release = nullptr;       // optional: a module built before it releases nothing
};

// Set once the module has loaded: release_cached_gpu_memory does not load it.
std::atomic<const Module*> loaded{nullptr};

std::filesystem::path find_module() {
  std::vector<std::filesystem::path> tried;
  if (const char* bin = std::getenv("CUDA_AGENT_BIN"); bin && *bin)
    tried.push_back(std::filesystem::path(bin).parent_path() / kModuleName);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(exe.parent_path() / kModuleName);
  for (const auto& p : tried)
    if (std::filesystem::exists(p, ec)) return p;
  std::string where;
  for (const auto& p : tried) where += (where.empty() ? "" : ", ") + p.string();
  CA_FAIL(
      "cannot find the language-model module {} (looked at: {}); build the ca_lm target (scripts/setup.sh) "
      "and keep it beside the cuda-agent binary",
      kModuleName, where.empty() ? "nowhere: neither $CUDA_AGENT_BIN nor /proc/self/exe is usable" : where);
}

// Loaded once per process and never closed: models and libtorch's static state live in it.
const Module& module() {
  static std::once_flag once;
  static Module m;
  static std::string failure;
  std::call_once(once, [] {
    try {
      m.path = find_module();
      void* handle = dlopen(m.path.c_str(), RTLD_NOW | RTLD_LOCAL);
      CA_CHECK(handle != nullptr, "cannot load {}: {}; rebuild it with scripts/setup.sh", m.path.string(), dlerror());
      m.create = reinterpret_cast<CreateFn>(dlsym(handle, "ca_lm_create"));
      m.checkpoint_check = reinterpret_cast<CheckFn>(dlsym(handle, "ca_lm_checkpoint_check"));
      m.benchmark = reinterpret_cast<BenchFn>(dlsym(handle, "ca_lm_benchmark"));
      m.create_ppo = reinterpret_cast<PpoCreateFn>(dlsym(handle, "ca_lm_create_ppo_learner"));
      m.release = reinterpret_cast<ReleaseFn>(dlsym(handle, "ca_lm_release_cached_memory"));
      // The module's messages come out of this binary's loggers (absent in a module built before).
      using SetLogFn = int (*)(int, LogForward);
      if (auto set_log = reinterpret_cast<SetLogFn>(dlsym(handle, "ca_lm_set_log")))
        (void)set_log(kLmModuleAbi, &log_forwarded);
      CA_CHECK(m.create != nullptr && m.checkpoint_check != nullptr,
               "{} lacks the entry points ca_lm_create / ca_lm_checkpoint_check; rebuild it with scripts/setup.sh",
               m.path.string());
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  CA_CHECK(failure.empty(), "{}", failure);
  loaded = &m;
  return m;
}

// Keeps the exception contract at the boundary: whatever the module lets out becomes Error.
template <typename Fn>
auto guarded(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    CA_FAIL("language model {}: {}", what, e.what());
  }
}

// Owns the module's model, or (a learner's policy) only refers to it.
class ModuleLanguageModel final : public LanguageModel {
 public:
  explicit ModuleLanguageModel(std::unique_ptr<LanguageModel> impl) : owned_(std::move(impl)), impl_(owned_.get()) {}
  explicit ModuleLanguageModel(LanguageModel* impl) : impl_(impl) {}

  const ModelConfig& config() const override { return impl_->config(); }
  const LmOptions& options() const override { return impl_->options(); }
  std::vector<float> logits(const std::vector<int64_t>& tokens) override {
    return guarded("logits", [&] { return impl_->logits(tokens); });
  }
  std::vector<float> logits_with_cache(const std::vector<int64_t>& tokens, int64_t prefill) override {
    return guarded("logits_with_cache", [&] { return impl_->logits_with_cache(tokens, prefill); });
  }
  std::vector<Generation> generate(const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options,
                                   const std::function<bool(size_t, int64_t)>& on_token) override {
    return guarded("generate", [&] { return impl_->generate(prompts, options, on_token); });
  }
  std::vector<TrainForward> forward_for_training(const std::vector<std::vector<int64_t>>& sequences,
                                                 const std::vector<std::vector<uint8_t>>& loss_mask) override {
    return guarded("forward_for_training", [&] { return impl_->forward_for_training(sequences, loss_mask); });
  }
  void save_hf(const std::filesystem::path& dir) override {
    guarded("save_hf", [&] { impl_->save_hf(dir); });
  }
  EngineStats engine_stats() const override { return impl_->engine_stats(); }

 private:
  std::unique_ptr<LanguageModel> owned_;
  LanguageModel* impl_;
};

class ModulePpoLearner final : public PpoLearner {
 public:
  explicit ModulePpoLearner(std::unique_ptr<PpoLearner> impl) : impl_(std::move(impl)), policy_(&impl_->policy()) {}

  PpoStats update(const std::vector<PpoSample>& batch) override {
    return guarded("PPO update", [&] { return impl_->update(batch); });
  }
  PpoStats evaluate(const std::vector<PpoSample>& batch) override {
    return guarded("PPO evaluate", [&] { return impl_->evaluate(batch); });
  }
  PpoStats sft_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return guarded("SFT update", [&] { return impl_->sft_update(batch, stage); });
  }
  PpoStats value_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return guarded("value update", [&] { return impl_->value_update(batch, stage); });
  }
  std::vector<TrainForward> forward(const std::vector<std::vector<int64_t>>& sequences,
                                    const std::vector<std::vector<uint8_t>>& loss_mask) override {
    return guarded("PPO learner forward", [&] { return impl_->forward(sequences, loss_mask); });
  }
  void save_state(const std::filesystem::path& dir) override {
    guarded("PPO learner save_state", [&] { impl_->save_state(dir); });
  }
  int64_t optimizer_state_bytes() override {
    return guarded("PPO learner optimizer_state_bytes", [&] { return impl_->optimizer_state_bytes(); });
  }
  void load_state(const std::filesystem::path& dir) override {
    guarded("PPO learner load_state", [&] { impl_->load_state(dir); });
  }
  LanguageModel& policy() override { return policy_; }
  LanguageModel& snapshot_policy() override {
    LanguageModel& copy =
        guarded("PPO learner snapshot_policy", [&]() -> LanguageModel& { return impl_->snapshot_policy(); });
    if (!snapshot_) snapshot_ = std::make_unique<ModuleLanguageModel>(&copy);
    return *snapshot_;
  }
  const PpoOptions& options() const override { return impl_->options(); }
  std::vector<double> sum_over_processes(const std::vector<double>& values) override {
    return guarded("PPO learner sum_over_processes", [&] { return impl_->sum_over_processes(values); });
  }

 private:
  std::unique_ptr<PpoLearner> impl_;
  ModuleLanguageModel policy_;                     // declared after impl_: refers to the model impl_ owns
  std::unique_ptr<ModuleLanguageModel> snapshot_;  // refers to impl_'s snapshot, once made
};

std::unique_ptr<LanguageModel> create(const LmCreateRequest& request) {
  const Module& m = module();
  std::string error;
  LanguageModel* raw = m.create(&request, &error);
  CA_CHECK(raw != nullptr, "{}", error.empty() ? "the language-model module failed without a message" : error);
  return std::make_unique<ModuleLanguageModel>(std::unique_ptr<LanguageModel>(raw));
}

std::unique_ptr<PpoLearner> create_learner(const PpoCreateRequest& request) {
  const Module& m = module();
  CA_CHECK(m.create_ppo != nullptr,
           "{} lacks the entry point ca_lm_create_ppo_learner (built before the PPO learner); rebuild it with "
           "scripts/setup.sh",
           m.path.string());
  CA_CHECK(request.model.options->value_head || request.ppo->critic != "shared",
           "the PPO learner with the shared critic needs the value head: set LmOptions::value_head = true");
  std::string error;
  PpoLearner* raw = m.create_ppo(&request, &error);
  CA_CHECK(raw != nullptr, "{}", error.empty() ? "the language-model module failed without a message" : error);
  return std::make_unique<ModulePpoLearner>(std::unique_ptr<PpoLearner>(raw));
}

}  // namespace

int64_t release_cached_gpu_memory() {
  const Module* m = loaded.load();
  if (m == nullptr || m->release == nullptr) return 0;
  int64_t released = 0;
  std::string error;
  if (m->release(kLmModuleAbi, &released, &error) != 0) {
    CA_LOG_WARN("lm", "releasing cached GPU memory failed: {}", error);
    return 0;
  }
  return released;
}

std::filesystem::path language_model_module_path() {
  return module().path;
}

std::unique_ptr<LanguageModel> load_language_model(const std::filesystem::path& model, const LmOptions& options) {
  const std::string path = model.string();
  LmCreateRequest request;
  request.path = path.c_str();
  request.options = &options;
  return create(request);
}

std::unique_ptr<LanguageModel> random_language_model(const ModelConfig& config, const LmOptions& options) {
  LmCreateRequest request;
  request.config = &config;
  request.options = &options;
  return create(request);
}

std::unique_ptr<PpoLearner> create_ppo_learner(const std::filesystem::path& model, const LmOptions& options,
                                               const PpoOptions& ppo) {
  const std::string path = model.string();
  PpoCreateRequest request;
  request.model.path = path.c_str();
  request.model.options = &options;
  request.ppo = &ppo;
  return create_learner(request);
}

std::unique_ptr<PpoLearner> create_random_ppo_learner(const ModelConfig& config, const LmOptions& options,
                                                      const PpoOptions& ppo) {
  PpoCreateRequest request;
  request.model.config = &config;
  request.model.options = &options;
  request.ppo = &ppo;
  return create_learner(request);
}

nlohmann::json run_language_model_benchmark(const nlohmann::json& spec) {
  const Module& m = module();
  CA_CHECK(m.benchmark != nullptr, "{} lacks the entry point ca_lm_benchmark; rebuild it with scripts/setup.sh",
           m.path.string());
  std::string result, error;
  CA_CHECK(m.benchmark(kLmModuleAbi, spec.dump().c_str(), &result, &error) == 0, "{}", error);
  return nlohmann::json::parse(result);
}

double checkpointing_gradient_difference(const ModelConfig& config) {
  const Module& m = module();
  double difference = 0;
  std::string error;
  CA_CHECK(m.checkpoint_check(kLmModuleAbi, &config, &difference, &error) == 0, "{}", error);
  return difference;
}

}  // namespace cuda_agent::lm
