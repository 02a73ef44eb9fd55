#include "cuda_agent/rl/rollout.h"

#include <algorithm>
#include <fstream>

#include "cuda_agent/core/error.h"
#include "cuda_agent/rl/advantages.h"

namespace cuda_agent::rl {
namespace {

using TurnRecord = agent::TurnTokens;

constexpr const char* kNoRecords =
    "assistant turn {} has no token records (prompt_token_ids, completion_token_ids, completion_logprobs): its "
    "policy does not see tokens (replay: and openai: policies); train with an in-process local:MODEL policy";

// An assistant event's token records, as read back from a trajectory.
TurnRecord turn_record(const nlohmann::json& e, size_t index) {
  TurnRecord r;
  r.turn = e.value("turn", static_cast<int>(index) + 1);
  const bool has = e.contains("prompt_token_ids") && e.contains("completion_token_ids") &&
                   e.contains("completion_logprobs");
  CA_CHECK(has, kNoRecords, r.turn);
  try {
    r.prompt = e.at("prompt_token_ids").get<std::vector<int64_t>>();
    r.completion = e.at("completion_token_ids").get<std::vector<int64_t>>();
    r.logprobs = e.at("completion_logprobs").get<std::vector<float>>();
  } catch (const nlohmann::json::exception& x) {
    CA_FAIL("assistant turn {}: the token records are not lists of numbers: {}", r.turn, x.what());
  }
  r.teacher_forced = e.value("teacher_forced", false);
  return r;
}

void check_turn(const TurnRecord& r) {
  CA_CHECK(!r.prompt.empty(), "assistant turn {}: prompt_token_ids is empty (the first token has no prediction, so a "
           "sequence needs a prompt)", r.turn);
  CA_CHECK(r.logprobs.size() == r.completion.size(),
           "assistant turn {}: {} completion_logprobs for {} completion_token_ids", r.turn, r.logprobs.size(),
           r.completion.size());
}

// Does `next`'s prompt start with `prev`'s prompt + completion?
bool extends(const TurnRecord& prev, const TurnRecord& next) {
  const size_t n = prev.prompt.size() + prev.completion.size();
  if (next.prompt.size() < n) return false;
  return std::equal(prev.prompt.begin(), prev.prompt.end(), next.prompt.begin()) &&
         std::equal(prev.completion.begin(), prev.completion.end(), next.prompt.begin() + prev.prompt.size());
}

// tokens = prompt + completion, the completion marked as the policy's.
TokenSequence own_sequence(const TurnRecord& r) {
  TokenSequence s;
  s.tokens = r.prompt;
  s.tokens.insert(s.tokens.end(), r.completion.begin(), r.completion.end());
  s.loss_mask.assign(s.tokens.size(), 0);
  s.old_logprobs.assign(s.tokens.size(), 0.0f);
  for (size_t i = 0; i < r.completion.size(); ++i) {
    s.loss_mask[r.prompt.size() + i] = 1;
    s.old_logprobs[r.prompt.size() + i] = r.logprobs[i];
  }
  s.turns = {r.turn};
  return s;
}

}  // namespace

int64_t EpisodeSequence::policy_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += std::count(s.loss_mask.begin(), s.loss_mask.end(), uint8_t{1});
  return n;
}

EpisodeSequence episode_sequence(const nlohmann::json& trajectory_events) {
  CA_CHECK(trajectory_events.is_array(), "a trajectory is an array of events, got {}",
           trajectory_events.dump().substr(0, 200));
  std::vector<TurnRecord> turns;
  const nlohmann::json* score = nullptr;
  for (const auto& e : trajectory_events) {
    if (!e.is_object()) continue;
    const std::string type = e.value("type", "");
    if (type == "assistant") turns.push_back(turn_record(e, turns.size()));
    if (type == "score") score = &e;
  }
  CA_CHECK(!turns.empty(), "the trajectory has no assistant event: the policy never answered (see its error event)");
  CA_CHECK(score != nullptr, "the trajectory has no score event: the episode did not finish");
  CA_CHECK(score->contains("reward") && (*score)["reward"].is_number(), "the score event's reward is {}, not a number",
           score->contains("reward") ? (*score)["reward"].dump() : "missing");
  return episode_sequence(turns, (*score)["reward"].get<double>(), score->value("stop_reason", ""));
}

EpisodeSequence episode_sequence(const agent::EpisodeResult& result) {
  CA_CHECK(!result.turn_tokens.empty(),
           "the episode has no assistant turn: the policy never answered (see its error event)");
  for (const TurnRecord& r : result.turn_tokens)
    CA_CHECK(!r.prompt.empty() || !r.completion.empty(), kNoRecords, r.turn);
  return episode_sequence(result.turn_tokens, result.reward, result.stop_reason);
}

EpisodeSequence episode_sequence(const std::vector<agent::TurnTokens>& turns, double reward,
                                 const std::string& stop_reason) {
  CA_CHECK(!turns.empty(), "the episode has no assistant turn");
  for (const TurnRecord& r : turns) check_turn(r);
  EpisodeSequence out;
  out.reward = reward;
  out.stop_reason = stop_reason;
  out.assistant_turns = static_cast<int>(turns.size());
  out.teacher_forced = std::any_of(turns.begin(), turns.end(), [](const TurnRecord& r) { return r.teacher_forced; });
  out.chained = true;
  for (size_t k = 1; k < turns.size() && out.chained; ++k) out.chained = extends(turns[k - 1], turns[k]);

  if (!out.chained) {
    for (const auto& r : turns) out.sequences.push_back(own_sequence(r));
    return out;
  }
  // The last turn's sequence holds every earlier one as its prefix: mark each turn's completion.
  TokenSequence s = own_sequence(turns.back());
  for (size_t k = 0; k + 1 < turns.size(); ++k) {
    const TurnRecord& r = turns[k];
    for (size_t i = 0; i < r.completion.size(); ++i) {
      s.loss_mask[r.prompt.size() + i] = 1;
      s.old_logprobs[r.prompt.size() + i] = r.logprobs[i];
    }
  }
  s.turns.clear();
  for (const auto& r : turns) s.turns.push_back(r.turn);
  out.sequences.push_back(std::move(s));
  return out;
}

nlohmann::json read_trajectory(const std::filesystem::path& jsonl) {
  std::ifstream in(jsonl);
  CA_CHECK(in.good(), "cannot read the trajectory {}: no such file or no permission", jsonl.string());
  nlohmann::json events = nlohmann::json::array();
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      events.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      CA_FAIL("{}:{}: not a JSON event: {}", jsonl.string(), number, e.what());
    }
  }
  return events;
}

std::vector<std::vector<int64_t>> sequence_tokens(const std::vector<EpisodeSequence>& episodes) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& e : episodes)
    for (const auto& s : e.sequences) out.push_back(s.tokens);
  return out;
}

std::vector<lm::PpoSample> ppo_samples(const std::vector<EpisodeSequence>& episodes,
                                       const std::vector<std::vector<float>>& values, double gamma, double lambda,
                                       bool whiten, const SumAcross& sum_across) {
  size_t count = 0;
  for (const auto& e : episodes) count += e.sequences.size();
  CA_CHECK(values.size() == count, "{} value rows for {} sequences (one row per sequence, in sequence_tokens order)",
           values.size(), count);

  std::vector<lm::PpoSample> samples;
  TokenBatch advantages, masks;
  size_t i = 0;
  for (size_t ep = 0; ep < episodes.size(); ++ep) {
    CA_CHECK(!episodes[ep].teacher_forced,
             "episode {} is a teacher's (teacher-forced records): its log-probs are not the policy's, so PPO cannot "
             "take it; only the supervised stages (stages.sft, RFT) learn from teacher episodes", ep);
    for (const TokenSequence& s : episodes[ep].sequences) {
      const size_t n = s.tokens.size();
      CA_CHECK(values[i].size() == n, "sequence {} (episode {}) has {} tokens but {} values", i, ep, n,
               values[i].size());
      CA_CHECK(s.loss_mask.size() == n && s.old_logprobs.size() == n,
               "sequence {} (episode {}): {} tokens, {} mask entries, {} old log-probs", i, ep, n, s.loss_mask.size(),
               s.old_logprobs.size());
      CA_CHECK(n > 0 && s.loss_mask[0] == 0, "sequence {} (episode {}) starts with a policy token: it needs a prompt", i,
               ep);
      std::vector<float> mask(s.loss_mask.begin(), s.loss_mask.end());
      size_t last = n;
      for (size_t t = n; t-- > 0;)
        if (s.loss_mask[t]) {
          last = t;
          break;
        }
      CA_CHECK(last < n, "sequence {} (episode {}) has no policy token to give the reward to", i, ep);
      std::vector<float> rewards(n, 0.0f);
      rewards[last] = static_cast<float>(episodes[ep].reward);
      GaeResult gae = compute_gae(rewards, values[i], mask, gamma, lambda);

      lm::PpoSample p;
      p.tokens = s.tokens;
      p.loss_mask = s.loss_mask;
      p.old_logprobs = s.old_logprobs;
      p.advantages = std::move(gae.advantages);
      p.returns = std::move(gae.returns);
      p.old_values = values[i];
      advantages.push_back(p.advantages);
      masks.push_back(std::move(mask));
      samples.push_back(std::move(p));
      ++i;
    }
  }
  if (whiten && (!samples.empty() || sum_across)) {
    whiten_masked(advantages, masks, /*keep_mean=*/false, /*eps=*/1e-8, sum_across);
    for (size_t k = 0; k < samples.size(); ++k) samples[k].advantages = std::move(advantages[k]);
  }
  return samples;
}

RolloutStats rollout_stats(const std::vector<EpisodeSequence>& episodes) {
  RolloutStats s;
  if (episodes.empty()) return s;
  double reward = 0, length = 0;
  for (const auto& e : episodes) {
    ++s.episodes;
    s.sequences += static_cast<int64_t>(e.sequences.size());
    s.chained_episodes += e.chained ? 1 : 0;
    reward += e.reward;
    const int64_t n = e.policy_tokens();
    length += static_cast<double>(n);
    s.response_length_max = std::max(s.response_length_max, n);
    for (const auto& q : e.sequences) s.tokens += static_cast<int64_t>(q.tokens.size());
  }
  s.reward_mean = reward / static_cast<double>(s.episodes);
  s.response_length_mean = length / static_cast<double>(s.episodes);
  return s;
}

}  // namespace cuda_agent::rl
