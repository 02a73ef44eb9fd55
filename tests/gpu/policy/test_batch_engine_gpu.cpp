// The batched generation engine (LmOptions::batch_engine) on a CUDA device: calls from many
// threads, joining and leaving mid-decode, get the tokens and log-probs each gets alone through
// the per-call path (which on a GPU decodes from CUDA graphs), for every tiny model family; a pool
// that runs out makes calls wait and corrupts nothing. Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>
#include <tuple>

#include "cuda_agent/sandbox/worker_confinement.h"

#include "../../cpu/policy/engine_test_util.h"
#include "../gpu_test_util.h"

namespace cuda_agent::testing {
namespace {

SamplingOptions greedy(int64_t n) {
  SamplingOptions o;
  o.greedy = true;
  o.max_new_tokens = n;
  return o;
}

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

// The engine's paged attention kernel (paged_attention.h) on the head shapes of the models it
// serves (SmolLM2: 9 query heads over 3 key/value heads of 64; Qwen2-1.5B: 12 over 2 of 128),
// prompts that span several of its chunks and end inside a block, with few rows and with many
// (its chunk size differs: paged_decode_plan). In float32 each call gets what it gets alone
// through the per-call path; in bfloat16 the kernel's first steps agree with torch's attention
// over gathered keys.
TEST(BatchEngineGpu, PagedAttentionGivesWhatEachCallGetsAlone) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  for (const auto& [heads, kv_heads, dim] : {std::tuple{9, 3, 64}, std::tuple{12, 2, 128}}) {
    SCOPED_TRACE(std::to_string(heads) + " heads over " + std::to_string(kv_heads) + " of " + std::to_string(dim));
    auto config = tiny_config(policy::Family::kQwen2);
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.head_dim = dim;
    std::vector<Job> jobs;
    const int64_t lengths[] = {300, 17, 130, 1, 257};
    for (uint64_t i = 0; i < 5; ++i) {
      SamplingOptions o = i % 2 ? sampled(70 + i, 40) : greedy(40);
      jobs.push_back({{test_tokens(lengths[i], config.vocab_size, 80 + i)}, o});
    }
    // Forty rows more in one call, for a few steps: enough rows that the kernel's chunks are its
    // largest (128 keys) on an H200; the steps after, with five rows, split rows into smaller ones.
    Job wide{{}, greedy(6)};
    for (uint64_t i = 0; i < 40; ++i) wide.prompts.push_back(test_tokens(200 + 2 * i, config.vocab_size, 90 + i));
    jobs.push_back(wide);
    auto plain = model(config, false, 4096, 16, "cuda");
    const auto want = alone(*plain, jobs);
    auto engine = model(config, true, /*kv_tokens=*/16384, 16, "cuda");
    const auto got = together(*engine, jobs, 1);
    for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
    const lm::EngineStats s = engine->engine_stats();
    EXPECT_GT(s.paged_steps, 0);
    EXPECT_EQ(s.paged_steps, s.steps);

    auto options = test_options("cuda", 3);
    options.dtype = "bfloat16";
    options.batch_engine = true;
    options.kv_block = 16;
    auto paged = lm::random_language_model(config, options);
    options.paged_attention = false;
    auto gathered = lm::random_language_model(config, options);
    std::vector<Job> first_steps;
    for (const Job& j : jobs) first_steps.push_back({j.prompts, greedy(4)});
    const auto a = together(*paged, first_steps, 0), b = together(*gathered, first_steps, 0);
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_FALSE(a[i].empty() || b[i].empty()) << "job " << i;
      EXPECT_EQ(a[i][0].tokens.front(), b[i][0].tokens.front()) << "job " << i;
      EXPECT_LE(std::abs(a[i][0].logprobs.front() - b[i][0].logprobs.front()), 0.05) << "job " << i;
    }
    EXPECT_GT(paged->engine_stats().paged_steps, 0);
    EXPECT_EQ(gathered->engine_stats().paged_steps, 0);
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

// An idle engine gives its pool back to the driver, not only to torch's caching allocator, whose
// blocks the GPU's other processes cannot have (the sandbox's evaluations plan their memory with
// what the driver has free): release_cached_gpu_memory then finds little left to give. The pool
// comes back for the next calls, which still get what they get alone. A model destroyed leaves
// its memory cached in the process until release_cached_gpu_memory gives it back.
TEST(BatchEngineGpu, AnIdlePoolGoesBackToTheDriver) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kQwen2);
  // float32 keys and values: 2 layers x 2 heads x 16 x 2 x 4 bytes = 512 bytes a position, 512 MiB.
  const int64_t positions = int64_t{1} << 20;
  const int64_t pool_bytes =
      positions * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 * 4;
  std::vector<Job> jobs;
  for (uint64_t i = 0; i < 4; ++i)
    jobs.push_back({{test_tokens(20 + i, config.vocab_size, 80 + i)}, sampled(90 + i, 24)});
  auto plain = model(config, false, 4096, 16, "cuda");
  const auto want = alone(*plain, jobs);
  plain.reset();
  auto engine = model(config, true, positions, 16, "cuda");
  lm::release_cached_gpu_memory();  // what the models' making and the per-call path left
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto got = together(*engine, jobs, 0);
    for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
    if (round == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // the engine's idle_release_s: 2 s
      EXPECT_LT(lm::release_cached_gpu_memory(), pool_bytes / 4) << "the idle engine left its pool cached";
    }
  }
  engine.reset();  // within 2 s of its last call: its pool goes to the cache with it
  EXPECT_GE(lm::release_cached_gpu_memory(), pool_bytes);
  EXPECT_LT(lm::release_cached_gpu_memory(), pool_bytes / 4);
}

// The trainer's and eval's arrangement on a real GPU: the engine decodes under the GPU's quiet lock
// (its gate, sandbox::quiet_gate), calls arriving all the while, and an evaluation under the GPU's
// locks beside it gets its timed runs in between two engine steps: it passes without waiting long
// for the quiet lock, the engine goes on decoding while the evaluation runs, and after it.
TEST(BatchEngineGpu, ATimedEvaluationGetsInBetweenTheGatedEnginesSteps) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kQwen2);
  auto o = test_options("cuda", 3);
  o.batch_engine = true;
  o.kv_tokens = 8192;
  o.kv_block = 16;
  o.engine_gate = sandbox::quiet_gate(0, 600, "the test's engine");
  auto engine = lm::random_language_model(config, o);
  ASSERT_TRUE(engine->options().engine_gate != nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0};
  std::vector<std::thread> callers;
  for (uint64_t t = 0; t < 4; ++t)
    callers.emplace_back([&, t] {
      for (uint64_t k = 0; !stop; ++k) {
        const Job job{{test_tokens(24 + t, config.vocab_size, 90 + t + 8 * k)}, sampled(200 + t + 8 * k, 256)};
        engine->generate(job.prompts, job.options, {});
        ++calls;
      }
    });
  // Decoding before the evaluation starts.
  for (int i = 0; i < 500 && engine->engine_stats().steps < 50; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int64_t steps_before = engine->engine_stats().steps;
  ASSERT_GE(steps_before, 50) << "the engine did not decode";
  sandbox::SandboxOptions eval_options = fast_options();
  const nlohmann::json r = run_eval("tests/data/tasks/add/model.py", "tests/data/solutions/add_ok/model_new.py",
                                    sandbox::EvalMode::kEvaluate, eval_options, /*gpu_lock=*/true);
  const int64_t steps_during = engine->engine_stats().steps - steps_before;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t calls_after_eval = calls;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int64_t steps_after = engine->engine_stats().steps;
  stop = true;
  for (auto& t : callers) t.join();
  ASSERT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  const nlohmann::json phases = r.value("phase_seconds", nlohmann::json::object());
  ASSERT_TRUE(phases.contains("quiet_wait")) << phases.dump();
  EXPECT_LT(phases["quiet_wait"].get<double>(), 5.0) << phases.dump();
  EXPECT_GT(steps_during, 0) << "the engine stood still for the whole evaluation";
  EXPECT_GT(steps_after, steps_before + steps_during) << "the engine stopped after the evaluation";
  EXPECT_GT(calls.load(), calls_after_eval);
  std::cout << "engine steps during the evaluation: " << steps_during << "; phases: " << phases.dump() << "\n";
}

}  // namespace
}  // namespace cuda_agent::testing
