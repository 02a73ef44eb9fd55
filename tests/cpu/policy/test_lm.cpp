// The libtorch language model through its dlopen'd module, on the CPU with tiny random models:
// the KV cache against full recomputation, batched against single generation, sampling
// determinism, the training forward against logits, save/load, GGUF loading, checkpointing, bad
// inputs, and the logits and greedy tokens of Hugging Face transformers.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>

#include "../test_util.h"
#include "cuda_agent/core/log.h"
#include "cuda_agent/policy/weights.h"
#include "lm_test_util.h"

namespace cuda_agent::testing {
namespace {

using lm::Generation;
using lm::SamplingOptions;

class LmFamilies : public ::testing::TestWithParam<TinyModel> {
 protected:
  void SetUp() override { use_built_lm_module(); }
  std::unique_ptr<lm::LanguageModel> make(uint64_t seed = 1, bool value_head = false) {
    auto o = test_options("cpu", seed);
    o.value_head = value_head;
    return lm::random_language_model(GetParam().config, o);
  }
};

SamplingOptions greedy(int64_t n) {
  SamplingOptions s;
  s.greedy = true;
  s.max_new_tokens = n;
  return s;
}

TEST_P(LmFamilies, KvCacheDecodingEqualsFullRecompute) {
  auto model = make();
  const auto tokens = test_tokens(20, 256);
  const auto full = model->logits(tokens);
  ASSERT_EQ(full.size(), 20u * 256u);
  for (int64_t prefill : {1, 7, 20}) EXPECT_LT(max_abs_diff(model->logits_with_cache(tokens, prefill), full), 1e-4);
}

TEST_P(LmFamilies, BatchedGenerationEqualsEachPromptAlone) {
  auto model = make();
  const auto all = test_tokens(40, 256, 3);
  // Different lengths (left padding inside the batch), and a repeated prompt (shared prefill).
  std::vector<std::vector<int64_t>> prompts = {{all.begin(), all.begin() + 3},
                                               {all.begin() + 3, all.begin() + 12},
                                               {all.begin() + 12, all.begin() + 17},
                                               {all.begin() + 3, all.begin() + 12}};
  const auto batched = model->generate(prompts, greedy(12));
  ASSERT_EQ(batched.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const auto alone = model->generate({prompts[i]}, greedy(12))[0];
    EXPECT_EQ(batched[i].tokens, alone.tokens);
    EXPECT_LT(max_abs_diff(batched[i].logprobs, alone.logprobs), 1e-4);
    EXPECT_EQ(batched[i].finish_reason, "length");
    ASSERT_EQ(batched[i].tokens.size(), 12u);
    // Each returned log-prob is log_softmax of a full forward over prompt + generated tokens.
    auto seq = prompts[i];
    seq.insert(seq.end(), batched[i].tokens.begin(), batched[i].tokens.end());
    const auto logits = model->logits(seq);
    for (size_t t = 0; t < 12; ++t) {
      const int64_t row = static_cast<int64_t>(prompts[i].size() + t) - 1;
      EXPECT_NEAR(batched[i].logprobs[t], log_softmax_at(logits, 256, row, batched[i].tokens[t]), 1e-4);
      // Greedy: the chosen token is the argmax of the full forward's logits.
      const float* r = logits.data() + row * 256;
      EXPECT_EQ(batched[i].tokens[t], std::max_element(r, r + 256) - r);
    }
  }
}

TEST_P(LmFamilies, TrainingForwardMatchesLogits) {
  auto model = make(1, /*value_head=*/true);
  const std::vector<std::vector<int64_t>> seqs = {test_tokens(11, 256, 5), test_tokens(6, 256, 6)};
  std::vector<std::vector<uint8_t>> masks = {std::vector<uint8_t>(11, 1), {0, 0, 1, 1, 0, 1}};
  masks[0][4] = 0;
  const auto out = model->forward_for_training(seqs, masks);
  ASSERT_EQ(out.size(), 2u);
  for (size_t i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    const auto logits = model->logits(seqs[i]);
    ASSERT_EQ(out[i].logprobs.size(), seqs[i].size());
    ASSERT_EQ(out[i].values.size(), seqs[i].size());
    EXPECT_EQ(out[i].logprobs[0], 0.0f);
    for (size_t t = 0; t < seqs[i].size(); ++t) {
      if (masks[i][t] == 0 || t == 0) {
        EXPECT_EQ(out[i].logprobs[t], 0.0f);
        EXPECT_EQ(out[i].entropy[t], 0.0f);
        EXPECT_EQ(out[i].values[t], 0.0f);
        continue;
      }
      const int64_t row = static_cast<int64_t>(t) - 1;
      EXPECT_NEAR(out[i].logprobs[t], log_softmax_at(logits, 256, row, seqs[i][t]), 1e-4);
      EXPECT_NEAR(out[i].entropy[t], entropy_of(logits, 256, row), 1e-4);
      EXPECT_TRUE(std::isfinite(out[i].values[t]));
    }
  }
  // A sequence's values and log-probs do not depend on the batch it is in (right padding).
  const auto alone = model->forward_for_training({seqs[1]}, {masks[1]});
  EXPECT_LT(max_abs_diff(alone[0].values, out[1].values), 1e-5);
  EXPECT_LT(max_abs_diff(alone[0].logprobs, out[1].logprobs), 1e-5);
  // Without masks every position but the first is filled; values are absent without a head.
  const auto plain = make()->forward_for_training({seqs[0]}, {});
  EXPECT_TRUE(plain[0].values.empty());
  EXPECT_NE(plain[0].logprobs[4], 0.0f);
}

TEST_P(LmFamilies, SaveHfThenLoadGivesIdenticalLogits) {
  auto model = make(9, /*value_head=*/true);
  TempDir dir("ca-lm-save-");
  model->save_hf(dir.path() / "m");
  auto o = test_options();
  o.value_head = true;
  auto loaded = lm::load_language_model(dir.path() / "m", o);
  const auto tokens = test_tokens(17, 256);
  EXPECT_EQ(loaded->logits(tokens), model->logits(tokens));
  EXPECT_EQ(loaded->config().family, GetParam().config.family);
  EXPECT_EQ(loaded->config().tie_word_embeddings, GetParam().config.tie_word_embeddings);
  const auto a = model->forward_for_training({tokens}, {}), b = loaded->forward_for_training({tokens}, {});
  EXPECT_EQ(a[0].values, b[0].values);
  // The file is what transformers reads: the weight reader of policy/weights.h agrees on names.
  auto w = policy::load_model_weights(dir.path() / "m");
  EXPECT_FALSE(w.file->has("value_head.weight"));
}

INSTANTIATE_TEST_SUITE_P(Lm, LmFamilies, ::testing::ValuesIn(tiny_models()),
                         [](const auto& info) { return info.param.name; });

class LmSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    use_built_lm_module();
    model_ = lm::random_language_model(tiny_models()[3].config, test_options());
  }
  std::unique_ptr<lm::LanguageModel> model_;
  std::vector<std::vector<int64_t>> prompts_ = {{1, 2, 3}, {7, 8, 9, 10, 11}};
};

TEST_F(LmSampling, FixedSeedIsDeterministicAndSeedsDiffer) {
  SamplingOptions s;
  s.temperature = 0.9;
  s.top_p = 0.95;
  s.top_k = 100;
  s.max_new_tokens = 24;
  s.seed = 11;
  const auto a = model_->generate(prompts_, s), b = model_->generate(prompts_, s);
  s.seed = 12;
  const auto c = model_->generate(prompts_, s);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].logprobs, b[i].logprobs);
  }
  EXPECT_TRUE(a[0].tokens != c[0].tokens || a[1].tokens != c[1].tokens);
  // Sampling at temperature 1 without filters is not greedy: some token is not the argmax.
  SamplingOptions plain;
  plain.max_new_tokens = 24;
  const auto sampled = model_->generate({prompts_[0]}, plain)[0];
  EXPECT_NE(sampled.tokens, model_->generate({prompts_[0]}, greedy(24))[0].tokens);
}

TEST_F(LmSampling, TopK1AndTemperatureZeroEqualGreedy) {
  const auto g = model_->generate(prompts_, greedy(16));
  SamplingOptions k1;
  k1.top_k = 1;
  k1.temperature = 1.3;
  k1.max_new_tokens = 16;
  k1.seed = 5;
  SamplingOptions t0;
  t0.temperature = 0;
  t0.max_new_tokens = 16;
  const auto a = model_->generate(prompts_, k1), b = model_->generate(prompts_, t0);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ(a[i].tokens, g[i].tokens);
    EXPECT_EQ(b[i].tokens, g[i].tokens);
    // Log-probs are those of the unmodified distribution, whatever the sampling settings.
    EXPECT_LT(max_abs_diff(a[i].logprobs, g[i].logprobs), 1e-6);
  }
}

TEST_F(LmSampling, TopPKeepsOnlyTheNucleus) {
  // With a tiny top_p only the most likely token survives: greedy again.
  SamplingOptions s;
  s.top_p = 1e-6;
  s.max_new_tokens = 10;
  s.seed = 3;
  EXPECT_EQ(model_->generate(prompts_, s)[1].tokens, model_->generate(prompts_, greedy(10))[1].tokens);
}

TEST_F(LmSampling, StopTokensCallbackAndLength) {
  const auto g = model_->generate({prompts_[0]}, greedy(10))[0];
  ASSERT_EQ(g.tokens.size(), 10u);
  SamplingOptions s = greedy(10);
  s.stop_token_ids = {g.tokens[3]};
  const auto stopped = model_->generate({prompts_[0]}, s)[0];
  const size_t first = std::find(g.tokens.begin(), g.tokens.end(), g.tokens[3]) - g.tokens.begin();
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.tokens, std::vector<int64_t>(g.tokens.begin(), g.tokens.begin() + first + 1));

  std::vector<std::pair<size_t, int64_t>> seen;
  int second_prompt_tokens = 0;
  const auto called = model_->generate(prompts_, greedy(10), [&](size_t seq, int64_t token) {
    seen.emplace_back(seq, token);
    return !(seq == 1 && ++second_prompt_tokens == 2);  // stop prompt 1 after its second token
  });
  EXPECT_EQ(called[0].finish_reason, "length");
  EXPECT_EQ(called[0].tokens.size(), 10u);
  EXPECT_EQ(called[1].finish_reason, "callback");
  EXPECT_EQ(called[1].tokens.size(), 2u);
  EXPECT_EQ(seen.size(), 12u);

  const auto none = model_->generate(prompts_, greedy(0));
  EXPECT_TRUE(none[0].tokens.empty());
  EXPECT_EQ(none[0].finish_reason, "length");
  EXPECT_TRUE(model_->generate({}, greedy(5)).empty());
}

TEST(LmErrors, BadInputsSayWhatIsWrong) {
  use_built_lm_module();
  const auto config = tiny_models()[0].config;
  auto model = lm::random_language_model(config, test_options());
  EXPECT_NE(error_message([&] { model->logits({1, 256}); }).find("token 256 at position 1"), std::string::npos);
  EXPECT_NE(error_message([&] { model->generate({{1}, {-3}}, greedy(2)); }).find("prompt 1"), std::string::npos);
  EXPECT_NE(error_message([&] { model->generate({{1}, {}}, greedy(2)); }).find("prompt 1 is empty"),
            std::string::npos);
  EXPECT_NE(error_message([&] { model->forward_for_training({{1, 2, 3}}, {{1, 1}}); }).find("loss mask 0"),
            std::string::npos);
  SamplingOptions bad;
  bad.temperature = -1;
  EXPECT_NE(error_message([&] { model->generate({{1}}, bad); }).find("temperature"), std::string::npos);
  bad = SamplingOptions();
  bad.top_p = 0;
  EXPECT_NE(error_message([&] { model->generate({{1}}, bad); }).find("top_p"), std::string::npos);
  EXPECT_NE(error_message([&] { model->logits_with_cache({1, 2}, 3); }).find("prefill 3"), std::string::npos);

  auto o = test_options("tpu");
  EXPECT_NE(error_message([&] { lm::random_language_model(config, o); }).find("unknown device 'tpu'"),
            std::string::npos);
  o = test_options("cpu");
  o.dtype = "float64";
  EXPECT_NE(error_message([&] { lm::random_language_model(config, o); }).find("unknown dtype 'float64'"),
            std::string::npos);
  auto bad_shape = config;
  bad_shape.num_key_value_heads = 3;
  EXPECT_NE(error_message([&] { lm::random_language_model(bad_shape, test_options()); }).find("num_key_value_heads"),
            std::string::npos);
  EXPECT_NE(
      error_message([&] { lm::load_language_model("/nonexistent/model", test_options()); }).find("/nonexistent/model"),
      std::string::npos);
}

// The module's messages come out of this binary's loggers, at this binary's level.
TEST(LmLog, TheModuleLogsThroughTheBinarysLoggers) {
  use_built_lm_module();
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_pattern("%n %l %v");
  std::shared_ptr<spdlog::logger> lm_logger = logger("lm");
  lm_logger->sinks().push_back(sink);
  set_log_level("debug");
  (void)lm::random_language_model(tiny_models()[0].config, test_options());
  set_log_level("info");
  (void)lm::random_language_model(tiny_models()[0].config, test_options());
  lm_logger->sinks().pop_back();
  const std::string text = out.str();
  EXPECT_NE(text.find("lm debug random model: "), std::string::npos) << text;
  EXPECT_EQ(text.find("random model"), text.rfind("random model")) << "one message, at debug only: " << text;
}

TEST(LmErrors, CudaWithoutGpuIsRefused) {
  use_built_lm_module();
  try {
    lm::random_language_model(tiny_models()[0].config, test_options("cuda"));
    GTEST_SKIP() << "this machine has a CUDA GPU; the refusal is for machines without one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA GPU"), std::string::npos) << e.what();
  }
}

TEST(LmErrors, LoadingRejectsWrongShapes) {
  use_built_lm_module();
  TempDir dir("ca-lm-bad-");
  auto config = tiny_models()[2].config;
  lm::random_language_model(config, test_options())->save_hf(dir.path() / "m");
  // The config now claims a wider MLP than the weights have.
  auto wrong = config;
  wrong.intermediate_size = 96;
  write_file_atomic(dir.path() / "m" / "config.json", wrong.to_hf_json().dump());
  const auto message = error_message([&] { lm::load_language_model(dir.path() / "m", test_options()); });
  EXPECT_NE(message.find("mlp"), std::string::npos) << message;
}

TEST(LmLoad, ReadsTransformers5RopeParameters) {
  use_built_lm_module();
  for (size_t which : {size_t{1}, size_t{2}}) {  // llama3 scaling; qwen2 with rope_theta 1e6
    SCOPED_TRACE(tiny_models()[which].name);
    auto model = lm::random_language_model(tiny_models()[which].config, test_options());
    TempDir dir("ca-lm-rope-params-");
    model->save_hf(dir.path() / "m");
    // transformers 5 keeps rope_theta and the scaling together under "rope_parameters".
    auto j = nlohmann::json::parse(read_file(dir.path() / "m" / "config.json"));
    nlohmann::json rope = j.contains("rope_scaling") ? j["rope_scaling"] : nlohmann::json{{"rope_type", "default"}};
    rope["rope_theta"] = j["rope_theta"];
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = rope;
    write_file_atomic(dir.path() / "m" / "config.json", j.dump());
    const auto tokens = test_tokens(30, 256);
    EXPECT_EQ(lm::load_language_model(dir.path() / "m", test_options())->logits(tokens), model->logits(tokens));
  }
}

TEST(LmBf16, CloseToFloat32AndRoundTrips) {
  use_built_lm_module();
  auto config = tiny_models()[3].config;
  auto f32 = lm::random_language_model(config, test_options());
  auto o = test_options();
  o.dtype = "bfloat16";
  auto bf16 = lm::random_language_model(config, o);
  const auto tokens = test_tokens(16, 256);
  const auto a = f32->logits(tokens), b = bf16->logits(tokens);
  double scale = 0;
  for (float v : a) scale = std::max<double>(scale, std::fabs(v));
  EXPECT_LT(max_abs_diff(a, b), 0.1 * scale);  // bf16 keeps 8 bits of mantissa
  EXPECT_GT(max_abs_diff(a, b), 0.0);          // and it really ran in bf16
  TempDir dir("ca-lm-bf16-");
  bf16->save_hf(dir.path() / "m");
  EXPECT_EQ(lm::load_language_model(dir.path() / "m", o)->logits(tokens), b);
  const auto gen = bf16->generate({{1, 2, 3}}, greedy(8));
  EXPECT_EQ(gen[0].tokens.size(), 8u);
}

TEST(LmGguf, LoadsTheSameModelAsTheHfFolder) {
  use_built_lm_module();
  for (size_t which : {size_t{0}, size_t{3}}) {  // llama (RoPE rows permuted in GGUF), qwen3
    const auto config = tiny_models()[which].config;
    SCOPED_TRACE(tiny_models()[which].name);
    auto model = lm::random_language_model(config, test_options());
    TempDir dir("ca-lm-gguf-");
    model->save_hf(dir.path() / "m");
    auto w = policy::load_model_weights(dir.path() / "m");
    std::vector<policy::NamedTensor> tensors;
    for (const auto& t : w.file->tensors()) tensors.push_back({t.name, t.shape, w.file->read_f32(t.name)});
    policy::write_model_gguf(dir.path() / "m.gguf", config, tensors, policy::WeightType::F32);
    auto from_gguf = lm::load_language_model(dir.path() / "m.gguf", test_options());
    const auto tokens = test_tokens(12, 256);
    EXPECT_LT(max_abs_diff(from_gguf->logits(tokens), model->logits(tokens)), 1e-5);
  }
}

TEST(LmCheckpointing, RecomputedLayersGiveTheSameGradients) {
  use_built_lm_module();
  for (const auto& m : tiny_models()) {
    SCOPED_TRACE(m.name);
    EXPECT_LT(lm::checkpointing_gradient_difference(m.config), 1e-5);
  }
}

TEST(LmModule, IsFoundBesideTheBinary) {
  use_built_lm_module();
  EXPECT_EQ(lm::language_model_module_path().filename(), "libca_lm.so");
}

TEST(LmTransformers, MatchesLogitsAndGreedyTokensOnCpu) {
  const std::string why = transformers_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  auto models = tiny_models();
  for (auto& m : rope_variants()) models.push_back(m);
  expect_matches_transformers(models, "cpu");
}

}  // namespace
}  // namespace cuda_agent::testing
