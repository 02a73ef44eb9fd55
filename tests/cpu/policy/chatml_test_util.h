// A tiny chat model for the LocalPolicy and rollout suites: a random-weight Qwen2 model (so the
// qwen2.5 template renders tools and calls) with a byte-level ChatML tokenizer, written to a
// folder and loaded as any Hugging Face model is.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cuda_agent/core/files.h"
#include "lm_test_util.h"

namespace cuda_agent::testing {

// A byte-level tokenizer.json: the 256 GPT-2 byte symbols (ids = byte values) and the two ChatML
// special tokens (256, 257).
inline nlohmann::json tiny_chatml_tokenizer() {
  using nlohmann::json;
  json vocab = json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  json added = json::array();
  for (auto [id, text] : {std::pair{256, "<|im_start|>"}, std::pair{257, "<|im_end|>"}})
    added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

// Writes the tiny model folder `dir` (config, weights, tokenizer.json, tokenizer_config.json).
inline void write_tiny_chatml_model(const std::filesystem::path& dir) {
  policy::ModelConfig config = tiny_config(policy::Family::kQwen2);
  config.vocab_size = 258;  // the tokenizer's: a sampled id must be a token
  config.max_position_embeddings = 2048;
  config.attention_bias = true;
  lm::random_language_model(config, test_options())->save_hf(dir);
  write_file_atomic(dir / "tokenizer.json", tiny_chatml_tokenizer().dump());
  write_file_atomic(dir / "tokenizer_config.json", nlohmann::json{{"eos_token", "<|im_end|>"}}.dump());
}

// A suite that writes the tiny model folder once (model_dir()) and removes it after its tests.
class TinyChatmlModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    use_built_lm_module();
    dir_ = new TempDir("ca-tiny-chatml-");
    write_tiny_chatml_model(model_dir());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path model_dir() { return dir_->path() / "m"; }
  static inline TempDir* dir_ = nullptr;  // one suite at a time: gtest runs suites one after another
};

}  // namespace cuda_agent::testing
