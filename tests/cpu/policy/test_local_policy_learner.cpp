// LocalPolicy over the model a PPO learner trains (ChatSession::open_with_model on
// PpoLearner::policy()), on the tiny random Qwen2 model with the byte-level ChatML tokenizer: before
// any update it replies as a policy opened from the same folder does; after an update it samples
// from the trained weights while the folder's copy does not move. And the vocabulary check that
// open() and open_with_model() share.
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

#include "chatml_test_util.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/serve/chat_session.h"
#include "cuda_agent/serve/local_policy.h"
#include "lm_test_util.h"

using namespace cuda_agent;
using cuda_agent::testing::error_of;
namespace fs = std::filesystem;

namespace {

class LocalPolicyOnLearner : public cuda_agent::testing::TinyChatmlModelSuite {
 protected:

  static agent::PolicyRequest request() {
    agent::PolicyRequest r;
    r.messages.push_back({"system", "You write kernels.", {}, "", ""});
    r.messages.push_back({"user", "Make it fast.", {}, "", ""});
    return r;
  }
  static serve::LocalPolicyOptions greedy() {
    serve::LocalPolicyOptions o;
    o.temperature = 0;
    o.max_new_tokens = 12;
    return o;
  }
};

}  // namespace

TEST_F(LocalPolicyOnLearner, SamplesFromTheWeightsTheLearnerTrains) {
  lm::LmOptions lm;
  lm.value_head = true;
  lm.seed = 7;
  lm::PpoOptions ppo;
  ppo.actor_lr = 1e-2;  // large: one step must move the log-probs well past float noise
  ppo.critic_lr = 1e-2;
  auto learner = lm::create_ppo_learner(model_dir(), lm, ppo);

  auto opened = serve::ChatSession::open_with_model(model_dir(), learner->policy());
  // The trainer's per-episode session: the same tokenizer object, not read again; the same model.
  auto session = serve::ChatSession::share_with_model(*opened, learner->policy());
  EXPECT_EQ(&session->tokenizer(), &opened->tokenizer());
  EXPECT_EQ(session->path(), opened->path());
  EXPECT_EQ(session->stop_token_ids(), opened->stop_token_ids());
  EXPECT_FALSE(session->owns_model());
  EXPECT_EQ(&session->model(), &learner->policy());
  opened.reset();  // the shared tokenizer outlives the session it came from
  serve::LocalPolicy borrowed(std::move(session), greedy());
  serve::LocalPolicyOptions from_folder_options = greedy();
  from_folder_options.model = model_dir();
  serve::LocalPolicy from_folder(from_folder_options);
  EXPECT_TRUE(from_folder.session().owns_model());
  // The spec names the folder the tokenizer came from, with the sampling options given.
  EXPECT_EQ(borrowed.name(), from_folder.name());

  // Before any update: the same weights, so the same greedy reply and records.
  const agent::PolicyReply a = borrowed.complete(request()), b = from_folder.complete(request());
  ASSERT_FALSE(a.completion_token_ids.empty());
  EXPECT_EQ(a.prompt_token_ids, b.prompt_token_ids);
  EXPECT_EQ(a.completion_token_ids, b.completion_token_ids);
  EXPECT_EQ(a.text, b.text);
  ASSERT_EQ(a.completion_logprobs.size(), b.completion_logprobs.size());
  for (size_t i = 0; i < a.completion_logprobs.size(); ++i)
    EXPECT_NEAR(a.completion_logprobs[i], b.completion_logprobs[i], 1e-4) << "token " << i;

  // One update that raises the probability of that reply (advantage +1 on every reply token).
  std::vector<int64_t> sequence = a.prompt_token_ids;
  sequence.insert(sequence.end(), a.completion_token_ids.begin(), a.completion_token_ids.end());
  const size_t n_prompt = a.prompt_token_ids.size();
  lm::PpoSample sample;
  sample.tokens = sequence;
  sample.loss_mask.assign(sequence.size(), 0);
  sample.old_logprobs.assign(sequence.size(), 0.0f);
  sample.advantages.assign(sequence.size(), 0.0f);
  sample.returns.assign(sequence.size(), 0.0f);
  for (size_t i = 0; i < a.completion_logprobs.size(); ++i) {
    sample.loss_mask[n_prompt + i] = 1;
    sample.old_logprobs[n_prompt + i] = a.completion_logprobs[i];
    sample.advantages[n_prompt + i] = 1.0f;
    sample.returns[n_prompt + i] = 1.0f;
  }
  sample.old_values = learner->policy().forward_for_training({sequence}, {sample.loss_mask}).at(0).values;
  ASSERT_EQ(sample.old_values.size(), sequence.size());
  const lm::PpoStats step = learner->update({sample});
  ASSERT_GT(step.grad_norm_actor, 0.0);

  // The borrowed policy sees the trained weights: its log-probs of the same reply moved (up).
  const std::vector<float> trained =
      borrowed.session().model().forward_for_training({sequence}, {}).at(0).logprobs;
  double before = 0, after = 0, moved = 0;
  for (size_t i = 0; i < a.completion_logprobs.size(); ++i) {
    before += a.completion_logprobs[i];
    after += trained[n_prompt + i];
    moved = std::max(moved, std::abs(double(trained[n_prompt + i]) - a.completion_logprobs[i]));
  }
  EXPECT_GT(moved, 1e-2);
  EXPECT_GT(after, before);
  std::cout << "[ learner  ] reply log-prob " << before << " -> " << after << " after one update (largest token move "
            << moved << ")\n";
  // ... and so does what it samples: its next reply's records are the trained model's.
  borrowed.reset_chain();
  const agent::PolicyReply a2 = borrowed.complete(request());
  std::vector<int64_t> sequence2 = a2.prompt_token_ids;
  sequence2.insert(sequence2.end(), a2.completion_token_ids.begin(), a2.completion_token_ids.end());
  const std::vector<float> trained2 = learner->policy().forward_for_training({sequence2}, {}).at(0).logprobs;
  for (size_t i = 0; i < a2.completion_logprobs.size(); ++i)
    EXPECT_NEAR(a2.completion_logprobs[i], trained2[a2.prompt_token_ids.size() + i], 1e-3) << "token " << i;
  EXPECT_NE(a2.completion_logprobs, a.completion_logprobs);

  // The folder's copy did not move: the same reply, the same records.
  from_folder.reset_chain();
  const agent::PolicyReply b2 = from_folder.complete(request());
  EXPECT_EQ(b2.completion_token_ids, b.completion_token_ids);
  ASSERT_EQ(b2.completion_logprobs.size(), b.completion_logprobs.size());
  for (size_t i = 0; i < b.completion_logprobs.size(); ++i)
    EXPECT_NEAR(b2.completion_logprobs[i], b.completion_logprobs[i], 1e-5) << "token " << i;
  const std::vector<float> untouched = from_folder.session().model().forward_for_training({sequence}, {}).at(0).logprobs;
  for (size_t i = 0; i < a.completion_logprobs.size(); ++i)
    EXPECT_NEAR(untouched[n_prompt + i], b.completion_logprobs[i], 1e-3) << "token " << i;
}

// open() and open_with_model() run the same check: a model vocabulary smaller than the tokenizer's
// is refused, naming both sizes.
TEST_F(LocalPolicyOnLearner, VocabularyMismatchNamesBothSizes) {
  policy::ModelConfig small = cuda_agent::testing::tiny_config(policy::Family::kQwen2);  // 256 ids
  ASSERT_EQ(small.vocab_size, 256);
  auto model = lm::random_language_model(small, cuda_agent::testing::test_options());
  const std::string borrowed = error_of([&] { serve::ChatSession::open_with_model(model_dir(), *model); });
  EXPECT_NE(borrowed.find("the tokenizer has 258 ids but the model's vocabulary has 256"), std::string::npos)
      << borrowed;
  EXPECT_NE(borrowed.find(model_dir().string()), std::string::npos) << borrowed;

  // The same weights in a folder beside the 258-id tokenizer: open() says the same.
  const fs::path folder = dir_->path() / "small";
  model->save_hf(folder);
  write_file_atomic(folder / "tokenizer.json", cuda_agent::testing::tiny_chatml_tokenizer().dump());
  const std::string opened = error_of([&] { serve::ChatSession::open(folder, lm::LmOptions{}); });
  EXPECT_NE(opened.find("the tokenizer has 258 ids but the model's vocabulary has 256"), std::string::npos) << opened;

  // A larger model vocabulary (padded embeddings) is fine.
  policy::ModelConfig large = small;
  large.vocab_size = 300;
  auto padded = lm::random_language_model(large, cuda_agent::testing::test_options());
  EXPECT_NO_THROW(serve::ChatSession::open_with_model(model_dir(), *padded));
}
