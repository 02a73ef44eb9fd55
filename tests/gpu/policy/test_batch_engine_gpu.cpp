// The batched generation engine (LmOptions::batch_engine) on a CUDA device: calls from many
// threads, joining and leaving mid-decode, get the tokens and log-probs each gets alone through
// the per-call path (which on a GPU decodes from CUDA graphs), for every tiny model family; a pool
// that runs out makes calls wait and corrupts nothing. Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include "../../cpu/policy/engine_test_util.h"
#include "../gpu_test_util.h"

namespace cuda_agent::testing {
namespace {

TEST(BatchEngineGpu, EachCallGetsTheTokensItGetsAloneOnCuda) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  for (const auto& m : tiny_models()) {
    SCOPED_TRACE(m.name);
    const auto jobs = mixed_jobs(m.config.vocab_size);
    auto plain = model(m.config, false, 4096, 4, "cuda");
    const auto want = alone(*plain, jobs);
    auto engine = model(m.config, true, 4096, 4, "cuda");
    const auto got = together(*engine, jobs, 1);
    for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
    const lm::EngineStats s = engine->engine_stats();
    EXPECT_GE(s.peak_rows, 5);
    EXPECT_GT(s.reused_tokens, 0);
  }
}

// Sixteen blocks of 16 positions for eight calls that need four or five each, twice over (the
// pool freed and made again between the rounds when idle long enough).
TEST(BatchEngineGpu, APoolThatRunsOutMakesCallsWaitAndCorruptsNothing) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kQwen2);
  std::vector<Job> jobs;
  for (uint64_t i = 0; i < 8; ++i) jobs.push_back({{test_tokens(20 + i, config.vocab_size, 50 + i)}, sampled(60 + i, 48)});
  auto plain = model(config, false, 4096, 16, "cuda");
  const auto want = alone(*plain, jobs);
  auto engine = model(config, true, /*kv_tokens=*/256, /*block=*/16, "cuda");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto got = together(*engine, jobs, 0);
    for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
    if (round == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
  const lm::EngineStats s = engine->engine_stats();
  EXPECT_EQ(s.blocks, 16);
  EXPECT_LE(s.peak_blocks, 16);
  EXPECT_GT(s.waits + s.preemptions, 0);
}

}  // namespace
}  // namespace cuda_agent::testing
