// A real rollout on the CPU: two turns of the tiny random Qwen2 model through LocalPolicy (a
// conversation built as the agent loop builds it, with a tool result between the turns), its
// trajectory events turned into one chained sequence (rl/rollout.h), values from a PPO learner on
// the same weights, and one PPO update. The recorded log-probs must be the learner's own at the
// policy tokens, so the ratio starts at 1.
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chatml_test_util.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/rollout.h"
#include "cuda_agent/serve/local_policy.h"
#include "lm_test_util.h"

using namespace cuda_agent;
using nlohmann::json;

namespace {

class RolloutLocal : public cuda_agent::testing::TinyChatmlModelSuite {};

}  // namespace

TEST_F(RolloutLocal, TwoTurnEpisodeBecomesOneSequenceAndTrainsFromRatioOne) {
  const std::filesystem::path model = model_dir();
  serve::LocalPolicy local(
      serve::parse_local_policy_spec("local:" + model.string() + "?temperature=1&seed=4&max_new_tokens=12"));

  // The events run_episode records: system, user, then per turn the assistant event with the token
  // records and the tool's observation; the score last.
  agent::PolicyRequest req;
  req.messages.push_back({"system", "You write kernels.", {}, "", ""});
  req.messages.push_back({"user", "Make it fast.", {}, "", ""});
  json events = json::array({{{"type", "system"}, {"content", req.messages[0].content}},
                             {{"type", "user"}, {"content", req.messages[1].content}}});
  for (int turn = 1; turn <= 2; ++turn) {
    const agent::PolicyReply r = local.complete(req);
    events.push_back({{"type", "assistant"}, {"turn", turn}, {"content", r.text},
                      {"prompt_token_ids", r.prompt_token_ids}, {"completion_token_ids", r.completion_token_ids},
                      {"completion_logprobs", r.completion_logprobs},
                      {"prompt_extends_previous", r.prompt_extends_previous}});
    req.messages.push_back({"assistant", r.text, {}, "", ""});
    req.messages.push_back({"tool", "import torch", {}, "call_" + std::to_string(turn), "Read"});
    events.push_back({{"type", "observation"}, {"turn", turn}, {"ok", true}, {"output", "import torch"}});
  }
  events.push_back({{"type", "score"}, {"stop_reason", "max_turns"}, {"reward", 1.0}});
  // Through the JSONL form, as the trainer reads it.
  const json reread = json::parse(events.dump());
  ASSERT_TRUE(reread[4]["prompt_extends_previous"].get<bool>()) << "turn 2 did not extend turn 1";

  const rl::EpisodeSequence episode = rl::episode_sequence(reread);
  ASSERT_TRUE(episode.chained);
  ASSERT_EQ(episode.sequences.size(), 1u);
  const rl::TokenSequence& seq = episode.sequences[0];
  const size_t turn1 = reread[2]["completion_token_ids"].size(), turn2 = reread[4]["completion_token_ids"].size();
  EXPECT_EQ(episode.policy_tokens(), static_cast<int64_t>(turn1 + turn2));
  EXPECT_EQ(seq.tokens.size(), reread[4]["prompt_token_ids"].size() + turn2);

  // A learner on the same weights (a random value head): its log-probs at the policy tokens are
  // the recorded ones.
  lm::LmOptions lm;
  lm.value_head = true;
  lm.seed = 7;
  lm::PpoOptions ppo;
  ppo.actor_lr = 1e-3;
  ppo.critic_lr = 1e-3;
  auto learner = lm::create_ppo_learner(model, lm, ppo);
  const auto forward = learner->policy().forward_for_training(rl::sequence_tokens({episode}), {});
  ASSERT_EQ(forward.size(), 1u);
  ASSERT_EQ(forward[0].logprobs.size(), seq.tokens.size());
  for (size_t t = 0; t < seq.tokens.size(); ++t)
    if (seq.loss_mask[t]) {
      EXPECT_NEAR(forward[0].logprobs[t], seq.old_logprobs[t], 1e-3) << "position " << t;
    }

  const std::vector<lm::PpoSample> samples =
      rl::ppo_samples({episode}, {forward[0].values}, 1.0, 0.95, /*whiten=*/true);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].loss_mask[0], 0);
  // Ratio 1 everywhere: nothing clipped, and the whitened advantages (mean 0) give a surrogate of 0.
  const lm::PpoStats before = learner->evaluate(samples);
  EXPECT_EQ(before.clip_fraction, 0.0);
  EXPECT_NEAR(before.policy_loss, 0.0, 1e-3);
  EXPECT_EQ(before.tokens, episode.policy_tokens());

  const lm::PpoStats step = learner->update(samples);
  EXPECT_TRUE(std::isfinite(step.loss)) << step.loss;
  EXPECT_GT(step.grad_norm_actor, 0.0);
  EXPECT_EQ(step.tokens, episode.policy_tokens());
  const rl::RolloutStats stats = rl::rollout_stats({episode});
  EXPECT_EQ(stats.response_length_max, episode.policy_tokens());
  EXPECT_DOUBLE_EQ(stats.reward_mean, 1.0);
}
