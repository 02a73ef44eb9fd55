// The batched generation engine (LmOptions::batch_engine) on the CPU with tiny random models:
// calls from many threads, joining and leaving mid-decode, give the tokens and log-probs each
// gets alone; prompts that share a beginning reuse its cached blocks; a pool that runs out makes
// calls wait (or sends one back to the queue) and corrupts nothing; calls that cannot fit fail
// with a message, and the engine goes on.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "cuda_agent/core/files.h"
#include "cuda_agent/core/subprocess.h"
#include "engine_test_util.h"

namespace cuda_agent::testing {
namespace {

class EngineFamilies : public ::testing::TestWithParam<TinyModel> {
 protected:
  void SetUp() override { use_built_lm_module(); }
};

TEST_P(EngineFamilies, EachCallGetsTheTokensItGetsAloneWhileOthersJoinAndLeave) {
  const auto& config = GetParam().config;
  const auto jobs = mixed_jobs(config.vocab_size);
  auto plain = model(config, false);
  const auto want = alone(*plain, jobs);
  auto engine = model(config, true);
  const auto got = together(*engine, jobs, 1);
  for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));

  const lm::EngineStats s = engine->engine_stats();
  int64_t tokens = 0;
  for (const auto& call : want)
    for (const auto& g : call) tokens += static_cast<int64_t>(g.tokens.size());
  EXPECT_EQ(s.decoded_tokens, tokens);
  EXPECT_GE(s.peak_rows, 5);           // the group's four rows beside the long call, at least
  EXPECT_LT(s.steps * 4, tokens * 3);  // many steps decoded several calls' sequences
  EXPECT_GT(s.reused_tokens, 0);       // the group's copies and the shared beginning
  EXPECT_EQ(s.preemptions, 0);
  EXPECT_EQ(plain->engine_stats().steps, 0);
  // The steps' wall time and, within it, the waits for the device's picks.
  EXPECT_GT(s.step_seconds, 0);
  EXPECT_GE(s.device_wait_seconds, 0);
  EXPECT_LE(s.device_wait_seconds, s.step_seconds);
}

INSTANTIATE_TEST_SUITE_P(Tiny, EngineFamilies, ::testing::ValuesIn(tiny_models()),
                         [](const auto& info) { return info.param.name; });

// The gate (LmOptions::engine_gate, the trainer's hold of the GPU's quiet lock) runs on the
// engine's thread: true before each round of work, false once the engine has none, never two
// falses in a row; it changes no token. A gate that blocks holds every call back (a timed run
// between two steps), and the calls go on after it.
TEST(BatchEngine, TheGateRunsOnTheEnginesThreadAroundItsWork) {
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kLlama);
  const auto jobs = mixed_jobs(config.vocab_size);
  auto plain = model(config, false);
  const auto want = alone(*plain, jobs);

  struct Seen {
    std::mutex mutex;
    std::vector<bool> calls;
    std::set<std::thread::id> threads;
  };
  auto seen = std::make_shared<Seen>();
  std::atomic<bool> hold{false};
  auto o = test_options("cpu", 3);
  o.batch_engine = true;
  o.kv_tokens = 4096;
  o.kv_block = 4;
  o.engine_gate = [seen, &hold](bool working) {
    while (working && hold) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(seen->mutex);
    seen->calls.push_back(working);
    seen->threads.insert(std::this_thread::get_id());
  };
  auto engine = lm::random_language_model(config, o);
  ASSERT_TRUE(engine->options().engine_gate != nullptr);
  const auto got = together(*engine, jobs, 1);
  for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
  // The engine has gone idle once the calls are back (false comes right after its last round).
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(seen->mutex);
      if (!seen->calls.empty() && !seen->calls.back()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(seen->mutex);
    ASSERT_FALSE(seen->calls.empty());
    EXPECT_TRUE(seen->calls.front());
    EXPECT_FALSE(seen->calls.back());
    const int64_t rounds = std::count(seen->calls.begin(), seen->calls.end(), true);
    EXPECT_GE(rounds, engine->engine_stats().steps);
    for (size_t i = 1; i < seen->calls.size(); ++i)
      EXPECT_FALSE(!seen->calls[i] && !seen->calls[i - 1]) << "two falses in a row at " << i;
    ASSERT_EQ(seen->threads.size(), 1u);
    EXPECT_NE(*seen->threads.begin(), std::this_thread::get_id());
  }

  // A gate that holds the engine back: a call waits for it and then gets its tokens.
  hold = true;
  std::vector<Generation> late;
  std::thread caller([&] { late = engine->generate(jobs[0].prompts, jobs[0].options, stopper(jobs[0])); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(late.empty()) << "the engine decoded while its gate held it";
  hold = false;
  caller.join();
  expect_same(late, want[0], "the call held at the gate");

  // Without the engine (dynamic RoPE decodes each call alone) the options say so: no gate.
  auto dynamic = config;
  dynamic.rope_scaling.type = "dynamic";
  dynamic.rope_scaling.factor = 2.0;
  auto alone_model = lm::random_language_model(dynamic, o);
  EXPECT_FALSE(alone_model->options().batch_engine);
  EXPECT_TRUE(alone_model->options().engine_gate == nullptr);
}

// An episode's next turn starts with its previous prompt and reply: those blocks are reused.
TEST(BatchEngine, ANextTurnReusesThePreviousTurnsBlocks) {
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kQwen2);
  auto plain = model(config, false);
  auto engine = model(config, true);
  const auto first = test_tokens(40, config.vocab_size, 21);
  const auto reply = engine->generate({first}, sampled(1, 20))[0];
  expect_same({reply}, plain->generate({first}, sampled(1, 20)), "first turn");
  auto next = first;
  next.insert(next.end(), reply.tokens.begin(), reply.tokens.end());
  const auto observation = test_tokens(9, config.vocab_size, 22);
  next.insert(next.end(), observation.begin(), observation.end());
  const int64_t reused = engine->engine_stats().reused_tokens;
  expect_same(engine->generate({next}, sampled(2, 10)), plain->generate({next}, sampled(2, 10)), "second turn");
  // Every full block of the first turn's prompt and reply (all but the last token of the reply:
  // its keys were never computed).
  const int64_t known = static_cast<int64_t>(first.size() + reply.tokens.size()) - 1;
  EXPECT_GE(engine->engine_stats().reused_tokens - reused, known / 4 * 4);
}

// A PPO group's copies of one prompt in one call are prefilled together: the first copy fills the
// prompt's full blocks, the others wait a wave and reuse them; prompts of other lengths share the
// batched forward (padded). Every row still gets what it gets alone.
TEST(BatchEngine, CopiesOfOnePromptArePrefilledOnce) {
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kLlama);
  auto plain = model(config, false);
  auto engine = model(config, true);
  const auto prompt = test_tokens(40, config.vocab_size, 5);
  const std::vector<std::vector<int64_t>> group(4, prompt);
  expect_same(engine->generate(group, sampled(7, 6)), plain->generate(group, sampled(7, 6)), "group");
  const lm::EngineStats s = engine->engine_stats();
  // 39 positions to fill (the last token is fed at the first step); 9 full blocks of 4.
  EXPECT_EQ(s.prefilled_tokens, 39 + 3 * 3);
  EXPECT_EQ(s.reused_tokens, 3 * 36);
  const std::vector<std::vector<int64_t>> mixed = {test_tokens(3, config.vocab_size, 6),
                                                   test_tokens(70, config.vocab_size, 7), prompt,
                                                   test_tokens(17, config.vocab_size, 8)};
  expect_same(engine->generate(mixed, sampled(8, 9)), plain->generate(mixed, sampled(8, 9)), "mixed lengths");
}

// A pool of 16 blocks of 4 positions for calls that need 10 blocks each: they wait or go back to
// the queue, and every one still gets what it gets alone.
TEST(BatchEngine, APoolThatRunsOutMakesCallsWaitAndCorruptsNothing) {
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kLlama);
  std::vector<Job> jobs;
  for (uint64_t i = 0; i < 5; ++i) jobs.push_back({{test_tokens(10, config.vocab_size, 30 + i)}, sampled(40 + i, 30)});
  auto plain = model(config, false);
  const auto want = alone(*plain, jobs);
  auto engine = model(config, true, /*kv_tokens=*/64, /*block=*/4);
  const auto got = together(*engine, jobs, 1);
  for (size_t i = 0; i < jobs.size(); ++i) expect_same(got[i], want[i], "job " + std::to_string(i));
  const lm::EngineStats s = engine->engine_stats();
  EXPECT_EQ(s.blocks, 16);
  EXPECT_LE(s.peak_blocks, 16);
  EXPECT_GT(s.waits + s.preemptions, 0);
}

TEST(BatchEngine, CallsThatCannotFitFailAndTheEngineGoesOn) {
  use_built_lm_module();
  const auto config = tiny_config(policy::Family::kLlama);
  auto engine = model(config, true, /*kv_tokens=*/64, /*block=*/4);
  std::vector<Job> jobs = {{{test_tokens(80, config.vocab_size, 1)}, sampled(1, 4)},    // longer than the pool
                           {{test_tokens(10, config.vocab_size, 2)}, sampled(2, 100)},  // outgrows it
                           {{test_tokens(10, config.vocab_size, 3)}, sampled(3, 12)}};
  std::vector<std::string> errors;
  together(*engine, {jobs[0]}, 0, &errors);
  EXPECT_NE(errors[0].find("raise the model's kv_tokens or shorten the prompts"), std::string::npos) << errors[0];
  together(*engine, {jobs[1]}, 0, &errors);
  EXPECT_NE(errors[0].find("outgrew the batch engine's KV pool (64 positions)"), std::string::npos) << errors[0];
  auto plain = model(config, false);
  expect_same(engine->generate(jobs[2].prompts, jobs[2].options), plain->generate(jobs[2].prompts, jobs[2].options),
              "after the failures");
  EXPECT_NE(error_of([&] { engine->generate({{}}, sampled(1, 4)); }).find("prompt 0 is empty"), std::string::npos);
  // More rows than one step takes (256) still run, alone.
  auto wide = model(config, true, /*kv_tokens=*/4096, /*block=*/4);
  const auto rows =
      wide->generate(std::vector<std::vector<int64_t>>(300, test_tokens(3, config.vocab_size, 9)), sampled(4, 2));
  ASSERT_EQ(rows.size(), 300u);
  EXPECT_EQ(rows[299].tokens.size(), 2u);
}

// ca-lm-bench's rollout section (issue 19's figure on the GPU) on a tiny model: every turn makes
// its tokens through both paths.
// Without CUDA there is nothing cached on a GPU to give back, and asking is harmless
// (BatchEngineGpu.AnIdlePoolGoesBackToTheDriver on a GPU).
TEST(BatchEngine, ReleasingCachedGpuMemoryWithoutCudaGivesBackNothing) {
  use_built_lm_module();
  auto m = model(tiny_config(policy::Family::kLlama), true);
  (void)m->generate({test_tokens(12, 256)}, sampled(3, 8), {});
  EXPECT_EQ(lm::release_cached_gpu_memory(), 0);
}

TEST(BatchEngine, TheRolloutBenchmarkRunsBothPaths) {
  use_built_lm_module();
  const nlohmann::json spec = {
      {"device", "cpu"},
      {"dtype", "float32"},
      {"config", tiny_config(policy::Family::kLlama).to_hf_json()},
      {"rollout", {{"concurrent", {1, 4}}, {"prompt_tokens", 40}, {"new_tokens", 6}, {"kv_tokens", 1024}}}};
  const nlohmann::json out = lm::run_language_model_benchmark(spec);
  ASSERT_EQ(out["rollout"].size(), 2u) << out.dump(2);
  for (const auto& row : out["rollout"]) {
    EXPECT_GT(row["per_call_tokens_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["engine_tokens_per_s"].get<double>(), 0) << row;
    // The engine decoded them (how many steps together depends on when the threads arrived).
    EXPECT_GE(row["engine_steps"].get<int64_t>(), 6) << row;
    EXPECT_LE(row["engine_steps"].get<int64_t>(), 6 * row["concurrent"].get<int64_t>()) << row;
    // Every timed prompt is new to the engine: none of its prefill comes from the prefix cache
    // (a row's prompts once repeated the row before's).
    EXPECT_EQ(row["engine_reused_tokens"].get<int64_t>(), 0) << row;
  }
  // per_call_max 0: the engine alone; gathered_too: the engine again without the paged kernel
  // (on the CPU neither engine has it: no step went through it).
  nlohmann::json engine_only = spec;
  engine_only["rollout"]["concurrent"] = {2};
  engine_only["rollout"]["per_call_max"] = 0;
  engine_only["rollout"]["gathered_too"] = true;
  const nlohmann::json alone = lm::run_language_model_benchmark(engine_only);
  ASSERT_EQ(alone["rollout"].size(), 1u) << alone.dump(2);
  EXPECT_FALSE(alone["rollout"][0].contains("per_call_tokens_per_s")) << alone.dump(2);
  EXPECT_GT(alone["rollout"][0]["engine_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(alone["rollout"][0]["gathered_tokens_per_s"].get<double>(), 0) << alone.dump(2);
  EXPECT_EQ(alone["rollout"][0]["engine_paged_steps"].get<int64_t>(), 0) << alone.dump(2);
}

// ca-lm-bench as users run it: its own process, its own copy of the logging code beside the
// module's (it does not export its symbols), debug messages on the way. The module's forwarding
// logger once sat in spdlog's shared registry, where the binary found it and forwarded each
// message back to itself: a deadlock before the first figure.
TEST(BatchEngine, TheBenchmarkToolRunsInItsOwnProcess) {
#ifndef CA_LM_BENCH_BINARY
  GTEST_SKIP() << "ca-lm-bench is not built here (no libtorch)";
#else
  TempDir dir("ca-lm-bench-");
  const nlohmann::json spec = {
      {"device", "cpu"},
      {"dtype", "float32"},
      {"config", tiny_config(policy::Family::kLlama).to_hf_json()},
      {"rollout", {{"concurrent", {2}}, {"prompt_tokens", 9}, {"new_tokens", 4}, {"kv_tokens", 1024}}}};
  write_file_atomic(dir.path() / "spec.json", spec.dump());
  SubprocessOptions o;
  o.argv = {CA_LM_BENCH_BINARY, (dir.path() / "spec.json").string()};
  o.stdout_path = (dir.path() / "out.json").string();
  o.stderr_path = (dir.path() / "err.txt").string();
  o.timeout_s = 120;
  const SubprocessResult r = run_subprocess(o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << read_file(dir.path() / "err.txt");
  const nlohmann::json out = nlohmann::json::parse(read_file(dir.path() / "out.json"));
  ASSERT_EQ(out["rollout"].size(), 1u) << out.dump(2);
  EXPECT_GT(out["rollout"][0]["engine_tokens_per_s"].get<double>(), 0);
  EXPECT_NE(read_file(dir.path() / "err.txt").find("[rollout]"), std::string::npos);
#endif
}

}  // namespace
}  // namespace cuda_agent::testing
