// The PPO learner's separate critic and its checkpointable state, on the CPU with tiny random
// models: a from_actor critic starts as a copy of the actor's trunk (without an lm_head); the
// value loss trains the critic only and the policy loss the actor only (bit for bit); value
// pretraining moves the critic's trunk and not the actor; a critic from a path; save_state /
// load_state resume an update bit for bit (shared and separate critic) and refuse a state that
// does not fit the model, naming the file and the parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/policy/weights.h"
#include "cuda_agent/rl/advantages.h"
#include "lm_test_util.h"
#include "ppo_test_util.h"

namespace cuda_agent::testing {
namespace {

namespace fs = std::filesystem;
using lm::PpoLearner;
using lm::PpoOptions;
using lm::PpoSample;
using lm::PpoStats;
using Tensors = std::map<std::string, std::string>;  // tensor name -> stored bytes

Tensors tensors_of(const fs::path& file) {
  Tensors out;
  if (!fs::exists(file)) return out;
  auto f = policy::open_safetensors(file);
  for (const auto& t : f->tensors()) {
    auto bytes = f->raw_bytes(t.name);
    out[t.name] = std::string(bytes.begin(), bytes.end());
  }
  return out;
}

// Whether two sets of tensors are byte for byte the same; a failure names the tensors that differ
// (or are missing on one side) instead of printing bytes.
::testing::AssertionResult same(const Tensors& a, const Tensors& b) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : a)
    if (!b.count(name) || b.at(name) != bytes) names.push_back(name);
  for (const auto& [name, bytes] : b)
    if (!a.count(name)) names.push_back(name);
  if (names.empty()) return ::testing::AssertionSuccess() << "all " << a.size() << " tensors are equal";
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return ::testing::AssertionFailure() << names.size() << " of " << a.size() << " tensors differ: " << list;
}

// A learner's weights and state as bytes: the actor as the caller saves it, and what save_state
// writes (critic tensors empty with the shared critic, value_head empty with a separate one).
struct Snapshot {
  Tensors actor, value_head, critic, critic_head;
  std::string optimizer;
  nlohmann::json state;
};

Snapshot snapshot(PpoLearner& learner) {
  TempDir dir("ca-ppo-critic-");
  learner.policy().save_hf(dir.path() / "actor");
  learner.save_state(dir.path());
  Snapshot s;
  s.actor = tensors_of(dir.path() / "actor" / "model.safetensors");
  s.value_head = tensors_of(dir.path() / "actor" / "value_head.safetensors");
  s.critic = tensors_of(dir.path() / "critic" / "model.safetensors");
  s.critic_head = tensors_of(dir.path() / "critic" / "value_head.safetensors");
  s.optimizer = read_file(dir.path() / "optimizer.safetensors");
  s.state = nlohmann::json::parse(read_file(dir.path() / "learner_state.json"));
  return s;
}

// Options under which every update moves every trained weight: lr 1e-2, weight decay, two
// mini-batches and two epochs (so the seeded shuffle matters).
PpoOptions trained(const std::string& critic) {
  PpoOptions ppo;
  ppo.actor_lr = ppo.critic_lr = 1e-2;
  ppo.weight_decay = 0.1;
  ppo.mini_batches = 2;
  ppo.epochs = 2;
  ppo.seed = 17;
  ppo.critic = critic;
  return ppo;
}

// The value-pretraining form of a batch: no log-probs, advantages or reference.
std::vector<PpoSample> value_samples(std::vector<PpoSample> batch) {
  for (auto& s : batch) {
    s.old_logprobs.clear();
    s.advantages.clear();
    s.ref_logprobs.clear();
  }
  return batch;
}

void expect_error(const std::function<void()>& call, const std::vector<std::string>& needles) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning " << needles.front();
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(PpoCritic, FromActorCopiesTheActorsTrunkWithoutLmHead) {
  auto learner = make_learner(trained("from_actor"), 64, 3, kTestInitStd, /*tied=*/false);
  EXPECT_FALSE(learner->policy().options().value_head);  // the actor has no value head
  const Snapshot s = snapshot(*learner);
  EXPECT_TRUE(s.value_head.empty());
  ASSERT_TRUE(s.actor.count("lm_head.weight"));
  EXPECT_FALSE(s.critic.count("lm_head.weight"));  // the critic never needs logits
  EXPECT_EQ(s.critic.size(), s.actor.size() - 1);
  for (const auto& [name, bytes] : s.critic) {
    ASSERT_TRUE(s.actor.count(name)) << name;
    EXPECT_TRUE(bytes == s.actor.at(name)) << name;
  }
  EXPECT_EQ(s.critic_head.size(), 2u);  // value_head.weight and value_head.bias
  EXPECT_EQ(s.state["critic"], "separate");

  // forward(): the actor's log-probs and the critic's values; the actor alone has no values.
  const Batch b = fixed_batch(64);
  const auto actor = learner->policy().forward_for_training(b.tokens, b.masks);
  const auto both = learner->forward(b.tokens, b.masks);
  ASSERT_EQ(both.size(), b.tokens.size());
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    EXPECT_TRUE(actor[i].values.empty());
    EXPECT_EQ(both[i].logprobs, actor[i].logprobs);
    EXPECT_EQ(both[i].entropy, actor[i].entropy);
    ASSERT_EQ(both[i].values.size(), b.tokens[i].size());
    bool any = false;
    for (size_t t = 0; t < b.tokens[i].size(); ++t) {
      if (b.masks[i][t] == 0) {
        EXPECT_EQ(both[i].values[t], 0.0f) << i << " " << t;
      }
      any = any || both[i].values[t] != 0;
    }
    EXPECT_EQ(any, i != 3) << i;  // sequence 3 has no policy tokens
  }
}

// The critic's values against an independent path: its saved folder (a tied config, so a whole
// language model) loaded as a model with a value head, whose forward_for_training is the shared
// critic's code.
TEST(PpoCritic, ValuesEqualTheSavedCriticLoadedAsAModel) {
  auto learner = make_learner(trained("from_actor"));
  const Batch b = fixed_batch(64);
  learner->update(samples_around(*learner, b, 20));  // the critic is no longer the actor's copy
  TempDir dir("ca-ppo-critic-");
  learner->save_state(dir.path());
  auto reference = lm::load_language_model(dir.path() / "critic", learner_options());
  const auto want = reference->forward_for_training(b.tokens, b.masks);
  const auto got = learner->forward(b.tokens, b.masks);
  for (size_t i = 0; i < b.tokens.size(); ++i) EXPECT_LE(max_abs_diff(got[i].values, want[i].values), 1e-6) << i;
}

// Three learners alike step on batches that differ in the returns only, or in the advantages
// only: the actor's new weights do not depend on the value loss and the critic's not on the
// policy loss. With the shared critic the same comparison sees the coupling through the trunk.
TEST(PpoCritic, ValueLossTrainsOnlyTheCriticAndPolicyLossOnlyTheActor) {
  const Batch b = fixed_batch(64);
  auto run = [&](const std::string& critic, auto&& change) {
    auto learner = make_learner(trained(critic));
    auto batch = samples_around(*learner, b, 21);
    for (auto& s : batch) change(s);
    const PpoStats stats = learner->update(batch);
    EXPECT_GT(stats.grad_norm_actor, 0);
    EXPECT_GT(stats.grad_norm_critic, 0);
    return snapshot(*learner);
  };
  auto unchanged = [](PpoSample&) {};
  auto returns = [](PpoSample& s) {
    for (auto& r : s.returns) r = 2.0f - r;
  };
  auto advantages = [](PpoSample& s) {
    for (auto& a : s.advantages) a = -a;
  };
  const Snapshot before = snapshot(*make_learner(trained("from_actor")));
  const Snapshot base = run("from_actor", unchanged), other_returns = run("from_actor", returns),
                 other_advantages = run("from_actor", advantages);

  EXPECT_FALSE(same(base.actor, before.actor));
  EXPECT_FALSE(same(base.critic_head, before.critic_head));
  for (const auto& [name, bytes] : before.critic) EXPECT_TRUE(base.critic.at(name) != bytes) << name;  // trunk moved

  EXPECT_TRUE(same(other_returns.actor, base.actor));  // bit for bit
  EXPECT_FALSE(same(other_returns.critic, base.critic));
  EXPECT_FALSE(same(other_returns.critic_head, base.critic_head));

  EXPECT_TRUE(same(other_advantages.critic, base.critic));
  EXPECT_TRUE(same(other_advantages.critic_head, base.critic_head));
  EXPECT_FALSE(same(other_advantages.actor, base.actor));

  // Control: the shared critic's value loss reaches the actor's trunk.
  EXPECT_FALSE(same(run("shared", returns).actor, run("shared", unchanged).actor));
}

TEST(PpoCritic, ValueUpdateTrainsTheCriticTrunkAndFreezesTheActor) {
  auto learner = make_learner(trained("from_actor"));
  const Batch b = fixed_batch(64);
  learner->update(samples_around(*learner, b, 22));  // AdamW moments for both models
  const auto batch = value_samples(samples_around(*learner, b, 23));
  auto reference = [&] { return reference_value_loss(*learner, b, batch); };
  const auto probe = test_tokens(16, 64, 95);
  const auto logits_before = learner->policy().logits(probe);
  const Snapshot before = snapshot(*learner);
  const double loss_before = reference();

  const PpoStats s = learner->value_update(batch, {.lr = 1e-2, .epochs = 10, .mini_batches = 2});
  const double loss_after = reference();
  std::printf("  separate critic: value loss %.4f -> %.4f over 20 steps\n", loss_before, loss_after);
  EXPECT_LT(loss_after, 0.7 * loss_before);
  EXPECT_EQ(s.grad_norm_actor, 0);
  EXPECT_GT(s.grad_norm_critic, 0);
  const Snapshot after = snapshot(*learner);
  EXPECT_TRUE(same(after.actor, before.actor));  // bit for bit, with weight decay and moments
  EXPECT_EQ(learner->policy().logits(probe), logits_before);
  for (const auto& [name, bytes] : before.critic) EXPECT_TRUE(after.critic.at(name) != bytes) << name;
  EXPECT_FALSE(same(after.critic_head, before.critic_head));

  // Stage 2 the other way round: the actor moves, the critic keeps every weight.
  learner->sft_update(batch, {.lr = 1e-2, .epochs = 2, .mini_batches = 1});
  const Snapshot sft = snapshot(*learner);
  EXPECT_FALSE(same(sft.actor, after.actor));
  EXPECT_TRUE(same(sft.critic, after.critic));
  EXPECT_TRUE(same(sft.critic_head, after.critic_head));
}

TEST(PpoCritic, CriticFromAPath) {
  use_built_lm_module();
  TempDir dir("ca-ppo-critic-");
  const Batch b = fixed_batch(64);
  // An untied model without a value head (its lm_head.weight is ignored): the head is initialised
  // from the learner's seed, as load_language_model initialises it.
  auto plain_options = test_options("cpu", 77);
  lm::random_language_model(small_config(64, /*tied=*/false), plain_options)->save_hf(dir.path() / "plain");
  PpoOptions ppo = trained((dir.path() / "plain").string());
  auto learner = make_learner(ppo);
  const auto want =
      lm::load_language_model(dir.path() / "plain", learner_options())->forward_for_training(b.tokens, b.masks);
  auto got = learner->forward(b.tokens, b.masks);
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    EXPECT_LE(max_abs_diff(got[i].values, want[i].values), 1e-6) << i;
    EXPECT_TRUE(learner->policy().forward_for_training({b.tokens[i]}, {})[0].values.empty());
  }
  EXPECT_GT(learner->update(samples_around(*learner, b, 24)).grad_norm_critic, 0);

  // With value_head.safetensors beside the weights the critic is that model, head included.
  auto with_head_options = test_options("cpu", 78);
  with_head_options.value_head = true;
  auto with_head = lm::random_language_model(small_config(64), with_head_options);
  with_head->save_hf(dir.path() / "with_head");
  const auto original = with_head->forward_for_training(b.tokens, b.masks);
  learner = make_learner(trained((dir.path() / "with_head").string()));
  got = learner->forward(b.tokens, b.masks);
  for (size_t i = 0; i < b.tokens.size(); ++i) EXPECT_LE(max_abs_diff(got[i].values, original[i].values), 1e-6) << i;

  lm::random_language_model(small_config(80), plain_options)->save_hf(dir.path() / "other_vocab");
  expect_error([&] { make_learner(trained((dir.path() / "other_vocab").string())); },
               {"other_vocab", "vocab_size 80", "the actor's is 64"});
  expect_error([&] { make_learner(trained((dir.path() / "missing").string())); }, {"missing", "does not exist"});
  expect_error([&] { make_learner(trained("")); }, {"critic", "empty"});
}

// --- save_state / load_state --------------------------------------------------------------------

struct ResumeCase {
  std::string name;
  std::string critic;         // the saved learner's
  bool tied;
  std::string resume_critic;  // the resumed learner's; "<dir>" stands for the checkpoint folder
};

class PpoState : public ::testing::TestWithParam<ResumeCase> {};

// L1: update(b1), save, update(b2). L2 from the saved actor (+ critic), load_state, update(b2):
// the same weights, optimizer state and generator, bit for bit. Without load_state the same
// start gives other weights (the moments and the shuffle matter), so the comparison can fail.
TEST_P(PpoState, ResumedUpdateIsBitForBit) {
  const ResumeCase& c = GetParam();
  const PpoOptions ppo = trained(c.critic);
  auto first = make_learner(ppo, 64, 3, kTestInitStd, c.tied);
  const Batch b = fixed_batch(64);
  first->update(samples_around(*first, b, 30));
  TempDir dir("ca-ppo-state-");
  first->policy().save_hf(dir.path() / "actor");
  first->save_state(dir.path());
  const auto b2 = samples_around(*first, b, 31);
  first->update(b2);
  const Snapshot want = snapshot(*first);
  EXPECT_EQ(want.state["optimizer"]["actor"][0]["step"], 8);  // 2 updates x 2 epochs x 2 mini-batches

  PpoOptions resumed = ppo;
  resumed.critic = c.resume_critic == "<dir>" ? (dir.path() / "critic").string() : c.resume_critic;
  auto second = lm::create_ppo_learner(dir.path() / "actor", learner_options(), resumed);
  second->load_state(dir.path());
  second->update(b2);
  const Snapshot got = snapshot(*second);
  EXPECT_TRUE(same(got.actor, want.actor));
  EXPECT_TRUE(same(got.value_head, want.value_head));
  EXPECT_TRUE(same(got.critic, want.critic));
  EXPECT_TRUE(same(got.critic_head, want.critic_head));
  EXPECT_TRUE(got.optimizer == want.optimizer);  // bytes: not printed
  EXPECT_EQ(got.state["optimizer"], want.state["optimizer"]);
  EXPECT_EQ(got.state["shuffle_generator"], want.state["shuffle_generator"]);
  EXPECT_EQ(want.critic.empty(), c.critic == "shared");

  auto fresh = lm::create_ppo_learner(dir.path() / "actor", learner_options(), resumed);
  fresh->update(b2);
  EXPECT_FALSE(same(snapshot(*fresh).actor, want.actor));
}

INSTANTIATE_TEST_SUITE_P(Critics, PpoState,
                         ::testing::Values(ResumeCase{"shared", "shared", true, "shared"},
                                           // the saved critic lacks lm_head.weight (untied config)
                                           ResumeCase{"separate_from_its_folder", "from_actor", false, "<dir>"},
                                           // load_state overwrites the fresh copy of the actor
                                           ResumeCase{"separate_from_actor", "from_actor", true, "from_actor"}),
                         [](const auto& info) { return info.param.name; });

TEST(PpoStateErrors, LoadStateRefusesStateThatDoesNotFit) {
  const Batch b = fixed_batch(64);
  auto saved = make_learner(trained("shared"));
  saved->update(samples_around(*saved, b, 32));
  TempDir dir("ca-ppo-state-");
  saved->save_state(dir.path());
  const std::string file = (dir.path() / "learner_state.json").string();

  auto config = small_config(64);
  config.num_hidden_layers = 3;
  auto deeper = lm::create_random_ppo_learner(config, learner_options(), trained("shared"));
  deeper->update(samples_around(*deeper, b, 33));
  const Snapshot before = snapshot(*deeper);
  expect_error([&] { deeper->load_state(dir.path()); },
               {file, "'model.norm.weight' in the optimizer state but 'model.layers.2.input_layernorm.weight'"});
  const Snapshot after = snapshot(*deeper);  // a refused state changes nothing
  EXPECT_TRUE(after.optimizer == before.optimizer);
  EXPECT_EQ(after.state, before.state);

  config = small_config(64);
  config.hidden_size = 48;
  config.head_dim = 12;
  auto wider = lm::create_random_ppo_learner(config, learner_options(), trained("shared"));
  expect_error([&] { wider->load_state(dir.path()); },
               {file, "'model.embed_tokens.weight' has shape [64, 32] in the optimizer state, [64, 48] in the model"});

  expect_error([&] { make_learner(trained("from_actor"))->load_state(dir.path()); },
               {file, "the shared critic", "this one's critic is separate"});

  // A separate critic of another width: its parameter group does not fit.
  auto separate = make_learner(trained("from_actor"));
  TempDir other("ca-ppo-state-");
  separate->save_state(other.path());
  lm::random_language_model(config, test_options())->save_hf(other.path() / "wide");
  auto wide_critic = make_learner(trained((other.path() / "wide").string()));
  expect_error([&] { wide_critic->load_state(other.path()); },
               {(other.path() / "learner_state.json").string(), "critic parameter 'model.embed_tokens.weight'"});

  TempDir empty("ca-ppo-state-");
  expect_error([&] { saved->load_state(empty.path()); }, {"learner_state.json", "is missing"});
  fs::remove(dir.path() / "optimizer.safetensors");
  expect_error([&] { saved->load_state(dir.path()); }, {"optimizer.safetensors"});
}

}  // namespace
}  // namespace cuda_agent::testing
