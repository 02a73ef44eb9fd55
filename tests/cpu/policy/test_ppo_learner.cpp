// The PPO learner (libtorch, through the module) on the CPU with tiny random models: its losses
// against the torch-free reference (src/rl/advantages.cpp) in every aggregation mode, what one
// optimizer step does (lr 0: nothing; lr > 0: a lower surrogate), determinism, bad input, a toy
// environment in which PPO must raise the reward, and the two earlier stages' updates on the same
// learner (SFT of the actor, value pretraining with the actor frozen).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/advantages.h"
#include "cuda_agent/rl/train_config.h"
#include "lm_test_util.h"
#include "ppo_test_util.h"

namespace cuda_agent::testing {
namespace {

using lm::PpoLearner;
using lm::PpoOptions;
using lm::PpoSample;
using lm::PpoStats;

double tolerance(double x) { return 2e-5 * std::max(1.0, std::fabs(x)); }

class PpoLossModes : public ::testing::TestWithParam<std::string> {};

TEST_P(PpoLossModes, LossesEqualTheTorchFreeReference) {
  PpoOptions ppo;
  ppo.loss_aggregation = GetParam();
  ppo.entropy_coef = 0.01;
  ppo.kl_coef = 0.1;
  ppo.kl_mode = "loss";
  ppo.kl_estimator = "k3";
  ppo.actor_lr = ppo.critic_lr = 0;
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  const auto batch = samples_around(*learner, b, 5);
  const auto now = learner->policy().forward_for_training(b.tokens, b.masks);

  rl::TokenBatch logp, old_logp, adv, ret, values, old_values, entropy, kl, masks = as_float(b.masks);
  for (size_t i = 0; i < batch.size(); ++i) {
    logp.push_back(now[i].logprobs);
    values.push_back(now[i].values);
    entropy.push_back(now[i].entropy);
    old_logp.push_back(batch[i].old_logprobs);
    adv.push_back(batch[i].advantages);
    ret.push_back(batch[i].returns);
    old_values.push_back(batch[i].old_values);
    std::vector<float> k;
    for (size_t t = 0; t < logp[i].size(); ++t)
      k.push_back(static_cast<float>(rl::kl_estimate(logp[i][t], batch[i].ref_logprobs[t], rl::KlEstimator::kK3)));
    kl.push_back(k);
  }
  const auto mode = rl::parse_loss_aggregation(GetParam());
  const auto policy_ref = rl::ppo_policy_loss(logp, old_logp, adv, masks, ppo.clip_low, ppo.clip_high, mode);
  const auto value_ref = rl::ppo_value_loss(values, old_values, ret, masks, ppo.value_clip, mode);
  const double entropy_mean = rl::aggregate_loss(entropy, masks, rl::LossAggregation::kTokenMean);
  const double kl_mean = rl::aggregate_loss(kl, masks, rl::LossAggregation::kTokenMean);
  const double total_ref = policy_ref.loss + value_ref.loss - ppo.entropy_coef * rl::aggregate_loss(entropy, masks, mode) +
                           ppo.kl_coef * rl::aggregate_loss(kl, masks, mode);

  const PpoStats s = learner->evaluate(batch);
  std::printf("  %-20s policy %.6f (ref %.6f)  value %.6f (ref %.6f)  clip %.3f  vclip %.3f\n", GetParam().c_str(),
              s.policy_loss, policy_ref.loss, s.value_loss, value_ref.loss, s.clip_fraction, s.value_clip_fraction);
  EXPECT_NEAR(s.policy_loss, policy_ref.loss, tolerance(policy_ref.loss));
  EXPECT_NEAR(s.value_loss, value_ref.loss, tolerance(value_ref.loss));
  EXPECT_NEAR(s.entropy, entropy_mean, tolerance(entropy_mean));
  EXPECT_NEAR(s.kl, kl_mean, tolerance(kl_mean));
  EXPECT_NEAR(s.loss, total_ref, tolerance(total_ref));
  EXPECT_DOUBLE_EQ(s.clip_fraction, policy_ref.clip_fraction);
  EXPECT_DOUBLE_EQ(s.value_clip_fraction, value_ref.clip_fraction);
  // The offsets put ratios outside both clip bounds and values outside value_clip.
  EXPECT_GT(s.clip_fraction, 0.1);
  EXPECT_LT(s.clip_fraction, 0.9);
  EXPECT_GT(s.value_clip_fraction, 0.1);
  int64_t tokens = 0;
  for (const auto& m : b.masks)
    for (uint8_t x : m) tokens += x;
  EXPECT_EQ(s.tokens, tokens);

  // The training path (autograd, one mini-batch) computes the same objective before its step.
  const PpoStats u = learner->update(batch);
  EXPECT_NEAR(u.loss, s.loss, tolerance(s.loss));
  EXPECT_NEAR(u.policy_loss, s.policy_loss, tolerance(s.policy_loss));
  EXPECT_NEAR(u.value_loss, s.value_loss, tolerance(s.value_loss));
  EXPECT_DOUBLE_EQ(u.clip_fraction, s.clip_fraction);
  EXPECT_GT(u.grad_norm_actor, 0);
  EXPECT_GT(u.grad_norm_critic, 0);
}

INSTANTIATE_TEST_SUITE_P(Aggregation, PpoLossModes,
                         ::testing::Values("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"),
                         [](const auto& info) { return info.param; });

TEST(PpoLearner, ZeroLearningRateChangesNoWeight) {
  PpoOptions ppo;
  ppo.actor_lr = ppo.critic_lr = 0;
  ppo.weight_decay = 0.1;  // decoupled decay scales with lr: still nothing
  ppo.mini_batches = 2;
  ppo.epochs = 2;
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  const auto batch = samples_around(*learner, b, 6);
  const auto probe = test_tokens(16, 64, 99);
  const auto logits_before = learner->policy().logits(probe);
  const auto values_before = learner->policy().forward_for_training({probe}, {})[0].values;
  const PpoStats s = learner->update(batch);
  EXPECT_GT(s.grad_norm_actor, 0);  // there were gradients, the step just did not move
  EXPECT_EQ(learner->policy().logits(probe), logits_before);
  EXPECT_EQ(learner->policy().forward_for_training({probe}, {})[0].values, values_before);
}

TEST(PpoLearner, OneStepLowersTheSurrogateAndValueLoss) {
  PpoOptions ppo;
  ppo.actor_lr = 1e-3;
  ppo.critic_lr = 1e-2;
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  auto batch = samples_around(*learner, b, 7, /*logprob_offset=*/0);  // ratio 1: inside the clip range
  const PpoStats before = learner->evaluate(batch);
  EXPECT_EQ(before.clip_fraction, 0);
  const PpoStats step = learner->update(batch);
  const PpoStats after = learner->evaluate(batch);
  std::printf("  surrogate %.5f -> %.5f, value loss %.5f -> %.5f, grad norms %.3f / %.3f\n", before.policy_loss,
              after.policy_loss, before.value_loss, after.value_loss, step.grad_norm_actor, step.grad_norm_critic);
  EXPECT_LT(after.policy_loss, before.policy_loss - 1e-3);
  EXPECT_LT(after.value_loss, before.value_loss);
}

TEST(PpoLearner, SameSeedSameResult) {
  PpoOptions ppo;
  ppo.actor_lr = 1e-3;
  ppo.critic_lr = 1e-3;
  ppo.mini_batches = 2;
  ppo.epochs = 2;
  ppo.seed = 17;
  auto a = make_learner(ppo), c = make_learner(ppo);
  const Batch b = fixed_batch(64);
  const auto batch = samples_around(*a, b, 8);
  const PpoStats sa = a->update(batch), sc = c->update(batch);
  EXPECT_EQ(sa.loss, sc.loss);
  EXPECT_EQ(sa.grad_norm_actor, sc.grad_norm_actor);
  const auto probe = test_tokens(16, 64, 98);
  EXPECT_EQ(a->policy().logits(probe), c->policy().logits(probe));
}

// ppo.activation_checkpointing recomputes each layer in backward: the same statistics and the
// same weights after PPO and SFT steps, up to float rounding; and a snapshot of the actor
// (snapshot_policy) has the actor's weights when taken and keeps them through updates.
TEST(PpoLearner, ActivationCheckpointingStepsAsWithoutAndSnapshotsKeepTheirWeights) {
  PpoOptions ppo;
  ppo.actor_lr = 1e-3;
  ppo.critic_lr = 1e-3;
  ppo.mini_batches = 2;
  ppo.seed = 11;
  auto plain = make_learner(ppo);
  ppo.activation_checkpointing = true;
  auto recomputed = make_learner(ppo);
  const Batch b = fixed_batch(64);
  const auto batch = samples_around(*plain, b, 12);
  const auto probe = test_tokens(16, 64, 97);
  const auto before = recomputed->policy().logits(probe);
  lm::LanguageModel& snapshot = recomputed->snapshot_policy();
  EXPECT_EQ(snapshot.logits(probe), before);
  const PpoStats x = plain->update(batch), y = recomputed->update(batch);
  EXPECT_NEAR(x.loss, y.loss, 1e-5);
  EXPECT_NEAR(x.grad_norm_actor, y.grad_norm_actor, 1e-4 * std::max(1.0, x.grad_norm_actor));
  EXPECT_LT(max_abs_diff(plain->policy().logits(probe), recomputed->policy().logits(probe)), 1e-4);
  lm::StageUpdateOptions sft;
  sft.lr = 1e-3;
  const PpoStats sx = plain->sft_update(batch, sft), sy = recomputed->sft_update(batch, sft);
  EXPECT_NEAR(sx.loss, sy.loss, 1e-5);
  EXPECT_LT(max_abs_diff(plain->policy().logits(probe), recomputed->policy().logits(probe)), 1e-4);
  // The snapshot kept the weights it was taken with; taken again, it has the actor's new ones.
  EXPECT_EQ(snapshot.logits(probe), before);
  EXPECT_GT(max_abs_diff(recomputed->policy().logits(probe), before), 1e-4);
  EXPECT_EQ(&recomputed->snapshot_policy(), &snapshot);
  EXPECT_EQ(snapshot.logits(probe), recomputed->policy().logits(probe));
}

// Micro-batches accumulate the mini-batch's gradient: under each loss aggregation the step (its
// statistics, gradient norms and new weights) is the whole mini-batch's, and so is a value
// pretraining step with a separate critic.
TEST(PpoLearner, MicroBatchesStepAsTheWholeMiniBatch) {
  for (const char* aggregation : {"token_mean", "seq_mean_token_sum", "seq_mean_token_mean"}) {
    SCOPED_TRACE(aggregation);
    PpoOptions ppo;
    ppo.actor_lr = 1e-3;
    ppo.critic_lr = 1e-3;
    ppo.mini_batches = 2;
    ppo.seed = 11;
    ppo.loss_aggregation = aggregation;
    ppo.critic = std::string(aggregation) == "token_mean" ? "from_actor" : "shared";
    auto whole = make_learner(ppo);
    ppo.micro_batch_tokens = 20;  // most pairs of samples (9 to 14 tokens) already exceed it
    auto micro = make_learner(ppo);
    const Batch b = fixed_batch(64);
    const auto batch = samples_around(*whole, b, 12);
    const auto probe = test_tokens(16, 64, 97);
    const PpoStats x = whole->update(batch), y = micro->update(batch);
    EXPECT_EQ(x.forwards, 2);
    EXPECT_GE(y.forwards, 3);  // the mini-batch of 3 samples in 2 runs at least
    for (auto [a, c] : {std::pair(x.loss, y.loss), std::pair(x.policy_loss, y.policy_loss),
                        std::pair(x.value_loss, y.value_loss), std::pair(x.entropy, y.entropy),
                        std::pair(x.clip_fraction, y.clip_fraction)})
      EXPECT_NEAR(a, c, 1e-5);
    EXPECT_NEAR(x.grad_norm_actor, y.grad_norm_actor, 1e-4 * std::max(1.0, x.grad_norm_actor));
    EXPECT_NEAR(x.grad_norm_critic, y.grad_norm_critic, 1e-4 * std::max(1.0, x.grad_norm_critic));
    EXPECT_LT(max_abs_diff(whole->policy().logits(probe), micro->policy().logits(probe)), 1e-4);
    lm::StageUpdateOptions stage;
    stage.lr = 1e-3;
    const PpoStats vx = whole->value_update(batch, stage), vy = micro->value_update(batch, stage);
    EXPECT_NEAR(vx.value_loss, vy.value_loss, 1e-5);
    EXPECT_NEAR(vx.grad_norm_critic, vy.grad_norm_critic, 1e-4 * std::max(1.0, vx.grad_norm_critic));
  }
  PpoOptions bad;
  bad.micro_batch_tokens = -1;
  EXPECT_NE(error_of([&] { make_learner(bad); }).find("ppo.micro_batch_tokens = -1"), std::string::npos);
  bad = PpoOptions{};
  bad.temperature = 0;
  EXPECT_NE(error_of([&] { make_learner(bad); }).find("temperature (rollout.temperature) = 0"), std::string::npos);
}

// The log-probs and entropies of softmax(logits / temperature), from the model's logits by hand.
void tempered_stats(PpoLearner& learner, const Batch& b, double temperature, rl::TokenBatch& logp,
                    rl::TokenBatch& entropy) {
  const int64_t vocab = learner.policy().config().vocab_size;
  for (const auto& tokens : b.tokens) {
    const std::vector<float> logits = learner.policy().logits(tokens);
    std::vector<float> lp(tokens.size(), 0.0f), ent(tokens.size(), 0.0f);
    for (size_t t = 1; t < tokens.size(); ++t) {
      const float* row = logits.data() + (t - 1) * vocab;
      double top = -1e30, sum = 0;
      for (int64_t v = 0; v < vocab; ++v) top = std::max(top, row[v] / temperature);
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] / temperature - top);
      const double log_z = top + std::log(sum);
      double h = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double l = row[v] / temperature - log_z;
        h -= std::exp(l) * l;
      }
      lp[t] = static_cast<float>(row[tokens[t]] / temperature - log_z);
      ent[t] = static_cast<float>(h);
    }
    logp.push_back(lp);
    entropy.push_back(ent);
  }
}

TEST(PpoLearner, AtARolloutTemperatureTheRatioIsTheTemperedPolicysAndStartsAtOne) {
  // The rollout sampled softmax(logits / 0.5); the samples carry the untempered policy's
  // log-probs, offset as a stale sampler's would be. The learner takes old and new log-probs of
  // the tempered policy from the weights at the update's start, so the ratio is 1 and nothing
  // clips before the first step.
  PpoOptions ppo;
  ppo.actor_lr = ppo.critic_lr = 0;
  ppo.temperature = 0.5;
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  const auto batch = samples_around(*learner, b, 5);

  rl::TokenBatch logp, entropy, adv, masks = as_float(b.masks);
  tempered_stats(*learner, b, ppo.temperature, logp, entropy);
  for (const auto& s : batch) adv.push_back(s.advantages);
  const auto mode = rl::parse_loss_aggregation(ppo.loss_aggregation);
  const auto policy_ref = rl::ppo_policy_loss(logp, logp, adv, masks, ppo.clip_low, ppo.clip_high, mode);
  const double entropy_ref = rl::aggregate_loss(entropy, masks, rl::LossAggregation::kTokenMean);

  const PpoStats s = learner->evaluate(batch);
  EXPECT_NEAR(s.policy_loss, policy_ref.loss, tolerance(policy_ref.loss));
  EXPECT_NEAR(s.entropy, entropy_ref, tolerance(entropy_ref));
  EXPECT_EQ(s.clip_fraction, 0);
  const PpoStats u = learner->update(batch);  // the same objective before its step
  EXPECT_NEAR(u.policy_loss, s.policy_loss, tolerance(s.policy_loss));
  EXPECT_EQ(u.clip_fraction, 0);
  // The lm_head statistics recomputed in backward use the temperature too: the same gradient.
  PpoOptions checkpointed = ppo;
  checkpointed.activation_checkpointing = true;
  const PpoStats c = make_learner(checkpointed)->update(batch);
  EXPECT_NEAR(c.policy_loss, u.policy_loss, tolerance(u.policy_loss));
  EXPECT_NEAR(c.grad_norm_actor, u.grad_norm_actor, 1e-4 * u.grad_norm_actor);
  EXPECT_GT(u.grad_norm_actor, 0);

  // At temperature 1 the recorded log-probs are the old ones: the offsets clip, and the entropy
  // is the untempered policy's (higher than at 0.5).
  PpoOptions plain_options = ppo;
  plain_options.temperature = 1;
  const PpoStats plain = make_learner(plain_options)->evaluate(batch);
  EXPECT_GT(plain.clip_fraction, 0.1);
  EXPECT_GT(plain.entropy, s.entropy);
}

TEST(PpoLearner, BadInputSaysWhatIsWrong) {
  auto learner = make_learner(PpoOptions{});
  const Batch b = fixed_batch(64);
  auto batch = samples_around(*learner, b, 9);
  auto expect_error = [&](std::vector<PpoSample> bad, const std::string& needle) {
    try {
      learner->update(bad);
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto short_returns = batch;
  short_returns[1].returns.pop_back();
  expect_error(short_returns, "returns has 13 entries for 14 tokens");
  auto first_masked = batch;
  first_masked[0].loss_mask[0] = 1;
  expect_error(first_masked, "position 0 has no prediction");
  auto no_ref = batch;
  no_ref[2].ref_logprobs.clear();
  expect_error(no_ref, "ref_logprobs");
  auto token = batch;
  token[0].tokens[4] = 64;
  expect_error(token, "outside the vocabulary");

  PpoOptions bad;
  bad.loss_aggregation = "sum";
  EXPECT_THROW(make_learner(bad), Error);
  PpoOptions many;
  many.mini_batches = 6;
  EXPECT_THROW(make_learner(many)->update(batch), Error);
  auto o = test_options();
  EXPECT_THROW(lm::create_random_ppo_learner(small_config(64), o, PpoOptions{}), Error);  // no value head
}

TEST(PpoLearner, OptionsFromTheTrainConfig) {
  const auto config = rl::train_config_defaults();
  const PpoOptions o = PpoOptions::from_config(config["ppo"]);
  EXPECT_EQ(o.actor_lr, config["ppo"]["actor_lr"].get<double>());
  EXPECT_EQ(o.critic_lr, config["ppo"]["critic_lr"].get<double>());
  EXPECT_EQ(o.mini_batches, config["ppo"]["mini_batches"].get<int>());
  EXPECT_EQ(o.kl_mode, config["ppo"]["kl"]["mode"].get<std::string>());
  EXPECT_EQ(o.loss_aggregation, config["ppo"]["loss_aggregation"].get<std::string>());
  auto changed = config["ppo"];
  changed["kl"]["coef"] = 0.05;
  changed["clip_high"] = 0.3;
  EXPECT_EQ(PpoOptions::from_config(changed).kl_coef, 0.05);
  EXPECT_EQ(PpoOptions::from_config(changed).clip_high, 0.3);
  changed["epochs"] = "two";
  EXPECT_THROW(PpoOptions::from_config(changed), Error);
}

// --- stages 2 and 3: sft_update and value_update ------------------------------------------------

// Token-mean NLL of the masked-in tokens under the model now (the reference for sft_update).
double assistant_nll(lm::LanguageModel& model, const Batch& b) {
  const auto now = model.forward_for_training(b.tokens, b.masks);
  double sum = 0;
  int64_t count = 0;
  for (size_t i = 0; i < b.tokens.size(); ++i)
    for (size_t t = 0; t < b.tokens[i].size(); ++t)
      if (b.masks[i][t]) {
        sum -= now[i].logprobs[t];
        ++count;
      }
  return sum / static_cast<double>(count);
}

// The saved weights, split as save_hf writes them: the trunk and lm_head (model.safetensors) and
// the value head (value_head.safetensors), as bytes.
struct SavedWeights {
  std::string actor, value_head;
};

SavedWeights saved_weights(lm::LanguageModel& model) {
  TempDir dir("ca-ppo-stages-");
  model.save_hf(dir.path());
  return {read_file(dir.path() / "model.safetensors"), read_file(dir.path() / "value_head.safetensors")};
}

// Only tokens and loss_mask: what an RFT batch carries.
std::vector<PpoSample> sft_samples(const Batch& b) {
  std::vector<PpoSample> out;
  for (size_t i = 0; i < b.tokens.size(); ++i) out.push_back({b.tokens[i], b.masks[i], {}, {}, {}, {}, {}});
  return out;
}

TEST(PpoStages, SftLowersTheAssistantNllAndLeavesTheValueHead) {
  PpoOptions ppo;
  ppo.weight_decay = 0.1;  // a step of the value head would show even with a zero gradient
  ppo.actor_lr = ppo.critic_lr = 1e-2;
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  // A PPO step first, so the value head has AdamW moments that would move it if it were stepped.
  learner->update(samples_around(*learner, b, 10));
  const auto batch = sft_samples(b);
  const auto probe = test_tokens(16, 64, 97);
  const auto logits_before = learner->policy().logits(probe);
  const SavedWeights before = saved_weights(learner->policy());
  const double nll_before = assistant_nll(learner->policy(), b);

  // lr 0: the reported loss is the reference NLL of the assistant tokens only, and nothing moves.
  const PpoStats zero = learner->sft_update(batch, {.lr = 0, .epochs = 1, .mini_batches = 1});
  EXPECT_NEAR(zero.loss, nll_before, tolerance(nll_before));
  EXPECT_GT(zero.grad_norm_actor, 0);
  EXPECT_EQ(zero.grad_norm_critic, 0);
  int64_t tokens = 0;
  for (const auto& m : b.masks)
    for (uint8_t x : m) tokens += x;
  EXPECT_EQ(zero.tokens, tokens);
  EXPECT_EQ(learner->policy().logits(probe), logits_before);

  const PpoStats s = learner->sft_update(batch, {.lr = 1e-2, .epochs = 10, .mini_batches = 2});
  const double nll_after = assistant_nll(learner->policy(), b);
  std::printf("  assistant-token NLL %.4f -> %.4f over 20 steps (mean step loss %.4f)\n", nll_before, nll_after,
              s.loss);
  EXPECT_LT(nll_after, 0.5 * nll_before);
  EXPECT_NE(learner->policy().logits(probe), logits_before);
  // The value head's parameters are untouched (its outputs move with the shared trunk).
  const SavedWeights after_sft = saved_weights(learner->policy());
  EXPECT_NE(after_sft.actor, before.actor);
  EXPECT_EQ(after_sft.value_head, before.value_head);
  EXPECT_EQ(s.value_loss, 0);
  EXPECT_EQ(s.grad_norm_critic, 0);

  // The PPO update still trains both groups afterwards (the freeze is undone).
  const PpoStats after = learner->update(samples_around(*learner, b, 11));
  EXPECT_GT(after.grad_norm_actor, 0);
  EXPECT_GT(after.grad_norm_critic, 0);
}

TEST(PpoStages, ValueUpdateMovesOnlyTheValueHead) {
  PpoOptions ppo;
  ppo.weight_decay = 0.1;
  ppo.actor_lr = ppo.critic_lr = 1e-2;
  ppo.value_clip = 100;  // the plain squared error, so the loss can fall all the way
  auto learner = make_learner(ppo);
  const Batch b = fixed_batch(64);
  learner->update(samples_around(*learner, b, 12));  // the actor has AdamW moments now
  // Value-pretraining samples: returns and old values, no log-probs or advantages.
  std::vector<PpoSample> batch;
  for (auto& s : samples_around(*learner, b, 13)) {
    s.old_logprobs.clear();
    s.advantages.clear();
    s.ref_logprobs.clear();
    batch.push_back(std::move(s));
  }
  auto reference = [&] { return reference_value_loss(*learner, b, batch); };
  const auto probe = test_tokens(16, 64, 96);
  const auto logits_before = learner->policy().logits(probe);
  const auto values_before = learner->policy().forward_for_training({probe}, {})[0].values;
  const SavedWeights before = saved_weights(learner->policy());
  const double loss_before = reference();

  const PpoStats first = learner->value_update(batch, {.lr = 0, .epochs = 1, .mini_batches = 1});
  EXPECT_NEAR(first.loss, loss_before, tolerance(loss_before));
  EXPECT_EQ(first.value_loss, first.loss);
  EXPECT_GT(first.grad_norm_critic, 0);
  EXPECT_EQ(first.grad_norm_actor, 0);

  const PpoStats s = learner->value_update(batch, {.lr = 1e-2, .epochs = 10, .mini_batches = 2});
  const double loss_after = reference();
  std::printf("  value loss %.4f -> %.4f over 20 steps\n", loss_before, loss_after);
  EXPECT_LT(loss_after, 0.7 * loss_before);
  EXPECT_EQ(learner->policy().logits(probe), logits_before);  // bit for bit: the actor is frozen
  EXPECT_NE(learner->policy().forward_for_training({probe}, {})[0].values, values_before);
  const SavedWeights after = saved_weights(learner->policy());
  EXPECT_EQ(after.actor, before.actor);  // trunk and lm_head (the shared critic's trunk too)
  EXPECT_NE(after.value_head, before.value_head);
  EXPECT_EQ(s.policy_loss, 0);
  EXPECT_EQ(s.grad_norm_actor, 0);
}

TEST(PpoStages, BadInputSaysWhatIsWrong) {
  auto learner = make_learner(PpoOptions{});
  const Batch b = fixed_batch(64);
  const auto sft = sft_samples(b);
  const lm::StageUpdateOptions stage{.lr = 1e-3};
  auto expect_error = [&](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { learner->sft_update({}, stage); }, "SFT: the batch is empty");
  expect_error([&] { learner->value_update({}, stage); }, "value: the batch is empty");
  auto prompts_only = sft;
  for (auto& s : prompts_only) std::fill(s.loss_mask.begin(), s.loss_mask.end(), 0);
  expect_error([&] { learner->sft_update(prompts_only, stage); }, "holds no policy tokens");
  auto first_masked = sft;
  first_masked[1].loss_mask[0] = 1;
  expect_error([&] { learner->sft_update(first_masked, stage); }, "SFT sample 1: loss_mask[0] is 1");
  auto short_mask = sft;
  short_mask[2].loss_mask.pop_back();
  expect_error([&] { learner->sft_update(short_mask, stage); }, "loss_mask has 11 entries for 12 tokens");
  // SFT samples lack the critic's targets.
  expect_error([&] { learner->value_update(sft, stage); }, "value sample 0: returns has 0 entries for 9 tokens");
  expect_error([&] { learner->sft_update(sft, {.lr = -1}); }, "lr = -1");
  expect_error([&] { learner->sft_update(sft, {.lr = 1e-3, .epochs = 0}); }, "epochs = 0");
  expect_error([&] { learner->sft_update(sft, {.lr = 1e-3, .epochs = 1, .mini_batches = 6}); },
               "5 samples cannot fill mini_batches = 6");
}

// A bandit over token sequences: after a fixed prompt the policy samples 8 tokens; the reward
// (on the last token) is the fraction equal to kTarget. At random initialisation that fraction is
// about 1/vocab; PPO with GAE (gamma 1, lambda 0.95) and whitened advantages must raise it.
TEST(PpoLearner, ToyEnvironmentRewardRises) {
  constexpr int64_t kVocab = 16, kTarget = 5, kNew = 8, kSequences = 16;
  constexpr int kSteps = 40;
  PpoOptions ppo;
  ppo.actor_lr = 1e-2;
  ppo.critic_lr = 1e-2;
  ppo.mini_batches = 2;
  ppo.epochs = 2;
  auto learner = make_learner(ppo, kVocab, /*seed=*/21, /*init_std=*/0.02);
  const std::vector<int64_t> prompt = {1, 2, 3, 4};
  std::vector<double> rewards;
  for (int step = 0; step < kSteps; ++step) {
    lm::SamplingOptions sampling;
    sampling.max_new_tokens = kNew;
    sampling.seed = 1000 + step;
    const auto gens = learner->policy().generate(std::vector<std::vector<int64_t>>(kSequences, prompt), sampling);
    Batch b;
    std::vector<float> seq_reward;
    for (const auto& g : gens) {
      auto tokens = prompt;
      tokens.insert(tokens.end(), g.tokens.begin(), g.tokens.end());
      std::vector<uint8_t> mask(tokens.size(), 1);
      std::fill(mask.begin(), mask.begin() + prompt.size(), 0);
      b.tokens.push_back(tokens);
      b.masks.push_back(mask);
      seq_reward.push_back(static_cast<float>(std::count(g.tokens.begin(), g.tokens.end(), kTarget)) /
                           static_cast<float>(g.tokens.size()));
    }
    double mean = 0;
    for (float r : seq_reward) mean += r / kSequences;
    rewards.push_back(mean);

    const auto old = learner->policy().forward_for_training(b.tokens, b.masks);
    const rl::TokenBatch masks = as_float(b.masks);
    rl::TokenBatch advantages, returns;
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      std::vector<float> r(b.tokens[i].size(), 0.0f);
      r.back() = seq_reward[i];
      auto gae = rl::compute_gae(r, old[i].values, masks[i], 1.0, 0.95);
      advantages.push_back(gae.advantages);
      returns.push_back(gae.returns);
    }
    rl::whiten_masked(advantages, masks);
    std::vector<PpoSample> batch;
    for (size_t i = 0; i < b.tokens.size(); ++i)
      batch.push_back({b.tokens[i], b.masks[i], old[i].logprobs, advantages[i], returns[i], old[i].values, {}});
    learner->update(batch);
  }
  std::string curve;
  for (double r : rewards) curve += fmt::format("{:.2f} ", r);
  std::printf("  mean reward per step: %s\n", curve.c_str());
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += rewards[i] / 5;
    last += rewards[kSteps - 1 - i] / 5;
  }
  std::printf("  first 5 steps %.3f, last 5 steps %.3f\n", first, last);
  EXPECT_LT(rewards[0], 0.25);  // near chance (1/16) at the start: the rise is learned
  EXPECT_GT(last, 2 * first);
  EXPECT_GT(last, 0.5);
}

}  // namespace
}  // namespace cuda_agent::testing
