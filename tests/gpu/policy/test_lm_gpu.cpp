// The libtorch language model on a CUDA device: against Hugging Face transformers on the same
// GPU, against itself on the CPU, the KV cache and batching there, bfloat16, and a throughput
// figure. Every test skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "../../cpu/policy/lm_test_util.h"
#include "../gpu_test_util.h"

namespace cuda_agent::testing {
namespace {

lm::SamplingOptions greedy(int64_t n) {
  lm::SamplingOptions s;
  s.greedy = true;
  s.max_new_tokens = n;
  return s;
}

TEST(LmGpu, MatchesTransformersOnCuda) {
  CA_REQUIRE_GPU();
  const std::string why = transformers_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  auto models = tiny_models();
  for (auto& m : rope_variants()) models.push_back(m);
  expect_matches_transformers(models, "cuda");
}

TEST(LmGpu, CudaMatchesCpuAndCacheMatchesRecompute) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  for (const auto& m : tiny_models()) {
    SCOPED_TRACE(m.name);
    auto cpu = lm::random_language_model(m.config, test_options("cpu"));
    auto gpu = lm::random_language_model(m.config, test_options("cuda"));  // same seed: same weights
    const auto tokens = test_tokens(33, 256);
    const auto full = gpu->logits(tokens);
    EXPECT_LT(max_abs_diff(full, cpu->logits(tokens)), 1e-4);
    EXPECT_LT(max_abs_diff(gpu->logits_with_cache(tokens, 9), full), 1e-4);
    const std::vector<std::vector<int64_t>> prompts = {{tokens.begin(), tokens.begin() + 4},
                                                       {tokens.begin() + 4, tokens.begin() + 15}};
    const auto batched = gpu->generate(prompts, greedy(20));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = gpu->generate({prompts[i]}, greedy(20))[0];
      EXPECT_EQ(batched[i].tokens, alone.tokens);
      EXPECT_LT(max_abs_diff(batched[i].logprobs, alone.logprobs), 1e-4);
    }
    // Seeded sampling draws its randomness on the CPU: the same tokens on both devices (the
    // probabilities differ only by rounding).
    lm::SamplingOptions s;
    s.max_new_tokens = 16;
    s.seed = 4;
    EXPECT_EQ(gpu->generate(prompts, s)[0].tokens, cpu->generate(prompts, s)[0].tokens);
  }
}

// Decoding replayed from CUDA graphs gives what eager decoding gives: batched rows with left
// padding, 300 new tokens (two 256-position buckets, so two captures), a row that stops early
// while the others go on, and seeded sampling.
TEST(LmGpu, CudaGraphDecodingMatchesEagerDecoding) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  for (const auto& m : tiny_models()) {
    SCOPED_TRACE(m.name);
    auto gpu = lm::random_language_model(m.config, test_options("cuda"));
    const auto tokens = test_tokens(40, 256);
    const std::vector<std::vector<int64_t>> prompts = {{tokens.begin(), tokens.begin() + 5},
                                                       {tokens.begin() + 5, tokens.begin() + 40},
                                                       {tokens.begin() + 2, tokens.begin() + 9}};
    auto eager = greedy(300), graphs = greedy(300);
    eager.cuda_graphs = false;
    const auto compare = [&](const char* what) {
      SCOPED_TRACE(what);
      const auto a = gpu->generate(prompts, eager), b = gpu->generate(prompts, graphs);
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << "row " << i;
        EXPECT_EQ(a[i].finish_reason, b[i].finish_reason) << "row " << i;
        if (a[i].logprobs.size() == b[i].logprobs.size()) {
          EXPECT_LT(max_abs_diff(a[i].logprobs, b[i].logprobs), 1e-4) << "row " << i;
        }
      }
      return a;
    };
    const auto plain = compare("greedy, 300 tokens");
    eager.stop_token_ids = graphs.stop_token_ids = {plain[1].tokens[9]};
    const auto stopped = compare("row 1 stops at its 10th token");
    EXPECT_EQ(stopped[1].finish_reason, "stop");
    EXPECT_LE(stopped[1].tokens.size(), 10u);
    // Rows stop at different steps: the sampler must draw the same numbers for the same rows.
    eager.greedy = graphs.greedy = false;
    eager.seed = graphs.seed = 11;
    eager.top_k = graphs.top_k = 20;
    compare("seeded sampling, top-k 20, a stop token");
  }
}

// Three threads of one process decode from CUDA graphs at once, two of them from one model, while
// a fourth builds models, as `cuda-agent eval` runs one episode per GPU in threads and the trainer
// runs concurrent episodes on one model: a capture must not make the other threads' CUDA calls
// fail (it did in global capture mode), and each thread's tokens are what it gets alone.
TEST(LmGpu, CudaGraphDecodingInThreadsBesideModelLoads) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  const auto config = tiny_models()[0].config;
  auto a = lm::random_language_model(config, test_options("cuda"));
  auto b = lm::random_language_model(config, test_options("cuda"));
  const auto tokens = test_tokens(40, 256);
  const std::vector<std::vector<int64_t>> prompts = {{tokens.begin(), tokens.begin() + 7},
                                                     {tokens.begin() + 7, tokens.begin() + 30}};
  const auto alone_a = a->generate(prompts, greedy(400)), alone_b = b->generate({prompts[1]}, greedy(400));
  const auto alone_a1 = a->generate({prompts[1]}, greedy(400));
  std::vector<lm::Generation> got_a, got_a1, got_b;
  std::string errors;
  std::mutex m;
  const auto guarded = [&](const std::function<void()>& f) {
    return [&, f] {
      try {
        f();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        errors += std::string(e.what()) + "\n";
      }
    };
  };
  std::thread ta(guarded([&] { got_a = a->generate(prompts, greedy(400)); }));
  std::thread ta1(guarded([&] { got_a1 = a->generate({prompts[1]}, greedy(400)); }));  // one model, two threads
  std::thread tb(guarded([&] { got_b = b->generate({prompts[1]}, greedy(400)); }));
  std::thread loads(guarded([&] {
    for (int i = 0; i < 5; ++i) lm::random_language_model(config, test_options("cuda"))->logits(tokens);
  }));
  ta.join();
  ta1.join();
  tb.join();
  loads.join();
  ASSERT_TRUE(errors.empty()) << errors;
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got_a[i].tokens, alone_a[i].tokens) << "row " << i;
  EXPECT_EQ(got_a1[0].tokens, alone_a1[0].tokens);
  EXPECT_EQ(got_b[0].tokens, alone_b[0].tokens);
}

TEST(LmGpu, Bfloat16RunsAndRoundTrips) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  const auto config = tiny_models()[3].config;
  auto o = test_options("cuda");
  o.dtype = "bfloat16";
  o.value_head = true;
  auto bf16 = lm::random_language_model(config, o);
  auto f32 = lm::random_language_model(config, test_options("cuda"));
  const auto tokens = test_tokens(24, 256);
  const auto a = f32->logits(tokens), b = bf16->logits(tokens);
  double scale = 0;
  for (float v : a) scale = std::max<double>(scale, std::fabs(v));
  EXPECT_LT(max_abs_diff(a, b), 0.1 * scale);
  TempDir dir("ca-lm-gpu-bf16-");
  bf16->save_hf(dir.path() / "m");
  auto loaded = lm::load_language_model(dir.path() / "m", o);
  EXPECT_EQ(loaded->logits(tokens), b);
  EXPECT_EQ(loaded->forward_for_training({tokens}, {})[0].values, bf16->forward_for_training({tokens}, {})[0].values);
}

// Not a benchmark with a pass mark: prints decode throughput of a ~0.5B-parameter random model,
// so regressions are visible in the log.
TEST(LmGpu, GenerationThroughput) {
  CA_REQUIRE_GPU();
  use_built_lm_module();
  auto c = tiny_config(policy::Family::kQwen3);
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1000000.0;
  auto o = test_options("cuda");
  o.dtype = "bfloat16";
  o.init_std = 0.02;
  auto model = lm::random_language_model(c, o);
  std::vector<std::vector<int64_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(test_tokens(200 + 16 * i, c.vocab_size, 50 + i));
  lm::SamplingOptions s;
  s.max_new_tokens = 256;
  s.seed = 1;
  model->generate({prompts[0]}, greedy(8));  // warm-up: kernels, allocator
  const auto start = std::chrono::steady_clock::now();
  const auto out = model->generate(prompts, s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t produced = 0;
  for (const auto& g : out) produced += static_cast<int64_t>(g.tokens.size());
  EXPECT_EQ(produced, 16 * 256);
  std::printf("  qwen3-0.6B-shaped bf16, 16 prompts x 256 new tokens: %.2f s, %.0f tokens/s\n", seconds,
              static_cast<double>(produced) / seconds);
}

}  // namespace
}  // namespace cuda_agent::testing
