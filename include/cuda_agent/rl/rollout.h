// From agent episodes to PPO samples: the trainer side of a rollout.
//
// An episode's trajectory (agent::run_episode's events, or the lines of its trajectory.jsonl)
// holds, per assistant turn, the token records of an in-process policy (LocalPolicy):
// prompt_token_ids, completion_token_ids, completion_logprobs. episode_sequence() turns them into
// token sequences with a loss mask; ppo_samples() adds the rewards, GAE advantages and returns
// the PPO learner (policy/ppo_learner.h) takes.
//
// Chaining: when every turn's prompt starts with the previous turn's prompt + completion exactly
// (LocalPolicy keeps the ids it sampled; see local_policy.h), the episode is ONE sequence: the last
// turn's prompt + completion, with the loss mask 1 on every turn's completion tokens and 0 on the
// prompt and on the tool output and template text between turns. Otherwise each assistant turn is
// its own sequence (its prompt + its completion), the per-turn fallback.
//
// Rewards: one terminal reward per episode (the "score" event's "reward"), placed on the last
// policy token of each sequence: a chained episode gets it once; each per-turn sequence of a
// fallback episode gets the whole episode reward on its last token.
//
// Every function is pure and thread-safe. Bad input (a turn without records, lengths that do not
// match, no score) is an Error naming the turn or the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/agent/agent_loop.h"
#include "cuda_agent/lm/ppo_learner.h"
#include "cuda_agent/rl/advantages.h"

namespace cuda_agent::rl {

// One token sequence of an episode. Every vector has tokens.size() entries.
struct TokenSequence {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> loss_mask;   // 1 exactly on the completion tokens the policy sampled
  std::vector<float> old_logprobs;  // the recorded log-probs at mask-1 positions, 0 elsewhere
  std::vector<int> turns;           // the assistant turns (the events' "turn") it covers
};

struct EpisodeSequence {
  // One sequence when chained, else one per assistant turn, in turn order.
  std::vector<TokenSequence> sequences;
  bool chained = false;      // true: every turn extended the previous one (one sequence)
  double reward = 0;         // the "score" event's reward
  int assistant_turns = 0;
  std::string stop_reason;   // the "score" event's stop_reason ("" when absent)
  // Some turn's records are a teacher's reply in the policy's tokens (the event's "teacher_forced",
  // LocalPolicy's teacher forcing): its old_logprobs are zeros, not the policy's. Supervised
  // updates take it; ppo_samples refuses it.
  bool teacher_forced = false;

  // Policy tokens (loss mask 1) over all sequences: the episode's response length.
  int64_t policy_tokens() const;
};

// The episode of one trajectory: a JSON array of events as run_episode records them (other event
// types are ignored; a leading {"type": "episode"} header line is fine). Errors: no assistant
// event; an assistant event without token records (a replay: or openai: policy, which does not see
// tokens: the message names the turn and says to train with local:MODEL); records of mismatched
// lengths or an empty prompt (naming the turn); no "score" event or a non-numeric reward.
EpisodeSequence episode_sequence(const nlohmann::json& trajectory_events);

// The same from an episode run in this process: its typed token records (EpisodeResult::
// turn_tokens), reward and stop reason, with the same errors; no JSON read back.
EpisodeSequence episode_sequence(const agent::EpisodeResult& result);

// The same from the turns' records themselves, the episode's reward and stop reason.
EpisodeSequence episode_sequence(const std::vector<agent::TurnTokens>& turns, double reward,
                                 const std::string& stop_reason);

// The events of a trajectory.jsonl file (one JSON object a line; blank lines skipped), as an
// array. Error naming the file (and the line) when it cannot be read or a line is not JSON.
nlohmann::json read_trajectory(const std::filesystem::path& jsonl);

// The token lists of every sequence of `episodes`, episode by episode and in order within each:
// the order ppo_samples() expects `values` in, and what to pass to forward_for_training.
std::vector<std::vector<int64_t>> sequence_tokens(const std::vector<EpisodeSequence>& episodes);

// PPO samples of a batch of episodes. values[i] are the critic's values of the i-th sequence in
// sequence_tokens() order (TrainForward::values; same length as its tokens). For each sequence:
// rewards 0 except the episode reward on its last policy token; advantages and returns from
// compute_gae (gamma, lambda; masked tool and template tokens carry through, see advantages.h);
// then, when `whiten`, the advantages are whitened over every policy token of the batch
// (whiten_masked; needs at least two); returns stay unwhitened (A + V). old_values = values,
// old_logprobs and loss_mask from the sequence, ref_logprobs empty. Errors: a count or length
// that does not match (naming the sequence), a sequence without policy tokens, a teacher-forced
// episode (its log-probs are not the policy's), gamma or lambda outside [0, 1].
// With `sum_across` (data parallelism) the whitening's mean and variance are the job's
// (whiten_masked); every process must call it then, also one without episodes.
std::vector<lm::PpoSample> ppo_samples(const std::vector<EpisodeSequence>& episodes,
                                       const std::vector<std::vector<float>>& values, double gamma, double lambda,
                                       bool whiten, const SumAcross& sum_across = {});

// Batch statistics the trainer logs per step.
struct RolloutStats {
  int64_t episodes = 0;
  int64_t sequences = 0;
  int64_t chained_episodes = 0;       // episodes that became one sequence
  double reward_mean = 0;
  double response_length_mean = 0;    // policy tokens per episode
  int64_t response_length_max = 0;
  int64_t tokens = 0;                 // all tokens of all sequences (what the forward costs)
};
// Zeros for an empty batch.
RolloutStats rollout_stats(const std::vector<EpisodeSequence>& episodes);

}  // namespace cuda_agent::rl
