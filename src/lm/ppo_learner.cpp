#include "torch_fmt.h"  // first: see there
#include "ppo_learner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "adamw_state.h"
#include "replicas.h"
#include "ppo_batch.h"
#include "critic.h"
#include "cuda_agent/core/files.h"
#include "generation.h"
#include "training.h"
#include "weights_io.h"

namespace cuda_agent::lm {
namespace {

using lm::PpoOptions;
using lm::PpoSample;
using lm::PpoStats;
using lm::StageUpdateOptions;

using Aggregation = lm::LossAggregation;
using lm::KlEstimator;

void check_options(const PpoOptions& o) {
  CA_CHECK(std::isfinite(o.actor_lr) && o.actor_lr >= 0, "ppo.actor_lr = {}: must be >= 0", o.actor_lr);
  CA_CHECK(std::isfinite(o.critic_lr) && o.critic_lr >= 0, "ppo.critic_lr = {}: must be >= 0", o.critic_lr);
  CA_CHECK(o.clip_low > 0 && o.clip_low < 1, "ppo.clip_low = {}: allowed (0, 1)", o.clip_low);
  CA_CHECK(o.clip_high > 0 && std::isfinite(o.clip_high), "ppo.clip_high = {}: allowed (0, inf)", o.clip_high);
  CA_CHECK(o.value_clip > 0 && std::isfinite(o.value_clip), "ppo.value_clip = {}: allowed (0, inf)", o.value_clip);
  CA_CHECK(std::isfinite(o.entropy_coef), "ppo.entropy_coef = {}: must be finite", o.entropy_coef);
  CA_CHECK(std::isfinite(o.kl_coef) && o.kl_coef >= 0, "ppo.kl.coef = {}: must be >= 0", o.kl_coef);
  CA_CHECK(o.kl_mode == "reward" || o.kl_mode == "loss", "ppo.kl.mode = '{}': use reward or loss", o.kl_mode);
  CA_CHECK(o.grad_clip >= 0, "ppo.grad_clip = {}: must be >= 0 (0 turns clipping off)", o.grad_clip);
  CA_CHECK(o.mini_batches >= 1, "ppo.mini_batches = {}: must be >= 1", o.mini_batches);
  CA_CHECK(o.micro_batch_tokens >= 0, "ppo.micro_batch_tokens = {}: must be >= 0 (0: one forward a mini-batch)",
           o.micro_batch_tokens);
  CA_CHECK(o.epochs >= 1, "ppo.epochs = {}: must be >= 1", o.epochs);
  CA_CHECK(o.weight_decay >= 0, "ppo weight_decay = {}: must be >= 0", o.weight_decay);
  CA_CHECK(std::isfinite(o.temperature) && o.temperature > 0,
           "the PPO learner's temperature (rollout.temperature) = {}: must be > 0", o.temperature);
  lm::parse_loss_aggregation(o.loss_aggregation);
  lm::parse_kl_estimator(o.kl_estimator);
  critic_kind(o.critic);
}

void check_stage(const StageUpdateOptions& o, Use use) {
  CA_CHECK(std::isfinite(o.lr) && o.lr >= 0, "{} update: lr = {}: must be >= 0", label(use), o.lr);
  CA_CHECK(o.epochs >= 1, "{} update: epochs = {}: must be >= 1", label(use), o.epochs);
  CA_CHECK(o.mini_batches >= 1, "{} update: mini_batches = {}: must be >= 1", label(use), o.mini_batches);
}

// Takes parameters out of autograd for one update (back in on destruction, also on error): they
// get no gradient, so AdamW skips them (no step, no decay, moments kept), and backward does not
// spend work on them.
class Frozen {
 public:
  explicit Frozen(const std::vector<torch::Tensor>& params) : params_(params) {
    for (auto& p : params_) {
      saved_.push_back(p.requires_grad());
      p.requires_grad_(false);
    }
  }
  ~Frozen() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].requires_grad_(saved_[i]);
  }
  Frozen(const Frozen&) = delete;
  Frozen& operator=(const Frozen&) = delete;

 private:
  std::vector<torch::Tensor> params_;
  std::vector<bool> saved_;
};

// Sets one parameter group's learning rate for one update, restoring it on destruction.
class GroupLr {
 public:
  GroupLr(torch::optim::Optimizer& optimizer, size_t group, double lr)
      : options_(optimizer.param_groups().at(group).options()), saved_(options_.get_lr()) {
    options_.set_lr(lr);
  }
  ~GroupLr() { options_.set_lr(saved_); }
  GroupLr(const GroupLr&) = delete;
  GroupLr& operator=(const GroupLr&) = delete;

 private:
  torch::optim::OptimizerOptions& options_;
  double saved_;
};

// The files save_state writes beside the caller's actor/ folder (ppo_learner.h, "Checkpoints").
constexpr const char* kStateFile = "learner_state.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kCriticFolder = "critic";
constexpr const char* kStateFormat = "cuda-agent ppo learner state v1";

std::vector<float> row_values(const torch::Tensor& rows, int64_t row, int64_t len) {
  auto r = rows[row].narrow(0, 0, len).to(torch::kFloat32).contiguous();
  return {r.data_ptr<float>(), r.data_ptr<float>() + len};
}

class TorchPpoLearner final : public lm::PpoLearner {
 public:
  // `critic` is null for the shared critic (the actor's value head), else the separate critic.
  TorchPpoLearner(std::unique_ptr<TorchLanguageModel> model, CausalLM critic, const PpoOptions& options)
      : model_(std::move(model)),
        critic_(std::move(critic)),
        options_(options),
        aggregation_(lm::parse_loss_aggregation(options.loss_aggregation)),
        kl_(lm::parse_kl_estimator(options.kl_estimator)),
        rng_(options.seed) {
    CausalLM& m = model_->model();
    groups_ = {{"actor", {}}, {"critic", {}}};
    if (!separate()) {
      CA_CHECK(m->has_value_head(),
               "the PPO learner with the shared critic needs a model with a value head (LmOptions::value_head = true)");
      for (const auto& p : m->named_parameters(true)) {
        const size_t g = p.key().starts_with("value_head.") ? kCriticGroup : kActorGroup;
        groups_[g].params.emplace_back(p.key(), p.value());
      }
    } else {
      CA_CHECK(!m->has_value_head(), "the actor has a value head although the critic is a separate model ({})",
               options.critic);
      for (const auto& p : m->named_parameters(true)) groups_[kActorGroup].params.emplace_back(p.key(), p.value());
      for (const auto& p : critic_->named_parameters(true))
        groups_[kCriticGroup].params.emplace_back(p.key(), p.value());
    }
    for (const auto& [name, p] : groups_[kActorGroup].params) actor_params_.push_back(p);
    for (const auto& [name, p] : groups_[kCriticGroup].params) critic_params_.push_back(p);
    std::vector<torch::Tensor> all(actor_params_);
    all.insert(all.end(), critic_params_.begin(), critic_params_.end());
    replicas_ = std::make_unique<Replicas>(options.distributed, m->device(), std::move(all),
                                           options.shard_optimizer_state);
    // The optimizer steps the parameters this process owns: all of them unless sharded.
    auto group = [&](const std::vector<torch::Tensor>& all, size_t first, double lr) {
      std::vector<torch::Tensor> params;
      for (size_t i = 0; i < all.size(); ++i)
        if (replicas_->owns(first + i)) params.push_back(all[i]);
      auto o = std::make_unique<torch::optim::AdamWOptions>(lr);
      o->weight_decay(options.weight_decay);
      return torch::optim::OptimizerParamGroup(std::move(params), std::move(o));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.push_back(group(actor_params_, 0, options.actor_lr));
    groups.push_back(group(critic_params_, actor_params_.size(), options.critic_lr));
    optimizer_ = std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                       torch::optim::AdamWOptions(options.actor_lr)
                                                           .weight_decay(options.weight_decay));
    // Every replica starts from rank 0's weights (a value head drawn from the seed is equal
    // anyway; this also covers a rank that loaded other files).
    if (replicas_->distributed()) replicas_->broadcast_from_rank0();
  }

  PpoStats update(const std::vector<PpoSample>& batch) override {
    return translate_errors("PPO update", [&] {
      const auto start = std::chrono::steady_clock::now();
      std::vector<PpoSample> tempered;
      auto [tokens, plan] = replicas_->agreed("PPO update", [&] {
        const int64_t t = check_batch(batch, Use::kPpo);
        const std::vector<PpoSample>& used = with_old_logprobs(batch, tempered);
        return std::pair(t, draw_plan(used, options_.epochs, options_.mini_batches, Use::kPpo, "ppo."));
      });
      PpoStats stats = steps(plan, Use::kPpo, [&](const Padded& b) { return objective(b, /*backward=*/true); });
      return finish(stats, tokens, start);
    });
  }

  PpoStats sft_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return translate_errors("SFT update", [&] {
      const auto start = std::chrono::steady_clock::now();
      auto [tokens, plan] = replicas_->agreed("SFT update", [&] {
        check_stage(stage, Use::kSft);
        const int64_t t = check_batch(batch, Use::kSft);
        return std::pair(t, draw_plan(batch, stage.epochs, stage.mini_batches, Use::kSft, ""));
      });
      Frozen critic(critic_params_);
      GroupLr lr(*optimizer_, kActorGroup, stage.lr);
      PpoStats stats = steps(plan, Use::kSft, [&](const Padded& b) { return sft_objective(b); });
      return finish(stats, tokens, start);
    });
  }

  PpoStats value_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return translate_errors("value update", [&] {
      const auto start = std::chrono::steady_clock::now();
      auto [tokens, plan] = replicas_->agreed("value update", [&] {
        check_stage(stage, Use::kValue);
        const int64_t t = check_batch(batch, Use::kValue);
        return std::pair(t, draw_plan(batch, stage.epochs, stage.mini_batches, Use::kValue, ""));
      });
      // The shared critic's trunk is the actor's: it is frozen with the rest of the actor.
      Frozen actor(actor_params_);
      GroupLr lr(*optimizer_, kCriticGroup, stage.lr);
      PpoStats stats = steps(plan, Use::kValue, [&](const Padded& b) { return value_objective(b); });
      return finish(stats, tokens, start);
    });
  }

  PpoStats evaluate(const std::vector<PpoSample>& batch) override {
    return translate_errors("PPO evaluate", [&] {
      const auto start = std::chrono::steady_clock::now();
      const int64_t tokens = check_batch(batch, Use::kPpo);
      CA_CHECK(tokens > 0, "PPO evaluate: the batch holds no policy tokens (loss_mask 1)");
      torch::NoGradGuard no_grad;
      replicas_->reset_shares();  // this process's batch alone, also in a world of several
      std::vector<PpoSample> tempered;
      std::vector<const PpoSample*> all;
      for (const auto& s : with_old_logprobs(batch, tempered)) all.push_back(&s);
      return finish(objective(pad(all, model_->model()->device(), Use::kPpo), /*backward=*/false), tokens, start);
    });
  }

  std::vector<lm::TrainForward> forward(const std::vector<std::vector<int64_t>>& sequences,
                                        const std::vector<std::vector<uint8_t>>& loss_mask) override {
    // The actor's pass checks the arguments and gives log-probs and entropies (and the shared
    // critic's values); a separate critic adds its values in a pass of its own.
    auto out = model_->forward_for_training(sequences, loss_mask);
    if (!separate()) return out;
    return translate_errors("PPO learner forward", [&] {
      c10::InferenceMode inference;
      for_each_padded_run(sequences, kTrainingForwardTokens, [&](size_t begin, size_t end, const torch::Tensor& ids) {
        auto values = critic_values(*critic_, ids.to(critic_->device())).cpu();
        for (size_t i = begin; i < end; ++i) {
          auto& r = out[i];
          r.values = row_values(values, static_cast<int64_t>(i - begin), static_cast<int64_t>(sequences[i].size()));
          if (loss_mask.empty() || loss_mask[i].empty()) continue;
          for (size_t t = 0; t < r.values.size(); ++t)
            if (loss_mask[i][t] == 0) r.values[t] = 0;
        }
      });
      return out;
    });
  }

  void save_state(const std::filesystem::path& dir) override {
    translate_errors("PPO learner save_state", [&] {
      // Rank 0 borrows the other processes' moments for the file, and drops them afterwards.
      const std::vector<c10::TensorImpl*> borrowed =
          replicas_->sharded() ? replicas_->gather_moments_on_rank0(*optimizer_) : std::vector<c10::TensorImpl*>{};
      struct Drop {
        torch::optim::AdamW& optimizer;
        const std::vector<c10::TensorImpl*>& keys;
        ~Drop() {
          for (auto* k : keys) optimizer.state().erase(k);
        }
      } drop{*optimizer_, borrowed};
      if (replicas_->rank() != 0) return;
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      CA_CHECK(!ec, "cannot create the folder {}: {}", dir.string(), ec.message());
      if (separate()) save_hf_folder(*critic_, dir / kCriticFolder);
      std::ostringstream generator;
      generator << rng_;
      nlohmann::json state = {{"format", kStateFormat},
                              {"critic", separate() ? "separate" : "shared"},
                              {"critic_option", options_.critic},
                              {"shuffle_generator", generator.str()},
                              {"optimizer_file", kOptimizerFile}};
      state["optimizer"] = save_adamw_state(*optimizer_, groups_, dir / kOptimizerFile);
      write_file_atomic(dir / kStateFile, state.dump(1) + "\n");
    });
  }

  void load_state(const std::filesystem::path& dir) override {
    translate_errors("PPO learner load_state", [&] {
      const std::filesystem::path file = dir / kStateFile;
      CA_CHECK(std::filesystem::exists(file),
               "{} is missing: load_state reads a folder written by save_state (learner_state.json, {})", file.string(),
               kOptimizerFile);
      nlohmann::json state;
      std::mt19937_64 generator;
      std::unique_ptr<policy::WeightFile> moments;
      try {
        state = nlohmann::json::parse(read_file(file));
        const std::string format = state.value("format", "");
        CA_CHECK(format == kStateFormat, "{}: format '{}', this learner reads '{}'", file.string(), format,
                 kStateFormat);
        const std::string mode = state.at("critic").get<std::string>();
        const std::string mine = separate() ? "separate" : "shared";
        CA_CHECK(mode == mine,
                 "{}: saved by a learner with the {} critic, but this one's critic is {} (ppo critic '{}'); create the "
                 "learner with the critic mode of the checkpoint",
                 file.string(), mode, mine, options_.critic);
        std::istringstream in(state.at("shuffle_generator").get<std::string>());
        in >> generator;
        CA_CHECK(!in.fail(), "{}: shuffle_generator is not the state of a std::mt19937_64", file.string());
        moments = policy::open_safetensors(dir / kOptimizerFile);
        check_adamw_state(groups_, state.at("optimizer"), file, *moments);
      } catch (const nlohmann::json::exception& e) {
        CA_FAIL("{}: not a learner state ({})", file.string(), e.what());
      }
      if (separate()) load_weights_into(*critic_, dir / kCriticFolder);
      restore_adamw_state(*optimizer_, groups_, state.at("optimizer"), *moments);
      if (replicas_->sharded())  // keep this process's share only
        for_each_param([&](size_t i, const torch::Tensor& p) {
          if (!replicas_->owns(i)) optimizer_->state().erase(p.unsafeGetTensorImpl());
        });
      rng_ = generator;
    });
  }

  int64_t optimizer_state_bytes() override {
    int64_t bytes = 0;
    for_each_param([&](size_t, const torch::Tensor& p) {
      if (auto* state = adamw_state_of(*optimizer_, p))
        for (const auto& m : {state->exp_avg(), state->exp_avg_sq()})
          if (m.defined()) bytes += static_cast<int64_t>(m.nbytes());
    });
    return bytes;
  }

  lm::LanguageModel& policy() override { return *model_; }

  lm::LanguageModel& snapshot_policy() override {
    return translate_errors("snapshotting the actor for rollouts", [&]() -> lm::LanguageModel& {
      CausalLM& actor = model_->model();
      if (!snapshot_) {
        CausalLM copy(actor->config(), /*value_head=*/false,
                      torch::TensorOptions().dtype(actor->dtype()).device(actor->device()));
        copy->eval();
        lm::LmOptions o = model_->options();
        o.value_head = false;
        snapshot_ = std::make_unique<TorchLanguageModel>(std::move(copy), o);
      }
      copy_parameters(*actor, *snapshot_->model(), "its rollout snapshot");
      return *snapshot_;
    });
  }

  const PpoOptions& options() const override { return options_; }

  std::vector<double> sum_over_processes(const std::vector<double>& values) override {
    return translate_errors("PPO learner sum_over_processes", [&] { return replicas_->sum(values); });
  }

 private:
  static constexpr size_t kActorGroup = 0, kCriticGroup = 1;  // the optimizer's parameter groups

  bool separate() const { return !critic_.is_empty(); }
  TokenStatsOptions stats_options() const {
    TokenStatsOptions o;
    o.checkpoint = options_.activation_checkpointing;
    return o;
  }
  // The policy's statistics in the PPO objective: at the rollout's temperature.
  TokenStatsOptions policy_stats_options() const {
    TokenStatsOptions o = stats_options();
    o.temperature = options_.temperature;
    return o;
  }

  // `batch` itself at temperature 1; otherwise a copy in `tempered` whose old_logprobs are the
  // current weights' at options_.temperature on the policy tokens (PpoOptions::temperature).
  const std::vector<PpoSample>& with_old_logprobs(const std::vector<PpoSample>& batch,
                                                  std::vector<PpoSample>& tempered) {
    if (options_.temperature == 1.0) return batch;
    tempered = batch;
    std::vector<std::vector<int64_t>> sequences;
    for (const PpoSample& s : batch) sequences.push_back(s.tokens);
    c10::InferenceMode inference;
    CausalLM& model = model_->model();
    TokenStatsOptions o = policy_stats_options();
    o.checkpoint = false;
    for_each_padded_run(sequences, kTrainingForwardTokens, [&](size_t begin, size_t end, const torch::Tensor& ids) {
      const torch::Tensor logprobs =
          token_stats(*model, ids.to(model->device()), o).logprobs.to(torch::kCPU).contiguous();
      for (size_t i = begin; i < end; ++i) {
        PpoSample& s = tempered[i];
        const float* lp = logprobs[static_cast<int64_t>(i - begin)].data_ptr<float>();
        for (size_t t = 0; t < s.tokens.size(); ++t)
          if (s.loss_mask[t] != 0) s.old_logprobs[t] = lp[t];
      }
    });
    return tempered;
  }
  template <class F>
  void for_each_param(F&& f) const {
    size_t i = 0;
    for (const auto* params : {&actor_params_, &critic_params_})
      for (const auto& p : *params) f(i++, p);
  }

  // Checks every sample; returns the batch's policy tokens.
  int64_t check_batch(const std::vector<PpoSample>& batch, Use use) const {
    CA_CHECK(!batch.empty(), "{}: the batch is empty", label(use));
    int64_t tokens = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      check_sample(batch[i], i, model_->config(), use);
      CA_CHECK(use != Use::kPpo || batch[i].ref_logprobs.empty() == batch[0].ref_logprobs.empty(),
               "PPO sample {} {} ref_logprobs but sample 0 {}: give them for all samples or none", i,
               batch[i].ref_logprobs.empty() ? "lacks" : "has", batch[0].ref_logprobs.empty() ? "lacks them" : "has them");
      for (uint8_t m : batch[i].loss_mask) tokens += m;
    }
    return tokens;
  }

  // The mini-batches of every epoch, drawn (advancing the seeded shuffle) and checked before the
  // first step, so a bad batch changes nothing. `key` prefixes the option names in messages.
  std::vector<std::vector<const PpoSample*>> draw_plan(const std::vector<PpoSample>& batch, int epochs,
                                                       int mini_batches, Use use, const char* key) {
    const size_t n = batch.size(), parts = static_cast<size_t>(mini_batches);
    CA_CHECK(n >= parts, "{} update: {} samples cannot fill {}mini_batches = {} mini-batches", label(use), n, key,
             parts);
    std::vector<std::vector<const PpoSample*>> plan;
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    for (int epoch = 0; epoch < epochs; ++epoch) {
      std::shuffle(order.begin(), order.end(), rng_);
      for (size_t k = 0; k < parts; ++k) {
        std::vector<const PpoSample*> part;
        int64_t part_tokens = 0;
        for (size_t j = n * k / parts; j < n * (k + 1) / parts; ++j) {
          part.push_back(&batch[order[j]]);
          for (uint8_t m : batch[order[j]].loss_mask) part_tokens += m;
        }
        CA_CHECK(part_tokens > 0,
                 "{} update: mini-batch {} of epoch {} holds no policy tokens (loss_mask 1); use fewer "
                 "{}mini_batches or drop samples without policy tokens",
                 label(use), k, epoch, key);
        plan.push_back(std::move(part));
      }
    }
    return plan;
  }

  // One optimizer step per mini-batch of `plan` on the parameters that require grad; returns the
  // mean of the steps' statistics. objective_of computes a mini-batch's loss and back-propagates
  // it (the separate critic's part after the actor's, see objective()).
  template <class ObjectiveOf>
  PpoStats steps(const std::vector<std::vector<const PpoSample*>>& plan, Use use, ObjectiveOf&& objective_of) {
    torch::AutoGradMode grad(true);
    const double max_norm = options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
    PpoStats mean;
    double first = 0, last = 0;
    int64_t forwards = 0;
    for (const auto& part : plan) {
      zero_grads();
      replicas_->set_shares(part);
      // Micro-batches: one forward and backward each, the gradients accumulated; each forward's
      // aggregation scaled by its share of the mini-batch, so the step is the mini-batch's.
      PpoStats stats;
      for (const auto& micro : micro_batches(part)) {
        replicas_->set_forward(micro);
        PpoStats s = objective_of(pad(micro, model_->model()->device(), use));
        s.clip_fraction *= replicas_->token_share();
        s.value_clip_fraction *= replicas_->token_share();
        add(stats, s, 1.0);
        ++forwards;
      }
      if (replicas_->distributed()) {
        replicas_->reduce_gradients();
        stats = replicas_->reduce_stats(stats);
      }
      if (use != Use::kValue) stats.grad_norm_actor = torch::nn::utils::clip_grad_norm_(actor_params_, max_norm);
      if (use != Use::kSft) stats.grad_norm_critic = torch::nn::utils::clip_grad_norm_(critic_params_, max_norm);
      optimizer_->step();
      if (replicas_->sharded()) replicas_->share_stepped_params();
      add(mean, stats, 1.0 / static_cast<double>(plan.size()));
      if (&part == &plan.front()) first = stats.loss;
      last = stats.loss;
    }
    zero_grads();
    mean.first_loss = first;
    mean.last_loss = last;
    mean.forwards = forwards;
    return mean;
  }

  // The part in runs of consecutive samples whose padded size (samples x the longest) stays
  // within micro_batch_tokens (a longer sample alone); runs without policy tokens add nothing to
  // the loss and are left out. The whole part when micro_batch_tokens is 0.
  std::vector<std::vector<const PpoSample*>> micro_batches(const std::vector<const PpoSample*>& part) const {
    const int64_t budget = options_.micro_batch_tokens;
    if (budget <= 0) return {part};
    std::vector<std::vector<const PpoSample*>> out;
    std::vector<const PpoSample*> run;
    size_t longest = 0;
    bool has_tokens = false;
    const auto close = [&] {
      if (has_tokens) out.push_back(run);
      run.clear();
      longest = 0;
      has_tokens = false;
    };
    for (const PpoSample* s : part) {
      const size_t l = std::max(longest, s->tokens.size());
      if (!run.empty() && static_cast<int64_t>((run.size() + 1) * l) > budget) close();
      run.push_back(s);
      longest = std::max(longest, s->tokens.size());
      has_tokens = has_tokens || std::any_of(s->loss_mask.begin(), s->loss_mask.end(), [](uint8_t m) { return m != 0; });
    }
    close();
    return out;
  }

  // Every parameter's gradient dropped (the optimizer's zero_grad covers only what it steps).
  void zero_grads() {
    for_each_param([](size_t, torch::Tensor p) {  // a handle: the gradient is the parameter's own
      if (p.grad().defined()) p.mutable_grad().reset();
    });
  }

  static PpoStats finish(PpoStats stats, int64_t tokens, std::chrono::steady_clock::time_point start) {
    stats.tokens = tokens;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }

  // Stage 2: the mean NLL of the policy tokens, token_mean whatever loss_aggregation says.
  PpoStats sft_objective(const Padded& b) {
    TokenStats s = token_stats(*model_->model(), b.ids, stats_options());
    auto loss = replicas_->agg(-s.logprobs, b.mask, Aggregation::kTokenMean);
    PpoStats stats;
    stats.loss = loss.item<double>();
    stats.entropy = replicas_->agg(s.entropy.detach(), b.mask, Aggregation::kTokenMean).item<double>();
    loss.backward();
    return stats;
  }

  // Stage 3: the clipped value loss alone. The separate critic runs without the actor.
  PpoStats value_objective(const Padded& b) {
    auto values =
        separate() ? critic_values(*critic_, b.ids) : token_stats(*model_->model(), b.ids, stats_options()).values;
    torch::Tensor error, clipped_error;
    auto loss = value_loss(values, b, error, clipped_error);
    PpoStats stats;
    stats.loss = stats.value_loss = loss.item<double>();
    stats.value_clip_fraction = token_fraction(clipped_error > error, b.mask, b.tokens);
    loss.backward();
    return stats;
  }

  // The clipped value loss, aggregated per loss_aggregation; sets the two per-token errors.
  torch::Tensor value_loss(const torch::Tensor& v, const Padded& b, torch::Tensor& error, torch::Tensor& clipped_error) {
    auto v_clipped = b.old_values + (v - b.old_values).clamp(-options_.value_clip, options_.value_clip);
    error = (v - b.returns).square();
    clipped_error = (v_clipped - b.returns).square();
    return replicas_->agg(0.5 * torch::maximum(error, clipped_error), b.mask, aggregation_);
  }

  // The PPO objective of a mini-batch; with `backward` its gradient is accumulated as well. The
  // shared critic's value loss joins the actor's terms in one backward (they share the trunk).
  // A separate critic's graph is disjoint from the actor's: the actor's terms are back-propagated
  // (freeing its activations) before the critic's forward, and the gradients are the same as
  // those of the sum.
  PpoStats objective(const Padded& b, bool backward) {
    CausalLM& model = model_->model();
    TokenStats s = token_stats(*model, b.ids, policy_stats_options());
    const auto& m = b.mask;
    auto zeros = torch::zeros_like(s.logprobs);

    // Clipped surrogate; the log-ratio is zeroed off the mask so padding cannot overflow exp.
    auto ratio = torch::where(m, s.logprobs - b.old_logprobs, zeros).exp();
    auto unclipped = -b.advantages * ratio;
    auto clipped = -b.advantages * ratio.clamp(1.0 - options_.clip_low, 1.0 + options_.clip_high);
    auto policy_loss = replicas_->agg(torch::maximum(unclipped, clipped), m, aggregation_);

    torch::Tensor value, error, clipped_error;
    if (!separate()) value = value_loss(s.values, b, error, clipped_error);

    PpoStats stats;
    torch::Tensor loss = separate() ? policy_loss : policy_loss + value;
    if (options_.entropy_coef != 0) loss = loss - options_.entropy_coef * replicas_->agg(s.entropy, m, aggregation_);
    if (b.ref_logprobs.defined()) {
      auto d = torch::where(m, s.logprobs - b.ref_logprobs, zeros);
      torch::Tensor kl;
      switch (kl_) {
        case KlEstimator::kK1: kl = d; break;
        case KlEstimator::kK2: kl = 0.5 * d.square(); break;
        case KlEstimator::kK3: kl = torch::expm1(-d) + d; break;
      }
      if (options_.kl_mode == "loss" && options_.kl_coef != 0)
        loss = loss + options_.kl_coef * replicas_->agg(kl, m, aggregation_);
      stats.kl = replicas_->agg(kl.detach(), m, Aggregation::kTokenMean).item<double>();
    }
    stats.loss = loss.item<double>();
    stats.policy_loss = policy_loss.item<double>();
    stats.entropy = replicas_->agg(s.entropy.detach(), m, Aggregation::kTokenMean).item<double>();
    stats.clip_fraction = token_fraction(clipped > unclipped, m, b.tokens);
    if (backward) loss.backward();
    if (separate()) {
      value = value_loss(critic_values(*critic_, b.ids), b, error, clipped_error);
      stats.loss += value.item<double>();
      if (backward) value.backward();
    }
    stats.value_loss = value.item<double>();
    stats.value_clip_fraction = token_fraction(clipped_error > error, m, b.tokens);
    return stats;
  }

  static void add(PpoStats& sum, const PpoStats& s, double weight) {
    sum.loss += weight * s.loss;
    sum.policy_loss += weight * s.policy_loss;
    sum.value_loss += weight * s.value_loss;
    sum.entropy += weight * s.entropy;
    sum.kl += weight * s.kl;
    sum.clip_fraction += weight * s.clip_fraction;
    sum.value_clip_fraction += weight * s.value_clip_fraction;
    sum.grad_norm_actor += weight * s.grad_norm_actor;
    sum.grad_norm_critic += weight * s.grad_norm_critic;
  }

  std::unique_ptr<TorchLanguageModel> model_;
  CausalLM critic_{nullptr};  // the separate critic; empty with the shared one
  PpoOptions options_;
  Aggregation aggregation_;
  KlEstimator kl_;
  std::mt19937_64 rng_;
  std::vector<NamedGroup> groups_;  // [kActorGroup], [kCriticGroup], by parameter name (save_state)
  std::vector<torch::Tensor> actor_params_, critic_params_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<Replicas> replicas_;            // a world of one unless options.distributed says otherwise
  std::unique_ptr<TorchLanguageModel> snapshot_;  // snapshot_policy(), made at its first call
};

}  // namespace

std::unique_ptr<lm::PpoLearner> make_ppo_learner(std::unique_ptr<TorchLanguageModel> model, const PpoOptions& options) {
  return translate_errors("create_ppo_learner", [&]() -> std::unique_ptr<lm::PpoLearner> {
    check_options(options);
    CausalLM critic{nullptr};
    switch (critic_kind(options.critic)) {
      case CriticKind::kShared:
        break;
      case CriticKind::kFromActor:
        critic = critic_from_actor(*model->model(), model->options());
        break;
      case CriticKind::kPath:
        critic = critic_from_path(options.critic, model->options(), model->config());
        break;
    }
    return std::make_unique<TorchPpoLearner>(std::move(model), std::move(critic), options);
  });
}

}  // namespace cuda_agent::lm
