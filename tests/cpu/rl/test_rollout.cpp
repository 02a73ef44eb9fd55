// Episodes to PPO samples (rl/rollout.h) on hand-built trajectories: chaining into one sequence,
// the loss mask and old log-probs, reward placement and GAE against compute_gae worked by hand,
// the per-turn fallback, whitening over the batch, the statistics, and bad input.
#include "cuda_agent/rl/rollout.h"

#include <cmath>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::rl {
namespace {

using cuda_agent::testing::error_message;
using nlohmann::json;

json assistant(int turn, std::vector<int64_t> prompt, std::vector<int64_t> completion, std::vector<float> logprobs) {
  return {{"type", "assistant"}, {"turn", turn}, {"content", "x"}, {"prompt_token_ids", prompt},
          {"completion_token_ids", completion}, {"completion_logprobs", logprobs}};
}
json score(double reward) { return {{"type", "score"}, {"stop_reason", "answered"}, {"reward", reward}}; }

// Two turns that chain: prompt [1 2 3], completion [4 5]; then the tool output [6 7] and
// completion [8 9 10].
//   position   0 1 2 3 4 5 6 7 8 9 10 (token = position + 1)
//   mask       0 0 0 1 1 0 0 1 1 1
json chained_trajectory(double reward = 2.0) {
  return json::array({{{"type", "episode"}},
                      {{"type", "system"}, {"content", "s"}},
                      assistant(1, {1, 2, 3}, {4, 5}, {-0.1f, -0.2f}),
                      {{"type", "observation"}, {"turn", 1}, {"output", "o"}},
                      assistant(2, {1, 2, 3, 4, 5, 6, 7}, {8, 9, 10}, {-0.3f, -0.4f, -0.5f}),
                      score(reward)});
}

TEST(Rollout, ChainedTurnsBecomeOneSequenceMaskedOnEveryCompletion) {
  const EpisodeSequence e = episode_sequence(chained_trajectory());
  ASSERT_TRUE(e.chained);
  ASSERT_EQ(e.sequences.size(), 1u);
  const TokenSequence& s = e.sequences[0];
  EXPECT_EQ(s.tokens, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{0, 0, 0, 1, 1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(s.old_logprobs, (std::vector<float>{0, 0, 0, -0.1f, -0.2f, 0, 0, -0.3f, -0.4f, -0.5f}));
  EXPECT_EQ(s.turns, (std::vector<int>{1, 2}));
  EXPECT_DOUBLE_EQ(e.reward, 2.0);
  EXPECT_EQ(e.assistant_turns, 2);
  EXPECT_EQ(e.stop_reason, "answered");
  EXPECT_EQ(e.policy_tokens(), 5);
}

// An episode run in this process gives the same sequences from its typed records as from its
// events, and the same errors.
TEST(Rollout, TypedTurnRecordsGiveWhatTheEventsGive) {
  agent::EpisodeResult r;
  r.reward = 2.0;
  r.stop_reason = "answered";
  r.turn_tokens = {{1, {1, 2, 3}, {4, 5}, {-0.1f, -0.2f}, false},
                   {2, {1, 2, 3, 4, 5, 6, 7}, {8, 9, 10}, {-0.3f, -0.4f, -0.5f}, false}};
  const EpisodeSequence typed = episode_sequence(r), events = episode_sequence(chained_trajectory());
  ASSERT_EQ(typed.sequences.size(), events.sequences.size());
  EXPECT_EQ(typed.sequences[0].tokens, events.sequences[0].tokens);
  EXPECT_EQ(typed.sequences[0].loss_mask, events.sequences[0].loss_mask);
  EXPECT_EQ(typed.sequences[0].old_logprobs, events.sequences[0].old_logprobs);
  EXPECT_EQ(typed.sequences[0].turns, events.sequences[0].turns);
  EXPECT_EQ(typed.chained, events.chained);
  EXPECT_EQ(typed.reward, events.reward);
  EXPECT_EQ(typed.stop_reason, events.stop_reason);

  r.turn_tokens[1].prompt.clear();
  r.turn_tokens[1].completion.clear();
  r.turn_tokens[1].logprobs.clear();
  std::string m = error_message([&] { episode_sequence(r); });
  EXPECT_NE(m.find("assistant turn 2 has no token records"), std::string::npos) << m;
  r.turn_tokens.pop_back();
  r.turn_tokens[0].logprobs = {-0.1f};
  m = error_message([&] { episode_sequence(r); });
  EXPECT_NE(m.find("assistant turn 1: 1 completion_logprobs for 2 completion_token_ids"), std::string::npos) << m;
  r.turn_tokens.clear();
  m = error_message([&] { episode_sequence(r); });
  EXPECT_NE(m.find("no assistant turn"), std::string::npos) << m;
}

TEST(Rollout, ATurnThatDoesNotExtendFallsBackToPerTurnSequences) {
  json t = chained_trajectory();
  t[4]["prompt_token_ids"] = {1, 2, 3, 4, 99, 6, 7};  // the template rewrote the first completion
  const EpisodeSequence e = episode_sequence(t);
  EXPECT_FALSE(e.chained);
  ASSERT_EQ(e.sequences.size(), 2u);
  EXPECT_EQ(e.sequences[0].tokens, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(e.sequences[0].loss_mask, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(e.sequences[0].turns, (std::vector<int>{1}));
  EXPECT_EQ(e.sequences[1].tokens, (std::vector<int64_t>{1, 2, 3, 4, 99, 6, 7, 8, 9, 10}));
  EXPECT_EQ(e.sequences[1].loss_mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(e.sequences[1].old_logprobs[9], -0.5f);
  EXPECT_EQ(e.policy_tokens(), 5);

  // A prompt shorter than the previous prompt + completion does not extend either.
  json shorter = chained_trajectory();
  shorter[4]["prompt_token_ids"] = {1, 2, 3, 4};
  EXPECT_FALSE(episode_sequence(shorter).chained);
}

TEST(Rollout, RewardOnTheLastPolicyTokenAndGaeThroughTheToolTokens) {
  const EpisodeSequence e = episode_sequence(chained_trajectory(2.0));
  // Values at masked positions are ignored; policy positions 3, 4, 7, 8, 9.
  const std::vector<float> v = {9, 9, 9, 0.1f, 0.2f, 9, 9, 0.3f, 0.4f, 0.5f};
  const auto samples = ppo_samples({e}, {v}, 1.0, 1.0, /*whiten=*/false);
  ASSERT_EQ(samples.size(), 1u);
  const lm::PpoSample& p = samples[0];
  EXPECT_EQ(p.loss_mask[0], 0);
  EXPECT_EQ(p.tokens, e.sequences[0].tokens);
  EXPECT_EQ(p.old_values, v);
  EXPECT_TRUE(p.ref_logprobs.empty());
  // gamma = lambda = 1, one terminal reward R = 2: A_k = R - V_k, returns = R at every policy token.
  const std::vector<int> policy_positions = {3, 4, 7, 8, 9};
  for (int t : policy_positions) {
    EXPECT_NEAR(p.advantages[t], 2.0 - v[t], 1e-6) << t;
    EXPECT_NEAR(p.returns[t], 2.0, 1e-6) << t;
  }
  for (int t : {0, 1, 2, 5, 6}) {
    EXPECT_EQ(p.advantages[t], 0.0f) << t;
    EXPECT_EQ(p.returns[t], 0.0f) << t;
  }

  // gamma 0.5, lambda 1: discounting is per policy token (5 of them), not per position:
  // A_k = 0.5^(4-k) * 2 - V_k for the k-th policy token (k = 0..4).
  const auto d = ppo_samples({e}, {v}, 0.5, 1.0, false);
  for (int k = 0; k < 5; ++k) {
    const int t = policy_positions[k];
    EXPECT_NEAR(d[0].advantages[t], std::pow(0.5, 4 - k) * 2.0 - v[t], 1e-6) << t;
  }
}

TEST(Rollout, PerTurnSequencesEachGetTheEpisodeRewardOnTheirLastToken) {
  json t = chained_trajectory(1.5);
  t[4]["prompt_token_ids"] = {7, 7};
  const EpisodeSequence e = episode_sequence(t);
  ASSERT_FALSE(e.chained);
  ASSERT_EQ(e.sequences.size(), 2u);
  // Values 0: the advantage at each sequence's last token is its reward (gamma = lambda = 1: every
  // policy token of the sequence sees the whole reward).
  const std::vector<std::vector<float>> values = {std::vector<float>(5, 0.0f), std::vector<float>(5, 0.0f)};
  const auto samples = ppo_samples({e}, values, 1.0, 1.0, false);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].advantages, (std::vector<float>{0, 0, 0, 1.5f, 1.5f}));
  EXPECT_EQ(samples[1].advantages, (std::vector<float>{0, 0, 1.5f, 1.5f, 1.5f}));
  // gamma 0: only the last token of each sequence sees the reward.
  const auto g0 = ppo_samples({e}, values, 0.0, 1.0, false);
  EXPECT_EQ(g0[0].advantages, (std::vector<float>{0, 0, 0, 0, 1.5f}));
  EXPECT_EQ(g0[1].advantages, (std::vector<float>{0, 0, 0, 0, 1.5f}));
}

TEST(Rollout, WhiteningIsOverTheWholeBatchAndLeavesReturns) {
  const EpisodeSequence a = episode_sequence(chained_trajectory(2.0));
  const EpisodeSequence b = episode_sequence(chained_trajectory(-1.0));
  const std::vector<std::vector<float>> values(2, std::vector<float>(10, 0.0f));
  const auto raw = ppo_samples({a, b}, values, 1.0, 1.0, false);
  const auto white = ppo_samples({a, b}, values, 1.0, 1.0, true);
  ASSERT_EQ(white.size(), 2u);
  // Policy advantages: five 2s and five -1s; mean 0.5, unbiased std sqrt(22.5 / 9).
  const double sd = std::sqrt(10 * 2.25 / 9.0);
  for (int t : {3, 4, 7, 8, 9}) {
    EXPECT_NEAR(white[0].advantages[t], (2.0 - 0.5) / sd, 1e-5);
    EXPECT_NEAR(white[1].advantages[t], (-1.0 - 0.5) / sd, 1e-5);
  }
  EXPECT_EQ(white[0].advantages[5], 0.0f);
  EXPECT_EQ(white[0].returns, raw[0].returns);
  EXPECT_EQ(white[1].returns, raw[1].returns);
  EXPECT_EQ(sequence_tokens({a, b}).size(), 2u);
}

TEST(Rollout, StatisticsCountPolicyTokensPerEpisode) {
  json t = chained_trajectory(0.0);
  t[4]["prompt_token_ids"] = {7};
  const RolloutStats s = rollout_stats({episode_sequence(chained_trajectory(2.0)), episode_sequence(t)});
  EXPECT_EQ(s.episodes, 2);
  EXPECT_EQ(s.sequences, 3);
  EXPECT_EQ(s.chained_episodes, 1);
  EXPECT_DOUBLE_EQ(s.reward_mean, 1.0);
  EXPECT_DOUBLE_EQ(s.response_length_mean, 5.0);
  EXPECT_EQ(s.response_length_max, 5);
  EXPECT_EQ(s.tokens, 10 + 5 + 4);
  EXPECT_EQ(rollout_stats({}).episodes, 0);
}

TEST(Rollout, BadTrajectoriesAndBatchesAreErrorsNamingTheTurn) {
  json replay = chained_trajectory();
  replay[4].erase("prompt_token_ids");
  std::string m = error_message([&] { episode_sequence(replay); });
  EXPECT_NE(m.find("assistant turn 2 has no token records"), std::string::npos) << m;
  EXPECT_NE(m.find("local:MODEL"), std::string::npos) << m;

  json lengths = chained_trajectory();
  lengths[2]["completion_logprobs"] = {-0.1f};
  m = error_message([&] { episode_sequence(lengths); });
  EXPECT_NE(m.find("assistant turn 1: 1 completion_logprobs for 2 completion_token_ids"), std::string::npos) << m;

  json empty_prompt = chained_trajectory();
  empty_prompt[2]["prompt_token_ids"] = json::array();
  m = error_message([&] { episode_sequence(empty_prompt); });
  EXPECT_NE(m.find("assistant turn 1: prompt_token_ids is empty"), std::string::npos) << m;

  json no_score = chained_trajectory();
  no_score.erase(5);
  m = error_message([&] { episode_sequence(no_score); });
  EXPECT_NE(m.find("no score event"), std::string::npos) << m;

  m = error_message([&] { episode_sequence(json::array({score(1.0)})); });
  EXPECT_NE(m.find("no assistant event"), std::string::npos) << m;

  const EpisodeSequence e = episode_sequence(chained_trajectory());
  m = error_message([&] { ppo_samples({e}, {}, 1.0, 1.0, false); });
  EXPECT_NE(m.find("0 value rows for 1 sequences"), std::string::npos) << m;
  m = error_message([&] { ppo_samples({e}, {std::vector<float>(3, 0.0f)}, 1.0, 1.0, false); });
  EXPECT_NE(m.find("sequence 0 (episode 0) has 10 tokens but 3 values"), std::string::npos) << m;
  m = error_message([&] { ppo_samples({e}, {std::vector<float>(10, 0.0f)}, 1.5, 1.0, false); });
  EXPECT_NE(m.find("gamma"), std::string::npos) << m;
}

TEST(Rollout, ReadsTrajectoryFiles) {
  TempDir dir("ca-rollout-");
  std::string text;
  for (const auto& e : chained_trajectory()) text += e.dump() + "\n";
  write_file_atomic(dir.path() / "trajectory.jsonl", text + "\n");
  const json events = read_trajectory(dir.path() / "trajectory.jsonl");
  EXPECT_EQ(events, chained_trajectory());
  EXPECT_TRUE(episode_sequence(events).chained);

  write_file_atomic(dir.path() / "bad.jsonl", text + "{not json\n");
  std::string m = error_message([&] { read_trajectory(dir.path() / "bad.jsonl"); });
  EXPECT_NE(m.find("bad.jsonl:7"), std::string::npos) << m;
  m = error_message([&] { read_trajectory(dir.path() / "missing.jsonl"); });
  EXPECT_NE(m.find("missing.jsonl"), std::string::npos) << m;
}

}  // namespace
}  // namespace cuda_agent::rl
