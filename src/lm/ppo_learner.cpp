#include "torch_fmt.h"  // first: see there
#include "ppo_learner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "generation.h"
#include "training.h"

namespace cuda_agent::lm {
namespace {

using policy::PpoOptions;
using policy::PpoSample;
using policy::PpoStats;
using policy::StageUpdateOptions;

// Which update a batch feeds: it decides the per-position vectors a sample must carry.
enum class Use { kPpo, kSft, kValue };

const char* label(Use use) {
  switch (use) {
    case Use::kPpo: return "PPO";
    case Use::kSft: return "SFT";
    case Use::kValue: return "value";
  }
  return "?";
}

using Aggregation = policy::LossAggregation;
using policy::KlEstimator;

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
  CA_CHECK(o.epochs >= 1, "ppo.epochs = {}: must be >= 1", o.epochs);
  CA_CHECK(o.weight_decay >= 0, "ppo weight_decay = {}: must be >= 0", o.weight_decay);
  policy::parse_loss_aggregation(o.loss_aggregation);
  policy::parse_kl_estimator(o.kl_estimator);
}

void check_stage(const StageUpdateOptions& o, Use use) {
  CA_CHECK(std::isfinite(o.lr) && o.lr >= 0, "{} update: lr = {}: must be >= 0", label(use), o.lr);
  CA_CHECK(o.epochs >= 1, "{} update: epochs = {}: must be >= 1", label(use), o.epochs);
  CA_CHECK(o.mini_batches >= 1, "{} update: mini_batches = {}: must be >= 1", label(use), o.mini_batches);
}

void check_sample(const PpoSample& s, size_t i, const policy::ModelConfig& config, Use use) {
  const char* name = label(use);
  CA_CHECK(!s.tokens.empty(), "{} sample {} has no tokens", name, i);
  check_tokens(config, s.tokens, fmt::format("{} sample {}", name, i));
  const size_t n = s.tokens.size();
  auto same_length = [&](size_t got, const char* what) {
    CA_CHECK(got == n, "{} sample {}: {} has {} entries for {} tokens (one per position)", name, i, what, got, n);
  };
  same_length(s.loss_mask.size(), "loss_mask");
  if (use == Use::kPpo) {
    same_length(s.old_logprobs.size(), "old_logprobs");
    same_length(s.advantages.size(), "advantages");
    if (!s.ref_logprobs.empty()) same_length(s.ref_logprobs.size(), "ref_logprobs");
  }
  if (use != Use::kSft) {
    same_length(s.returns.size(), "returns");
    same_length(s.old_values.size(), "old_values");
  }
  for (size_t t = 0; t < n; ++t)
    CA_CHECK(s.loss_mask[t] <= 1, "{} sample {}: loss_mask[{}] = {}: a mask holds only 0 and 1", name, i, t,
             s.loss_mask[t]);
  CA_CHECK(s.loss_mask[0] == 0, "{} sample {}: loss_mask[0] is 1, but position 0 has no prediction; mask it out",
           name, i);
}

// One mini-batch, right-padded to [B, T] on the model's device; padding has mask false. Only the
// vectors its Use reads are filled; the others stay undefined.
struct Padded {
  torch::Tensor ids, mask, old_logprobs, advantages, returns, old_values, ref_logprobs;  // ref: undefined if absent
  int64_t tokens = 0;
};

Padded pad(const std::vector<const PpoSample*>& samples, const torch::Device& device, Use use) {
  const int64_t batch = static_cast<int64_t>(samples.size());
  int64_t len = 0;
  for (const auto* s : samples) len = std::max<int64_t>(len, static_cast<int64_t>(s->tokens.size()));
  const bool policy = use == Use::kPpo, values = use != Use::kSft;
  const bool ref = policy && !samples.front()->ref_logprobs.empty();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  Padded p;
  p.ids = torch::zeros({batch, len}, torch::kInt64);
  p.mask = torch::zeros({batch, len}, torch::kBool);
  if (policy) p.old_logprobs = torch::zeros({batch, len}, f32);
  if (policy) p.advantages = torch::zeros({batch, len}, f32);
  if (values) p.returns = torch::zeros({batch, len}, f32);
  if (values) p.old_values = torch::zeros({batch, len}, f32);
  if (ref) p.ref_logprobs = torch::zeros({batch, len}, f32);
  for (int64_t i = 0; i < batch; ++i) {
    const PpoSample& s = *samples[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    auto row = [&](torch::Tensor& dst, const auto& src, torch::ScalarType type) {
      if (!dst.defined()) return;
      dst[i].narrow(0, 0, n).copy_(torch::from_blob(const_cast<void*>(static_cast<const void*>(src.data())), {n}, type));
    };
    row(p.ids, s.tokens, torch::kInt64);
    row(p.mask, s.loss_mask, torch::kUInt8);
    row(p.old_logprobs, s.old_logprobs, torch::kFloat32);
    row(p.advantages, s.advantages, torch::kFloat32);
    row(p.returns, s.returns, torch::kFloat32);
    row(p.old_values, s.old_values, torch::kFloat32);
    row(p.ref_logprobs, s.ref_logprobs, torch::kFloat32);
  }
  p.tokens = p.mask.sum().item<int64_t>();
  for (auto* t : {&p.ids, &p.mask, &p.old_logprobs, &p.advantages, &p.returns, &p.old_values, &p.ref_logprobs})
    if (t->defined()) *t = t->to(device);
  return p;
}

// rl::aggregate_loss on tensors: masked positions are selected away (they may hold inf or NaN),
// sequences without policy tokens do not count in the seq_ modes.
torch::Tensor aggregate(const torch::Tensor& per_token, const torch::Tensor& mask, Aggregation mode) {
  auto sums = torch::where(mask, per_token, torch::zeros_like(per_token)).sum(1);
  auto counts = mask.sum(1).to(torch::kFloat32);
  if (mode == Aggregation::kTokenMean) return sums.sum() / counts.sum();
  auto sequences = (counts > 0).sum().to(torch::kFloat32);
  if (mode == Aggregation::kSeqMeanTokenSum) return sums.sum() / sequences;
  return (sums / counts.clamp_min(1)).sum() / sequences;
}

// The share of policy tokens where `flag` holds (the reference's clip fractions).
double token_fraction(const torch::Tensor& flag, const torch::Tensor& mask, int64_t tokens) {
  return (flag & mask).sum().item<double>() / static_cast<double>(tokens);
}

struct Objective {
  torch::Tensor loss;  // scalar, with autograd when grad mode is on
  PpoStats stats;      // losses and fractions; no grad norms
};

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

class TorchPpoLearner final : public policy::PpoLearner {
 public:
  TorchPpoLearner(std::unique_ptr<TorchLanguageModel> model, const PpoOptions& options)
      : model_(std::move(model)),
        options_(options),
        aggregation_(policy::parse_loss_aggregation(options.loss_aggregation)),
        kl_(policy::parse_kl_estimator(options.kl_estimator)),
        rng_(options.seed) {
    CausalLM& m = model_->model();
    CA_CHECK(m->has_value_head(), "the PPO learner needs a model with a value head (LmOptions::value_head = true)");
    for (const auto& p : m->named_parameters(true))
      (p.key().starts_with("value_head.") ? critic_params_ : actor_params_).push_back(p.value());
    auto group = [&](std::vector<torch::Tensor> params, double lr) {
      auto o = std::make_unique<torch::optim::AdamWOptions>(lr);
      o->weight_decay(options.weight_decay);
      return torch::optim::OptimizerParamGroup(std::move(params), std::move(o));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.push_back(group(actor_params_, options.actor_lr));
    groups.push_back(group(critic_params_, options.critic_lr));
    optimizer_ = std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                       torch::optim::AdamWOptions(options.actor_lr)
                                                           .weight_decay(options.weight_decay));
  }

  PpoStats update(const std::vector<PpoSample>& batch) override {
    return translate_errors("PPO update", [&] {
      const auto start = std::chrono::steady_clock::now();
      const int64_t tokens = check_batch(batch, Use::kPpo);
      const auto plan = draw_plan(batch, options_.epochs, options_.mini_batches, Use::kPpo, "ppo.");
      PpoStats stats = steps(plan, Use::kPpo, [&](const Padded& b) { return objective(b); });
      return finish(stats, tokens, start);
    });
  }

  PpoStats sft_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return translate_errors("SFT update", [&] {
      const auto start = std::chrono::steady_clock::now();
      check_stage(stage, Use::kSft);
      const int64_t tokens = check_batch(batch, Use::kSft);
      const auto plan = draw_plan(batch, stage.epochs, stage.mini_batches, Use::kSft, "");
      Frozen critic(critic_params_);
      GroupLr lr(*optimizer_, kActorGroup, stage.lr);
      PpoStats stats = steps(plan, Use::kSft, [&](const Padded& b) { return sft_objective(b); });
      return finish(stats, tokens, start);
    });
  }

  PpoStats value_update(const std::vector<PpoSample>& batch, const StageUpdateOptions& stage) override {
    return translate_errors("value update", [&] {
      const auto start = std::chrono::steady_clock::now();
      check_stage(stage, Use::kValue);
      const int64_t tokens = check_batch(batch, Use::kValue);
      const auto plan = draw_plan(batch, stage.epochs, stage.mini_batches, Use::kValue, "");
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
      std::vector<const PpoSample*> all;
      for (const auto& s : batch) all.push_back(&s);
      return finish(objective(pad(all, model_->model()->device(), Use::kPpo)).stats, tokens, start);
    });
  }

  policy::LanguageModel& policy() override { return *model_; }
  const PpoOptions& options() const override { return options_; }

 private:
  static constexpr size_t kActorGroup = 0, kCriticGroup = 1;  // the optimizer's parameter groups

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
  // mean of the steps' statistics.
  template <class ObjectiveOf>
  PpoStats steps(const std::vector<std::vector<const PpoSample*>>& plan, Use use, ObjectiveOf&& objective_of) {
    torch::AutoGradMode grad(true);
    const double max_norm = options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
    PpoStats mean;
    for (const auto& part : plan) {
      optimizer_->zero_grad(/*set_to_none=*/true);
      Objective o = objective_of(pad(part, model_->model()->device(), use));
      o.loss.backward();
      if (use != Use::kValue) o.stats.grad_norm_actor = torch::nn::utils::clip_grad_norm_(actor_params_, max_norm);
      if (use != Use::kSft) o.stats.grad_norm_critic = torch::nn::utils::clip_grad_norm_(critic_params_, max_norm);
      optimizer_->step();
      add(mean, o.stats, 1.0 / static_cast<double>(plan.size()));
    }
    optimizer_->zero_grad(/*set_to_none=*/true);
    return mean;
  }

  static PpoStats finish(PpoStats stats, int64_t tokens, std::chrono::steady_clock::time_point start) {
    stats.tokens = tokens;
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }

  // Stage 2: the mean NLL of the policy tokens, token_mean whatever loss_aggregation says.
  Objective sft_objective(const Padded& b) {
    TokenStats s = token_stats(*model_->model(), b.ids);
    Objective o;
    o.loss = aggregate(-s.logprobs, b.mask, Aggregation::kTokenMean);
    o.stats.loss = o.loss.item<double>();
    o.stats.entropy = aggregate(s.entropy.detach(), b.mask, Aggregation::kTokenMean).item<double>();
    return o;
  }

  // Stage 3: the clipped value loss alone.
  Objective value_objective(const Padded& b) {
    TokenStats s = token_stats(*model_->model(), b.ids);
    torch::Tensor error, clipped_error;
    Objective o;
    o.loss = value_loss(s.values, b, error, clipped_error);
    o.stats.loss = o.stats.value_loss = o.loss.item<double>();
    o.stats.value_clip_fraction = token_fraction(clipped_error > error, b.mask, b.tokens);
    return o;
  }

  // The clipped value loss, aggregated per loss_aggregation; sets the two per-token errors.
  torch::Tensor value_loss(const torch::Tensor& v, const Padded& b, torch::Tensor& error, torch::Tensor& clipped_error) {
    auto v_clipped = b.old_values + (v - b.old_values).clamp(-options_.value_clip, options_.value_clip);
    error = (v - b.returns).square();
    clipped_error = (v_clipped - b.returns).square();
    return aggregate(0.5 * torch::maximum(error, clipped_error), b.mask, aggregation_);
  }

  Objective objective(const Padded& b) {
    CausalLM& model = model_->model();
    TokenStats s = token_stats(*model, b.ids);
    const auto& m = b.mask;
    auto zeros = torch::zeros_like(s.logprobs);

    // Clipped surrogate; the log-ratio is zeroed off the mask so padding cannot overflow exp.
    auto ratio = torch::where(m, s.logprobs - b.old_logprobs, zeros).exp();
    auto unclipped = -b.advantages * ratio;
    auto clipped = -b.advantages * ratio.clamp(1.0 - options_.clip_low, 1.0 + options_.clip_high);
    auto policy_loss = aggregate(torch::maximum(unclipped, clipped), m, aggregation_);

    torch::Tensor error, clipped_error;
    auto value = value_loss(s.values, b, error, clipped_error);

    Objective o;
    o.loss = policy_loss + value;
    if (options_.entropy_coef != 0) o.loss = o.loss - options_.entropy_coef * aggregate(s.entropy, m, aggregation_);
    if (b.ref_logprobs.defined()) {
      auto d = torch::where(m, s.logprobs - b.ref_logprobs, zeros);
      torch::Tensor kl;
      switch (kl_) {
        case KlEstimator::kK1: kl = d; break;
        case KlEstimator::kK2: kl = 0.5 * d.square(); break;
        case KlEstimator::kK3: kl = torch::expm1(-d) + d; break;
      }
      if (options_.kl_mode == "loss" && options_.kl_coef != 0)
        o.loss = o.loss + options_.kl_coef * aggregate(kl, m, aggregation_);
      o.stats.kl = aggregate(kl.detach(), m, Aggregation::kTokenMean).item<double>();
    }
    o.stats.loss = o.loss.item<double>();
    o.stats.policy_loss = policy_loss.item<double>();
    o.stats.value_loss = value.item<double>();
    o.stats.entropy = aggregate(s.entropy.detach(), m, Aggregation::kTokenMean).item<double>();
    o.stats.clip_fraction = token_fraction(clipped > unclipped, m, b.tokens);
    o.stats.value_clip_fraction = token_fraction(clipped_error > error, m, b.tokens);
    return o;
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
  PpoOptions options_;
  Aggregation aggregation_;
  KlEstimator kl_;
  std::mt19937_64 rng_;
  std::vector<torch::Tensor> actor_params_, critic_params_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace

std::unique_ptr<policy::PpoLearner> make_ppo_learner(std::unique_ptr<TorchLanguageModel> model,
                                                     const PpoOptions& options) {
  return translate_errors("create_ppo_learner", [&]() -> std::unique_ptr<policy::PpoLearner> {
    check_options(options);
    return std::make_unique<TorchPpoLearner>(std::move(model), options);
  });
}

}  // namespace cuda_agent::lm
