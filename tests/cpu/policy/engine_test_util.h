// Helpers of the batched generation engine's tests (tests/cpu/policy/test_batch_engine.cpp on the
// CPU, tests/gpu/policy/test_batch_engine_gpu.cpp on a GPU): jobs of calls, each alone through the
// per-call path and all at once from threads, compared token by token.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "lm_test_util.h"

namespace cuda_agent::testing {

using lm::Generation;
using lm::SamplingOptions;

struct Job {
  std::vector<std::vector<int64_t>> prompts;
  SamplingOptions options;
  int64_t stop_after = 0;  // on_token says stop after this many tokens of row 0 (0: never)
};

inline std::function<bool(size_t, int64_t)> stopper(const Job& job) {
  if (job.stop_after == 0) return {};
  auto seen = std::make_shared<int64_t>(0);
  return [seen, n = job.stop_after](size_t row, int64_t) { return row != 0 || ++*seen < n; };
}

inline std::unique_ptr<lm::LanguageModel> model(const policy::ModelConfig& config, bool engine,
                                                int64_t kv_tokens = 4096, int64_t block = 4,
                                                const std::string& device = "cpu") {
  auto o = test_options(device, 3);
  o.batch_engine = engine;
  o.kv_tokens = kv_tokens;
  o.kv_block = block;
  return lm::random_language_model(config, o);
}

// Each job alone through the per-call path.
inline std::vector<std::vector<Generation>> alone(lm::LanguageModel& m, const std::vector<Job>& jobs) {
  std::vector<std::vector<Generation>> out;
  for (const Job& j : jobs) out.push_back(m.generate(j.prompts, j.options, stopper(j)));
  return out;
}

// All jobs at once, one thread each, the i-th starting i * stagger_ms later (so that calls join
// while others decode); a call's Error text in place of its result.
inline std::vector<std::vector<Generation>> together(lm::LanguageModel& m, const std::vector<Job>& jobs, int stagger_ms,
                                              std::vector<std::string>* errors = nullptr) {
  std::vector<std::vector<Generation>> out(jobs.size());
  std::vector<std::string> failed(jobs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < jobs.size(); ++i)
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms * static_cast<int>(i)));
      try {
        out[i] = m.generate(jobs[i].prompts, jobs[i].options, stopper(jobs[i]));
      } catch (const Error& e) {
        failed[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (errors != nullptr) *errors = failed;
  if (errors == nullptr) {
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(failed[i], "") << "job " << i;
  }
  return out;
}

inline void expect_same(const std::vector<Generation>& got, const std::vector<Generation>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << what << " row " << r;
    EXPECT_EQ(got[r].finish_reason, want[r].finish_reason) << what << " row " << r;
    EXPECT_LE(max_abs_diff(got[r].logprobs, want[r].logprobs), 1e-4) << what << " row " << r;
  }
}

inline SamplingOptions sampled(uint64_t seed, int64_t max_new, std::vector<int64_t> stops = {}) {
  SamplingOptions s;
  s.temperature = 0.9;
  s.top_p = 0.95;
  s.seed = seed;
  s.max_new_tokens = max_new;
  s.stop_token_ids = std::move(stops);
  return s;
}

// A beginning every episode shares (a system prompt), then each job's own tokens.
inline std::vector<Job> mixed_jobs(int64_t vocab) {
  const auto shared = test_tokens(22, vocab, 11);
  auto with_shared = [&](size_t extra, uint64_t seed) {
    auto p = shared;
    const auto own = test_tokens(extra, vocab, seed);
    p.insert(p.end(), own.begin(), own.end());
    return p;
  };
  std::vector<Job> jobs;
  // Long enough that every other call joins while it decodes.
  jobs.push_back({{with_shared(5, 1)}, sampled(1, 120)});
  jobs.push_back({{test_tokens(3, vocab, 2)}, sampled(2, 9)});
  jobs.push_back({{with_shared(14, 3)}, sampled(3, 24, {7, 19})});
  SamplingOptions g;
  g.greedy = true;
  g.max_new_tokens = 16;
  jobs.push_back({{with_shared(9, 4)}, g});
  // A PPO group: four samples of one prompt in one call.
  jobs.push_back({std::vector<std::vector<int64_t>>(4, with_shared(6, 5)), sampled(5, 14)});
  // Prompts of different lengths in one call, one stopped by its callback.
  jobs.push_back({{test_tokens(30, vocab, 6), test_tokens(1, vocab, 7)}, sampled(6, 12), 5});
  return jobs;
}

}  // namespace cuda_agent::testing
